"""Give back what compiling the probes needed and loading them does not.

bcc compiles C with clang and LLVM inside the agent: their code (about 85 MB
of libLLVM and libclang-cpp touched) and their heap stay in the agent's RSS
for good once the programs are loaded, although nothing runs them again
until another compile. ``release_compiler`` drops the compiler's read-only
clean pages from this process's page tables (they stay in the page cache, and a
later compile faults them back in) and has malloc return freed heap.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re

from .compiler import LOCK

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
# the compiler bcc links: these libraries' pages are used only while compiling
COMPILER = re.compile(r"/lib(LLVM|clang-cpp)[-.]")
_MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s+(\S.*)$")


def compiler_ranges(smaps: str) -> list[tuple[int, int]]:
    """(start, length) of every mapping of the compiler's libraries, in a
    /proc/PID/smaps text, whose pages are all clean copies of the file: not
    writable and holding no anonymous page. That leaves out its data and its
    RELRO (relocated, then made read-only: those pages were written, and
    dropping them would lose the relocations)."""
    out, current = [], None
    for line in smaps.splitlines():
        m = _MAP.match(line)
        if m:
            current = None
            if "w" not in m[3] and COMPILER.search(m[4]):
                current = (int(m[1], 16), int(m[2], 16) - int(m[1], 16))
        elif current is not None and line.startswith("Anonymous:"):
            if int(line.split()[1]) == 0:
                out.append(current)
            current = None
    return out


def release_compiler(proc: str = "/proc") -> int:
    """Drop the compiler's read-only pages and trim the heap; the bytes of
    mappings released (0 where this is not Linux with glibc, or while a
    compile is under way: that one needs them, and releases them after)."""
    if not LOCK.acquire(blocking=False):
        return 0
    try:
        return _release(proc)
    finally:
        LOCK.release()


def _release(proc: str) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(os.path.join(proc, "self/smaps")) as f:
            ranges = compiler_ranges(f.read())
    except OSError as e:
        log.debug("compiler pages kept: %s", e)
        return 0
    released = 0
    for start, length in ranges:
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_DONTNEED) == 0:
            released += length
    trim = getattr(libc, "malloc_trim", None)  # glibc's
    if trim is not None:
        trim(0)
    return released
