"""Loads bpf/cuda.c: uprobes on the CUDA runtime and driver API of the
processes it is given, counted in the kernel (see sitsprobe.gpu.cuda)."""
from __future__ import annotations

import ctypes as ct
import logging
import os
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..abi import CUDA_COUNTERS as COUNTERS
from ..errors import ProbeAttachError
from ..gpu.cuda import DIRECTIONS, FUNCTIONS, CudaCount
from . import apart, side_by_side
from .compiler import compile_module
from .libs import MappedLibrary, mapped_libraries
from .maps import discard
from .net import bpf_dir, source_flags

log = logging.getLogger("sitsprobe.cuda")

RUNTIME, DRIVER = "libcudart", "libcuda"
_LIBRARY = {  # file name -> library kind (auditwheel may add a -hash)
    RUNTIME: re.compile(r"^libcudart(-[0-9a-f]{8})?\.so(\.\d+)*$"),
    DRIVER: re.compile(r"^libcuda\.so(\.\d+)*$"),
}
# symbol -> (entry program, return program or None); the per-thread-stream
# variants (_ptsz/_ptds, nvcc --default-stream per-thread) count as the plain name
_SYMBOLS = {
    RUNTIME: {
        "cudaLaunchKernel": ("cuda_launch_kernel", None),
        "cudaMemcpy": ("cuda_memcpy", "cuda_memcpy_ret"),
        "cudaMemcpyAsync": ("cuda_memcpy_async", None),
        "cudaStreamSynchronize": ("cuda_stream_sync", "cuda_stream_sync_ret"),
        "cudaDeviceSynchronize": ("cuda_device_sync", "cuda_device_sync_ret"),
        "cudaMalloc": ("cuda_malloc", "cuda_malloc_ret"),
        "cudaFree": ("cuda_free", "cuda_free_ret"),
        "cudaGraphLaunch": ("cuda_graph_launch", None),
    },
    DRIVER: {
        "cuLaunchKernel": ("cuda_cu_launch_kernel", None),
        "cuLaunchKernelEx": ("cuda_cu_launch_kernel_ex", None),
    },
}
_VARIANT = re.compile(r"^(\w+?)(_ptsz|_ptds)?$")
WAITS_KEPT = 4096  # device waits remembered per process, the newest: for the requests still open


@dataclass(slots=True)
class Attachment:
    library: MappedLibrary
    via: str  # the path the probes were attached through
    functions: list[str] = field(default_factory=list)  # symbols probed
    missing: list[str] = field(default_factory=list)  # not exported by this build


def cflags(*, max_keys: int = 16384, max_allocs: int = 65536) -> list[str]:
    """Load-time settings as -D constants: (pid, function, direction) rows kept,
    and live allocations remembered to size cudaFree."""
    return [f"-DMAX_CUDA_KEYS={max_keys}", f"-DMAX_CUDA_ALLOCS={max_allocs}"]


def cuda_libraries(pid: int, proc: str = "/proc") -> list[MappedLibrary]:
    """The CUDA runtime/driver libraries mapped by pid (empty if it is gone)."""
    return mapped_libraries(pid, _LIBRARY, "/libcuda", proc)


def probe_points(kind: str, exported: Iterable[tuple[str, int]],
                 functions: Iterable[str] | None = None) -> list[tuple[str, str, str | None]]:
    """(symbol, entry program, return program) for each wanted symbol the
    library exports, one per address (aliases are probed once)."""
    wanted = {f: p for f, p in _SYMBOLS[kind].items() if functions is None or f in functions}
    seen, points = set(), []
    for sym, addr in sorted(exported):
        m = _VARIANT.match(sym)
        progs = wanted.get(m.group(1)) if m else None
        if progs is None or addr in seen:
            continue
        seen.add(addr)
        points.append((sym, *progs))
    return points


