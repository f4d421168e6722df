"""The NVML sampler, run over a RecordedBackend: the same code path as on a GPU."""
from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sitsprobe.clock import WallClock
from sitsprobe.containers import Container
from sitsprobe.gpu.calls import CallRunner, CallTimeout, DriverHung
from sitsprobe.gpu.metrics import GpuMetrics
from sitsprobe.gpu.nvml import (GPM, RATES, SAMPLES, NvmlSampler, NvmlUnavailable, available,
                                decode_throttle)
from sitsprobe.gpu.recorded import (NVMLError_GpuIsLost, NVMLError_LibraryNotFound,
                                    NVMLError_NotSupported, RecordedBackend, RecordedGpu)

T0_US = 1_750_000_000_000_000  # the driver's wall clock, µs


class FakeMonotonic:
    def __init__(self, start: int = 10_000_000_000):
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


def clock_with_offset(offset_ns: int) -> WallClock:
    c = WallClock()
    c.offset_ns = offset_ns
    return c


def sampler(backend, **kw) -> NvmlSampler:
    kw.setdefault("monotonic_ns", FakeMonotonic())
    kw.setdefault("clock", clock_with_offset(T0_US * 1000 - 10_000_000_000))
    s = NvmlSampler(backend, **kw)
    s.open()
    return s


# -- the busy signal ----------------------------------------------------------------

def test_signal_order_gpm_then_samples_then_rates():
    b = RecordedBackend([
        RecordedGpu(gpm=True, samples=[]),  # Hopper: GPM wins over samples
        RecordedGpu(gpm=False, samples=[(T0_US - 10, 5.0)]),
        RecordedGpu(gpm=False, samples=None),  # neither: the rates
    ], now_us=T0_US)
    s = sampler(b)
    assert s.signals() == {0: GPM, 1: SAMPLES, 2: RATES}
    samples = {x.gpu: x for x in s.tick()}
    assert {i: x.signal for i, x in samples.items()} == {0: GPM, 1: SAMPLES, 2: RATES}
    assert s.errors() == {}  # "not supported" is an answer, not an error


def test_gpm_query_failing_as_unsupported_falls_to_samples():
    b = RecordedBackend([RecordedGpu(gpm=True, samples=[])], now_us=T0_US)
    b.fail[(0, "gpm_supported")] = NVMLError_NotSupported()
    assert sampler(b).signals() == {0: SAMPLES}


def test_gpm_busy_is_sm_util_between_consecutive_samples():
    mono = FakeMonotonic()
    b = RecordedBackend([RecordedGpu(gpm=True, sm_util=40.0, sm_occupancy=22.0)], now_us=T0_US)
    s = sampler(b, monotonic_ns=mono)
    first, = s.tick()
    assert first.busy_percent is None and first.window_ns == 0  # opens the first window
    mono.advance(0.2)
    second, = s.tick()
    assert (second.busy_percent, second.sm_occupancy_percent) == (40.0, 22.0)
    assert second.window_ns == 200_000_000 and second.ts_ns == mono.now
    b.gpus[0].sm_util = 90.0
    mono.advance(0.2)
    assert s.tick()[0].busy_percent == 90.0
    windows = [args[:2] for _, args in b.called("gpm_metrics")]
    assert windows == [(1, 2), (2, 3)]  # each window starts where the last ended


def test_gpm_unsupported_at_run_time_degrades_to_samples():
    b = RecordedBackend([RecordedGpu(gpm=True, samples=[])], now_us=T0_US)
    s = sampler(b)
    b.fail[(0, "gpm_sample")] = NVMLError_NotSupported()
    s.tick()
    assert s.signals() == {0: SAMPLES} and s.errors() == {}


def test_samples_cursor_is_the_newest_timestamp_seen():
    g = RecordedGpu(samples=[(T0_US - 300_000, 10.0), (T0_US - 100_000, 20.0)])
    b = RecordedBackend([g], now_us=T0_US)
    s = sampler(b)
    assert b.called("util_samples") == [(0, (0,))]  # the first call takes the history ...
    x, = s.tick()
    assert x.busy_percent is None  # ... and primes the cursor: history is not this tick
    g.samples += [(T0_US + 100_000, 50.0), (T0_US + 200_000, 70.0)]
    b.now_us = T0_US + 150_000  # the driver has taken only the first of them yet
    s.tick()
    b.now_us = T0_US + 250_000
    s.tick()
    s.tick()  # nothing new
    cursors = [args[0] for _, args in b.called("util_samples")]
    assert cursors == [0, T0_US - 100_000, T0_US - 100_000, T0_US + 100_000, T0_US + 200_000]


