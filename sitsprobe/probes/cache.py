"""Loads bpf/cache.c: uprobes on cache look-up functions -> KeyLookup events.

Each CacheProbeSpec takes a slot of the program: its settings go into the
`cache_cfgs` map, cache_enter_<slot>/cache_return_<slot> go on its symbol in
every binary it names (pid -1: every process running that file, including
ones started later: uprobes belong to the file, not to a process).

Clients: the kernel remembers (tgid, fd) -> peer for connections a cache
process accepts; a process is known as one by its comm at exec, by
``rescan`` (processes running a probed file), or by its first look-up.
Connections made before that are seeded from /proc (procs.established).
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import shutil
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .. import procs
from ..abi import (CACHE_COUNTERS as COUNTERS, CACHE_HIT_OPS as HIT_OPS, CACHE_KEY_KINDS as KEY_KINDS,
                   CACHE_LAT_SLOTS as LAT_SLOTS, CE_PEER, CE_TRUNCATED)
from ..cache.lookup import UNIX_PEER, KernelCacheCounts, KeyLookup
from ..cache.spec import MAX_CACHES, CacheProbeSpec
from ..errors import ProbeAttachError
from ..request import Endpoint
from . import apart, side_by_side
from .compiler import compile_module
from .hooks import TRACEPOINT, UPROBE, Hook
from .maps import discard
from .net import bpf_dir, source_flags
from .ring import DrainBudget, RingReader, wake_bytes

log = logging.getLogger("sitsprobe.cache")

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10

# What the client attribution hooks (always tracepoints; uprobes per spec).
CLIENT_HOOKS = [Hook(TRACEPOINT, f"syscalls:{n}") for n in (
    "sys_enter_read", "sys_enter_recvfrom", "sys_enter_accept", "sys_exit_accept",
    "sys_enter_accept4", "sys_exit_accept4", "sys_enter_close")] + [
    Hook(TRACEPOINT, "sched:sched_process_exec"), Hook(TRACEPOINT, "sched:sched_process_exit")]


def _pow2(v: int) -> bool:
    return v >= 1 and not v & (v - 1)


def cflags(*, key_bytes: int = 64, ring_buffer_mib: int = 4, max_peers: int = 65536,
           cpus: int | None = None) -> list[str]:
    """Load-time settings as -D constants (bpf/sitsprobe.h, cache block);
    wakeups as ring.wake_bytes sizes them."""
    if key_bytes not in (16, 32, 64, 128, 256):
        raise ValueError("key_bytes must be 16, 32, 64, 128 or 256")
    if not _pow2(ring_buffer_mib):
        raise ValueError("ring_buffer_mib must be a power of two")
    return [*source_flags(), f"-DCACHE_KEY_CAP={key_bytes}",
            f"-DCACHE_RING_PAGES={ring_buffer_mib * 256}", f"-DCACHE_MAX_PEERS={max_peers}",
            f"-DCACHE_WAKE_BYTES={wake_bytes(ring_buffer_mib << 20, cpus)}"]


@dataclass(frozen=True, slots=True)
class Attachment:
    spec: str  # the cache's name
    slot: int
    path: str  # the file the uprobes are on
    symbol: str
    pid: int

    @property
    def hook(self) -> Hook:
        return Hook(UPROBE, f"{self.path}:{self.symbol}")


def resolve_binary(binary: str, which: Callable[[str], str | None] = shutil.which) -> str:
    """A path as given, a program on $PATH as its path, else a library name
    that bcc resolves (``c`` -> libc.so.6)."""
    if "/" in binary:
        return binary
    return which(binary) or binary


def comms_for(path: str) -> set[str]:
    """The comms a process running path gets at exec (through a link, or not);
    none for a library name bcc resolves ("c")."""
    if not os.path.isfile(path):
        return set()
    names = {os.path.basename(path)[:15], os.path.basename(os.path.realpath(path))[:15]}
    return {n for n in names if n}


def _endpoint(family: int, raw: bytes, port: int) -> Endpoint | None:
    if family == AF_INET:
        return Endpoint(socket.inet_ntop(socket.AF_INET, raw[:4]), port)
    if family == AF_INET6:
        if raw[:12] == b"\0" * 10 + b"\xff\xff":
            return Endpoint(socket.inet_ntop(socket.AF_INET, raw[12:16]), port)
        return Endpoint(socket.inet_ntop(socket.AF_INET6, raw[:16]), port)
    if family == AF_UNIX:
        return Endpoint(UNIX_PEER, 0)
    return None


class CacheProbe(RingReader):
    """The loaded cache program and its maps. Only this class touches them.

    The agent waits on its ring with the others' and calls ``consume`` in
    its loop, ``rescan`` every rescan interval, and reads ``kernel_counts``
    at scrape time (CacheStats(kernel=probe.kernel_counts)).
    """

    RINGS = ("cache_events",)

    def __init__(self, specs: Iterable[CacheProbeSpec], on_lookup: Callable[[KeyLookup], None],
                 flags: list[str] | None = None, proc: str = "/proc"):
        self.specs = tuple(specs)
        if len(self.specs) > MAX_CACHES:
            raise ValueError(f"at most {MAX_CACHES} cache probes per program")
        self._proc = proc
        self._bpf = compile_module(str(bpf_dir() / "cache.c"), flags or cflags())
        self._cfgs = self._bpf[b"cache_cfgs"]
        self._peers = self._bpf[b"cache_peers"]
        self._procs = self._bpf[b"cache_procs"]
        self._comms = self._bpf[b"cache_comms"]
        self._events = self._bpf[b"cache_events"]
        self.attachments: list[Attachment] = []
        self.pending: dict[int, str] = {}  # slot -> why it is not attached yet
        self._known: set[int] = set()  # tgids adopted (seeded from /proc)
        self._files: set[tuple[int, int]] = set()  # (st_dev, st_ino) of probed executables
        self._names = [s.name for s in self.specs]

        self._budget = DrainBudget()

        def event_cb(_ctx, data, _size):
            e = self._events.event(data)
            if e.tgid not in self._known:
                self._adopt(e.tgid)
            on_lookup(self._decode(e))
            return self._budget.take()

        try:
            for slot, spec in enumerate(self.specs):
                self._configure(slot, spec)
            for slot, spec in enumerate(self.specs):
                self._attach(slot, spec)
            self._events.open_ring_buffer(event_cb)
            self.rescan()
        except BaseException:
            side_by_side.close(self._bpf)  # detach what did attach: never leave probes behind
            raise

    # -- setting up -------------------------------------------------------------

    def _configure(self, slot: int, spec: CacheProbeSpec) -> None:
        c = self._cfgs.Leaf()
        c.key_kind = KEY_KINDS[spec.key.read]
        c.key_arg = spec.key.arg
        c.len_arg = spec.key.length_arg or 0
        c.hit_src = 0 if spec.hit.arg is None else spec.hit.arg + 1
        c.hit_deref = spec.hit.deref
        c.hit_op = HIT_OPS[spec.hit.op]
        c.hit_value = spec.hit.value
        if spec.only_if is not None:
            c.filter_on, c.filter_arg = 1, spec.only_if.arg
            c.filter_mask, c.filter_equals = spec.only_if.mask, spec.only_if.equals
        self._cfgs[ct.c_int(slot)] = c
        if spec.process is not None:
            for comm in spec.process.comms:
                self._learn_comm(comm)

    def _learn_comm(self, comm: str) -> None:
        k = self._comms.Key()
        k.comm = comm.encode()[:15]
        self._comms[k] = ct.c_ubyte(1)

    def _paths(self, spec: CacheProbeSpec) -> list[str]:
        if spec.binary is not None:
            return [resolve_binary(spec.binary)]
        found = procs.select(spec.process, self._proc)
        paths = set()
        for pid in found:
            try:
                paths.add(os.path.realpath(f"{self._proc}/{pid}/exe", strict=True))
            except OSError:
                continue  # gone, or a kernel thread
        return sorted(paths)

    def _attach(self, slot: int, spec: CacheProbeSpec) -> None:
        from bcc import BPF  # the probes layer is the only one that imports bcc

        paths = self._paths(spec)
        if not paths:
            self.pending[slot] = "no running process matches its process selector yet"
            return
        done = {(a.path, a.pid) for a in self.attachments if a.slot == slot}
        for path in paths:
            if (path, spec.pid) in done:
                continue
            try:
                enter, leave = f"cache_enter_{slot}".encode(), f"cache_return_{slot}".encode()
                for fn in (enter, leave):  # loaded here, not inside bcc's attach: a refusal is tried again
                    apart.load_func(self._bpf, fn, BPF.KPROBE, {})
                self._bpf.attach_uprobe(name=path.encode(), sym=spec.symbol.encode(), fn_name=enter, pid=spec.pid)
                self._bpf.attach_uretprobe(name=path.encode(), sym=spec.symbol.encode(), fn_name=leave,
                                           pid=spec.pid)
            except Exception as e:  # bcc raises plain Exception with its reason
                raise ProbeAttachError(f"cache {spec.name}", f"{path}:{spec.symbol}",
                                       f"{e}; check the path and that the symbol is exported "
                                       f"(nm -D {path} | grep {spec.symbol})") from None
            self.attachments.append(Attachment(spec.name, slot, path, spec.symbol, spec.pid))
            for comm in comms_for(path):
                self._learn_comm(comm)
            try:
                st = os.stat(path)
                self._files.add((st.st_dev, st.st_ino))
            except OSError:
                pass  # a library name bcc resolved: its processes are met at their first look-up
            log.info("cache %s: uprobe on %s:%s (pid %d)", spec.name, path, spec.symbol, spec.pid)
        self.pending.pop(slot, None)

    def hooks(self) -> dict[str, str]:
        """What each cache probe is attached to, for `doctor` and the log."""
        out = {f"cache {a.spec}": str(a.hook) + ("" if a.pid == -1 else f" pid {a.pid}")
               for a in self.attachments}
        out.update({f"cache {self.specs[s].name}": f"pending: {why}" for s, why in self.pending.items()})
        out["cache clients"] = ", ".join(h.target for h in CLIENT_HOOKS)
        return out

    # -- processes and their clients ---------------------------------------------

    def _adopt(self, tgid: int) -> None:
        """A cache process: follow its accepts, and seed the connections it has."""
        self._known.add(tgid)
        self._procs[ct.c_uint(tgid)] = ct.c_ubyte(1)
        listening = procs.listening_ports(tgid, self._proc)
        for fd, local, peer in procs.established(tgid, self._proc):
            if local.port in listening:
                self.seed(tgid, fd, peer)

    def seed(self, tgid: int, fd: int, peer: Endpoint) -> None:
        """Name the client of a connection accepted before the process was known."""
        key = self._peers.Key((tgid << 32) | fd)
        if key in self._peers:
            return
        p = self._peers.Leaf()
        family = socket.AF_INET6 if ":" in peer.address else socket.AF_INET
        raw = socket.inet_pton(family, peer.address)
        ct.memmove(p.addr, raw, len(raw))
        p.family = AF_INET6 if family == socket.AF_INET6 else AF_INET
        p.port = peer.port
        try:
            self._peers[key] = p
        except Exception:  # map full: LRU, so only on a race; the look-up stays unattributed
            pass

    def _runs_probed_file(self, pid: int) -> bool:
        try:
            st = os.stat(f"{self._proc}/{pid}/exe")
        except OSError:
            return False
        return (st.st_dev, st.st_ino) in self._files

    def rescan(self) -> None:
        """Attach pending specs, adopt processes running a probed file, forget dead ones."""
        for slot in list(self.pending):
            try:
                self._attach(slot, self.specs[slot])
            except ProbeAttachError as e:  # a process the selector found lacks the symbol
                if self.pending.get(slot) != str(e):
                    log.warning("%s", e)
                self.pending[slot] = str(e)
        try:
            pids = [int(n) for n in os.listdir(self._proc) if n.isdigit()]
        except OSError:
            pids = []
        for pid in pids:
            if pid not in self._known and self._runs_probed_file(pid):
                self._adopt(pid)
        gone = {t for t in self._known if not os.path.exists(f"{self._proc}/{t}")}
        if gone:
            self.forget(gone)

    def forget(self, tgids: set[int]) -> None:
        self._known -= tgids
        for t in tgids:
            discard(self._procs, ct.c_uint(t))
        for key in [k for k in self._peers.keys() if (k.value >> 32) in tgids]:
            discard(self._peers, key)

    # -- events and counts --------------------------------------------------------

    def _decode(self, e) -> KeyLookup:
        n = min(e.key_len, ct.sizeof(e.key))
        peer = None
        if e.flags & CE_PEER:
            peer = _endpoint(e.family, ct.string_at(ct.addressof(e.addr), 16), e.port)
        return KeyLookup(
            cache=self._names[e.slot] if e.slot < len(self._names) else str(e.slot),
            ts_ns=e.ts_ns, hit=bool(e.hit),
            key=ct.string_at(ct.addressof(e.key), n),
            truncated=bool(e.flags & CE_TRUNCATED) or e.key_size > n,
            duration_ns=e.duration_ns, tgid=e.tgid, tid=e.tid, fd=e.fd, peer=peer)

    def kernel_counts(self) -> dict[str, KernelCacheCounts]:
        """Per cache: the kernel's exact counts and log2 latency histogram."""
        counts = self._bpf[b"cache_counts"]
        latency = self._bpf[b"cache_latency"]
        out = {}
        for slot, spec in enumerate(self.specs):
            c = {name: sum(counts[ct.c_int(slot * len(COUNTERS) + i)])
                 for i, name in enumerate(COUNTERS)}
            lat = tuple(sum(latency[ct.c_int(slot * LAT_SLOTS + s)]) for s in range(LAT_SLOTS))
            out[spec.name] = KernelCacheCounts(latency=lat, **c)
        return out

    def close(self) -> None:
        side_by_side.close(self._bpf)
