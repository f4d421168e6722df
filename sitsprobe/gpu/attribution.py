"""Per-request GPU attribution: what the GPU did while a request was served.

``GpuTimeline`` keeps a short history: every NVML sample per GPU, and per
process, at each agent tick, its running CUDA totals (kernel launches, bytes
copied) and the requests its engine held. From that, for one request:

- each compute stage (prefill, a decode step) gets the GPU its process runs
  on and the busy % and memory used measured over the stage: NVML samples
  cover windows of their own, so each sample counts by how much of its
  window overlaps the stage; a stage no window has reached yet takes the
  latest sample before it;
- the request gets its share of the process's launches and copy bytes: the
  process's increase over the request's interval (totals interpolated
  between ticks) divided by the mean number of requests the engine held
  meanwhile. An estimate at the tick's resolution, and exported as one
  (``sitsprobe.cuda.attribution = "process_share"``).
"""
from __future__ import annotations

import bisect
import threading
from collections import deque

from .samples import GpuSample

COMPUTE_STAGES = frozenset({"prefill", "decode"})


class GpuTimeline:
    def __init__(self, keep_s: float = 120.0, max_points: int = 4096):
        self._keep_ns = int(keep_s * 1e9)
        self._max = max_points
        self._gpus: dict[int, deque[GpuSample]] = {}
        self._procs: dict[int, deque[tuple[int, int, int, float]]] = {}  # ts, launches, bytes, held
        self._on: dict[int, tuple[int, ...]] = {}  # pid -> its GPUs
        self._lock = threading.Lock()

    # -- input ------------------------------------------------------------------

    def add_sample(self, s: GpuSample) -> None:
        """An NVML sample (from the sampler's thread)."""
        if s.busy_percent is None:
            return
        with self._lock:
            self._append(self._gpus.setdefault(s.gpu, deque()), s, s.ts_ns)

    def add_process(self, pid: int, ts_ns: int, gpus: tuple[int, ...], launches: int,
                    copy_bytes: int, held: float) -> None:
        """A process's GPUs, CUDA running totals and requests held, at a tick."""
        with self._lock:
            if gpus:
                self._on[pid] = gpus
            self._append(self._procs.setdefault(pid, deque()), (ts_ns, launches, copy_bytes, held), ts_ns)

    def forget(self, pid: int) -> None:
        with self._lock:
            self._procs.pop(pid, None)
            self._on.pop(pid, None)

    def _append(self, series: deque, row, ts_ns: int) -> None:
        series.append(row)
        while len(series) > self._max or (series and _ts(series[0]) < ts_ns - self._keep_ns):
            series.popleft()

    # -- attribution ------------------------------------------------------------

    def stage(self, pid: int, start_ns: int, end_ns: int) -> dict:
        """Attributes for a compute stage of pid over [start, end]; {} when unknown."""
        with self._lock:
            gpus = self._on.get(pid, ())
            if not gpus:
                return {}
            attrs: dict = {"sitsprobe.gpu.index": gpus[0] if len(gpus) == 1 else list(gpus)}
            readings = [r for g in gpus if (r := _over(self._gpus.get(g, ()), start_ns, end_ns))]
        if readings:
            attrs["sitsprobe.gpu.busy_percent"] = round(sum(r[0] for r in readings) / len(readings), 2)
            attrs["sitsprobe.gpu.busy_signal"] = readings[0][2]
            used = [r[1] for r in readings if r[1] is not None]
            if used:
                attrs["sitsprobe.gpu.memory_used_bytes"] = int(sum(used))
        return attrs

    def request(self, pid: int, start_ns: int, end_ns: int) -> dict:
        """The request's share of pid's launches and copy bytes; {} without CUDA counts."""
        with self._lock:
            points = self._procs.get(pid, ())
            if len(points) < 2 or points[-1][1:3] == (0, 0):
                return {}  # no CUDA calls seen from it
            series = []  # back from the newest to the last point at or before the start
            for row in reversed(points):
                series.append(row)
                if row[0] <= start_ns:
                    break
        series.reverse()
        launches = _at(series, end_ns, 1) - _at(series, start_ns, 1)
        copied = _at(series, end_ns, 2) - _at(series, start_ns, 2)
        held = [r[3] for r in series if start_ns <= r[0] <= end_ns] or [_at(series, end_ns, 3)]
        share = 1 / max(1.0, sum(held) / len(held))
        return {"sitsprobe.cuda.launches": round(max(0.0, launches) * share, 1),
                "sitsprobe.cuda.copy_bytes": int(max(0.0, copied) * share),
                "sitsprobe.cuda.attribution": "process_share"}


def _ts(row) -> int:
    return row.ts_ns if isinstance(row, GpuSample) else row[0]


def _over(samples: deque[GpuSample], start: int, end: int) -> tuple[float, int | None, str] | None:
    """(busy %, memory used, signal) over [start, end], overlap-weighted; else
    the latest sample before it. Walks back from the newest sample: the stages
    asked about are recent, so this reads a few samples, not the history."""
    weight = busy = 0.0
    covering = before = None
    for s in reversed(samples):
        if s.ts_ns <= start:  # its window ends before the stage, and so do the older ones'
            before = s
            break
        overlap = min(s.ts_ns, end) - max(s.ts_ns - s.window_ns, start)
        if overlap > 0:
            weight, busy = weight + overlap, busy + overlap * s.busy_percent
            covering = covering or s
    s = covering or before
    if s is None:
        return None
    return (busy / weight if weight else s.busy_percent), s.memory_used_bytes, s.signal


def _at(series: list[tuple], ts: int, i: int) -> float:
    """Column i of a time series at ts, linear between points, clamped at the ends."""
    times = [r[0] for r in series]
    k = bisect.bisect_left(times, ts)
    if k == 0:
        return series[0][i]
    if k == len(series):
        return series[-1][i]
    (t0, *a), (t1, *b) = series[k - 1], series[k]
    return a[i - 1] + (b[i - 1] - a[i - 1]) * (ts - t0) / (t1 - t0)