def test_samples_are_weighted_by_the_time_each_covers():
    g = RecordedGpu(samples=[(T0_US, 0.0)])
    b = RecordedBackend([g], now_us=T0_US)
    s = sampler(b)
    # 100 % for 100 ms, then 0 % for 300 ms: busy 25 % (a plain mean says 50 %)
    g.samples += [(T0_US + 100_000, 100.0), (T0_US + 400_000, 0.0)]
    b.now_us = T0_US + 400_000
    x, = s.tick()
    assert x.busy_percent == pytest.approx(25.0)
    assert x.window_ns == 400_000_000
    s.tick()
    assert s.latest()[0].busy_percent is None  # no new driver samples: no reading


def test_a_long_gap_does_not_stretch_one_sample():
    g = RecordedGpu(samples=[(T0_US, 0.0)])
    b = RecordedBackend([g], now_us=T0_US)
    s = sampler(b)
    g.samples += [(T0_US + 30_000_000, 100.0), (T0_US + 31_000_000, 0.0)]  # 30 s unseen
    b.now_us = T0_US + 31_000_000
    x, = s.tick()
    assert x.busy_percent == pytest.approx(50.0)  # the stale one covers at most 1 s


def test_driver_timestamps_land_on_the_monotonic_clock():
    offset = 1_749_999_000_000_000_000  # wall - monotonic, measured once by WallClock
    g = RecordedGpu(samples=[(T0_US, 0.0)], processes=[(4242, T0_US + 150_000, 33.0, 7.0)])
    b = RecordedBackend([g], now_us=T0_US + 200_000)
    s = sampler(b, clock=clock_with_offset(offset))
    g.samples.append((T0_US + 200_000, 60.0))
    x, = s.tick()
    assert x.ts_ns == (T0_US + 200_000) * 1000 - offset
    p, = x.processes
    assert (p.pid, p.sm_percent, p.memory_percent) == (4242, 33.0, 7.0)
    assert p.ts_ns == (T0_US + 150_000) * 1000 - offset


def test_rates_busy_and_the_other_readings():
    g = RecordedGpu(rates=(63.0, 21.0), memory=(30 << 30, 141 << 30), power_mw=412_500,
                    sm_clock_mhz=1755, pcie_kb_per_s=(1000, 2000), throttle_mask=0x1 | 0x40)
    s = sampler(RecordedBackend([g], now_us=T0_US), interval_s=0.25)
    x, = s.tick()
    assert (x.signal, x.busy_percent, x.window_ns) == (RATES, 63.0, 250_000_000)
    assert (x.util_gpu_percent, x.util_memory_percent) == (63.0, 21.0)
    assert (x.memory_used_bytes, x.memory_total_bytes) == (30 << 30, 141 << 30)
    assert x.power_watts == 412.5 and x.sm_clock_mhz == 1755
    assert (x.pcie_tx_bytes_per_s, x.pcie_rx_bytes_per_s) == (1000 * 1024, 2000 * 1024)
    assert x.throttle_reasons == ("gpu_idle", "hw_thermal_slowdown")


def test_pcie_and_compute_processes_are_read_at_a_slower_interval():
    mono = FakeMonotonic()
    b = RecordedBackend([RecordedGpu(compute_pids=[31, 30])], now_us=T0_US)
    s = sampler(b, monotonic_ns=mono, slow_interval_s=1.0)
    for _ in range(10):
        x, = s.tick()
        assert x.compute_pids == (30, 31)  # carried between reads
        mono.advance(0.2)
    assert len(b.called("pcie_kb_per_s")) == 2  # each read costs the driver 2 x 20 ms
    assert len(b.called("compute_pids")) == 2


def test_process_gpus_maps_pids_to_the_gpus_they_use():
    b = RecordedBackend([RecordedGpu(compute_pids=[10, 11]),
                         RecordedGpu(compute_pids=[11], processes=[(12, T0_US, 5.0, 1.0)])],
                        now_us=T0_US)
    s = sampler(b, clock=clock_with_offset(T0_US * 1000 - FakeMonotonic().now))
    s.tick()
    assert s.process_gpus() == {10: (0,), 11: (0, 1), 12: (1,)}


def test_unsupported_field_is_left_out_and_not_asked_again():
    b = RecordedBackend([RecordedGpu()], now_us=T0_US)
    b.fail[(0, "power_mw")] = NVMLError_NotSupported()
    s = sampler(b)
    assert [x.power_watts for x in s.tick() + s.tick()] == [None, None]
    assert len(b.called("power_mw")) == 1 and s.errors() == {}


