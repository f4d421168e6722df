"""Engine markers -> Inference records, joined to the network Requests.

An instrumented engine names each request and the socket it came on
(``request_begin``), its stages (``range_*``, a batched step naming every
request it serves through ``batch``), its cache look-ups and its token
usage. The join key is (process, socket fd) plus time: the engine's request
begins inside the network exchange's span. The two event streams arrive
through different rings, so a Request from an instrumented process waits up
to ``hold_ns`` for its markers before it is released without them.
"""
from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..events import MarkerEvent
from ..request import CacheLookup, Inference, Request, Stage

MAX_OPEN_PER_PROCESS = 4096  # engine requests in flight we remember, per process
MAX_BATCHES = 4096


@dataclass
class _Open:
    request_id: int
    fd: int
    model: str
    start_ns: int
    stages: list[Stage] = field(default_factory=list)
    cache: list[CacheLookup] = field(default_factory=list)
    usage: tuple[int, int, int] = (0, 0, 0)


class EngineJoin:
    def __init__(self, hold_ns: int = 500_000_000):
        self.hold_ns = hold_ns
        self._open: dict[tuple[int, int], _Open] = {}  # (tgid, request id) -> state
        self._batches: dict[tuple[int, int], tuple[int, ...]] = {}  # (tgid, batch) -> ids
        self._done: dict[tuple[int, int], deque[Inference]] = defaultdict(deque)  # (tgid, fd)
        self._held: deque[tuple[int, Request]] = deque()  # (deadline, request)
        self.instrumented: set[int] = set()
        self.batch_sizes: list[int] = []  # drained by the metrics side
        self.unmatched = 0  # engine requests never joined to a network request
        self.dropped = 0  # state shed to stay bounded
        self._handlers = {"request_begin": self._request_begin, "request_end": self._request_end,
                          "range": self._range, "batch": self._batch, "cache_get": self._cache_get,
                          "usage": self._usage}

    # -- markers ------------------------------------------------------------------

    def on_marker(self, ev: MarkerEvent) -> None:
        self.instrumented.add(ev.tgid)
        handler = self._handlers.get(ev.kind)
        if handler is not None:
            handler(ev)

    def _request_begin(self, ev: MarkerEvent) -> None:
        if len(self._open) >= MAX_OPEN_PER_PROCESS * max(1, len(self.instrumented)):
            self._open.pop(next(iter(self._open)))
            self.dropped += 1
        self._open[(ev.tgid, ev.request_id)] = _Open(ev.request_id, ev.fd, ev.name, ev.ts_ns)

    def _request_end(self, ev: MarkerEvent) -> None:
        st = self._open.pop((ev.tgid, ev.request_id), None)
        if st is None:
            return
        inf = Inference(st.request_id, st.model, st.start_ns, ev.ts_ns, tuple(st.stages),
                        tuple(st.cache), *st.usage)
        done = self._done[(ev.tgid, st.fd)]
        done.append(inf)
        if len(done) > 64:  # never claimed by a network request
            done.popleft()
            self.unmatched += 1

    def _batch(self, ev: MarkerEvent) -> None:
        key = (ev.tgid, ev.batch_id)
        self._batches[key] = self._batches.get(key, ()) + ev.request_ids
        if len(self._batches) > MAX_BATCHES:
            self._batches.pop(next(iter(self._batches)))

    def _range(self, ev: MarkerEvent) -> None:
        if ev.batch_id:
            ids = self._batches.pop((ev.tgid, ev.batch_id), ())
            self.batch_sizes.append(len(ids))
            stage = Stage(ev.name, ev.begin_ns, ev.ts_ns, ev.batch_id, len(ids))
        else:
            ids, stage = (ev.request_id,), Stage(ev.name, ev.begin_ns, ev.ts_ns)
        for rid in ids:
            st = self._open.get((ev.tgid, rid))
            if st is not None:
                st.stages.append(stage)

    def _cache_get(self, ev: MarkerEvent) -> None:
        st = self._open.get((ev.tgid, ev.request_id))
        if st is not None:
            st.cache.append(CacheLookup(ev.name, ev.key, bool(ev.hit), ev.ts_ns))

    def _usage(self, ev: MarkerEvent) -> None:
        st = self._open.get((ev.tgid, ev.request_id))
        if st is not None:
            st.usage = (ev.input_tokens, ev.output_tokens, ev.kv_bytes)

    def demand(self, open_ranges: Iterable[tuple[int, str]] = ()) -> dict[int, tuple[int, int]]:
        """Per process, the engine's own count: (requests begun and not ended,
        of which waiting in a "queue" stage now). ``open_ranges``: (tgid,
        name) of each range begun and not ended (the kernel keeps them:
        MarkerProbe.open_ranges)."""
        out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for tgid, _ in self._open:
            out[tgid][0] += 1
        for tgid, name in open_ranges:
            if name == "queue" and tgid in out:
                out[tgid][1] += 1
        return {tgid: (n, min(q, n)) for tgid, (n, q) in out.items()}

    # -- requests -----------------------------------------------------------------

    def on_request(self, r: Request, now_ns: int) -> list[Request]:
        """Requests ready to emit: joined ones, those of uninstrumented processes,
        and held ones whose wait ran out."""
        if r.pid not in self.instrumented:
            return self.due(now_ns) + [r] if self._held else [r]
        joined = self._join(r)
        if joined is not None:
            return self.due(now_ns) + [joined]
        self._held.append((now_ns + self.hold_ns, r))
        return self.due(now_ns)

    def due(self, now_ns: int, everything: bool = False) -> list[Request]:
        out, keep = [], deque()
        for deadline, r in self._held:
            joined = self._join(r)
            if joined is not None:
                out.append(joined)
            elif everything or now_ns >= deadline:
                out.append(r)
            else:
                keep.append((deadline, r))
        self._held = keep
        return out

    def _join(self, r: Request) -> Request | None:
        done = self._done.get((r.pid, r.fd))
        if not done:
            return None
        for i, inf in enumerate(done):
            if r.start_ns <= inf.start_ns <= r.end_ns:
                del done[i]
                return r._replace(inference=inf)
        return None
