"""What the CUDA probes count, as plain records (no bcc here: sinks and the
collapse detector read these, only sitsprobe.probes.cuda loads BPF)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from ..abi import CUDA_FN_NAMES as FUNCTIONS  # enum cuda_fn order

COPIES = ("cudaMemcpy", "cudaMemcpyAsync")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
TIMED = ("cudaMemcpy", *SYNCS, "cudaMalloc", "cudaFree")  # these have a return probe
# cudaMemcpyKind 0..4, and 5 for a value outside it
DIRECTIONS = ("host_to_host", "host_to_device", "device_to_host", "device_to_device",
              "default", "other")


@dataclass(frozen=True, slots=True)
class CudaCount:
    """The kernel's running totals for one (process, function, direction)."""

    pid: int
    function: str  # one of FUNCTIONS
    direction: str  # one of DIRECTIONS for copies, "" otherwise
    calls: int
    errors: int  # failed returns, for functions with a return probe
    bytes: int  # copies: bytes asked; cudaMalloc: allocated; cudaFree: freed
    ns: int  # time inside the call, for functions with a return probe
    process: str = ""  # set (with pid 0) on the totals of exited processes of this name


@dataclass(frozen=True, slots=True)
class CudaShares:
    """Share of wall time a process spent blocked in CUDA calls over an
    interval (summed over its threads, so it can pass 1.0)."""

    pid: int
    ts_ns: int
    interval_ns: int
    copy: float  # inside synchronous cudaMemcpy
    sync: float  # inside cudaStreamSynchronize / cudaDeviceSynchronize
    launches: int  # kernel and graph launches in the interval


class Totals(NamedTuple):
    """A process's running totals, summed over functions and directions."""

    copy_ns: int  # inside synchronous cudaMemcpy
    sync_ns: int  # inside stream/device synchronize
    launches: int  # kernel and graph launches
    copy_bytes: int  # asked of cudaMemcpy / cudaMemcpyAsync


def totals(counts: Iterable[CudaCount]) -> dict[int, Totals]:
    """pid -> its Totals."""
    out: dict[int, list[int]] = {}
    for c in counts:
        t = out.setdefault(c.pid, [0, 0, 0, 0])
        if c.function in COPIES:
            t[3] += c.bytes
            if c.function == "cudaMemcpy":
                t[0] += c.ns
        elif c.function in SYNCS:
            t[1] += c.ns
        elif "Launch" in c.function:
            t[2] += c.calls
    return {pid: Totals(*t) for pid, t in out.items()}


class ShareTracker:
    """Turns successive snapshots of the running totals into per-interval shares."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, Totals]] = {}

    def update(self, current: dict[int, Totals], now_ns: int) -> list[CudaShares]:
        """current: totals(counts) read now."""
        out = []
        for pid, cur in current.items():
            prev = self._last.get(pid)
            self._last[pid] = (now_ns, cur)
            if prev is None or now_ns <= prev[0]:
                continue
            dt = now_ns - prev[0]
            (c0, s0, l0, _), (c1, s1, l1, _) = prev[1], cur
            out.append(CudaShares(pid, now_ns, dt, max(0, c1 - c0) / dt, max(0, s1 - s0) / dt,
                                  max(0, l1 - l0)))
        for pid in [p for p in self._last if p not in current]:
            del self._last[pid]
        return out
