"""Outgoing calls as client spans, and one trace per request across them.

A service answers each request by calling a real redis-server and a real
nginx (Flask's threaded server with redis-py and requests; FastAPI on
uvicorn with redis.asyncio and httpx); all three are traced. Each request
must come out as one trace: the service's server span, its three client
spans under it, and the callees' server spans under those client spans,
though no one sent a traceparent. Then a gateway (nginx's proxy_pass) in
front of the reference engine: every engine span in the gateway's trace;
and Node's http and HAProxy as gateways in front of http.server and nginx,
and nginx and HAProxy forwarding each client's traceparent under concurrency.
"""
from __future__ import annotations

import collections
import contextlib
import http.client
import json
import random
import shutil
import subprocess
import sys

import pytest

from .conftest import (HERE, TAG, Engine, Nginx, NodeScript, Owned,
                       RedisServer, accepts, free_port, port_for_later, wait_until)

REDIS_PORT = port_for_later()  # bound minutes after this module is imported
TIERS = ("socket", "syscall")  # the exactness of each socket tier that loads (socket_hooks)
AGENT_SELECT = {"ports": [REDIS_PORT], "cmdline": [TAG, r"engine/serve\.py .*--model-seed 11\b"]}
N = 12
CLIENT, SERVER = 3, 2


class CallingService(Owned):
    def __init__(self, agent, framework: str, backend: str, *args: str):
        pytest.importorskip({"flask": "flask", "fastapi": "fastapi"}[framework])
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "calls_app.py"), framework, "--tag", TAG,
             "--redis", str(REDIS_PORT), "--backend", backend, *args], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, f"the agent to track the {framework} service")


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, body


@pytest.fixture(scope="module")
def redis(agent):
    with RedisServer(REDIS_PORT) as r:
        wait_until(lambda: agent.tracks(r.proc.pid), 15, "the agent to track redis-server")
        yield r


def by_id(spans: list[dict]) -> dict[str, dict]:
    return {s["spanId"]: s for s in spans}


@pytest.mark.parametrize("framework", ["flask", "fastapi"])
def test_each_request_is_one_trace_through_its_calls(agent, redis, tmp_path, framework):
    with Nginx(agent, tmp_path / "nginx") as backend, \
            CallingService(agent, framework, f"http://127.0.0.1:{backend.port}") as service:
        tally = 0
        for i in range(N):
            status, body = get(service.port, f"/work/{i}")
            assert status == 200, body
            tally += json.loads(body)["calls"]
        servers = agent.traces.wait_for_port(service.port, N, pid=service.pid)
        mine = lambda s: s["resource"].get("process.pid") == service.pid  # noqa: E731

        def calls():
            spans = [s for s in agent.traces.spans() if mine(s) and s["kind"] == CLIENT]
            ops = [s for s in spans if s["attrs"].get("db.operation.name") in ("GET", "SET")
                   or s["attrs"].get("server.port") == backend.port]
            return len(ops) >= tally and spans
        wait_until(calls, 15, f"{tally} client spans of the {framework} service")

        def unanswered():  # a callee's span may be written after its caller's
            spans = agent.traces.spans()
            callers = {x.get("parentSpanId") for x in spans if x["kind"] == SERVER}
            return [c["name"] for c in spans if mine(c) and c["kind"] == CLIENT and c["spanId"] not in callers]
        with contextlib.suppress(AssertionError):  # if one never comes, the checks below say which
            wait_until(lambda: not unanswered() or None, 15, "a callee span under each client span")
        spans = agent.traces.spans()
        index = by_id(spans)
        wrong = []
        for s in servers:
            children = [c for c in spans if c.get("parentSpanId") == s["spanId"] and c["kind"] == CLIENT]
            ops = collections.Counter(c["attrs"].get("db.operation.name") or
                                      f"http {c['attrs'].get('server.port')}" for c in children)
            want = {"GET": 1, "SET": 1, f"http {backend.port}": 1}  # redis-py adds HELLO, CLIENT once
            if {k: ops[k] for k in want} != want:
                wrong.append(f"{s['attrs'].get('url.path')}: calls {dict(ops)}")
            for c in children:
                callee = [x for x in spans if x.get("parentSpanId") == c["spanId"] and x["kind"] == SERVER]
                # one each; two for a call of pipelined commands (redis-py's CLIENT SETINFO pair)
                if not callee or any(x["traceId"] != s["traceId"] for x in callee):
                    wrong.append(f"{c['name']} of {s['attrs'].get('url.path')}: callees {callee}")
                elif any(x["attrs"].get("sitsprobe.parent.inferred") != "connection" for x in callee):
                    wrong.append(f"callee of {c['name']}: {callee[0]['attrs']}")
            if "parentSpanId" in s and s["parentSpanId"] in index:
                wrong.append(f"the service's span has a parent: {index[s['parentSpanId']]['name']}")
        assert not wrong, "\n".join(wrong)
        got = sum(1 for s in spans if mine(s) and s["kind"] == CLIENT and s.get("parentSpanId") in
                  {x["spanId"] for x in servers} and (s["attrs"].get("db.operation.name") in ("GET", "SET")
                                                       or s["attrs"].get("server.port") == backend.port))
        assert got == tally, (got, tally)


