"""What quiet keep-alive connections cost the agent.

    sudo .venv/bin/python bench/bench_idle.py [--conns 500,2000,8000] [--seconds 10]

An inference gateway holds thousands of keep-alive connections, most of them
quiet between requests. The agent follows each one in its kernel map, and its
flush tick (every stitch.flush_interval_ms) looks at all of them. For each N this
starts the test server (tests/integration/httpserver.py, a thread per
connection), the agent on it (`sitsprobe run --pid`), opens N connections
that each make one request and then stay open, and measures the agent's CPU
(user + sys) over --seconds of quiet. Nothing else runs: every CPU second the
agent uses here is for the connections it holds.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_http import Agent, cpu_s, machine

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "integration" / "httpserver.py"


def hold(port: int, n: int) -> list[socket.socket]:
    """n connections, one answered request each, left open."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /idle HTTP/1.1\r\nHost: bench\r\n\r\n")
        socks.append(s)
    for s in socks:
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"\n"):
            data += s.recv(4096)
    return socks


def measure(n: int, seconds: float, tmp: Path) -> float:
    """The agent's CPU, as a share of one core, while n connections are quiet."""
    server = subprocess.Popen([sys.executable, str(SERVER), "--tag", "bench-idle"],
                              stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    agent = Agent(["--pid", str(server.pid)], [server.pid], tmp, f"idle-{n}")
    try:
        socks = hold(port, n)
        time.sleep(2)  # the responses are flushed; the map is now n quiet connections
        c0, t0 = cpu_s(agent.ps), time.monotonic()
        time.sleep(seconds)
        share = (cpu_s(agent.ps) - c0) / (time.monotonic() - t0)
        for s in socks:
            s.close()
        return share
    finally:
        agent.stop()
        server.kill()
        server.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conns", default="0,500,2000,8000", help="connection counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=10, help="quiet time measured per count")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_idle: run as root (the agent loads BPF)", file=sys.stderr)
        return 2
    counts = [int(c) for c in a.conns.split(",")]
    print(f"reproduce: cd {ROOT} && sudo .venv/bin/python bench/bench_idle.py "
          f"--conns {a.conns} --seconds {a.seconds:g}")
    print("\n".join(machine()))
    tmp = Path(tempfile.mkdtemp(prefix="sitsprobe-bench-idle-"))
    print(f"\n{'connections':>11} {'agent CPU, % of a core':>23}")
    for n in counts:
        print(f"{n:11d} {100 * measure(n, a.seconds, tmp):23.1f}", flush=True)
    print(f"\nagent logs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
