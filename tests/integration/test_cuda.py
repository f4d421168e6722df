"""CUDA uprobes on the real libcudart.so.12 (nvidia-cuda-runtime-cu12): a
process calls the API a known, odd number of times through ctypes (without a
GPU every call fails, and the probes fire all the same) and the in-kernel
counts must equal them exactly."""
from __future__ import annotations

import json
import time
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sitsprobe import kheaders, tracefs
from tests.integration.conftest import made_as_keys_come, require_root

pytestmark = pytest.mark.integration

CHILD = r'''
import ctypes as ct, json, sys

class dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]

lib = None
buf = ct.create_string_buffer(4096)
ptr = ct.c_void_p()
CALLS = {
    "cudaMalloc": lambda: lib.cudaMalloc(ct.byref(ptr), ct.c_size_t(1 << 20)),
    "cudaFree": lambda: lib.cudaFree(ct.c_void_p(0)),
    "cudaLaunchKernel": lambda: lib.cudaLaunchKernel(ct.c_void_p(0), dim3(1, 1, 1), dim3(1, 1, 1),
                                                     ct.c_void_p(0), ct.c_size_t(0), ct.c_void_p(0)),
    "cudaMemcpy": lambda: lib.cudaMemcpy(buf, buf, ct.c_size_t(100), 1),  # host to device
    "cudaMemcpyAsync": lambda: lib.cudaMemcpyAsync(buf, buf, ct.c_size_t(64), 2, ct.c_void_p(0)),
    "cudaDeviceSynchronize": lambda: lib.cudaDeviceSynchronize(),
    "cudaStreamSynchronize": lambda: lib.cudaStreamSynchronize(ct.c_void_p(0)),
    "cudaGraphLaunch": lambda: lib.cudaGraphLaunch(ct.c_void_p(0), ct.c_void_p(0)),
    "cuLaunchKernel": lambda: lib.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None),
    "cuLaunchKernelEx": lambda: lib.cuLaunchKernelEx(None, None, None, None),
}
print("ready", flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if "load" in cmd:
        lib = ct.CDLL(cmd["load"])
        print("{}", flush=True)
        continue
    print(json.dumps({name: [CALLS[name]() for _ in range(n)] for name, n in cmd.items()}), flush=True)
'''

DRIVER_SRC = r'''
typedef int CUresult;
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void *stream, void **params, void **extra)
{ return 0; }
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                             void **extra) __attribute__((alias("cuLaunchKernel")));
CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) { return 0; }
'''

# odd, and different for each function, so a count landing on the wrong row shows
CALLS = {"cudaMalloc": 7, "cudaFree": 5, "cudaLaunchKernel": 13, "cudaMemcpy": 11,
         "cudaMemcpyAsync": 9, "cudaDeviceSynchronize": 3, "cudaStreamSynchronize": 15,
         "cudaGraphLaunch": 1}


def libcudart() -> Path:
    try:
        import nvidia.cuda_runtime
    except ImportError:
        pytest.skip("nvidia-cuda-runtime-cu12 is not installed (pip install -e '.[test]')")
    path = Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib" / "libcudart.so.12"
    if not path.exists():
        pytest.skip(f"{path} is missing from nvidia-cuda-runtime-cu12")
    return path


class Child:
    """A process calling the CUDA API through ctypes, on command."""

    def __init__(self, tmp: Path, lib: Path | None = None):
        script = tmp / "cuda_child.py"
        script.write_text(CHILD)
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        assert self.proc.stdout.readline().strip() == "ready"
        if lib is not None:
            self.load(lib)

    def _ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def load(self, lib: Path) -> None:
        self._ask({"load": str(lib)})

    def call(self, calls: dict[str, int]) -> dict[str, list[int]]:
        """Make the calls; their return codes."""
        return self._ask(calls)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def probe():
    require_root()
    tracefs.ensure_mounted()
    kheaders.install(kheaders.resolve())
    from sitsprobe.probes.cuda import CudaProbe, cflags

    p = CudaProbe(cflags(max_keys=4096, max_allocs=1024))
    yield p
    p.close()


@pytest.fixture
def children(tmp_path):
    made = []

    def make(lib: Path | None = None) -> Child:
        made.append(Child(tmp_path, lib))
        return made[-1]

    yield make
    for c in made:
        c.stop()


def by_function(probe, pid: int) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for c in probe.counts():
        if c.pid == pid:
            row = out.setdefault(c.function, {"calls": 0, "errors": 0, "bytes": 0, "ns": 0})
            for k in row:
                row[k] += getattr(c, k)
    return out


