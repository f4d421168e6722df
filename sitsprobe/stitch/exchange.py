"""Exchanges (matched in the kernel) -> Requests, through their protocol.

The kernel reports an exchange when the next request begins, the next
response begins, or the socket closes. An exchange whose response's own
framing shows it ended (`complete`) is reported by the flush tick before
that, once; the kernel's later copy of it is recognised by its key and
dropped. Nothing is reported because a connection went quiet: a streamed
answer that pauses is still one request, reported when it ends.

A POST's response writes (`Beat`s) come before its exchange on the ring;
they wait here, bounded, and join its payload when it arrives.
"""
from __future__ import annotations

from collections import OrderedDict

from ..abi import CF_BY_PROCESS, CF_CLIENT, CF_TLS
from ..events import END_EXIT, Beat, Exchange
from ..request import Link, Request, Write
from ..routes import RouteMapper
from .protocols import http1, protocol_of


# A call (a client exchange) is reported by the flush only once it has been
# quiet this long. The kernel reports the call before it on the connection
# when this one begins, through the ring; a ring record waits behind any
# reserved before it whose program has not yet submitted (its CPU taken away:
# 55 ms seen on a loaded 2-CPU machine). A call flushed meanwhile would come
# before the one it followed, and the joiner bounds a call's answer by the
# end of the call before it (join.Joiner._after).
CALL_SETTLE_NS = 250_000_000


class Stitcher:
    def __init__(self, routes: RouteMapper, max_remembered: int = 65536, max_writes: int = 1 << 20,
                 writes_per_exchange: int = 4096):
        """writes_per_exchange: capture.max_writes, the writes the kernel
        reports one by one of each exchange."""
        self._routes = routes
        self._per_exchange = writes_per_exchange
        self._reported: OrderedDict[tuple[int, int, int, int], None] = OrderedDict()
        self._max_remembered = max_remembered
        self._writes: dict[tuple[int, int, int, int], list[Write]] = {}
        self._writes_held, self._max_writes = 0, max_writes
        self.duplicates = 0
        self.writes_dropped = 0  # writes not held: max_writes were waiting already (a loss, exported)

    def on_beat(self, beat: Beat) -> None:
        """A response write of an exchange still to come; or more of the peek
        of the write before it (a response's first write, its head and first
        event together), which goes on that peek where it follows on."""
        if beat.peek_at:
            writes = self._writes.get(beat.key)
            if writes and len(writes[-1].peek) == beat.peek_at and writes[-1].ts_ns == beat.write.ts_ns:
                writes[-1] = writes[-1]._replace(peek=writes[-1].peek + beat.write.peek)
            return
        if self._writes_held >= self._max_writes:
            self.writes_dropped += 1
            return
        self._writes.setdefault(beat.key, []).append(beat.write)
        self._writes_held += 1

    def forget(self, tgid: int) -> None:
        """A process exited: the writes of its exchanges never reported go."""
        for key in [k for k in self._writes if k[0] == tgid]:
            self._writes_held -= len(self._writes.pop(key))

    def _joined(self, ex: Exchange) -> Exchange:
        """ex, reported now, with its writes in its payload (any later are dropped)."""
        writes = self._writes.pop(ex.key, None)
        if writes is None:
            return ex
        self._writes_held -= len(writes)
        return ex if ex.payload is None else ex._replace(payload=ex.payload._replace(writes=tuple(writes)))

    def on_exchange(self, ex: Exchange) -> list[Request]:
        """An exchange the kernel reported."""
        if ex.key in self._reported:  # already reported by a flush
            del self._reported[ex.key]
            self.duplicates += 1
            if (writes := self._writes.pop(ex.key, None)) is not None:
                self._writes_held -= len(writes)
            return []
        return self.requests(self._joined(ex))

    def due(self, ex: Exchange, now_ns: int) -> bool:
        """Whether an open exchange's framing says its response has ended,
        its request's body is all read (HTTP/1: see http1.body_read), the
        events of all its writes are in hand (the last may still be on its
        way when the connection's entry already shows the end), and, for a
        call, it has been quiet for CALL_SETTLE_NS (at ``now_ns``)."""
        if ex.flags & CF_CLIENT and now_ns - max(ex.last_in_ns, ex.last_out_ns) < CALL_SETTLE_NS:
            return False
        proto = protocol_of(ex)
        if ex.key in self._reported or not proto.complete(ex) or (proto is http1 and not http1.body_read(ex)):
            return False
        p = ex.payload
        return p is None or len(self._writes.get(ex.key, ())) >= min(p.writes_total, self._per_exchange)

    def on_flush(self, ex: Exchange, final: bool = False) -> list[Request]:
        """An open exchange userspace reports itself: one that is `due`, or,
        with ``final``, any (the agent stops, the process exited): complete
        only if its framing says so. Once only, however often it is seen."""
        if ex.key in self._reported:
            return []
        self._reported[ex.key] = None
        if len(self._reported) > self._max_remembered:
            self._reported.popitem(last=False)
        requests = self.requests(self._joined(ex))
        if final and not protocol_of(ex).complete(ex):
            requests = [r._replace(complete=False) if r.protocol == http1.NAME else r
                        for r in requests]
        return requests

    def requests(self, ex: Exchange) -> list[Request]:
        requests = protocol_of(ex).requests(ex, self._routes)
        if ex.flags & (CF_CLIENT | CF_TLS) or ex.link_key or ex.calls:
            link = Link(ex.link_key >> 32, ex.link_key & 0xFFFFFFFF, ex.link_start,
                        bool(ex.flags & CF_BY_PROCESS)) if ex.link_key else None
            direction = "client" if ex.flags & CF_CLIENT else "server"
            requests = [r._replace(direction=direction, link=link, calls=ex.calls, tls=bool(ex.flags & CF_TLS))
                        for r in requests]
        return requests


def enrich(r: Request, redact: frozenset[str] = frozenset(),
           keep_query: frozenset[str] = frozenset()) -> Request:
    """What only a traced request pays for, by its protocol."""
    if r.protocol == http1.NAME:
        return http1.enrich(r, redact, keep_query)
    return r


def exited(ex: Exchange) -> Exchange:
    return ex._replace(reason=END_EXIT)
