"""HTTP/2 connections (CF_STREAM) -> one Request per stream.

The kernel sends every read and write of such a connection as a `Chunk`
(the first capture.stream_bytes of each); `protocols.http2` frames them,
HPACK included, and each stream it finishes becomes a Request here: gRPC
calls and plain HTTP/2 requests alike, server or client side.
"""
from __future__ import annotations

from collections.abc import Callable

from ..abi import CF_CLIENT, CH_CLOSE, CH_IN
from ..events import Chunk
from ..request import H2, Request
from ..routes import RouteMapper
from .http import parse_traceparent, path_of
from .protocols import http2


CANCEL, CANCELLED = 0x8, 1  # the RST_STREAM error code; the gRPC status it means


class StreamStitcher:
    def __init__(self, routes: RouteMapper, name_of: Callable[[int], str]):
        self._routes = routes
        self._name_of = name_of
        self._conns: dict[tuple[int, int], tuple[http2.Connection, Chunk]] = {}

    def connections(self) -> int:
        return len(self._conns)

    def on_chunk(self, ch: Chunk) -> list[Request]:
        key = (ch.tgid, ch.fd)
        if ch.dir == CH_CLOSE:
            return self._close(key, ch.ts_ns)
        held = self._conns.get(key)
        if held is None:
            side = "client" if ch.flags & CF_CLIENT else "server"
            held = self._conns[key] = (http2.Connection(side), ch)
        conn, first = held
        conn.feed(ch.ts_ns, "in" if ch.dir == CH_IN else "out", ch.data, ch.size)
        return self._requests(conn, first)

    def forget(self, tgid: int, now_ns: int) -> list[Request]:
        """A process exited: its connections end, their open streams incomplete."""
        out = []
        for key in [k for k in self._conns if k[0] == tgid]:
            out += self._close(key, now_ns)
        return out

    def close_all(self, now_ns: int) -> list[Request]:
        out = []
        for key in list(self._conns):
            out += self._close(key, now_ns)
        return out

    def _close(self, key: tuple[int, int], ts_ns: int) -> list[Request]:
        held = self._conns.pop(key, None)
        if held is None:
            return []
        held[0].close(ts_ns)
        return self._requests(*held)

    def _requests(self, conn: http2.Connection, first: Chunk) -> list[Request]:
        return [self._request(s, conn, first) for s in conn.finished()]

    def _request(self, s: http2.Stream, conn: http2.Connection, ch: Chunk) -> Request:
        grpc = bool(s.content_type and s.content_type.startswith("application/grpc"))
        path = path_of(s.path) if s.path else None
        tp = parse_traceparent(s.traceparent) if s.traceparent else None
        status = s.grpc_status
        if grpc and status is None and s.reset_code == CANCEL:  # gRPC's mapping of RST_STREAM(CANCEL)
            status = CANCELLED
        return Request(
            ch.tgid, self._name_of(ch.tgid), ch.fd, s.start_ns, max(s.end_ns, s.start_ns),
            s.first_response_ns, s.request_bytes, s.response_bytes, ch.local, ch.peer, http2.NAME,
            method=s.method, target=s.path, path=path, route=None if grpc else self._routes.route(path),
            status=s.status, user_agent=s.user_agent, traceparent=tp,
            complete=s.complete, direction=conn.side, partial=s.partial or conn.partial,
            tracestate=s.tracestate if tp is not None else None,
            h2=H2(s.stream_id, s.authority, s.scheme, grpc, status, s.grpc_message,
                  s.request_messages, s.response_messages, s.flow_control_wait_ns or 0, s.reset_code))
