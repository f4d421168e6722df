"""HTTP/2 and gRPC from the wire: servers and clients no one here wrote.

grpcio's server driven by grpcio's client (unary, server streaming, an error
status, a deadline exceeded), and hypercorn over h2c driven by httpx's
HTTP/2 client: one span per RPC or request, each with its method, path and
status, equal to the client's own tally.
"""
from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from .conftest import HERE, TAG, Owned, wait_until

SERVER = 2


class H2Peer(Owned):
    def __init__(self, agent, server: str):
        pytest.importorskip({"grpc": "grpc", "hypercorn": "hypercorn"}[server])
        self.proc = subprocess.Popen([sys.executable, str(HERE / "h2_peers.py"), server, "--tag", TAG],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid
        wait_until(lambda: agent.tracks(self.pid), 10, f"the agent to track {server}")


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
        if got[("demo.Echo/Slow", "CANCELLED")] == 1:
            got[("demo.Echo/Slow", "DEADLINE_EXCEEDED")] += got.pop(("demo.Echo/Slow", "CANCELLED"))
        assert got == tally, spans[:3]
        assert all(s["attrs"].get("rpc.system.name") == "grpc" for s in spans)
        streamed = sorted(s["attrs"].get("sitsprobe.rpc.response_messages") for s in spans
                          if s["attrs"].get("rpc.method") == "demo.Echo/Count")
        assert streamed == messages


def test_h2c_requests_are_exact_per_path_and_status(agent):
    import httpx

    with H2Peer(agent, "hypercorn") as server:
        tally: collections.Counter = collections.Counter()
        with httpx.Client(http1=False, http2=True, base_url=f"http://127.0.0.1:{server.port}") as client:
            for i in range(30):
                path = ("/status/200", "/status/404", "/status/503", "/big/20000")[i % 4]
                r = client.get(path)
                assert r.http_version == "HTTP/2"
                tally[path, r.status_code] += 1
        spans = wait_until(lambda: (s := agent.traces.for_port(server.port)) and len(s) >= 30 and s,
                           20, "30 HTTP/2 spans")
        got = collections.Counter((s["attrs"].get("url.path"), s["attrs"].get("http.response.status_code"))
                                  for s in spans)
        assert got == tally, spans[:3]
        assert {s["attrs"].get("network.protocol.version") for s in spans} == {"2"}
        big = [s for s in spans if s["attrs"].get("url.path") == "/big/20000"]
        assert all(s["attrs"].get("http.response.size") == 20000 for s in big)
