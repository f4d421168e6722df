"""Real inference traffic, told true (issue 9): the edges of the wire that
servers and clients no one here wrote put in front of the agent.

- Connections that predate the agent: a keep-alive connection whose server
  thread is already blocked in recv(2) when the agent attaches. Each later
  request on it is one span with its own method, path, status and sizes
  (and, from the engine, its stages), never a response-only "HTTP unknown".
- Traffic that is not HTTP/1.1 (gRPC, which is HTTP/2; HTTP over TLS) is
  counted as unframed exchanges by protocol, not as HTTP requests with empty
  labels, and a TLS connection closing is no error.
- A full connection table: the kernel still counts every response of a
  tracked process, and says how many it could not stitch.
"""
from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from sitsprobe.procs import established

from .conftest import TAG, Engine, Nginx, Server, require_root, running_agent, wait_until
from .edge_peers import GREETER, SAY_HELLO, Peer
from .test_net import Client

# the module's agent (parts 2 and 3): a connection table that 500 keep-alive
# connections overflow; traces sampled under load, metrics are not
AGENT_EXTRA = {"stitch": {"flush_interval_ms": 50, "max_connections": 64}}
AGENT_TRACES = {"max_per_second": 200, "cpu_budget": 0}

ENGINE_SEED = "11"  # selects this file's engine only
LATE_REQUESTS = 5
ENGINE_STAGES = {"tokenize", "queue", "prefill", "decode", "detokenize"}


