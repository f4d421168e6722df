"""The agent's GPU layer end to end without a GPU: a recorded NVML stream
through the real sampler thread, a real CPU-pegged process for the host
signal, and the detector's alert out through the alert exporter."""
from __future__ import annotations

import subprocess
import sys
import threading
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


class FakeCuda:
    """CudaProbe's face: running totals by pid, and forget() giving a pid's last."""

    def __init__(self, rows):
        self.rows = rows

    def counts(self):
        return list(self.rows)

    def forget(self, pid):
        final = [c for c in self.rows if c.pid == pid]
        self.rows = [c for c in self.rows if c.pid != pid]
        return final


def test_an_exited_processes_cuda_counts_join_its_names_totals():
    from sitsprobe.gpu.cuda import CudaCount
    from sitsprobe.gpu.metrics import CudaMetrics

    names = {7: "engine", 8: "engine", 9: "worker"}
    w = GpuWatch(clock=WallClock(), name_of=names.get, interval_s=0.1, cuda_probes=False,
                 collapse=FAST, alerts=AlertExporter(WallClock(), None),
                 backend=RecordedBackend([]))
    w.cuda = FakeCuda([CudaCount(7, "cudaLaunchKernel", "", 13, 0, 0, 0),
                       CudaCount(8, "cudaLaunchKernel", "", 5, 0, 0, 0),
                       CudaCount(9, "cudaMalloc", "", 7, 0, 1 << 20, 0)])
    w.forget(7)
    w.forget(8)  # a second engine of that name: one series, summed
    metrics = CudaMetrics(w._cuda_counts, process_name=names.get)
    calls = {tuple(s.labels.values()): s.value for f in metrics.collect() if f.name == "sitsprobe_cuda_calls"
             for s in f.samples}
    assert calls == {("", "engine", "cudaLaunchKernel"): 18, ("9", "worker", "cudaMalloc"): 7}


def test_without_nvml_the_agent_lets_the_gpu_layer_go():
    """No NVML (a CPU node): nothing to sample, no CUDA probes (no call can
    reach a device), so the agent drops the layer and no request pays for a
    GPU look-up per stage; with NVML the layer stays, as before."""
    from pynvml import NVMLError_LibraryNotFound

    from sitsprobe import config
    from sitsprobe.agent import Agent

    for backend, kept in ((RecordedBackend([], init_error=NVMLError_LibraryNotFound()), False),
                          (RecordedBackend([RecordedGpu(rates=(50.0, 10.0))]), True)):
        agent = Agent(config.load(overrides={"select.pids": [1]}), gpu_backend=backend)
        registry = CollectorRegistry()
        before = set(threading.enumerate())
        agent._start_gpu(registry)
        try:
            assert (agent.gpu is not None) is kept
            families = {m.name for m in registry.collect()}
            assert ("sitsprobe_gpu_utilization_collapse" in families) is kept
            if not kept:  # nor a thread left waiting for NVML calls that will never come
                for t in set(threading.enumerate()) - before:
                    t.join(5)
                    assert not t.is_alive(), f"thread {t.name} outlives the GPU layer"
        finally:
            if agent.gpu is not None:
                agent.gpu.close()
