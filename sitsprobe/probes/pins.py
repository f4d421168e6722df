"""A bcc module's maps pinned in the BPF file system while another module is
compiled on them, then unpinned: nothing of them stays in bpffs.

bcc opens a map declared BPF_TABLE_PINNED from its pin rather than make one
of its own, so the second module gets the first one's very maps (net.c's
TLS_MODULE). bcc's own sharing (public and extern tables) finds a map by
name in a storage that outlives its module: a module freed in the same
process (the guess `load_net` compiles, then closes) would hand its stale fd
numbers to the next module's extern tables."""
from __future__ import annotations

import ctypes as ct
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..tracefs import BPFFS


def _lib():
    from bcc.libbcc import lib  # the probes layer is the only one that imports bcc

    lib.bpf_num_tables.restype, lib.bpf_num_tables.argtypes = ct.c_size_t, [ct.c_void_p]
    lib.bpf_table_name.restype, lib.bpf_table_name.argtypes = ct.c_char_p, [ct.c_void_p, ct.c_size_t]
    lib.bpf_table_fd_id.restype, lib.bpf_table_fd_id.argtypes = ct.c_int, [ct.c_void_p, ct.c_size_t]
    lib.bpf_obj_pin.restype, lib.bpf_obj_pin.argtypes = ct.c_int, [ct.c_int, ct.c_char_p]
    return lib


@contextmanager
def pinned(bpf, root: str = BPFFS) -> Iterator[str]:
    """Every map of ``bpf`` pinned as <dir>/<its name>, for the with block:
    the directory (a fresh one under ``root``, a BPF file system)."""
    lib = _lib()
    directory = tempfile.mkdtemp(prefix=f"sitsprobe-{os.getpid()}-", dir=root)
    pins = []
    try:
        for i in range(lib.bpf_num_tables(bpf.module)):
            name = lib.bpf_table_name(bpf.module, i).decode()
            path = os.path.join(directory, name)
            if lib.bpf_obj_pin(lib.bpf_table_fd_id(bpf.module, i), path.encode()) != 0:
                err = ct.get_errno()
                raise OSError(err, f"pinning the map {name} at {path}: {os.strerror(err)} "
                                   f"(pins need a BPF file system mounted at {root})")
            pins.append(path)
        yield directory
    finally:
        for path in pins:
            os.unlink(path)
        os.rmdir(directory)
