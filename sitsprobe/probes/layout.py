"""Read a bcc event struct in one `struct.unpack_from` call.

bcc derives each event's ctypes class from the C struct (we never mirror a
struct by hand). Reading such an object field by field costs a ctypes
attribute lookup per field, about 0.1 µs each: at twenty fields and tens of
thousands of events a second that alone is a tenth of a core. `Layout` turns
the very same ctypes class into a `struct.Struct` with the same offsets, so
an event is one C call over the ring buffer's memory, and `Layout.at` names
where each field lands in the resulting tuple.
"""
from __future__ import annotations

import ctypes as ct
import struct

_INT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _code(ctype) -> str:
    """struct code of a ctypes integer type, at its standard size."""
    size = ct.sizeof(ctype)
    code = _INT_CODES.get(size)
    kind = getattr(ctype, "_type_", None)
    if code is None or not isinstance(kind, str) or kind not in "bBhHiIlLqQ":
        raise TypeError(f"{ctype.__name__}: not an integer type")
    return code.lower() if kind in "bhilq" else code


class Layout:
    """The flat `struct` twin of a ctypes Structure.

    Integers become one tuple item each; byte and char arrays one `bytes`
    item of their full length; arrays of wider integers one item per
    element (`at` gives a slice for them); nested structs are flattened
    under dotted names ("t.family")."""

    def __init__(self, ctype: type[ct.Structure]):
        self._fmt: list[str] = []
        self._items = 0
        self._end = 0  # bytes covered so far
        self.at: dict[str, int | slice] = {}
        self._fields: dict[str, tuple[int, str]] = {}  # name -> (offset, struct code)
        self._add(ctype, 0, "")
        self._pad(ct.sizeof(ctype))
        self.struct = struct.Struct("=" + "".join(self._fmt))
        self.unpack_from = self.struct.unpack_from

    def subset(self, *names: str) -> struct.Struct:
        """A Struct of the same size that reads only ``names`` (given in the
        struct's order), skipping the rest: for a glance at many entries."""
        fmt, end = [], 0
        for name in names:
            off, code = self._fields[name]
            if off < end:
                raise ValueError(f"{name}: fields must be given in the struct's order")
            fmt.append(f"{off - end}x{code}" if off > end else code)
            end = off + struct.calcsize("=" + code)
        fmt.append(f"{self.struct.size - end}x")
        return struct.Struct("=" + "".join(fmt))

    def _pad(self, offset: int) -> None:
        if offset > self._end:
            self._fmt.append(f"{offset - self._end}x")
            self._end = offset

    def _add(self, ctype, base: int, prefix: str) -> None:
        for name, ftype, *_bits in ctype._fields_:
            off = base + getattr(ctype, name).offset
            size = ct.sizeof(ftype)
            full = prefix + name
            self._pad(off)
            if isinstance(ftype, type) and issubclass(ftype, ct.Structure):
                self._add(ftype, off, full + ".")
                continue
            if isinstance(ftype, type) and issubclass(ftype, ct.Array):
                elem = ftype._type_
                if ct.sizeof(elem) == 1:  # bytes, char[]: one bytes item
                    code = f"{size}s"
                    self.at[full] = self._items
                    self._items += 1
                else:
                    code = _code(elem) * ftype._length_
                    self.at[full] = slice(self._items, self._items + ftype._length_)
                    self._items += ftype._length_
            else:
                code = _code(ftype)
                self.at[full] = self._items
                self._items += 1
            self._fmt.append(code)
            self._fields[full] = (off, code)
            self._end = off + size
