"""bcc's slow steps, done side by side: the kernel does each on its own and
bcc's calls into it drop the GIL, so a start and a stop wait for the
slowest step, not for their sum."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from .. import cpus
from . import apart
from .compiler import free_module

log = logging.getLogger(__name__)


def _each(steps: list[Callable[[], object]], name: str, workers: int | None = None) -> list:
    """Each step's result, in order; the steps begin in that order, on
    ``workers`` threads (default: one each)."""
    if len(steps) < 2:
        return [step() for step in steps]
    with ThreadPoolExecutor(max_workers=workers or len(steps), thread_name_prefix=name) as pool:
        return list(pool.map(lambda step: step(), steps))


def load(bpf, names: Iterable[bytes], prog_type: int, compiled_apart: apart.Programs | None = None) -> list:
    """The programs loaded side by side, the largest first, on as many
    threads as this process has CPUs to run on (cpus.usable): verifying is CPU work, and one thread
    more than the CPUs only slows the longest (sock_io) down. Here net.c's
    socket tier: 0.27 s against 0.39 with a thread each, and 0.65 one after
    the other. Those in ``compiled_apart`` are loaded from its instructions
    (probes/apart.py)."""
    from bcc.libbcc import lib

    names, made = list(names), compiled_apart or {}
    order = sorted(range(len(names)), key=lambda i: -(len(made[names[i]]) if names[i] in made else
                                                      lib.bpf_function_size(bpf.module, names[i])))
    loaded = _each([lambda name=names[i]: apart.load_func(bpf, name, prog_type, made) for i in order],
                   "bpf-load", workers=min(len(names), cpus.usable()))
    out = [None] * len(names)
    for i, fn in zip(order, loaded):
        out[i] = fn
    return out


def close(bpf) -> None:
    """Every probe off at once, then the rest of bcc's cleanup: closing a
    tracepoint's or a uprobe's perf event waits for the kernel to be sure no
    CPU still runs its program, some 70 ms each, one after the other in
    cleanup() (net.c's: 0.36-0.41 s at once against 0.72 s)."""
    _each([*(lambda k=k: bpf.detach_tracepoint(k) for k in list(bpf.tracepoint_fds)),
           *(lambda k=k: bpf.detach_raw_tracepoint(k) for k in list(bpf.raw_tracepoint_fds)),
           *(lambda k=k: bpf.detach_uprobe_event(k) for k in list(bpf.uprobe_fds)),
           *(lambda k=k: bpf.detach_kprobe_event(k) for k in list(bpf.kprobe_fds))], "bpf-detach")
    free_module(bpf)


class Detacher:
    """A module's uprobes detached on a thread of their own, so that a caller
    does not wait for the kernel: closing a uprobe's perf event waits for a
    grace period, 100-130 ms each on this kernel, and one after the other even
    from several threads. A traced process that exits takes its 8 TLS probes
    with it: detached in the agent's loop, they stopped it for 0.8 s, its
    rings unread, once per process that exited.

    Each event leaves bcc's table at once, as bcc's own detach would take it
    out: its count of open probes, which bounds every later attach, stays
    true, and its cleanup does not close the event a second time."""

    def __init__(self, bpf, lib=None):
        if lib is None:
            from bcc.libbcc import lib
        self._bpf, self._lib = bpf, lib
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def detach(self, events: Iterable[bytes]) -> None:
        """The uprobe events (bcc's names) off, soon; returns at once."""
        for ev in events:
            fd = self._bpf.uprobe_fds.get(ev)
            if fd is not None:
                self._bpf._del_uprobe_fd(ev)  # bcc's table and its count (private: bcc has no public way)
                self._queue.put((ev, fd))
        if self._thread is None and not self._queue.empty():
            self._thread = threading.Thread(target=self._run, name="uprobe-detach", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            ev, fd = item
            if self._lib.bpf_close_perf_event_fd(fd) < 0 or self._lib.bpf_detach_uprobe(ev) < 0:
                log.debug("uprobe %s: the kernel did not take it off", ev.decode(errors="replace"))

    def close(self) -> None:
        """Returns once every event handed over is off."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
