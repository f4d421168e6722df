"""Which hooks bpf/net.c goes on, on this kernel, and the -D flags it is
compiled with: what `sitsprobe run` loads, and what `run --ebpf` prints."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from ..config import Config
from ..errors import MapCreateError, SitsprobeError
from ..export.buckets import DURATION_BUCKETS, SEGMENT_BUCKETS
from . import btf, capability, hooks, probe_aside
from .bins import bin_flags
from .net import cflags

log = logging.getLogger("sitsprobe")
VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
T = TypeVar("T")


class NetPlan(NamedTuple):
    hooks: dict  # hook point (probes.hooks) -> Hook, or None where the kernel has none
    flags: list[str]  # net.c's -D flags


def plan_net(config: Config, probed: dict[str, capability.Capability] | None = None) -> NetPlan:
    """Probe the kernel (tiny programs: probes.capability; ``probed``: what
    its groups said, if already asked), choose the socket tier and each hook,
    and say in the log what was chosen and what fell back."""
    caps = capability.probe_all(only=_groups(config)) if probed is None else probed
    if "fentry" not in caps and not caps["sock_tracepoint"].ok:
        caps |= capability.probe_all(only=("fentry",))
    return _plan(config, caps, say=True)


def load_net(config: Config, load: Callable[[list[str]], T]) -> tuple[NetPlan, T]:
    """The plan, and what ``load`` (net.c's compile and load) made of its
    flags. The kernel is probed in a child process (probes.probe_aside)
    while ``load`` runs on the flags of a guess (the last probe of this boot,
    else every hook working); where the probe then plans otherwise, that is
    closed and ``load`` runs again on the plan's: a second compile."""
    groups = _groups(config)
    aside = probe_aside.ProbeAside(groups)
    guess = guessed(config)
    refused: MapCreateError | None = None
    try:
        made = load(guess.flags)
    except MapCreateError as e:  # the maps' sizes are the config's, whatever the hooks: no second try
        made, refused = None, e
    except Exception as e:  # the plan says, or the second try raises, what is wrong
        log.debug("net.c on the flags guessed before the probe: %s", e)
        made = None
    try:
        net = plan_net(config, aside.result())
    except BaseException:  # no hook for this kernel, or stopped: nothing of the guess stays attached
        if made is not None:
            made.close()
        raise
    if refused is not None:  # a second compile near the memory limit could only be killed there
        raise refused
    if made is not None and net.flags == guess.flags:
        return net, made
    if made is not None:
        log.info("the kernel's hooks are not those guessed: net.c compiled again for the plan")
        made.close()
    return net, load(net.flags)


def guessed(config: Config) -> NetPlan:
    """The plan on what this boot's last probe of the kernel said (else on
    every hook working): what net.c is compiled for before the probe answers."""
    return _plan(config, probe_aside.guess(_groups(config)), say=False)


def _groups(config: Config) -> tuple[str, ...]:
    """The capability groups the plan needs: tcp_sendmsg's fentry only on the syscall tier."""
    return ("main", "fentry") if config.socket_hooks == "syscall" else ("main",)


def _plan(config: Config, caps: dict[str, capability.Capability], say: bool) -> NetPlan:
    wanted = config.socket_hooks
    plan = capability.plan(caps, socket_hooks=wanted)["net"]
    if say:
        for line in capability.fallback_notes({"net": plan}, caps, wanted):
            log.info("%s", line)
    io_hook, tcp_hook = plan["socket_io"], plan.get("tcp_sendmsg")
    if io_hook is None:
        raise SitsprobeError(f"no hook for the bytes of socket calls on this kernel (socket_hooks: "
                             f"{wanted}; see `sitsprobe doctor`)")
    if io_hook == hooks.SYSCALL_TIER and tcp_hook is None:
        raise SitsprobeError("no hook for tcp_sendmsg on this kernel (see `sitsprobe doctor`)")
    if say:
        log.info("socket calls read through %s%s", io_hook, "" if wanted == "auto" else f" (socket_hooks: {wanted})")
    run_queue, task_offsets = _run_queue(config, plan, say)
    sock_offsets = follow_connections(plan, say)
    cap, stitch = config.capture, config.stitch
    flags = cflags(request_bytes=cap.request_bytes, response_bytes=cap.response_bytes,
                   max_connections=stitch.max_connections, ring_buffer_mib=config.ring_buffer_mib,
                   socket_io=io_hook, tcp_sendmsg=tcp_hook, run_queue=run_queue, task_offsets=task_offsets,
                   read_waits=stitch.read_waits, outgoing=stitch.outgoing, stream_bytes=cap.stream_bytes,
                   genai=cap.genai, body_bytes=cap.body_bytes, tail_bytes=cap.tail_bytes,
                   write_peek_bytes=cap.write_peek_bytes, max_writes=cap.max_writes,
                   max_payloads=cap.max_payloads,
                   bins=bin_flags(DURATION_BUCKETS, SEGMENT_BUCKETS) if stitch.kernel_bins else (),
                   sock_offsets=sock_offsets)
    return NetPlan(plan, flags)


_CONNECTION_MEMBERS = (("sock", "__sk_common"), ("sock_common", "skc_family"), ("sock", "sk_type"),
                       ("unix_sock", "addr"))


def connection_offsets(path: str = VMLINUX_BTF) -> tuple[int, int, int] | None:
    """Where struct sock's family and type and struct unix_sock's address
    (which tells an accepted Unix socket from a socketpair) sit, from the
    kernel's BTF at ``path``: what net.c needs to follow connections on the
    socket tier with no syscall tracepoint (CONN_BY_STATE); None where the
    BTF lacks one of them."""
    found = btf.member_offsets(_CONNECTION_MEMBERS, path)
    if None in found.values():
        return None
    base, family, kind, unix_addr = (found[m] for m in _CONNECTION_MEMBERS)
    return base + family, kind, unix_addr


def follow_connections(plan: dict, say: bool = False,
                       btf_path: str = VMLINUX_BTF) -> tuple[int, int, int] | None:
    """On the socket tier (``plan``'s socket_io), where connection_offsets
    finds its offsets: net.c takes a connection at its first call and lets it
    go by its TCP state, so that no syscall tracepoint goes on (any one sends
    every syscall of the node through the kernel's tracing slow path), and
    the plan's accept, connect and close points become that one. What
    `doctor` shows and `run` loads."""
    if plan.get("socket_io") != hooks.SOCKET_TIER:
        return None
    offsets = connection_offsets(btf_path)
    if offsets is None:
        if say:
            log.info("connections: struct sock's family and type or struct unix_sock's addr not in the "
                     "kernel's BTF; using the accept, connect and close syscall tracepoints (every "
                     "syscall of the node then takes the kernel's tracing slow path)")
        return None
    for point in hooks.CONNECTION_SYSCALLS:
        plan.pop(point, None)
    plan["connections"] = hooks.CONNECTIONS_BY_STATE
    if say:
        log.info("connections followed from their first socket call and through %s: "
                 "no syscall tracepoint", hooks.CONNECTIONS_BY_STATE)
    return offsets


_TASK_IDS = (("task_struct", "pid"), ("task_struct", "tgid"))


def task_offsets(path: str = VMLINUX_BTF) -> tuple[int, int] | None:
    """Where struct task_struct's pid and tgid sit, from the kernel's BTF at
    ``path``: what the raw run-queue tracepoints read of the tasks they are
    given. None where the BTF lacks either."""
    found = btf.member_offsets(_TASK_IDS, path)
    pid, tgid = (found[m] for m in _TASK_IDS)
    return None if pid is None or tgid is None else (pid, tgid)


def _run_queue(config: Config, plan: dict, say: bool) -> tuple[bool, tuple[int, int] | None]:
    """Whether the run-queue hooks go on (stitch.run_queue), and the pid and
    tgid offsets in struct task_struct that make them raw tracepoints (from
    the kernel's BTF); the plan is told what the hooks are, and the log if ``say``."""
    def tell(level: int, *args) -> None:
        if say:
            log.log(level, *args)

    if not config.stitch.run_queue:
        return False, None
    if plan["run_queue"] is not None and plan["run_queue"].kind == hooks.RAW_TRACEPOINT:
        offsets = task_offsets()
        if offsets is not None:
            plan.pop("run_queue_wakeup", None)  # the raw pair is one point
            tell(logging.INFO, "run queue timed through %s", plan["run_queue"])
            return True, offsets
        tell(logging.INFO, "run_queue: no task_struct.pid or .tgid in the kernel's BTF; "
             "using tracepoint sched:sched_switch")
        plan["run_queue"] = hooks.Hook(hooks.TRACEPOINT, "sched:sched_switch")
    if plan["run_queue"] and plan["run_queue_wakeup"]:
        tell(logging.INFO, "run queue timed through %s", plan["run_queue"])
        return True, None
    tell(logging.WARNING, "stitch.run_queue: sched:sched_switch or sched:sched_wakeup unavailable here; "
         "sitsprobe.latency.scheduling_s holds only engine queue stages")
    return False, None
