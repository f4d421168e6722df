"""HTTP/2 streams rebuilt from genuine byte streams: an h2 client and server
talk in memory, each flush of one side's output is one syscall's chunk, and
the module must give back what was sent, or nothing, never something else."""
from __future__ import annotations

import random
import struct

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived
from h2.settings import SettingCodes
from hpack import Encoder

from sitsprobe.stitch.protocols import http2
from sitsprobe.stitch.protocols.http2 import PREFACE, Connection, grpc_method, looks_like_h2

MS = 1_000_000
GRPC = "application/grpc"


def msg(payload: bytes) -> bytes:
    """A gRPC length-prefixed message."""
    return b"\0" + len(payload).to_bytes(4, "big") + payload


def req(path, method="GET", authority="example.com", **extra):
    return [(":method", method), (":scheme", "https"), (":authority", authority),
            (":path", path), *[(k.replace("_", "-"), v) for k, v in extra.items()]]


class Wire:
    """An h2 client and server in memory. `flush` moves one side's pending
    bytes to the other as one chunk at a timestamp; `log` keeps the chunks."""

    def __init__(self, client=None, server=None):
        self.c = H2Connection(H2Configuration(client_side=True))
        self.s = H2Connection(H2Configuration(client_side=False))
        self.ts, self.log, self.ack = 0, [], True
        self.c.initiate_connection()
        self.s.initiate_connection()
        if client:
            self.c.update_settings(client)
        if server:
            self.s.update_settings(server)
        self.settle()

    def flush(self, who: str, dt: int = 1000) -> int:
        """Sends what `who` ("c" or "s") has pending as one chunk; its ts."""
        src, dst = (self.c, self.s) if who == "c" else (self.s, self.c)
        data = src.data_to_send()
        if data:
            self.ts += dt
            self.log.append((self.ts, who, data))
            for ev in dst.receive_data(data):
                if self.ack and isinstance(ev, DataReceived) and ev.flow_controlled_length:
                    dst.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        return self.ts

    def settle(self) -> None:
        """Both sides flush in turn until neither has anything to say."""
        while True:
            n = len(self.log)
            self.flush("c")
            self.flush("s")
            if len(self.log) == n:
                return

    def chunks(self, side: str):
        """(ts, direction, data) as the traced side's syscalls see them."""
        for ts, who, data in self.log:
            yield ts, "in" if (who == "c") == (side == "server") else "out", data


def feed(w: Wire, side: str = "server", started: bool = True, copied=None) -> Connection:
    """A Connection fed every chunk of w; copied: {chunk index: bytes copied}."""
    conn = Connection(side, started)
    for i, (ts, d, data) in enumerate(w.chunks(side)):
        n = (copied or {}).get(i, len(data))
        conn.feed(ts, d, data[:n], len(data))
    return conn


def by_id(conn: Connection) -> dict:
    return {s.stream_id: s for s in conn.finished()}


def interleaved() -> tuple[Wire, dict]:
    """Three concurrent streams, answered out of order; and their chunks' times."""
    w, t = Wire(), {}
    w.c.send_headers(1, req("/a?x=1", user_agent="probe/1.0",
                            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                            tracestate="vendor=opaque"), end_stream=True)
    t["req1"] = w.flush("c")
    w.c.send_headers(3, req("/b", "POST", content_type="application/json"))
    w.c.send_data(3, b"x" * 600)
    t["req3"] = w.flush("c")
    w.c.send_headers(5, req("/c", "DELETE", authority="other.example"), end_stream=True)
    t["req5"] = w.flush("c")
    w.s.send_headers(5, [(":status", "404")], end_stream=True)
    t["resp5"] = w.flush("s")
    w.s.send_headers(1, [(":status", "200"), ("content-type", "text/plain")])
    w.s.send_data(1, b"y" * 200)
    t["resp1"] = w.flush("s")
    w.c.send_data(3, b"x" * 400, end_stream=True)
    w.flush("c")
    w.s.send_data(1, b"y" * 100, end_stream=True)
    w.s.send_headers(3, [(":status", "201")])
    t["end1"] = t["resp3"] = w.flush("s")
    w.s.send_data(3, b"ok", end_stream=True)
    t["end3s"] = w.flush("s", dt=7 * MS)
    return w, t


