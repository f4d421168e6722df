"""Where a field of a kernel struct sits, from the running kernel's own BTF.

bcc compiles against whatever kernel headers it found, and on a node they may
be another kernel's (doctor says so): a program that reads a kernel struct
through them may read the wrong bytes. A raw tracepoint hands its program
struct pointers, so the one field it needs (a task's pid) is located here, in
/sys/kernel/btf/vmlinux, which describes the kernel that runs, and passed to
the program as a -D constant. Only the type section is read: enough to find
a struct by name and a member's offset.
"""
from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterable

BTF_MAGIC = 0xEB9F
_HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, hdr_len, type_off, type_len, str_off, str_len
_TYPE = struct.Struct("<III")  # name_off, info, size_or_type
_MEMBER = struct.Struct("<III")  # name_off, type, offset
KIND_STRUCT = 4
# bytes that follow a type's header, by kind: fixed, and per vlen entry
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0),
          15: (0, 12), 17: (4, 0), 19: (0, 12)}


Member = tuple[str, str]  # (struct name, member name)


def member_offset(struct_name: str, member: str, path: str = "/sys/kernel/btf/vmlinux") -> int | None:
    """The byte offset of ``struct_name.member`` in the kernel ``path``
    describes; None where there is no BTF, no such struct or member, or the
    member is a bitfield."""
    return member_offsets([(struct_name, member)], path)[struct_name, member]


def member_offsets(wanted: Iterable[Member], path: str = "/sys/kernel/btf/vmlinux") -> dict[Member, int | None]:
    """member_offset of each of ``wanted``, from one read and one pass; a pass
    is kept for the same file (path and stat) and ``wanted``: a start plans
    net.c more than once, and each pass over vmlinux's BTF takes some 40 ms."""
    wanted = tuple(wanted)
    try:
        st = os.stat(path)
    except OSError:
        return dict.fromkeys(wanted)
    return dict(_read_members(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), wanted))


@functools.lru_cache(maxsize=8)
def _read_members(path: str, _identity: tuple, wanted: tuple[Member, ...]) -> dict[Member, int | None]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return dict.fromkeys(wanted)
    return find_members(data, wanted)


def find_member(data: bytes, struct_name: str, member: str) -> int | None:
    """As member_offset, over the bytes of a BTF blob; never raises on bad bytes."""
    return find_members(data, [(struct_name, member)])[struct_name, member]


def find_members(data: bytes, wanted: Iterable[Member]) -> dict[Member, int | None]:
    """As member_offsets, over the bytes of a BTF blob; never raises on bad
    bytes. The first struct of a name is the one read."""
    found: dict[Member, int | None] = dict.fromkeys(wanted)
    try:
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, str_len = _HEADER.unpack_from(data)
    except struct.error:
        return found
    if magic != BTF_MAGIC:
        return found
    types = data[hdr_len + type_off:hdr_len + type_off + type_len]
    strings = data[hdr_len + str_off:hdr_len + str_off + str_len]

    def name(off: int) -> bytes:
        end = strings.find(b"\0", off)
        return strings[off:end] if end >= 0 else b""

    left: dict[bytes, dict[bytes, Member]] = {}  # struct -> member -> key, for structs not yet read
    for s, m in found:
        left.setdefault(s.encode(), {})[m.encode()] = (s, m)
    pos = 0
    try:
        while left and pos + _TYPE.size <= len(types):
            name_off, info, _ = _TYPE.unpack_from(types, pos)
            kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            pos += _TYPE.size
            fixed, each = _EXTRA.get(kind, (0, 0))
            members = left.pop(name(name_off), None) if kind == KIND_STRUCT else None
            for i in range(vlen if members else 0):
                m_name, _, offset = _MEMBER.unpack_from(types, pos + i * _MEMBER.size)
                key = members.get(name(m_name))
                if key is not None:
                    bits = offset & 0xFFFFFF if kind_flag else offset
                    found[key] = None if bits % 8 or (kind_flag and offset >> 24) else bits // 8
            pos += fixed + each * vlen
    except struct.error:
        return found
    return found