def samples(scrape: str, prefix: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample whose name starts with prefix."""
    out = []
    for line in scrape.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1).startswith(prefix):
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")),
                        float(m.group(3))))
    return out


def in_processes(scrape: str, prefix: str, names: set[str], **labels) -> float:
    """Sum of the samples named prefix* with a process label in names (and `labels`)."""
    return sum(v for _, have, v in samples(scrape, prefix)
               if have.get("process") in names and all(have.get(k) == str(x) for k, x in labels.items()))


# -- 1. connections that predate the agent -------------------------------------------------


def engine_request(c: Client, i: int) -> dict:
    body = json.dumps({"model": "sitsprobe-tiny-gpt", "prompt": f"a request on an old connection {i}",
                       "max_tokens": 3, "temperature": 0}).encode()
    entry = c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    usage = json.loads(c.last.split(b"\r\n\r\n", 1)[1])["usage"]
    return dict(entry, tokens=usage["completion_tokens"])


def http_request(c: Client, i: int) -> dict:
    """Methods, paths and statuses that differ from one request to the next."""
    method, path, body = [("GET", f"/late/{i}?q=1", b""), ("POST", "/echo", b"x" * (10 + i)),
                          ("GET", "/status/404", b""), ("PUT", "/echo", b"put"),
                          ("DELETE", f"/things/{i}", b"")][i % 5]
    return c.request(method, path, body=body)


class BodyClient(Client):
    """test_net's tallying client, keeping the last response too."""

    def _read_response(self) -> bytes:
        self.last = super()._read_response()
        return self.last


class Late:
    """A server, the keep-alive connection it accepted before the agent, and
    how to send a request on it."""

    def __init__(self, pid: int, port: int, send):
        self.pid, self.port, self.send = pid, port, send
        self.client = BodyClient(port)
        self.first = send(self.client, 0)  # before the agent: the server is then blocked in recv
        self.client_port = self.client.sock.getsockname()[1]


@pytest.fixture(scope="class")
def late(tmp_path_factory):
    """Three servers, each holding an idle keep-alive connection, and then an
    agent of their own started after those connections."""
    require_root()
    d = tmp_path_factory.mktemp("late")
    servers = []
    try:
        engine = Engine(d, "--max-window-ms", "5", "--model-seed", ENGINE_SEED)
        servers.append(engine)
        servers.append(threaded := Server(None))
        servers.append(asgi := Peer("asgi"))
        peers = {"engine": Late(engine.pid, engine.port, engine_request),
                 "threaded": Late(threaded.pid, threaded.port, http_request),
                 "asgi": Late(asgi.pid, asgi.port, http_request)}
        for p in peers.values():
            assert p.first["status"] == 200, p.first
        time.sleep(0.2)  # each connection's thread (or loop) back waiting for the next request
        select = {"cmdline": [TAG, rf"engine/serve\.py .*--model-seed {ENGINE_SEED}\b"]}
        with running_agent(d, select, {}, {}) as agent:
            for name, p in peers.items():
                wait_until(lambda: agent.tracks(p.pid), 15, f"the agent to track the {name} server")
            wait_until(lambda: f"engine markers: attached to {d}/" in agent.log.read_text(), 15,
                       "the agent to attach to the engine's markers")
            yield agent, peers
            for p in peers.values():
                p.client.close()
    finally:
        for server in servers:
            server.stop()


class TestConnectionsThatPredateTheAgent:
    @pytest.mark.parametrize("server", ["engine", "threaded", "asgi"])
    def test_each_request_on_an_old_connection_is_its_own_span(self, late, server):
        agent, peers = late
        p = peers[server]
        tally = [p.send(p.client, i) for i in range(1, LATE_REQUESTS + 1)]
        assert all(e["status"] in (200, 404) for e in tally), tally

        def on_conn():
            return [s for s in agent.traces.for_pid(p.pid)
                    if s["attrs"].get("client.port") == p.client_port]

        try:
            wait_until(lambda: len(on_conn()) >= LATE_REQUESTS, 15,
                       f"{LATE_REQUESTS} spans on the old connection")
        except AssertionError:
            pass  # the comparison below says what came instead
        time.sleep(0.6)  # engine requests wait for their markers; nothing more may arrive
        spans = on_conn()

        problems = []
        unknown = [s["attrs"] for s in spans
                   if s["name"] == "HTTP unknown" and s["attrs"].get("http.response.size") == 0]
        if unknown:
            problems.append(f"response-less 'HTTP unknown' spans: {unknown}")

        def told(s):
            a = s["attrs"]
            return (a.get("http.request.method"), a.get("url.path"), a.get("http.response.status_code"),
                    a.get("http.request.size"), a.get("http.response.size"), a.get("sitsprobe.partial"))

        expected = Counter((e["method"], e["path"].split("?")[0], e["status"], e["bytes_in"], e["bytes_out"], None)
                           for e in tally)
        got = Counter(told(s) for s in spans)
        if got != expected:
            problems.append(f"(method, path, status, request size, response size, partial) missing: "
                            f"{dict(expected - got)}; unexpected: {dict(got - expected)}; "
                            f"server spans of the pid on other connections: "
                            f"{sum(s['kind'] == 2 for s in agent.traces.for_pid(p.pid)) - len(spans)}")
        if server == "engine":  # each request's engine stages, as children of its span
            children: dict[str, set[str]] = {}
            for s in agent.traces.for_pid(p.pid):
                if s.get("parentSpanId"):
                    children.setdefault(s["parentSpanId"], set()).add(s["name"])
            for s, e in zip(sorted(spans, key=lambda s: int(s["startTimeUnixNano"])), tally):
                want = ENGINE_STAGES if e["tokens"] >= 2 else ENGINE_STAGES - {"decode"}  # EOS first
                have = children.get(s["spanId"], set())
                if not want <= have:
                    problems.append(f"{s['name']!r} (response {s['attrs'].get('http.response.size')} bytes) "
                                    f"has stages {sorted(have)}, not {sorted(want)}")
        assert not problems, f"{server} server, old connection:\n" + "\n".join(problems)


# -- 2. traffic no HTTP/1.1 framing claims --------------------------------------------------


RPCS = 20


def grpc_traffic(port: int, cert: Path | None = None) -> None:
    """RPCS calls; over TLS with ``cert`` (the server's self-signed certificate)."""
    import grpc

    target = f"127.0.0.1:{port}"
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(cert.read_bytes()),
                                  (("grpc.ssl_target_name_override", "localhost"),)) if cert else \
        grpc.insecure_channel(target)
    with channel:
        say = channel.unary_unary(f"/{GREETER}/{SAY_HELLO}")  # no (de)serializers: bytes
        for i in range(RPCS):
            assert say(b"edge %d" % i, timeout=10) == b"hello edge %d" % i


CLOSES = ("close_notify both ways", "close_notify, then close", "close_notify, then reset", "close")