def test_answers_to_clients_that_left_are_counted_and_stitched(agent, redis, tmp_path):
    """A client that sends its request and closes: Flask (werkzeug) answers
    after its calls, redis-server after a script's busy loop, and each answer
    draws a reset that loopback delivers inside the send of it. Both answers
    are counted and in their spans, on every tier."""
    from .test_net import abandon

    body = b"for i = 1, 20000000 do end return 7"  # a busy redis-server: the client's FIN comes first
    script = b"*3\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n0\r\n" % (len(body), body)
    with Nginx(agent, tmp_path / "nginx") as backend, \
            CallingService(agent, "flask", f"http://127.0.0.1:{backend.port}") as service:
        abandon(service.port, b"GET /work/99 HTTP/1.1\r\nHost: a\r\n\r\n")
        abandon(REDIS_PORT, script)
        [evals] = wait_until(lambda: [s for s in agent.traces.for_pid(redis.proc.pid) if s["kind"] == SERVER
                                      and s["attrs"].get("db.operation.name") == "EVAL"], 15, "the EVAL span")
        assert evals["attrs"].get("sitsprobe.complete") is not False and \
            evals.get("status", {}).get("code") != 2, evals
        [left] = wait_until(lambda: [s for s in agent.traces.for_pid(service.pid)
                                     if s["attrs"].get("url.path") == "/work/99"], 15, "the Flask span")
        assert left["attrs"].get("http.response.status_code") == 200, left["attrs"]
        assert agent.metric("sitsprobe_http_server_requests_total", pid=service.pid) == 1


def test_a_grpc_call_and_its_server_are_in_the_callers_trace(agent, redis):
    """Flask calling a traced grpcio server: its gRPC client span under its
    server span, and the gRPC server's span under that call (HTTP/2 stream
    matched on the connection), one trace per request."""
    from .test_http2 import H2Peer

    with H2Peer(agent, "grpc") as grpc_server, \
            CallingService(agent, "flask", "http://127.0.0.1:9", "--grpc", f"127.0.0.1:{grpc_server.port}") as app:
        for i in range(6):
            status, body = get(app.port, f"/rpc/{i}")
            assert status == 200, body
        servers = agent.traces.wait_for_port(app.port, 6, pid=app.pid)
        callee = wait_until(lambda: (s := [x for x in agent.traces.for_pid(grpc_server.pid) if x["kind"] == SERVER])
                            and len(s) >= 6 and s, 15, "the gRPC server's 6 spans")
        index = by_id(agent.traces.spans())
        for s in callee:
            call = index.get(s.get("parentSpanId"))
            assert call is not None and call["kind"] == CLIENT and call["attrs"].get("rpc.method") == \
                "demo.Echo/Say", s
            top = index.get(call.get("parentSpanId"))
            assert top is not None and top in servers and top["traceId"] == s["traceId"] == call["traceId"]


def test_a_gateway_and_its_engine_share_each_trace(agent, tmp_path):
    (tmp_path / "engine").mkdir()
    engine = Engine(tmp_path / "engine", "--model-seed", "11")
    try:
        proxy = f"""
        location /v1/ {{
            proxy_pass http://127.0.0.1:{engine.port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}"""
        with Nginx(agent, tmp_path / "gateway", locations=proxy) as gateway:
            wait_until(lambda: agent.tracks(engine.pid), 15, "the agent to track the engine")
            for i in range(8):
                body = json.dumps({"prompt": f"gateway {i}", "max_tokens": 4, "temperature": 0})
                conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                assert r.status == 200, r.read()
                r.read()
                conn.close()
            # its worker's: the kernel may have given an earlier test's server the same port
            outer = agent.traces.wait_for_port(gateway.port, 8, pid=gateway.workers[0])
            inner = agent.traces.wait_for_port(engine.port, 8, pid=engine.pid)
            traces = {s["traceId"] for s in outer}
            assert len(traces) == 8
            assert {s["traceId"] for s in inner} == traces
            index = by_id(agent.traces.spans())
            for s in inner:
                parent = index.get(s.get("parentSpanId"))
                assert parent is not None and parent["kind"] == CLIENT, s
                assert parent["resource"]["process.pid"] in gateway.workers
    finally:
        engine.stop()


