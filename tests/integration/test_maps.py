"""MapCopy against a real BPF hash map: every entry, whole, whether the
kernel copies them in batches or the fallback walks them one by one."""
from __future__ import annotations

import struct

import pytest

from .conftest import require_root

PROGRAM = b"""
struct entry { u64 id; u32 tgid; u8 state; u8 pad[300]; };
BPF_HASH(m, u64, struct entry, 4096);
"""


@pytest.fixture
def table():
    require_root()
    bcc = pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
    b = bcc.BPF(text=PROGRAM)
    yield b["m"]
    b.cleanup()


def _fill(table, n: int) -> dict[int, tuple[int, int, int]]:
    want = {}
    for i in range(n):
        key = (i * 7919) << 32 | i  # spread over the buckets like tgid << 32 | fd
        v = table.Leaf()
        v.id, v.tgid, v.state, v.pad[299] = key ^ 0xABCD, i, i % 3, i % 251
        table[table.Key(key)] = v
        want[key] = (key ^ 0xABCD, i, i % 3, i % 251)
    return want


def _read(copy) -> dict[int, tuple[int, int, int]]:
    n, keys, values = copy.read()
    size = copy.value_size
    assert len(keys) == 8 * n and len(values) == size * n
    got = {}
    for i, (key,) in enumerate(struct.iter_unpack("=Q", keys)):
        entry = bytes(values[i * size:(i + 1) * size])
        ident, tgid, state = struct.unpack_from("=QIB", entry)
        got[key] = (ident, tgid, state, entry[13 + 299])
    return got


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "one-by-one"])
def test_copies_every_entry_whole(table, batched):
    from sitsprobe.probes.maps import MapCopy

    copy = MapCopy(table, "m")
    copy.batched = batched
    assert copy.read()[0] == 0  # empty map
    want = _fill(table, 3000)
    assert _read(copy) == want
    assert copy.batched == batched  # this kernel has BPF_MAP_LOOKUP_BATCH (5.6+)
    for key in list(want)[:1000]:
        del table[table.Key(key)]
        del want[key]
    assert _read(copy) == want  # the buffers are reused: no stale tail


def test_full_map_reads_whole(table):
    from sitsprobe.probes.maps import MapCopy

    want = _fill(table, 4096)
    assert _read(MapCopy(table, "m")) == want
