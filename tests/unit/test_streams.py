"""stitch.streams: an HTTP/2 connection's chunks, as the kernel sends them, become one Request per stream."""
from __future__ import annotations

import h2.config
import h2.connection
import h2.errors

from sitsprobe.abi import CF_CLIENT, CF_CLOSING, CF_SEEDED, CF_TLS, CF_TUPLE, CH_CLOSE, CH_IN, CH_OUT
from sitsprobe.events import Chunk
from sitsprobe.request import Endpoint
from sitsprobe.routes import RouteMapper
from sitsprobe.stitch.streams import StreamStitcher

LOCAL, PEER = Endpoint("10.0.0.5", 50051), Endpoint("10.0.0.9", 40000)


class Wire:
    """An h2 client and server in memory; the traced side's chunks, timed 1 ms apart."""

    def __init__(self, flags: int = CF_TUPLE):
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.flags, self.chunks, self.t = flags, [], 0
        self.client.initiate_connection()
        self.server.initiate_connection()
        self.flush()

    def flush(self) -> None:
        for sender, receiver, direction in ((self.client, self.server, CH_IN), (self.server, self.client, CH_OUT)):
            data = sender.data_to_send()
            if data:
                receiver.receive_data(data)
                self.t += 1_000_000
                self.chunks.append(Chunk(7, 3, self.t, direction, len(data), self.flags, LOCAL, PEER, data))

    def call(self, sid: int, path: str, status: int = 200, grpc_status: int | None = None) -> None:
        self.client.send_headers(sid, [(":method", "POST"), (":path", path), (":scheme", "http"),
                                       (":authority", "svc"), ("content-type", "application/grpc")])
        self.client.send_data(sid, b"\0\0\0\0\x02hi", end_stream=True)
        self.flush()
        self.server.send_headers(sid, [(":status", str(status)), ("content-type", "application/grpc")])
        self.server.send_data(sid, b"\0\0\0\0\x02ok")
        if grpc_status is None:
            self.server.end_stream(sid)
        else:
            self.server.send_headers(sid, [("grpc-status", str(grpc_status))], end_stream=True)
        self.flush()


def stitch(chunks) -> list:
    s = StreamStitcher(RouteMapper([], True, 100), lambda pid: "server")
    return [r for ch in chunks for r in s.on_chunk(ch)], s


def test_each_stream_is_a_request_with_its_call():
    w = Wire()
    w.call(1, "/pkg.Svc/Get", grpc_status=0)
    w.call(3, "/pkg.Svc/Put", grpc_status=5)
    reqs, s = stitch(w.chunks)
    assert [(r.path, r.h2.grpc, r.h2.grpc_status, r.h2.request_messages, r.h2.response_messages)
            for r in reqs] == [("/pkg.Svc/Get", True, 0, 1, 1), ("/pkg.Svc/Put", True, 5, 1, 1)]
    r = reqs[0]
    assert (r.pid, r.fd, r.comm, r.protocol, r.direction, r.local, r.peer) == \
        (7, 3, "server", "http/2", "server", LOCAL, PEER)
    assert r.start_ns < r.first_out_ns <= r.end_ns and r.route is None  # gRPC: no route template
    assert s.counts()[("server", "connections")] == 1


def test_a_call_the_client_cancels_is_cancelled():
    w = Wire()
    w.client.send_headers(1, [(":method", "POST"), (":path", "/pkg.Svc/Slow"), (":scheme", "http"),
                              (":authority", "svc"), ("content-type", "application/grpc")], end_stream=True)
    w.flush()
    w.client.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
    w.flush()
    [r], _ = stitch(w.chunks)
    assert r.h2.grpc_status == 1 and r.h2.reset_code == 8  # CANCELLED, as gRPC maps it
    assert (r.partial, r.is_error) == ("client_closed", False)  # the client's doing


