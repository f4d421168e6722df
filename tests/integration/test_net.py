"""The spine end to end: real BPF, a real server, a real client over loopback.
What the agent exported is checked against the client's own tally."""
from __future__ import annotations

import os
import re
import socket
import time
from collections import Counter

import pytest

from .conftest import Server, wait_until

TIERS = ("socket", "syscall")  # the exactness of each socket tier that loads (socket_hooks)


class Client:
    """A raw HTTP/1.1 client that knows exactly what it sent and received."""

    def __init__(self, port: int, unix: str | None = None):
        self.port, self.unix = port, unix
        self.sock: socket.socket | None = None
        self.tally: list[dict] = []

    def _connect(self) -> socket.socket:
        if self.unix is None:
            return socket.create_connection(("127.0.0.1", self.port))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.unix)
        return s

    def request(self, method: str, path: str, body: bytes = b"", keep_alive: bool = True,
                headers: dict[str, str] | None = None) -> dict:
        if self.sock is None:
            self.sock = self._connect()
        lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "User-Agent: tally/1"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        if not keep_alive:
            lines.append("Connection: close")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        t0 = time.monotonic_ns()
        self.sock.sendall(raw)
        resp = self._read_response()
        rtt = time.monotonic_ns() - t0
        status = int(resp.split(b" ", 2)[1])
        entry = dict(method=method, path=path, status=status, bytes_in=len(raw),
                     bytes_out=len(resp), rtt_ns=rtt)
        self.tally.append(entry)
        if not keep_alive:
            self.close()
        return entry

    def _read_response(self) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(data) < len(head) + 4 + length:
            data += self.sock.recv(65536)
        return data

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def workload(port: int) -> list[dict]:
    """Several methods, paths and statuses, keep-alive and not."""
    c = Client(port)
    for i in range(12):
        c.request("GET", f"/items/{i}?q=1")
    for status in (201, 404, 500, 503):
        c.request("GET", f"/status/{status}", keep_alive=False)
    for i in range(5):
        c.request("POST", "/echo", body=b"x" * (100 * i + 1))
    c.request("PUT", "/echo", body=b"put-body")
    c.request("DELETE", "/things/7", keep_alive=False)
    c.close()
    return c.tally


def check_against_tally(spans: list[dict], tally: list[dict]) -> None:
    def key(e):
        return (e["method"], e["path"], e["status"], e["bytes_in"], e["bytes_out"])

    seen = Counter(key(dict(method=s["attrs"]["http.request.method"],
                            path=s["attrs"]["url.path"],
                            status=s["attrs"]["http.response.status_code"],
                            bytes_in=s["attrs"]["http.request.size"],
                            bytes_out=s["attrs"]["http.response.size"])) for s in spans)
    expected = Counter(key(dict(e, path=e["path"].split("?")[0])) for e in tally)
    assert seen == expected


@pytest.mark.parametrize("mode", ["sendto", "writev", "sendmsg", "write"])
def test_spans_equal_client_tally(agent, mode):
    with Server(agent, mode) as server:
        tally = workload(server.port)
        spans = agent.traces.wait_for_port(server.port, len(tally), pid=server.pid)
        time.sleep(0.3)  # nothing more may arrive
        spans = agent.traces.for_port(server.port, server.pid)
    assert len(spans) == len(tally)
    check_against_tally(spans, tally)
    by_path = {}
    for s in spans:
        by_path.setdefault(s["attrs"]["url.path"], []).append(int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]))
    longest_rtt = {}
    for e in tally:
        p = e["path"].split("?")[0]
        longest_rtt[p] = max(longest_rtt.get(p, 0), e["rtt_ns"])
    for path, durations in by_path.items():
        assert max(durations) <= longest_rtt[path], path
    s = spans[0]
    assert s["kind"] == 2  # SERVER
    assert s["attrs"]["client.address"] == "127.0.0.1"
    assert s["attrs"]["user_agent.original"] == "tally/1"
    assert s["resource"]["process.pid"] == server.pid


def test_unix_socket_requests_are_counted_and_not_called_tcp(agent, tmp_path):
    """HTTP over a Unix socket (a server behind a local proxy): the same
    tally, no addresses, and no network.transport=tcp (tcp_sendmsg never ran).
    No TCP state tells a Unix connection's end: on the socket tier the next
    connection the server's accept gives the same fd ends the one before
    (sock_io asks end_conn, which hands its call back to sock_io), and the
    new one's first request is still counted."""
    path = str(tmp_path / "server.sock")
    with Server(agent, unix=path) as server:
        tally = []
        for n in range(3):
            c = Client(0, unix=path)
            tally += [c.request("GET", f"/unix/{n}/{i}") for i in range(2)]
            tally.append(c.request("POST", "/echo", body=b"over a unix socket", keep_alive=False))
            time.sleep(0.2)  # the server closes its end, so its next accept gives the same fd
        spans = wait_until(lambda: len(s := agent.traces.for_pid(server.pid)) >= 9 and s, 15,
                           "9 spans from the Unix-socket server")
    check_against_tally(spans, tally)
    for s in spans:
        assert not any(k.startswith(("network.transport", "server.", "client.")) for k in s["attrs"]), s
    fds = Counter(s["attrs"]["sitsprobe.fd"] for s in spans)
    assert max(fds.values()) > 3, f"the test's premise: a connection on an earlier one's fd ({fds})"


