"""Stitcher: kernel exchanges -> Requests through their protocol, without a kernel."""
from __future__ import annotations

import random

from sitsprobe.abi import CF_CLIENT
from sitsprobe.events import (CF_CHUNK_END, CF_MISSED, CF_TCP, CF_TUPLE, END_CLOSE, END_FLUSH,
                              END_NEXT, END_RESPONSE, Exchange)
from sitsprobe.events import Beat
from sitsprobe.export.semconv import span_attributes
from sitsprobe.request import CLIENT_CLOSED, Endpoint, Payload, Write
from sitsprobe.routes import RouteMapper
from sitsprobe.stitch.exchange import CALL_SETTLE_NS, Stitcher, enrich
from sitsprobe.stitch.protocols import http1, opaque, protocol_of

REQ = b"GET /v1/models/7?x=1 HTTP/1.1\r\nHost: a\r\nUser-Agent: t/1\r\n\r\n"
RESP = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
LOCAL, PEER = Endpoint("10.0.0.1", 8000), Endpoint("10.0.0.2", 41234)
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def exchange(req=REQ, resp=RESP, flags=CF_TUPLE | CF_TCP, answered=True, **kw) -> Exchange:
    fields = dict(tgid=42, fd=7, comm="vllm", reason=END_NEXT, start_ns=1_000, last_in_ns=1_500,
                  first_out_ns=2_000 if answered else 0, last_out_ns=3_000 if answered else 0,
                  bytes_in=len(req), bytes_out=len(resp) if answered else 0, flags=flags,
                  local=LOCAL if flags & CF_TUPLE else None, peer=PEER if flags & CF_TUPLE else None,
                  status=404 if answered else 0, pipeline=0,
                  req=req, resp=resp if answered else b"")
    return Exchange(**(fields | kw))


LATER = 10**12  # ns: a flush long after the exchanges here ended (CALL_SETTLE_NS)


def stitcher() -> Stitcher:
    return Stitcher(RouteMapper([], True, 500))


def test_one_request_fields():
    (r,) = stitcher().on_exchange(exchange())
    assert (r.pid, r.comm, r.fd, r.start_ns, r.end_ns, r.first_out_ns) == (42, "vllm", 7, 1_000, 3_000, 2_000)
    assert (r.method, r.target, r.path, r.route, r.status) == ("GET", "/v1/models/7?x=1", "/v1/models/7",
                                                                "/v1/models/{id}", 404)
    assert (r.bytes_in, r.bytes_out, r.local, r.peer) == (len(REQ), len(RESP), LOCAL, PEER)
    assert (r.protocol, r.transport, r.complete, r.head) == ("http/1.1", "tcp", True, REQ)
    assert (r.inference, r.gpu, r.user_agent, r.traceparent, r.partial) == (None,) * 5
    assert r.direction == "server"


def test_the_fast_path_agrees_with_the_general_one():
    """One request is built by position; the first of pipelined ones goes
    through the keyword path. Their fields must agree."""
    (fast,) = stitcher().on_exchange(exchange())
    (general,) = stitcher().on_exchange(exchange(req=REQ + REQ, reason=END_RESPONSE))
    differ = {f for f in fast._fields if getattr(fast, f) != getattr(general, f)}
    assert differ == {"user_agent", "head", "trace_headers"}  # headers parsed, nothing left to parse
    assert general.bytes_in == len(REQ)  # its own size, not the run's


def test_pipelined_responses_each_get_their_own_request_status_and_size():
    burst = REQ.replace(b"7?x=1", b"1") + REQ.replace(b"7?x=1", b"2") + REQ.replace(b"7?x=1", b"3")
    s = stitcher()
    out = []
    for i, status in enumerate((200, 404, 503)):
        resp = f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok".encode()
        out += s.on_exchange(exchange(req=burst[:110], resp=resp, status=status, pipeline=i,
                                      reason=END_RESPONSE if i < 2 else END_NEXT,
                                      first_out_ns=2_000 + i, last_out_ns=2_500 + i))
    assert [(r.path, r.status, r.end_ns) for r in out[:2]] == [("/v1/models/1", 200, 2_500),
                                                              ("/v1/models/2", 404, 2_501)]
    assert [r.bytes_in for r in out[:2]] == [len(REQ) - 4] * 2
    # the third head lay past the bytes captured: its status is known, its request is not
    third = out[2]
    assert (third.method, third.status, third.partial) == (None, 503, http1.HEAD_NOT_CAPTURED)
    assert third.start_ns == out[0].start_ns  # all arrived in one read


