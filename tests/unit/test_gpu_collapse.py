"""The collapse detector over synthesized streams: each induced cause is named,
input starvation and normal load stay quiet, and noise at a threshold never flaps."""
from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sitsprobe.gpu.collapse import CLEARED, RAISED, CollapseConfig, CollapseDetector
from sitsprobe.gpu.metrics import CollapseMetrics
from sitsprobe.gpu.nvml import GpuSample

HZ = 5  # samples per second, as the sampler's default 200 ms
S = 1_000_000_000
ENGINE = 4321


class Stream:
    """Feeds one GPU and its engine process at HZ; each phase sets the levels."""

    def __init__(self, detector: CollapseDetector | None = None, seed: int = 1):
        self.d = detector or CollapseDetector()
        self.t = 1000 * S
        self.rng = random.Random(seed)
        self.alerts = []

    def run(self, seconds: float, busy: float, noise: float = 3.0, demand: float = 4,
            on_cpu: float = 0.35, runq: float = 0.02, copy: float = 0.02, sync: float = 0.1,
            throttle: tuple[str, ...] = (), memory: float = 0.5) -> list:
        new = []
        for _ in range(int(seconds * HZ)):
            self.t += S // HZ
            jitter = lambda: self.rng.uniform(-1, 1)  # noqa: E731
            self.d.observe_demand(0, ENGINE, self.t, max(0, round(demand + jitter())) if demand else 0)
            self.d.observe_host(ENGINE, self.t, min(1.0, max(0, on_cpu + 0.03 * jitter())),
                                max(0, runq + 0.02 * jitter()))
            self.d.observe_cuda(ENGINE, self.t, max(0, copy + 0.02 * jitter()),
                                max(0, sync + 0.03 * jitter()))
            b = min(100.0, max(0.0, busy + noise * jitter()))
            new += self.d.observe_gpu(0, self.t, b, throttle, memory)
        self.alerts += new
        return new

    def warm(self, seconds: float = 120) -> None:
        assert self.run(seconds, busy=70) == []


@pytest.mark.parametrize("cause,collapse", [
    ("cpu_bound", dict(on_cpu=0.99)),
    ("scheduler_starvation", dict(on_cpu=0.3, runq=0.6)),
    ("copy_bound", dict(copy=0.7)),
    ("sync_stall", dict(sync=0.95)),
    ("throttling", dict(throttle=("gpu_idle", "hw_thermal_slowdown"))),
    ("memory_pressure", dict(memory=0.99)),
])
def test_each_induced_cause_is_named(cause, collapse):
    s = Stream()
    s.warm()
    raised = s.run(20, busy=12, demand=8, **collapse)
    assert [(a.state, a.cause, a.gpu, a.pid) for a in raised] == [(RAISED, cause, 0, ENGINE)]
    a = raised[0]
    assert a.window_end_ns - a.window_start_ns == 5 * S
    assert a.evidence["working_level_percent"] == pytest.approx(72, abs=2)
    assert a.evidence["busy_mean_percent"] < 20 and a.evidence["score"] >= 1
    assert a.evidence["demand"] >= 1
    assert f"pid_{ENGINE}" in a.evidence


def test_raises_after_the_sustain_time_not_before():
    s = Stream()
    s.warm()
    start = s.t
    raised = s.run(4.4, busy=10, on_cpu=0.99)
    assert raised == []
    raised = s.run(2, busy=10, on_cpu=0.99)
    assert len(raised) == 1 and 5 * S <= raised[0].window_end_ns - start <= 5.4 * S


def test_clears_with_hysteresis():
    s = Stream()
    s.warm()
    assert len(s.run(10, busy=10, on_cpu=0.99)) == 1
    assert s.run(60, busy=45, noise=2) == []  # over the raise bar (35), under the clear bar (49)
    cleared = s.run(10, busy=68)
    assert [(a.state, a.cause) for a in cleared] == [(CLEARED, "cpu_bound")]
    a = cleared[0]
    assert a.evidence["cleared_by"] == "recovered"
    assert a.window_end_ns - a.window_start_ns > 70 * S  # the whole collapse
    assert s.d.active() == {}


def test_input_starvation_is_not_a_collapse():
    s = Stream()
    s.warm()
    assert s.run(120, busy=1, demand=0, on_cpu=0.05) == []  # nothing arrives: nothing to do
    assert s.run(120, busy=1, demand=0.3, on_cpu=0.05) == []  # a trickle: mostly nothing waiting


def test_normal_load_stays_quiet():
    s = Stream(seed=7)
    # a working GPU wanders: long stretches of lighter and heavier batches
    for level in (70, 55, 80, 50, 65, 75, 60, 70):
        assert s.run(60, busy=level, noise=12, demand=3) == []


def test_noise_at_the_threshold_does_not_flap():
    for seed in range(5):
        s = Stream(seed=seed)
        s.warm()
        level = s.d.status()[0]["working_level_percent"]
        # hover right at the raise bar (half the working level), then at the clear bar
        s.run(300, busy=0.5 * level, noise=8, on_cpu=0.99)
        s.run(300, busy=0.7 * level, noise=8, on_cpu=0.99)
        states = [a.state for a in s.alerts]
        assert states in ([], [RAISED], [RAISED, CLEARED]), (seed, states)


