"""Host-side signals from /proc: fixture trees, and a real busy loop."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sitsprobe.gpu.host import HostSampler, read_threads

S = 1_000_000_000


def stat_line(tid: int, comm: str, utime: int, stime: int) -> str:
    # fields 3.. of /proc/PID/task/TID/stat; utime and stime are fields 14 and 15
    rest = ["R", "1", "1", "0", "0", "-1", "4194304", "0", "0", "0", "0", str(utime), str(stime)]
    rest += ["0"] * 39
    return f"{tid} ({comm}) " + " ".join(rest) + "\n"


class FakeProc:
    def __init__(self, root: Path, pid: int):
        self.root, self.pid = root, pid

    def thread(self, tid: int, comm: str, ticks: tuple[int, int], sched: tuple[int, int, int] | None):
        d = self.root / str(self.pid) / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(stat_line(tid, comm, *ticks))
        if sched is not None:
            (d / "schedstat").write_text(" ".join(map(str, sched)) + "\n")

    def remove(self, tid: int):
        d = self.root / str(self.pid) / "task" / str(tid)
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


def test_shares_over_the_interval_from_a_fixture_tree(tmp_path):
    p = FakeProc(tmp_path, 500)
    p.thread(500, "python3", (1000, 200), (0, 5_000_000, 10))
    p.thread(501, "engine loop", (50, 0), (0, 1_000_000, 40))
    p.thread(502, "we(ird) name)", (0, 0), (0, 0, 0))
    h = HostSampler(proc=str(tmp_path), clock_ticks=100)
    assert h.sample(500, now_ns=10 * S) is None  # the first read opens the interval
    p.thread(500, "python3", (1010, 210), (0, 5_000_000, 12))  # 20 ticks = 0.2 s of 1 s
    p.thread(501, "engine loop", (140, 5), (0, 301_000_000, 60))  # 95 ticks; waited 300 ms
    p.thread(503, "born later", (99, 0), (0, 0, 0))
    s = h.sample(500, now_ns=11 * S)
    assert s.interval_ns == S and s.pid == 500 and s.ts_ns == 11 * S
    assert [(t.tid, t.comm) for t in s.threads] == [(501, "engine loop"), (500, "python3"),
                                                   (502, "we(ird) name)")]
    assert s.on_cpu_max == pytest.approx(0.95)
    assert s.on_cpu_total == pytest.approx(1.15)
    assert s.runq_wait_max == pytest.approx(0.3)
    assert s.runq_latency_ns == pytest.approx(300_000_000 / 22)  # waited / times scheduled in
    assert s.threads[1].runq_wait == 0.0


def test_thread_filter_and_missing_schedstat(tmp_path):
    p = FakeProc(tmp_path, 7)
    p.thread(7, "python3", (0, 0), None)  # a kernel without schedstat
    p.thread(8, "gpu-worker", (0, 0), (0, 0, 0))
    h = HostSampler(proc=str(tmp_path), threads=r"^gpu-", clock_ticks=100)
    h.sample(7, now_ns=S)
    p.thread(7, "python3", (100, 0), None)
    p.thread(8, "gpu-worker", (30, 0), (0, 100_000_000, 5))
    s = h.sample(7, now_ns=2 * S)
    assert [t.tid for t in s.threads] == [8] and s.on_cpu_max == pytest.approx(0.3)
    assert read_threads(7, str(tmp_path))[7].wait_ns == 0


def test_a_process_that_is_gone(tmp_path):
    p = FakeProc(tmp_path, 9)
    p.thread(9, "x", (0, 0), (0, 0, 0))
    h = HostSampler(proc=str(tmp_path), clock_ticks=100)
    h.sample(9, now_ns=S)
    p.remove(9)
    assert h.sample(9, now_ns=2 * S) is None
    assert h.sample(12345, now_ns=2 * S) is None
    assert read_threads(12345, str(tmp_path)) == {}


def test_sample_all_forgets_pids_no_longer_listed(tmp_path):
    a, b = FakeProc(tmp_path, 1), FakeProc(tmp_path, 2)
    a.thread(1, "a", (0, 0), (0, 0, 0))
    b.thread(2, "b", (0, 0), (0, 0, 0))
    h = HostSampler(proc=str(tmp_path), clock_ticks=100)
    assert h.sample_all([1, 2], now_ns=S) == []
    assert [s.pid for s in h.sample_all([1], now_ns=2 * S)] == [1]
    assert h.sample_all([1, 2], now_ns=3 * S)[1:] == []  # 2 starts over


def _spin(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_real_busy_loop_is_near_one_cpu():
    busy, idle = _spin("while True: pass"), _spin("import time; time.sleep(60)")
    try:
        h = HostSampler()
        time.sleep(0.3)
        h.sample_all([busy.pid, idle.pid])
        time.sleep(2.0)
        s = {x.pid: x for x in h.sample_all([busy.pid, idle.pid])}
        # on a 2-core machine shared with other test runs the loop may wait for a CPU
        # now and then, but it is always running or waiting to run
        assert s[busy.pid].on_cpu_max > 0.5, s[busy.pid]
        assert s[busy.pid].on_cpu_max + s[busy.pid].runq_wait_max > 0.9, s[busy.pid]
        assert s[idle.pid].on_cpu_max < 0.05, s[idle.pid]
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
