"""Which hook each probe point gets on this kernel, and why not a better one."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sitsprobe import tracefs
from sitsprobe.probes import hooks

if TYPE_CHECKING:
    from sitsprobe.probes.capability import Capability

Plan = dict[str, dict[str, "hooks.Hook | None"]]  # group -> point -> hook (None: nothing works)

_CAPABILITY = {hooks.FENTRY: "fentry", hooks.KPROBE: "kprobe", hooks.UPROBE: "uprobe",
               hooks.USDT: "usdt", hooks.RAW_TRACEPOINT: "sock_tracepoint"}


def capability_for(hook: hooks.Hook) -> str:
    """The capability a hook needs: syscall tracepoints are checked apart."""
    if hook.kind == hooks.TRACEPOINT:
        return "syscall_tracepoint" if hook.target.startswith("syscalls:") else "tracepoint"
    return _CAPABILITY[hook.kind]


def plan(caps: dict[str, Capability], root: str = "/", socket_hooks: str = "auto") -> Plan:
    """Probe group -> point -> the best hook that works here, of those the
    ``socket_hooks`` setting allows. On the socket tier, the points only the
    syscall tier needs are left out."""
    def ok(name: str) -> bool:
        return name in caps and caps[name].ok

    available = {kind: ok(name) for kind, name in _CAPABILITY.items()}
    available[hooks.TRACEPOINT] = ok("tracepoint") or ok("syscall_tracepoint")

    def usable(hook: hooks.Hook) -> bool:
        if hook.kind not in (hooks.TRACEPOINT, hooks.RAW_TRACEPOINT):
            return True
        return ok(capability_for(hook)) and all(tracefs.tracepoint_exists(t, root)
                                                for t in hook.targets())

    chosen = {group: {point: hooks.choose(candidates, available, usable)
                      for point, candidates in points.items()}
              for group, points in hooks.candidates(socket_hooks).items()}
    if chosen["net"]["socket_io"] == hooks.SOCKET_TIER:
        chosen["net"] = {p: h for p, h in chosen["net"].items() if p not in hooks.SYSCALL_TIER_ONLY}
    return chosen


def fallback_notes(chosen: Plan, caps: dict[str, Capability], socket_hooks: str = "auto") -> list[str]:
    """One line per point that did not get its first choice, saying why:
    "tcp_sendmsg: fentry unavailable (EPERM), kprobe unavailable
    (CONFIG_KPROBES unset); using tracepoint tcp:tcp_sendmsg_locked"."""
    lines = []
    for group, points in chosen.items():
        for point, hook in points.items():
            skipped = []
            for candidate in hooks.candidates(socket_hooks)[group][point]:
                if candidate == hook:
                    break
                cap = caps.get(capability_for(candidate))
                if cap is not None and not cap.ok:
                    skipped.append(f"{candidate.kind} unavailable ({cap.reason or cap.detail})")
                else:
                    skipped.append(f"{candidate} missing")
            if skipped:
                using = f"using {hook}" if hook else "no usable hook"
                lines.append(f"{point}: {', '.join(skipped)}; {using}")
    return lines
