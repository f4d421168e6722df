"""The GPU layer: NVML sampling, host-side demand signals, CUDA counts and
the utilization-collapse detector. Nothing here imports bcc (the CUDA
uprobes load in sitsprobe.probes.cuda) and nothing needs a GPU to import.

  nvml      NvmlSampler -> GpuSample (busy by GPM, driver samples or rates)
  host      HostSampler -> HostSample (threads' on-CPU and run-queue wait)
  cuda      CudaCount records and their time shares (CudaShares)
  collapse  CollapseDetector -> Alert
  metrics   the Prometheus Collectors over all of it
"""
from .collapse import Alert, CollapseConfig, CollapseDetector
from .cuda import CudaCount, CudaShares, ShareTracker
from .host import HostSample, HostSampler
from .nvml import GpuInfo, GpuSample, NvmlSampler, NvmlUnavailable, ProcessUtil, available

__all__ = [
    "Alert", "CollapseConfig", "CollapseDetector",
    "CudaCount", "CudaShares", "ShareTracker",
    "HostSample", "HostSampler",
    "GpuInfo", "GpuSample", "NvmlSampler", "NvmlUnavailable", "ProcessUtil", "available",
]
