"""The hardware boundary: the handful of NVML calls the sampler makes.

``PynvmlBackend`` makes them through pynvml (nvidia-ml-py); a test feeds the
same sampler a ``RecordedBackend`` (sitsprobe.gpu.recorded). Methods return
plain Python values; "no new samples" is an empty list, never an error.
Errors are pynvml's (``NVMLError_GpuIsLost``, ...) or ones named the same way.
"""
from __future__ import annotations

import re
from typing import Any, Protocol

GPM_SM_UTIL, GPM_SM_OCCUPANCY = 2, 3  # NVML_GPM_METRIC_SM_UTIL, _SM_OCCUPANCY


class NvmlBackend(Protocol):
    def init(self) -> None: ...  # nvmlInit
    def shutdown(self) -> None: ...  # nvmlShutdown
    def device_count(self) -> int: ...
    def handle(self, index: int) -> Any: ...
    def uuid(self, h: Any) -> str: ...
    def name(self, h: Any) -> str: ...
    def gpm_supported(self, h: Any) -> bool: ...  # nvmlGpmQueryDeviceSupport
    def gpm_alloc(self) -> Any: ...  # nvmlGpmSampleAlloc
    def gpm_free(self, sample: Any) -> None: ...
    def gpm_sample(self, h: Any, sample: Any) -> None: ...  # nvmlGpmSampleGet
    def gpm_metrics(self, s1: Any, s2: Any, ids: tuple[int, ...]) -> dict[int, float | None]: ...
    # nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES): (wall µs, percent) newer than last_seen_us
    def util_samples(self, h: Any, last_seen_us: int) -> list[tuple[int, float]]: ...
    def utilization_rates(self, h: Any) -> tuple[float, float]: ...  # (gpu %, memory %)
    def memory(self, h: Any) -> tuple[int, int]: ...  # (used, total) bytes
    def power_mw(self, h: Any) -> int: ...
    def sm_clock_mhz(self, h: Any) -> int: ...
    def pcie_kb_per_s(self, h: Any) -> tuple[int, int]: ...  # (tx, rx), NVML's KB/s
    def throttle_reasons(self, h: Any) -> int: ...  # bitmask, NVML clocks event reasons
    # nvmlDeviceGetProcessUtilization: (pid, wall µs, sm %, mem %) newer than last_seen_us
    def process_utilization(self, h: Any, last_seen_us: int) -> list[tuple[int, int, float, float]]: ...
    def compute_pids(self, h: Any) -> list[int]: ...  # nvmlDeviceGetComputeRunningProcesses


def error_name(e: BaseException) -> str:
    """A metric label for an error: NVMLError_GpuIsLost -> gpu_is_lost."""
    name = type(e).__name__
    if name == "NVMLError":
        return f"nvml_error_{getattr(e, 'value', 'unknown')}"
    name = name.removeprefix("NVMLError_")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


_VALUE_FIELD = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # nvmlValueType_t


class PynvmlBackend:
    """The real thing. Raises ImportError when nvidia-ml-py is missing."""

    def __init__(self) -> None:
        import pynvml

        self._n = pynvml

    def init(self) -> None:
        self._n.nvmlInit()

    def shutdown(self) -> None:
        self._n.nvmlShutdown()

    def device_count(self) -> int:
        return self._n.nvmlDeviceGetCount()

    def handle(self, index: int) -> Any:
        return self._n.nvmlDeviceGetHandleByIndex(index)

    def uuid(self, h: Any) -> str:
        return _str(self._n.nvmlDeviceGetUUID(h))

    def name(self, h: Any) -> str:
        return _str(self._n.nvmlDeviceGetName(h))

    def gpm_supported(self, h: Any) -> bool:
        return bool(self._n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)

    def gpm_alloc(self) -> Any:
        return self._n.nvmlGpmSampleAlloc()

    def gpm_free(self, sample: Any) -> None:
        self._n.nvmlGpmSampleFree(sample)

    def gpm_sample(self, h: Any, sample: Any) -> None:
        self._n.nvmlGpmSampleGet(h, sample)

    def gpm_metrics(self, s1: Any, s2: Any, ids: tuple[int, ...]) -> dict[int, float | None]:
        n = self._n
        get = n.c_nvmlGpmMetricsGet_t()
        get.version = n.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(ids)
        get.sample1, get.sample2 = s1, s2
        for i, metric in enumerate(ids):
            get.metrics[i].metricId = metric
        n.nvmlGpmMetricsGet(get)
        return {m.metricId: (m.value if m.nvmlReturn == n.NVML_SUCCESS else None)
                for m in get.metrics[: len(ids)]}

    def util_samples(self, h: Any, last_seen_us: int) -> list[tuple[int, float]]:
        n = self._n
        try:
            kind, samples = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, last_seen_us)
        except n.NVMLError_NotFound:  # nothing newer than last_seen_us
            return []
        field = _VALUE_FIELD[kind] if 0 <= kind < len(_VALUE_FIELD) else "uiVal"
        return [(s.timeStamp, float(getattr(s.sampleValue, field))) for s in samples]

    def utilization_rates(self, h: Any) -> tuple[float, float]:
        u = self._n.nvmlDeviceGetUtilizationRates(h)
        return float(u.gpu), float(u.memory)

    def memory(self, h: Any) -> tuple[int, int]:
        m = self._n.nvmlDeviceGetMemoryInfo(h)
        return int(m.used), int(m.total)

    def power_mw(self, h: Any) -> int:
        return self._n.nvmlDeviceGetPowerUsage(h)

    def sm_clock_mhz(self, h: Any) -> int:
        return self._n.nvmlDeviceGetClockInfo(h, self._n.NVML_CLOCK_SM)

    def pcie_kb_per_s(self, h: Any) -> tuple[int, int]:
        n = self._n  # each call measures over 20 ms
        return (n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
                n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES))

    def throttle_reasons(self, h: Any) -> int:
        n = self._n
        try:
            return n.nvmlDeviceGetCurrentClocksEventReasons(h)
        except n.NVMLError_FunctionNotFound:  # drivers before 535
            return n.nvmlDeviceGetCurrentClocksThrottleReasons(h)

    def process_utilization(self, h: Any, last_seen_us: int) -> list[tuple[int, int, float, float]]:
        n = self._n
        try:
            samples = n.nvmlDeviceGetProcessUtilization(h, last_seen_us)
        except n.NVMLError as e:
            if e.value in (n.NVML_SUCCESS, n.NVML_ERROR_NOT_FOUND):  # no process sampled since
                return []
            raise
        return [(s.pid, s.timeStamp, float(s.smUtil), float(s.memUtil)) for s in samples]

    def compute_pids(self, h: Any) -> list[int]:
        n = self._n
        try:
            procs = n.nvmlDeviceGetComputeRunningProcesses_v3(h)
        except n.NVMLError_FunctionNotFound:  # drivers before 510
            procs = n.nvmlDeviceGetComputeRunningProcesses_v2(h)
        return [p.pid for p in procs]


def _str(v: bytes | str) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else v