def test_process_utilization_by_pid_with_its_own_cursor():
    mono = FakeMonotonic()
    g = RecordedGpu(processes=[(100, T0_US - 50, 10.0, 1.0), (100, T0_US, 30.0, 3.0),
                               (200, T0_US, 5.0, 0.0)])
    b = RecordedBackend([g], now_us=T0_US)
    s = sampler(b, monotonic_ns=mono, clock=clock_with_offset(T0_US * 1000 - mono.now))
    x, = s.tick()
    assert [(p.pid, p.sm_percent) for p in x.processes] == [(100, 30.0), (200, 5.0)]
    g.processes.append((200, T0_US + 100_000, 80.0, 9.0))
    b.now_us = T0_US + 100_000
    mono.advance(0.1)
    x, = s.tick()
    assert [(p.pid, p.sm_percent) for p in x.processes] == [(100, 30.0), (200, 80.0)]
    assert [args[0] for _, args in b.called("process_utilization")] == [0, T0_US]
    mono.advance(5.0)  # nobody sampled since: they left the GPU
    assert s.tick()[0].processes == ()


# -- failure ------------------------------------------------------------------------

def test_gpu_falling_off_the_bus_is_counted_and_survived():
    pynvml = pytest.importorskip("pynvml")
    mono = FakeMonotonic()
    b = RecordedBackend([RecordedGpu(rates=(50.0, 1.0)), RecordedGpu(rates=(60.0, 2.0))], now_us=T0_US)
    s = sampler(b, monotonic_ns=mono, retry_s=5.0)
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)  # the class pynvml raises
    assert type(lost).__name__ == "NVMLError_GpuIsLost"
    b.fail[(0, "utilization_rates")] = lost
    assert [x.gpu for x in s.tick()] == [1]  # the other GPU keeps being sampled
    mono.advance(1.0)
    assert [x.gpu for x in s.tick()] == [1]  # GPU 0 is left alone until retry_s
    assert s.errors() == {(0, "gpu_is_lost"): 1}
    del b.fail[(0, "utilization_rates")]  # back (a reset brought it back)
    mono.advance(5.0)
    assert [x.gpu for x in s.tick()] == [0, 1]
    assert s.latest()[0].busy_percent == 50.0


def test_other_errors_are_counted_per_gpu_and_error_and_the_field_dropped():
    b = RecordedBackend([RecordedGpu()], now_us=T0_US)
    b.fail[(0, "sm_clock_mhz")] = RuntimeError("glitch")
    s = sampler(b)
    x, = s.tick()
    assert x.sm_clock_mhz is None and x.power_watts is not None
    s.tick()
    assert s.errors() == {(0, "runtime_error"): 2}  # asked again: a glitch may pass


def test_a_hanging_call_times_out_and_sampling_goes_on():
    mono = FakeMonotonic()
    b = RecordedBackend([RecordedGpu(rates=(40.0, 0.0)), RecordedGpu(rates=(41.0, 0.0))], now_us=T0_US)
    s = sampler(b, monotonic_ns=mono, call_timeout_s=0.2, retry_s=5.0)
    b.hang.add("power_mw")  # the driver blocks in this call
    try:
        t = time.monotonic()
        assert s.tick() == []  # both GPUs time out in turn ...
        assert time.monotonic() - t < 2.0  # ... each after the call timeout, not forever
        assert s.errors() == {(0, "call_timeout"): 1, (1, "call_timeout"): 1}
        b.hang.clear()
        mono.advance(5.0)
        assert [x.busy_percent for x in s.tick()] == [40.0, 41.0]  # fresh worker threads
    finally:
        b.release.set()
        s.close()


def test_runner_stops_calling_a_driver_with_too_many_stuck_calls():
    release = threading.Event()
    r = CallRunner(timeout_s=0.05, max_stuck=2)
    for _ in range(2):
        with pytest.raises(CallTimeout):
            r.call(release.wait)
    with pytest.raises(DriverHung):
        r.call(lambda: 1)
    release.set()
    time.sleep(0.2)
    assert r.call(lambda: 7) == 7  # the stuck calls returned: back to normal
    r.close()