def test_server_duration_within_each_round_trip(agent):
    with Server(agent) as server:
        c = Client(server.port)
        tally = [c.request("GET", f"/rtt/{i}x") for i in range(20)]
        c.close()
        spans = agent.traces.wait_for_port(server.port, 20, pid=server.pid)
    by_path = {s["attrs"]["url.path"]: s for s in spans}
    for e in tally:
        s = by_path[e["path"]]
        assert int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"]) <= e["rtt_ns"]


def test_traceparent_makes_the_server_span_a_child(agent):
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with Server(agent) as server:
        c = Client(server.port)
        c.request("GET", "/traced", headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        c.request("GET", "/untraced")
        c.close()
        spans = agent.traces.wait_for_port(server.port, 2, pid=server.pid)
    by_path = {s["attrs"]["url.path"]: s for s in spans}
    assert by_path["/traced"]["traceId"] == trace_id
    assert by_path["/traced"]["parentSpanId"] == parent
    assert by_path["/untraced"]["traceId"] != trace_id
    assert not by_path["/untraced"].get("parentSpanId")


def test_pipelined_chunked_and_streamed_responses(agent):
    with Server(agent) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /p/1 HTTP/1.1\r\nHost: a\r\n\r\nGET /status/404 HTTP/1.1\r\nHost: a\r\n\r\n"
                  b"GET /p/3 HTTP/1.1\r\nHost: a\r\n\r\n")
        got = b""
        while got.count(b"HTTP/1.1") < 3 or not got.endswith(b"ok /p/3\n"):
            got += s.recv(65536)
        s.sendall(b"GET /chunked/5 HTTP/1.1\r\nHost: a\r\n\r\n")
        chunked = b""
        while not chunked.endswith(b"0\r\n\r\n"):
            chunked += s.recv(65536)
        s.close()
        sse = socket.create_connection(("127.0.0.1", server.port))
        sse.sendall(b"GET /sse/7 HTTP/1.1\r\nHost: a\r\n\r\n")
        streamed = b""
        while chunk := sse.recv(65536):
            streamed += chunk
        sse.close()
        spans = agent.traces.wait_for_port(server.port, 5, pid=server.pid)
    by_path = {s["attrs"]["url.path"]: s["attrs"] for s in spans}
    assert set(by_path) == {"/p/1", "/status/404", "/p/3", "/chunked/5", "/sse/7"}
    assert by_path["/status/404"]["http.response.status_code"] == 404
    assert by_path["/p/3"]["http.response.status_code"] == 200
    assert by_path["/chunked/5"]["http.response.size"] == len(chunked)
    assert by_path["/sse/7"]["http.response.size"] == len(streamed)
    assert streamed.count(b"data: token") == 7


def test_garbage_and_a_process_dying_mid_request_leave_the_agent_counting(agent):
    with Server(agent) as server:
        g = socket.create_connection(("127.0.0.1", server.port))
        g.sendall(bytes(range(256)) * 4 + b"\r\n\r\n\x00\xff")
        time.sleep(0.2)
        g.close()
        hang = socket.create_connection(("127.0.0.1", server.port))
        hang.sendall(b"GET /hang HTTP/1.1\r\nHost: a\r\n\r\n")
        time.sleep(0.3)
        server.stop()  # dies with /hang unanswered
        hang.close()
        spans = agent.traces.wait_for_port(server.port, 2, pid=server.pid)
    by_proto = {s["attrs"].get("url.path", "tcp"): s for s in spans}
    assert by_proto["tcp"]["name"].endswith("unknown exchange")
    assert by_proto["/hang"]["status"]["code"] == 2  # ERROR: never answered
    assert by_proto["/hang"]["attrs"]["sitsprobe.complete"] is False
    wait_until(lambda: not agent.tracks(server.pid), 5, "the dead server to be retired")
    assert agent.alive()
    with Server(agent) as again:  # and it still counts
        tally = workload(again.port)
        spans = agent.traces.wait_for_port(again.port, len(tally), pid=again.pid)
        check_against_tally(spans, tally)


