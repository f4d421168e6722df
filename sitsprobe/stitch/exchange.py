"""Exchanges (matched in the kernel) -> Requests (framed as HTTP/1.1 here).

The kernel reports an exchange when the next request begins or the socket
closes. A response on a keep-alive connection that then goes quiet is
reported by `due()` instead: at once when its Content-Length or the chunked
terminator says it is complete, otherwise after an idle timeout. The kernel's
later copy of an exchange reported that way is recognised and dropped.
"""
from __future__ import annotations

from collections import OrderedDict

from ..events import CF_CHUNK_END, CF_TCP, CF_TUPLE, END_CLOSE, END_EXIT, Exchange
from ..request import Request
from ..routes import RouteMapper
from .http import RequestHead, parse_request_heads, parse_response_head, path_of, request_line

STREAM_IDLE_NS = 30_000_000_000  # an open stream (SSE, chunked) may pause this long

# Nearly every exchange is one plain request, and its Request is built by
# position: 1.0 µs here against 2.6 µs by keyword. Built in this order:
_FAST_FIELDS = ("pid", "comm", "fd", "start_ns", "end_ns", "first_out_ns", "bytes_in",
                "bytes_out", "local", "peer", "protocol", "method", "target", "path", "route",
                "status", "user_agent", "traceparent", "complete", "head")
if Request._fields[: len(_FAST_FIELDS)] != _FAST_FIELDS:
    raise ImportError("sitsprobe.request.Request fields moved: update Stitcher.requests")


class Stitcher:
    def __init__(self, routes: RouteMapper, idle_flush_ns: int, max_remembered: int = 65536):
        self._routes = routes
        self._idle_ns = idle_flush_ns
        # exchanges a flush reported -> their last_out_ns then
        self._reported: OrderedDict[tuple[int, int, int], int] = OrderedDict()
        self._max_remembered = max_remembered
        self.duplicates = 0

    def on_exchange(self, ex: Exchange) -> list[Request]:
        """An exchange the kernel reported."""
        if ex.key in self._reported:  # already reported by a flush
            del self._reported[ex.key]
            self.duplicates += 1
            return []
        return self.requests(ex)

    def on_flush(self, ex: Exchange) -> list[Request]:
        """An open exchange userspace reports itself (idle, or its process
        exited); once only, however many flush ticks see it still open."""
        if ex.key in self._reported:
            return []
        self._reported[ex.key] = ex.last_out_ns
        if len(self._reported) > self._max_remembered:
            self._reported.popitem(last=False)
        return self.requests(ex)

    def due(self, ex: Exchange, now_ns: int) -> bool:
        """Whether an open, responding exchange should be reported now."""
        if self._reported.get(ex.key) == ex.last_out_ns:
            return True  # reported as due, and nothing sent since: it only got quieter
        resp = parse_response_head(ex.resp)
        if ex.n_responses <= 1 and resp is not None:
            if ex.flags & CF_CHUNK_END and resp.chunked:
                return True
            head_end = ex.resp.find(b"\r\n\r\n")
            if resp.content_length is not None and head_end >= 0:
                if ex.bytes_out >= head_end + 4 + resp.content_length:
                    return True
            streaming = resp.event_stream or (resp.chunked and not ex.flags & CF_CHUNK_END)
            if streaming:
                return now_ns - ex.last_out_ns > STREAM_IDLE_NS
        return now_ns - ex.last_out_ns > self._idle_ns

    def requests(self, ex: Exchange) -> list[Request]:
        answered = ex.first_out_ns != 0
        end = ex.last_out_ns if answered else ex.last_in_ns
        complete = answered or ex.reason not in (END_EXIT, END_CLOSE)
        # TCP: the kernel saw its 4-tuple or a tcp_sendmsg on it. An answer sent
        # without tcp_sendmsg went over another kind of socket (a Unix one).
        tcp = ex.flags & (CF_TCP | CF_TUPLE) or not answered
        if ex.n_responses <= 1 and (line := request_line(ex.req)) is not None:
            # the common case, kept cheap: headers are parsed only for traced requests
            method, target = line
            path = path_of(target)
            r = Request(  # by position, in _FAST_FIELDS order
                ex.tgid, ex.comm, ex.fd, ex.start_ns, end, ex.first_out_ns or None,
                ex.bytes_in, ex.bytes_out, ex.local, ex.peer, "http/1.1", method, target,
                path, self._routes.route(path), ex.statuses[0] if ex.statuses else None,
                None, None, complete, ex.req)
            return [r if tcp else r._replace(transport=None)]
        base = dict(pid=ex.tgid, comm=ex.comm, fd=ex.fd, start_ns=ex.start_ns, end_ns=end,
                    first_out_ns=ex.first_out_ns or None, local=ex.local, peer=ex.peer,
                    complete=complete, transport="tcp" if tcp else None)
        heads = parse_request_heads(ex.req)
        resp = parse_response_head(ex.resp)
        if not heads and resp is None:  # not HTTP: one connection-level exchange
            return [Request(protocol="tcp", bytes_in=ex.bytes_in, bytes_out=ex.bytes_out, **base)]
        n = max(len(heads), ex.n_responses, 1)
        statuses = ex.statuses or ((resp.status,) if resp else ())
        out = []
        for i in range(n):
            head = heads[i] if i < len(heads) else None
            share = _share(ex.bytes_in, n, i), _share(ex.bytes_out, n, i)
            out.append(self._http(head, statuses[i] if i < len(statuses) else None, share, base))
        return out

    def _http(self, head: RequestHead | None, status: int | None, size: tuple[int, int],
              base: dict) -> Request:
        if head is None:
            return Request(bytes_in=size[0], bytes_out=size[1], status=status,
                           route=self._routes.route(None), **base)
        return Request(
            bytes_in=size[0], bytes_out=size[1], status=status,
            method=head.method, target=head.target, path=head.path,
            route=self._routes.route(head.path), user_agent=head.headers.get("user-agent"),
            traceparent=head.traceparent, **base)


def enrich(r: Request, redact: frozenset[str] = frozenset()) -> Request:
    """Add what only the headers tell (traceparent, user agent) to a request
    about to be traced; the metrics path never pays for parsing them. A header
    named in `redact` (capture.redact_headers) is never exported."""
    if not r.head:
        return r
    heads = parse_request_heads(r.head, limit=1)
    if not heads:
        return r._replace(head=b"")
    h = heads[0]
    agent = None if "user-agent" in redact else h.headers.get("user-agent")
    return r._replace(head=b"", traceparent=h.traceparent, user_agent=agent)


def _share(total: int, n: int, i: int) -> int:
    """Pipelined requests split an exchange's bytes evenly (the first takes the rest)."""
    return total // n + (total % n if i == 0 else 0)
