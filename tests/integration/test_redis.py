"""Cache probes on a real Redis: what the uprobe counts equals the client's own
tally and Redis's INFO stats (keyspace_hits/misses) exactly, per key prefix and
per client; through a Redis started before the probe, one started after it,
and a restart. The probe-free side (sitsprobe.stitch.protocols.resp) is fed the exact
bytes each raw RESP client sent and received, and must agree with the probe.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from sitsprobe.cache import CacheStats, KeyLookup, redis_spec
from sitsprobe.stitch.protocols.resp import resp_get_results
from sitsprobe.request import Endpoint

from .conftest import free_port, wait_until

pytestmark = pytest.mark.integration

REDIS = shutil.which("redis-server")
CLIENT_A, CLIENT_B = "127.0.0.2", "127.0.1.3"  # subnets 127.0.0.0/24 and 127.0.1.0/24


def _require():
    if os.geteuid() != 0:
        pytest.skip("cache probes load BPF programs: run the integration tests as root (CI does)")
    if REDIS is None:
        pytest.skip("no redis-server on PATH: apt-get install redis-server")
    pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")


# -- a real Redis, and a raw RESP client that keeps every byte ----------------


class Redis:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid
        wait_until(self._up, 10, f"redis-server on port {self.port}")

    def _up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stats(self) -> tuple[int, int]:
        """INFO stats keyspace_hits, keyspace_misses: Redis's own count."""
        c = Client(self.port, "127.0.0.1")
        info = c.call([b"INFO", b"stats"])[0].decode()
        c.close()
        f = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        return int(f["keyspace_hits"]), int(f["keyspace_misses"])

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def encode(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Client:
    """Raw RESP2 over a socket bound to a chosen loopback source address."""

    def __init__(self, port: int, source: str):
        self.source = source
        self.sock = socket.socket()
        self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.local = Endpoint(*self.sock.getsockname()[:2])
        self.sent = bytearray()
        self.received = bytearray()
        self._buf = b""

    def call(self, *commands: list[bytes]) -> list:
        """Send the commands in one write (a pipeline); return their replies."""
        payload = b"".join(encode(c) for c in commands)
        self.sock.sendall(payload)
        self.sent += payload
        return [self._reply() for _ in commands]

    def _more(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.received += chunk
        self._buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            self._more()
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return rest if kind == b"+" else RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self._buf) < n + 2:
                self._more()
            value, self._buf = self._buf[:n], self._buf[n + 2:]
            return value
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise AssertionError(f"unexpected reply {line!r}")

    def close(self):
        self.sock.close()


class Tally:
    """The workload's own count of read look-ups, by prefix and by client."""

    def __init__(self):
        self.by_prefix: Counter = Counter()  # (prefix, hit)
        self.by_client: Counter = Counter()  # ((address, port), hit)
        self.hits = self.misses = 0

    def lookup(self, client: Client, key: bytes, hit: bool):
        self.by_prefix[(key.split(b":")[0].decode(), hit)] += 1
        self.by_client[((client.local.address, client.local.port), hit)] += 1
        self.hits += hit
        self.misses += not hit

    def get(self, client: Client, *keys: bytes):
        """GET each key, pipelined; tally each reply."""
        for key, value in zip(keys, client.call(*[[b"GET", k] for k in keys])):
            self.lookup(client, key, value is not None)

    def mget(self, client: Client, *keys: bytes):
        (values,) = client.call([b"MGET", *keys])
        for key, value in zip(keys, values):
            self.lookup(client, key, value is not None)

    def exists(self, client: Client, key: bytes):
        (n,) = client.call([b"EXISTS", key])
        self.lookup(client, key, n == 1)


def populate(c: Client):
    """Write look-ups only (filtered out by the preset; INFO does not count them)."""
    c.call(*[[b"SET", b"user:%d" % i, b"u"] for i in range(0, 100, 2)])
    c.call(*[[b"SET", b"session:%d" % i, b"s"] for i in range(0, 40, 4)])
    c.call(*[[b"SET", b"model:%d" % i, b"m" * 200] for i in range(20)])
    c.call([b"INCR", b"counter:x"], [b"DEL", b"user:98"], [b"APPEND", b"model:0", b"!"])


def workload(t: Tally, a: Client, b: Client):
    """user 49/100 hits, session 10/40, model all, absent none; single GETs,
    pipelines, MGET and EXISTS, from two clients in two subnets."""
    for i in range(100):
        t.get(a, b"user:%d" % i)
    t.get(b, *[b"session:%d" % i for i in range(40)])
    t.mget(a, *[b"model:%d" % i for i in range(20)], b"absent:1", b"absent:2")
    for i in range(15):
        t.get(b, b"absent:%d" % i, b"model:%d" % i)
    for i in range(5):
        t.exists(a, b"user:%d" % i)
        t.exists(b, b"session:%d" % i)


# -- the probe, drained by a thread while tests run ------------------------------


class Probe:
    def __init__(self):
        from sitsprobe import kheaders, tracefs
        from sitsprobe.probes.cache import CacheProbe

        tracefs.ensure_mounted()
        kheaders.install(kheaders.resolve())
        self.lock = threading.Lock()
        self.events: list[KeyLookup] = []
        self.stats = CacheStats()
        self.probe = CacheProbe([redis_spec(REDIS)], self._on)
        self.stats.kernel = self.probe.kernel_counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _on(self, e: KeyLookup):
        with self.lock:
            self.events.append(e)
        self.stats.observe(e)

    def _drain(self):
        while not self._stop.is_set():
            self.probe.poll(20)

    def of(self, pid: int) -> list[KeyLookup]:
        with self.lock:
            return [e for e in self.events if e.tgid == pid]

    def settle(self, pid: int, n: int) -> list[KeyLookup]:
        """The events of pid once n have arrived and nothing more does."""
        wait_until(lambda: len(self.of(pid)) >= n, 15, f"{n} look-ups from redis {pid} "
                   f"(have {len(self.of(pid))})")
        time.sleep(0.3)
        return self.of(pid)

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.probe.close()


def counted(probe, r, a: Client, b: Client) -> tuple[list[KeyLookup], Tally]:
    """Run the workload from a and b; check what the probe saw against the
    tally and against Redis's INFO stats over the same interval."""
    before = r.stats()
    t = Tally()
    workload(t, a, b)
    after = r.stats()
    events = probe.settle(r.pid, t.hits + t.misses)
    check(events, t, before, after)
    return events, t


def check(events: list[KeyLookup], tally: Tally, before: tuple[int, int], after: tuple[int, int]):
    """Probe == tally (by prefix, by client) == INFO stats delta, exactly."""
    by_prefix = Counter((e.key.split(b":")[0].decode(), e.hit) for e in events)
    by_client = Counter(((e.peer.address, e.peer.port) if e.peer else None, e.hit) for e in events)
    assert by_prefix == tally.by_prefix
    assert by_client == tally.by_client
    hits = sum(e.hit for e in events)
    assert (hits, len(events) - hits) == (tally.hits, tally.misses)
    assert (after[0] - before[0], after[1] - before[1]) == (tally.hits, tally.misses)


@pytest.fixture(scope="module")
def early():
    """A Redis, with a client connected, started before the probe attaches."""
    _require()
    r = Redis()
    c = Client(r.port, CLIENT_A)
    c.call([b"PING"])
    yield r, c
    c.close()
    r.stop()


@pytest.fixture(scope="module")
def probe(early):
    p = Probe()
    yield p
    p.close()


def test_redis_started_before_the_probe(probe, early):
    r, pre = early  # `pre` connected before the probe existed: seeded from /proc
    assert r.pid in probe.probe._known
    fresh = Client(r.port, CLIENT_B)
    populate(fresh)
    events, t = counted(probe, r, pre, fresh)
    assert t.by_prefix[("user", True)] == 49 + 3 and t.by_prefix[("absent", True)] == 0
    assert all(e.duration_ns > 0 and e.fd >= 0 for e in events)
    fresh.close()


def _from(probe: Probe, pid: int, *clients: Client) -> list[KeyLookup]:
    peers = {c.local for c in clients}
    return [e for e in probe.of(pid) if e.peer in peers]


def _settle_from(probe: Probe, pid: int, n: int, *clients: Client) -> list[KeyLookup]:
    wait_until(lambda: len(_from(probe, pid, *clients)) >= n, 15, f"{n} look-ups from these clients")
    time.sleep(0.3)
    return _from(probe, pid, *clients)


def test_client_subnets_and_metrics(probe, early):
    r, _ = early
    a, b = Client(r.port, CLIENT_A), Client(r.port, CLIENT_B)
    populate(a)
    t = Tally()
    workload(t, a, b)
    events = _settle_from(probe, r.pid, t.hits + t.misses, a, b)
    assert len(events) == t.hits + t.misses
    stats = CacheStats(kernel=probe.probe.kernel_counts)
    for e in events:
        stats.observe(e)
    want = Counter()
    for ((address, _port), hit), n in t.by_client.items():
        want[("127.0.0.0/24" if address == CLIENT_A else "127.0.1.0/24", hit)] += n
    got = Counter()
    for (_prefix, subnet), (h, m) in stats.subnet_counts("redis").items():
        got[(subnet, True)] += h
        got[(subnet, False)] += m
    assert +got == +want
    assert stats.prefix_counts("redis") == {
        p: (t.by_prefix[(p, True)], t.by_prefix[(p, False)]) for p, _ in t.by_prefix}
    registry = CollectorRegistry()
    registry.register(stats)
    sample = registry.get_sample_value
    session_hits = sample("sitsprobe_cache_lookups_total",
                          {"cache": "redis", "prefix": "session", "result": "hit"})
    assert session_hits == t.by_prefix[("session", True)] == 10 + 2  # 10 GETs, 2 EXISTS
    assert sample("sitsprobe_cache_client_lookups_total", {
        "cache": "redis", "prefix": "user", "subnet": "127.0.0.0/24", "result": "miss"}) == 51 + 2
    assert sample("sitsprobe_cache_lookup_duration_seconds_count", {"cache": "redis"}) >= len(events)
    k = probe.probe.kernel_counts()["redis"]
    assert k.filtered > 0  # SET, DEL, INCR, APPEND: write look-ups, not counted
    assert sum(k.latency) == k.hits + k.misses and k.duration_ns > 0
    assert k.lost == 0 and k.inflight_lost == 0
    a.close()
    b.close()


def test_probe_free_mode_agrees_with_the_probe(probe, early):
    """Same workload, two views: the uprobe, and resp_get_results over the exact
    bytes each client sent and received (what a socket probe would capture)."""
    r, _ = early
    a, b = Client(r.port, CLIENT_A), Client(r.port, CLIENT_B)
    populate(a)
    t = Tally()
    for i in range(30):
        t.get(a, b"user:%d" % i)
    t.get(b, *[b"session:%d" % i for i in range(40)])  # one pipeline
    t.mget(a, *[b"model:%d" % i for i in range(25)])
    t.get(b, b"absent:1")
    n = t.hits + t.misses
    probed = Counter((e.key, e.hit) for e in _settle_from(probe, r.pid, n, a, b))
    # populate's writes are in a.sent too: resp_get_results must skip them
    parsed = Counter(resp_get_results(bytes(a.sent), bytes(a.received)))
    parsed += Counter(resp_get_results(bytes(b.sent), bytes(b.received)))
    assert parsed == probed
    assert sum(parsed.values()) == n
    by_prefix = Counter()
    for (key, hit), k in parsed.items():
        by_prefix[(key.split(b":")[0].decode(), hit)] += k
    assert by_prefix == t.by_prefix
    a.close()
    b.close()


def test_redis_started_after_the_probe_and_restarted(probe):
    r = Redis()
    try:
        a = Client(r.port, CLIENT_A)  # accepted while the probe watches: peer from accept
        b = Client(r.port, CLIENT_B)
        populate(a)
        counted(probe, r, a, b)
        a.close()
        b.close()
        old_pid = r.pid
        r.stop()
        r = Redis(r.port)  # the same port, a new process: counting resumes
        assert r.pid != old_pid
        a, b = Client(r.port, CLIENT_B), Client(r.port, CLIENT_A)
        populate(b)
        counted(probe, r, a, b)
        a.close()
        b.close()
    finally:
        r.stop()


def test_process_selector_pending_and_clean_close(probe, early):
    """A spec naming processes attaches to what they run (and waits, pending,
    while none runs); closing leaves no probe event and no BPF object behind."""
    from sitsprobe import tracefs
    from sitsprobe.cache import CacheProbeSpec
    from sitsprobe.probes.cache import CacheProbe

    r, _ = early
    by_process = CacheProbeSpec.from_dict(
        {"preset": "redis", "name": "by-process", "process": {"pids": [r.pid]}}, "<test>")
    nobody = CacheProbeSpec.from_dict(
        {"preset": "redis", "name": "nobody", "process": {"comms": ["no-such-comm"]}}, "<test>")
    got: list[KeyLookup] = []
    before = Counter(tracefs.bpf_fds())
    p = CacheProbe([by_process, nobody], got.append)
    try:
        hooks = p.hooks()
        assert hooks["cache by-process"] == f"uprobe {os.path.realpath(REDIS)}:lookupKey"
        assert hooks["cache nobody"].startswith("pending: no running process")
        c = Client(r.port, CLIENT_A)
        t = Tally()
        t.get(c, b"user:2", b"user:3")
        wait_until(lambda: (p.poll(50), len([e for e in got if e.peer == c.local]) >= 2)[1], 15,
                   "look-ups through the process selector's probe")
        assert Counter((e.cache, e.key, e.hit) for e in got if e.peer == c.local) == Counter(
            {("by-process", b"user:2", True): 1, ("by-process", b"user:3", False): 1})
        c.close()
    finally:
        p.close()
    assert tracefs.leftovers() == []  # bcc 0.26 with the uprobe PMU writes no uprobe_events
    assert Counter(tracefs.bpf_fds()) == before  # every program, map and perf event closed


LIBC_CALLER = r"""
import ctypes, sys
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_void_p
libc.memmem.restype = ctypes.c_void_p
libc.memmem.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
print("ready", flush=True)
for line in sys.stdin:
    op, *args = line.split()
    if op == "getenv":
        libc.getenv(args[0].encode())
    elif op == "memmem":
        hay, needle = args[0].encode(), args[1].encode()
        libc.memmem(hay, len(hay), needle, len(needle))
    print("ok", flush=True)
"""


def test_generic_specs_on_libc(probe):
    """cstr and ptr_len keys, a return-value and an argument hit rule, a filter
    and two caches on one symbol: getenv and memmem in one process (pid)."""
    from sitsprobe.cache import CacheProbeSpec
    from sitsprobe.probes.cache import CacheProbe

    caller = subprocess.Popen([sys.executable, "-c", LIBC_CALLER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "SITS_SET": "1", "SITS_ALSO": "x"})
    assert caller.stdout.readline() == "ready\n"
    specs = [CacheProbeSpec.from_dict(d, "<test>") for d in (
        {"name": "env", "binary": "c", "symbol": "getenv", "pid": caller.pid,
         "key": {"arg": 0, "read": "cstr"}},
        {"name": "find", "binary": "c", "symbol": "memmem", "pid": caller.pid,
         "key": {"arg": 2, "read": "ptr_len", "length_arg": 3},
         "only_if": {"arg": 1, "mask": 0xFFFF, "equals": 16}},  # haystacks of 16 bytes only
        {"name": "long-needle", "binary": "c", "symbol": "memmem", "pid": caller.pid,
         "key": {"arg": 2, "read": "ptr_len", "length_arg": 3},
         "hit": {"from": "arg3", "op": ">=", "value": 4}},
    )]
    got: list[KeyLookup] = []
    p = CacheProbe(specs, got.append)
    try:
        def call(*line):
            caller.stdin.write(" ".join(line) + "\n")
            caller.stdin.flush()
            assert caller.stdout.readline() == "ok\n"

        for name in ("SITS_SET", "SITS_NOPE", "SITS_ALSO", "SITS_" + "K" * 80):
            call("getenv", name)
        call("memmem", "user:1234:abcdef", "user")  # 16 bytes, found
        call("memmem", "user:1234:abcdef", "zz")  # 16 bytes, not found
        call("memmem", "short:hay", "hay")  # filtered out of "find"

        def mine(cache):
            return [e for e in got if e.cache == cache and e.tgid == caller.pid
                    and e.key.startswith((b"SITS_", b"user", b"zz", b"hay"))]

        wait_until(lambda: (p.poll(50), len(mine("env")) >= 4 and len(mine("find")) >= 2
                            and len(mine("long-needle")) >= 3)[1], 15, "libc look-ups")
        env = [(e.key, e.hit, e.truncated) for e in mine("env")]
        assert env == [(b"SITS_SET", True, False), (b"SITS_NOPE", False, False),
                       (b"SITS_ALSO", True, False), (b"SITS_" + b"K" * 58, False, True)]
        assert [(e.key, e.hit) for e in mine("find")] == [(b"user", True), (b"zz", False)]
        assert [(e.key, e.hit) for e in mine("long-needle")] == [
            (b"user", True), (b"zz", False), (b"hay", False)]
        k = p.kernel_counts()
        assert k["find"].filtered >= 1 and k["long-needle"].filtered == 0
    finally:
        p.close()
        caller.kill()
        caller.wait()


def test_a_cache_program_the_kernel_refused_for_the_moment_is_loaded_on_a_retry(early, monkeypatch, caplog):
    """bcc loads a uprobe's program inside its attach, where nothing tries
    again; the cache probe loads them itself first (probes/apart.py), so a
    refusal for the moment (here EAGAIN, as bcc words it, for the first try
    of cache_enter_0) is tried again, and the probe counts what Redis counts."""
    import errno
    import logging

    from sitsprobe.cache import CacheProbeSpec
    from sitsprobe.probes import apart, retry
    from sitsprobe.probes.cache import CacheProbe

    r, _ = early
    monkeypatch.setattr(retry, "SOON_S", (0.01,))
    real, refused = apart._load_func, []

    def load(bpf, name, *rest):
        if name == b"cache_enter_0" and not refused:
            refused.append(name)
            raise Exception(f"Failed to load BPF program b'cache_enter_0': {os.strerror(errno.EAGAIN)}")
        return real(bpf, name, *rest)
    monkeypatch.setattr(apart, "_load_func", load)
    spec = CacheProbeSpec.from_dict({"preset": "redis", "name": "retried", "process": {"pids": [r.pid]}}, "<test>")
    got: list[KeyLookup] = []
    with caplog.at_level(logging.INFO, logger="sitsprobe"):
        p = CacheProbe([spec], got.append)
    try:
        assert refused and any("refused cache_enter_0 for the moment" in m for m in caplog.messages)
        assert p.hooks()["cache retried"] == f"uprobe {os.path.realpath(REDIS)}:lookupKey"
        c = Client(r.port, CLIENT_B)
        before, t = r.stats(), Tally()
        t.get(c, b"user:2", b"user:3")
        wait_until(lambda: (p.poll(50), len([e for e in got if e.peer == c.local]) >= 2)[1], 15,
                   "look-ups through the retried probe")
        after = r.stats()
        mine = [e for e in got if e.peer == c.local]
        assert (sum(e.hit for e in mine), sum(not e.hit for e in mine)) == (t.hits, t.misses) == (
            after[0] - before[0], after[1] - before[1])
        c.close()
    finally:
        p.close()
