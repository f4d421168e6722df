"""A compile on a thread whose /proc/kallsyms is two lines (probes/compiler.py):
what bcc makes there is what it makes with the kernel's own symbols, and
nothing of it is left once the thread ends."""
from __future__ import annotations

import pytest

from sitsprobe.probes import compiler
from sitsprobe.probes.apart import programs_of

from .conftest import require_root

# both helpers bcc looks up in the kernel's symbols, spelled as it checks them
SOURCE = r"""
int probe(void *ctx) {
    char buf[16] = {};
    bpf_probe_read_kernel(buf, 8, ctx);
    bpf_probe_read_user(buf + 8, 8, (void *)bpf_get_current_task());
    return buf[0] + buf[9];
}
"""


@pytest.fixture
def bcc():
    require_root()
    return pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")


def _kallsyms() -> bytes:
    with open("/proc/kallsyms", "rb") as f:
        return f.read()


def _mounted_over_kallsyms(pid: str) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as f:
        return [line for line in f if "kallsyms" in line]


def test_the_compile_s_thread_alone_sees_the_short_kallsyms(bcc):
    assert compiler.short_kallsyms(_kallsyms) == compiler.KALLSYMS
    assert _kallsyms().count(b"\n") > 1000  # this thread: the kernel's own
    assert _mounted_over_kallsyms("self") == [] and _mounted_over_kallsyms("1") == []
    with pytest.raises(ZeroDivisionError):
        compiler.short_kallsyms(lambda: 1 / 0)  # raised where it was asked for


def test_bcc_compiles_the_same_program_there_as_with_the_kernel_s_symbols(bcc, tmp_path):
    src = tmp_path / "probe.c"
    src.write_text(SOURCE)
    short = compiler.compile_module(str(src), [])
    whole = bcc.BPF(src_file=str(src).encode())  # this thread: all of /proc/kallsyms read
    try:
        assert programs_of(short) == programs_of(whole)
    finally:
        compiler.free_module(short)
        whole.cleanup()


def test_symbols_read_there_are_not_what_the_process_knows_after(bcc):
    bcc.BPF._sym_caches.pop(-1, None)  # none read yet in this process
    assert compiler.short_kallsyms(lambda: bcc.BPF.ksymname(b"tcp_sendmsg")) == -1
    assert bcc.BPF.ksymname(b"tcp_sendmsg") != -1


def test_where_no_namespace_can_be_made_the_compile_reads_the_kernel_s_own(bcc, monkeypatch, caplog):
    assert compiler.kallsyms_seen() == "two lines (in a mount namespace of the compile's thread)"

    def refused():
        raise PermissionError(1, "unshare(CLONE_NEWNS): Operation not permitted")
    monkeypatch.setattr(compiler, "_see_short_kallsyms", refused)
    monkeypatch.setattr(compiler, "_said", [])
    caplog.set_level("DEBUG", logger=compiler.__name__)
    assert compiler.short_kallsyms(_kallsyms) == _kallsyms()
    assert compiler.short_kallsyms(_kallsyms) == _kallsyms()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0] == ("INFO", "each compile reads all of /proc/kallsyms (0.1-0.2 s), not two lines of it: "
                               "[Errno 1] unshare(CLONE_NEWNS): Operation not permitted")
    assert said[1][0] == "DEBUG"  # said once a process
    assert compiler.kallsyms_seen() == "all of it ([Errno 1] unshare(CLONE_NEWNS): Operation not permitted)"


# a loop the verifier walks for a while (some milliseconds): long enough for a signal to find it running
SLOW = r"""
BPF_ARRAY(vals, u64, 64);
int slow(void *ctx) {
    u64 acc = 0;
    for (int i = 0; i < 64; i++) {
        int k = i;
        u64 *v = vals.lookup(&k);
        if (v) { if (*v & 1) acc += *v; else acc ^= *v; }
        if (acc > 1000) acc >>= 1;
    }
    return acc & 1;
}
"""


class _Storm:
    """SIGUSR1 (with a handler: a signal left to its default is never
    pending) at this thread every 0.2 ms from another, as a profiler's
    interruptions come, until ``stop`` is set."""

    def __init__(self):
        import signal
        import threading

        self._signal, self.stop, self.sent = signal, threading.Event(), 0
        self._old = signal.signal(signal.SIGUSR1, lambda *_: None)
        self._target = threading.get_ident()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self.stop.wait(0.0002):
            self._signal.pthread_kill(self._target, self._signal.SIGUSR1)
            self.sent += 1

    def close(self):
        self.stop.set()
        self._thread.join()
        self._signal.signal(self._signal.SIGUSR1, self._old)


def _slow_module(tmp_path):
    src = tmp_path / "slow.c"
    src.write_text(SLOW)
    return compiler.compile_module(str(src), [])


def test_a_load_a_signal_interrupted_is_tried_again(bcc, tmp_path, caplog):
    """The verifier gives up with EAGAIN when a signal is pending for the
    thread that loads (libbpf tries again at once, five times: under a storm
    of them, in vain). The load is tried again after a pause: here the storm
    ends at the first refusal the agent says, and the next try loads."""
    import logging

    from sitsprobe.probes import apart

    bpf = _slow_module(tmp_path)
    storm = _Storm()

    class EndStorm(logging.Handler):
        def emit(self, record):
            if "refused slow for the moment" in record.getMessage():
                storm.stop.set()
    handler = EndStorm()
    logging.getLogger("sitsprobe").addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="sitsprobe"):
            fn = apart.load_func(bpf, b"slow", bcc.BPF.KPROBE, {})
        assert fn.fd >= 0 and storm.stop.is_set() and storm.sent > 0  # refused first, then loaded
    finally:
        logging.getLogger("sitsprobe").removeHandler(handler)
        storm.close()
        compiler.free_module(bpf)


def test_a_load_refused_through_every_try_is_one_line_that_says_why(bcc, tmp_path, monkeypatch, caplog):
    """What `sitsprobe run` prints where the net program cannot load: the
    program, the kernel's words and, said before, how often it tried."""
    import logging

    from sitsprobe.errors import ProbeLoadError, SitsprobeError
    from sitsprobe.probes import apart, retry

    monkeypatch.setattr(retry, "SOON_S", (0.01, 0.02))
    bpf = _slow_module(tmp_path)
    storm = _Storm()
    try:
        with caplog.at_level(logging.INFO, logger="sitsprobe"), pytest.raises(ProbeLoadError) as e:
            apart.load_func(bpf, b"slow", bcc.BPF.KPROBE, {})
    finally:
        storm.close()
        compiler.free_module(bpf)
    assert isinstance(e.value, SitsprobeError)  # the CLI's one line, no traceback
    assert str(e.value) == "Failed to load BPF program slow: Resource temporarily unavailable"
    said = [r.getMessage() for r in caplog.records if "refused slow" in r.getMessage()]
    assert len(said) == 3 and said[-1].startswith("the kernel refused slow 3 times over 0.03 s"), said
