"""HTTP/1.x: an exchange is one request and its response.

The kernel ends an exchange when the next request begins, when the socket
closes, or when the next response begins (pipelined requests: one exchange
per response, all starting at their common read, ``Exchange.pipeline``
counting the responses before). `complete` says when a response's own framing
(Content-Length, the chunked terminator, a response that has no body) shows
it ended, so it can be reported before any of those happen; a response
whose end the captured bytes do not show waits for them. A streamed answer
that pauses for minutes is still one request.
"""
from __future__ import annotations

import re

from ...abi import CF_CLIENT
from ...events import CF_CHUNK_END, CF_MISSED, END_CLOSE, END_EXIT, END_RESPONSE, Exchange
from ...redact import redact_target
from ...request import CLIENT_CLOSED, Request, TraceParent
from ...routes import RouteMapper
from ..http import (looks_like_request, parse_request_heads, parse_response_head,
                    parse_traceparent, path_of, request_headers, request_line)
from .common import end_ns, ended_early, transport

NAME = "http/1.1"
NAME_1_0 = "http/1.0"  # what enrich() makes it for a traced request whose request line says HTTP/1.0
NAMES = (NAME, NAME_1_0)
REQUEST_MISSED = "request_missed"  # sitsprobe.partial: only the response was seen
HEAD_NOT_CAPTURED = "request_head_not_captured"  # a pipelined head past the bytes kept
RESPONSE_CUT_OFF = "response_cut_off"  # the connection closed before the response's framing ended

# Nearly every exchange is one plain request, and its Request is built by
# position: 1.0 µs here against 2.6 µs by keyword. Built in this order:
_FAST_FIELDS = ("pid", "comm", "fd", "start_ns", "end_ns", "first_out_ns", "bytes_in",
                "bytes_out", "local", "peer", "protocol", "method", "target", "path", "route",
                "status", "user_agent", "traceparent", "complete", "head")
if Request._fields[: len(_FAST_FIELDS)] != _FAST_FIELDS:
    raise ImportError("sitsprobe.request.Request fields moved: update http1.requests")
_TRACEPARENT = re.compile(rb"\ntraceparent[ \t]*:([^\r\n]*)", re.IGNORECASE)


def claims(ex: Exchange) -> bool:
    return bool(ex.status) or looks_like_request(ex.req)


def _framing(ex: Exchange, resp) -> bool | None:
    """What the response's own framing says: ended (True), not (False), or
    nothing (None): a head not captured whole, an upgrade or interim response,
    a body delimited by the close, or chunked with neither the terminator seen
    in the last write nor a kept response tail to look in (the terminator may
    come in writes of its own)."""
    if resp is None or resp.head_size is None or resp.status < 200:
        return None
    if resp.status in (204, 304) or (ex.pipeline == 0 and ex.req.startswith(b"HEAD ")):
        return True  # no body, whatever Content-Length says
    if resp.chunked:
        tail = ex.payload.response_tail if ex.payload is not None else b""
        if ex.flags & CF_CHUNK_END or tail.endswith(b"0\r\n\r\n"):
            return True
        return False if len(tail) >= 5 else None
    if resp.content_length is not None:
        return ex.bytes_out >= resp.head_size + resp.content_length
    return None


def complete(ex: Exchange) -> bool:
    """Whether the response's framing shows that it has ended."""
    return bool(ex.status) and _framing(ex, parse_response_head(ex.resp)) is True


def body_read(ex: Exchange) -> bool:
    """Whether the request's body, where its head gives its length, has all
    been read. A server may answer from the head (a 404 or 413 before an
    upload) and read the body after, as slowly as the client sends it
    (gunicorn in its lingering close): those bytes are still the request's,
    so its exchange is not reported before them. Not known: read."""
    if ex.pipeline or ex.req.startswith((b"GET ", b"HEAD ")):
        return True  # (the cheap common case; pipelined: each head's own bytes are not known)
    heads = parse_request_heads(ex.req, limit=1)
    return not heads or heads[0].size is None or ex.bytes_in >= heads[0].size


def cut_off(ex: Exchange) -> bool:
    """Whether an answer the close ended fell short of its own framing: fewer
    bytes than its Content-Length, or chunked with no terminator; or, a
    server's answer that only its close ends (HTTP/1.0's streams), when its
    client hung up first. Not known (see _framing): not cut off."""
    if not ex.status or ex.reason not in (END_CLOSE, END_EXIT):
        return False
    resp = parse_response_head(ex.resp)
    if (resp is None or resp.head_size is None) and ex.payload is not None and ex.payload.writes:
        resp = parse_response_head(ex.payload.writes[0].peek)  # a head longer than ex.resp
    framing = _framing(ex, resp)
    if framing is None and ex.peer_ended and not ex.flags & CF_CLIENT and _ended_by_close(ex, resp):
        return True
    return framing is False


def _ended_by_close(ex: Exchange, resp) -> bool:
    """Whether the answer's body is all the server sends until it closes: no
    length, not chunked (where _framing has found no other end). A tunnel's
    200 to a CONNECT is no such answer."""
    return resp is not None and resp.head_size is not None and resp.status >= 200 and not resp.chunked \
        and resp.content_length is None and not (ex.pipeline == 0 and ex.req.startswith(b"CONNECT "))


