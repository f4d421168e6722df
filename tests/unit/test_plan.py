"""Hook choice, fallback notes and doctor's text, from made-up capabilities."""
from __future__ import annotations

from sitsprobe import doctor
from sitsprobe.probes import hooks
from sitsprobe.probes.capability import Capability, fallback_notes, plan

KINDS = ["btf", "syscall_tracepoint", "tracepoint", "raw_tracepoint", "sock_tracepoint", "kprobe", "fentry",
         "uprobe", "usdt", "ringbuf", "map_batch"]


def caps(**off: str) -> dict[str, Capability]:
    """Everything works but the kinds named, each with its short reason."""
    return {k: Capability(k, k not in off, f"{k}: {off.get(k, 'fired')}", off.get(k, ""))
            for k in KINDS}


def tracing(root, *names: str) -> str:
    for name in names:
        (root / "sys/kernel/tracing/events" / name.replace(":", "/")).mkdir(parents=True)
    return str(root)


ALL_TPS = sorted({t for cands in hooks.NET_POINTS.values() for h in cands
           if h.kind in (hooks.TRACEPOINT, hooks.RAW_TRACEPOINT) for t in h.targets()})
SOCK_TPS = ("sock:sock_send_length", "sock:sock_recv_length")


def test_best_candidate_when_everything_works(tmp_path):
    chosen = plan(caps(), tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["socket_io"] == hooks.SOCKET_TIER
    assert "tcp_sendmsg" not in chosen["net"] and "socket_tuple" not in chosen["net"]  # the tier needs neither
    assert chosen["net"]["accept4"] == hooks.Hook(hooks.TRACEPOINT, "syscalls:sys_enter_accept4")
    assert fallback_notes(chosen, caps()) == []


def test_the_syscall_tier_when_the_socket_tier_does_not_load(tmp_path):
    c = caps(sock_tracepoint="EINVAL")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["socket_io"] == hooks.SYSCALL_TIER
    assert chosen["net"]["tcp_sendmsg"] == hooks.Hook(hooks.FENTRY, "tcp_sendmsg")
    assert chosen["net"]["socket_tuple"] is not None
    assert fallback_notes(chosen, c) == [
        f"socket_io: raw_tracepoint unavailable (EINVAL); using {hooks.SYSCALL_TIER}",
        "run_queue: raw_tracepoint unavailable (EINVAL); using tracepoint sched:sched_switch"]


def test_the_syscall_tier_on_a_kernel_without_the_socket_tracepoints(tmp_path):
    present = [t for t in ALL_TPS if t not in SOCK_TPS]
    chosen = plan(caps(), tracing(tmp_path, *present))
    assert chosen["net"]["socket_io"] == hooks.SYSCALL_TIER
    assert chosen["net"]["socket_tuple"] is None  # and no tuples: doctor says so
    notes = fallback_notes(chosen, caps())
    assert f"socket_io: {hooks.SOCKET_TIER} missing; using {hooks.SYSCALL_TIER}" in notes


def test_each_data_syscall_tracepoint_is_needed_for_the_syscall_tier(tmp_path):
    present = [t for t in ALL_TPS if t not in (*SOCK_TPS, "syscalls:sys_exit_recvmsg")]
    chosen = plan(caps(), tracing(tmp_path, *present))
    assert chosen["net"]["socket_io"] is None


def test_socket_hooks_setting_forces_a_tier(tmp_path):
    root = tracing(tmp_path, *ALL_TPS)
    assert plan(caps(), root, socket_hooks="syscall")["net"]["socket_io"] == hooks.SYSCALL_TIER
    assert fallback_notes(plan(caps(), root, "syscall"), caps(), "syscall") == []
    c = caps(sock_tracepoint="EINVAL")
    forced = plan(c, root, socket_hooks="socket")
    assert forced["net"]["socket_io"] is None
    assert fallback_notes(forced, c, "socket")[0] == "socket_io: raw_tracepoint unavailable (EINVAL); no usable hook"


def test_brace_expansion():
    assert hooks.expand("s:x_{a,b}_{1,2}") == ["s:x_a_1", "s:x_a_2", "s:x_b_1", "s:x_b_2"]
    assert hooks.expand("tcp:tcp_sendmsg_locked") == ["tcp:tcp_sendmsg_locked"]
    assert len(hooks.SYSCALL_TIER.targets()) == 18


def test_no_kprobe_no_fentry_falls_back_to_tracepoint(tmp_path):
    c = caps(kprobe="CONFIG_KPROBES unset", fentry="EPERM", sock_tracepoint="EINVAL")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["tcp_sendmsg"] == hooks.Hook(hooks.TRACEPOINT, "tcp:tcp_sendmsg_locked")
    assert [n for n in fallback_notes(chosen, c) if n.startswith("tcp_sendmsg")] == [
        "tcp_sendmsg: fentry unavailable (EPERM), kprobe unavailable (CONFIG_KPROBES unset); "
        "using tracepoint tcp:tcp_sendmsg_locked"]


def test_kprobe_only(tmp_path):
    c = caps(fentry="EPERM", sock_tracepoint="EINVAL")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["tcp_sendmsg"] == hooks.Hook(hooks.KPROBE, "tcp_sendmsg")


def test_missing_tracepoint_means_no_hook(tmp_path):
    c = caps(kprobe="CONFIG_KPROBES unset", fentry="EPERM", sock_tracepoint="EINVAL")
    present = [t for t in ALL_TPS if t != "tcp:tcp_sendmsg_locked"]
    chosen = plan(c, tracing(tmp_path, *present))
    assert chosen["net"]["tcp_sendmsg"] is None
    note = next(n for n in fallback_notes(chosen, c) if n.startswith("tcp_sendmsg"))
    assert note.endswith("tracepoint tcp:tcp_sendmsg_locked missing; no usable hook")


def test_syscall_tracepoints_need_their_own_capability(tmp_path):
    c = caps(syscall_tracepoint="ENOENT")
    chosen = plan(c, tracing(tmp_path, *ALL_TPS))
    assert chosen["net"]["socket_io"] == hooks.SOCKET_TIER
    assert chosen["net"]["accept"] is None
    assert chosen["net"]["tcp_state"] == hooks.Hook(hooks.TRACEPOINT, "sock:inet_sock_set_state")
    assert "accept: tracepoint unavailable (ENOENT); no usable hook" in fallback_notes(chosen, c)


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
    assert ("run_queue: raw_tracepoint sched:{sched_switch,sched_wakeup} missing, tracepoint sched:sched_switch "
            "missing; no usable hook") in fallback_notes(chosen, c)
    assert {"run_queue", "run_queue_wakeup"} <= hooks.OPTIONAL  # doctor still says the agent can run