def test_counts_equal_the_calls_made(probe, children):
    lib = libcudart()
    child = children(lib)
    probe.attach_pids([child.pid])
    assert str(lib) in {a.library.path for a in probe.attached.values()}
    rcs = child.call(CALLS)
    counts = by_function(probe, child.pid)
    assert {f: row["calls"] for f, row in counts.items()} == CALLS
    for f in ("cudaMalloc", "cudaFree", "cudaMemcpy", "cudaDeviceSynchronize", "cudaStreamSynchronize"):
        assert counts[f]["errors"] == sum(rc != 0 for rc in rcs[f]), f  # timed: failures counted
        assert counts[f]["ns"] > 0, f
    assert counts["cudaLaunchKernel"]["errors"] == 0  # launches have no return probe
    directions = {(c.function, c.direction): c.bytes for c in probe.counts()
                  if c.pid == child.pid and c.direction}
    assert directions == {("cudaMemcpy", "host_to_device"): 11 * 100,
                          ("cudaMemcpyAsync", "device_to_host"): 9 * 64}
    assert probe.counters() == {"stats_full": 0, "inflight_lost": 0, "allocs_full": 0, "waits_lost": 0}


def test_counts_are_made_as_keys_come(probe):
    """Preallocated, each of the per-CPU table's entries would be made once
    per possible CPU at the start (MAX_CUDA_KEYS x 32 bytes x CPUs)."""
    assert made_as_keys_come(probe._bpf[b"cuda_stats"])


def test_each_wait_on_the_device_is_timed_for_the_requests_open_meanwhile(probe, children):
    child = children(libcudart())
    probe.attach_pids([child.pid])
    before = time.monotonic_ns()
    child.call({"cudaMemcpy": 4, "cudaDeviceSynchronize": 3, "cudaStreamSynchronize": 2,
                "cudaLaunchKernel": 5, "cudaMalloc": 2})
    after = time.monotonic_ns()
    waits = probe.waits(child.pid, before, after)
    assert len(waits) == 4 + 3 + 2  # the blocking copies and syncs; launches and allocations are not waits
    assert all(before <= s <= e <= after for s, e in waits)
    assert probe.waits(child.pid, after, after + 10**9) == []  # none after they were made
    (s, e) = sorted(waits)[0]
    assert probe.waits(child.pid, s + 1, s + 2) == [(s + 1, s + 2)]  # clipped to the request asking


def test_a_process_is_counted_once_attach_pids_names_it(probe, children):
    lib = libcudart()
    first = children(lib)
    probe.attach_pids([first.pid])
    later = children(lib)  # started after attach_pids
    later.call({"cudaLaunchKernel": 5})
    assert by_function(probe, later.pid) == {}  # not followed: the kernel filters it out
    assert probe.attach_pids([first.pid, later.pid]) == []  # same file: nothing new to attach
    later.call({"cudaLaunchKernel": 21, "cudaDeviceSynchronize": 3})
    assert {f: r["calls"] for f, r in by_function(probe, later.pid).items()} == {
        "cudaLaunchKernel": 21, "cudaDeviceSynchronize": 3}


def test_a_library_loaded_later_is_attached_once(probe, children, tmp_path):
    copy = tmp_path / "vendored" / "libcudart.so.12"  # another file: probed on its own
    copy.parent.mkdir()
    shutil.copy(libcudart(), copy)
    child = children()  # no CUDA library yet
    assert probe.attach_pids([child.pid]) == []
    child.load(copy)
    new = probe.attach_pids([child.pid])
    assert [a.library.path for a in new] == [str(copy)]
    assert "cudaLaunchKernel" in new[0].functions and new[0].missing == []
    assert probe.attach_pids([child.pid]) == []  # again: nothing new, nothing doubled
    child.call({"cudaLaunchKernel": 17, "cudaMemcpy": 3})
    assert {f: r["calls"] for f, r in by_function(probe, child.pid).items()} == {
        "cudaLaunchKernel": 17, "cudaMemcpy": 3}


def test_driver_api_launches(probe, children, tmp_path):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build a stand-in libcuda.so.1")
    src, lib = tmp_path / "fake_cuda.c", tmp_path / "libcuda.so.1"
    src.write_text(DRIVER_SRC)
    subprocess.run([gcc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], check=True)
    child = children(lib)
    attached = probe.attach_pids([child.pid])
    assert [(a.library.kind, a.functions) for a in attached] == [
        ("libcuda", ["cuLaunchKernel", "cuLaunchKernelEx"])]  # the _ptsz alias probed once
    child.call({"cuLaunchKernel": 19, "cuLaunchKernelEx": 7})
    assert {f: r["calls"] for f, r in by_function(probe, child.pid).items()} == {
        "cuLaunchKernel": 19, "cuLaunchKernelEx": 7}