@pytest.mark.parametrize("side", ["server", "client"])
def test_interleaved_streams_every_field(side):
    w, t = interleaved()
    conn = feed(w, side)
    got = by_id(conn)
    assert list(got) == [5, 1, 3]  # the order they finished
    s1, s3, s5 = got[1], got[3], got[5]
    assert (s1.method, s1.path, s1.authority) == ("GET", "/a?x=1", "example.com")
    assert s1.scheme == "https"
    assert s1.status == 200
    assert (s1.user_agent, s1.tracestate) == ("probe/1.0", "vendor=opaque")
    assert s1.traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert (s1.start_ns, s1.first_response_ns, s1.end_ns) == (t["req1"], t["resp1"], t["end1"])
    assert (s1.request_bytes, s1.response_bytes, s1.content_type) == (0, 300, "text/plain")
    assert (s3.method, s3.path, s3.status) == ("POST", "/b", 201)
    assert s3.content_type == "application/json"
    assert (s3.request_bytes, s3.response_bytes) == (1000, 2)
    assert (s3.start_ns, s3.first_response_ns, s3.end_ns) == (t["req3"], t["resp3"], t["end3s"])
    assert (s5.method, s5.path, s5.authority, s5.status) == ("DELETE", "/c", "other.example", 404)
    assert s5.first_response_ns == s5.end_ns == t["resp5"]
    for s in (s1, s3, s5):
        assert s.complete and s.partial is None and s.reset_code is None
        assert s.flow_control_wait_ns == 0
        assert s.request_messages is s.response_messages is s.grpc_status is None
    assert conn.partial is None and conn.frame_errors == 0 and conn.skipped_bytes == 0
    assert conn.frames["HEADERS"] == (3, 3)
    assert sum(conn.frames["SETTINGS"]) == 4  # two and their ACKs


GRPC_REQ = req("/helloworld.Greeter/SayHello", "POST", content_type=GRPC, te="trailers")


def grpc_wire():
    w = Wire()
    w.c.send_headers(1, GRPC_REQ)
    w.c.send_data(1, msg(b"hi"), end_stream=True)
    w.flush("c")
    w.s.send_headers(1, [(":status", "200"), ("content-type", GRPC)])
    w.s.send_data(1, msg(b"hello"))
    w.s.send_headers(1, [("grpc-status", "0")], end_stream=True)
    w.flush("s")
    # server streaming: five messages, prefixes cut across DATA frames, several in one
    w.c.send_headers(3, req("/routes.Guide/ListFeatures", "POST", content_type=GRPC + "+proto"))
    w.c.send_data(3, msg(b"area"), end_stream=True)
    w.flush("c")
    w.s.send_headers(3, [(":status", "200"), ("content-type", GRPC + "+proto")])
    body = b"".join(msg(bytes([65 + i]) * (i * 7)) for i in range(5))
    for a, b in ((0, 3), (3, 9), (9, 40), (40, len(body))):
        w.s.send_data(3, body[a:b])
        w.flush("s")
    w.s.send_headers(3, [("grpc-status", "5"), ("grpc-message", "feature " + "x" * 200)],
                     end_stream=True)
    w.flush("s")
    # trailers-only: the error in the one HEADERS
    w.c.send_headers(5, req("/routes.Guide/Nope", "POST", content_type=GRPC), end_stream=True)
    w.flush("c")
    w.s.send_headers(5, [(":status", "200"), ("content-type", GRPC), ("grpc-status", "12"),
                         ("grpc-message", "unimplemented")], end_stream=True)
    w.flush("s")
    return w


