"""Stitcher: kernel exchanges -> Requests, without a kernel."""
from __future__ import annotations

import pytest

from sitsprobe.events import CF_TCP, CF_TUPLE, END_CLOSE, END_FLUSH, END_NEXT, Exchange
from sitsprobe.request import Endpoint
from sitsprobe.routes import RouteMapper
from sitsprobe.stitch.exchange import Stitcher

REQ = b"GET /v1/models/7?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: t/1\r\n\r\n"
RESP = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
LOCAL, PEER = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 41234)


def exchange(req=REQ, resp=RESP, flags=CF_TUPLE | CF_TCP, answered=True, **kw) -> Exchange:
    fields = dict(tgid=42, fd=7, comm="vllm", reason=END_NEXT, start_ns=1_000, last_in_ns=1_500,
                  first_out_ns=2_000 if answered else 0, last_out_ns=3_000 if answered else 0,
                  bytes_in=len(req), bytes_out=len(resp) if answered else 0, flags=flags,
                  local=LOCAL if flags & CF_TUPLE else None, peer=PEER if flags & CF_TUPLE else None,
                  statuses=(404,) if answered else (), n_responses=1 if answered else 0,
                  req=req, resp=resp if answered else b"")
    return Exchange(**(fields | kw))


def stitcher() -> Stitcher:
    return Stitcher(RouteMapper([], True, 500), 500_000_000)


def test_one_request_fields():
    (r,) = stitcher().on_exchange(exchange())
    assert (r.pid, r.comm, r.fd, r.start_ns, r.end_ns, r.first_out_ns) == (42, "vllm", 7, 1_000, 3_000, 2_000)
    assert (r.method, r.target, r.path, r.route, r.status) == ("GET", "/v1/models/7?x=1", "/v1/models/7",
                                                                "/v1/models/{id}", 404)
    assert (r.bytes_in, r.bytes_out, r.local, r.peer) == (len(REQ), len(RESP), LOCAL, PEER)
    assert (r.protocol, r.transport, r.complete, r.head) == ("http/1.1", "tcp", True, REQ)
    assert (r.inference, r.gpu, r.user_agent, r.traceparent) == (None, None, None, None)


def test_the_fast_path_agrees_with_the_general_one():
    """One request is built by position; the same request among pipelined ones
    goes through the keyword path. Their fields must agree."""
    (fast,) = stitcher().on_exchange(exchange())
    general = stitcher().on_exchange(exchange(req=REQ + REQ, statuses=(404, 404), n_responses=2))[0]
    differ = {f for f in fast._fields if getattr(fast, f) != getattr(general, f)}
    assert differ == {"bytes_out", "user_agent", "head"}  # a share of the bytes; headers parsed


def test_transport_tcp_only_when_the_kernel_saw_tcp():
    s = stitcher()
    assert s.on_exchange(exchange(flags=CF_TCP))[0].transport == "tcp"  # tcp_sendmsg, no 4-tuple
    assert s.on_exchange(exchange(flags=CF_TUPLE, fd=8))[0].transport == "tcp"
    (unix,) = s.on_exchange(exchange(flags=0, fd=9))  # answered, and no tcp_sendmsg: not TCP
    assert unix.transport is None and unix.status == 404
    (multi,) = s.on_exchange(exchange(req=b"\x00\x01binary", resp=b"\x02ok", flags=0, fd=10))
    assert (multi.protocol, multi.transport) == ("tcp", None)  # a non-HTTP exchange, not on TCP
    assert s.on_exchange(exchange(flags=0, fd=11, answered=False, reason=END_CLOSE))[0].transport == "tcp"


def test_a_flushed_exchange_reported_again_by_the_kernel_is_dropped():
    s = stitcher()
    ex = exchange()
    assert len(s.on_flush(ex._replace(reason=END_FLUSH))) == 1
    assert s.on_flush(ex._replace(reason=END_FLUSH)) == []
    assert s.on_exchange(ex) == [] and s.duplicates == 1
    assert len(s.on_exchange(ex._replace(start_ns=5_000))) == 1  # the next exchange


def test_a_reported_quiet_exchange_is_due_without_parsing_it_again(monkeypatch):
    """Every flush tick asks about every quiet keep-alive connection: once one
    is reported, only a new send makes it worth parsing again."""
    from sitsprobe.stitch import exchange as mod

    s = stitcher()
    ex = exchange(reason=END_FLUSH, resp=b"HTTP/1.1 200 OK\r\n\r\n", statuses=(200,))  # no length
    assert s.due(ex, 3_000 + 600_000_000)  # idle past idle_flush
    assert len(s.on_flush(ex)) == 1
    monkeypatch.setattr(mod, "parse_response_head", lambda _b: pytest.fail("parsed again"))
    assert s.due(ex, 3_000 + 600_000_001)
    resumed = ex._replace(last_out_ns=10**9, bytes_out=ex.bytes_out + 10)  # sent more since
    with pytest.raises(pytest.fail.Exception):
        s.due(resumed, 10**9 + 1)
