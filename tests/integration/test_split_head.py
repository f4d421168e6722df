"""A request whose head comes in more than one read: Go's HTTP servers read
a kept-alive connection's next request's first byte alone (the background
read net/http starts while a handler runs), then the rest; any server reads
a head in pieces when its client sends it so. The agent keeps the head
whole; before, a request begun by a one-byte read lost its method and route
("HTTP unknown"), and one after a POST's answer was taken for more of the
POST's body, its answer for a pipelined one's. Each tier is run (TIERS).

Peers no one here wrote: Prometheus (Go's net/http, Debian's package) and
nginx (Debian).
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from .conftest import TAG, Nginx, Owned, accepts, free_port, wait_until
from .test_body_after_answer import read_answer

TIERS = ("socket", "syscall")


class Prometheus(Owned):
    """Prometheus with nothing to scrape; its storage path carries the run's
    tag, by which the agent selects it."""

    def __init__(self, agent, tmp_path):
        if shutil.which("prometheus") is None:
            pytest.skip("no prometheus: .ci/run installs Debian's package")
        self.port = free_port()
        conf = tmp_path / "prometheus.yml"
        conf.write_text("global:\n  scrape_interval: 1h\n")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / TAG}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track prometheus")
        self.until(lambda: accepts(self.port), 20, f"prometheus on port {self.port}")
        self.readiness_calls = 0  # each a request the agent sees, on a connection of its own
        self.until(self._ready, 30, "prometheus ready (its queries answer 503 until then)")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                self.readiness_calls += 1
                return r.status == 200
        except urllib.error.HTTPError:  # 503: answered, not ready yet
            self.readiness_calls += 1
            return False


# (method, path, body) one after another on one connection, four times: a POST's
# form and a PUT's body (405: answered without reading it) among GETs
PROMETHEUS_CALLS = [("GET", "/-/healthy", b""), ("POST", "/api/v1/query", b"query=up"),
                    ("GET", "/api/v1/status/buildinfo", b""), ("PUT", "/api/v1/query", b"z" * 300),
                    ("GET", "/nope", b"")] * 4


def keep_alive(port: int, calls, first_alone: bool = False) -> tuple[int, list[tuple[str, int, int, int]]]:
    """Each call on one connection, its head and body in one send (or, with
    `first_alone`, its first byte, a pause, then the rest), its answer read
    before the next. (client port, [(span name, status, bytes sent, bytes
    answered)])."""
    done, left = [], b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for method, path, body in calls:
            request = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                       f"Content-Type: application/x-www-form-urlencoded\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            if first_alone:
                s.sendall(request[:1])
                time.sleep(0.05)  # the server's read returns that byte alone
                s.sendall(request[1:])
            else:
                s.sendall(request)
            answer, left = read_answer(s, left)
            done.append((f"{method} {path}", int(answer.split(b" ", 2)[1]), len(request), len(answer)))
        return s.getsockname()[1], done


def spans_of(agent, pid: int, n: int) -> list[tuple]:
    wait_until(lambda: len(agent.traces.for_pid(pid)) >= n, 15, f"{n} spans")
    time.sleep(0.3)  # and no more
    spans = sorted(agent.traces.for_pid(pid), key=lambda s: int(s["startTimeUnixNano"]))
    return [(s["attrs"].get("client.port"), s["name"], s["attrs"].get("http.response.status_code"),
             s["attrs"].get("http.request.size"), s["attrs"].get("http.response.size")) for s in spans]


def test_a_go_server_reading_a_request_s_first_byte_alone(agent, tier, tmp_path):
    """Every request to Prometheus is one server span with its method, route,
    status and sizes as the client counted them."""
    with Prometheus(agent, tmp_path) as server:
        port, done = keep_alive(server.port, PROMETHEUS_CALLS)
        assert [status for _, status, _, _ in done] == [200, 200, 200, 405, 404] * 4, done
        spans = spans_of(agent, server.pid, len(done) + server.readiness_calls)
        assert [s for s in spans if s[0] == port] == [(port, *call) for call in done]
        assert [s[1] for s in spans if s[0] != port] == ["GET /-/ready"] * server.readiness_calls
        assert agent.metric("sitsprobe_http_server_requests_total", pid=server.pid) == len(spans)


def test_a_head_sent_a_byte_first(agent, tier, tmp_path):
    """nginx reads each request's first byte, then the rest: one span each, whole."""
    with Nginx(agent, tmp_path / "nginx") as server:
        calls = [("GET", "/index.html", b""), ("GET", "/missing", b"")] * 3
        port, done = keep_alive(server.port, calls, first_alone=True)
        assert [status for _, status, _, _ in done] == [200, 404] * 3, done
        (worker,) = server.workers
        assert spans_of(agent, worker, len(done)) == [(port, *call) for call in done]