class EarlyCaller(Owned):
    """early_caller.py: POSTs of 64 MiB, each sent in one blocking send, on
    one kept-alive connection (``each``: a connection each), once told to."""

    def __init__(self, agent, port: int, posts: int, each: bool):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "early_caller.py"), str(port), str(posts),
                                      *(["--each"] if each else []), TAG],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track the caller")


@pytest.mark.parametrize("callee", ["nginx", "uvicorn"])
def test_a_post_answered_before_its_body_was_read_is_one_span_under_its_call(agent, tmp_path, callee):
    """nginx (``return``) and uvicorn (an ASGI app that never reads the body)
    answer a POST from its head while the caller's one send of the head and
    body still blocks, and read the body after. Each POST must be one server
    span (the body is no request of its own), under the caller's client span:
    the kernel saw the answer before it saw the call begin, and a connection's
    first call's before it saw the connection do anything but connect. nginx's
    POSTs share a kept-alive connection; uvicorn's have one each, since it may
    read a body's end and the next request at once (early_caller.py). (How
    much of the body a span counts depends on when it went out: test_net_probe
    checks that the body is its request's.)"""
    from .edge_peers import Peer

    posts = 3
    if callee == "nginx":
        server = Nginx(agent, tmp_path / "nginx",
                       locations='location = /early { client_max_body_size 100m; return 200 "early\\n"; }')
        pids = server.workers
    else:
        server = Peer("asgi")
        pids = [server.pid]
        wait_until(lambda: agent.tracks(server.pid), 10, "the agent to track uvicorn")
    try:
        with EarlyCaller(agent, server.port, posts, each=callee == "uvicorn") as caller:
            out, _ = caller.proc.communicate("go\n", timeout=60)  # it closes the connection as it exits
        assert out.split("\n") == ["200 6"] * posts + [""], out
        answers = wait_until(lambda: len(s := [x for p in pids for x in agent.traces.for_pid(p)]) >= posts and s,
                             15, f"{callee}'s {posts} spans")
        assert [s["name"] for s in answers] == ["POST /early"] * posts
        calls = by_id(wait_until(lambda: len(s := agent.traces.for_pid(caller.pid)) >= posts and s, 15,
                                 "the caller's spans"))
        for s in answers:
            call = calls.get(s.get("parentSpanId"))
            assert call is not None and call["kind"] == CLIENT, (s, list(calls.values()))
            assert call["attrs"]["http.request.method"] == s["attrs"]["http.request.method"], (s, call)
            assert call["traceId"] == s["traceId"] and s["attrs"]["sitsprobe.parent.inferred"] == "connection"
        assert agent.metric("sitsprobe_http_server_requests_total", pid=pids[0]) == posts
    finally:
        server.stop()


class StdlibUpstream(Owned):
    """Python's http.server over a folder whose path carries the run's tag:
    HTTP/1.0, so it closes each connection after its answer."""

    def __init__(self, agent, folder):
        folder.mkdir()
        (folder / "page.txt").write_text("upstream\n" * 40)
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                      "--directory", str(folder), str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pids = [self.proc.pid]
        self.until(lambda: agent.tracks(self.proc.pid), 10, "the agent to track http.server")
        self.until(lambda: accepts(self.port), 10, f"http.server on port {self.port}")


