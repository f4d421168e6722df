"""HTTP/2 and gRPC from the wire: servers and clients no one here wrote.

grpcio's server driven by grpcio's client (unary, server streaming, an error
status, a deadline exceeded), and hypercorn over h2c driven by httpx's
HTTP/2 client: one span per RPC or request, each with its method, path and
status, equal to the client's own tally.
"""
from __future__ import annotations

import collections
import random
import subprocess
import sys
import time

import pytest

from .conftest import HERE, TAG, Owned, wait_until

SERVER = 2


class H2Peer(Owned):
    def __init__(self, agent, server: str, tls: tuple[str, str] | None = None):
        pytest.importorskip({"grpc": "grpc", "hypercorn": "hypercorn", "h2": "h2"}[server])
        self.proc = subprocess.Popen([sys.executable, str(HERE / "h2_peers.py"), server, "--tag", TAG,
                                      *(("--tls", *tls) if tls else ())], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid
        if agent is not None:
            self.until(lambda: agent.tracks(self.pid), 10, f"the agent to track {server}")


def test_grpc_calls_are_one_span_each_with_method_and_status(agent):
    import grpc

    with H2Peer(agent, "grpc") as server:
        tally: collections.Counter = collections.Counter()
        messages = []
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            say = channel.unary_unary("/demo.Echo/Say")
            count = channel.unary_stream("/demo.Echo/Count")
            missing = channel.unary_unary("/demo.Echo/Missing")
            slow = channel.unary_unary("/demo.Echo/Slow")
            for i in range(10):
                assert say(b"hello %d" % i, timeout=10) == b"hello %d" % i
                tally["demo.Echo/Say", "OK"] += 1
            for n in (1, 3, 5):
                assert len(list(count(b"%d" % n, timeout=10))) == n
                tally["demo.Echo/Count", "OK"] += 1
                messages.append(n)
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as e:
                    missing(b"x", timeout=10)
                assert e.value.code() == grpc.StatusCode.NOT_FOUND
                tally["demo.Echo/Missing", "NOT_FOUND"] += 1
            with pytest.raises(grpc.RpcError) as e:
                slow(b"x", timeout=0.3)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # grpcio's server keeps the grpc-timeout too and may end the call itself with
            # DEADLINE_EXCEEDED; or the client's RST_STREAM(CANCEL) comes first: CANCELLED
            tally["demo.Echo/Slow", "DEADLINE_EXCEEDED"] += 1
        total = sum(tally.values())
        spans = wait_until(lambda: (s := [x for x in agent.traces.for_pid(server.pid) if x["kind"] == SERVER])
                           and len(s) >= total and s, 20, f"{total} gRPC spans")
        got = collections.Counter((s["attrs"].get("rpc.method"), s["attrs"].get("rpc.response.status_code"))
                                  for s in spans)
        seen = +got  # as the spans say it
        if got[("demo.Echo/Slow", "CANCELLED")] == 1:
            got[("demo.Echo/Slow", "DEADLINE_EXCEEDED")] += got.pop(("demo.Echo/Slow", "CANCELLED"))
        assert got == tally, (got, tally, [s["attrs"] for s in spans if not s["attrs"].get("http.response.status_code")][:1])
        assert all(s["attrs"].get("rpc.system.name") == "grpc" for s in spans)
        # a server's span is an error for the codes that are its errors (DEADLINE_EXCEEDED here), not
        # for the caller's (NOT_FOUND) nor a call its caller cancelled
        statuses = {(s["attrs"].get("rpc.method"), s["attrs"].get("rpc.response.status_code"),
                     s["status"].get("code")) for s in spans}
        assert statuses == {(m, code, 2 if code == "DEADLINE_EXCEEDED" else None) for m, code in seen}
        streamed = sorted(s["attrs"].get("sitsprobe.rpc.response_messages") for s in spans
                          if s["attrs"].get("rpc.method") == "demo.Echo/Count")
        assert streamed == messages
        page = agent.scrape()  # the metrics, by method and status, agree with the spans
        counted = collections.Counter()
        for method, status in seen:
            counted[method, status] = agent.metric("rpc_server_call_duration_seconds_count", page,
                                                   rpc_method=method, rpc_response_status_code=status)
        assert counted == seen


# hypercorn writes each frame on its own (a DATA frame past the bytes
# captured is skipped by its length). The h2 peer writes 9-byte slices, so
# the kernel copies each write as a chain of tail calls (bpf/net.c
# send_chunk, CHUNK_IOVS entries a run), and /big/3200 has the last of its
# seven DATA frames' headers near entry 350: a chain that stops short of it
# loses the stream's end and the connection's place (later header blocks
# cannot be trusted: HPACK). It stays under the 4,096 bytes captured of a
# write, past which the same holds.
H2C_PATHS = {"hypercorn": ("/status/200", "/status/404", "/status/503", "/big/20000"),
             "h2": ("/status/200", "/status/404", "/status/503", "/big/1500", "/big/3200")}


@pytest.mark.parametrize("peer", list(H2C_PATHS))
def test_h2c_requests_are_exact_per_path_and_status(agent, peer):
    import httpx

    paths = H2C_PATHS[peer]
    with H2Peer(agent, peer) as server:
        tally: collections.Counter = collections.Counter()
        with httpx.Client(http1=False, http2=True, base_url=f"http://127.0.0.1:{server.port}") as client:
            for i in range(30):
                r = client.get(paths[i % len(paths)])
                assert r.http_version == "HTTP/2"
                tally[paths[i % len(paths)], r.status_code] += 1
        spans = wait_until(lambda: (s := agent.traces.for_port(server.port, server.pid)) and len(s) >= 30 and s,
                           20, "30 HTTP/2 spans")
        got = collections.Counter((s["attrs"].get("url.path"), s["attrs"].get("http.response.status_code"))
                                  for s in spans)
        assert got == tally, spans[:3]
        assert {s["attrs"].get("network.protocol.version") for s in spans} == {"2"}
        for path in (p for p in paths if p.startswith("/big/")):
            big = [s for s in spans if s["attrs"].get("url.path") == path]
            assert all(s["attrs"].get("http.response.size") == int(path[5:]) for s in big)


def test_a_call_its_client_cancels_mid_stream_is_the_client_s_doing(agent):
    """grpcio's client cancels a server-streaming call after two messages: it
    sends RST_STREAM(CANCEL). The server's span says CANCELLED and
    client_closed, with no error status, and holds at least the messages
    the client got."""
    import grpc

    with H2Peer(agent, "grpc") as server:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.unary_stream("/demo.Echo/Drip")(b"50", timeout=10)
            got = [next(call), next(call)]
            call.cancel()
            with pytest.raises(grpc.RpcError) as e:
                next(call)
            assert e.value.code() == grpc.StatusCode.CANCELLED
        span = wait_until(lambda: [s for s in agent.traces.for_pid(server.pid) if s["kind"] == SERVER], 15,
                          "the cancelled call's span")[0]
    a = span["attrs"]
    assert (a["rpc.method"], a["rpc.response.status_code"], a.get("sitsprobe.partial"), a.get("error.type"),
            span["status"]) == ("demo.Echo/Drip", "CANCELLED", "client_closed", "client_closed", {})
    assert len(got) <= a["sitsprobe.rpc.response_messages"] < 50


def test_a_stream_left_open_by_a_client_that_drops_the_connection_is_client_closed(agent):
    """httpx's HTTP/2 client sends no RST_STREAM for a response it stops
    reading: closing the client closes the connection with the stream still
    open. The server's span (h2's, whose loop closes once a write fails)
    says client_closed, with no error status. (hypercorn kept such a
    connection in CLOSE_WAIT for 6 s in one run here, over 40 s in another:
    a stream's span waits for the close.)"""
    import httpx

    with H2Peer(agent, "h2") as server:
        with httpx.Client(http1=False, http2=True, base_url=f"http://127.0.0.1:{server.port}", timeout=10) as c:
            with c.stream("GET", "/drip/40") as r:
                got = [line for line, _ in zip((x for x in r.iter_lines() if x), range(2))]
        span = wait_until(lambda: [s for s in agent.traces.for_pid(server.pid)
                                   if s["kind"] == SERVER and s["attrs"].get("url.path") == "/drip/40"], 15,
                          "the stream's span")[0]
    a = span["attrs"]
    assert len(got) == 2 and r.http_version == "HTTP/2"
    assert (a["http.response.status_code"], a["sitsprobe.complete"], a.get("sitsprobe.partial"),
            a.get("error.type"), span["status"]) == (200, False, "client_closed", "client_closed", {})


def test_a_stream_held_on_a_zero_window_says_how_long(agent):
    """A client (the h2 library on a socket) with a 4 KiB stream window that
    lets the server send more only 0.25 s after each window is used up: the
    server's span says how long it waited."""
    import socket

    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    with H2Peer(agent, "hypercorn") as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        c.initiate_connection()
        c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4096})
        c.send_headers(1, [(":method", "GET"), (":path", "/big/20000"), (":scheme", "http"),
                           (":authority", "localhost")], end_stream=True)
        sock.sendall(c.data_to_send())
        got, unacked, held, done = 0, 0, 0, False
        while not done:
            for ev in c.receive_data(sock.recv(65536)):
                if isinstance(ev, h2.events.DataReceived):
                    got += len(ev.data)
                    unacked += ev.flow_controlled_length
                elif isinstance(ev, h2.events.StreamEnded):
                    done = True
            if unacked >= 4096 and not done:  # the window is spent: hold the server
                time.sleep(0.25)
                held += 1
                c.acknowledge_received_data(unacked, 1)
                unacked = 0
            sock.sendall(c.data_to_send())
        sock.close()
        assert got == 20000 and held >= 3
        [span] = agent.traces.wait_for_port(server.port, 1, pid=server.pid)
        wait = span["attrs"]["sitsprobe.http2.flow_control_wait_s"]
        duration = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e9
        assert 0.25 * held * 0.9 <= wait <= duration, (wait, held, duration)


