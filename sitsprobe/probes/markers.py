"""Loads bpf/markers.c: calls of libsitsprobe_markers -> MarkerEvents.

Hook: a uprobe on each exported function of the library, attached by path for
every process (pid -1), so engines started after the agent are seen too. The
function's first instruction is the USDT probe's nop, so this costs what bcc's
USDT attach costs (the same instruction; measured alike, bench/bench_markers.py),
and, unlike USDT, whose generated argument readers are compiled per library,
one compiled program serves any number of libraries (builds in different cache
folders, containers), attached as they are found.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from ..abi import (MARKER_COUNTERS as COUNTERS, MARKER_IDS,
                   MARKER_KINDS as KINDS, MK_BATCH)
from ..errors import ProbeAttachError
from ..markers._native import FUNCTIONS
from ..events import MarkerEvent
from . import apart, side_by_side
from .compiler import compile_module
from .libs import mapped_libraries
from .net import bpf_dir, source_flags
from .ring import DrainBudget, RingReader, wake_bytes

# exported function -> BPF function in bpf/markers.c
HOOKS = {sym: f"on_{sym.removeprefix('sitsprobe_')}" for sym in FUNCTIONS}  # symbol -> program
_LIBRARY = {"markers": re.compile(r"libsitsprobe_markers[^/]*\.so$")}  # by file name


def find_marker_libraries(proc: str = "/proc", pids: Iterable[int] | None = None) -> set[str]:
    """Every libsitsprobe_markers*.so mapped by a process (by the given pids
    only, when given), as a path this process can open: the path itself, or
    through /proc/<pid>/root when the process sees another file there
    (another mount namespace: a container). A replaced file (" (deleted)")
    is not ours to probe."""
    found = set()
    for pid in os.listdir(proc) if pids is None else map(str, pids):
        if not pid.isdigit():
            continue
        for lib in mapped_libraries(int(pid), _LIBRARY, "/libsitsprobe_markers", proc):
            found.add(_reachable(proc, pid, lib.path))
    found.discard("")
    return found


def _reachable(proc: str, pid: str, path: str) -> str:
    inside = f"{proc}/{pid}/root{path}"
    try:
        theirs = os.stat(inside)
    except OSError:
        return ""
    try:
        ours = os.stat(path)
    except OSError:
        return inside
    same = (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)
    return path if same else inside


def decode(e) -> MarkerEvent:
    """A non-batch `struct marker_event` (bcc's ctypes view) as a MarkerEvent.
    (ctypes hands a char array back as bytes cut at the first NUL.)"""
    kind = KINDS.get(e.kind) or f"unknown({e.kind})"
    head = (kind, e.ts, e.tgid, e.tid, e.request_id)
    if kind == "range":
        return MarkerEvent(*head, batch_id=e.batch_id, name=e.name.decode(errors="replace"),
                           begin_ns=e.begin_ts)
    if kind == "cache_get":
        key = bytes(e.key[: min(e.key_len, len(e.key))])
        return MarkerEvent(*head, name=e.name.decode(errors="replace"), hit=bool(e.hit),
                           key=key.decode(errors="backslashreplace"))
    if kind == "request_begin":
        return MarkerEvent(*head, fd=e.fd, name=e.name.decode(errors="replace"))
    if kind == "usage":
        return MarkerEvent(*head, input_tokens=e.input_tokens,
                           output_tokens=e.output_tokens, kv_bytes=e.kv_bytes)
    return MarkerEvent(*head)


class Batches:
    """Joins the events of one batch call (MARKER_IDS ids each) into one MarkerEvent.

    The events of one call come in order from one thread; a part lost to a full
    ring shows as a gap, and what arrived is reported when the thread moves on.
    """

    def __init__(self, max_ids: int):
        self.max_ids = max_ids
        self.pending: dict[int, _Open] = {}  # by thread id

    def add(self, e) -> list[MarkerEvent]:
        out = []
        held = self.pending.get(e.tid)
        if held is not None and (held.ts != e.ts or held.next != e.first):
            out.append(self.interrupt(e.tid))
            held = None
        if held is None:
            held = self.pending[e.tid] = _Open(e)
        held.ids.extend(e.ids[: min(e.n_ids, MARKER_IDS)])
        held.next = e.first + MARKER_IDS
        if held.next >= min(e.n_total, self.max_ids):
            out.append(self.interrupt(e.tid))
        return out

    def interrupt(self, tid: int) -> MarkerEvent:
        """The batch open on thread `tid` (in `pending`) is done: what arrived of it."""
        held = self.pending.pop(tid)
        return MarkerEvent("batch", held.ts, held.tgid, tid, batch_id=held.batch_id,
                           request_ids=tuple(held.ids))


class _Open:
    __slots__ = ("ts", "tgid", "batch_id", "next", "ids")

    def __init__(self, e):
        self.ts, self.tgid, self.batch_id, self.next, self.ids = e.ts, e.tgid, e.batch_id, 0, []


OPEN_RANGES = 16384  # ranges begun and not yet ended that the kernel keeps, all engines together


def cflags(ring_pages: int, max_batch_ids: int, cpus: int | None = None) -> list[str]:
    """-D settings; wakeups as ring.wake_bytes sizes them."""
    return [*source_flags(), f"-DMARKER_RING_PAGES={ring_pages}", f"-DMARKER_OPEN_RANGES={OPEN_RANGES}",
            f"-DMARKER_MAX_IDS={max_batch_ids}", f"-DMARKER_WAKE_BYTES={wake_bytes(ring_pages * 4096, cpus)}"]


class MarkerProbe(RingReader):
    """The loaded marker program, attached to one or more marker libraries.

    library_path: a path, several, or None (attach later with `attach`).
    """

    hook = "uprobe"
    RINGS = ("marker_events",)

    def __init__(self, library_path: str | Iterable[str] | None,
                 on_event: Callable[[MarkerEvent], None], *,
                 ring_pages: int = 1024, max_batch_ids: int = 256):
        from bcc import BPF  # the probes layer is the only one that imports bcc

        if max_batch_ids % MARKER_IDS or ring_pages & (ring_pages - 1):
            raise ValueError("max_batch_ids: a multiple of 16; ring_pages: a power of two")
        self._on_event = on_event
        self._budget = DrainBudget()
        self._batches = Batches(max_batch_ids)
        self._attached: dict[tuple[int, int], tuple[str, set]] = {}  # inode -> path, bcc events
        self._bpf = compile_module(str(bpf_dir() / "markers.c"), cflags(ring_pages, max_batch_ids))
        for fn in HOOKS.values():  # verify every program now, not at the first attach
            apart.load_func(self._bpf, fn.encode(), BPF.KPROBE, {})
        self._ring = self._bpf[b"marker_events"]
        self._event_type = None
        self._ring.open_ring_buffer(self._on_ring)
        if isinstance(library_path, (str, os.PathLike)):
            library_path = [library_path]
        try:
            for path in library_path or ():
                self.attach(path)
        except Exception:
            self.close()
            raise

    def _on_ring(self, _ctx, data, _size) -> int:
        self._deliver(data)
        return self._budget.take()

    def _deliver(self, data) -> None:
        cls = self._event_type
        if cls is None:  # bcc derives the class from the C struct at the first event
            cls = self._event_type = type(self._ring.event(data))
        e = cls.from_address(data)  # 3x cheaper than bcc's cast(...).contents
        if e.kind == MK_BATCH:
            for m in self._batches.add(e):
                self._on_event(m)
            return
        if self._batches.pending and e.tid in self._batches.pending:
            self._on_event(self._batches.interrupt(e.tid))
        self._on_event(decode(e))

    def attach(self, path: str) -> bool:
        """Probe every process's calls into the library at `path`; False when
        that file (by inode) is already attached."""
        path = os.fspath(path)
        try:
            st = os.stat(path)
        except OSError as e:
            raise ProbeAttachError("markers", path, e.strerror or str(e)) from e
        if (st.st_dev, st.st_ino) in self._attached:
            return False
        before = set(self._bpf.uprobe_fds)
        try:
            for sym, fn in HOOKS.items():
                self._bpf.attach_uprobe(name=path.encode(), sym=sym.encode(),
                                        fn_name=fn.encode(), pid=-1)
        except Exception as e:
            self._detach_events(set(self._bpf.uprobe_fds) - before)
            raise ProbeAttachError("markers", f"{path}:{sym}", str(e)) from e
        self._attached[(st.st_dev, st.st_ino)] = (path, set(self._bpf.uprobe_fds) - before)
        return True

    def detach(self, path: str) -> bool:
        """Stop probing the library attached as `path` (which may be gone by
        now: a /proc/<pid>/root path of an exited engine); False when it was not."""
        path = os.fspath(path)
        for key, (attached, events) in list(self._attached.items()):
            if attached == path:
                self._detach_events(events)
                del self._attached[key]
                return True
        return False

    def _detach_events(self, events) -> None:
        for ev in events:
            self._bpf.detach_uprobe_event(ev)

    @property
    def libraries(self) -> list[str]:
        """The library paths attached, in the order they were attached."""
        return [path for path, _ in self._attached.values()]

    def open_ranges(self) -> list[tuple[int, str]]:
        """(tgid, name) of every range begun and not yet ended, as the kernel
        keeps them (a map walk: for a tick, not per event)."""
        return [(k.tgid, k.name.decode(errors="replace")) for k in self._bpf[b"range_begins"].keys()]

    def counters(self) -> dict[str, int]:
        table = self._bpf[b"marker_counters"]
        return {name: sum(table[table.Key(i)]) for i, name in enumerate(COUNTERS)}

    def close(self) -> None:
        side_by_side.close(self._bpf)
