"""The GPU sampler: NVML, every ``interval_s``, as GpuSample records on the
agent's one clock (CLOCK_MONOTONIC ns).

"Busy" is the best signal the GPU offers, named in each sample:
  gpm_sm_util        NVML GPM SM activity (Hopper and later): the share of SMs busy
  samples            the driver's own utilization samples since the last one seen,
                     weighted by the time each covers (nvmlDeviceGetSamples)
  utilization_rates  nvmlDeviceGetUtilizationRates: "a kernel ran" over the last period
Every NVML call runs on the sampler's worker thread with a deadline; errors
are counted per GPU and error name, and a GPU that stops answering is
retried later, never waited for.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..clock import WallClock
from ..errors import SitsprobeError
from .backend import GPM_SM_OCCUPANCY, GPM_SM_UTIL, NvmlBackend, PynvmlBackend, error_name
from .calls import CallRunner
from .samples import GPM, RATES, SAMPLES, GpuInfo, GpuSample, ProcessUtil, decode_throttle

log = logging.getLogger("sitsprobe.gpu")

# answers that mean "this GPU does not have that": the field is left out, not counted
_UNSUPPORTED = {"not_supported", "function_not_found", "nvml_library_mismatch_error"}
# answers after which the GPU (or the driver) is not asked again until retry_s
_LOST = {"gpu_is_lost", "call_timeout", "driver_hung", "timeout", "uninitialized",
         "driver_not_loaded", "reset_required", "gpu_not_found", "lib_rm_version_mismatch"}
_MAX_SAMPLE_GAP_US = 1_000_000  # one driver sample never covers more than this


class NvmlUnavailable(SitsprobeError):
    """No GPU sampling here; the message says why and is fit for a log line."""


class _Lost(Exception):
    pass


@dataclass
class _Gpu:
    info: GpuInfo
    handle: Any
    signal: str = RATES
    gpm: list[Any] = field(default_factory=list)  # [previous, next] GPM sample buffers
    gpm_prev_ns: int = 0
    util_cursor_us: int = 0  # newest driver sample seen
    proc_cursor_us: int = 0
    procs: dict[int, ProcessUtil] = field(default_factory=dict)
    off: set[str] = field(default_factory=set)  # fields this GPU does not support
    retry_at_ns: int = 0
    slow_at_ns: int = 0  # when PCIe and the compute processes are read next
    pcie: tuple[float, float] | None = None
    compute_pids: tuple[int, ...] = ()


class NvmlSampler:
    def __init__(self, backend: NvmlBackend | None = None, *, interval_s: float = 0.2,
                 call_timeout_s: float = 1.0, retry_s: float = 5.0, slow_interval_s: float = 1.0,
                 clock: WallClock | None = None,
                 monotonic_ns: Callable[[], int] = time.monotonic_ns):
        self._backend = backend
        self.interval_s = interval_s
        self._runner = CallRunner(call_timeout_s)
        self._retry_ns, self._slow_ns = int(retry_s * 1e9), int(slow_interval_s * 1e9)
        self._clock = clock or WallClock()  # NVML stamps in wall-clock µs
        self._now = monotonic_ns
        self._gpus: list[_Gpu] = []
        self._opened = False
        self._lock = threading.Lock()
        self._latest: dict[int, GpuSample] = {}
        self._errors: dict[tuple[int, str], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- setup --------------------------------------------------------------------

    def open(self) -> list[GpuInfo]:
        """nvmlInit (once) and choose each GPU's busy signal. Raises NvmlUnavailable."""
        if self._opened:
            return self.gpus
        try:
            if self._backend is None:
                self._backend = PynvmlBackend()
            b = self._backend
            self._runner.call(b.init)
            count = self._runner.call(b.device_count)
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py is not installed: pip install 'sitsprobe[gpu]'")
        except Exception as e:
            raise NvmlUnavailable(describe(e)) from None
        for i in range(count):
            try:
                h = self._runner.call(b.handle, i)
                info = GpuInfo(i, self._runner.call(b.uuid, h), self._runner.call(b.name, h))
            except Exception as e:  # one GPU already off the bus: sample the others
                self._count(i, error_name(e))
                log.warning("gpu %d: %s; not sampled", i, describe(e))
                continue
            self._gpus.append(_Gpu(info, h))
        if not self._gpus:
            raise NvmlUnavailable("NVML answers but sees no GPU" if not count else
                                  f"none of the {count} GPU(s) answers NVML")
        self._opened = True
        for g in self._gpus:
            self._choose_signal(g)
            log.info("gpu %d %s (%s): busy from %s", g.info.index, g.info.name, g.info.uuid, g.signal)
        return self.gpus

    def _choose_signal(self, g: _Gpu, gpm: bool = True) -> None:
        """GPM if the GPU has it, else the driver's samples, else the rates."""
        b = self._backend
        try:
            if gpm and self._runner.call(b.gpm_supported, g.handle):
                g.gpm = [self._runner.call(b.gpm_alloc), self._runner.call(b.gpm_alloc)]
                g.gpm_prev_ns, g.signal = 0, GPM  # the first tick opens the first window
                return
        except Exception as e:
            self._count_unless_unsupported(g, e)
        self._free_gpm(g)
        try:  # the first call primes the cursor: the buffer it returns is history
            samples = self._runner.call(b.util_samples, g.handle, 0)
            g.util_cursor_us = max((ts for ts, _ in samples), default=0)
            g.signal = SAMPLES
        except Exception as e:
            self._count_unless_unsupported(g, e)
            g.signal = RATES

    def _count_unless_unsupported(self, g: _Gpu, e: Exception) -> None:
        name = error_name(e)
        if name not in _UNSUPPORTED:
            self._count(g.info.index, name)

    # -- one pass -----------------------------------------------------------------

    def tick(self) -> list[GpuSample]:
        """Sample every GPU once (those not waiting out a retry)."""
        self.open()
        out = []
        for g in self._gpus:
            now = self._now()
            if now < g.retry_at_ns:
                continue
            try:
                s = self._sample(g, now)
            except _Lost as e:
                g.retry_at_ns = now + self._retry_ns
                log.warning("gpu %d: %s; retrying in %gs", g.info.index, e, self._retry_ns / 1e9)
                continue
            with self._lock:
                self._latest[g.info.index] = s
            out.append(s)
        return out

    def _sample(self, g: _Gpu, now: int) -> GpuSample:
        busy, occupancy, end, window = self._busy(g, now)
        rates = self._read(g, "utilization_rates")
        memory = self._read(g, "memory")
        power = self._read(g, "power_mw")
        throttle = self._read(g, "throttle_reasons")
        if now >= g.slow_at_ns:  # each PCIe read costs the driver 20 ms
            pcie = self._read(g, "pcie_kb_per_s")
            g.pcie = None if pcie is None else (pcie[0] * 1024.0, pcie[1] * 1024.0)
            g.compute_pids = tuple(sorted(self._read(g, "compute_pids") or ()))
            g.slow_at_ns = now + self._slow_ns
        if busy is None and g.signal == RATES and rates is not None:
            busy, end, window = rates[0], now, int(self.interval_s * 1e9)
        return GpuSample(
            gpu=g.info.index, uuid=g.info.uuid, ts_ns=end, window_ns=window if busy is not None else 0,
            signal=g.signal, busy_percent=busy, sm_occupancy_percent=occupancy,
            util_gpu_percent=None if rates is None else rates[0],
            util_memory_percent=None if rates is None else rates[1],
            memory_used_bytes=None if memory is None else memory[0],
            memory_total_bytes=None if memory is None else memory[1],
            power_watts=None if power is None else power / 1000.0,
            sm_clock_mhz=self._read(g, "sm_clock_mhz"),
            pcie_tx_bytes_per_s=None if g.pcie is None else g.pcie[0],
            pcie_rx_bytes_per_s=None if g.pcie is None else g.pcie[1],
            throttle_reasons=decode_throttle(throttle or 0),
            processes=self._processes(g, now),
            compute_pids=g.compute_pids,
        )

    def _busy(self, g: _Gpu, now: int) -> tuple[float | None, float | None, int, int]:
        """(busy %, SM occupancy %, window end ns, window ns) by the GPU's signal."""
        if g.signal == GPM:
            return self._gpm(g, now)
        if g.signal == SAMPLES:
            samples = self._read(g, "util_samples", g.util_cursor_us)
            if "util_samples" in g.off:
                g.signal = RATES
            return self._weighted(g, samples or [])
        return None, None, now, 0

    def _gpm(self, g: _Gpu, now: int) -> tuple[float | None, float | None, int, int]:
        """SM activity between the previous GPM sample and one taken now."""
        b = self._backend
        try:
            self._runner.call(b.gpm_sample, g.handle, g.gpm[1])
            t = self._now()
            m = (self._runner.call(b.gpm_metrics, g.gpm[0], g.gpm[1], (GPM_SM_UTIL, GPM_SM_OCCUPANCY))
                 if g.gpm_prev_ns else {})
        except Exception as e:
            g.gpm_prev_ns = 0  # the next tick opens a fresh window
            if error_name(e) in _UNSUPPORTED:
                log.info("gpu %d: GPM not supported after all; busy from the driver's samples",
                         g.info.index)
                self._choose_signal(g, gpm=False)
                return None, None, now, 0
            self._fail(g, e)
            return None, None, now, 0
        g.gpm.reverse()  # the sample just taken starts the next window
        start, g.gpm_prev_ns = g.gpm_prev_ns, t
        if not start:
            return None, None, t, 0
        return m.get(GPM_SM_UTIL), m.get(GPM_SM_OCCUPANCY), t, t - start

    def _weighted(self, g: _Gpu, samples: list[tuple[int, float]]) -> tuple:
        """Each driver sample covers the time since the one before it."""
        prev, total, weighted = g.util_cursor_us, 0, 0.0
        for ts, value in sorted(samples):
            if ts <= prev:
                continue
            dt = min(ts - prev, _MAX_SAMPLE_GAP_US) if g.util_cursor_us else 0
            weighted, total, prev = weighted + value * dt, total + dt, ts
        g.util_cursor_us = prev  # a cursor of 0 (an empty buffer at start) primes here
        if not total:
            return None, None, self._now(), 0
        return weighted / total, None, self._mono(prev), total * 1000

    def _processes(self, g: _Gpu, now: int) -> tuple[ProcessUtil, ...]:
        """The latest reading of each process NVML sampled lately."""
        for pid, ts, sm, mem in self._read(g, "process_utilization", g.proc_cursor_us) or ():
            g.proc_cursor_us = max(g.proc_cursor_us, ts)
            seen = g.procs.get(pid)
            if seen is None or self._mono(ts) >= seen.ts_ns:
                g.procs[pid] = ProcessUtil(pid, sm, mem, self._mono(ts))
        stale = now - max(2_000_000_000, int(10 * self.interval_s * 1e9))
        g.procs = {pid: p for pid, p in g.procs.items() if p.ts_ns >= stale}
        return tuple(sorted(g.procs.values(), key=lambda p: p.pid))

    def _read(self, g: _Gpu, method: str, *args: Any) -> Any:
        """backend.method(handle, *args), or None (counted) when it fails."""
        if method in g.off:
            return None
        try:
            return self._runner.call(getattr(self._backend, method), g.handle, *args)
        except Exception as e:
            if error_name(e) in _UNSUPPORTED:
                g.off.add(method)
                log.info("gpu %d: %s not supported; left out", g.info.index, method)
                return None
            self._fail(g, e)
            return None

    def _fail(self, g: _Gpu, e: Exception) -> None:
        name = error_name(e)
        self._count(g.info.index, name)
        if name in _LOST:
            raise _Lost(f"{name}: {e}")

    def _count(self, gpu: int, name: str) -> None:
        with self._lock:
            self._errors[(gpu, name)] = self._errors.get((gpu, name), 0) + 1

    def _mono(self, wall_us: int) -> int:
        return wall_us * 1000 - self._clock.offset_ns

    def _free_gpm(self, g: _Gpu) -> None:
        for s in g.gpm:
            try:
                self._runner.call(self._backend.gpm_free, s)
            except Exception:
                pass
        g.gpm = []

    # -- reading ------------------------------------------------------------------

    @property
    def gpus(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def signals(self) -> dict[int, str]:
        return {g.info.index: g.signal for g in self._gpus}

    def latest(self) -> dict[int, GpuSample]:
        with self._lock:
            return dict(self._latest)

    def process_gpus(self) -> dict[int, tuple[int, ...]]:
        """pid -> the GPUs it runs on (holds a context on, or was sampled using)."""
        out: dict[int, set[int]] = {}
        for s in self.latest().values():
            for pid in (*s.compute_pids, *(p.pid for p in s.processes)):
                out.setdefault(pid, set()).add(s.gpu)
        return {pid: tuple(sorted(gpus)) for pid, gpus in out.items()}

    def errors(self) -> dict[tuple[int, str], int]:
        """(gpu, error name) -> count."""
        with self._lock:
            return dict(self._errors)

    # -- in the background --------------------------------------------------------

    def start(self, on_sample: Callable[[GpuSample], None] | None = None) -> list[GpuInfo]:
        """open(), then tick() every interval_s on a thread of its own."""
        gpus = self.open()
        self._thread = threading.Thread(target=self._loop, args=(on_sample,), name="gpu-sampler",
                                        daemon=True)
        self._thread.start()
        return gpus

    def _loop(self, on_sample: Callable[[GpuSample], None] | None) -> None:
        due = time.monotonic()
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + self.interval_s, time.monotonic())
            try:
                for s in self.tick():
                    if on_sample is not None:
                        on_sample(s)
            except Exception:  # a bug here must not end GPU sampling
                log.exception("gpu sampling pass failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._opened:
            for g in self._gpus:
                self._free_gpm(g)
            try:
                self._runner.call(self._backend.shutdown)
            except Exception:
                pass
            self._opened = False
        self._runner.close()


def describe(e: BaseException) -> str:
    """Why NVML cannot be used, as a user reads it."""
    name = error_name(e)
    return {
        "library_not_found": "NVML (libnvidia-ml.so.1) not found: no NVIDIA driver on this node; "
                             "GPU sampling off",
        "driver_not_loaded": "the NVIDIA kernel driver is not loaded; GPU sampling off",
        "no_permission": "no permission to talk to the NVIDIA driver (run privileged or add the "
                         "device nodes); GPU sampling off",
        "call_timeout": f"NVML did not answer ({e}); GPU sampling off",
    }.get(name, f"NVML failed: {name} ({e}); GPU sampling off")


def available(backend: NvmlBackend | None = None, timeout_s: float = 2.0) -> tuple[bool, str]:
    """Whether NVML answers here, and what it sees (for doctor). No traceback."""
    runner = CallRunner(timeout_s)
    try:
        b = backend if backend is not None else PynvmlBackend()
        runner.call(b.init)
        try:
            n = runner.call(b.device_count)
            names = [runner.call(b.name, runner.call(b.handle, i)) for i in range(n)]
        finally:
            runner.call(b.shutdown)
    except ImportError:
        return False, "nvidia-ml-py is not installed: pip install 'sitsprobe[gpu]'"
    except Exception as e:
        return False, describe(e)
    finally:
        runner.close()
    if not n:
        return False, "NVML answers but sees no GPU"
    return True, f"{n} GPU(s): {', '.join(names)}"
