"""Copy a whole BPF hash map out in a few syscalls; take an entry out of one
that the kernel may take out too.

Walking a map with bcc's ``items()`` costs two syscalls and two ctypes
objects per entry, about 14 µs here: 136 ms for 10,000 connections, on every
flush tick. ``BPF_MAP_LOOKUP_BATCH`` (Linux 5.6) copies the entries into
buffers allocated once, in one call or a few, and `Layout` unpacks them with
``struct.iter_unpack``. Where the kernel refuses it, the copy falls back to
``items()`` and says so once.
"""
from __future__ import annotations

import ctypes as ct
import errno
import logging
import os

log = logging.getLogger(__name__)

# errnos of a kernel without the command, or a map type without batch ops
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, 524}  # 524: ENOTSUPP


def discard(table, key) -> None:
    """Take ``key`` out of the bcc table ``table`` if it is there. bcc's
    ``pop(key, None)`` looks the entry up, then deletes it: where the kernel
    deletes it in between (a connection it closed, a read that returned, an
    allocation freed), the delete raises KeyError. One delete, its absence
    ignored, cannot race."""
    try:
        del table[key]
    except KeyError:
        pass


class MapCopy:
    """Snapshots of one hash map: ``read()`` -> (n, keys, values), raw bytes
    of n entries each. Entries may change while they are copied; each one
    is whole (the kernel copies an entry under its bucket lock)."""

    def __init__(self, table, name: str):
        from bcc.libbcc import lib  # the probes layer is the only one that imports bcc

        self._lib, self._table, self._name = lib, table, name
        self._fd = table.map_fd
        self._max = table.max_entries
        self.key_size, self.value_size = ct.sizeof(table.Key), ct.sizeof(table.Leaf)
        self._keys = ct.create_string_buffer(self.key_size * self._max)
        self._values = ct.create_string_buffer(self.value_size * self._max)
        self.batched = True
        self.unbatched_why = ""  # why the kernel refused the batch lookup, once it has

    def read(self) -> tuple[int, memoryview, memoryview]:
        n = self._batch() if self.batched else None
        if n is None:
            return self._one_by_one()
        return (n, memoryview(self._keys)[: n * self.key_size],
                memoryview(self._values)[: n * self.value_size])

    def _batch(self) -> int | None:
        cursor, count, total = ct.c_uint32(0), ct.c_uint32(0), 0
        while total < self._max:
            count.value = self._max - total
            res = self._lib.bpf_lookup_batch(
                self._fd, ct.byref(cursor) if total else None, ct.byref(cursor),
                ct.byref(self._keys, self.key_size * total),
                ct.byref(self._values, self.value_size * total), ct.byref(count))
            err = ct.get_errno()
            total += count.value
            if res == 0 and count.value:
                continue
            if res == 0 or err == errno.ENOENT:  # the whole map has been read
                return total
            if err == errno.ENOSPC:  # the map grew past the buffer meanwhile: take what fit
                return total
            if err in _UNSUPPORTED and total == 0:
                self.unbatched_why = errno.errorcode.get(err, str(err))
                log.warning("BPF_MAP_LOOKUP_BATCH unavailable on %s (%s); reading its "
                            "entries one by one", self._name, os.strerror(err))
                self.batched = False
                return None
            raise OSError(err, f"BPF_MAP_LOOKUP_BATCH on {self._name}: {os.strerror(err)}")
        return total

    def _one_by_one(self) -> tuple[int, memoryview, memoryview]:
        pairs = list(self._table.items())
        return (len(pairs), memoryview(b"".join(bytes(k) for k, _ in pairs)),
                memoryview(b"".join(bytes(v) for _, v in pairs)))
