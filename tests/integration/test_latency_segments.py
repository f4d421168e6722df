"""Issue 11: the kernel's part of the five latency segments, on a real server.
A threaded server that, inside each request, waits 30 ms on a read of a pipe
(as it would on a file or a dependency's socket), or on a real redis-server's
reply (BLPOP with a 30 ms timeout), and then answers: its spans must show the
first wait as io and the second as cache, not as compute; the send calls as
network; and the five adding up to the span. On each socket tier: the socket
tier sees no read of a pipe or a file (its hooks are the socket layer's), so
there a pipe wait is compute, as documented, and the Redis one still cache.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import urllib.request

import pytest

from .conftest import Owned, RedisServer, running_agent, wait_until

SERVER = r"""
import os, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/redis":  # a cache look-up that takes 30 ms: BLPOP on an empty list
            with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as redis:
                redis.sendall(b"*3\r\n$5\r\nBLPOP\r\n$5\r\nempty\r\n$4\r\n0.03\r\n")
                assert redis.recv(64).startswith((b"*-1", b"_"))  # nil: nothing came in time
        elif self.path == "/spin":  # 30 ms of this thread's CPU time, no wait of its own
            end = time.thread_time() + 0.03
            while time.thread_time() < end:
                pass
        else:
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
    def __init__(self, redis_port: int = 0):
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(redis_port)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())


def segments_of(s: dict) -> dict[str, float]:
    parts = {k: s["attrs"][f"sitsprobe.latency.{k}_s"] for k in ("network", "scheduling", "compute", "io", "cache")}
    duration = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
    assert abs(sum(parts.values()) - duration) < 1e-6, (parts, duration)
    return parts


@pytest.fixture(scope="module", params=["socket", "syscall"], ids=lambda t: f"{t}-tier")
def traced(request, tmp_path_factory):
    """(tier, the server, the agent tracing it on that socket tier), once per tier."""
    d = tmp_path_factory.mktemp("agent")
    with RedisServer() as redis, Waiting(redis.port) as server, \
            running_agent(d, {"pids": [server.proc.pid], "cmdline": []}, {},
                          {"socket_hooks": request.param}) as agent:
        wait_until(functools.partial(agent.tracks, server.proc.pid), 15, "the agent to track the server")
        yield request.param, server, agent


def spans_of(agent, server, paths: tuple[str, ...], n: int) -> list[dict]:
    """The first n spans of the server for these paths (the module's other tests ask for others)."""
    return wait_until(lambda: (s := [x for x in agent.traces.for_port(server.port) if x["attrs"]["url.path"] in paths])
                      and len(s) >= n and s, 15, f"{n} spans of {paths}")


def test_a_blocking_read_is_io_and_a_redis_reply_is_cache(traced):
    tier, server, agent = traced
    for path in ("/", "/redis") * 4:
        assert urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5).read() == b"done"
    by_path: dict[str, list[dict]] = {}
    for s in spans_of(agent, server, ("/", "/redis"), 8):
        by_path.setdefault(s["attrs"]["url.path"], []).append(segments_of(s))
    for parts in by_path["/"]:
        if tier == "syscall":
            assert parts["io"] >= 0.025 and parts["cache"] == 0 and parts["compute"] < parts["io"], parts
            assert parts["network"] > 0, parts  # the send calls, at least
        else:  # the pipe's read is not seen: its wait is the server's own time
            assert parts["io"] == 0 and parts["cache"] == 0 and parts["compute"] >= 0.025, parts
    for parts in by_path["/redis"]:
        assert parts["cache"] >= 0.025 and parts["io"] < 0.005 and parts["compute"] < parts["cache"], parts


BUSY = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); print(flush=True)\nwhile True: pass"


def test_waiting_for_a_cpu_is_scheduling(traced):
    """The server shares one CPU with two busy loops: each request's thread
    computes for 30 ms of CPU time, preempted by them again and again, and
    waits its turns to run (raw sched tracepoints on the socket tier,
    perf-event ones on the syscall tier): those waits are scheduling, not
    compute."""
    tier, server, agent = traced
    cpu = max(os.sched_getaffinity(0))
    everywhere = os.sched_getaffinity(server.proc.pid)
    tasks = [int(t) for t in os.listdir(f"/proc/{server.proc.pid}/task")]
    for task in tasks:
        os.sched_setaffinity(task, {cpu})
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for h in hogs:
            h.stdout.readline()
        for _ in range(6):
            assert urllib.request.urlopen(f"http://127.0.0.1:{server.port}/spin", timeout=10).read() == b"done"
        spans = spans_of(agent, server, ("/spin",), 6)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        for task in tasks:  # the module's other tests run on every CPU again
            os.sched_setaffinity(task, everywhere)
    for parts in map(segments_of, spans):  # a third of the CPU: about 60 ms waiting, 30 computing
        assert parts["scheduling"] > 0.015 and parts["compute"] > 0.02, parts
    hook = "raw_tracepoint sched:{sched_switch,sched_wakeup}" if tier == "socket" else "tracepoint sched:sched_switch"
    assert f"run queue timed through {hook}" in agent.log.read_text()
