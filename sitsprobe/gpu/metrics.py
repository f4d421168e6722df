"""Prometheus Collectors for the GPU layer: each reads plain state when
scraped (the sampler's latest samples, the kernel's CUDA counts, the
detector's alerts) and bumps nothing per event."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..containers import Container, container_of
from .collapse import CollapseDetector
from .cuda import COPIES, SYNCS, TIMED, CudaCount
from .nvml import NvmlSampler


class GpuMetrics:
    """The NVML sampler's latest reading of each GPU, and its error counts."""

    def __init__(self, sampler: NvmlSampler, process_name: Callable[[int], str] = lambda pid: "",
                 container: Callable[[int], Container | None] = container_of):
        self._s, self._name, self._container = sampler, process_name, container

    def collect(self):
        g = ("gpu",)
        info = GaugeMetricFamily("sitsprobe_gpu_info", "GPUs NVML sees", labels=("gpu", "uuid", "name"))
        for gpu in self._s.gpus:
            info.add_metric([str(gpu.index), gpu.uuid, gpu.name], 1)
        yield info
        fam = {
            "busy": GaugeMetricFamily("sitsprobe_gpu_busy_ratio",
                                      "GPU busy share by the best signal it offers (signal label)",
                                      labels=("gpu", "signal")),
            "occ": GaugeMetricFamily("sitsprobe_gpu_sm_occupancy_ratio",
                                     "Active warps over the maximum (GPM)", labels=g),
            "util": GaugeMetricFamily("sitsprobe_gpu_utilization_ratio",
                                      "NVML utilization rates: kernel (gpu) and memory controller",
                                      labels=("gpu", "kind")),
            "mem_used": GaugeMetricFamily("sitsprobe_gpu_memory_used_bytes", "GPU memory used", labels=g),
            "mem_total": GaugeMetricFamily("sitsprobe_gpu_memory_total_bytes", "GPU memory", labels=g),
            "power": GaugeMetricFamily("sitsprobe_gpu_power_watts", "Power draw", labels=g),
            "clock": GaugeMetricFamily("sitsprobe_gpu_sm_clock_hertz", "SM clock", labels=g),
            "pcie": GaugeMetricFamily("sitsprobe_gpu_pcie_throughput_bytes_per_second",
                                      "PCIe throughput", labels=("gpu", "direction")),
            "throttle": GaugeMetricFamily("sitsprobe_gpu_throttle_reason",
                                          "Clock throttle (event) reasons active now",
                                          labels=("gpu", "reason")),
            "proc": GaugeMetricFamily("sitsprobe_gpu_process_sm_utilization_ratio",
                                      "SM utilization by process (NVML), with its container and pod",
                                      labels=("gpu", "pid", "process", "container_id", "pod_uid")),
        }
        for s in self._s.latest().values():
            i = str(s.gpu)
            _add(fam["busy"], [i, s.signal], s.busy_percent, 0.01)
            _add(fam["occ"], [i], s.sm_occupancy_percent, 0.01)
            _add(fam["util"], [i, "gpu"], s.util_gpu_percent, 0.01)
            _add(fam["util"], [i, "memory"], s.util_memory_percent, 0.01)
            _add(fam["mem_used"], [i], s.memory_used_bytes)
            _add(fam["mem_total"], [i], s.memory_total_bytes)
            _add(fam["power"], [i], s.power_watts)
            _add(fam["clock"], [i], s.sm_clock_mhz, 1e6)
            _add(fam["pcie"], [i, "tx"], s.pcie_tx_bytes_per_s)
            _add(fam["pcie"], [i, "rx"], s.pcie_rx_bytes_per_s)
            for reason in s.throttle_reasons:
                fam["throttle"].add_metric([i, reason], 1)
            for p in s.processes:
                c = self._container(p.pid)
                fam["proc"].add_metric([i, str(p.pid), self._name(p.pid), c.id if c else "",
                                        c.pod_uid if c else ""], p.sm_percent / 100)
        yield from fam.values()
        errors = CounterMetricFamily("sitsprobe_gpu_nvml_errors", "NVML calls that failed, by error",
                                     labels=("gpu", "error"))
        for (gpu, error), n in sorted(self._s.errors().items()):
            errors.add_metric([str(gpu), error], n)
        yield errors