def abandon(port: int, request: bytes) -> None:
    """Send a request and close at once: the server's answer, when it comes,
    draws a reset, which loopback delivers inside the very send of it."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)


def test_an_answer_to_a_client_that_left_is_counted_and_stitched(agent):
    with Server(agent) as server:
        for i in range(3):
            abandon(server.port, f"GET /slow/{100 + i} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        spans = wait_until(lambda: (s := [x for x in agent.traces.for_pid(server.pid)
                                          if x["attrs"].get("url.path", "").startswith("/slow/")])
                           and len(s) >= 3 and s, 15, "the three abandoned requests' spans")
        assert all(s["attrs"].get("http.response.status_code") == 200 for s in spans), [s["attrs"] for s in spans]
        assert agent.metric("sitsprobe_http_server_requests_total", pid=server.pid,
                            http_response_status_code=200) == 3


def test_metrics_and_otlp_receiver_agree_with_the_file(agent):
    with Server(agent) as server:
        c = Client(server.port)
        for i in range(17):
            c.request("GET", f"/metered/{1000 + i}")
        c.close()
        spans = agent.traces.wait_for_port(server.port, 17, pid=server.pid)
        kernel = wait_until(lambda: agent.metric("sitsprobe_http_server_requests_total",
                                                 pid=server.pid) == 17 or None,
                            5, "the kernel request count")
        assert kernel
    assert agent.metric("http_server_request_duration_seconds_count", http_route="/metered/{id}",
                        http_request_method="GET", http_response_status_code="200") == 17
    assert agent.metric("sitsprobe_events_lost_total") == 0
    ids = {s["spanId"] for s in spans}
    got = wait_until(lambda: (r := {s.span_id.hex() for _, s in agent.receiver.spans()}) >= ids and r,
                     10, "the gRPC receiver to get every span")
    assert ids <= got


def test_no_query_secret_leaves_the_agent(agent, tmp_path):
    """`?api_key=...&token=...` sent by a real client (urllib) to our server
    and to nginx: the traces (file and OTLP receiver), the metrics and the
    agent's log never hold the values; the names stay, and so do the routes."""
    import urllib.request

    from .conftest import Nginx

    with Nginx(agent, tmp_path / "nginx") as nginx, Server(agent) as server:
        for port in (server.port, nginx.port):
            for i in range(3):
                url = f"http://127.0.0.1:{port}/items/{i}?api_key=SECRET{i}&token=SECRET2&mode=x"
                try:
                    urllib.request.urlopen(url, timeout=5).read()
                except urllib.error.HTTPError as e:  # nginx: 404, a response all the same
                    e.read()
        spans = agent.traces.wait_for_port(server.port, 3, pid=server.pid) + agent.traces.wait_for_port(nginx.port, 3, pid=nginx.pids)
        wait_until(lambda: len(agent.receiver.spans()) >= 6, 10, "the OTLP receiver's spans")
        scrape = agent.scrape()
    assert {s["attrs"]["url.query"] for s in spans} == {"api_key=REDACTED&token=REDACTED&mode=REDACTED"}
    assert {s["attrs"]["http.route"] for s in spans} == {"/items/{id}"}
    exported = agent.traces.path.read_text() + repr(agent.receiver.spans()) + scrape + agent.log.read_text()
    assert "SECRET" not in exported


def test_exited_processes_keep_their_counts_and_leave_no_series(agent):
    """20 servers, each answering 3 requests and killed: every response stays
    in sitsprobe_http_server_requests_total, under its name with pid "", and
    no series names a dead pid, so /metrics does not grow with the dead."""
    def folded() -> float:
        return agent.metric("sitsprobe_http_server_requests_total", pid="")

    def settled() -> bool:  # an earlier test's server, retired meanwhile, would fold its counts into ours
        tracked = re.findall(r'^sitsprobe_tracked_process_info\{[^}]*pid="(\d+)"', agent.scrape(), re.M)
        return all(os.path.exists(f"/proc/{pid}") for pid in tracked)

    wait_until(settled, 10, "the servers of earlier tests to be retired")
    before, size_before, dead = folded(), None, []
    for _ in range(20):
        if len(dead) == 1:  # the routes and names of this test are in the page from now on
            wait_until(lambda: not agent.tracks(dead[0]), 10, "the first server to be retired")
            size_before = len(agent.scrape())
        with Server(agent) as server:
            c = Client(server.port)
            for i in range(3):
                c.request("GET", f"/short/{i}")
            c.close()
            wait_until(lambda: agent.metric("sitsprobe_http_server_requests_total", pid=server.pid) == 3,
                       5, "the kernel count of the short-lived server")
        dead.append(server.pid)
    wait_until(lambda: not any(agent.tracks(p) for p in dead), 10, "the dead servers to be retired")
    assert folded() - before == 60
    page = agent.scrape()
    assert not [line for line in page.splitlines() for p in dead if f'pid="{p}"' in line]
    assert len(page) - size_before < 2_000, "per-pid series of exited processes piled up"


