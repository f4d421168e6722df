"""Which kernel hook each probe point can use, in order of preference.

A probe point names what it observes (``tcp_sendmsg``); its candidates say how
(fentry, then kprobe, then a tracepoint). The capability probe decides which
candidate loads on this kernel; ``doctor`` prints the choice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FENTRY, KPROBE, TRACEPOINT, UPROBE, USDT = "fentry", "kprobe", "tracepoint", "uprobe", "usdt"


@dataclass(frozen=True, slots=True)
class Hook:
    kind: str  # one of FENTRY, KPROBE, TRACEPOINT, UPROBE, USDT
    target: str  # "tcp_sendmsg", "tcp:tcp_sendmsg_locked", "libc:getpid"

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"


def _syscall(name: str) -> list[Hook]:
    return [Hook(TRACEPOINT, f"syscalls:sys_enter_{name}")]


# probe point -> candidates, best first
NET_POINTS: dict[str, list[Hook]] = {
    "tcp_sendmsg": [
        Hook(FENTRY, "tcp_sendmsg"),
        Hook(KPROBE, "tcp_sendmsg"),
        Hook(TRACEPOINT, "tcp:tcp_sendmsg_locked"),
    ],
    "tcp_state": [Hook(TRACEPOINT, "sock:inet_sock_set_state")],
    "process_lifecycle": [Hook(TRACEPOINT, "sched:sched_process_exec")],
    # the run-queue wait of traced threads (stitch.run_queue): optional, the
    # agent runs without them and says so
    "run_queue": [Hook(TRACEPOINT, "sched:sched_switch")],
    "run_queue_wakeup": [Hook(TRACEPOINT, "sched:sched_wakeup")],
    # connections traced processes open (stitch.outgoing) and TLS plaintext (capture.tls): optional
    "connect": _syscall("connect"),
    "tls_library": [Hook(UPROBE, "libssl:SSL_read,SSL_write,SSL_read_ex,SSL_write_ex")],
    **{
        sc: _syscall(sc)
        for sc in (
            "accept", "accept4", "close",
            "sendto", "recvfrom", "write", "read",
            "writev", "readv", "sendmsg", "recvmsg",
        )
    },
}

OPTIONAL = frozenset({"run_queue", "run_queue_wakeup", "connect", "tls_library"})  # the agent runs without
PROBES: dict[str, dict[str, list[Hook]]] = {"net": NET_POINTS}


def choose(candidates: list[Hook], available: dict[str, bool],
           usable: Callable[[Hook], bool] | None = None) -> Hook | None:
    """The first candidate whose hook kind loads here (``available[kind]``)
    and, if ``usable`` is given, whose own target passes it (a tracepoint
    this kernel actually has)."""
    for hook in candidates:
        if available.get(hook.kind) and (usable is None or usable(hook)):
            return hook
    return None
