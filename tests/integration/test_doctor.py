"""doctor against the real kernel, and every capability claim checked independently.

Each check below is written apart from ``probes.capability`` (other targets,
other triggers), so a capability probe that lies in either direction fails.
"""
from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess

import pytest

from sitsprobe import doctor, tracefs
from sitsprobe.probes import capability, hooks, probe_aside

pytestmark = [pytest.mark.integration,
              pytest.mark.filterwarnings("ignore:not a bytes object:DeprecationWarning")]

if os.geteuid() != 0:
    pytest.skip("loading BPF needs root; run the integration tests as root",
                allow_module_level=True)
bcc = pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
BPF, USDT = bcc.BPF, bcc.USDT

COUNT = """BPF_ARRAY(n, u64, 1);
int hit(void *ctx) {
    if ((bpf_get_current_pid_tgid() >> 32) != PID) return 0;
    int k = 0; u64 *v = n.lookup(&k); if (v) __sync_fetch_and_add(v, 1);
    return 0;
}
"""


@pytest.fixture(scope="module")
def outcome():
    before = sorted(tracefs.bpf_fds())
    r = doctor.report()
    return r, before, sorted(tracefs.bpf_fds())


def _counted(attach, trigger, text=COUNT, pid=None) -> bool:
    """Compile, attach with ``attach(b)``, run ``trigger()``, did it count?"""
    b = BPF(text=text, cflags=[f"-DPID={pid or os.getpid()}"])
    try:
        attach(b)
        trigger()
        return b["n"][0].value > 0
    finally:
        b.cleanup()


def _tcp_send():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        with socket.create_connection(srv.getsockname()) as cli:
            conn, _ = srv.accept()
            cli.sendall(b"ping")
            conn.recv(4)
            conn.close()


def works_syscall_tracepoint():
    return _counted(lambda b: b.attach_tracepoint(tp="syscalls:sys_enter_getuid", fn_name="hit"),
                    os.getuid)


def works_tracepoint():
    return _counted(lambda b: b.attach_tracepoint(tp="tcp:tcp_sendmsg_locked", fn_name="hit"),
                    _tcp_send)


def works_raw_tracepoint():
    return _counted(lambda b: b.attach_raw_tracepoint(tp="sys_exit", fn_name="hit"), os.getuid)


def works_kprobe():
    return _counted(lambda b: b.attach_kprobe(event="tcp_sendmsg", fn_name="hit"), _tcp_send)


def works_fentry():
    text = COUNT.replace("int hit(void *ctx)", "static int hit(void)") + \
        "KFUNC_PROBE(tcp_sendmsg) { return hit(); }"
    return _counted(lambda b: None, _tcp_send, text=text)


def works_uprobe():
    libc = ctypes.CDLL("libc.so.6")
    return _counted(lambda b: b.attach_uprobe(name="c", sym="getuid", fn_name="hit",
                                              pid=os.getpid()), libc.getuid)


