"""The utilization-collapse detector: pure logic over the time series fed to it.

A GPU collapses when its busy share falls well below its own recent working
level (or under an absolute floor) while work keeps waiting for it, and stays
there. A GPU idling because nothing arrives (input starvation) is not a
collapse and raises nothing. Each alert names the likeliest cause from the
evidence over its window: throttling, memory_pressure, cpu_bound,
scheduler_starvation, copy_bound, sync_stall, or unknown.

Raising needs most samples of ``sustain_s`` low; clearing needs most samples
of ``clear_s`` recovered above a higher bar (or the demand gone): between the
two bars nothing changes, so a signal hovering at a threshold never flaps.
Timestamps are the caller's (monotonic ns); the detector never reads a clock.
It is safe to feed from several threads (the sampler's, the agent loop's).
"""
from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

THROTTLING = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                        "hw_thermal_slowdown", "hw_power_brake_slowdown"})
CAUSES = ("throttling", "memory_pressure", "cpu_bound", "scheduler_starvation",
          "copy_bound", "sync_stall", "unknown")
RAISED, CLEARED = "raised", "cleared"


@dataclass(frozen=True, slots=True)
class CollapseConfig:
    baseline_window_s: float = 300.0  # busy history the working level is taken from
    baseline_percentile: float = 90.0  # the working level: this percentile of it
    min_history_s: float = 30.0  # history needed before the relative test applies
    min_working_percent: float = 10.0  # a lower working level is idling, not working
    drop_ratio: float = 0.5  # low: busy under drop_ratio x working level ...
    floor_percent: float = 5.0  # ... or under this, whatever the history
    recover_ratio: float = 0.7  # recovered: busy at or over recover_ratio x working level
    sustain_s: float = 5.0  # low, with demand, this long to raise
    clear_s: float = 5.0  # recovered (or no demand) this long to clear
    hold_fraction: float = 0.8  # share of samples in such a window that must agree
    min_demand: float = 1.0  # requests in flight + queued on the GPU's processes
    demand_stale_s: float = 2.0  # a demand reading older than this counts as none
    cpu_bound_share: float = 0.85  # an engine thread's on-CPU share (of one CPU)
    runq_wait_share: float = 0.25  # an engine thread's share of time waiting for a CPU
    copy_share: float = 0.3  # share of time blocked in synchronous copies
    sync_share: float = 0.5  # share of time blocked in stream/device synchronize
    throttle_fraction: float = 0.5  # share of busy samples with a throttling reason
    memory_pressure_ratio: float = 0.95  # GPU memory used / total


@dataclass(frozen=True, slots=True)
class Alert:
    gpu: int
    pid: int  # the process the cause points at; 0 when none does
    cause: str  # one of CAUSES
    state: str  # RAISED or CLEARED
    window_start_ns: int  # raised: the low window; cleared: the whole collapse
    window_end_ns: int
    evidence: dict[str, Any] = field(hash=False, compare=False)


@dataclass
class _Gpu:
    busy: deque = field(default_factory=deque)  # (ts, busy %, counts toward the level)
    marks: deque = field(default_factory=deque)  # (ts, low with demand, recovered or idle)
    throttled: deque = field(default_factory=deque)  # (ts, any throttling reason)
    memory: deque = field(default_factory=deque)  # (ts, used / total)
    level: float | None = None  # working level, kept while raised
    low_since: int | None = None  # start of the current run of low-with-demand samples
    ok_since: int | None = None  # start of the current run of recovered (or idle) samples
    alert: Alert | None = None


def _mean(series: Iterable[tuple], start: int, end: int, i: int = 1) -> float | None:
    vals = [r[i] for r in series if start <= r[0] <= end]
    return sum(vals) / len(vals) if vals else None


def _percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