def test_a_response_whose_request_the_agent_missed_says_so():
    ex = exchange(req=b"", bytes_in=0, flags=CF_TUPLE | CF_MISSED, start_ns=2_000, last_in_ns=0)
    (r,) = stitcher().on_exchange(ex)
    assert (r.method, r.status, r.partial, r.bytes_in, r.start_ns) == (None, 404, "request_missed", 0, 2_000)
    assert r.complete and not r.is_error


def test_transport_tcp_only_when_the_kernel_saw_tcp():
    s = stitcher()
    assert s.on_exchange(exchange(flags=CF_TCP))[0].transport == "tcp"  # tcp_sendmsg, no 4-tuple
    assert s.on_exchange(exchange(flags=CF_TUPLE, fd=8))[0].transport == "tcp"
    (unix,) = s.on_exchange(exchange(flags=0, fd=9))  # answered, and no tcp_sendmsg: not TCP
    assert unix.transport is None and unix.status == 404
    (other,) = s.on_exchange(exchange(req=b"\x00\x01binary", resp=b"\x02ok", flags=0, fd=10, status=0))
    assert (other.protocol, other.transport) == ("unknown", None)
    assert s.on_exchange(exchange(flags=0, fd=11, answered=False, reason=END_CLOSE))[0].transport == "tcp"


def test_what_no_protocol_frames_is_named_for_what_it_looks_like():
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40
    app = b"\x17\x03\x03\x00\x45" + b"\x99" * 69
    preface = opaque.H2_PREFACE + b"\x00\x00\x06\x04\x00\x00\x00\x00\x00"
    headers = b"\x00\x00\x20\x01\x04\x00\x00\x00\x01" + b"\x88" * 32
    settings_ack = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
    cases = {
        "tls": [exchange(req=hello, resp=app, status=0), exchange(req=app, resp=app, status=0)],
        "http2": [exchange(req=preface, resp=settings_ack, status=0),
                  exchange(req=headers, resp=headers, status=0)],
        "unknown": [exchange(req=b"\x00\x01\x02", resp=b"\xff", status=0)],
    }
    for name, exchanges in cases.items():
        for ex in exchanges:
            (r,) = stitcher().on_exchange(ex)
            assert (r.protocol, r.method, r.status, r.complete) == (name, None, None, True), ex.req[:9]
    # a TLS connection's end is no error: without framing there is no telling
    closed = exchange(req=app, answered=False, reason=END_CLOSE, status=0)
    assert not stitcher().on_exchange(closed)[0].is_error


def test_websocket_frames_after_an_upgrade_are_named_websocket():
    """Frames as wsproto (a WebSocket implementation no one here wrote) makes
    them, each side as it must: the client's masked, the server's not; long
    lengths, control frames, a message compressed by permessage-deflate (RSV1)
    and a fragmented one, and a cut frame whose start is all there is."""
    from wsproto.extensions import PerMessageDeflate
    from wsproto.frame_protocol import FrameProtocol

    def sides(deflate: bool = False) -> tuple[FrameProtocol, FrameProtocol]:
        if not deflate:
            return FrameProtocol(client=True, extensions=[]), FrameProtocol(client=False, extensions=[])
        client, server = PerMessageDeflate(), PerMessageDeflate()
        server.accept(client.offer())  # what the handshake would agree
        return FrameProtocol(client=True, extensions=[client]), FrameProtocol(client=False, extensions=[server])

    c, s = sides()
    z, zs = sides(deflate=True)
    framed = [
        (c.send_data("hello"), s.send_data("echo:hello")),
        (c.send_data(b"x" * 300), s.send_data(b"y" * 70_000)),  # 16- and 64-bit lengths
        (c.ping(b"p") + c.send_data("a", fin=False) + c.send_data("b"), s.pong(b"p") + s.send_data("ab")),
        (c.close(1000, "bye"), s.close(1000)),
        (z.send_data("compress me " * 20), zs.send_data("and me " * 20)),
        (c.send_data(b"z" * 70_000)[:6], b""),  # the length cut short by the capture
        (b"", s.send_data("pushed")),  # the server speaking first
    ]
    for req, resp in framed:  # (wsproto makes bytearrays; the kernel's records are bytes)
        (r,) = stitcher().on_exchange(exchange(req=bytes(req), resp=bytes(resp), status=0))
        assert (r.protocol, r.method, r.complete) == ("websocket", None, True), (req[:8], resp[:8])
    wrong_way = [
        (s.send_data("hello"), s.send_data("x")),  # the client's frames unmasked
        (c.send_data("hello"), c.send_data("x")),  # the server's masked
        (b"\x83\x80\x00\x00\x00\x00", b"\x81\x00"),  # opcode 3 is reserved
        (b"\x89\xfe\x00\x80" + b"\x00" * 132, b"\x8a\x00"),  # a ping longer than 125 bytes
        (b"\x09\x80\x00\x00\x00\x00", b"\x8a\x00"),  # a ping in fragments
        (b"\xa1\x80\x00\x00\x00\x00", b"\x81\x00"),  # RSV2 with no extension for it
        (c.send_data("hello") + b"\x00\x01\x02", b"\x81\x00"),  # a second frame unmasked
    ]
    for req, resp in wrong_way:
        (r,) = stitcher().on_exchange(exchange(req=bytes(req), resp=bytes(resp), status=0))
        assert r.protocol == "unknown", (req[:8], resp[:8])
    rnd = random.Random(6455)  # any bytes at all: named, never raised on
    for _ in range(3000):
        req, resp = (bytes([rnd.choice((0x81, 0x82, 0x88, 0x01))]) + rnd.randbytes(rnd.randint(0, 40))
                     for _ in range(2))
        assert stitcher().on_exchange(exchange(req=req, resp=resp, status=0))[0].protocol in opaque.NAMES