class HAProxy(Owned):
    """Debian's HAProxy in front of one upstream, in the foreground, with two
    threads (an event loop each) and its default connection reuse; its
    config's path carries the run's tag, by which the agent selects it. It
    ignores probes: else the connection that `accepts` opens and closes
    without a request gets a 400, which the agent rightly reports."""

    def __init__(self, agent, folder, upstream: int, pem: str | None = None):
        """pem: a certificate and its key in one file, to terminate TLS with."""
        haproxy = shutil.which("haproxy")
        if haproxy is None:
            pytest.skip("no HAProxy: .ci/run installs the haproxy package")
        folder.mkdir()
        self.port = free_port()
        config = folder / "haproxy.cfg"
        config.write_text(f"""global
    nbthread 2
defaults
    mode http
    option http-ignore-probes
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend gateway
    bind 127.0.0.1:{self.port}{f" ssl crt {pem}" if pem else ""}
    default_backend upstream
backend upstream
    server up 127.0.0.1:{upstream}
""")
        self.proc = subprocess.Popen([haproxy, "-db", "-f", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track HAProxy")
        self.until(lambda: accepts(self.port), 10, f"HAProxy on port {self.port}")


def test_an_nginx_gateway_s_concurrent_requests_each_have_their_call(agent, tmp_path):
    """nginx's proxy_pass under 8 concurrent keep-alive clients (`ab`): it
    dials the upstream right after it read a request, but writes the call
    once the connection is ready, when it has read others. Each call is the
    one whose thread dialled its connection's: every gateway span has its
    one call, and the upstream's span under it (before: 94 of 600 had one
    call, 400 none)."""
    proxy = f"""
        location /up/ {{
            proxy_pass http://127.0.0.1:{{port}}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}"""
    with Nginx(agent, tmp_path / "nginx") as up, \
            Nginx(agent, tmp_path / "gateway", locations=proxy.replace("{port}", str(up.port))) as gateway:
        out = subprocess.run(["ab", "-k", "-c", "8", "-n", "200", f"http://127.0.0.1:{gateway.port}/up/index.html"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert "Complete requests:      200" in out and "Failed requests:        0" in out, out
        assert_each_request_is_its_call_and_callee(agent, gateway.port, gateway.workers[0], up, 200)


@pytest.mark.parametrize("upstream", ["http.server", "nginx"])
def test_a_haproxy_gateway_s_calls_are_in_its_requests_traces(agent, tmp_path, upstream):
    """HAProxy forwards each request on a connection to the upstream that it
    keeps for reuse where the upstream keeps it (nginx), on one of its
    threads' event loops. Each request is one trace: the gateway's span, its
    call, the upstream's span under the call, matched by connection."""
    with (StdlibUpstream(agent, tmp_path / TAG) if upstream == "http.server"
          else Nginx(agent, tmp_path / "nginx")) as up, HAProxy(agent, tmp_path / f"haproxy-{TAG}", up.port) as gateway:
        path = "/page.txt" if upstream == "http.server" else "/index.html"
        for _ in range(N):
            status, _ = get(gateway.port, path)
            assert status == 200
        assert_each_request_is_its_call_and_callee(agent, gateway.port, gateway.pid, up, N)


@pytest.mark.parametrize("upstream", ["http.server", "nginx"])
def test_a_node_gateway_s_calls_are_in_its_requests_traces(agent, tmp_path, upstream):
    """Node calls through its keep-alive agent: http.server closes each
    connection (Node reads the close, then shuts its side and closes), nginx
    keeps them. Each request is one trace: the gateway's span, its call, and
    the upstream's span under the call, matched by connection. (On the
    socket tier a socket that Node shut after reading the close kept its
    connection, and the next socket the kernel made at the same address was
    taken for it: its calls' upstream spans were traces of their own.)"""
    with (StdlibUpstream(agent, tmp_path / TAG) if upstream == "http.server"
          else Nginx(agent, tmp_path / "nginx")) as up, NodeScript(agent, "gateway_node.js", str(up.port)) as gateway:
        path = "/page.txt" if upstream == "http.server" else "/index.html"
        for _ in range(N):
            status, _ = get(gateway.port, path)
            assert status == 200
        assert_each_request_is_its_call_and_callee(agent, gateway.port, gateway.pid, up, N)


@pytest.mark.parametrize("gateway", ["nginx", "haproxy"])
def test_a_gateway_that_forwards_traceparent_has_each_call_under_the_request_that_sent_it(
        agent, tmp_path, gateway):
    """curl sends 200 requests, 8 at a time over kept-alive connections, each
    with a traceparent of its own, through nginx's proxy_pass or HAProxy to
    nginx; both forward the header unchanged. Each call carries its request's
    header, which names the request it is for where the thread's guess would
    not (HAProxy reuses its upstream connections): each gateway span is the
    child of its client's span, with its one call under it
    (`sitsprobe.parent.inferred="traceparent"`), the upstream's span under
    the call, all in the client's trace."""
    n, proxy = 200, """
        location /up/ {{
            proxy_pass http://127.0.0.1:{port}/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}"""
    sent = {f"{random.getrandbits(128) | 1:032x}": f"{random.getrandbits(64) | 1:016x}" for _ in range(n)}
    with Nginx(agent, tmp_path / "nginx") as up, \
            (Nginx(agent, tmp_path / "gateway", locations=proxy.format(port=up.port)) if gateway == "nginx"
             else HAProxy(agent, tmp_path / f"haproxy-{TAG}", up.port)) as gw:
        path = "/up/index.html" if gateway == "nginx" else "/index.html"
        config = tmp_path / "curl.conf"
        config.write_text("next\n".join(f'url = "http://127.0.0.1:{gw.port}{path}"\n'
                                         f'header = "traceparent: 00-{trace}-{span}-01"\n'
                                         'output = "/dev/null"\nwrite-out = "%{http_code}\\n"\n'
                                         for trace, span in sent.items()))
        out = subprocess.run(["curl", "-s", "--parallel", "--parallel-max", "8", "-K", str(config)],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert out.split() == ["200"] * n, out
        pid = gw.workers[0] if gateway == "nginx" else gw.pid
        served = agent.traces.wait_for_port(gw.port, n, pid=pid)
        wait_until(lambda: len([s for s in agent.traces.for_pid(pid) if s["kind"] == CLIENT]) >= n, 15,
                   f"the gateway's {n} calls")
        wait_until(lambda: len([s for s in agent.traces.spans() if s["resource"].get("process.pid") in up.pids
                                and s["kind"] == SERVER]) >= n, 15, f"{n} upstream spans")
    spans = agent.traces.spans()
    assert sorted(s["traceId"] for s in served) == sorted(sent)
    wrong = []
    for s in served:
        calls = [c for c in spans if c.get("parentSpanId") == s["spanId"] and c["kind"] == CLIENT]
        callees = [x for c in calls for x in spans if x.get("parentSpanId") == c["spanId"]]
        got = (s.get("parentSpanId") == sent[s["traceId"]],
               [(c["traceId"] == s["traceId"], c["attrs"].get("sitsprobe.parent.inferred"),
                 c["attrs"].get("http.response.status_code")) for c in calls],
               [(x["resource"].get("process.pid") in up.pids, x["traceId"] == s["traceId"],
                 x["attrs"].get("sitsprobe.parent.inferred")) for x in callees])
        if got != (True, [(True, "traceparent", 200)], [(True, True, "connection")]):
            wrong.append(f"{s['name']} {s['traceId']}: {got}")
    assert not wrong, f"{len(wrong)} of {n}:\n" + "\n".join(wrong[:20])


def assert_each_request_is_its_call_and_callee(agent, port: int, pid: int, up, n: int) -> None:
    """The gateway's n requests: each the root of its trace with one call to
    the upstream (answered 200) and the upstream's span under that call."""
    served = agent.traces.wait_for_port(port, n, pid=pid)
    wait_until(lambda: len([s for s in agent.traces.spans() if s["resource"].get("process.pid") in up.pids
                            and s["kind"] == SERVER]) >= n, 15, f"{n} upstream spans")
    # the last call on a kept-alive connection is flushed once quiet (CALL_SETTLE_NS)
    wait_until(lambda: len([s for s in agent.traces.for_pid(pid) if s["kind"] == CLIENT]) >= n, 15,
               f"the gateway's {n} calls")
    spans = agent.traces.spans()
    wrong = []
    for s in served:
        calls = [c for c in spans if c.get("parentSpanId") == s["spanId"] and c["kind"] == CLIENT]
        callees = [x for c in calls for x in spans if x.get("parentSpanId") == c["spanId"]]
        got = ([(c["attrs"].get("server.port"), c["attrs"].get("http.response.status_code")) for c in calls],
               [(x["resource"].get("process.pid") in up.pids, x["traceId"] == s["traceId"],
                 x["attrs"].get("sitsprobe.parent.inferred")) for x in callees])
        if got != ([(up.port, 200)], [(True, True, "connection")]) or "parentSpanId" in s:
            wrong.append(f"{s['name']} {s['spanId']} (parent {s.get('parentSpanId')}): {got}")
    assert not wrong, "\n".join(wrong)