@pytest.mark.parametrize("side", ["server", "client"])
def test_grpc_unary_streaming_and_trailers_only(side):
    got = by_id(feed(grpc_wire(), side))
    unary, stream, only = got[1], got[3], got[5]
    assert grpc_method(unary.path) == "helloworld.Greeter/SayHello"
    assert (unary.request_messages, unary.response_messages) == (1, 1)
    assert (unary.grpc_status, unary.grpc_message, unary.status) == (0, None, 200)
    assert (stream.request_messages, stream.response_messages, stream.grpc_status) == (1, 5, 5)
    assert stream.grpc_message == ("feature " + "x" * 200)[:128]
    assert stream.response_bytes == sum(5 + i * 7 for i in range(5))
    assert (only.status, only.grpc_status, only.grpc_message) == (200, 12, "unimplemented")
    assert (only.request_messages, only.response_messages, only.content_type) == (0, 0, GRPC)
    assert all(s.complete and s.partial is None for s in got.values())


def many_streams(w: Wire, first: int, n: int, sizes=()) -> dict:
    """n requests with repeated custom headers (HPACK indexes them); truth by id.
    sizes: {stream number: header table size the server asks for before it}."""
    truth = {}
    for k in range(n):
        sid = first + 2 * k
        if k in dict(sizes):
            w.s.update_settings({SettingCodes.HEADER_TABLE_SIZE: dict(sizes)[k]})
            w.settle()
        path = f"/items/{k % 5}"
        w.c.send_headers(sid, req(path, "PUT" if k % 3 else "GET", user_agent="bench/2",
                                  x_tenant="acme-corp", x_request_id=f"r{k}"), end_stream=True)
        w.flush("c")
        status = 200 + k % 3
        w.s.send_headers(sid, [(":status", str(status)), ("server", "h2-test"),
                               ("x-tenant", "acme-corp")], end_stream=True)
        w.flush("s")
        truth[sid] = ("PUT" if k % 3 else "GET", path, status)
    return truth


@pytest.mark.parametrize("side", ["server", "client"])
def test_hpack_dynamic_table_and_its_size_changes(side):
    w = Wire()
    truth = many_streams(w, 1, 40, sizes=((10, 65536), (25, 256)))
    assert w.c.encoder.header_table.dynamic_entries  # the repeats went by reference
    w.c.update_settings({SettingCodes.HEADER_TABLE_SIZE: 0})  # the client's decoder: no table
    w.settle()
    truth |= many_streams(w, 81, 5)
    conn = feed(w, side)
    got = by_id(conn)
    assert {sid: (s.method, s.path, s.status) for sid, s in got.items()} == truth
    assert all(s.user_agent == "bench/2" and s.partial is None for s in got.values())
    assert conn.partial is None and conn.headers_undecoded == 0


def test_started_late_never_attributes_wrong_headers():
    w = Wire()
    truth = many_streams(w, 1, 6)
    w.c.send_headers(13, req("/in-flight", "GET", user_agent="bench/2"), end_stream=True)
    w.flush("c")
    cut = len(w.log)  # the watch starts inside the chunk before: 13's request
    w.s.send_headers(13, [(":status", "200")])
    w.flush("s")
    # a request whose every header is static or new: decodable without the past
    w.c.send_headers(15, [(":method", "GET"), (":scheme", "https"),
                          (":authority", "fresh.example"), (":path", "/fresh")], end_stream=True)
    w.flush("c")
    w.s.send_headers(15, [(":status", "206")], end_stream=True)
    w.flush("s")
    w.s.send_data(13, b"late", end_stream=True)
    w.flush("s")
    truth[15] = ("GET", "/fresh", 206)
    truth |= many_streams(w, 17, 4)  # these refer to what was indexed before the cut
    for side in ("server", "client"):
        conn = Connection(side, started=False)
        chunks = list(w.chunks(side))[cut - 1:]
        ts, d, data = chunks[0]
        conn.feed(ts, d, data[5:], len(data) - 5)  # starts inside a frame: skipped
        for ts, d, data in chunks[1:]:
            conn.feed(ts, d, data, len(data))
        conn.close(w.ts + 1)
        got = by_id(conn)
        assert 13 not in got  # its request was not seen
        fresh = got[15]
        assert (fresh.method, fresh.path, fresh.status) == ("GET", "/fresh", 206)
        assert fresh.partial is None
        for sid in range(17, 25, 2):
            s = got[sid]
            assert s.method is None and s.path is None and s.partial == "headers_not_decoded"
        for sid, s in got.items():
            m, p, st = truth[sid]
            assert s.method in (None, m) and s.path in (None, p) and s.status in (None, st)
        assert conn.partial == "connection_start_missed" and conn.skipped_bytes > 0


