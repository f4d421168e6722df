"""Requests counted in the kernel (bpf/net.c, BINS): the `bins`, `shapes`,
`sampling` and `taken` maps.

A plain HTTP/1.x server exchange whose method and path userspace has told the
kernel it knows the route of (its *shape*, a hash the kernel computes) is
counted into a per-(process, shape, status) histogram in the kernel, and
crosses the ring buffer only when it is chosen for a trace. The histograms
are read here as deltas since the last read, for the agent to add to its own.
"""
from __future__ import annotations

import ctypes as ct
from collections.abc import Sequence
from typing import NamedTuple

from ..abi import SEG_COUNT

BPF_NOEXIST = 1  # map update flag: create only
MAX_BINS = 4096  # series (process, method and path, status) the kernel holds, and shapes it knows


def bin_flags(duration_buckets: Sequence[float], segment_buckets: Sequence[float],
              max_bins: int = MAX_BINS) -> list[str]:
    """-D constants: the kernel's buckets are the histograms' own. A value's
    bucket is how many upper bounds it is above (bisect_left's index)."""
    return ["-DBINS=1", f"-DMAX_BINS={max_bins}",
            f"-DDUR_SLOTS={len(duration_buckets) + 1}", f"-DDUR_SLOT(ns)={_slot(duration_buckets)}",
            f"-DSEG_SLOTS={len(segment_buckets) + 1}", f"-DSEG_SLOT(ns)={_slot(segment_buckets)}"]


def _slot(bounds: Sequence[float]) -> str:
    """A binary search as nested conditionals: a few compares, no table."""
    ns = [round(b * 1e9) for b in bounds]

    def within(lo: int, hi: int) -> str:  # the first i in [lo, hi) with value <= ns[i], else hi
        if lo == hi:
            return str(lo)
        mid = (lo + hi) // 2
        return f"((ns)<={ns[mid]}ULL?{within(lo, mid)}:{within(mid + 1, hi)})"
    return within(0, len(ns))


class BinDelta(NamedTuple):
    """What one series gained since the last read."""

    tgid: int
    shape: int
    status: int
    count: int
    sum_ns: int
    bytes_in: int
    bytes_out: int
    durations: tuple[int, ...]  # per bucket, +Inf last
    segment_sums_ns: tuple[int, ...]  # per segment (stitch.segments order)
    segments: tuple[tuple[int, ...], ...]  # per segment, per bucket


class KernelBins:
    """The maps of in-kernel counting. Only this class touches them."""

    def __init__(self, bpf):
        from bcc.libbcc import lib  # the probes layer is the only one that imports bcc

        self._lib = lib
        self._bins, self._shapes = bpf["bins"], bpf["shapes"]
        self._taken, self._sampling = bpf["taken"], bpf["sampling"]
        self._last: dict[tuple[int, int, int], tuple] = {}

    def learn(self, shape: int) -> bool:
        """Exchanges of this shape may be counted in the kernel from now on;
        False: the map is full, and they go on crossing the ring. The agent
        asks once per shape (it keeps what each stands for)."""
        key = self._shapes.Key(shape)
        one = self._shapes.Leaf(1)
        if self._lib.bpf_update_elem(self._shapes.map_fd, ct.byref(key), ct.byref(one), 0) != 0:
            return False
        return True

    def sample(self, everything: bool, rate: float, slow_ns: int) -> None:
        """Which binned exchanges still cross the ring (struct sampling)."""
        zero = self._sampling.Key(0)
        s = self._sampling[zero]
        s.all, s.rate, s.slow_ns = int(everything), max(0, int(rate)), max(0, int(slow_ns))
        self._sampling[zero] = s

    def claim(self, conn_key: int, start_ns: int, unchanged) -> bool:
        """Whether userspace may count an open CF_BINNED exchange itself (an
        idle flush), so that the kernel does not count it too when it ends.

        The claim goes into `taken` first; then ``unchanged()`` reads the
        connection's entry again. Unchanged: the kernel has not begun to end
        the exchange (it moves the entry's seq before it looks at `taken`),
        and will find the claim and leave the exchange alone. Changed: the
        claim is withdrawn; if it is already gone, the kernel honoured it and
        the exchange is ours; else the kernel counts it, and the exchange is
        left for its report."""
        key, start = self._taken.Key(conn_key), self._taken.Leaf(start_ns)
        fd = self._taken.map_fd
        if self._lib.bpf_update_elem(fd, ct.byref(key), ct.byref(start), BPF_NOEXIST) != 0:
            self._lib.bpf_update_elem(fd, ct.byref(key), ct.byref(start), 0)  # an old claim's
        if unchanged():
            return True
        return self._lib.bpf_delete_elem(fd, ct.byref(key)) != 0  # gone: the kernel took it

    def deltas(self, tgid: int | None = None, remove: bool = False) -> list[BinDelta]:
        """Every series' growth since the last read (with ``tgid``, that
        process's only; with ``remove``, its series then leave the map)."""
        out = []
        for k, v in self._bins.items():
            if tgid is not None and k.tgid != tgid:
                continue
            key = (k.tgid, k.shape, k.status)
            seg = tuple(v.seg)  # SEG_COUNT runs of buckets
            width = len(seg) // SEG_COUNT
            now = (v.count, v.sum_ns, v.bytes_in, v.bytes_out, tuple(v.dur), tuple(v.seg_sum_ns),
                   tuple(seg[i * width:(i + 1) * width] for i in range(SEG_COUNT)))
            before = self._last.get(key)
            if remove:
                self._bins.pop(k, None)
                self._last.pop(key, None)
            else:
                self._last[key] = now
            if before is None:
                out.append(BinDelta(*key, *now))
            elif before != now:  # a series is updated field by field: any field may have moved
                out.append(BinDelta(*key, *(a - b for a, b in zip(now[:4], before[:4])),
                                    tuple(a - b for a, b in zip(now[4], before[4])),
                                    tuple(a - b for a, b in zip(now[5], before[5])),
                                    tuple(tuple(a - b for a, b in zip(r, q)) for r, q in zip(now[6], before[6]))))
        return out
