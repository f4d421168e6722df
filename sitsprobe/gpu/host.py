"""Host-side demand signals for the collapse detector, read from /proc.

For each thread of a process, over the interval between two reads:
  on-CPU share     (utime + stime) from /proc/PID/task/TID/stat, in CPUs
  run-queue wait   the 2nd field of /proc/PID/task/TID/schedstat: ns spent
                   runnable but waiting for a CPU (the 3rd: times scheduled in)
A GPU idling while one engine thread sits near 1.0 on-CPU is CPU-bound; one
whose threads wait long in the run queue is starved by the scheduler.
Every read takes the /proc root as a parameter, so tests use fixture trees.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_GONE = (FileNotFoundError, ProcessLookupError, PermissionError)


@dataclass(frozen=True, slots=True)
class ThreadTimes:
    tid: int
    comm: str
    cpu_ticks: int  # utime + stime, in clock ticks
    wait_ns: int  # run-queue wait
    slices: int  # times scheduled in


@dataclass(frozen=True, slots=True)
class ThreadShare:
    tid: int
    comm: str
    on_cpu: float  # share of one CPU over the interval
    runq_wait: float  # share of the interval runnable but not running


@dataclass(frozen=True, slots=True)
class HostSample:
    pid: int
    ts_ns: int
    interval_ns: int
    threads: tuple[ThreadShare, ...]  # busiest first
    on_cpu_max: float  # the busiest thread's share of a CPU (~1.0: one thread pegged)
    on_cpu_total: float  # all threads together, in CPUs
    runq_wait_max: float  # the most-delayed thread's share of the interval spent waiting
    runq_latency_ns: float  # mean wait per time a thread was scheduled in


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except _GONE:
        return None
    except OSError:  # ESRCH and friends from a thread exiting mid-read
        return None


def read_threads(pid: int, proc: str = "/proc") -> dict[int, ThreadTimes]:
    """tid -> its counters now; empty when the process is gone."""
    try:
        tids = [int(t) for t in os.listdir(f"{proc}/{pid}/task") if t.isdigit()]
    except _GONE:
        return {}
    out = {}
    for tid in tids:
        stat = _read(f"{proc}/{pid}/task/{tid}/stat")
        sched = _read(f"{proc}/{pid}/task/{tid}/schedstat")
        if not stat or ")" not in stat:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()  # fields[0] is field 3, state
        ss = (sched or "0 0 0").split()
        out[tid] = ThreadTimes(tid, comm, int(fields[11]) + int(fields[12]), int(ss[1]), int(ss[2]))
    return out


class HostSampler:
    """Call sample(pid) every interval; each call covers the time since the last."""

    def __init__(self, proc: str = "/proc", threads: str | None = None,
                 clock_ticks: int | None = None, monotonic_ns: Callable[[], int] = time.monotonic_ns):
        self._proc = proc
        self._filter = re.compile(threads) if threads else None  # regex on thread comm
        self._tick_ns = 1e9 / (clock_ticks or os.sysconf("SC_CLK_TCK"))
        self._now = monotonic_ns
        self._last: dict[int, tuple[int, dict[int, ThreadTimes]]] = {}

    def sample(self, pid: int, now_ns: int | None = None) -> HostSample | None:
        """The interval since the previous call for pid; None on the first, or once it is gone."""
        now = self._now() if now_ns is None else now_ns
        threads = read_threads(pid, self._proc)
        if self._filter is not None:
            threads = {t: v for t, v in threads.items() if self._filter.search(v.comm)}
        prev = self._last.get(pid)
        if not threads:
            self._last.pop(pid, None)
            return None
        self._last[pid] = (now, threads)
        if prev is None or now <= prev[0]:
            return None
        interval = now - prev[0]
        shares, waited, slices = [], 0, 0
        for tid, cur in threads.items():
            old = prev[1].get(tid)
            if old is None:
                continue  # born during the interval: counted from the next one
            dwait, dslices = max(0, cur.wait_ns - old.wait_ns), max(0, cur.slices - old.slices)
            waited, slices = waited + dwait, slices + dslices
            on_cpu = max(0, cur.cpu_ticks - old.cpu_ticks) * self._tick_ns / interval
            shares.append(ThreadShare(tid, cur.comm, on_cpu, dwait / interval))
        shares.sort(key=lambda s: (-s.on_cpu, s.tid))
        return HostSample(
            pid=pid, ts_ns=now, interval_ns=interval, threads=tuple(shares),
            on_cpu_max=max((s.on_cpu for s in shares), default=0.0),
            on_cpu_total=sum(s.on_cpu for s in shares),
            runq_wait_max=max((s.runq_wait for s in shares), default=0.0),
            runq_latency_ns=waited / slices if slices else 0.0)

    def sample_all(self, pids: Iterable[int], now_ns: int | None = None) -> list[HostSample]:
        """sample() each pid; pids no longer listed are forgotten."""
        pids = list(pids)
        for gone in set(self._last) - set(pids):
            del self._last[gone]
        return [s for pid in pids if (s := self.sample(pid, now_ns)) is not None]

    def forget(self, pid: int) -> None:
        self._last.pop(pid, None)