def works_usdt():
    binaries = capability.usdt_candidates()
    if not binaries:
        return False
    script = "import sys, gc; print('up', flush=True); sys.stdin.readline(); gc.collect()"
    child = subprocess.Popen([binaries[0], "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # its runtime is mapped: a USDT read of it earlier can find no probes
        u = USDT(pid=child.pid)
        u.enable_probe(probe="gc__done", fn_name="hit")
        b = BPF(text=COUNT, cflags=[f"-DPID={child.pid}"], usdt_contexts=[u])
        try:
            child.stdin.write(b"\n")
            child.stdin.close()
            child.wait(10)
            return b["n"][0].value > 0
        finally:
            b.cleanup()
    finally:
        child.kill()
        child.wait()


def works_ringbuf():
    got = []
    b = BPF(text="""BPF_RINGBUF_OUTPUT(rb, 1);
        int hit(void *ctx) {
            if ((bpf_get_current_pid_tgid() >> 32) != PID) return 0;
            rb.ringbuf_output(&ctx, sizeof(ctx), 0); return 0; }""",
            cflags=[f"-DPID={os.getpid()}"])
    try:
        b.attach_tracepoint(tp="syscalls:sys_enter_getuid", fn_name="hit")
        b["rb"].open_ring_buffer(lambda _c, _d, size: got.append(size))
        os.getuid()
        b.ring_buffer_poll(200)
    finally:
        b.cleanup()
    return bool(got)


def works_map_batch():
    """bcc's own batch lookup, not sitsprobe's MapCopy."""
    b = BPF(text="BPF_HASH(m, u32, u32, 4);")
    try:
        m = b["m"]
        m[m.Key(1)] = m.Leaf(2)
        return list(m.items_lookup_batch()) == [(1, 2)]  # ctypes arrays give ints
    finally:
        b.cleanup()


def works_btf():
    try:
        with open("/sys/kernel/btf/vmlinux", "rb") as f:
            return f.read(2) == b"\x9f\xeb"  # BTF magic 0xeB9F, little-endian
    except OSError:
        return False


KINDS = ["syscall_tracepoint", "tracepoint", "raw_tracepoint", "kprobe", "fentry",
         "uprobe", "usdt", "ringbuf", "map_batch", "btf"]


@pytest.mark.parametrize("kind", KINDS)
def test_capability_claim_matches_reality(outcome, kind):
    claim = outcome[0]["capabilities"][kind]
    try:
        real = globals()[f"works_{kind}"]()
    except Exception as e:  # what a failed load or attach looks like in bcc
        real = False
        print(f"{kind}: independent check failed: {e}")
    assert claim["ok"] == real, f"doctor says {kind} ok={claim['ok']} ({claim['detail']})"


def test_this_machine_falls_back_to_tracepoints(outcome):
    config = capability.kernel_config() or {}
    if "CONFIG_KPROBES" in config:
        pytest.skip("this kernel has kprobes; the fallback is for kernels without (like CI's)")
    r = outcome[0]
    caps = r["capabilities"]
    assert not caps["kprobe"]["ok"] and caps["kprobe"]["reason"] == "CONFIG_KPROBES unset"
    assert "kprobe_events missing" in caps["kprobe"]["detail"]
    assert not caps["fentry"]["ok"] and caps["fentry"]["reason"]
    # the socket tier needs no tcp_sendmsg hook; the syscall tier falls back to its tracepoint
    assert r["plan"]["net"]["socket_io"] == str(hooks.SOCKET_TIER)
    assert "tcp_sendmsg" not in r["plan"]["net"]
    syscall_tier = capability.plan(capability.probe_all(), socket_hooks="syscall")["net"]
    assert syscall_tier["tcp_sendmsg"] == hooks.Hook(hooks.TRACEPOINT, "tcp:tcp_sendmsg_locked")


def test_report_is_ok_json_and_leaves_nothing_behind(outcome):
    r, before, after = outcome
    assert r["ok"], r["problems"]
    assert r["headers"]["ok"] and r["bcc"]
    assert all(r["mounts"].values())
    assert all(h is not None for h in r["plan"]["net"].values())
    json.dumps(r)
    assert after == before, "doctor left BPF objects open in this process"
    assert tracefs.leftovers() == []


def test_run_prints_80_columns_and_exits_0(capsys):
    assert doctor.run(False) == 0
    out = capsys.readouterr().out
    assert "result: ok" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert doctor.run(True) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_the_probe_aside_says_what_the_probe_here_says(tmp_path):
    """A start probes the kernel in a child process (probes.probe_aside)
    while it compiles: the child's answer is this process's own, and it is
    kept as the next start's guess."""
    kept = str(tmp_path / "caps.json")
    aside = probe_aside.ProbeAside(("main", "fentry"), kept)
    here = capability.probe_all(only=("main", "fentry"))
    there = aside.result()
    assert {k: c.ok for k, c in there.items()} == {k: c.ok for k, c in here.items()}
    fired = [c.detail for c in there.values() if c.ok and c.kind != "btf"]
    assert fired and all(d.startswith("fired ") for d in fired), fired
    assert probe_aside.guess(("main", "fentry"), kept) == there


def test_a_probe_aside_that_fails_is_probed_here_and_said(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(probe_aside.sys, "executable", "/bin/false")
    aside = probe_aside.ProbeAside(("main",), str(tmp_path / "caps.json"))
    with caplog.at_level("WARNING", logger="sitsprobe"):
        caps = aside.result()
    assert "probing here" in caplog.text and "exit status 1" in caplog.text
    assert set(caps) == {"btf", *capability.KINDS["main"]} and caps["syscall_tracepoint"].ok


def test_a_test_program_the_kernel_refused_for_the_moment_is_tried_again(outcome, monkeypatch, caplog):
    """The probe's answer is kept for the boot (probes.probe_aside), so a
    refusal for the moment (EAGAIN, as bcc words it) of a test program's
    compile, or of the load inside each attach, must not stand as a hook this
    kernel lacks: each is tried again, and the answer is the doctor's."""
    import errno
    import logging

    from sitsprobe.probes import retry

    monkeypatch.setattr(retry, "SOON_S", (0.01,))
    refusal = os.strerror(errno.EAGAIN)
    compiles, loads = [], set()
    real_init, real_load = BPF.__init__, BPF.load_func

    def init(self, *a, **kw):
        compiles.append(kw.get("text", "")[:40])
        if len(compiles) % 2:  # every compile's first try
            raise Exception(f"Failed to compile BPF module <text>: {refusal}")
        real_init(self, *a, **kw)

    def load_func(self, name, *a, **kw):
        if name not in loads:
            loads.add(name)
            raise Exception(f"Failed to load BPF program {name!r}: {refusal}")
        return real_load(self, name, *a, **kw)
    monkeypatch.setattr(BPF, "__init__", init)
    monkeypatch.setattr(BPF, "load_func", load_func)
    with caplog.at_level(logging.INFO, logger="sitsprobe"):
        caps = capability.probe_all(only=("main", "ringbuf"))
    said = outcome[0]["capabilities"]
    assert {k: c.ok for k, c in caps.items()} == {k: said[k]["ok"] for k in caps}
    assert len(compiles) == 4 and {b"on_syscall_tracepoint", b"on_uprobe", b"on_getppid"} <= loads
    assert sum("refused" in m and "for the moment" in m for m in caplog.messages) >= 2 + len(loads)
