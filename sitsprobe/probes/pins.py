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
from .compiler import lib as bcc_lib, tables


@contextmanager
def pinned(bpf, root: str = BPFFS) -> Iterator[str]:
    """Every map of ``bpf`` pinned as <dir>/<its name>, for the with block:
    the directory (a fresh one under ``root``, a BPF file system)."""
    lib = bcc_lib()
    lib.bpf_obj_pin.restype, lib.bpf_obj_pin.argtypes = ct.c_int, [ct.c_int, ct.c_char_p]
    directory = tempfile.mkdtemp(prefix=f"sitsprobe-{os.getpid()}-", dir=root)
    pins = []
    try:
        for fd, name in tables(bpf).items():
            path = os.path.join(directory, name)
            if lib.bpf_obj_pin(fd, path.encode()) != 0:
                err = ct.get_errno()
                raise OSError(err, f"pinning the map {name} at {path}: {os.strerror(err)} "
                                   f"(pins need a BPF file system mounted at {root})")
            pins.append(path)
        yield directory
    finally:
        for path in pins:
            os.unlink(path)
        os.rmdir(directory)
