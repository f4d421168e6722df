"""A scripted NVML for tests: the sampler runs its real code over it.

Each ``RecordedGpu`` holds what NVML would answer now; a test changes its
fields between ticks to play a stream, advances ``RecordedBackend.now_us``
(the driver's wall clock, µs) to release the driver samples it holds, makes
calls fail (``fail``) or hang (``hang``), and reads back every call made.
Errors are named like pynvml's, so the sampler classifies them the same way.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .backend import GPM_SM_OCCUPANCY, GPM_SM_UTIL


class NVMLError_NotSupported(Exception):  # noqa: N801 (pynvml's names)
    pass


class NVMLError_GpuIsLost(Exception):  # noqa: N801
    pass


class NVMLError_LibraryNotFound(Exception):  # noqa: N801
    pass


@dataclass
class RecordedGpu:
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "Recorded GPU"
    gpm: bool = False  # nvmlGpmQueryDeviceSupport
    sm_util: float = 0.0  # GPM SM_UTIL over the window ending at the latest GPM sample
    sm_occupancy: float = 0.0
    samples: list[tuple[int, float]] | None = None  # driver buffer (wall µs, %); None: unsupported
    rates: tuple[float, float] = (0.0, 0.0)  # (gpu %, memory %)
    memory: tuple[int, int] = (0, 80 << 30)
    power_mw: int = 100_000
    sm_clock_mhz: int = 1980
    pcie_kb_per_s: tuple[int, int] = (0, 0)
    throttle_mask: int = 0
    processes: list[tuple[int, int, float, float]] = field(default_factory=list)  # pid, µs, sm, mem
    compute_pids: list[int] = field(default_factory=list)  # processes with a CUDA context on it


class RecordedBackend:
    def __init__(self, gpus: list[RecordedGpu], now_us: int | None = None,
                 init_error: Exception | None = None):
        self.gpus = gpus
        self.now_us = time.time_ns() // 1000 if now_us is None else now_us
        self.init_error = init_error
        self.fail: dict[tuple[int | None, str], Exception] = {}  # (gpu or None: all, method) -> raise
        self.hang: set[str] = set()  # methods that block until `release` is set
        self.release = threading.Event()
        self.calls: list[tuple[str, int | None, tuple]] = []  # (method, gpu, args)
        self._gpm_seq = 0

    def _enter(self, method: str, h: int | None, *args: Any) -> RecordedGpu | None:
        self.calls.append((method, h, args))
        if method in self.hang:
            self.release.wait()
        error = self.fail.get((h, method)) or self.fail.get((None, method))
        if error is not None:
            raise error
        return None if h is None else self.gpus[h]

    def init(self) -> None:
        self._enter("init", None)
        if self.init_error is not None:
            raise self.init_error

    def shutdown(self) -> None:
        self._enter("shutdown", None)

    def device_count(self) -> int:
        self._enter("device_count", None)
        return len(self.gpus)

    def handle(self, index: int) -> int:
        self._enter("handle", None, index)
        return index

    def uuid(self, h: int) -> str:
        return self._enter("uuid", h).uuid

    def name(self, h: int) -> str:
        return self._enter("name", h).name

    def gpm_supported(self, h: int) -> bool:
        return self._enter("gpm_supported", h).gpm

    def gpm_alloc(self) -> list:
        self._enter("gpm_alloc", None)
        return [None, None]  # a buffer: [sequence number of the sample in it, its GPU]

    def gpm_free(self, sample: list) -> None:
        self._enter("gpm_free", None)

    def gpm_sample(self, h: int, sample: list) -> None:
        self._enter("gpm_sample", h)
        self._gpm_seq += 1
        sample[:] = [self._gpm_seq, h]

    def gpm_metrics(self, s1: list, s2: list, ids: tuple[int, ...]) -> dict[int, float | None]:
        self.calls.append(("gpm_metrics", None, (s1[0], s2[0], ids)))
        g = self.gpus[s2[1]]
        values = {GPM_SM_UTIL: g.sm_util, GPM_SM_OCCUPANCY: g.sm_occupancy}
        return {i: values.get(i) for i in ids}

    def util_samples(self, h: int, last_seen_us: int) -> list[tuple[int, float]]:
        g = self._enter("util_samples", h, last_seen_us)
        if g.samples is None:
            raise NVMLError_NotSupported()
        return [(ts, v) for ts, v in g.samples if last_seen_us < ts <= self.now_us]

    def utilization_rates(self, h: int) -> tuple[float, float]:
        return self._enter("utilization_rates", h).rates

    def memory(self, h: int) -> tuple[int, int]:
        return self._enter("memory", h).memory

    def power_mw(self, h: int) -> int:
        return self._enter("power_mw", h).power_mw

    def sm_clock_mhz(self, h: int) -> int:
        return self._enter("sm_clock_mhz", h).sm_clock_mhz

    def pcie_kb_per_s(self, h: int) -> tuple[int, int]:
        return self._enter("pcie_kb_per_s", h).pcie_kb_per_s

    def throttle_reasons(self, h: int) -> int:
        return self._enter("throttle_reasons", h).throttle_mask

    def process_utilization(self, h: int, last_seen_us: int) -> list[tuple[int, int, float, float]]:
        g = self._enter("process_utilization", h, last_seen_us)
        return [p for p in g.processes if last_seen_us < p[1] <= self.now_us]

    def compute_pids(self, h: int) -> list[int]:
        return list(self._enter("compute_pids", h).compute_pids)

    def called(self, method: str) -> list[tuple[int | None, tuple]]:
        return [(h, args) for m, h, args in self.calls if m == method]
