"""Which kernel hook each probe point can use, in order of preference.

A probe point names what it observes (``tcp_sendmsg``); its candidates say how
(fentry, then kprobe, then a tracepoint). The capability probe decides which
candidate loads on this kernel; ``doctor`` prints the choice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FENTRY, KPROBE, TRACEPOINT, UPROBE, USDT = "fentry", "kprobe", "tracepoint", "uprobe", "usdt"
RAW_TRACEPOINT = "raw_tracepoint"


@dataclass(frozen=True, slots=True)
class Hook:
    kind: str  # one of FENTRY, KPROBE, TRACEPOINT, RAW_TRACEPOINT, UPROBE, USDT
    target: str  # "tcp_sendmsg", "tcp:tcp_sendmsg_locked", "libc:getpid", "sock:{a,b}"

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"

    def targets(self) -> list[str]:
        """Each target a braced one names: "s:x_{a,b}" -> ["s:x_a", "s:x_b"]."""
        return expand(self.target)


def expand(pattern: str) -> list[str]:
    """Brace expansion, as a shell does it (no nesting): "a{1,2}b{x,y}" ->
    a1bx a1by a2bx a2by."""
    head, brace, rest = pattern.partition("{")
    if not brace:
        return [pattern]
    choices, _, tail = rest.partition("}")
    return [head + c + t for c in choices.split(",") for t in expand(tail)]


def _syscall(name: str) -> list[Hook]:
    return [Hook(TRACEPOINT, f"syscalls:sys_enter_{name}")]


# The tiers the bytes of socket calls can be read from (NET_TIER in bpf/net.c),
# cheapest first: a raw tracepoint per direction at the socket layer, the
# syscall's arguments from its registers; else each data syscall's enter and
# exit tracepoints (paid by every process that makes those syscalls, and two
# per call), with the socket tracepoints for the 4-tuple and tcp_sendmsg for TCP.
SOCKET_TIER = Hook(RAW_TRACEPOINT, "sock:{sock_send_length,sock_recv_length}")
SYSCALL_TIER = Hook(TRACEPOINT, "syscalls:sys_{enter,exit}_{read,write,readv,writev,recvfrom,"
                                "sendto,recvmsg,sendmsg,sendfile64}")

# probe point -> candidates, best first
NET_POINTS: dict[str, list[Hook]] = {
    "socket_io": [SOCKET_TIER, SYSCALL_TIER],
    # the syscall tier's: which socket a call was on, and that it is TCP
    "socket_tuple": [Hook(TRACEPOINT, "sock:{sock_send_length,sock_recv_length}")],
    "tcp_sendmsg": [
        Hook(FENTRY, "tcp_sendmsg"),
        Hook(KPROBE, "tcp_sendmsg"),
        Hook(TRACEPOINT, "tcp:tcp_sendmsg_locked"),
    ],
    "tcp_state": [Hook(TRACEPOINT, "sock:inet_sock_set_state")],
    "process_lifecycle": [Hook(TRACEPOINT, "sched:sched_process_exec")],
    # the run-queue wait of traced threads (stitch.run_queue): optional, the
    # agent runs without them and says so
    "run_queue": [Hook(RAW_TRACEPOINT, "sched:{sched_switch,sched_wakeup}"),  # with a task's pid from BTF
                  Hook(TRACEPOINT, "sched:sched_switch")],
    "run_queue_wakeup": [Hook(TRACEPOINT, "sched:sched_wakeup")],
    # connections traced processes open (stitch.outgoing) and TLS plaintext (capture.tls): optional
    "connect": _syscall("connect"),
    "tls_library": [Hook(UPROBE, "libssl:SSL_read,SSL_write,SSL_read_ex,SSL_write_ex")],
    **{
        sc: _syscall(sc)
        for sc in ("accept", "accept4", "close")
    },
}

# what the socket tier follows connections by where the kernel's BTF has
# struct sock (probes/net_plan.py): a connection's first call and its TCP
# state, in place of these syscalls' tracepoints
CONNECTION_SYSCALLS = ("accept", "accept4", "connect", "close")
CONNECTIONS_BY_STATE = Hook(TRACEPOINT, "sock:inet_sock_set_state")

OPTIONAL = frozenset({"run_queue", "run_queue_wakeup", "connect", "tls_library"})  # the agent runs without
SYSCALL_TIER_ONLY = frozenset({"socket_tuple", "tcp_sendmsg"})  # what the socket tier needs not
PROBES: dict[str, dict[str, list[Hook]]] = {"net": NET_POINTS}
_TIERS = {"auto": [SOCKET_TIER, SYSCALL_TIER], "socket": [SOCKET_TIER], "syscall": [SYSCALL_TIER]}


def candidates(socket_hooks: str = "auto") -> dict[str, dict[str, list[Hook]]]:
    """PROBES, with the socket tiers the ``socket_hooks`` setting allows; the
    syscall tier is the one for kernels before raw tracepoints: none at all."""
    points = {**NET_POINTS, "socket_io": _TIERS[socket_hooks]}
    if socket_hooks == "syscall":
        points = {p: [h for h in hs if h.kind != RAW_TRACEPOINT] for p, hs in points.items()}
    return {"net": points}


def choose(candidates: list[Hook], available: dict[str, bool],
           usable: Callable[[Hook], bool] | None = None) -> Hook | None:
    """The first candidate whose hook kind loads here (``available[kind]``)
    and, if ``usable`` is given, whose own target passes it (a tracepoint
    this kernel actually has)."""
    for hook in candidates:
        if available.get(hook.kind) and (usable is None or usable(hook)):
            return hook
    return None