def big_frames_wire():
    """A gRPC connection whose DATA frames may be 1 MiB: what the kernel copies of them
    is the start only."""
    big = {SettingCodes.MAX_FRAME_SIZE: 1 << 20, SettingCodes.INITIAL_WINDOW_SIZE: 1 << 21}
    w = Wire(client=big, server=big)
    w.c.increment_flow_control_window(1 << 22)
    w.s.increment_flow_control_window(1 << 22)
    w.settle()
    for sid, body in ((1, msg(b"a" * 200_000) + msg(b"tail")), (3, msg(b"b" * 300_000))):
        w.c.send_headers(sid, GRPC_REQ)
        w.c.send_data(sid, msg(b"q"), end_stream=True)
        w.flush("c")
        w.s.send_headers(sid, [(":status", "200"), ("content-type", GRPC)])
        w.flush("s")
        w.s.send_data(sid, body)
        w.flush("s")
        w.s.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        w.flush("s")
    return w


@pytest.mark.parametrize("side", ["server", "client"])
def test_gap_inside_data_is_skipped(side):
    """Not skipped, the next chunks would be read as the rest of the big frame."""
    w = big_frames_wire()
    bodies = [i for i, (_, who, d) in enumerate(w.log) if who == "s" and len(d) > 100_000]
    conn = feed(w, side, copied={i: 4096 for i in bodies})
    got = by_id(conn)
    assert got[1].response_bytes == 200_005 + 9 and got[3].response_bytes == 300_005
    assert got[1].response_messages is None  # the second prefix was in the gap
    assert got[3].response_messages == 1  # the gap was all message body
    assert got[1].grpc_status == got[3].grpc_status == 0  # the trailers after the gap
    assert all(s.complete and s.partial is None for s in got.values())
    assert conn.partial is None and conn.skipped_bytes == 0


def test_gap_in_padding_is_skipped():
    w = Wire()
    w.c.send_headers(1, GRPC_REQ, end_stream=True)
    w.flush("c")
    w.s.send_headers(1, [(":status", "200"), ("content-type", GRPC)])
    w.s.send_data(1, msg(b"abc"), pad_length=200)
    w.flush("s")
    w.s.send_headers(1, [("grpc-status", "0")], end_stream=True)
    w.flush("s")
    body = len(w.log) - 2
    conn = feed(w, copied={body: len(w.log[body][2]) - 150})
    s = by_id(conn)[1]
    assert (s.response_bytes, s.response_messages, s.grpc_status, s.complete) == (8, 1, 0, True)
    assert conn.partial is None


def test_gap_in_headers_loses_that_direction_and_nothing_is_made_up():
    w = Wire()
    w.c.send_headers(1, req("/one"), end_stream=True)
    w.flush("c")
    w.c.send_headers(3, req("/two", x_long="v" * 300), end_stream=True)
    lost = len(w.log)
    w.flush("c")
    w.c.send_headers(5, req("/three"), end_stream=True)
    w.flush("c")
    for sid in (1, 3, 5):
        w.s.send_headers(sid, [(":status", "200")], end_stream=True)
        w.flush("s")
    conn = feed(w, "server", copied={lost: 20})
    conn.close(w.ts + 1)
    got = by_id(conn)
    assert list(got) == [1]  # the only request seen; answered, it finished
    assert (got[1].path, got[1].status, got[1].complete) == ("/one", 200, True)
    assert got[1].partial is None  # it had sent all it had to
    assert conn.partial == "bytes_not_captured"
    assert conn.skipped_bytes == sum(len(d) for _, who, d in w.log[lost:] if who == "c") - 20


