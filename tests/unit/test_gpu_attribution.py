"""Per-request GPU attribution from NVML windows and CUDA running totals."""
from __future__ import annotations

import pytest

from sitsprobe.gpu.attribution import GpuTimeline
from sitsprobe.gpu.samples import GpuSample

PID = 77


def sample(ts, busy, used=1 << 30, window=1000, gpu=0):
    return GpuSample(gpu=gpu, uuid="GPU-a", ts_ns=ts, window_ns=window, signal="gpm_sm_util",
                     busy_percent=busy, memory_used_bytes=used)


@pytest.fixture
def timeline():
    t = GpuTimeline()
    t.add_sample(sample(1000, 80.0, used=10))  # covers 0..1000
    t.add_sample(sample(2000, 20.0, used=30))  # covers 1000..2000
    t.add_sample(GpuSample(gpu=0, uuid="GPU-a", ts_ns=2100, window_ns=0, signal="gpm_sm_util",
                           busy_percent=None))  # a tick without a reading: ignored
    t.add_process(PID, 0, (0,), 0, 0, 1)
    return t


@pytest.mark.parametrize("start, end, busy, used", [
    (500, 1500, 50.0, 30),   # half of each window
    (0, 1000, 80.0, 10),     # exactly the first
    (900, 1000, 80.0, 10),   # inside the first
    (1200, 1300, 20.0, 30),  # inside the second
    (2500, 2600, 20.0, 30),  # no window reaches it yet: the latest before it
])
def test_a_stage_takes_the_windows_it_overlaps(timeline, start, end, busy, used):
    assert timeline.stage(PID, start, end) == {
        "sitsprobe.gpu.index": 0, "sitsprobe.gpu.busy_percent": busy,
        "sitsprobe.gpu.busy_signal": "gpm_sm_util", "sitsprobe.gpu.memory_used_bytes": used}


def test_a_stage_before_any_sample_names_only_its_gpu(timeline):
    assert timeline.stage(PID, -500, -100) == {"sitsprobe.gpu.index": 0}


def test_a_process_on_no_gpu_gets_nothing(timeline):
    assert timeline.stage(PID + 1, 500, 1500) == {}
    timeline.forget(PID)
    assert timeline.stage(PID, 500, 1500) == {}


def test_a_process_on_two_gpus_names_both_and_sums_their_memory():
    t = GpuTimeline()
    t.add_sample(sample(1000, 80.0, used=10, gpu=0))
    t.add_sample(sample(1000, 40.0, used=5, gpu=1))
    t.add_process(PID, 0, (0, 1), 0, 0, 1)
    assert t.stage(PID, 0, 1000) == {
        "sitsprobe.gpu.index": [0, 1], "sitsprobe.gpu.busy_percent": 60.0,
        "sitsprobe.gpu.busy_signal": "gpm_sm_util", "sitsprobe.gpu.memory_used_bytes": 15}


def test_a_request_gets_its_share_of_launches_and_copies():
    t = GpuTimeline()
    for ts, launches, copied, held in ((0, 0, 0, 2), (1000, 100, 1000, 2), (2000, 300, 3000, 4)):
        t.add_process(PID, ts, (0,), launches, copied, held)
    # over 500..1500 the process launched 50..200 (150) and copied 500..2000 (1500),
    # while its engine held 2 requests: this one's share is half
    assert t.request(PID, 500, 1500) == {"sitsprobe.cuda.launches": 75.0, "sitsprobe.cuda.copy_bytes": 750,
                                         "sitsprobe.cuda.attribution": "process_share"}
    # beyond the last tick the totals are clamped: nothing more is claimed
    assert t.request(PID, 2000, 5000)["sitsprobe.cuda.launches"] == 0.0


def test_no_cuda_calls_no_attribution():
    t = GpuTimeline()
    for ts in (0, 1000, 2000):
        t.add_process(PID, ts, (0,), 0, 0, 1)
    assert t.request(PID, 0, 2000) == {}
    assert t.request(PID + 1, 0, 2000) == {}


def test_history_is_bounded():
    t = GpuTimeline(keep_s=1e-6, max_points=8)  # 1000 ns
    for ts in range(0, 100_000, 100):
        t.add_sample(sample(ts, 50.0, window=100))
        t.add_process(PID, ts, (0,), ts, 0, 1)
    assert len(t._gpus[0]) <= 8 and len(t._procs[PID]) <= 8
