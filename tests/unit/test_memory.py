"""Which of the compiler's pages the agent drops once its probes are loaded."""
from __future__ import annotations

from sitsprobe.probes.memory import compiler_ranges, release_compiler

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 08:01 123  /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                1024 kB
Anonymous:             0 kB
7f0000100000-7f0002000000 r-xp 00100000 08:01 123  /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:               40000 kB
Anonymous:             0 kB
7f0002000000-7f0002100000 r--p 02000000 08:01 123  /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                1024 kB
Anonymous:          1024 kB
7f0002100000-7f0002200000 rw-p 02100000 08:01 123  /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                 512 kB
Anonymous:           512 kB
7f0003000000-7f0003800000 r-xp 00000000 08:01 124  /usr/lib/llvm-14/lib/libclang-cpp.so.14
Rss:                8000 kB
Anonymous:             0 kB
7f0004000000-7f0004100000 r-xp 00000000 08:01 125  /usr/lib/x86_64-linux-gnu/libbcc.so.0.26.0
Rss:                2000 kB
Anonymous:             0 kB
7f0005000000-7f0005100000 r-xp 00000000 08:01 126  /opt/libLLVMish/other.so
Rss:                2000 kB
Anonymous:             0 kB
"""


def test_only_clean_read_only_compiler_pages_are_dropped():
    assert compiler_ranges(SMAPS) == [
        (0x7f0000000000, 0x100000),   # its read-only head
        (0x7f0000100000, 0x1f00000),  # its code
        (0x7f0003000000, 0x800000),   # clang's code
    ]  # not the RELRO (written, then made read-only), not the data, not bcc, not a look-alike


def test_nothing_to_release_and_no_smaps_are_zero_bytes(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "smaps").write_text("")  # nothing to drop: only the heap is trimmed
    assert release_compiler(str(tmp_path)) == 0
    assert release_compiler(str(tmp_path / "missing")) == 0