@pytest.mark.parametrize("side", ["server", "client"])
def test_flow_control_wait(side):
    """The traced side sends until the peer's window is used up; the peer's
    WINDOW_UPDATE 50 ms later ends the wait."""
    small = {SettingCodes.INITIAL_WINDOW_SIZE: 1000}
    w = Wire(client=small) if side == "server" else Wire(server=small)
    w.ack = False  # no WINDOW_UPDATE but the one the test sends
    sender, receiver = (w.s, w.c) if side == "server" else (w.c, w.s)
    me, peer = ("s", "c") if side == "server" else ("c", "s")
    w.c.send_headers(1, req("/upload", "POST"), end_stream=side == "server")
    w.flush("c")
    if side == "server":
        w.s.send_headers(1, [(":status", "200")])
    sender.send_data(1, b"z" * 1000)
    blocked = w.flush(me)
    receiver.increment_flow_control_window(5000, stream_id=1)
    opened = w.flush(peer, dt=50 * MS)
    sender.send_data(1, b"z" * 2000, end_stream=True)
    w.flush(me)
    if side == "client":
        w.s.send_headers(1, [(":status", "200")], end_stream=True)
        w.flush("s")
    conn = feed(w, side)
    s = by_id(conn)[1]
    assert opened - blocked == 50 * MS  # nothing else came between
    assert s.flow_control_wait_ns == 50 * MS
    assert conn.window_updates_in >= 1
    assert (s.request_bytes if side == "client" else s.response_bytes) == 3000


def test_rst_stream_goaway_and_close():
    w = Wire()
    for sid in (1, 3, 5, 7):
        w.c.send_headers(sid, req(f"/s{sid}"), end_stream=True)
    w.flush("c")
    w.s.send_headers(1, [(":status", "200")])
    w.flush("s")
    w.c.reset_stream(1, 8)  # CANCEL
    w.flush("c")
    w.s.close_connection(error_code=11, last_stream_id=3)  # ENHANCE_YOUR_CALM
    w.flush("s")
    conn = feed(w)
    got = by_id(conn)
    assert list(got) == [1, 5, 7]
    assert (got[1].reset_code, got[1].status, got[1].complete, got[1].partial) == (8, 200, False, "client_closed")
    assert got[5].reset_code == got[7].reset_code == 11 and got[5].partial is None  # the server's GOAWAY
    assert conn.goaway == (3, 11)
    conn.close(w.ts + 5)
    (s3,) = conn.finished()
    assert (s3.stream_id, s3.complete, s3.path, s3.reset_code) == (3, False, "/s3", None)
    assert conn.finished() == []


def test_a_reset_is_the_client_closing_only_when_a_server_s_client_sends_it():
    """RST_STREAM from a server's client before the answer ended: client_closed
    (a cancelled call: no error of the server's). The same frames seen by the
    client that sent them, and a reset the server sends, are not."""
    w = Wire()
    for sid in (1, 3):
        w.c.send_headers(sid, req(f"/s{sid}"), end_stream=True)
    w.flush("c")
    for sid in (1, 3):
        w.s.send_headers(sid, [(":status", "200")])
    w.flush("s")
    w.c.reset_stream(1, 8)  # CANCEL
    w.flush("c")
    w.s.reset_stream(3, 2)  # INTERNAL_ERROR: the server gives up
    w.flush("s")
    server, client = by_id(feed(w)), by_id(feed(w, side="client"))
    assert [(s.reset_code, s.complete, s.partial) for s in (server[1], server[3])] == \
        [(8, False, "client_closed"), (2, False, None)]
    assert [client[1].partial, client[3].partial] == [None, None]