def _locked(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return wrapper


class CollapseDetector:
    def __init__(self, config: CollapseConfig = CollapseConfig()):
        self.config = config
        self._lock = threading.RLock()
        self._gpus: dict[int, _Gpu] = {}
        self._gpu_of: dict[int, set[int]] = {}  # pid -> the GPUs its demand is on
        self._demand: dict[int, deque] = {}  # pid -> (ts, in flight + queued)
        self._host: dict[int, deque] = {}  # pid -> (ts, on-CPU max, run-queue wait max)
        self._cuda: dict[int, deque] = {}  # pid -> (ts, copy share, sync share)
        self._raised_total: dict[tuple[int, str], int] = {}

    # -- inputs ---------------------------------------------------------------------

    @_locked
    def observe_demand(self, gpu: int, pid: int, ts_ns: int, in_flight: float,
                       queued: float = 0) -> None:
        """Requests the process has in flight (and queued) now; call once per GPU
        it runs on (sitsprobe.gpu.nvml.NvmlSampler.process_gpus)."""
        self._gpu_of.setdefault(pid, set()).add(gpu)
        series = self._demand.setdefault(pid, deque())
        if not series or series[-1] != (ts_ns, in_flight + queued):  # once per reading
            self._push(self._demand, pid, (ts_ns, in_flight + queued))

    @_locked
    def observe_host(self, pid: int, ts_ns: int, on_cpu_max: float, runq_wait_max: float) -> None:
        """From a gpu.host.HostSample: busiest thread's on-CPU share, worst run-queue wait share."""
        self._push(self._host, pid, (ts_ns, on_cpu_max, runq_wait_max))

    @_locked
    def observe_cuda(self, pid: int, ts_ns: int, copy_share: float, sync_share: float) -> None:
        """From a gpu.cuda.CudaShares: time shares blocked in copies and in synchronize."""
        self._push(self._cuda, pid, (ts_ns, copy_share, sync_share))

    @_locked
    def forget(self, pid: int) -> None:
        for table in (self._gpu_of, self._demand, self._host, self._cuda):
            table.pop(pid, None)

    @_locked
    def observe_sample(self, s) -> list[Alert]:
        """A gpu.nvml.GpuSample (one without a busy reading is skipped)."""
        if s.busy_percent is None:
            return []
        mem = (s.memory_used_bytes / s.memory_total_bytes
               if s.memory_used_bytes is not None and s.memory_total_bytes else None)
        return self.observe_gpu(s.gpu, s.ts_ns, s.busy_percent, s.throttle_reasons, mem)

    @_locked
    def observe_gpu(self, gpu: int, ts_ns: int, busy_percent: float,
                    throttle_reasons: Iterable[str] = (), memory_used_ratio: float | None = None
                    ) -> list[Alert]:
        """A busy reading; returns the alerts it raised or cleared."""
        c, g = self.config, self._gpus.setdefault(gpu, _Gpu())
        g.throttled.append((ts_ns, float(bool(THROTTLING.intersection(throttle_reasons)))))
        if memory_used_ratio is not None:
            g.memory.append((ts_ns, memory_used_ratio))
        level = self._level(g, ts_ns)
        g.busy.append((ts_ns, busy_percent, g.alert is None))
        relative = level is not None and level >= c.min_working_percent
        demand = self._demand_now(gpu, ts_ns)
        low = busy_percent < c.floor_percent or (relative and busy_percent < c.drop_ratio * level)
        recovered = busy_percent >= c.floor_percent and (
            not relative or busy_percent >= c.recover_ratio * level)
        has_demand = demand >= c.min_demand
        g.marks.append((ts_ns, low and has_demand, recovered or not has_demand))
        self._trim(g, ts_ns)
        g.low_since = self._run(g.marks, g.low_since, ts_ns, 1)
        g.ok_since = self._run(g.marks, g.ok_since, ts_ns, 2)
        if g.alert is None and low and has_demand and self._held(g.low_since, ts_ns, c.sustain_s):
            return [self._raise(gpu, g, ts_ns, busy_percent, level, demand)]
        if g.alert is not None and self._held(g.ok_since, ts_ns, c.clear_s):
            return [self._clear(g, ts_ns, busy_percent, has_demand)]
        return []

    # -- state ----------------------------------------------------------------------

    def _level(self, g: _Gpu, now: int) -> float | None:
        """The working level: a high percentile of busy over the baseline window,
        from samples older than the sustain window and taken outside a collapse."""
        c = self.config
        if g.alert is None and g.busy and now - g.busy[0][0] >= c.min_history_s * 1e9:
            cutoff = now - c.sustain_s * 1e9
            vals = [b for ts, b, counts in g.busy if counts and ts <= cutoff]
            if vals:
                g.level = _percentile(vals, c.baseline_percentile)
        return g.level

    def _run(self, marks: deque, since: int | None, now: int, i: int) -> int | None:
        """Where the current run of marks[i] began: it begins at a true mark and
        lasts while hold_fraction of the marks since are true (noise inside a run
        does not end it; a run mostly false does)."""
        mark = marks[-1][i]
        if since is None:
            return now if mark else None
        window = [m[i] for m in marks if m[0] >= since]
        if sum(window) >= self.config.hold_fraction * len(window):
            return since
        return now if mark else None

    @staticmethod
    def _held(since: int | None, now: int, span_s: float) -> bool:
        return since is not None and now - since >= span_s * 1e9

    def _demand_now(self, gpu: int, now: int) -> float:
        stale = now - self.config.demand_stale_s * 1e9
        total = 0.0
        for pid, series in self._demand.items():
            if gpu in self._gpu_of.get(pid, ()):
                latest = [v for ts, v in series if stale <= ts <= now]
                total += latest[-1] if latest else 0.0
        return total

    def _raise(self, gpu: int, g: _Gpu, now: int, busy: float, level: float | None,
               demand: float) -> Alert:
        start = g.low_since
        pid, cause, evidence = self._diagnose(gpu, g, start, now)
        evidence.update(busy_percent=round(busy, 2),
                        busy_mean_percent=_round(_mean(g.busy, start, now)),
                        working_level_percent=_round(level), demand=demand)
        g.alert, g.ok_since = Alert(gpu, pid, cause, RAISED, start, now, evidence), None
        key = (gpu, cause)
        self._raised_total[key] = self._raised_total.get(key, 0) + 1
        return g.alert

    def _clear(self, g: _Gpu, now: int, busy: float, has_demand: bool) -> Alert:
        a = g.alert
        evidence = dict(a.evidence, cleared_by="recovered" if has_demand else "demand_ended",
                        busy_percent_at_clear=round(busy, 2))
        g.alert, g.low_since = None, None
        return Alert(a.gpu, a.pid, a.cause, CLEARED, a.window_start_ns, now, evidence)

    def _diagnose(self, gpu: int, g: _Gpu, start: int, end: int) -> tuple[int, str, dict]:
        """The strongest cause over [start, end] (each scored against its
        threshold), and every signal seen, as evidence."""
        c = self.config
        throttled, memory = _mean(g.throttled, start, end), _mean(g.memory, start, end)
        evidence: dict[str, Any] = {"throttled_fraction": _round(throttled),
                                    "memory_used_ratio": _round(memory)}
        best = [((throttled or 0) / c.throttle_fraction, 0, "throttling"),
                ((memory or 0) / c.memory_pressure_ratio, 0, "memory_pressure")]
        pids = sorted(p for p, gpus in self._gpu_of.items() if gpu in gpus)
        for pid in pids:
            signals = {
                "on_cpu_max": _mean(self._host.get(pid, ()), start, end, 1),
                "runq_wait_max": _mean(self._host.get(pid, ()), start, end, 2),
                "copy_share": _mean(self._cuda.get(pid, ()), start, end, 1),
                "sync_share": _mean(self._cuda.get(pid, ()), start, end, 2),
                "demand_mean": _mean(self._demand.get(pid, ()), start, end, 1),
            }
            evidence[f"pid_{pid}"] = {k: _round(v) for k, v in signals.items()}
            for cause, key, bar in (("cpu_bound", "on_cpu_max", c.cpu_bound_share),
                                    ("scheduler_starvation", "runq_wait_max", c.runq_wait_share),
                                    ("copy_bound", "copy_share", c.copy_share),
                                    ("sync_stall", "sync_share", c.sync_share)):
                best.append(((signals[key] or 0) / bar, pid, cause))
        score, pid, cause = max(best, key=lambda b: (b[0], -CAUSES.index(b[2])))
        busiest = max(pids, key=lambda p: _mean(self._demand.get(p, ()), start, end) or 0,
                      default=0)
        if score < 1:
            return busiest, "unknown", evidence
        evidence["score"] = round(score, 2)
        return pid or busiest, cause, evidence  # a GPU-wide cause names the busiest process

    def _push(self, table: dict[int, deque], pid: int, row: tuple) -> None:
        series = table.setdefault(pid, deque())
        series.append(row)
        keep = 4 * max(self.config.sustain_s, self.config.clear_s, self.config.demand_stale_s)
        while series and series[0][0] < row[0] - keep * 1e9:
            series.popleft()

    def _trim(self, g: _Gpu, now: int) -> None:
        c = self.config
        horizon = now - c.baseline_window_s * 1e9
        while g.busy and g.busy[0][0] < horizon:
            g.busy.popleft()
        recent = now - 2 * max(c.sustain_s, c.clear_s) * 1e9
        for series in (g.marks, g.throttled, g.memory):
            while series and series[0][0] < recent:
                series.popleft()

    # -- outputs --------------------------------------------------------------------

    @_locked
    def active(self) -> dict[int, Alert]:
        """GPU -> its raised alert."""
        return {gpu: g.alert for gpu, g in self._gpus.items() if g.alert is not None}

    @_locked
    def raised_total(self) -> dict[tuple[int, str], int]:
        """(gpu, cause) -> alerts raised so far."""
        return dict(self._raised_total)

    @_locked
    def status(self) -> dict[int, dict[str, Any]]:
        """Per GPU, what the detector holds now (for `top` and the GPU check)."""
        out = {}
        for gpu, g in self._gpus.items():
            last = g.busy[-1] if g.busy else (0, None, True)
            out[gpu] = {"busy_percent": last[1], "working_level_percent": _round(g.level),
                        "demand": self._demand_now(gpu, last[0]),
                        "alert": g.alert.cause if g.alert else None}
        return out


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