def test_garbage_frames_are_counted_and_survived(agent):
    import socket

    import httpx

    with H2Peer(agent, "hypercorn") as server:
        rng = random.Random(12)
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(rng.getrandbits(8) for _ in range(300)))
                try:
                    sock.recv(4096)
                except OSError:
                    pass
        with httpx.Client(http1=False, http2=True, base_url=f"http://127.0.0.1:{server.port}") as client:
            assert client.get("/status/200").status_code == 200
        [span] = agent.traces.wait_for_port(server.port, 1, pid=server.pid)
        assert span["attrs"]["url.path"] == "/status/200"
        assert agent.alive()
        wait_until(lambda: agent.metric("sitsprobe_http2_connections_total", process="python") >= 6, 10,
                   "the six connections counted")
        errors = agent.metric("sitsprobe_http2_frame_errors_total", process="python") + \
            agent.metric("sitsprobe_http2_partial_total", process="python")
        assert errors >= 1


def test_a_connection_older_than_the_agent_is_never_misattributed(tmp_path):
    """Requests on an HTTP/2 connection made before the agent started: the
    later ones are spans; none has a path or status it did not have, and
    those whose headers named table entries the agent never saw say so."""
    import httpx

    from .conftest import running_agent

    server = H2Peer(None, "hypercorn")
    try:
        paths = ("/status/200", "/status/404", "/big/100")
        with httpx.Client(http1=False, http2=True, base_url=f"http://127.0.0.1:{server.port}") as client:
            for p in paths:
                client.get(p)  # before the agent: the HPACK tables fill up
            with running_agent(tmp_path, {"pids": [server.pid], "cmdline": []}, {}, {}) as agent:
                wait_until(lambda: agent.tracks(server.pid), 15, "the agent to track hypercorn")
                truth = []
                for i in range(12):
                    p = paths[i % 3]
                    truth.append((p, client.get(p).status_code))
                spans = agent.traces.wait_for_port(server.port, 12, timeout=20, pid=server.pid)
        real = set(truth)
        for s in spans:
            a = s["attrs"]
            path, status = a.get("url.path"), a.get("http.response.status_code")
            assert path is None or status is None or (path, status) in real, a
            assert path is None or path in paths, a
            if path is None:
                assert a.get("sitsprobe.partial"), a
        assert len(spans) == 12
    finally:
        server.stop()
