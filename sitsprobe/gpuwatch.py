"""The GPU layer inside the agent: NVML samples, CUDA counts, host signals and
the utilization-collapse detector, fed every tick and exported as metrics and
alerts. Without NVML (as on a CPU node) it says once why GPU sampling is off,
and has nothing to do: no CUDA call can reach a device, so it loads no CUDA
probes either, and the agent lets it go (`start` says so)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from prometheus_client import CollectorRegistry

from .clock import WallClock
from .export.alerts import AlertExporter
from .gpu import (Alert, CollapseConfig, CollapseDetector, HostSampler, NvmlSampler,
                  NvmlUnavailable, ShareTracker)
from .gpu.attribution import COMPUTE_STAGES, GpuTimeline
from .gpu.cuda import CudaCount, totals
from .gpu.metrics import CollapseMetrics, CudaMetrics, GpuMetrics
from .request import GpuUse, Request

log = logging.getLogger("sitsprobe")
ATTACH_EVERY_S = 2.0  # /proc/PID/maps scans for CUDA libraries


class GpuWatch:
    def __init__(self, *, clock: WallClock, name_of: Callable[[int], str], interval_s: float,
                 cuda_probes: bool, collapse: CollapseConfig, alerts: AlertExporter,
                 backend=None):
        self._clock, self._name = clock, name_of
        self._interval_s, self._want_cuda = interval_s, cuda_probes
        self.detector = CollapseDetector(collapse)
        self._alerts = alerts
        self._backend = backend  # None: the real NVML; tests pass a recorded one
        self.sampler: NvmlSampler | None = None
        self.cuda = None
        self.hosts, self.shares = HostSampler(), ShareTracker()
        self.timeline = GpuTimeline()
        self.status = "off"
        self.alerts: list[Alert] = []
        self._lock = threading.Lock()
        self._next_attach = 0.0
        self._exited_cuda: dict[tuple[str, str, str], CudaCount] = {}  # (name, function, direction)

    def start(self, registry: CollectorRegistry, cuda_flags: list[str] | None) -> bool:
        """Sample the GPUs, load the CUDA probes where asked; whether either
        is on (False: close it, the layer has nothing to attribute or watch)."""
        sampler = NvmlSampler(self._backend, interval_s=self._interval_s, clock=self._clock)
        try:
            gpus = sampler.start(on_sample=self._on_sample)
            self.sampler = sampler
            self.status = ", ".join(f"GPU {g.index} {g.name}" for g in gpus) or "no GPUs"
            registry.register(GpuMetrics(sampler, self._name))
        except NvmlUnavailable as e:
            sampler.close()  # its NVML call thread, which nothing will call now
            self.status = f"GPU sampling off: {e}"
        log.info("%s", self.status)
        if self._want_cuda and cuda_flags is not None and self.sampler is None:
            log.info("CUDA probes off: no GPU driver (NVML) here, so no CUDA call can reach a device")
        elif self._want_cuda and cuda_flags is not None:
            from .probes.cuda import CudaProbe
            try:
                self.cuda = CudaProbe(cuda_flags)
                registry.register(CudaMetrics(self._cuda_counts, self.cuda.counters, self._name))
            except Exception as e:  # never take the agent down for an optional layer
                log.warning("CUDA probes off: %s", e)
        if self.sampler is None and self.cuda is None:
            return False
        registry.register(CollapseMetrics(self.detector))
        return True

    def _on_sample(self, sample) -> None:  # the NVML thread
        self.timeline.add_sample(sample)
        for alert in self.detector.observe_sample(sample):
            self._raise(alert)

    def _raise(self, alert: Alert) -> None:
        with self._lock:
            self.alerts.append(alert)
        self._alerts.emit(alert, self._name(alert.pid) if alert.pid else "")

    def tick(self, pids: list[int], demand: dict[int, tuple[float, float]]) -> None:
        """Every agent tick: demand (in flight, queued) per traced pid, host
        signals, CUDA shares; CUDA libraries looked for every few seconds."""
        now = time.monotonic_ns()
        if self.cuda is not None and time.monotonic() >= self._next_attach:
            for a in self.cuda.attach_pids(pids):
                log.info("CUDA probes: attached to %s", a.library.path)
            self._next_attach = time.monotonic() + ATTACH_EVERY_S
        on_gpu = self.sampler.process_gpus() if self.sampler is not None else {}
        cuda = totals(self.cuda.counts()) if self.cuda is not None else {}
        for pid in pids:
            in_flight, queued = demand.get(pid, (0.0, 0.0))
            t = cuda.get(pid)
            self.timeline.add_process(pid, now, on_gpu.get(pid, ()), t.launches if t else 0,
                                      t.copy_bytes if t else 0, in_flight + queued)
            for gpu in on_gpu.get(pid, ()):
                self.detector.observe_demand(gpu, pid, now, in_flight, queued)
            # host signals explain a GPU's collapse: read them only for processes on
            # one (two /proc reads per thread; a thread-per-connection server with
            # 2,000 idle connections cost the agent 70 % of a core without this)
            h = self.hosts.sample(pid, now) if on_gpu.get(pid) else None
            if h is not None:
                self.detector.observe_host(pid, h.ts_ns, h.on_cpu_max, h.runq_wait_max)
        if self.cuda is not None:
            for c in self.shares.update(cuda, now):
                self.detector.observe_cuda(c.pid, c.ts_ns, c.copy, c.sync)

    def attribute(self, r: Request) -> Request:
        """r with what the GPU did for it: per compute stage, the GPU and its
        busy % and memory over the stage; per request, its share of launches
        and copy bytes. Unchanged where nothing is known."""
        if r.inference is None:
            return r
        stages = tuple(self.timeline.stage(r.pid, s.start_ns, s.end_ns) if s.name in COMPUTE_STAGES
                       else {} for s in r.inference.stages)
        request = self.timeline.request(r.pid, r.start_ns, r.end_ns)
        if not request and not any(stages):
            return r
        return r._replace(gpu=GpuUse(request, stages))

    def device_waits(self, pid: int, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        """The process's waits on the device within a request's span (the
        CUDA probes' blocking copies and synchronisations): its I/O time."""
        return self.cuda.waits(pid, start_ns, end_ns) if self.cuda is not None else []

    def forget(self, pid: int) -> None:
        """A process exited: its CUDA counts are folded into its name's totals
        (pid ""), so a call made just before it exited is still counted, and
        exited processes leave one series per name, not one per pid."""
        self.detector.forget(pid)
        self.timeline.forget(pid)
        if self.cuda is not None:
            name = self._name(pid)
            for c in self.cuda.forget(pid):
                key = (name, c.function, c.direction)
                was = self._exited_cuda.get(key)
                self._exited_cuda[key] = replace(c, pid=0, process=name) if was is None else replace(
                    was, calls=was.calls + c.calls, errors=was.errors + c.errors,
                    bytes=was.bytes + c.bytes, ns=was.ns + c.ns)

    @property
    def alerts_tally(self):
        """The alert log records' accounting; None when alerts go to the log only."""
        return self._alerts.tally

    def _cuda_counts(self) -> list[CudaCount]:
        return self.cuda.counts() + list(self._exited_cuda.values())

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self.cuda is not None:
            self.cuda.close()
        self._alerts.shutdown()