def test_absolute_floor_needs_no_history():
    s = Stream()
    raised = s.run(10, busy=1, noise=0.5, on_cpu=0.97)
    assert [(a.state, a.cause) for a in raised] == [(RAISED, "cpu_bound")]
    assert raised[0].evidence["working_level_percent"] is None


def test_an_idle_gpu_has_no_working_level_to_fall_from():
    s = Stream()
    assert s.run(120, busy=8, noise=1) == []  # under min_working_percent: idling
    assert s.run(60, busy=6, noise=0.5, on_cpu=0.99) == []  # above the floor: not a collapse


def test_demand_ending_clears():
    s = Stream()
    s.warm()
    assert len(s.run(10, busy=10, on_cpu=0.99)) == 1
    cleared = s.run(10, busy=1, demand=0)
    assert [a.evidence["cleared_by"] for a in cleared] == ["demand_ended"]


def test_a_long_collapse_keeps_its_working_level():
    s = Stream(CollapseDetector(CollapseConfig(baseline_window_s=60)))
    s.warm(60)
    assert len(s.run(10, busy=10, on_cpu=0.99)) == 1
    assert s.run(240, busy=10, on_cpu=0.99) == []  # longer than the baseline window
    assert s.d.active()[0].cause == "cpu_bound"
    assert s.d.status()[0]["working_level_percent"] == pytest.approx(72, abs=2)


def test_no_evidence_is_unknown_and_names_the_process_with_demand():
    s = Stream()
    s.warm()
    raised = s.run(10, busy=10, on_cpu=0.2, sync=0.0)
    assert [(a.cause, a.pid) for a in raised] == [("unknown", ENGINE)]


def test_the_strongest_cause_wins():
    s = Stream()
    s.warm()
    raised = s.run(10, busy=10, copy=0.33, sync=0.99)  # copy 1.1x its bar, sync ~2x its bar
    assert raised[0].cause == "sync_stall"


def test_demand_is_per_gpu():
    d = CollapseDetector()
    t = 0
    for _ in range(20 * HZ):
        t += S // HZ
        d.observe_demand(1, 99, t, 5)  # demand on GPU 1 only
        d.observe_host(99, t, 0.99, 0.0)
        assert d.observe_gpu(0, t, 1.0) == []
    assert d.status()[0]["demand"] == 0


def test_a_process_on_two_gpus_is_demand_on_both():
    d = CollapseDetector()
    t, raised = 0, []
    for _ in range(10 * HZ):
        t += S // HZ
        for gpu in (0, 1):
            d.observe_demand(gpu, 99, t, 5)
        d.observe_host(99, t, 0.99, 0.0)
        raised += d.observe_gpu(0, t, 1.0) + d.observe_gpu(1, t, 1.0)
    assert sorted((a.gpu, a.pid, a.cause) for a in raised) == [(0, 99, "cpu_bound"), (1, 99, "cpu_bound")]
    assert raised[0].evidence["pid_99"]["demand_mean"] == 5.0  # each reading counted once


def test_stale_demand_counts_as_none():
    d = CollapseDetector()
    d.observe_demand(0, 5, 0, 10)
    t = 0
    for _ in range(20 * HZ):
        t += S // HZ
        assert d.observe_gpu(0, t, 1.0) == []


def test_gpu_samples_feed_it_directly():
    d = CollapseDetector()
    t, out = 0, []
    for _ in range(10 * HZ):
        t += S // HZ
        d.observe_demand(0, ENGINE, t, 3)
        out += d.observe_sample(GpuSample(gpu=0, uuid="u", ts_ns=t, window_ns=S // HZ, signal="samples",
                                          busy_percent=0.5, memory_used_bytes=79, memory_total_bytes=80))
        out += d.observe_sample(GpuSample(gpu=0, uuid="u", ts_ns=t, window_ns=0, signal="samples",
                                          busy_percent=None))
    assert [(a.cause, a.evidence["memory_used_ratio"]) for a in out] == [("memory_pressure", 0.988)]


def test_collapse_metrics_collector():
    s = Stream()
    s.warm()
    s.run(10, busy=10, on_cpu=0.99)
    reg = CollectorRegistry()
    reg.register(CollapseMetrics(s.d))
    text = generate_latest(reg).decode()
    assert 'sitsprobe_gpu_utilization_collapse{cause="cpu_bound",gpu="0"} 1.0' in text
    assert 'sitsprobe_gpu_collapse_alerts_total{cause="cpu_bound",gpu="0"} 1.0' in text
    s.run(10, busy=70)
    text = generate_latest(reg).decode()
    assert 'sitsprobe_gpu_utilization_collapse{cause="cpu_bound",gpu="0"} 0.0' in text
    assert 'sitsprobe_gpu_collapse_alerts_total{cause="cpu_bound",gpu="0"} 1.0' in text
