"""The utilization-collapse detector inside the real agent, watching the real
reference engine under the load generator. Only the NVML boundary is replaced
(a RecordedBackend that says what the GPU is doing); the requests, the
engine's markers, the on-CPU and run-queue signals are real.

- normal load (the GPU busy while requests flow): no alert;
- CPU-bound host work injected into the engine (SITSPROBE_ENGINE_CPU_BURN_MS),
  GPU starved: an alert naming cpu_bound and the engine, on every output;
- the load stops (input starvation): the alert clears and none is raised;
- every traced prefill and decode step names GPU 0 and its busy share then;
- the engine squeezed onto one CPU with busy neighbours: scheduler_starvation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sitsprobe import config
from sitsprobe.agent import Agent
from sitsprobe.gpu.recorded import RecordedBackend, RecordedGpu

from .conftest import ROOT, Engine, TraceFile, free_port, require_root, wait_until

BUSY, STARVED = (75.0, 20.0), (2.0, 1.0)  # (gpu %, memory %) as NVML reports them


class Watched:
    """The agent, in this process, on one engine; GPU 0 says what `gpu.rates` says."""

    def __init__(self, engine: Engine, tmp_path):
        self.engine = engine
        self.gpu = RecordedGpu(rates=BUSY, compute_pids=[engine.pid],
                               processes=[(engine.pid, 0, 70.0, 5.0)])
        self.port = free_port()
        self.traces = TraceFile(tmp_path / "traces.jsonl")
        self.agent = Agent(config.load(overrides={
            "select.pids": [engine.pid], "traces.file": str(self.traces.path),
            "metrics.port": self.port, "metrics.address": "127.0.0.1",
            "gpu.interval_ms": 100, "gpu.cuda_probes": False,
            "gpu.collapse_sustain_s": 1.5, "gpu.collapse_clear_s": 1.5}),
            gpu_backend=RecordedBackend([self.gpu]))
        self.stop = threading.Event()
        self.agent.start()
        self.thread = threading.Thread(target=self.agent.run, args=(self.stop,), daemon=True)
        self.thread.start()
        wait_until(lambda: engine.pid in self.agent.engine.instrumented, 20,
                   "the agent to attach to the engine's markers")

    def load(self, requests: int, users: int = 3, cpus: set[int] | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "examples/loadgen.py", "--url", self.engine.url, "--users", str(users),
             "--requests", str(requests), "--max-tokens", "8", "--json", os.devnull],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=None if not cpus else lambda: os.sched_setaffinity(0, cpus))

    def raised(self) -> list:
        return [a for a in self.agent.gpu.alerts if a.state == "raised"]

    def page(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return r.read().decode()

    def gauge(self, cause: str) -> float:
        for family in text_string_to_metric_families(self.page("/metrics")):
            for s in family.samples:
                if s.name == "sitsprobe_gpu_utilization_collapse" and s.labels == {"gpu": "0", "cause": cause}:
                    return s.value
        return 0.0

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)
        self.agent.close()


@pytest.fixture
def watch(tmp_path):
    require_root()
    pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
    made = []

    def make(*engine_args: str, **engine_kw) -> Watched:
        engine = Engine(tmp_path, "--max-window-ms", "5", *engine_args, **engine_kw)
        made.append(engine)
        w = Watched(engine, tmp_path)
        made.append(w)
        return w

    yield make
    for thing in reversed(made):
        if isinstance(thing, Watched):
            thing.close()
        else:
            thing.stop()


def test_cpu_bound_engine_raises_then_clears_when_the_load_stops(watch):
    # The engine gets a CPU of its own, the load generator the others: on a
    # shared CPU the burning thread would also wait in the run queue, and
    # scheduler_starvation would be as right an answer.
    cpus = os.sched_getaffinity(0)
    w = watch(env={"SITSPROBE_ENGINE_CPU_BURN_MS": "150"}, cpus={max(cpus)})
    load = w.load(requests=400, cpus=cpus - {max(cpus)})
    try:
        wait_until(lambda: w.agent.requests_seen >= 3, 30, "the first requests to be seen")
        time.sleep(3)  # normal load: the GPU keeps up
        assert w.raised() == []
        w.gpu.rates = STARVED  # ... then starves while requests wait behind the host work
        alert = wait_until(lambda: w.raised(), 15, "a collapse alert")[0]
        assert (alert.gpu, alert.pid, alert.cause) == (0, w.engine.pid, "cpu_bound"), alert
        assert alert.evidence["demand"] >= 1
        assert alert.evidence[f"pid_{w.engine.pid}"]["on_cpu_max"] >= 0.85
        assert w.gauge("cpu_bound") == 1.0
        shown = json.loads(w.page("/alerts.json"))
        assert [(a["gpu"], a["pid"], a["cause"]) for a in shown] == [(0, w.engine.pid, "cpu_bound")]
    finally:
        load.kill()
        load.wait()
    # input starvation: nothing arrives, the GPU stays idle; not a collapse
    cleared = wait_until(lambda: [a for a in w.agent.gpu.alerts if a.state == "cleared"], 15,
                         "the alert to clear once no request waits")
    assert cleared[0].evidence["cleared_by"] == "demand_ended"
    time.sleep(3)
    assert len(w.raised()) == 1 and w.gauge("cpu_bound") == 0.0
    assert json.loads(w.page("/alerts.json")) == []
    # each compute stage names its GPU and what the GPU did meanwhile: busy, then starved
    stages = wait_until(lambda: [s for s in w.traces.spans() if s["name"] in ("prefill", "decode")],
                        15, "stage spans in the traces file")
    assert {s["attrs"].get("sitsprobe.gpu.index") for s in stages} == {0}
    assert {BUSY[0], STARVED[0]} <= {s["attrs"].get("sitsprobe.gpu.busy_percent") for s in stages}


def test_engine_starved_of_cpu_by_its_neighbours_is_scheduler_starvation(watch):
    cpu = max(os.sched_getaffinity(0))
    w = watch(cpus={cpu})
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) for _ in range(3)]
    load = w.load(requests=400)
    try:
        w.gpu.rates = STARVED
        alert = wait_until(lambda: w.raised(), 25, "a collapse alert")[0]
        assert (alert.pid, alert.cause) == (w.engine.pid, "scheduler_starvation"), alert
        assert alert.evidence[f"pid_{w.engine.pid}"]["runq_wait_max"] >= 0.25
    finally:
        for p in (load, *hogs):
            p.kill()
            p.wait()
