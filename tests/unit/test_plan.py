"""Hook choice, fallback notes and doctor's text, from made-up capabilities."""
from __future__ import annotations

from sitsprobe import doctor
from sitsprobe.probes import hooks
from sitsprobe.probes.capability import Capability, fallback_notes, plan

KINDS = ["btf", "syscall_tracepoint", "tracepoint", "raw_tracepoint", "kprobe", "fentry",
         "uprobe", "usdt", "ringbuf", "map_batch"]


def caps(**off: str) -> dict[str, Capability]:
    """Everything works but the kinds named, each with its short reason."""
    return {k: Capability(k, k not in off, f"{k}: {off.get(k, 'fired')}", off.get(k, ""))
            for k in KINDS}


def tracing(root, *names: str) -> str:
    for name in names:
        (root / "sys/kernel/tracing/events" / name.replace(":", "/")).mkdir(parents=True)
    return str(root)


ALL_TPS = [h.target for cands in hooks.NET_POINTS.values() for h in cands
           if h.kind == hooks.TRACEPOINT]


def test_best_candidate_when_everything_works(tmp_path):
    chosen = plan(caps(), tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["tcp_sendmsg"] == hooks.Hook(hooks.FENTRY, "tcp_sendmsg")
    assert fallback_notes(chosen, caps()) == []


def test_no_kprobe_no_fentry_falls_back_to_tracepoint(tmp_path):
    c = caps(kprobe="CONFIG_KPROBES unset", fentry="EPERM")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["tcp_sendmsg"] == hooks.Hook(hooks.TRACEPOINT, "tcp:tcp_sendmsg_locked")
    assert fallback_notes(chosen, c) == [
        "tcp_sendmsg: fentry unavailable (EPERM), kprobe unavailable (CONFIG_KPROBES unset); "
        "using tracepoint tcp:tcp_sendmsg_locked"]


def test_kprobe_only(tmp_path):
    c = caps(fentry="EPERM")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["tcp_sendmsg"] == hooks.Hook(hooks.KPROBE, "tcp_sendmsg")


def test_missing_tracepoint_means_no_hook(tmp_path):
    c = caps(kprobe="CONFIG_KPROBES unset", fentry="EPERM")
    present = [t for t in ALL_TPS if t != "tcp:tcp_sendmsg_locked"]
    chosen = plan(c, tracing(tmp_path, *present))
    assert chosen["net"]["tcp_sendmsg"] is None
    note = next(n for n in fallback_notes(chosen, c) if n.startswith("tcp_sendmsg"))
    assert note.endswith("tracepoint tcp:tcp_sendmsg_locked missing; no usable hook")


def test_syscall_tracepoints_need_their_own_capability(tmp_path):
    c = caps(syscall_tracepoint="ENOENT")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["sendto"] is None
    assert chosen["net"]["tcp_state"] == hooks.Hook(hooks.TRACEPOINT, "sock:inet_sock_set_state")
    assert "sendto: tracepoint unavailable (ENOENT); no usable hook" in fallback_notes(chosen, c)


def test_choose_without_usable_is_unchanged():
    cands = hooks.NET_POINTS["tcp_sendmsg"]
    assert hooks.choose(cands, {hooks.KPROBE: True}) == cands[1]
    assert hooks.choose(cands, {hooks.KPROBE: True}, lambda h: False) is None


def test_render_text_fits_80_columns_and_lists_problems():
    c = caps(kprobe="CONFIG_KPROBES unset", fentry="EPERM")
    long = "/usr/src/linux-headers-6.1.0-50-cloud-amd64 " * 3
    r = {
        "kernel": "6.18.44-fc-v782", "bcc": "0.26.0", "btf": True,
        "mounts": {"tracefs": True, "debugfs": True, "bpf": False},
        "mounted_now": ["tracefs on /sys/kernel/tracing"],
        "headers": {"ok": True, "kind": "nearest", "build": "/usr/src/x", "source": None,
                    "note": "headers are for 6.1.0, the kernel is 6.18: " + long,
                    "linked": "linked " + long},
        "capabilities": {k: {"ok": v.ok, "detail": v.detail * 5, "reason": v.reason}
                         for k, v in c.items()},
        "nvml": {"ok": False, "detail": "NVMLError_LibraryNotFound"},
        "plan": {"net": {"tcp_sendmsg": "tracepoint tcp:tcp_sendmsg_locked", "sendto": None}},
        "notes": ["tcp_sendmsg: " + long], "problems": ["net probe point sendto: " + long],
        "ok": False,
    }
    text = doctor.render_text(r)
    assert max(map(len, text.splitlines())) <= 80
    assert "  --  kprobe" in text and "  ok  uprobe" in text
    assert "(mounted now)" in text and "NVMLError_LibraryNotFound" in text
    assert "result: the agent cannot run here:" in text
    assert "  - net probe point sendto" in text


def test_without_the_sched_tracepoints_only_the_run_queue_goes(tmp_path):
    present = [t for t in ALL_TPS if t not in ("sched:sched_switch", "sched:sched_wakeup")]
    c = caps()
    chosen = plan(c, tracing(tmp_path, *present))
    assert chosen["net"]["run_queue"] is None and chosen["net"]["run_queue_wakeup"] is None
    assert chosen["net"]["process_lifecycle"] is not None
    assert "run_queue: tracepoint sched:sched_switch missing; no usable hook" in fallback_notes(chosen, c)
    assert {"run_queue", "run_queue_wakeup"} <= hooks.OPTIONAL  # doctor still says the agent can run