def test_runner_passes_errors_and_values_through():
    r = CallRunner(timeout_s=1)
    assert r.call(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(KeyError):
        r.call({}.__getitem__, "x")
    r.close()


# -- no NVML ------------------------------------------------------------------------

def test_missing_nvml_is_a_reason_not_a_traceback():
    ok, reason = available(RecordedBackend([], init_error=NVMLError_LibraryNotFound()))
    assert not ok and "libnvidia-ml.so.1) not found" in reason
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver"):
        NvmlSampler(RecordedBackend([], init_error=NVMLError_LibraryNotFound())).open()
    ok, reason = available(RecordedBackend([]))
    assert (ok, reason) == (False, "NVML answers but sees no GPU")


def test_available_on_this_machine_says_why_not():
    ok, reason = available()  # real pynvml; CI machines have no NVIDIA driver
    if ok:
        pytest.skip(f"this machine has NVML: {reason}")
    assert reason and "Traceback" not in reason


def test_available_counts_gpus():
    b = RecordedBackend([RecordedGpu(name="NVIDIA H200"), RecordedGpu(name="NVIDIA H200")])
    assert available(b) == (True, "2 GPU(s): NVIDIA H200, NVIDIA H200")
    assert [m for m, *_ in b.calls][:1] == ["init"] and b.called("shutdown")


def test_init_happens_once():
    b = RecordedBackend([RecordedGpu()], now_us=T0_US)
    s = sampler(b)
    s.open()
    s.tick()
    assert len(b.called("init")) == 1


# -- running and exporting ----------------------------------------------------------

def test_background_sampling_delivers_samples_until_closed():
    b = RecordedBackend([RecordedGpu(rates=(12.0, 3.0))], now_us=T0_US)
    s = NvmlSampler(b, interval_s=0.02)
    got: list = []
    s.start(got.append)
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.close()
    assert len(got) >= 3 and all(x.busy_percent == 12.0 for x in got)
    assert b.called("shutdown")


def test_error_names():
    from sitsprobe.gpu.backend import error_name
    from sitsprobe.gpu.calls import CallTimeout

    class NVMLLibraryMismatchError(Exception):
        pass

    assert error_name(NVMLError_GpuIsLost()) == "gpu_is_lost"
    assert error_name(NVMLLibraryMismatchError()) == "nvml_library_mismatch_error"
    assert error_name(CallTimeout("f", 1)) == "call_timeout"
    assert error_name(OSError()) == "os_error"


def test_decode_throttle_names_unknown_bits():
    assert decode_throttle(0) == ()
    assert decode_throttle(0x4 | 0x8) == ("sw_power_cap", "hw_slowdown")
    assert decode_throttle(0x1000 | 0x1) == ("gpu_idle", "0x1000")


def test_gpu_metrics_collector():
    b = RecordedBackend([RecordedGpu(uuid="GPU-abc", name="NVIDIA H200", rates=(50.0, 10.0),
                                     power_mw=300_000, throttle_mask=0x4,
                                     processes=[(77, T0_US, 45.0, 5.0)])], now_us=T0_US)
    s = sampler(b)
    s.tick()
    b.fail[(0, "utilization_rates")] = NVMLError_GpuIsLost()
    s.tick()
    reg = CollectorRegistry()
    pod = Container("cd" * 32, "containerd", "1f2e3d4c-5b6a-4789-8abc-def012345678")
    reg.register(GpuMetrics(s, process_name={77: "engine"}.get, container={77: pod}.get))
    text = generate_latest(reg).decode()
    for line in ('sitsprobe_gpu_info{gpu="0",name="NVIDIA H200",uuid="GPU-abc"} 1.0',
                 'sitsprobe_gpu_busy_ratio{gpu="0",signal="utilization_rates"} 0.5',
                 'sitsprobe_gpu_utilization_ratio{gpu="0",kind="memory"} 0.1',
                 'sitsprobe_gpu_power_watts{gpu="0"} 300.0',
                 'sitsprobe_gpu_throttle_reason{gpu="0",reason="sw_power_cap"} 1.0',
                 'sitsprobe_gpu_process_sm_utilization_ratio{container_id="' + "cd" * 32 + '",gpu="0",'
                 'pid="77",pod_uid="1f2e3d4c-5b6a-4789-8abc-def012345678",process="engine"} 0.45',
                 'sitsprobe_gpu_nvml_errors_total{error="gpu_is_lost",gpu="0"} 1.0'):
        assert line in text, line


def test_a_gpu_lost_before_start_is_left_out():
    b = RecordedBackend([RecordedGpu(uuid="GPU-a"), RecordedGpu(uuid="GPU-b")], now_us=T0_US)
    b.fail[(0, "uuid")] = NVMLError_GpuIsLost()
    s = sampler(b)
    assert [g.uuid for g in s.gpus] == ["GPU-b"]
    assert [x.gpu for x in s.tick()] == [1] and s.errors() == {(0, "gpu_is_lost"): 1}
