"""A struct member's offset from a BTF blob, built here byte by byte."""
from __future__ import annotations

import os
import random
import struct

from sitsprobe.probes.btf import BTF_MAGIC, find_member, find_members, member_offset, member_offsets


def blob(*, bitfield: bool = False) -> bytes:
    strings = b"\0int\0task_struct\0state\0pid\0tgid\0other\0"
    at = {s: strings.index(b"\0" + s.encode() + b"\0") + 1 for s in ("int", "task_struct", "state", "pid",
                                                                      "tgid", "other")}
    types = struct.pack("<III", at["int"], 1 << 24, 4) + struct.pack("<I", 32)  # INT, 4 bytes
    types += struct.pack("<III", 0, 6 << 24 | 1, 4) + struct.pack("<iI", 0, 0)  # an anonymous ENUM, one value
    types += struct.pack("<III", at["other"], 4 << 24 | 1, 8) + struct.pack("<III", at["pid"], 1, 0)
    flag = 1 << 31 if bitfield else 0
    members = [("state", 0), ("pid", 1264 * 8 | ((3 << 24) if bitfield else 0)), ("tgid", 1268 * 8)]
    types += struct.pack("<III", at["task_struct"], flag | 4 << 24 | len(members), 2048)
    types += b"".join(struct.pack("<III", at[n], 1, off) for n, off in members)
    header = struct.pack("<HBBIIIII", BTF_MAGIC, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def test_member_offsets_of_the_struct_named():
    b = blob()
    assert find_member(b, "task_struct", "pid") == 1264
    assert find_member(b, "task_struct", "tgid") == 1268
    assert find_member(b, "other", "pid") == 0  # same member name, another struct
    assert find_member(b, "task_struct", "missing") is None
    assert find_member(b, "missing", "pid") is None


def test_several_members_in_one_pass():
    want = [("task_struct", "tgid"), ("other", "pid"), ("task_struct", "pid"), ("missing", "pid"),
            ("task_struct", "missing")]
    assert find_members(blob(), want) == {("task_struct", "tgid"): 1268, ("other", "pid"): 0,
                                          ("task_struct", "pid"): 1264, ("missing", "pid"): None,
                                          ("task_struct", "missing"): None}
    assert member_offsets(want, "/nonexistent") == dict.fromkeys(want)


def test_a_bitfield_member_has_no_byte_offset():
    assert find_member(blob(bitfield=True), "task_struct", "pid") is None


def test_bad_bytes_never_raise():
    good = blob()
    rng = random.Random(7)
    for n in range(300):
        bad = bytearray(good[:rng.randrange(len(good))] if n % 2 else good)
        for _ in range(rng.randrange(1, 8)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        got = find_member(bytes(bad), "task_struct", "pid")  # must not raise
        assert got is None or isinstance(got, int)
    assert find_member(b"", "task_struct", "pid") is None
    assert member_offset("task_struct", "pid", "/nonexistent") is None


def test_a_file_is_read_once_until_it_changes(tmp_path, monkeypatch):
    from sitsprobe.probes import btf

    passes = []
    monkeypatch.setattr(btf, "find_members", lambda data, wanted: passes.append(1) or find_members(data, wanted))
    path = tmp_path / "vmlinux"
    path.write_bytes(blob())
    want = [("task_struct", "pid")]
    assert member_offsets(want, str(path)) == {("task_struct", "pid"): 1264}
    member_offsets(want, str(path))[("task_struct", "pid")] = -1  # a caller's copy, not the kept one
    assert member_offsets(want, str(path)) == {("task_struct", "pid"): 1264}
    assert len(passes) == 1
    assert member_offsets([("task_struct", "tgid")], str(path)) == {("task_struct", "tgid"): 1268}
    assert len(passes) == 2  # other members: another pass
    path.write_bytes(blob(bitfield=True))  # the same size: its time tells it apart
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert member_offsets(want, str(path)) == {("task_struct", "pid"): None}
    assert len(passes) == 3