class CudaMetrics:
    """The CUDA probes' in-kernel counts (CudaProbe.counts), read at scrape time."""

    def __init__(self, counts: Callable[[], Iterable[CudaCount]],
                 drops: Callable[[], dict[str, int]] = dict,
                 process_name: Callable[[int], str] = lambda pid: ""):
        self._counts, self._drops, self._name = counts, drops, process_name

    def collect(self):
        pf, pp = ("pid", "process", "function"), ("pid", "process")
        families = {
            "calls": CounterMetricFamily("sitsprobe_cuda_calls", "CUDA API calls by tracked processes",
                                         labels=pf),
            "errors": CounterMetricFamily("sitsprobe_cuda_call_errors",
                                          "CUDA API calls that returned an error (timed functions)",
                                          labels=pf),
            "copied": CounterMetricFamily("sitsprobe_cuda_memcpy_bytes",
                                          "Bytes asked to copy (cudaMemcpy, cudaMemcpyAsync), by direction",
                                          labels=("pid", "process", "direction")),
            "copy_s": CounterMetricFamily("sitsprobe_cuda_memcpy_seconds",
                                          "Time threads spent blocked in synchronous cudaMemcpy", labels=pp),
            "sync_s": CounterMetricFamily("sitsprobe_cuda_sync_seconds",
                                          "Time threads spent blocked in synchronize calls", labels=pf),
            "alloc": CounterMetricFamily("sitsprobe_cuda_alloc_bytes", "Bytes cudaMalloc returned",
                                         labels=pp),
            "freed": CounterMetricFamily("sitsprobe_cuda_free_bytes",
                                         "Bytes cudaFree released (of allocations seen)", labels=pp),
        }
        sums: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in families}

        def add(name: str, labels: tuple[str, ...], value: float) -> None:
            sums[name][labels] = sums[name].get(labels, 0) + value

        for c in self._counts():  # pid 0: the totals of exited processes named c.process
            who = (str(c.pid), self._name(c.pid)) if c.pid else ("", c.process)
            add("calls", (*who, c.function), c.calls)
            if c.function in TIMED:
                add("errors", (*who, c.function), c.errors)
            if c.function in COPIES:
                add("copied", (*who, c.direction), c.bytes)
            if c.function == "cudaMemcpy":
                add("copy_s", who, c.ns / 1e9)
            if c.function in SYNCS:
                add("sync_s", (*who, c.function), c.ns / 1e9)
            if c.function == "cudaMalloc":
                add("alloc", who, c.bytes)
            if c.function == "cudaFree":
                add("freed", who, c.bytes)
        for name, family in families.items():
            for labels, value in sorted(sums[name].items()):
                family.add_metric(list(labels), value)
        yield from families.values()
        drops = CounterMetricFamily("sitsprobe_cuda_probe_drops", "CUDA calls the probes could not count",
                                    labels=("reason",))
        for reason, n in self._drops().items():
            drops.add_metric([reason], n)
        yield drops


class CollapseMetrics:
    """The detector's alerts: a gauge per (gpu, cause) raised now, and a count."""

    def __init__(self, detector: CollapseDetector):
        self._d = detector

    def collect(self):
        active = {(gpu, a.cause) for gpu, a in self._d.active().items()}
        raised = self._d.raised_total()
        gauge = GaugeMetricFamily("sitsprobe_gpu_utilization_collapse",
                                  "1 while a GPU's utilization has collapsed under demand, by cause",
                                  labels=("gpu", "cause"))
        total = CounterMetricFamily("sitsprobe_gpu_collapse_alerts", "Collapse alerts raised",
                                    labels=("gpu", "cause"))
        for gpu, cause in sorted(set(raised) | active):
            gauge.add_metric([str(gpu), cause], 1 if (gpu, cause) in active else 0)
            total.add_metric([str(gpu), cause], raised.get((gpu, cause), 0))
        yield gauge
        yield total


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None, scale: float = 1) -> None:
    if value is not None:
        family.add_metric(labels, value * scale)
