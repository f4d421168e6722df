"""The agent with the Redis preset and the probe-free RESP mode, against a
real redis-server: per-prefix and per-client counts equal the workload's own
tally and Redis's INFO stats; the heatmap is served and drawn."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections import Counter

import pytest

from tests.otlp_receiver import accepts

from .conftest import ROOT, port_for_later, wait_until

REDIS_PORT = port_for_later()  # bound minutes after this module is imported
AGENT_SELECT = {"ports": [REDIS_PORT]}  # redis-server is traced too, for the RESP mode
AGENT_EXTRA = {"cache": {"probes": ["redis"], "resp_mode": True, "bucket_s": 1}}
AGENT_TRACES = {"metrics_interval_s": 0.5}
CLIENTS = ("127.0.0.2", "127.0.1.3")


def resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Client:
    def __init__(self, port: int, source: str):
        self.sock = socket.socket()
        self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.buf = b""

    def call(self, *args: bytes) -> bytes:
        self.sock.sendall(resp(*args))
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        line, _, rest = self.buf.partition(b"\r\n")
        if line.startswith(b"$") and line != b"$-1":
            n = int(line[1:])
            while len(rest) < n + 2:
                rest += self.sock.recv(65536)
            self.buf = rest[n + 2:]
            return rest[:n]
        self.buf = rest
        return line


def info(c: Client) -> dict[str, int]:
    text = c.call(b"INFO", b"stats").decode()
    return {k: int(v) for k, v in (ln.split(":", 1) for ln in text.splitlines() if ":" in ln)
            if k in ("keyspace_hits", "keyspace_misses")}


@pytest.fixture(scope="module")
def redis(agent):
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is needed: .ci/run installs it")
    port = REDIS_PORT
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--protected-mode", "no"], stdout=subprocess.DEVNULL)
    wait_until(lambda: agent.tracks(proc.pid), 15, "the agent to track redis-server")
    wait_until(lambda: accepts(port), 10, "redis to listen")
    yield port
    proc.kill()
    proc.wait()


def test_preset_and_resp_mode_count_what_redis_counts(agent, redis):
    clients = {src: Client(redis, src) for src in CLIENTS}
    admin = Client(redis, "127.0.0.1")
    for i in range(40):
        admin.call(b"SET", b"user:%d" % i, b"v")
    before = info(admin)
    tally = Counter()  # (prefix, client, hit)
    for n in range(300):
        src = CLIENTS[n % 2]
        prefix = (b"user", b"session", b"feed")[n % 3]
        key = b"%s:%d" % (prefix, n % 57)  # user:<57 hits only under 40
        hit = clients[src].call(b"GET", key) != b"$-1"
        tally[(prefix.decode(), src, hit)] += 1
    after = info(admin)
    hits = sum(n for (_, _, h), n in tally.items() if h)
    misses = sum(n for (_, _, h), n in tally.items() if not h)
    assert (after["keyspace_hits"] - before["keyspace_hits"],
            after["keyspace_misses"] - before["keyspace_misses"]) == (hits, misses)

    def counted(cache, prefix, result):
        return agent.metric("sitsprobe_cache_lookups_total", cache=cache, prefix=prefix, result=result)

    for cache in ("redis", "redis-resp"):
        for prefix in ("user", "session", "feed"):
            for hit, result in ((True, "hit"), (False, "miss")):
                want = sum(n for (p, _, h), n in tally.items() if p == prefix and h == hit)
                wait_until(lambda: counted(cache, prefix, result) >= want, 10,
                           f"{cache} {prefix} {result} to reach {want}")
                assert counted(cache, prefix, result) == want, (cache, prefix, result)

    def otlp(prefix, result):  # the same counters, over OTLP metrics to a real receiver
        return sum(v for a, v in agent.receiver.metrics.points("sitsprobe_cache_lookups")
                   if a == {"cache": "redis", "prefix": prefix, "result": result})

    want = sum(n for (p, _, h), n in tally.items() if p == "user" and h)
    wait_until(lambda: otlp("user", "hit") == want, 10, "the OTLP metrics to show the same count")

    text = subprocess.run([sys.executable, "-m", "sitsprobe.cli", "heatmap", "--url", agent.metrics_url],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert "user" in text.stdout and "127.0.0.0/24" in text.stdout and "127.0.1.0/24" in text.stdout


def test_heatmap_png(agent, redis, tmp_path):
    out = tmp_path / "heat.png"
    p = subprocess.run([sys.executable, "-m", "sitsprobe.cli", "heatmap", "--url", agent.metrics_url,
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
