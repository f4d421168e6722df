"""bcc's compiler, one module at a time in this process.

clang and LLVM inside bcc must not run twice at once (iovisor/bcc#4500), and
making or freeing a module writes the one table storage bcc keeps for every
module of the process (a std::map, not locked). The TLS half of net.c is
compiled on a thread of its own while the agent runs (probes/tls.py), so
every compile and every free of a module holds this lock.
"""
from __future__ import annotations

import threading

LOCK = threading.Lock()


def compile_module(src_file: str, cflags: list[str]):
    """``bcc.BPF`` of one source file: compiled, its maps made."""
    from bcc import BPF  # the probes layer is the only one that imports bcc

    with LOCK:
        return BPF(src_file=src_file.encode(), cflags=cflags)


def free_module(bpf) -> None:
    """bcc's cleanup of a module whose probes are off: its maps and programs go."""
    with LOCK:
        bpf.cleanup()