def test_resp_is_framed_as_redis_commands():
    ex = exchange(req=b"*2\r\n$3\r\nget\r\n$1\r\nk\r\n", resp=b"$-1\r\n", status=0)
    (r,) = stitcher().on_exchange(ex)
    assert (r.protocol, r.method, r.status) == ("resp", "GET", None)


def test_a_response_is_due_only_when_its_framing_says_it_ended():
    s = stitcher()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    assert not s.due(exchange(resp=head, status=200, bytes_out=len(head) + 9), LATER)
    assert s.due(exchange(resp=head, status=200, bytes_out=len(head) + 10), LATER)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    assert not s.due(exchange(resp=chunked, status=200, bytes_out=10_000), LATER)  # a stream, paused
    assert s.due(exchange(resp=chunked, status=200, flags=CF_TUPLE | CF_CHUNK_END), LATER)
    # the terminator split over writes: not in the last one, but in the kept tail
    split_end = Payload(response_tail=b"data: x\n\n\r\n0\r\n\r\n")
    assert s.due(exchange(resp=chunked, status=200, payload=split_end), LATER)
    assert not s.due(exchange(resp=chunked, status=200, payload=Payload(response_tail=b"data: x\n\n\r\n")), LATER)
    close_delimited = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    assert not s.due(exchange(resp=close_delimited, status=200, bytes_out=10**9), LATER)
    assert s.due(exchange(resp=b"HTTP/1.1 204 No Content\r\n\r\n", status=204), LATER)
    assert s.due(exchange(req=b"HEAD / HTTP/1.1\r\n\r\n", resp=head, status=200), LATER)
    assert not s.due(exchange(resp=b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Le", status=200), LATER)
    assert not s.due(exchange(resp=b"HTTP/1.1 101 Switching\r\n\r\n", status=101), LATER)


def test_a_response_before_its_requests_body_waits_for_the_body():
    """A server that answers an upload from its head reads the body after,
    as the client sends it: the exchange is not due until then, whatever
    the response's framing says."""
    s = stitcher()
    head = b"PUT /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    answer = b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope\n"
    assert not s.due(exchange(req=head, resp=answer, bytes_in=len(head)), LATER)
    assert not s.due(exchange(req=head + b"y" * 60, resp=answer, bytes_in=len(head) + 99), LATER)
    assert s.due(exchange(req=head + b"y" * 60, resp=answer, bytes_in=len(head) + 100), LATER)
    # no length to wait for: a chunked body, or a head longer than the bytes kept
    chunked = b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert s.due(exchange(req=chunked, resp=answer, bytes_in=len(chunked)), LATER)
    assert s.due(exchange(req=head[:30], resp=answer, bytes_in=30), LATER)
    # pipelined: the exchange's bytes are its and the others' (the kernel's END_RESPONSE tells)
    assert s.due(exchange(req=head, resp=answer, bytes_in=len(head), pipeline=1), LATER)


def test_a_call_is_due_only_once_it_has_been_quiet_a_while():
    """A call flushed at once could come before the call it followed on its
    connection, whose record the ring still holds back (CALL_SETTLE_NS)."""
    s = stitcher()
    call = exchange(flags=CF_TUPLE | CF_TCP | CF_CLIENT, last_out_ns=3_000)
    assert not s.due(call, 3_000 + CALL_SETTLE_NS - 1)
    assert s.due(call, 3_000 + CALL_SETTLE_NS)
    assert s.due(call._replace(flags=CF_TUPLE | CF_TCP), 3_000)  # a server's answer: at once


def test_an_answer_the_close_cut_short_of_its_framing_says_so():
    s = stitcher()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"

    def seen(**kw):
        r = s.on_exchange(exchange(status=200, reason=END_CLOSE, **kw))[0]
        return r.complete, r.partial
    assert seen(resp=head, bytes_out=len(head) + 4) == (False, http1.RESPONSE_CUT_OFF)
    assert seen(resp=head, bytes_out=len(head) + 10) == (True, None)
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert seen(resp=chunked, flags=CF_TUPLE | CF_CHUNK_END) == (True, None)
    assert seen(resp=chunked) == (True, None)  # no tail kept: not known
    # the tail shows the terminator, also when it came in writes of its own
    assert seen(resp=chunked, payload=Payload(response_tail=b'data: [DONE]\n\n\r\n0\r\n\r\n')) == (True, None)
    assert seen(resp=chunked, payload=Payload(response_tail=b'data: {"cho')) == (False, http1.RESPONSE_CUT_OFF)
    close_delimited = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    assert seen(resp=close_delimited, bytes_out=10) == (True, None)  # the close is its end
    # a head longer than the kernel keeps in resp: read from the payload's first write
    long_head = b"HTTP/1.1 200 OK\r\nx-pad: " + b"p" * 400 + b"\r\nContent-Length: 10\r\n\r\n"
    first = Payload(writes=(Write(2_000, len(long_head) + 4, long_head + b"abcd"),))
    assert seen(resp=long_head[:256], payload=first, bytes_out=len(long_head) + 4) == (False, http1.RESPONSE_CUT_OFF)
    assert seen(resp=long_head[:256], bytes_out=len(long_head) + 4) == (True, None)  # no payload: not known
    # pipelined, the general path: the same
    two = REQ + REQ
    assert s.on_exchange(exchange(req=two, resp=head, status=200, reason=END_CLOSE, pipeline=1,
                                  bytes_out=len(head)))[0].partial == http1.RESPONSE_CUT_OFF


def test_an_answer_cut_short_after_its_client_hung_up_is_the_client_s_doing():
    """conn.peer_ended: the client ended its side before the server closed (a
    stop button). A server's answer cut short then is client_closed, no
    error of the server's: error.type client_closed, no error status, not
    kept by the sampler as an error. A call whose server ended its side is
    cut off as before: the call failed."""
    s = stitcher()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    cut = dict(status=200, reason=END_CLOSE, resp=head, bytes_out=len(head) + 4)

    def seen(**kw):
        r = s.on_exchange(exchange(**(cut | kw)))[0]
        return r.complete, r.partial, r.is_error, span_attributes(r).get("error.type")
    assert seen(peer_ended=1) == (False, CLIENT_CLOSED, False, "client_closed")
    assert seen() == (False, http1.RESPONSE_CUT_OFF, True, "incomplete")  # the server's abort
    assert seen(peer_ended=1, bytes_out=len(head) + 10) == (True, None, False, None)  # whole, whoever closed
    assert seen(peer_ended=1, flags=CF_TUPLE | CF_TCP | CF_CLIENT) == (False, http1.RESPONSE_CUT_OFF, True, "incomplete")
    r = s.on_exchange(exchange(peer_ended=1, **cut))[0]
    assert span_attributes(r)["http.request.size"] == r.bytes_in  # the request was whole
    # an answer only the close ends (HTTP/1.0's stream): ended by the server's close, cut by the client's
    by_close = cut | dict(resp=b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", bytes_out=90)
    assert seen(**by_close) == (True, None, False, None)
    assert seen(peer_ended=1, **by_close)[:2] == (False, CLIENT_CLOSED)
    connect = by_close | dict(req=b"CONNECT api.example:443 HTTP/1.1\r\n\r\n", resp=b"HTTP/1.1 200 OK\r\n\r\n")
    assert seen(peer_ended=1, **connect)[:2] == (True, None)  # a tunnel the client ends


def test_a_flushed_exchange_reported_again_by_the_kernel_is_dropped():
    s = stitcher()
    ex = exchange()
    assert s.due(ex, LATER)
    assert len(s.on_flush(ex._replace(reason=END_FLUSH))) == 1
    assert not s.due(ex, LATER) and s.on_flush(ex._replace(reason=END_FLUSH)) == []
    assert s.on_exchange(ex) == [] and s.duplicates == 1
    assert len(s.on_exchange(ex._replace(start_ns=5_000))) == 1  # the next exchange
    assert len(s.on_exchange(ex._replace(pipeline=1))) == 1  # the next pipelined response


def test_open_at_stop_is_incomplete_unless_its_framing_ended():
    s = stitcher()
    streaming = exchange(resp=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", status=200,
                         reason=END_FLUSH)
    assert s.on_flush(streaming, final=True)[0].complete is False
    assert s.on_flush(exchange(reason=END_FLUSH, fd=8), final=True)[0].complete is True


def test_enrich_takes_the_trace_context_the_kernel_found_past_the_head():
    (r,) = stitcher().on_exchange(exchange(traceparent=b" " + TP.encode() + b"\r\nx-more: 1",
                                           tracestate=b"vendor=abc,other=x\r\n"))
    e = enrich(r)
    assert (e.traceparent.span_id, e.tracestate) == (0xB7AD6B7169203331, "vendor=abc,other=x")
    assert (e.head, e.trace_headers) == (b"", None)  # the captured bytes never travel further
    # a tracestate cut before its line end keeps only its whole members
    (cut,) = stitcher().on_exchange(exchange(traceparent=TP.encode(), tracestate=b"a=1,b=2,c=3-cut-h"))
    assert enrich(cut).tracestate == "a=1,b=2"


def test_an_http_1_0_request_says_its_version():
    for version in ("1.0", "1.1"):
        (r,) = stitcher().on_exchange(exchange(req=f"GET /v1/x HTTP/{version}\r\nHost: a\r\n\r\n".encode()))
        a = span_attributes(enrich(r))
        assert (a["network.protocol.name"], a["network.protocol.version"], a["url.path"]) == \
            ("http", version, "/v1/x")


def test_the_heads_own_trace_context_comes_first():
    req = f"GET / HTTP/1.1\r\ntraceparent: {TP}\r\ntracestate: k=v\r\n\r\n".encode()
    (r,) = stitcher().on_exchange(exchange(req=req))
    e = enrich(r)
    assert (e.traceparent.trace_id, e.tracestate) == (0x0AF7651916CD43DD8448EB211C80319C, "k=v")


def test_the_traceparent_is_known_before_enrich_on_either_path():
    """The joiner reads it (stitch.join): in the head, in any letter case,
    not in the body; else the kernel's copy of one past the head."""
    in_head = f"GET / HTTP/1.1\r\nHost: a\r\nTraceParent:  {TP}\r\n\r\n".encode()
    in_body = f"POST / HTTP/1.1\r\nContent-Length: 70\r\n\r\n\ntraceparent: {TP}".encode()
    for req in (in_head, in_head + in_head):  # one request (by position), pipelined ones (by keyword)
        (r, *_) = stitcher().on_exchange(exchange(req=req, reason=END_RESPONSE if req != in_head else END_NEXT))
        assert r.traceparent is not None and r.traceparent.span_id == 0xB7AD6B7169203331
    (r,) = stitcher().on_exchange(exchange(req=in_body))
    assert r.traceparent is None
    for req in (REQ, REQ + REQ):
        (r, *_) = stitcher().on_exchange(exchange(req=req, traceparent=b" " + TP.encode() + b"\r\nx: 1",
                                                  reason=END_RESPONSE if req != REQ else END_NEXT))
        assert r.traceparent is not None and r.traceparent.trace_id == 0x0AF7651916CD43DD8448EB211C80319C


def test_enrich_redacts_every_query_value_but_those_kept():
    (r,) = stitcher().on_exchange(exchange(req=b"GET /v1/x?api_key=SECRET&token=SECRET2&model=m HTTP/1.1\r\n\r\n"))
    assert enrich(r).target == "/v1/x?api_key=REDACTED&token=REDACTED&model=REDACTED"
    kept = enrich(r, keep_query=frozenset({"model"})).target
    assert kept == "/v1/x?api_key=REDACTED&token=REDACTED&model=m"
    assert "SECRET" not in repr(enrich(r))


def test_protocols_are_asked_in_order():
    assert protocol_of(exchange()) is http1
    assert protocol_of(exchange(req=b"\x16\x03\x01\x00\x10", status=0)) is opaque


def test_a_resp_exchange_is_due_once_every_command_has_its_whole_reply():
    s = stitcher()
    two = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n"
    assert s.due(exchange(req=two, resp=b"$1\r\nx\r\n$-1\r\n", status=0), LATER)
    assert not s.due(exchange(req=two, resp=b"$1\r\nx\r\n", status=0), LATER)  # one reply still to come
    assert not s.due(exchange(req=two, resp=b"$5\r\nxy", status=0), LATER)  # a reply cut
    big = exchange(req=two, resp=b"$1\r\nx\r\n$-1\r\n", status=0, bytes_out=10_000)
    assert not s.due(big, LATER)  # more was sent than captured: cannot tell


def test_a_posts_writes_join_its_exchange_and_it_is_due_once_all_are_in():
    s = Stitcher(RouteMapper([], True, 500), writes_per_exchange=2)
    post = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"
    ex = exchange(req=post, resp=head, status=200, bytes_out=len(head) + 4,
                  payload=Payload(writes_total=3))
    s.on_beat(Beat(ex.key, Write(2_000, len(head), head)))
    assert not s.due(ex, LATER)  # its framing ended, but the second write's event is still on its way
    s.on_beat(Beat(ex.key, Write(2_500, 4, b"ok!!")))
    assert s.due(ex, LATER)  # the kernel reports the first two writes one by one: both are in
    (r,) = s.on_flush(ex)
    assert [w.ts_ns for w in r.payload.writes] == [2_000, 2_500]
    assert s.on_exchange(ex) == []  # the kernel's own report, dropped; no writes held for it
    s.on_beat(Beat((1, 2, 3, 0), Write(1, 1, b"x")))
    s.forget(1)  # a process that exited takes its waiting writes with it
    assert s.on_exchange(exchange(tgid=1, fd=2, start_ns=3, payload=Payload()))[0].payload.writes == ()


def test_writes_past_what_the_stitcher_holds_are_counted_not_kept():
    s = Stitcher(RouteMapper([], True, 500), max_writes=2)
    for i in range(5):
        s.on_beat(Beat((1, 2, 3, 0), Write(i, 1, b"x")))
    assert s.writes_dropped == 3
    (r,) = s.on_exchange(exchange(tgid=1, fd=2, start_ns=3, payload=Payload(writes_total=5)))
    assert len(r.payload.writes) == 2


def test_a_first_writes_more_peeks_go_on_its_peek_where_they_follow_on():
    """A response's first write longer than its peek (its head and first
    event together) comes with more of its peek after it, each from where the
    last ended (bpf/net.c send_more): one write, its peek their sum. A piece
    that does not follow on (one before it was lost) is not put on, nor is
    one with no write before it; none counts as a write."""
    s = Stitcher(RouteMapper([], True, 500))
    whole = bytes(range(256)) * 4
    key = (1, 2, 3, 0)
    s.on_beat(Beat(key, Write(1_000, 5_000, whole[:256], 4, 0, 4096)))
    s.on_beat(Beat(key, Write(1_000, 5_000, whole[256:512]), 256))
    s.on_beat(Beat(key, Write(1_000, 5_000, whole[768:1024]), 768))  # 512's was lost
    s.on_beat(Beat((9, 9, 9, 0), Write(1_000, 5_000, b"alone"), 256))
    s.on_beat(Beat(key, Write(2_000, 10, b"0123456789")))
    (r,) = s.on_exchange(exchange(tgid=1, fd=2, start_ns=3, payload=Payload(writes_total=2)))
    assert r.payload.writes == (Write(1_000, 5_000, whole[:512], 4, 0, 4096), Write(2_000, 10, b"0123456789"))
    (r,) = s.on_exchange(exchange(tgid=9, fd=9, start_ns=9, payload=Payload(writes_total=0)))
    assert r.payload.writes == ()
