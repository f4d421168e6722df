"""HTTP/2 connections (CF_STREAM) -> one Request per stream.

The kernel sends every read and write of such a connection as a `Chunk`
(the first capture.stream_bytes of each); `protocols.http2` frames them,
HPACK included, and each stream it finishes becomes a Request here: gRPC
calls and plain HTTP/2 requests alike, server or client side. A POST to a
GenAI endpoint, served or called by a traced process, keeps its payload
pieces (protocols.http2_payload) for stitch.genai, as the kernel keeps an
HTTP/1 exchange's, under the same capture settings: at most
``max_payloads`` streams at once, the rest counted.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..abi import CF_BY_PROCESS, CF_CLIENT, CF_CLOSING, CF_SEEDED, CF_TLS, CH_CLOSE, CH_IN
from ..events import Chunk
from ..request import H2, Link, Request
from ..routes import RouteMapper
from .genai_shapes import shape_of
from .http import parse_traceparent, path_of
from .protocols import http2
from .protocols.http2_payload import Kept, Limits


CANCEL, CANCELLED = 0x8, 1  # the RST_STREAM error code; the gRPC status it means
MAX_LINKS = 1024  # chunk links a connection keeps for streams still open


@dataclass(slots=True)
class _Conn:
    conn: http2.Connection
    first: Chunk  # its first chunk: who, where
    links: dict[int, Link] = field(default_factory=dict)  # chunk ts -> what its streams belong to


class StreamStitcher:
    def __init__(self, routes: RouteMapper, name_of: Callable[[int], str],
                 payloads: Limits | None = None, max_payloads: int = 4096):
        """``payloads``: what a GenAI stream keeps (None: nothing, capture.genai off)."""
        self._routes = routes
        self._name_of = name_of
        self._payloads, self._max_payloads, self._kept = payloads, max_payloads, 0
        self._conns: dict[tuple[int, int], _Conn] = {}
        # (process, what) -> totals kept apart from the open connections': the closed ones', and
        # payloads_not_kept
        self._closed: dict[tuple[str, str], int] = {}

    def counts(self) -> dict[tuple[str, str], int]:
        """(process, what) -> total over its HTTP/2 connections, open and closed:
        connections, partial (connections not decoded whole), frame_errors,
        skipped_bytes, window_updates_in, window_updates_out; and
        payloads_not_kept (GenAI streams past max_payloads at once)."""
        out = dict(self._closed)
        for c in self._conns.values():
            self._fold(out, self._name_of(c.first.tgid), c.conn)
        return out

    @staticmethod
    def _fold(into: dict[tuple[str, str], int], process: str, conn: http2.Connection) -> None:
        for what, n in (("connections", 1), ("partial", int(conn.partial is not None)),
                        ("frame_errors", conn.frame_errors), ("skipped_bytes", conn.skipped_bytes),
                        ("window_updates_in", conn.window_updates_in),
                        ("window_updates_out", conn.window_updates_out),
                        ("payloads_not_kept", 0)):  # counted apart (_keep); 0 from the first connection
            into[process, what] = into.get((process, what), 0) + n

    def on_chunk(self, ch: Chunk) -> list[Request]:
        key = (ch.tgid, ch.fd)
        if ch.dir == CH_CLOSE:
            return self._close(key, ch.ts_ns, ch.peer_ended)
        c = self._conns.get(key)
        if c is None:
            side = "client" if ch.flags & CF_CLIENT else "server"
            keep = None if self._payloads is None else lambda method, path: self._keep(ch.tgid, method, path)
            c = self._conns[key] = _Conn(http2.Connection(side, not ch.flags & CF_SEEDED, keep), ch)
        if ch.link_key:  # the streams this chunk begins belong to it (stitch.join)
            c.links[ch.ts_ns] = Link(ch.link_key >> 32, ch.link_key & 0xFFFFFFFF, ch.link_start,
                                     bool(ch.flags & CF_BY_PROCESS))
            if len(c.links) > MAX_LINKS:
                del c.links[next(iter(c.links))]
        c.conn.feed(ch.ts_ns, "in" if ch.dir == CH_IN else "out", ch.data, ch.size)
        if ch.flags & CF_CLOSING:  # TCP ended it during this call: the chunk is its close too
            return self._close(key, ch.ts_ns, ch.peer_ended)
        return self._requests(c)

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

    def _keep(self, tgid: int, method: str | None, path: str | None) -> Kept | None:
        """A keeper for a stream's payload pieces, if it is a POST to a GenAI endpoint."""
        if method != "POST" or not path or shape_of(path_of(path)) is None:
            return None
        if self._kept >= self._max_payloads:
            key = (self._name_of(tgid), "payloads_not_kept")
            self._closed[key] = self._closed.get(key, 0) + 1
            return None
        self._kept += 1
        return Kept(self._payloads, self._release)

    def _release(self) -> None:
        self._kept -= 1

    def _close(self, key: tuple[int, int], ts_ns: int, peer_ended: bool = False) -> list[Request]:
        c = self._conns.pop(key, None)
        if c is None:
            return []
        c.conn.close(ts_ns, peer_ended)
        out = self._requests(c)
        self._fold(self._closed, self._name_of(c.first.tgid), c.conn)
        return out

    def _requests(self, c: _Conn) -> list[Request]:
        return [self._request(s, c) for s in c.conn.finished()]

    def _request(self, s: http2.Stream, c: _Conn) -> Request:
        ch, conn = c.first, c.conn
        grpc = bool(s.content_type and s.content_type.startswith("application/grpc"))
        path = path_of(s.path) if s.path else None
        tp = parse_traceparent(s.traceparent) if s.traceparent else None
        status = s.grpc_status
        if grpc and status is None and s.reset_code == CANCEL:  # gRPC's mapping of RST_STREAM(CANCEL)
            status = CANCELLED
        link = c.links.pop(s.start_ns, None)
        if link is not None and not link.start_ns:  # the caller's call is the stream of the same id
            link = link._replace(stream=s.stream_id)
        return Request(
            ch.tgid, self._name_of(ch.tgid), ch.fd, s.start_ns, max(s.end_ns, s.start_ns),
            s.first_response_ns, s.request_bytes, s.response_bytes, ch.local, ch.peer, http2.NAME,
            method=s.method, target=s.path, path=path, route=None if grpc else self._routes.route(path),
            status=s.status, user_agent=s.user_agent, traceparent=tp,
            complete=s.complete, direction=conn.side, partial=s.partial or conn.partial,
            tracestate=s.tracestate if tp is not None else None, tls=bool(ch.flags & CF_TLS),
            payload=s.payload,
            link=link, calls=int(conn.side == "client"),  # a traced server may answer it (stitch.join)
            h2=H2(s.stream_id, s.authority, s.scheme, grpc, status, s.grpc_message,
                  s.request_messages, s.response_messages, s.flow_control_wait_ns or 0, s.reset_code,
                  conn.window_updates_in))
