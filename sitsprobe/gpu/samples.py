"""What the GPU sampler produces: plain, immutable records on the agent's
one clock (CLOCK_MONOTONIC ns)."""
from __future__ import annotations

from dataclasses import dataclass

# where a sample's busy_percent came from (see sitsprobe.gpu.nvml)
GPM, SAMPLES, RATES = "gpm_sm_util", "samples", "utilization_rates"
# NVML clocks event (throttle) reasons, by bit
THROTTLE_REASONS = {
    0x001: "gpu_idle", 0x002: "applications_clocks_setting", 0x004: "sw_power_cap",
    0x008: "hw_slowdown", 0x010: "sync_boost", 0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown", 0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_throttle(mask: int) -> tuple[str, ...]:
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return (*names, f"0x{rest:x}") if rest else tuple(names)


@dataclass(frozen=True, slots=True)
class ProcessUtil:
    pid: int
    sm_percent: float
    memory_percent: float
    ts_ns: int  # when NVML took it


@dataclass(frozen=True, slots=True)
class GpuSample:
    gpu: int  # NVML index
    uuid: str
    ts_ns: int  # end of the window busy_percent covers (monotonic)
    window_ns: int  # the window's length; 0 when busy_percent is None
    signal: str  # GPM, SAMPLES or RATES
    busy_percent: float | None  # None: no new reading this tick
    sm_occupancy_percent: float | None = None  # GPM only
    util_gpu_percent: float | None = None
    util_memory_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    sm_clock_mhz: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    processes: tuple[ProcessUtil, ...] = ()  # SM use by the processes NVML sampled lately
    compute_pids: tuple[int, ...] = ()  # processes holding a CUDA context on the GPU


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