def test_a_traced_process_that_execs_into_an_unselected_program_is_let_go(agent):
    import subprocess
    import sys

    from .conftest import TAG

    code = "import os, sys; sys.stdin.readline(); os.execvp('sleep', ['sleep', '30'])"
    proc = subprocess.Popen([sys.executable, "-c", code, TAG], stdin=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: agent.tracks(proc.pid), 10, "the agent to track the tagged process")
        proc.stdin.write("\n")
        proc.stdin.flush()  # now it becomes `sleep 30`, which nothing selects
        wait_until(lambda: not agent.tracks(proc.pid), 5, "the agent to let the exec'd process go")
        assert "became sleep, which is not selected" in agent.log.read_text()
    finally:
        proc.kill()
        proc.wait()


def test_workers_nginx_forks_on_a_reload_are_found_and_counted_as_nginx_logs_them(agent, tmp_path):
    """nginx reloaded (SIGHUP) forks new workers and execs nothing: no exec
    notice tells the agent, and the rescan, which reads only processes new
    since its last look, finds them. What the kernel then counts for the new
    worker equals the lines nginx's own access log wrote."""
    import signal

    from .conftest import Nginx, children

    log = tmp_path / "counted.log"
    counted = f'location /counted/ {{ access_log {log}; return 200 "counted\\n"; }}'
    with Nginx(agent, tmp_path / "nginx", locations=counted) as nginx:
        old = set(nginx.workers)
        nginx.proc.send_signal(signal.SIGHUP)
        new = wait_until(lambda: [p for p in children(nginx.pid) if p not in old] or None, 10,
                         "nginx's new worker")
        wait_until(lambda: all(agent.tracks(p) for p in new), 10, "the agent to track the new worker")
        wait_until(lambda: not set(children(nginx.pid)) & old, 10, "the old worker to leave")
        for i in range(7):
            Client(nginx.port).request("GET", f"/counted/{i}", keep_alive=False)
        lines = wait_until(lambda: len(log.read_text().splitlines()) == 7 or None, 10, "nginx's log")
        assert lines
        wait_until(lambda: sum(agent.metric("sitsprobe_http_server_requests_total", pid=p) for p in new)
                   == len(log.read_text().splitlines()), 10, "the kernel's count of the new worker")


def test_a_process_that_execs_and_then_renames_itself_is_found_by_its_new_name(tmp_path):
    """A rescan reads a process it found unselected only while it is young,
    or young again: it exec'd. A shell that was there before the agent
    (found unselected, old, passed over) execs a program that renames itself
    a second later (prctl, as servers' setproctitle does): the agent, told of
    the exec by the kernel, reads it again and finds it by its new name."""
    import subprocess
    import sys

    from .conftest import require_root, running_agent

    require_root()
    rename = ("import ctypes, time; time.sleep(1); "
              "ctypes.CDLL(None).prctl(15, b'sp-renamed', 0, 0, 0); time.sleep(60)")
    proc = subprocess.Popen(["sh", "-c", f'read line; exec {sys.executable} -c "{rename}"'],
                            stdin=subprocess.PIPE, text=True)
    try:
        with running_agent(tmp_path, {"comms": ["sp-renamed"], "cmdline": []}, {}, {}) as agent:
            time.sleep(0.5)  # a few rescans: the shell is passed over by now
            assert not agent.tracks(proc.pid)
            proc.stdin.write("\n")
            proc.stdin.flush()
            wait_until(lambda: agent.tracks(proc.pid), 10, "the agent to find the renamed process")
    finally:
        proc.kill()
        proc.wait()


def test_a_server_restarted_on_a_selected_port_is_traced_from_its_first_request(tmp_path):
    """--port with a rescan a minute away: the kernel sees the listen() on the
    port and tracks the process there and then, so the requests sent the
    moment it listens are all counted and traced, twice over a restart."""
    from .conftest import free_port, require_root, running_agent

    require_root()
    port = free_port()
    with running_agent(tmp_path, {"ports": [port], "cmdline": [], "comms": [], "rescan_interval_s": 60},
                       {}, {}) as agent:
        for life in range(2):
            with Server(None, port=port) as server:  # no waiting for the agent: at once
                tally = [Client(port).request("GET", f"/life/{life}/{i}", keep_alive=False)
                         for i in range(5)]
                spans = agent.traces.wait_for_port(port, 5 * (life + 1))
                kernel = wait_until(lambda: agent.metric("sitsprobe_http_server_requests_total",
                                                         pid=server.pid) == 5 or None, 5,
                                    "the kernel count of the new server")
                assert kernel
            assert len([s for s in spans if s["attrs"]["url.path"].startswith(f"/life/{life}/")]) == len(tally)