def test_a_client_connection_and_tls_say_so():
    w = Wire(CF_TUPLE | CF_CLIENT | CF_TLS)
    w.call(1, "/pkg.Svc/Get", grpc_status=0)
    # the client's view: what it wrote is the request
    chunks = [c._replace(dir=CH_OUT if c.dir == CH_IN else CH_IN) for c in w.chunks]
    [r], _ = stitch(chunks)
    assert r.direction == "client" and r.tls and r.path == "/pkg.Svc/Get" and r.h2.grpc_status == 0


def test_close_and_a_missed_start():
    w = Wire(CF_TUPLE | CF_SEEDED)
    w.call(1, "/pkg.Svc/Get", grpc_status=0)  # before the agent: its headers fill the HPACK tables
    seen_from = len(w.chunks)
    w.call(3, "/pkg.Svc/Get", grpc_status=0)  # after: they name entries the agent never saw
    w.client.send_headers(5, [(":method", "POST"), (":path", "/pkg.Svc/Get"), (":scheme", "http"),
                              (":authority", "svc"), ("content-type", "application/grpc")])
    w.flush()
    reqs, s = stitch(w.chunks[seen_from:] + [Chunk(7, 3, 10**10, CH_CLOSE, 0, CF_TUPLE, LOCAL, PEER, b"")])
    assert all(r.path is None and r.partial for r in reqs), reqs  # never a guess
    assert [r.complete for r in reqs] == [True, False]  # stream 5 was open at the close
    assert s.counts()[("server", "partial")] == 1


def test_a_connection_its_client_dropped_leaves_its_open_streams_client_closed():
    """A client that closes the connection with a stream still open (httpx
    sends no RST_STREAM for a response it stops reading): where its side
    ended first (struct chunk_head.peer_ended), the stream is client_closed,
    no error; a connection the server closed leaves it cut short, an error."""
    got = []
    for peer_ended in (1, 0):
        w = Wire()
        w.call(1, "/v1/models", grpc_status=None)
        w.client.send_headers(3, [(":method", "GET"), (":path", "/v1/stream"), (":scheme", "http"),
                                  (":authority", "svc")], end_stream=True)
        w.flush()
        w.server.send_headers(3, [(":status", "200"), ("content-type", "text/event-stream")])
        w.server.send_data(3, b"data: 1\n\n")
        w.flush()
        close = Chunk(7, 3, 10**10, CH_CLOSE, 0, CF_TUPLE, LOCAL, PEER, b"", peer_ended=peer_ended)
        reqs, _ = stitch(w.chunks + [close])
        got.append([(r.path, r.complete, r.partial, r.is_error) for r in reqs])
    assert got == [[("/v1/models", True, None, False), ("/v1/stream", False, "client_closed", False)],
                   [("/v1/models", True, None, False), ("/v1/stream", False, None, True)]]


def test_a_chunk_sent_as_tcp_closed_its_connection_is_its_last():
    """The kernel's last chunk of a connection TCP ended during that very call
    (a reset drawn by the send of the answer's trailers) carries CF_CLOSING
    and no close chunk comes: its bytes count, then the connection ends."""
    w = Wire()
    w.client.send_headers(1, [(":method", "POST"), (":path", "/pkg.Svc/Slow"), (":scheme", "http"),
                              (":authority", "svc"), ("content-type", "application/grpc")])
    w.client.send_headers(3, [(":method", "POST"), (":path", "/pkg.Svc/Slow"), (":scheme", "http"),
                              (":authority", "svc"), ("content-type", "application/grpc")], end_stream=True)
    w.flush()
    w.server.send_headers(3, [(":status", "200"), ("content-type", "application/grpc"),
                              ("grpc-status", "4")], end_stream=True)
    w.flush()
    *before, last = w.chunks
    reqs, s = stitch([*before, last._replace(flags=last.flags | CF_CLOSING)])
    assert [(r.h2.stream_id, r.h2.grpc_status, r.complete) for r in reqs] == [(3, 4, True), (1, None, False)]
    assert s.counts()[("server", "connections")] == 1 and not s._conns  # closed: nothing left open