class CudaProbe:
    """The loaded CUDA program: attach to processes, read the counts."""

    def __init__(self, flags: Iterable[str] = (), proc: str = "/proc",
                 functions: Iterable[str] | None = None):
        """flags: cflags(...); functions: the API functions to probe
        (sitsprobe.gpu.cuda.FUNCTIONS names), all by default: leave launches
        out where they run hotter than the uprobe cost allows."""
        from bcc import BPF  # the probes layer is the only one that imports bcc

        self._BPF = BPF
        self._proc = proc
        self._functions = None if functions is None else frozenset(functions)
        unknown = (self._functions or frozenset()) - set(FUNCTIONS)
        if unknown:
            raise ValueError(f"unknown CUDA functions {sorted(unknown)}; expected some of {FUNCTIONS}")
        self._bpf = compile_module(str(bpf_dir() / "cuda.c"), [*source_flags(), *flags])
        self._pids = self._bpf[b"cuda_pids"]
        self._stats = self._bpf[b"cuda_stats"]
        self._waits: dict[int, deque[tuple[int, int]]] = {}  # pid -> (start, end) of device waits
        ring = self._bpf[b"cuda_waits"]

        def on_wait(_ctx, data, _size):
            w = ring.event(data)
            kept = self._waits.get(w.tgid)
            if kept is None:
                kept = self._waits[w.tgid] = deque(maxlen=WAITS_KEPT)
            kept.append((w.start_ns, w.end_ns))

        ring.open_ring_buffer(on_wait)
        self.attached: dict[tuple[str, int], Attachment] = {}
        self.failed: dict[tuple[str, int], str] = {}  # library -> why it could not be probed

    def attach_pids(self, pids: Iterable[int]) -> list[Attachment]:
        """Follow these processes; probe CUDA libraries not probed before.
        Call again whenever: a library a process loaded since is found then."""
        new = []
        for pid in pids:
            libs = cuda_libraries(pid, self._proc)
            if not libs:
                continue
            self._pids[ct.c_uint(pid)] = ct.c_ubyte(1)
            for lib in libs:
                if lib.key in self.attached or lib.key in self.failed or not self._wanted(lib.kind):
                    continue
                try:
                    new.append(self._attach(lib, pid))
                except ProbeAttachError as e:
                    self.failed[lib.key] = str(e)
                    log.warning("%s", e)
        return new

    def _attach(self, lib: MappedLibrary, pid: int) -> Attachment:
        via = f"{self._proc}/{pid}/root{lib.path}"  # the file in the process's mount namespace
        if not os.path.exists(via):
            raise ProbeAttachError("cuda", lib.path, f"{via} is gone (pid {pid} exited?)")
        try:
            exported = [(s.decode(), a) for s, a in self._BPF.get_user_functions_and_addresses(
                via.encode(), rb"^cu(da)?[A-Z]\w*$")]
        except Exception as e:
            raise ProbeAttachError("cuda", lib.path, f"cannot read its symbols: {e}") from e
        a = Attachment(lib, via)
        for sym, entry, ret in probe_points(lib.kind, exported, self._functions):
            try:
                for fn in (entry, ret) if ret else (entry,):  # loaded here, not inside bcc's attach:
                    apart.load_func(self._bpf, fn.encode(), self._BPF.KPROBE, {})  # a refusal is tried again
                self._bpf.attach_uprobe(name=via.encode(), sym=sym.encode(), fn_name=entry.encode())
                if ret:
                    self._bpf.attach_uretprobe(name=via.encode(), sym=sym.encode(),
                                               fn_name=ret.encode())
            except Exception as e:  # the others may still attach
                log.warning("%s", ProbeAttachError("cuda", f"{lib.path}:{sym}", str(e)))
                continue
            a.functions.append(sym)
        names = {_VARIANT.match(s).group(1) for s in a.functions}
        wanted = self._wanted(lib.kind)
        a.missing = sorted(set(wanted) - names)
        if not a.functions:
            raise ProbeAttachError("cuda", lib.path, "none of " + ", ".join(wanted) + " could be probed")
        self.attached[lib.key] = a
        log.info("cuda probes on %s: %d functions%s", lib.path, len(a.functions),
                 f" (missing {', '.join(a.missing)})" if a.missing else "")
        return a

    def _wanted(self, kind: str) -> list[str]:
        return [f for f in _SYMBOLS[kind] if self._functions is None or f in self._functions]

    def waits(self, pid: int, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        """pid's waits on the device (blocking copies, synchronisations) that
        overlap [start_ns, end_ns], clipped to it; the ring drained first."""
        self._bpf.ring_buffer_consume()
        out = []
        for s, e in reversed(self._waits.get(pid, ())):  # newest first, in the ring's order
            if e <= start_ns:
                break
            if s < end_ns:
                out.append((max(s, start_ns), min(e, end_ns)))
        return out

    def forget(self, pid: int) -> list[CudaCount]:
        """Stop following pid and drop its counts (it exited); its final counts."""
        self._waits.pop(pid, None)
        final = [c for c in self.counts() if c.pid == pid]
        discard(self._pids, ct.c_uint(pid))
        for key in [k for k in self._stats.keys() if k.tgid == pid]:
            discard(self._stats, key)
        allocs = self._bpf[b"cuda_allocs"]
        for key in [k for k in allocs.keys() if k.tgid == pid]:
            discard(allocs, key)  # the kernel takes an allocation out when it is freed
        return final

    def counts(self) -> list[CudaCount]:
        """The kernel's running totals, one row per (pid, function, direction)."""
        out = []
        for k, per_cpu in self._stats.items():
            fn = FUNCTIONS[k.fn] if k.fn < len(FUNCTIONS) else f"fn{k.fn}"
            out.append(CudaCount(
                pid=k.tgid, function=fn,
                direction=DIRECTIONS[min(k.kind, 5)] if fn in ("cudaMemcpy", "cudaMemcpyAsync") else "",
                calls=sum(v.calls for v in per_cpu), errors=sum(v.errors for v in per_cpu),
                bytes=sum(v.bytes for v in per_cpu), ns=sum(v.ns for v in per_cpu)))
        return out

    def counters(self) -> dict[str, int]:
        table = self._bpf[b"cuda_counters"]
        return {name: sum(table[ct.c_int(i)]) for i, name in enumerate(COUNTERS)}

    def close(self) -> None:
        side_by_side.close(self._bpf)
