"""Which hooks bpf/net.c goes on, on this kernel, and the -D flags it is
compiled with: what `sitsprobe run` loads, and what `run --ebpf` prints."""
from __future__ import annotations

import logging
from typing import NamedTuple

from ..config import Config
from ..errors import SitsprobeError
from ..export.prom import DURATION_BUCKETS, SEGMENT_BUCKETS
from . import btf, capability, hooks
from .bins import bin_flags
from .net import cflags

log = logging.getLogger("sitsprobe")


class NetPlan(NamedTuple):
    hooks: dict  # hook point (probes.hooks) -> Hook, or None where the kernel has none
    flags: list[str]  # net.c's -D flags


def plan_net(config: Config) -> NetPlan:
    """Probe the kernel (tiny programs: probes.capability), choose the socket
    tier and each hook, and say in the log what was chosen and what fell back."""
    wanted = config.socket_hooks
    # what the plan needs: tcp_sendmsg's fentry only on the syscall tier
    caps = capability.probe_all(only=("main",))
    if wanted == "syscall" or not caps["sock_tracepoint"].ok:
        caps |= capability.probe_all(only=("fentry",))
    plan = capability.plan(caps, socket_hooks=wanted)["net"]
    for line in capability.fallback_notes({"net": plan}, caps, wanted):
        log.info("%s", line)
    io_hook, tcp_hook = plan["socket_io"], plan.get("tcp_sendmsg")
    if io_hook is None:
        raise SitsprobeError(f"no hook for the bytes of socket calls on this kernel (socket_hooks: "
                             f"{wanted}; see `sitsprobe doctor`)")
    if io_hook == hooks.SYSCALL_TIER and tcp_hook is None:
        raise SitsprobeError("no hook for tcp_sendmsg on this kernel (see `sitsprobe doctor`)")
    log.info("socket calls read through %s%s", io_hook, "" if wanted == "auto" else f" (socket_hooks: {wanted})")
    run_queue, pid_offset = _run_queue(config, plan)
    cap, stitch = config.capture, config.stitch
    flags = cflags(request_bytes=cap.request_bytes, response_bytes=cap.response_bytes,
                   max_connections=stitch.max_connections, ring_buffer_mib=config.ring_buffer_mib,
                   socket_io=io_hook, tcp_sendmsg=tcp_hook, run_queue=run_queue, task_pid_offset=pid_offset,
                   read_waits=stitch.read_waits, outgoing=stitch.outgoing, stream_bytes=cap.stream_bytes,
                   genai=cap.genai, body_bytes=cap.body_bytes, tail_bytes=cap.tail_bytes,
                   write_peek_bytes=cap.write_peek_bytes, max_writes=cap.max_writes,
                   max_payloads=cap.max_payloads,
                   bins=bin_flags(DURATION_BUCKETS, SEGMENT_BUCKETS) if stitch.kernel_bins else ())
    return NetPlan(plan, flags)


def _run_queue(config: Config, plan: dict) -> tuple[bool, int | None]:
    """Whether the run-queue hooks go on (stitch.run_queue), and the pid
    offset in struct task_struct that makes them raw tracepoints (from the
    kernel's BTF); the plan is told what the hooks are."""
    if not config.stitch.run_queue:
        return False, None
    if plan["run_queue"] is not None and plan["run_queue"].kind == hooks.RAW_TRACEPOINT:
        offset = btf.member_offset("task_struct", "pid")
        if offset is not None:
            plan.pop("run_queue_wakeup", None)  # the raw pair is one point
            log.info("run queue timed through %s", plan["run_queue"])
            return True, offset
        log.info("run_queue: no task_struct.pid in the kernel's BTF; using tracepoint sched:sched_switch")
        plan["run_queue"] = hooks.Hook(hooks.TRACEPOINT, "sched:sched_switch")
    if plan["run_queue"] and plan["run_queue_wakeup"]:
        log.info("run queue timed through %s", plan["run_queue"])
        return True, None
    log.warning("stitch.run_queue: sched:sched_switch or sched:sched_wakeup unavailable here; "
                "sitsprobe.latency.scheduling_s holds only engine queue stages")
    return False, None