def test_forget_drops_a_process_and_gives_its_final_counts(probe, children):
    child = children(libcudart())
    probe.attach_pids([child.pid])
    child.call({"cudaLaunchKernel": 13, "cudaMalloc": 7})
    assert by_function(probe, child.pid)
    final = probe.forget(child.pid)  # what the agent folds into the name's totals
    assert {c.function: c.calls for c in final} == {"cudaLaunchKernel": 13, "cudaMalloc": 7}
    assert by_function(probe, child.pid) == {}
    child.call({"cudaLaunchKernel": 3})
    assert by_function(probe, child.pid) == {}  # no longer followed


def test_only_the_functions_asked_for(probe, children):  # probe: set up bcc, then a second one
    from sitsprobe.probes.cuda import CudaProbe

    with pytest.raises(ValueError, match="cudaLaunchKernle"):
        CudaProbe(functions=["cudaLaunchKernle"])
    p = CudaProbe(functions=["cudaMemcpy", "cudaDeviceSynchronize"])
    try:
        child = children(libcudart())
        attached = p.attach_pids([child.pid])
        assert [a.functions for a in attached] == [["cudaDeviceSynchronize", "cudaMemcpy",
                                                    "cudaMemcpy_ptds"]]
        child.call({"cudaLaunchKernel": 3, "cudaMemcpy": 5, "cudaDeviceSynchronize": 1})
        assert {c.function: c.calls for c in p.counts() if c.pid == child.pid} == {
            "cudaMemcpy": 5, "cudaDeviceSynchronize": 1}
    finally:
        p.close()


def test_calls_made_just_before_a_process_exits_are_in_metrics(tmp_path, children):
    """The real agent (only NVML recorded): a process makes 13 launches and 7
    mallocs, exits a second later, and at the next scrape they are there,
    under its name with pid "", and its pid's own series are gone."""
    import threading
    import urllib.request

    from sitsprobe import config
    from sitsprobe.agent import Agent
    from sitsprobe.gpu.recorded import RecordedBackend, RecordedGpu

    from .conftest import free_port, wait_until

    require_root()
    child = children(libcudart())
    port = free_port()
    agent = Agent(config.load(overrides={
        "select.pids": [child.pid], "metrics.port": port, "metrics.address": "127.0.0.1",
        "gpu.interval_ms": 100, "engine.markers": False}),
        gpu_backend=RecordedBackend([RecordedGpu(rates=(50.0, 10.0), compute_pids=[child.pid],
                                                 processes=[(child.pid, 0, 50.0, 5.0)])]))
    stop = threading.Event()
    agent.start()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()

    def calls(**labels) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            page = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                   if line.startswith("sitsprobe_cuda_calls_total{")
                   and all(f'{k}="{v}"' in line for k, v in labels.items()))

    try:
        def attached():
            child.call({"cudaDeviceSynchronize": 1})
            return calls(pid=child.pid, function="cudaDeviceSynchronize") > 0

        wait_until(attached, 30, "the agent's CUDA probes on the child")
        child.call({"cudaLaunchKernel": 13, "cudaMalloc": 7})
        time.sleep(1)
        pid = child.pid
        child.stop()
        wait_until(lambda: pid not in agent.tracked, 10, "the agent to retire the child")
        assert calls(pid="", function="cudaLaunchKernel") == 13
        assert calls(pid="", function="cudaMalloc") == 7
        assert calls(pid=pid) == 0  # its own series went with it
    finally:
        stop.set()
        thread.join(10)
        agent.close()


def test_a_program_the_kernel_refused_for_the_moment_is_loaded_on_a_retry(probe, children, tmp_path,
                                                                          monkeypatch):
    """The uprobes' programs are loaded by the probe itself before bcc's
    attach (which would load them with no second try): the first load,
    refused for the moment (EAGAIN, as bcc words it), is tried again, and no
    function goes unprobed for it."""
    import errno
    import os

    from sitsprobe.probes import apart, retry

    monkeypatch.setattr(retry, "SOON_S", (0.01,))
    real, refused = apart._load_func, []

    def load(bpf, name, *rest):
        if not refused:
            refused.append(name)
            raise Exception(f"Failed to load BPF program {name!r}: {os.strerror(errno.EAGAIN)}")
        return real(bpf, name, *rest)
    monkeypatch.setattr(apart, "_load_func", load)
    copy = tmp_path / "retried" / "libcudart.so.12"
    copy.parent.mkdir()
    shutil.copy(libcudart(), copy)
    child = children(copy)
    new = probe.attach_pids([child.pid])
    assert refused and [a.library.path for a in new] == [str(copy)]
    assert "cudaLaunchKernel" in new[0].functions and new[0].missing == []
    child.call({"cudaLaunchKernel": 5, "cudaMemcpy": 7})
    assert {f: r["calls"] for f, r in by_function(probe, child.pid).items()} == {
        "cudaLaunchKernel": 5, "cudaMemcpy": 7}
