"""A connection whose process shut only its sending side (shutdown(SHUT_WR))
goes on: the server still reads (gunicorn's lingering close), the client
still reads its answer (`nc -N`). On the socket tier the kernel sees the
TCP state move as a close moves it (FIN_WAIT1), so the agent must tell the
two apart; each tier is run (TIERS).

Peers no one here wrote: gunicorn's sync worker, Debian's netcat-openbsd,
Python's http.server (which shuts its side, then closes); and gunicorn on a
Unix socket with Debian's curl, where no TCP state ends a connection at all.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

from .conftest import HERE, TAG, Owned, accepts, children, free_port, wait_until

RUN_TAG = f"{TAG}-half-close-{os.getpid()}"
TIERS = ("socket", "syscall")
AGENT_SELECT = {"cmdline": [re.escape(RUN_TAG)], "comms": [], "ports": []}

BODY = 100  # bytes of each PUT's body, sent after its answer
PUTS = 6
SLOW_CLIENT_S = 0.15  # three of the test agent's flush ticks (conftest: 50 ms)


class Gunicorn(Owned):
    """gunicorn, one sync worker, serving early_wsgi.py; tracked by the agent.
    With ``unix``, bound to that Unix socket path instead of a port."""

    def __init__(self, agent, unix: str | None = None):
        pytest.importorskip("gunicorn", reason="gunicorn is a test extra (pyproject.toml)")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--workers", "1",
             "--bind", f"unix:{unix}" if unix else f"127.0.0.1:{self.port}",
             "--chdir", str(HERE), "--name", RUN_TAG, "early_wsgi:app"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.worker = self.until(lambda: (c := children(self.proc.pid)) and c[0], 15, "gunicorn's worker")
        self.until(lambda: agent.tracks(self.worker), 10, "the agent to track gunicorn's worker")
        if unix:
            self.until(lambda: os.path.exists(unix), 10, f"gunicorn on {unix}")
        else:
            self.until(lambda: accepts(self.port), 10, f"gunicorn on port {self.port}")


def put_answered_before_its_body(port: int) -> tuple[int, int, bytes]:
    """A PUT's head; its answer, read until the server shuts its side; then,
    after a pause longer than the agent's flush tick (a client on a slow
    link), its body, and a pause in which the server reads it, before the
    close. (client port, bytes sent, the answer)."""
    head = (f"PUT /upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {BODY}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        time.sleep(SLOW_CLIENT_S)
        s.sendall(b"y" * BODY)
        time.sleep(0.1)
        return s.getsockname()[1], len(head) + BODY, answer


def test_a_body_read_in_a_lingering_close_is_its_requests(agent, tier):
    """Each PUT is one server span, its body in its size, and the requests
    the kernel counted are the client's: the body is no request of its own
    (it was one, "python unknown exchange", on the socket tier)."""
    with Gunicorn(agent) as server:
        unframed = agent.metric("sitsprobe_unframed_exchanges_total")
        sent = [put_answered_before_its_body(server.port) for _ in range(PUTS)]
        assert all(a.startswith(b"HTTP/1.1 404 ") for _, _, a in sent), sent
        wait_until(lambda: len(agent.traces.for_pid(server.worker)) >= PUTS, 15, f"{PUTS} spans")
        time.sleep(0.5)  # and no more
        spans = agent.traces.for_pid(server.worker)
        got = sorted((s["attrs"].get("client.port"), s["name"], s["attrs"].get("http.response.status_code"),
                      s["attrs"].get("http.request.size"), s["attrs"].get("http.response.size")) for s in spans)
        assert got == sorted((port, "PUT /upload", 404, size, len(answer)) for port, size, answer in sent)
        assert agent.metric("sitsprobe_http_server_requests_total", pid=server.worker) == PUTS
        assert agent.metric("sitsprobe_unframed_exchanges_total") == unframed


class StdlibServer(Owned):
    """Python's http.server over a folder whose path carries the run's tag:
    HTTP/1.0, so it closes each connection after its answer, by shutting its
    side and then closing."""

    def __init__(self, agent, folder):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                      "--directory", str(folder), str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track http.server")
        self.until(lambda: accepts(self.port), 10, f"http.server on port {self.port}")


def test_a_client_that_shuts_its_side_still_reads_its_answer(agent, tmp_path, tier):
    """`nc -N` sends a GET, shuts its sending side at its input's end, and
    reads the answer until http.server closes. nc's one CLIENT span has the
    answer's status and every byte nc printed; http.server's SERVER span
    agrees."""
    nc = shutil.which("nc.openbsd") or shutil.which("nc")  # netcat-traditional has no -N
    if nc is None or "-N" not in subprocess.run([nc, "-h"], capture_output=True, text=True).stderr:
        pytest.skip("no OpenBSD netcat (nc -N): .ci/run installs netcat-openbsd")
    folder = tmp_path / RUN_TAG
    folder.mkdir()
    (folder / "page.txt").write_bytes(b"half-closed\n" * 300)
    with StdlibServer(agent, folder) as server:
        request = f"GET /page.txt HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUser-Agent: nc\r\n\r\n".encode()
        # the agent selects the shell by its command line, and nc (argv[0]) after the exec that
        # a line on stdin lets go: nc connects at once, and the syscall tier follows no
        # connection made before its process was tracked
        shell = f'read -r _ && exec -a "nc-{RUN_TAG}" {nc} -N 127.0.0.1 {server.port}'
        client = subprocess.Popen(["bash", "-c", shell], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            wait_until(lambda: agent.tracks(client.pid), 10, "the agent to track the shell that becomes nc")
            answer, _ = client.communicate(b"go\n" + request, timeout=15)
        finally:
            client.kill()
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"half-closed\n" * 300), answer[:200]
        wait_until(lambda: agent.traces.for_pid(client.pid), 15, "nc's span")
        served = agent.traces.wait_for_port(server.port, 1, pid=server.pid)
        time.sleep(0.5)
        calls = agent.traces.for_pid(client.pid)
        assert [(s["kind"], s["name"], s["attrs"].get("http.response.status_code"),
                 s["attrs"].get("http.request.size"), s["attrs"].get("http.response.size"))
                for s in calls] == [(3, "GET", 200, len(request), len(answer))], calls
        assert [(s["name"], s["attrs"].get("http.response.status_code"), s["attrs"].get("http.response.size"))
                for s in served] == [("GET /page.txt", 200, len(answer))], served


def test_gunicorn_on_a_unix_socket_has_every_connection_s_request(agent, tier, tmp_path):
    """gunicorn behind a local proxy listens on a Unix socket: no TCP state
    ends its connections, and its sync worker, which ends each one after one
    request, accepts the next on the same fd. On the socket tier the first
    call on that fd ends the connection before (end_conn), then is seen again
    as the new one's (sock_io). Each of curl's requests, as curl counted
    them, is one span with its path and status, and one in the kernel's count."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (scripts/setup.sh installs it)")
    path = str(tmp_path / "gunicorn.sock")
    with Gunicorn(agent, unix=path) as server:
        urls = [f"http://localhost/unix/{i}" for i in range(PUTS)]
        out = subprocess.run(["curl", "-s", "--unix-socket", path, "-w", "%{http_code}\n",
                              *(a for u in urls for a in ("-o", "/dev/null", u))],
                             capture_output=True, text=True, timeout=30).stdout.split()
        assert out == ["200"] * PUTS, out  # curl's own tally
        wait_until(lambda: len(agent.traces.for_pid(server.worker)) >= PUTS, 15, f"{PUTS} spans")
        time.sleep(0.5)  # and no more
        spans = agent.traces.for_pid(server.worker)
        got = Counter((s["attrs"].get("url.path"), s["attrs"].get("http.response.status_code")) for s in spans)
        assert got == Counter((f"/unix/{i}", 200) for i in range(PUTS))
        assert agent.metric("sitsprobe_http_server_requests_total", pid=server.worker) == PUTS
    fds = {s["attrs"]["sitsprobe.fd"] for s in spans}
    assert len(fds) < PUTS, f"the test's premise: connections on an earlier one's fd ({fds})"
