"""A traced process's connections that it opened before it was traced (a
pool of upstream connections made at start-up, then a selector that picks
the process up) are followed as a client's: its next calls on them are
CLIENT spans. On the syscall tier the kernel learns a client's connection
at its connect, so the agent seeds those it finds in /proc; each tier is
run (TIERS).

Clients no one here wrote, each connected before its process takes the
name the agent selects: Python's http.client to Python's http.server, and
redis-py to redis-server.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from .conftest import Owned, RedisServer, accepts, free_port, wait_until

COMM = f"sp-open-{os.getpid() % 10000}"  # 15 bytes at most: what the agent selects the clients by
TIERS = ("socket", "syscall")
AGENT_SELECT = {"cmdline": [], "comms": [COMM], "ports": []}

# argv: port, the name to take. Connects, takes the name, waits for a line, calls once, closes.
CLIENTS = {
    "http.client": """\
import http.client
conn = http.client.HTTPConnection("127.0.0.1", int(PORT))
conn.connect()
named()
conn.request("GET", "/page.txt")
r = conn.getresponse()
body = r.read()
conn.close()
print(r.status, len(body), flush=True)
""",
    "redis-py": """\
import redis
r = redis.Redis(port=int(PORT), single_connection_client=True)
r.ping()
named()
value = r.get("opened-before")
r.close()
print(value, flush=True)
""",
}
PRELUDE = """\
import ctypes, sys
PORT = sys.argv[1]

def named():
    if ctypes.CDLL(None).prctl(15, sys.argv[2].encode(), 0, 0, 0) != 0:  # PR_SET_NAME
        sys.exit("prctl failed")
    print("connected", flush=True)
    sys.stdin.readline()  # once the agent traces this process
"""


class StdlibServer(Owned):
    """Python's http.server over ``folder`` (untraced): HTTP/1.0, an answer a connection."""

    def __init__(self, folder):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                      "--directory", str(folder), str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.until(lambda: accepts(self.port), 10, f"http.server on port {self.port}")


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_connection_opened_before_its_process_was_traced_is_followed(agent, tmp_path, tier, client):
    if client == "redis-py":
        pytest.importorskip("redis")
        server = RedisServer()
    else:
        (tmp_path / "page.txt").write_bytes(b"opened before\n" * 100)
        server = StdlibServer(tmp_path)
    with server:
        proc = subprocess.Popen([sys.executable, "-c", PRELUDE + CLIENTS[client], str(server.port), COMM],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline() == "connected\n"
            wait_until(lambda: agent.tracks(proc.pid), 10, "the agent to trace the client")
            out, _ = proc.communicate("go\n", timeout=15)
        finally:
            proc.kill()
        wait_until(lambda: agent.traces.for_pid(proc.pid), 15, "the client's span")
        time.sleep(0.5)  # and no other
        spans = agent.traces.for_pid(proc.pid)
        got = [(s["kind"], s["name"], s["attrs"].get("server.port")) for s in spans]
        if client == "redis-py":
            assert out == "None\n"
            assert got == [(3, "GET", server.port)], spans
        else:
            status, body = map(int, out.split())
            assert got == [(3, "GET", server.port)], spans
            assert spans[0]["attrs"].get("http.response.status_code") == status == 200
            assert body < spans[0]["attrs"]["http.response.size"] < body + 512  # and http.server's head