def requests(ex: Exchange, routes: RouteMapper) -> list[Request]:
    status = ex.status or None
    if ex.flags & CF_MISSED:  # its read began before we could see it
        return [Request(ex.tgid, ex.comm, ex.fd, ex.first_out_ns, ex.last_out_ns, ex.first_out_ns,
                        0, ex.bytes_out, ex.local, ex.peer, NAME, status=status,
                        route=routes.route(None), partial=REQUEST_MISSED, transport=transport(ex))]
    done = not ended_early(ex)
    short = (CLIENT_CLOSED if ex.peer_ended and not ex.flags & CF_CLIENT else RESPONSE_CUT_OFF) \
        if done and cut_off(ex) else None
    done = done and short is None
    if ex.pipeline == 0 and ex.reason != END_RESPONSE and (line := request_line(ex.req)) is not None:
        # the common case, kept cheap: headers are parsed only for traced requests
        # (END_RESPONSE: another response followed, so this one was pipelined)
        method, target = line
        path = path_of(target)
        r = Request(  # by position, in _FAST_FIELDS order
            ex.tgid, ex.comm, ex.fd, ex.start_ns, end_ns(ex), ex.first_out_ns or None,
            ex.bytes_in, ex.bytes_out, ex.local, ex.peer, NAME, method, target,
            path, routes.route(path), status, None, _traceparent(ex), done, ex.req,
            trace_headers=(ex.traceparent, ex.tracestate) if ex.traceparent or ex.tracestate else None,
            payload=ex.payload, last_in_ns=ex.last_in_ns, send_ns=ex.send_ns, runq_ns=ex.runq_ns,
            read_wait_ns=ex.read_wait_ns, cache_wait_ns=ex.cache_wait_ns, partial=short)
        return [r if transport(ex) else r._replace(transport=None)]
    heads = parse_request_heads(ex.req)
    head = heads[ex.pipeline] if ex.pipeline < len(heads) else None
    base = dict(pid=ex.tgid, comm=ex.comm, fd=ex.fd, start_ns=ex.start_ns, end_ns=end_ns(ex),
                first_out_ns=ex.first_out_ns or None, bytes_out=ex.bytes_out, local=ex.local,
                peer=ex.peer, protocol=NAME, status=status, complete=done,
                transport=transport(ex))
    if head is None:
        return [Request(bytes_in=0 if ex.pipeline else ex.bytes_in, route=routes.route(None),
                        partial=HEAD_NOT_CAPTURED if ex.pipeline else short, **base)]
    # the first of several pipelined requests, or a later one: its own size where the head tells
    size = head.size if head.size is not None and (ex.pipeline or len(heads) > 1) else None
    return [Request(
        bytes_in=size if size is not None else (0 if ex.pipeline else ex.bytes_in),
        method=head.method, target=head.target, path=head.path, route=routes.route(head.path),
        user_agent=head.headers.get("user-agent"), traceparent=head.traceparent or _far_traceparent(ex),
        tracestate=head.headers.get("tracestate"),
        trace_headers=(ex.traceparent, ex.tracestate) if ex.pipeline == 0 else None,
        payload=ex.payload if ex.pipeline == 0 else None, last_in_ns=ex.last_in_ns,
        send_ns=ex.send_ns, runq_ns=ex.runq_ns, read_wait_ns=ex.read_wait_ns,
        cache_wait_ns=ex.cache_wait_ns, partial=short, **base)]


def _traceparent(ex: Exchange) -> TraceParent | None:
    """The traceparent of a request whose other headers wait for enrich():
    the joiner needs it for every request (a call that carries the header
    its process was sent belongs to that request; a trace is its caller's),
    so it is found by one search of the captured head (0.2-0.6 µs), else
    taken from the kernel's copy of one past those bytes."""
    end = ex.req.find(b"\r\n\r\n")
    m = _TRACEPARENT.search(ex.req, 0, end if end >= 0 else len(ex.req))
    return parse_traceparent(m[1].decode("latin-1")) if m is not None else _far_traceparent(ex)


def _far_traceparent(ex: Exchange) -> TraceParent | None:
    return parse_traceparent(_value(ex.traceparent)) if ex.traceparent else None


def enrich(r: Request, redact: frozenset[str], keep_query: frozenset[str]) -> Request:
    """What only a traced request pays for: its headers (user agent, trace
    state), the tracestate the kernel found past them, and its query string
    with every value but those of ``keep_query`` redacted (its traceparent
    was taken when it was stitched). A header named in ``redact``
    (capture.redact_headers) is never exported."""
    headers = request_headers(r.head) if r.head else None
    if r.head and headers is None:
        return r._replace(head=b"", target=redact_target(r.target, keep_query))
    ts, agent = r.tracestate, r.user_agent
    if headers is not None:
        ts = headers.get("tracestate") or ts
        agent = headers.get("user-agent")
    if not ts and r.trace_headers is not None and (far_ts := r.trace_headers[1]):
        ts = _list_value(far_ts)
    if "user-agent" in redact:
        agent = None
    return r._replace(head=b"", trace_headers=None, tracestate=ts or None,
                      user_agent=agent, target=redact_target(r.target, keep_query),
                      protocol=NAME_1_0 if r.head.partition(b"\r\n")[0].endswith(b" HTTP/1.0") else r.protocol)


def _value(raw: bytes) -> str:
    """A header value from the bytes after its name: up to the line end."""
    return raw.split(b"\n", 1)[0].split(b"\r", 1)[0].strip(b" \t").decode("latin-1")


def _list_value(raw: bytes) -> str:
    """A list-valued header (tracestate) from bytes that may have been cut
    before its line end: only the members that arrived whole."""
    whole = b"\n" in raw or b"\r" in raw
    v = _value(raw)
    return v if whole else v.rpartition(",")[0].rstrip(" \t")


__all__ = ["NAME", "NAME_1_0", "NAMES", "REQUEST_MISSED", "HEAD_NOT_CAPTURED", "RESPONSE_CUT_OFF", "CLIENT_CLOSED", "claims", "complete", "cut_off",
           "requests", "enrich"]
