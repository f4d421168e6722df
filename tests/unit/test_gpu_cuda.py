"""CUDA probes without loading BPF: finding the libraries in /proc/PID/maps,
choosing probe points from a library's symbols, and the counts' consumers."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from sitsprobe.gpu.cuda import CudaCount, ShareTracker, Totals, totals
from sitsprobe.gpu.metrics import CudaMetrics
from sitsprobe.probes.cuda import DRIVER, RUNTIME, cuda_libraries, probe_points

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 1234 /usr/bin/python3.11
7f0000000000-7f0000010000 r--p 00000000 fe:00 5342499 /venv/nvidia/cuda_runtime/lib/libcudart.so.12
7f0000010000-7f0000080000 r-xp 00010000 fe:00 5342499 /venv/nvidia/cuda_runtime/lib/libcudart.so.12
7f0000100000-7f0000180000 r-xp 00000000 fe:00 777 /usr/lib/x86_64-linux-gnu/libcuda.so.565.57.01
7f0000200000-7f0000280000 r-xp 00000000 fe:00 888 /venv/torch/lib/libcudart-9335f6a2.so.12
7f0000300000-7f0000380000 r-xp 00000000 fe:00 999 /venv/nvidia/cudnn/lib/libcudnn.so.9
7f0000400000-7f0000480000 r-xp 00000000 fe:00 111 /tmp/old/libcudart.so.12 (deleted)
7f0000500000-7f0000580000 r-xp 00000000 00:00 0 [heap]
7f0000600000-7f0000680000 r-xp 00000000 fe:00 222 /opt/libcuda_wrapper.so
7f0000700000-7f0000780000 r-xp 00000000 fe:00 5342499 /other/path/to/the/same/libcudart.so.12
"""


def test_cuda_libraries_from_maps(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_text(MAPS)
    libs = cuda_libraries(42, str(tmp_path))
    assert [(lib.kind, lib.path, lib.inode) for lib in libs] == [
        (RUNTIME, "/venv/nvidia/cuda_runtime/lib/libcudart.so.12", 5342499),  # once per file
        (DRIVER, "/usr/lib/x86_64-linux-gnu/libcuda.so.565.57.01", 777),
        (RUNTIME, "/venv/torch/lib/libcudart-9335f6a2.so.12", 888),  # auditwheel's copy
    ]
    assert cuda_libraries(43, str(tmp_path)) == []  # gone


def test_probe_points_one_per_address_with_variants():
    exported = [("cudaLaunchKernel", 0x100), ("cudaLaunchKernel_ptsz", 0x200),
                ("cudaMemcpy", 0x300), ("cudaMemcpy_ptds", 0x400),
                ("cudaMemcpyToSymbol", 0x500),  # not one we want
                ("cudaFree", 0x600), ("cudaFreeAlias", 0x600),
                ("cudaStreamSynchronize", 0x700), ("cudaStreamSynchronize_v2", 0x800)]
    points = probe_points(RUNTIME, exported)
    assert points == [
        ("cudaFree", "cuda_free", "cuda_free_ret"),
        ("cudaLaunchKernel", "cuda_launch_kernel", None),
        ("cudaLaunchKernel_ptsz", "cuda_launch_kernel", None),
        ("cudaMemcpy", "cuda_memcpy", "cuda_memcpy_ret"),
        ("cudaMemcpy_ptds", "cuda_memcpy", "cuda_memcpy_ret"),
        ("cudaStreamSynchronize", "cuda_stream_sync", "cuda_stream_sync_ret"),
    ]
    aliased = probe_points(DRIVER, [("cuLaunchKernel", 0x10), ("cuLaunchKernel_ptsz", 0x10),
                                    ("cuLaunchKernelEx", 0x20)])
    assert [p[0] for p in aliased] == ["cuLaunchKernel", "cuLaunchKernelEx"]


def _counts(copy_ns: int, sync_ns: int, launches: int, pid: int = 7) -> list[CudaCount]:
    return [CudaCount(pid, "cudaMemcpy", "device_to_host", 3, 0, 300, copy_ns),
            CudaCount(pid, "cudaStreamSynchronize", "", 5, 0, 0, sync_ns),
            CudaCount(pid, "cudaLaunchKernel", "", launches, 0, 0, 0)]


def test_totals_per_process():
    assert totals(_counts(250, 600, 40) + _counts(1, 2, 3, pid=8)) == {
        7: Totals(copy_ns=250, sync_ns=600, launches=40, copy_bytes=300),
        8: Totals(copy_ns=1, sync_ns=2, launches=3, copy_bytes=300)}


def test_share_tracker_turns_totals_into_shares():
    t = ShareTracker()
    assert t.update(totals(_counts(0, 0, 0)), 1_000_000_000) == []
    s, = t.update(totals(_counts(250_000_000, 600_000_000, 40)), 2_000_000_000)
    assert (s.pid, s.copy, s.sync, s.launches) == (7, 0.25, 0.6, 40)
    assert t.update({}, 3_000_000_000) == []  # the process went away: forgotten


def test_cuda_metrics_collector():
    counts = [
        CudaCount(7, "cudaLaunchKernel", "", 101, 0, 0, 0),
        CudaCount(7, "cudaMemcpy", "host_to_device", 3, 1, 3000, 1_500_000_000),
        CudaCount(7, "cudaMemcpyAsync", "host_to_device", 2, 0, 2000, 0),
        CudaCount(7, "cudaMemcpyAsync", "device_to_host", 1, 0, 10, 0),
        CudaCount(7, "cudaDeviceSynchronize", "", 5, 0, 0, 2_000_000_000),
        CudaCount(7, "cudaMalloc", "", 2, 0, 1 << 20, 10),
        CudaCount(7, "cudaFree", "", 1, 0, 1 << 19, 10),
    ]
    reg = CollectorRegistry()
    reg.register(CudaMetrics(lambda: counts, lambda: {"stats_full": 0, "inflight_lost": 2},
                             {7: "engine"}.get))
    text = generate_latest(reg).decode()
    for line in (
        'sitsprobe_cuda_calls_total{function="cudaLaunchKernel",pid="7",process="engine"} 101.0',
        'sitsprobe_cuda_calls_total{function="cudaMemcpyAsync",pid="7",process="engine"} 3.0',
        'sitsprobe_cuda_call_errors_total{function="cudaMemcpy",pid="7",process="engine"} 1.0',
        'sitsprobe_cuda_memcpy_bytes_total{direction="host_to_device",pid="7",process="engine"} 5000.0',
        'sitsprobe_cuda_memcpy_bytes_total{direction="device_to_host",pid="7",process="engine"} 10.0',
        'sitsprobe_cuda_memcpy_seconds_total{pid="7",process="engine"} 1.5',
        'sitsprobe_cuda_sync_seconds_total{function="cudaDeviceSynchronize",pid="7",process="engine"} 2.0',
        'sitsprobe_cuda_alloc_bytes_total{pid="7",process="engine"} 1.048576e+06',
        'sitsprobe_cuda_free_bytes_total{pid="7",process="engine"} 524288.0',
        'sitsprobe_cuda_probe_drops_total{reason="inflight_lost"} 2.0',
    ):
        assert line in text, line
    assert 'sitsprobe_cuda_call_errors_total{function="cudaLaunchKernel"' not in text
