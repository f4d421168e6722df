"""TLS from the library: HTTPS framed exactly like cleartext.

uvicorn (Python's ssl module over asyncio's memory BIOs), nginx (OpenSSL
on its sockets) and Node (its official builds, NodeSource's among them, link
OpenSSL into the executable and map no libssl; Debian's maps libssl), and
HAProxy terminating TLS in front of nginx, with a self-signed certificate, driven over HTTPS with keep-alive:
every request one span with its path and status, equal to the client's
tally, and no opaque `tls` exchange beside them. grpcio carries BoringSSL
inside its module: the agent says it cannot read it.
"""
from __future__ import annotations

import collections
import http.client
import json
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcOtlpReceiver

from .conftest import HERE, TAG, Nginx, NodeScript, Owned, require_root, running_agent, wait_until

TIERS = ("socket", "syscall")  # the exactness of each socket tier that loads (socket_hooks)
PATHS = ("/json/a", "/status/404", "/json/b", "/status/503")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl (the command) makes the test certificate: .ci/run installs it")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


class HttpsUvicorn(Owned):
    def __init__(self, agent, cert: tuple[str, str]):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "peers.py"), "uvicorn", "--tag", TAG,
                                      "--tls", *cert], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track uvicorn")


def https_node(agent, cert: tuple[str, str]) -> NodeScript:
    return NodeScript(agent, "https_node.js", *cert)


def drive(port: int, paths, connections: int = 3, per_connection: int = 8) -> collections.Counter:
    """Requests over HTTPS, several per connection; the client's own tally by (path, status)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    tally: collections.Counter = collections.Counter()
    for c in range(connections):
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
        for i in range(per_connection):
            path = paths[(c + i) % len(paths)]
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            tally[path, r.status] += 1
        conn.close()
    return tally


def _traced_past_the_capture(port: int, n: int) -> set[tuple[str, str]]:
    """n GETs over HTTPS whose traceparent follows 400 bytes of another header:
    their (trace id, parent span id)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    sent = set()
    for i in range(n):
        trace, parent = f"{0xabc0 + i:032x}", f"{0x5e0 + i:016x}"
        conn.request("GET", "/", headers={"X-Pad": "p" * 400, "traceparent": f"00-{trace}-{parent}-01"})
        conn.getresponse().read()
        sent.add((trace, parent))
    conn.close()
    return sent


def check(agent, port: int, pid: int, tally: collections.Counter) -> None:
    total = sum(tally.values())
    spans = agent.traces.wait_for_port(port, total, timeout=20, pid=pid)
    got = collections.Counter((s["attrs"].get("url.path"), s["attrs"].get("http.response.status_code"))
                              for s in spans)
    assert got == tally, [s["name"] for s in spans]
    opaque = [s for s in agent.traces.for_pid(pid) if s["attrs"].get("sitsprobe.protocol") == "tls"]
    assert not opaque, opaque[:2]


def test_uvicorn_over_https_is_framed_like_cleartext(agent, certificate):
    with HttpsUvicorn(agent, certificate) as server:
        # the ssl module is loaded at start: its libssl is hooked before the first connection
        wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=server.pid) == 1, 10,
                   "the agent to hook uvicorn's libssl")
        check(agent, server.port, server.pid, drive(server.port, PATHS))


def test_nginx_over_https_is_framed_like_cleartext(agent, certificate, tmp_path):
    with Nginx(agent, tmp_path / "nginx", tls=certificate) as nginx:
        wait_until(lambda: all(agent.metric("sitsprobe_tls_processes", pid=p) == 1 for p in nginx.workers),
                   10, "the agent to hook nginx's libssl")
        tally = drive(nginx.port, ("/", "/missing", "/index.html"))
        assert tally["/missing", 404] and tally["/", 200]
        check(agent, nginx.port, nginx.workers[0], tally)


def test_a_second_start_loads_the_tls_programs_the_first_compiled(certificate, tmp_path):
    """The first agent compiles the TLS module once nginx's libssl shows, and
    keeps its programs beside net.c's (compiled_dir); the next, with the same
    settings, makes the module's maps alone and loads them: nginx over HTTPS
    is framed as before, a span for each of the client's requests."""
    require_root()
    kept = tmp_path / "compiled"
    for run in ("first", "second"):
        d = tmp_path / run
        d.mkdir()
        with running_agent(d, {}, {}, {"compiled_dir": str(kept)}) as agent, \
                Nginx(agent, d / "nginx", tls=certificate) as nginx:
            wait_until(lambda: all(agent.metric("sitsprobe_tls_processes", pid=p) == 1 for p in nginx.workers),
                       10, "the agent to hook nginx's libssl")
            check(agent, nginx.port, nginx.workers[0], drive(nginx.port, ("/", "/missing"), 2, 5))
            # a traceparent past the bytes captured with a head: found by the tail call that scans it
            sent = _traced_past_the_capture(nginx.port, 3)
            spans = agent.traces.wait_for_port(nginx.port, 10 + 3, timeout=20, pid=nginx.pids)
            assert sent <= {(s["traceId"], s.get("parentSpanId")) for s in spans}, sent
        said = (d / "agent.log").read_text()
        assert ("tls programs kept from an earlier start" in said) == (run == "second"), said
        assert len(list(kept.iterdir())) == 2  # net.c's, and the TLS module's


