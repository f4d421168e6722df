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
