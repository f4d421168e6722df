"""The agent's GPU layer end to end without a GPU: a recorded NVML stream
through the real sampler thread, a real CPU-pegged process for the host
signal, and the detector's alert out through the alert exporter."""
from __future__ import annotations

import subprocess
import sys
import time

from prometheus_client import CollectorRegistry

from sitsprobe.clock import WallClock
from sitsprobe.export.alerts import AlertExporter
from sitsprobe.gpu import CollapseConfig
from sitsprobe.gpu.recorded import RecordedBackend, RecordedGpu
from sitsprobe.gpuwatch import GpuWatch

FAST = CollapseConfig(baseline_window_s=20, min_history_s=1.5, sustain_s=1.0, clear_s=1.0)


def watch_engine(demand: float, seconds_busy=2.0, seconds_idle=3.5):
    engine = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # host work pegs a CPU
    gpu = RecordedGpu(rates=(75.0, 10.0), compute_pids=[engine.pid],
                      processes=[(engine.pid, 0, 70.0, 5.0)])
    w = GpuWatch(clock=WallClock(), name_of=lambda pid: "engine", interval_s=0.1, cuda_probes=False,
                 collapse=FAST, alerts=AlertExporter(WallClock(), None),
                 backend=RecordedBackend([gpu]))
    try:
        w.start(CollectorRegistry(), cuda_flags=None)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds_busy + seconds_idle:
            if time.monotonic() - t0 > seconds_busy:
                gpu.rates = (3.0, 1.0)  # the GPU starves while requests wait
            w.tick([engine.pid], {engine.pid: (demand, 0.0)})
            time.sleep(0.1)
        return w
    finally:
        w.close()
        engine.kill()
        engine.wait()


def test_a_starved_gpu_with_a_pegged_engine_raises_cpu_bound():
    w = watch_engine(demand=3)
    assert w.status.startswith("GPU 0 Recorded GPU")
    assert [(a.state, a.cause, a.gpu) for a in w.alerts][:1] == [("raised", "cpu_bound", 0)]
    assert w.alerts[0].evidence["demand"] >= 1


def test_no_requests_waiting_is_not_a_collapse():
    assert watch_engine(demand=0).alerts == []