def tls_traffic(port: int) -> None:
    """Keep-alive connections, closed each a way real clients close them: a
    close_notify each way (Python's unwrap), a close_notify and the socket
    closed at once (as curl does), a close_notify and a reset (SO_LINGER 0,
    as clients and balancers that abort do), the socket just closed."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    per = RPCS // len(CLOSES)
    for n, how in enumerate(CLOSES):
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
        for i in range(n * per, (n + 1) * per):
            c.request("GET", f"/tls/{i}")
            r = c.getresponse()
            assert r.status == 200 and r.read() == f"ok /tls/{i}\n".encode()
        if how.endswith("reset"):
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if how.startswith("close_notify"):
            c.sock.setblocking(how == "close_notify both ways")
            try:
                c.sock.unwrap()  # blocking: until the server's close_notify; else sent, not awaited
            except (OSError, ssl.SSLError):
                pass
        c.close()


@pytest.fixture(scope="module")
def unframed(agent, tmp_path_factory):
    """A gRPC server and an HTTPS server, each after RPCS exchanges: the scrape once
    the agent took in what it saw of them, and (the servers stopped, so the agent
    flushed their traces) their spans."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-days", "1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True, timeout=60)
    peers = {}
    try:
        peers["grpc"] = Peer("grpc")
        peers["tls"] = Peer("asgi", "--tls", str(d / "cert.pem"), str(d / "key.pem"))
        peers["grpcs"] = Peer("grpc", "--tls", str(d / "cert.pem"), str(d / "key.pem"))
        for name, p in peers.items():
            wait_until(lambda: agent.tracks(p.pid), 15, f"the agent to track the {name} server")
        wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=peers["tls"].pid) == 1, 15,
                   "the agent to hook the TLS server's libssl")
        grpc_traffic(peers["grpc"].port)
        tls_traffic(peers["tls"].port)
        grpc_traffic(peers["grpcs"].port, d / "cert.pem")
        names = {name: p.thread_comms() for name, p in peers.items()}
        for name, p in peers.items():  # the servers closed their side too: nothing left open
            wait_until(lambda: not established(p.pid), 15, f"the {name} server to close its connections")
            settle(agent, p, names[name])
        scrape = agent.scrape()
    finally:
        for p in peers.values():
            p.stop()
    spans = {}
    for name, p in peers.items():  # retired, the agent flushes its traces
        wait_until(lambda: not agent.tracks(p.pid), 10, f"the agent to retire the {name} server")
        spans[name] = flushed_spans(agent, p.pid)
    return scrape, {name: (p, names[name], spans[name]) for name, p in peers.items()}


def flushed_spans(agent, pid: int, timeout: float = 8) -> list[dict]:
    """The pid's spans once some arrived and none came for half a second (or
    after `timeout`: an agent may export no span for unframed exchanges)."""
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        now = agent.traces.for_pid(pid)
        if len(now) != (len(last) if last is not None else -1):
            last, since = now, time.monotonic()
        elif now and time.monotonic() - since >= 0.5:
            break
        time.sleep(0.1)
    return last or []


def settle(agent, peer: Peer, names: set[str]) -> None:
    """Until the agent has counted something under one of the peer's names and
    those counts stopped moving for a second."""
    def mine(scrape):
        return sorted(line for line in scrape.splitlines()
                      if not line.startswith(("#", "sitsprobe_tracked_process_info"))
                      and any(f'process="{n}"' in line for n in names))

    wait_until(lambda: any(not line.endswith(" 0.0") for line in mine(agent.scrape())), 15,
               f"the agent to count anything of the {peer.kind} server ({sorted(names)})")
    last, since = None, time.monotonic()
    deadline = since + 10
    while time.monotonic() < deadline:
        now = mine(agent.scrape())
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return
        time.sleep(0.2)


@pytest.mark.parametrize("peer", ["grpc", "grpcs"])
def test_unframed_traffic_is_no_http_request(unframed, peer):
    scrape, peers = unframed
    _, names, spans = peers[peer]
    fake = [(n, labels) for n, labels, _ in samples(scrape, "http_server_request_duration_seconds")
            if labels.get("process") in names]
    empty = [(n, labels) for n, labels in fake if not labels.get("http_request_method") or not labels.get("http_response_status_code")]
    assert not empty, f"HTTP request samples with an empty method or status for the {peer} server: {empty[:4]}"
    assert not fake, f"HTTP request samples for the {peer} server, whose bytes are no HTTP/1.1: {fake[:4]}"
    claimed = [s["name"] for s in spans if s["attrs"].get("network.protocol.version") == "1.1"]
    assert not claimed, f"spans from the {peer} server that claim HTTP/1.1: {claimed}"


@pytest.mark.parametrize("peer, family", [("grpc", "rpc_server_call_duration_seconds_count"),
                                          ("tls", "http_server_request_duration_seconds_count")])
