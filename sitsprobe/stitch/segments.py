"""A request's latency in five segments, the SITS2026 methodology's
网络/调度/计算/IO/缓存: network, scheduling, compute, I/O and cache.

The five are a partition of the request's span, first byte in to last byte
out: every instant is counted in exactly one segment, so they add up to the
duration. What each holds:

- **network**: receiving the request (first to last byte in: a body the client
  is still sending), the time inside the response's send calls, and with
  engine markers everything outside the engine's stages (before its first,
  after its last: parsing, queuing for the HTTP server, writing out).
- **scheduling**: the engine's queue stages (``engine.scheduling_stages``), and
  the run-queue wait of the thread serving the request while it was open
  (``stitch.run_queue``: the kernel's ``sched_switch``/``sched_wakeup``): the
  thread that read it, while it is the one writing the answer (the same
  thread's other reads, below, likewise).
- **compute**: the engine's compute stages (prefill, decode, ...: every stage
  not named in another list) and its time between stages; without markers,
  everything between the last byte in and the last byte out that is not a
  send call or a run-queue wait (the server's own time, the model's included).
- **io**: the process's waits on the device while the request was open
  (blocking ``cudaMemcpy``, stream and device synchronisation, timed by the
  CUDA probes), the serving thread's reads of anything but its connection
  (files, pipes, a dependency's socket: ``stitch.read_waits``), and the
  engine's I/O stages (``engine.io_stages``).
- **cache**: the engine's cache stages (``engine.cache_stages``), and the
  serving thread's reads of a Redis reply (a read whose first byte is a RESP
  type: ``+ - : $ *`` and RESP3's), taken out of its other reads.

Approximate, and said so: the run-queue wait is one thread's, the one on the
connection; an engine's other threads (a scheduler, a thread pool) wait
unseen, and what it waits is taken out of compute only up to what compute
holds; a send made during a decode step (a
stream) counts as compute when the engine marks that step; an engine without
markers cannot tell its queue from its model, so both are compute; a device
wait is the process's, so it counts for every request open at the time (a
batch waits together), and waits in a worker process of its own (vLLM's
GPU workers) are not this process's and are not seen. Where two
stages overlap, the instant goes to the first of cache, io, scheduling,
network, compute.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..request import Request

SEGMENTS = ("network", "scheduling", "compute", "io", "cache")
NETWORK, SCHEDULING, COMPUTE, IO, CACHE = range(5)
_PRIORITY = (CACHE, IO, SCHEDULING, NETWORK, COMPUTE)  # who wins an overlapped instant


class StageSegments:
    """Which segment an engine stage's time counts in (the engine.*_stages lists)."""

    def __init__(self, scheduling: Iterable[str] = ("queue",), io: Iterable[str] = (),
                 cache: Iterable[str] = (), network: Iterable[str] = ()):
        self._of: dict[str, int] = {}
        for seg, names in ((NETWORK, network), (CACHE, cache), (IO, io), (SCHEDULING, scheduling)):
            self._of.update(dict.fromkeys(names, seg))

    def of(self, stage: str) -> int:
        return self._of.get(stage, COMPUTE)


def segments(r: Request, stages: StageSegments,
             waits: Iterable[tuple[int, int]] = ()) -> tuple[int, int, int, int, int]:
    """(network, scheduling, compute, io, cache) in ns, adding up to
    r.duration_ns. ``waits``: (start, end) of the process's device waits
    during the request."""
    start, end = r.start_ns, r.end_ns
    out = [0] * 5
    if end <= start:
        return (0, 0, 0, 0, 0)
    device = [(max(s, start), min(e, end), IO) for s, e in waits if e > start and s < end]
    inf = r.inference
    if inf is not None and inf.stages:
        _engine_timeline(out, start, end, [(max(s.start_ns, start), min(s.end_ns, end), stages.of(s.name))
                                           for s in inf.stages if s.end_ns > start and s.start_ns < end]
                         + device)
    else:
        last_in = min(max(r.last_in_ns, start), end) if r.last_in_ns else start
        out[NETWORK] = last_in - start
        out[IO] = _covered([(max(s, last_in), e) for s, e, _ in device if e > last_in])
        out[COMPUTE] = end - last_in - out[IO]
        sent = min(r.send_ns, out[COMPUTE])
        out[COMPUTE] -= sent
        out[NETWORK] += sent
    reads = max(0, r.read_wait_ns - r.cache_wait_ns)
    for seg, ns in ((SCHEDULING, r.runq_ns), (CACHE, r.cache_wait_ns), (IO, reads)):
        taken = min(ns, out[COMPUTE])
        out[COMPUTE] -= taken
        out[seg] += taken
    return tuple(out)


def _covered(spans: list[tuple[int, int]]) -> int:
    """ns covered by the union of (start, end) spans."""
    total, reach = 0, None
    for s, e in sorted(spans):
        if reach is None or s > reach:
            total, reach = total + (e - s), e
        elif e > reach:
            total, reach = total + (e - reach), e
    return total


def _engine_timeline(out: list[int], start: int, end: int, spans: list[tuple[int, int, int]]) -> None:
    """Sweep the request's span: each piece goes to the first active segment
    in _PRIORITY; a piece no stage covers is compute inside the engine's
    first-to-last stage and network outside it. Compute comes last in
    _PRIORITY and every stage lies inside first-to-last, so compute stages
    bound the sweep and take no part in it: an engine's decode steps, most
    of its stages, cost a look each. O(n log n) in the other stages."""
    if not spans:
        out[NETWORK] += end - start
        return
    first, last = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    events = sorted([(s, 1, seg) for s, _, seg in spans if seg != COMPUTE]
                    + [(e, -1, seg) for _, e, seg in spans if seg != COMPUTE]
                    + [(first, 0, -1), (last, 0, -1), (end, 0, -1)])
    active = [0] * 5
    at = start
    for t, step, seg in events:
        if t > at:
            for held in _PRIORITY:
                if active[held]:
                    break
            else:
                held = COMPUTE if first <= at and t <= last else NETWORK
            out[held] += t - at
            at = t
        if step:
            active[seg] += step