def test_haproxy_over_https_is_framed_like_cleartext(agent, certificate, tmp_path):
    """HAProxy (Debian's, on libssl) terminating TLS in front of nginx: its
    requests framed from the plaintext, its calls to nginx in cleartext."""
    from .test_calls import HAProxy

    pem = tmp_path / "haproxy.pem"  # HAProxy takes the certificate and its key in one file
    pem.write_text(Path(certificate[0]).read_text() + Path(certificate[1]).read_text())
    with Nginx(agent, tmp_path / "nginx") as up, HAProxy(agent, tmp_path / f"haproxy-{TAG}", up.port,
                                                          str(pem)) as gateway:
        wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=gateway.pid) == 1, 15,
                   "the agent to hook HAProxy's libssl")
        tally = drive(gateway.port, ("/", "/missing", "/index.html"))
        assert tally["/missing", 404] and tally["/", 200]
        check(agent, gateway.port, gateway.pid, tally)


def test_node_over_https_is_framed_like_cleartext(agent, certificate):
    """Node's official builds map no libssl: the probes go on the executable, which exports
    OpenSSL's functions (tests/unit/test_tls_status.py checks that path whatever this node is)."""
    with https_node(agent, certificate) as server:
        wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=server.pid) == 1, 15,
                   "the agent to hook the OpenSSL in node")
        check(agent, server.port, server.pid, drive(server.port, PATHS))


def test_http2_over_tls_is_framed_like_h2c(agent, certificate):
    """hypercorn with a certificate (h2 by ALPN), httpx's HTTP/2 client: exact per path and status."""
    import httpx

    from .test_http2 import H2Peer

    with H2Peer(agent, "hypercorn", certificate) as server:
        wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=server.pid) == 1, 10,
                   "the agent to hook hypercorn's libssl")
        tally: collections.Counter = collections.Counter()
        with httpx.Client(http1=False, http2=True, verify=False, base_url=f"https://127.0.0.1:{server.port}") as c:
            for i in range(12):
                path = ("/status/200", "/status/404", "/big/5000")[i % 3]
                r = c.get(path)
                assert r.http_version == "HTTP/2"
                tally[path, r.status_code] += 1
        check(agent, server.port, server.pid, tally)
        spans = agent.traces.for_port(server.port, server.pid)
        assert {s["attrs"].get("network.protocol.version") for s in spans} == {"2"}


def test_doctor_names_what_it_cannot_decrypt(agent, certificate):
    """grpcio's module carries BoringSSL: doctor says so; uvicorn's ssl maps libssl; node is readable."""
    from .test_http2 import H2Peer

    with H2Peer(agent, "grpc") as grpc_server, HttpsUvicorn(agent, certificate) as https, \
            https_node(agent, certificate) as node:
        doctor = subprocess.run([sys.executable, "-m", "sitsprobe.cli", "doctor", "--json",
                                 "--pid", str(grpc_server.pid), "--pid", str(https.pid), "--pid", str(node.pid)],
                                capture_output=True, text=True, timeout=120)
        tls = json.loads(doctor.stdout)["tls"]
        assert not tls[str(grpc_server.pid)]["ok"] and "BoringSSL" in tls[str(grpc_server.pid)]["detail"], tls
        assert tls[str(https.pid)]["ok"] and "libssl" in tls[str(https.pid)]["detail"], tls
        # OpenSSL in the executable (nodejs.org's and NodeSource's builds), or Debian's shared libssl
        assert tls[str(node.pid)]["ok"] and ("OpenSSL linked into the program" in tls[str(node.pid)]["detail"]
                                             or "libssl mapped" in tls[str(node.pid)]["detail"]), tls



class SlowCollector(GrpcOtlpReceiver):
    """A collector that takes half a second to answer each export."""

    def Export(self, request, context):  # noqa: N802 (the gRPC method's name)
        time.sleep(0.5)
        return super().Export(request, context)


def test_a_stop_sends_every_span_before_the_kernel_takes_the_tls_probes_off(certificate, tmp_path):
    """Each process whose libssl is probed has 8 uprobes of its own, and the
    kernel takes each off in some 0.1 s, one after the other: nginx and 3
    idle processes outlast stop_timeout_s. The spans of nginx's HTTPS
    answers still waiting for their batch (traces.export_delay_ms) go to a
    slow collector before that, and are counted delivered, not dropped."""
    require_root()
    idle = [subprocess.Popen([sys.executable, "-c", "import ssl, time; time.sleep(120)", f"{TAG}-tls-idle"])
            for _ in range(3)]
    nginx = None
    try:
        with SlowCollector() as collector, \
                running_agent(tmp_path, {}, {"otlp_endpoint": collector.endpoint, "export_delay_ms": 60000},
                              {"stop_timeout_s": 1.5}) as agent:
            nginx = Nginx(agent, tmp_path / "nginx", tls=certificate)  # alive through the stop: an exiting
            probed = [p.pid for p in idle] + nginx.workers              # process's spans are sent at once
            wait_until(lambda: all(agent.metric("sitsprobe_tls_processes", pid=p) == 1 for p in probed), 60,
                       "the agent to probe every process's libssl")
            tally = drive(nginx.port, ("/", "/missing"))
            n = sum(tally.values())
            wait_until(lambda: agent.metric("sitsprobe_requests_stitched_total") >= n, 10,
                       "the agent to stitch the client's requests")
    finally:
        if nginx is not None:
            nginx.stop()
        for p in idle:
            p.kill()
            p.wait()
    said = (tmp_path / "agent.log").read_text()
    [accounting] = [line for line in said.splitlines() if " spans: file: " in line]
    assert f"file: {n} delivered; otlp: {n} delivered" in accounting, accounting
    spans = agent.traces.for_port(nginx.port, nginx.pids)
    assert collections.Counter((s["attrs"]["url.path"], s["attrs"]["http.response.status_code"]) for s in spans) \
        == tally
    assert len(collector.spans()) == n