def test_grpc_and_tls_from_libssl_are_framed_whole(unframed, peer, family):
    """gRPC over h2c (HTTP/2 framing) and HTTPS through Python's ssl (the libssl
    uprobes): every call counted as what it is, none left unframed."""
    scrape, peers = unframed
    _, names, _ = peers[peer]
    assert in_processes(scrape, family, names) == RPCS
    left = in_processes(scrape, "sitsprobe_unframed_exchanges_total", names)
    assert left == 0, f"{left} exchanges of the {peer} server left unframed"


@pytest.mark.parametrize("peer, protocol", [("grpcs", "tls")])  # grpcio's BoringSSL: no libssl to hook
def test_unframed_exchanges_are_counted_by_protocol(unframed, peer, protocol):
    scrape, peers = unframed
    _, names, _ = peers[peer]
    counted = in_processes(scrape, "sitsprobe_unframed_exchanges_total", names, protocol=protocol)
    by_protocol = {labels.get("protocol"): v for _, labels, v in samples(scrape, "sitsprobe_unframed_exchanges_total")
                   if labels.get("process") in names}
    assert counted > 0, (f"sitsprobe_unframed_exchanges_total{{process in {sorted(names)}, "
                         f"protocol={protocol!r}}} is {counted}; by protocol: {by_protocol}")
    others = {k: v for k, v in by_protocol.items() if k != protocol and v}
    assert not others, f"exchanges of the {peer} server taken for something else: {others}"


@pytest.mark.parametrize("peer", ["grpc", "tls", "grpcs"])
def test_a_connection_closing_is_no_error(unframed, peer):
    _, peers = unframed
    _, _, spans = peers[peer]
    errors = [(s["name"], s["attrs"].get("sitsprobe.complete"), s["attrs"].get("error.type"))
              for s in spans if s.get("status", {}).get("code") == 2]
    print(f"{peer}: {len(spans)} spans: {Counter(s['name'] for s in spans)}")
    assert not errors, (f"ERROR spans from the {peer} server, which answered every request (what went "
                        f"unanswered was a connection closing): {errors}")


# -- 3. a full connection table ------------------------------------------------------------


CONNECTIONS = 500


@pytest.fixture
def nginx(agent, tmp_path: Path):
    if not shutil.which("nginx") or not shutil.which("wrk"):
        pytest.skip("nginx and wrk are needed")
    with Nginx(agent, tmp_path / "nginx") as n:  # worker_connections 1024
        yield n.port, n.workers


def test_a_full_connection_table_still_counts_every_response(agent, nginx):
    port, workers = nginx
    out = subprocess.run(["wrk", "-t2", f"-c{CONNECTIONS}", "-d5s", f"http://127.0.0.1:{port}/index.html"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    complete = int(re.search(r"(\d+) requests in", out).group(1))
    assert "Non-2xx" not in out, out
    print(out)

    def numbers():
        scrape = agent.scrape()
        kernel = sum(v for _, labels, v in samples(scrape, "sitsprobe_http_server_requests_total")
                     if labels.get("pid", "") in {str(w) for w in workers})
        untracked = sum(v for _, labels, v in samples(scrape, "sitsprobe_http_server_requests_untracked_total")
                        if labels.get("pid", "") in {str(w) for w in workers})
        stitched = in_processes(scrape, "sitsprobe_requests_stitched_total", {"nginx"})
        unanswered = in_processes(scrape, "http_server_request_duration_seconds_count", {"nginx"},
                                  http_response_status_code="")
        return kernel, stitched, untracked, unanswered

    # until the counts settle (requests in flight at a scrape): they add up, or stopped moving
    deadline, last, since = time.monotonic() + 30, None, time.monotonic()
    while time.monotonic() < deadline:
        now = numbers()
        kernel, stitched, untracked, unanswered = now
        if now != last:
            last, since = now, time.monotonic()
        elif kernel >= complete and stitched + untracked == kernel or time.monotonic() - since >= 3:
            break
        time.sleep(0.5)
    overflow = agent.metric("sitsprobe_events_lost_total", reason="connection_table_full")
    lost = agent.metric("sitsprobe_events_lost_total", reason="ring_buffer_full")
    told = (f"wrk completed {complete} over {CONNECTIONS} connections; the kernel counted {kernel:.0f}, "
            f"stitched {stitched:.0f} ({unanswered:.0f} of them unanswered), untracked {untracked:.0f} "
            f"(connections the table refused: {overflow:.0f}, "
            f"lost in the ring: {lost:.0f})")
    print(told)
    assert complete <= kernel <= complete + CONNECTIONS, told
    assert stitched + untracked == kernel, told  # nginx answers every request it read
