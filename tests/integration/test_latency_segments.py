"""Issue 11: the kernel's part of the five latency segments, on a real server.
A threaded server that, inside each request, waits 30 ms on a read of a pipe
(as it would on a file or a dependency's socket), and then answers: its spans
must show that wait as io, not as compute; the send calls as network; and the
five adding up to the span.
"""
from __future__ import annotations

import functools
import subprocess
import sys
import urllib.request

from .conftest import Owned, running_agent, wait_until

SERVER = r"""
import os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        r, w = os.pipe()
        threading.Timer(0.03, os.write, (w, b"x")).start()  # the answer, 30 ms from now
        os.read(r, 1)  # blocks: a read of something that is not this connection
        os.close(r), os.close(w)
        body = b"done"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


class Waiting(Owned):
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())


def test_a_blocking_read_inside_a_request_is_io(tmp_path):
    (tmp_path / "agent").mkdir()
    with Waiting() as server, running_agent(tmp_path / "agent", {"pids": [server.proc.pid], "cmdline": []},
                                            {}, {}) as agent:
        wait_until(functools.partial(agent.tracks, server.proc.pid), 15, "the agent to track the server")
        for _ in range(5):
            assert urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=5).read() == b"done"
        spans = agent.traces.wait_for_port(server.port, 5)
    for s in spans:
        a = s["attrs"]
        duration = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
        parts = {k: a[f"sitsprobe.latency.{k}_s"] for k in ("network", "scheduling", "compute", "io", "cache")}
        assert abs(sum(parts.values()) - duration) < 1e-6, (parts, duration)
        assert 0.025 <= parts["io"] <= duration, parts  # the 30 ms wait on the pipe
        assert parts["compute"] < parts["io"], parts
        assert parts["network"] > 0, parts  # the send calls, at least
