"""A keep-alive server that answers a request from its head (an upload it
rejects) reads the rest of the body afterwards, and with it whatever the
client sent next: one read holds the body's end and the next request. The
agent ends the first request at its Content-Length and begins the next one
there; before, the next request was taken for more body and its answer for
a pipelined one, its request unknown ("HTTP unknown"). Each tier is run
(TIERS).

Peers no one here wrote: Node's http module (nodejs), gunicorn's
threaded worker (PyPI); each serves a PUT 404 from its head, and a GET.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from .conftest import HERE, TAG, NodeScript, Owned, accepts, children, free_port, wait_until

RUN_TAG = f"{TAG}-body-after-answer-{os.getpid()}"
TIERS = ("socket", "syscall")
AGENT_SELECT = {"cmdline": [re.escape(RUN_TAG)], "comms": [], "ports": []}

BODY = 100  # bytes of each PUT's body, sent after its answer
ROUNDS = 5  # PUT, then GET, on one connection


class GunicornThreads(Owned):
    """gunicorn's gthread worker (keep-alive), serving early_wsgi.py; tracked by the agent."""

    def __init__(self, agent):
        pytest.importorskip("gunicorn", reason="gunicorn is a test extra (pyproject.toml)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--threads", "2",
             "--bind", f"127.0.0.1:{self.port}", "--chdir", str(HERE), "--name", RUN_TAG, "early_wsgi:app"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.until(lambda: (c := children(self.proc.pid)) and c[0], 15, "gunicorn's worker")
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track gunicorn's worker")
        self.until(lambda: accepts(self.port), 10, f"gunicorn on port {self.port}")


def read_answer(s: socket.socket, buffered: bytes) -> tuple[bytes, bytes]:
    """One answer framed by its Content-Length; (it, the bytes after it)."""
    data = buffered
    while b"\r\n\r\n" not in data:
        data += s.recv(4096) or pytest.fail(f"closed mid-answer: {data!r}")
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head).group(1))
    while len(rest) < length:
        rest += s.recv(4096) or pytest.fail(f"closed mid-answer: {data!r}")
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


def put_then_get(port: int) -> tuple[int, list[tuple[str, int, int, bytes]]]:
    """ROUNDS times on one connection: a PUT's head; its answer; then its
    body and a GET in one send, so that the server's read of the body's end
    holds the GET; the GET's answer. (client port, [(name, status, bytes
    sent, answer)])."""
    put = (f"PUT /upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {BODY}\r\n\r\n").encode()
    get = f"GET /hello HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    sent, left = [], b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(ROUNDS):
            s.sendall(put)
            answer, left = read_answer(s, left)
            sent.append(("PUT /upload", 404, len(put) + BODY, answer))
            s.sendall(b"y" * BODY + get)
            answer, left = read_answer(s, left)
            sent.append(("GET /hello", 200, len(get), answer))
        return s.getsockname()[1], sent


def node(agent) -> NodeScript:
    return NodeScript(agent, "early_node.js", tag=RUN_TAG)


@pytest.mark.parametrize("server", [node, GunicornThreads], ids=["node", "gunicorn-gthread"])
def test_the_request_after_a_body_read_late_is_its_own(agent, tier, server):
    """Every request is one server span with its method, route, status and
    sizes as the client counted them; none is unknown, and the requests the
    kernel counted are the client's."""
    with server(agent) as srv:
        port, sent = put_then_get(srv.port)
        assert [(a.split(b" ", 2)[1]) for *_, a in sent] == [b"404", b"200"] * ROUNDS, sent
        wait_until(lambda: len(agent.traces.for_pid(srv.pid)) >= len(sent), 15, f"{len(sent)} spans")
        spans = sorted(agent.traces.for_pid(srv.pid), key=lambda s: int(s["startTimeUnixNano"]))
        got = [(s["attrs"].get("client.port"), s["name"], s["attrs"].get("http.response.status_code"),
                s["attrs"].get("http.request.size"), s["attrs"].get("http.response.size")) for s in spans]
        assert got == [(port, name, status, size, len(answer)) for name, status, size, answer in sent]
        assert agent.metric("sitsprobe_http_server_requests_total", pid=srv.pid) == len(sent)
