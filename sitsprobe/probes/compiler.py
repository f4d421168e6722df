"""bcc's compiler, one module at a time in this process.

clang and LLVM inside bcc must not run twice at once (iovisor/bcc#4500), and
making or freeing a module writes the one table storage bcc keeps for every
module of the process (a std::map, not locked). The TLS half of net.c is
compiled on a thread of its own while the agent runs (probes/tls.py), so
every compile and every free of a module holds this lock.
"""
from __future__ import annotations

import ctypes as ct
import threading

LOCK = threading.Lock()
Tables = dict[int, str]  # a module's maps: their fds in this process -> their names


def lib():
    """libbcc, with the calls on a module's maps declared (bcc's Python leaves them out)."""
    from bcc.libbcc import lib  # the probes layer is the only one that imports bcc

    lib.bpf_num_tables.restype, lib.bpf_num_tables.argtypes = ct.c_size_t, [ct.c_void_p]
    lib.bpf_table_name.restype, lib.bpf_table_name.argtypes = ct.c_char_p, [ct.c_void_p, ct.c_size_t]
    lib.bpf_table_fd_id.restype, lib.bpf_table_fd_id.argtypes = ct.c_int, [ct.c_void_p, ct.c_size_t]
    return lib


def tables(bpf) -> Tables:
    """A module's maps: their fds in this process, and their names."""
    bcc = lib()
    return {bcc.bpf_table_fd_id(bpf.module, i): bcc.bpf_table_name(bpf.module, i).decode()
            for i in range(bcc.bpf_num_tables(bpf.module))}


def compile_module(src_file: str, cflags: list[str]):
    """``bcc.BPF`` of one source file: compiled, its maps made."""
    from bcc import BPF  # the probes layer is the only one that imports bcc

    with LOCK:
        return BPF(src_file=src_file.encode(), cflags=cflags)


def free_module(bpf) -> None:
    """bcc's cleanup of a module whose probes are off: its maps and programs go."""
    with LOCK:
        bpf.cleanup()