def test_push_promise_is_decoded_but_not_a_request():
    w = Wire()
    w.c.send_headers(1, req("/page", user_agent="browser"), end_stream=True)
    w.flush("c")
    w.s.push_stream(1, 2, req("/style.css", user_agent="browser", x_cache="hit"))
    w.s.send_headers(2, [(":status", "200"), ("content-type", "text/css")])
    w.s.send_data(2, b"body{}", end_stream=True)
    w.s.send_headers(1, [(":status", "200"), ("content-type", "text/css")], end_stream=True)
    w.flush("s")
    w.c.send_headers(3, req("/style.css", user_agent="browser"), end_stream=True)
    w.flush("c")
    w.s.send_headers(3, [(":status", "304"), ("content-type", "text/css"), ("x-cache", "hit")],
                     end_stream=True)  # x-cache: a reference to what the promise indexed
    w.flush("s")
    conn = feed(w)
    got = by_id(conn)
    assert sorted(got) == [1, 3]
    assert (got[3].path, got[3].status, got[3].content_type) == ("/style.css", 304, "text/css")
    assert got[3].partial is None
    assert conn.frames["PUSH_PROMISE"] == (0, 1) and conn.partial is None


def frame(t: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([t, flags]) + sid.to_bytes(4, "big") + payload


def hostile(*frames: bytes, max_frame: int = 0xFFFFFF) -> Connection:
    """A traced server that announced it accepts frames up to ``max_frame``
    long, then read these frames, after the preface, in one chunk."""
    conn = Connection("server")
    settings = frame(4, 0, 0, struct.pack(">HI", 5, max_frame))
    conn.feed(0, "out", settings, len(settings))
    data = PREFACE + b"".join(frames)
    conn.feed(1, "in", data, len(data))
    return conn


def test_padded_priority_headers_and_split_header_blocks():
    enc = Encoder()
    block = enc.encode(req("/hand/made", "PATCH"))
    payload = bytes([3]) + b"\x80\0\0\x01\x10" + block[:5]  # pad length, priority, fragment
    conn = Connection("server")
    data = PREFACE + frame(1, 0x8 | 0x20, 1, payload + b"\0\0\0") + frame(9, 0x4, 1, block[5:])
    for i in range(len(data)):  # one byte a chunk
        conn.feed(i, "in", data[i:i + 1], 1)
    resp = Encoder().encode([(":status", "204")])
    conn.feed(999, "out", frame(1, 0x5, 1, resp), 9 + len(resp))
    conn.feed(1000, "in", frame(0, 0x1, 1), 9)
    (s,) = conn.finished()
    assert (s.method, s.path, s.status, s.complete) == ("PATCH", "/hand/made", 204, True)
    assert conn.frame_errors == 0


def test_gap_in_header_padding_is_skipped():
    block = Encoder().encode(req("/padded"))
    data = PREFACE + frame(1, 0x8 | 0x5, 1, bytes([100]) + block + bytes(100))
    conn = Connection("server")
    conn.feed(1, "in", data[:-60], len(data))  # the 60 bytes not copied are padding
    resp = Encoder().encode([(":status", "200")])
    conn.feed(2, "out", frame(1, 0x5, 1, resp), 9 + len(resp))
    (s,) = conn.finished()
    assert (s.path, s.status, s.complete) == ("/padded", 200, True) and conn.partial is None


def test_hostile_frames_are_counted_and_survived():
    enc = Encoder()
    ok = enc.encode(req("/ok"))
    conn = hostile(
        frame(9, 0x4, 1, b"\x82"),  # CONTINUATION without HEADERS
        frame(4, 0, 0, b"\0" * 7),  # SETTINGS not a multiple of 6
        frame(4, 0, 0, b"\0\x04\x00\x00\x00\x10" * 12000),  # 72 kB of SETTINGS
        frame(0, 0, 0, b"data on stream 0"),
        frame(6, 0, 1, b"\0" * 8),  # PING on a stream
        frame(8, 0, 0, b"\0\0\0\0"),  # WINDOW_UPDATE of 0
        frame(3, 0, 1, b"\0"),  # RST_STREAM of one byte
        frame(0xEE, 0xFF, 1, b"unknown type: ignored"),
        frame(1, 0x5, 1, ok),
    )
    assert conn.frame_errors == 7
    assert conn.finished() == []  # the stream waits for its response
    conn.close(2)
    assert conn.finished()[0].path == "/ok" and conn.partial is None


@pytest.mark.parametrize("block", [
    b"\x3f\xe1\x7f",  # a table size update to 16 KiB, above the allowed 4096
    b"\xbe",  # an index into a dynamic table that holds nothing
    b"\x82" * 7000,  # 7000 times ":method: GET": a header list over the 256 KiB guard
], ids=["size-update", "bad-index", "oversized"])
def test_hpack_errors_leave_headers_unknown(block):
    after = Encoder().encode(req("/after"))  # decodable alone; not decoded: the table is unknown
    conn = hostile(frame(1, 0x5, 1, block), frame(1, 0x5, 3, after))
    conn.close(2)
    got = by_id(conn)
    assert got[1].method is got[3].method is got[3].path is None
    assert got[1].partial == got[3].partial == "headers_not_decoded"
    assert conn.partial == "hpack_error" and conn.headers_undecoded == 2


def test_an_entry_larger_than_the_table_empties_it():
    big = Encoder()
    block = big.encode(req("/x", x_big="v" * 5000))  # RFC 7541 4.4: not an error
    conn = hostile(frame(1, 0x5, 1, block))
    conn.close(2)
    assert conn.finished()[0].path == "/x" and conn.partial is None


def test_a_frame_longer_than_the_receiver_accepts_loses_the_direction():
    enc = Encoder()
    conn = hostile(frame(1, 0x5, 1, enc.encode(req("/before"))), frame(0, 0, 1, b"x" * 20_000),
                   frame(1, 0x5, 3, enc.encode(req("/after"))), max_frame=16384)
    conn.close(2)
    assert conn.frame_errors == 1 and conn.partial == "malformed_frame"
    assert [s.path for s in conn.finished()] == ["/before"]  # nothing read past it


def test_header_block_over_the_cap_is_skipped():
    enc = Encoder()
    block = enc.encode(req("/huge", x_big="v" * 90_000))
    conn = hostile(frame(1, 0, 1, block[:40_000]), frame(9, 0x4, 1, block[40_000:]))
    conn.close(2)
    (s,) = conn.finished()
    assert s.path is None and conn.partial == "headers_too_large"


def test_headers_flood_is_bounded():
    enc = Encoder()
    frames = [frame(1, 0x4, 2 * k + 1, enc.encode(req(f"/{k}"))) for k in range(3000)]
    conn = hostile(*frames)
    done = conn.finished()
    assert len(done) == 3000 - http2.MAX_OPEN
    assert all(s.partial == "too_many_streams" and not s.complete for s in done)
    assert done[0].path == "/0"


def test_random_bytes_never_raise():
    rnd = random.Random(7)
    for _ in range(300):
        conn = Connection(rnd.choice(["server", "client"]), rnd.random() < 0.5)
        for k in range(rnd.randint(1, 8)):
            data = rnd.randbytes(rnd.randint(0, 300))
            conn.feed(k, rnd.choice(["in", "out"]), data, len(data) + rnd.choice([0, 0, 9, 4000]))
        conn.close(99)
        conn.finished()


def base_wire() -> tuple[Wire, dict]:
    """A genuine connection with a bit of everything, and its truth by stream id."""
    w, _ = interleaved()
    truth = {1: ("GET", "/a?x=1", 200), 3: ("POST", "/b", 201), 5: ("DELETE", "/c", 404)}
    truth |= many_streams(w, 7, 8)
    w.c.send_headers(23, GRPC_REQ)
    w.c.send_data(23, msg(b"hi") * 3, end_stream=True)
    w.flush("c")
    w.s.send_headers(23, [(":status", "200"), ("content-type", GRPC)])
    w.s.send_data(23, msg(b"x" * 3000) * 4, pad_length=17)
    w.s.send_headers(23, [("grpc-status", "0")], end_stream=True)
    w.flush("s")
    truth[23] = ("POST", "/helloworld.Greeter/SayHello", 200)
    truth |= many_streams(w, 25, 4)
    return w, truth


def recut(rnd: random.Random, chunks):
    """The same bytes in other syscalls: each chunk split at random points, some
    pieces' tails not copied."""
    for ts, d, data in chunks:
        cuts = sorted(rnd.sample(range(1, len(data)), min(len(data) - 1, rnd.randint(0, 3))))
        for a, b in zip([0, *cuts], [*cuts, len(data)]):
            n = b - a if rnd.random() < 0.97 else rnd.randint(0, b - a)
            yield ts, d, data[a:a + n], b - a


def test_fuzz_capture_damage_never_invents_values():
    """Splits, gaps and a start missed at any byte: every value given back is
    the one sent on that stream."""
    w, truth = base_wire()
    rnd = random.Random(2024)
    decoded = [0, 0]  # streams whose request was decoded: seen late, seen whole
    for trial in range(2500):
        side = rnd.choice(["server", "client"])
        chunks = list(w.chunks(side))
        started = trial % 3 != 0
        if not started:
            k = rnd.randrange(1, len(chunks))
            ts, d, data = chunks[k]
            chunks = [(ts, d, data[rnd.randrange(len(data)) if rnd.random() < 0.5 else 0:])]
            chunks += list(w.chunks(side))[k + 1:]
        conn = Connection(side, started)
        for ts, d, data, size in recut(rnd, chunks):
            conn.feed(ts, d, data, size)
        conn.close(w.ts + 1)
        for s in conn.finished():
            m, p, st = truth[s.stream_id]
            assert s.method in (None, m) and s.path in (None, p), (trial, s)
            assert s.status in (None, st), (trial, s)
            decoded[started] += s.method is not None
    assert decoded[0] > 300 and decoded[1] > 2500 * 4  # not a pass by decoding nothing


def test_fuzz_corrupted_bytes_never_raise():
    """Bit flips, cut and doubled chunks: what the bytes say may be anything,
    but feed survives it and keeps its counters."""
    w, _ = base_wire()
    rnd = random.Random(99)
    for _ in range(1500):
        side = rnd.choice(["server", "client"])
        conn = Connection(side, rnd.random() < 0.7)
        for ts, d, data, size in recut(rnd, w.chunks(side)):
            data = bytearray(data)
            for _ in range(rnd.choice([0, 0, 1, 3])):
                if data:
                    data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
            if rnd.random() < 0.05:
                data = data[:rnd.randrange(len(data) + 1)]
            conn.feed(ts, d, bytes(data), max(size, len(data)))
            if rnd.random() < 0.02:
                conn.feed(ts, d, bytes(data), len(data))
        conn.close(w.ts + 1)
        for s in conn.finished():
            assert s.status is None or isinstance(s.status, int)
        assert conn.skipped_bytes >= 0 and conn.frame_errors >= 0


def test_looks_like_h2():
    assert looks_like_h2(PREFACE + frame(4, 0, 0), seeded=False)
    assert looks_like_h2(PREFACE[:10], seeded=False)
    settings = frame(4, 0, 0, b"\0\x03\0\0\0\x64")
    assert not looks_like_h2(settings, seeded=False)
    assert looks_like_h2(settings + frame(8, 0, 0, b"\0\0\0\x01"), seeded=True)
    assert not looks_like_h2(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", seeded=True)
    assert not looks_like_h2(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", seeded=True)  # TLS
    assert not looks_like_h2(frame(4, 0, 1, b""), seeded=True)  # SETTINGS on a stream
    assert not looks_like_h2(settings + b"\x00\x00\x04\x0c\x00\x00\x00\x00\x00", seeded=True)


def test_grpc_method():
    assert grpc_method("/pkg.Service/Method") == "pkg.Service/Method"
    assert grpc_method("/grpc.health.v1.Health/Check") == "grpc.health.v1.Health/Check"
    for path in (None, "", "/", "/only", "/a/b/c", "/pkg.S/M?x=1", "pkg.S/M"):
        assert grpc_method(path) is None
