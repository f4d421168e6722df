"""Issue 9, "Real inference traffic, told true": servers and clients no one
here wrote (uvicorn+Starlette, aiohttp, nginx; httpx, the official openai
client) and raw sockets that keep every byte. What the agent exports must
equal what crossed the wire: one span per request, as long as the request
lasted, its bytes, its status at its place in a pipeline, its trace context
wherever in the head the client put it.

Each test reports every way the agent disagreed with the wire at once
(`Checks`), so one failing run shows the whole picture.
"""
from __future__ import annotations

import itertools
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

import pytest

from .conftest import HERE, TAG, Nginx, Owned, port_for_later, wait_until
from .peers import sse_schedule, status_locations

# This module's agent traces only this module's servers: other sessions on the
# machine run servers tagged TAG and nginx too, and their load is not ours to count.
RUN_TAG = f"{TAG}-wire-truth-{os.getpid()}"
NGINX_PORT = port_for_later()  # bound minutes after this module is imported
TIERS = ("socket", "syscall")  # the exactness of each socket tier that loads (socket_hooks)
AGENT_SELECT = {"cmdline": [re.escape(RUN_TAG)], "comms": [], "ports": [NGINX_PORT]}

MIX_SECONDS = 15  # per server: the mixed client's run
PACE_S = 0.05  # pause between one client thread's connections
PARTIAL_HEAD = "request_head_not_captured"


# -- what a test expected and what it got -------------------------------------


class Checks:
    """Every expectation of a test, each with its numbers; asserted together."""

    def __init__(self):
        self.failed: list[str] = []

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failed.append(what)
        return ok

    def done(self) -> None:
        assert not self.failed, f"{len(self.failed)} disagreement(s) with the wire:\n" + "\n".join(self.failed)


def samples(agent, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of `name` in one scrape."""
    out = []
    for line in agent.scrape().splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name:
            out.append((dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))))
    return out


def for_process(agent, name: str, pids: list[int], comm: str) -> float:
    """`name` summed over one server's samples: by pid where the metric has a
    pid label, else by its process (comm) label."""
    rows = samples(agent, name)
    if any("pid" in labels for labels, _ in rows):
        return sum(v for labels, v in rows if labels.get("pid") in {str(p) for p in pids})
    return sum(v for labels, v in rows if labels.get("process") == comm)


def poll(value, until, timeout: float):
    """value() once until(value()) holds, or its last value after timeout."""
    deadline = time.monotonic() + timeout
    while not until(v := value()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return v


def settled_spans(agent, peer, n: int, timeout: float = 15) -> list[dict]:
    """The peer's spans (its port, its processes: an earlier server of the
    agent's run may have had the port) once n arrived (or timeout), and a
    second more for any extra."""
    def mine() -> list[dict]:
        return [s for s in agent.traces.for_port(peer.port) if s["resource"].get("process.pid") in peer.pids]

    poll(lambda: len(mine()), lambda k: k >= n, timeout)
    time.sleep(1.0)
    return mine()


def duration_ns(span: dict) -> int:
    return int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])


def losses(agent) -> str:
    """The agent's own account of what it dropped, for a failure message."""
    lost = {labels.get("reason"): v for labels, v in samples(agent, "sitsprobe_events_lost_total") if v}
    traces = {labels.get("outcome"): v for labels, v in samples(agent, "sitsprobe_traces_total")}
    return f"(agent: events lost {lost or 0}, traces {traces})"


# -- servers -------------------------------------------------------------------


class Peer(Owned):
    """tests/integration/peers.py (uvicorn or aiohttp) in a subprocess, named
    `name` (its comm), tracked by the agent."""

    def __init__(self, agent, server: str, name: str, *args: str):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peers.py"), server, "--tag", RUN_TAG, "--name", name, *args],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise AssertionError(f"peers.py {server} did not print its port: {line!r}")
        self.port, self.pid, self.pids = int(line), self.proc.pid, [self.proc.pid]
        wait_until(lambda: agent.tracks(self.pid), 10, f"the agent to track {server} (pid {self.pid})")


# -- clients that keep what crossed the wire ----------------------------------


def _httpx():
    try:
        import httpcore2 as httpcore
        import httpx2 as httpx
    except ImportError:
        httpcore = pytest.importorskip("httpcore")
        httpx = pytest.importorskip("httpx")
    return httpx, httpcore


class TappedStream:
    """An httpcore network stream that keeps every byte both ways, and when
    the request's first byte left and the response's last byte arrived."""

    def __init__(self, inner):
        self.inner = inner
        self.sent, self.received = bytearray(), bytearray()
        self.first_write_ns = self.last_read_ns = 0
        self.client_port = inner.get_extra_info("socket").getsockname()[1]

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not self.first_write_ns:
            self.first_write_ns = time.monotonic_ns()
        self.inner.write(buffer, timeout)
        self.sent += buffer

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self.inner.read(max_bytes, timeout)
        if data:
            self.last_read_ns = time.monotonic_ns()
            self.received += data
        return data

    def close(self) -> None:
        self.inner.close()

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


def tapped_client(streams: list[TappedStream]):
    """An httpx Client whose connections are TappedStreams, appended to `streams`."""
    httpx, httpcore = _httpx()

    class Tap(httpcore.SyncBackend):
        def connect_tcp(self, *args, **kwargs):
            stream = TappedStream(super().connect_tcp(*args, **kwargs))
            streams.append(stream)
            return stream

    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(network_backend=Tap())  # httpx takes no backend itself
    return httpx.Client(transport=transport, timeout=30)


@dataclass
class Stream:
    target: str
    status: int
    body: bytes
    wire: bytes  # every byte the client received: head, chunk framing, terminator
    client_port: int
    elapsed_ns: int  # request's first byte sent -> response's last byte received

    @property
    def planned_s(self) -> float:
        """The server's pauses: before the first event, and between events."""
        first, gaps = sse_schedule(dict(parse_qsl(urlsplit(self.target).query)))
        return first + sum(gaps)

    @property
    def events(self) -> int:
        return len(sse_schedule(dict(parse_qsl(urlsplit(self.target).query)))[1]) + 1


def sse_stream(port: int, target: str) -> Stream:
    """One server-sent event stream read to its end with httpx, on its own connection."""
    streams: list[TappedStream] = []
    with tapped_client(streams) as client:
        with client.stream("GET", f"http://127.0.0.1:{port}{target}",
                           headers={"Accept": "text/event-stream"}) as r:
            body = b"".join(r.iter_raw())
    assert len(streams) == 1, f"httpx opened {len(streams)} connections for one stream"
    s = streams[0]
    return Stream(target, r.status_code, body, bytes(s.received), s.client_port,
                  s.last_read_ns - s.first_write_ns)


@dataclass
class Conn:
    """A raw HTTP/1.1 client connection: what it asked, what it was answered."""

    kind: str
    port: int = 0  # the client's port
    opened_ns: int = 0  # wall clock, as the spans are
    closed_ns: int = 0
    answers: list[tuple[str, int]] = field(default_factory=list)  # (path, status), in order


class RawClient:
    """One connection; reads responses by their framing, keeps the tally."""

    def __init__(self, port: int, kind: str):
        self.conn = Conn(kind, opened_ns=time.time_ns())
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.conn.port = self.sock.getsockname()[1]
        self.buf = bytearray()

    @staticmethod
    def request(path: str, close: bool = False) -> bytes:
        return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: wire-truth/1\r\n"
                + ("Connection: close\r\n" if close else "") + "\r\n").encode()

    def ask(self, paths: list[str], close: bool = False) -> None:
        """Write every request in one sendall (a pipeline if several), read every answer."""
        self.ask_raw(b"".join(self.request(p, close) for p in paths), paths)

    def ask_raw(self, raw: bytes, paths: list[str]) -> list[int]:
        """Write `raw` (the requests for `paths`) in one sendall; the statuses answered."""
        self.sock.sendall(raw)
        statuses = [self._response() for _ in paths]
        self.conn.answers += zip(paths, statuses)
        return statuses

    def close(self, expect_eof: bool = False) -> Conn:
        if expect_eof:  # the server said it would close: it must, with nothing more
            while chunk := self.sock.recv(65536):
                self.buf += chunk
            assert not self.buf, f"bytes after the last response: {bytes(self.buf[:80])!r}"
        self.sock.close()
        self.conn.closed_ns = time.time_ns()
        return self.conn

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed with {len(self.buf)} of {n} bytes")
            self.buf += chunk

    def _line(self, pos: int) -> int:
        """Index of the CRLF ending the line at pos (reading as needed)."""
        while (end := self.buf.find(b"\r\n", pos)) < 0:
            self._fill(len(self.buf) + 1)
        return end

    def _response(self) -> int:
        while (head_end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill(len(self.buf) + 1)
        head = bytes(self.buf[:head_end]).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        pos = head_end + 4
        if status in (204, 304) or 100 <= status < 200:
            end = pos
        elif "content-length" in headers:
            end = pos + int(headers["content-length"])
            self._fill(end)
        elif headers.get("transfer-encoding", "").lower().endswith("chunked"):
            while True:
                line_end = self._line(pos)
                size = int(bytes(self.buf[pos:line_end]).split(b";")[0], 16)
                pos = line_end + 2
                if size == 0:
                    while (line_end := self._line(pos)) != pos:  # trailer fields, then the blank line
                        pos = line_end + 2
                    end = pos + 2
                    break
                pos += size + 2
                self._fill(pos)
        else:
            raise AssertionError(f"a response framed by close: {head}")
        del self.buf[:end]
        if 100 <= status < 200:
            return self._response()
        return status


# -- 1. SSE streams: one span, as long as the stream, every byte ------------------

SSE_STREAMS = ("/sse?gaps=0.2,0.6,1.5,3", "/sse?first=2&gaps=0.3")


@pytest.mark.parametrize("server", ["uvicorn", "aiohttp"])
def test_sse_stream_is_one_span_as_long_as_the_stream(agent, server):
    with Peer(agent, server, f"wt-sse-{server[:3]}") as peer:
        with ThreadPoolExecutor(len(SSE_STREAMS)) as pool:
            streams = list(pool.map(lambda t: sse_stream(peer.port, t), SSE_STREAMS))
        spans = settled_spans(agent, peer, len(streams))
        histogram = poll(lambda: for_process(agent, "http_server_request_duration_seconds_count",
                                             peer.pids, peer.name),
                         lambda n: n >= len(streams), 5)
    for s in streams:  # the servers did what the test asked of them
        assert s.status == 200 and s.body.count(b"data: token ") == s.events, (s.target, s.body)
        assert s.elapsed_ns >= s.planned_s * 1e9, s

    check = Checks()
    check.expect(len(spans) == len(streams),
                 f"{len(spans)} spans for port {peer.port}, {len(streams)} requests made")
    for s in streams:
        mine = [x for x in spans if x["attrs"].get("client.port") == s.client_port]
        if not check.expect(len(mine) == 1, f"{s.target}: {len(mine)} spans for its connection, 1 request"):
            continue
        span, = mine
        d = duration_ns(span)
        check.expect(d >= s.planned_s * 1e9,
                     f"{s.target}: span lasts {d / 1e9:.3f} s, shorter than the server's "
                     f"{s.planned_s:.1f} s of pauses (the client saw {s.elapsed_ns / 1e9:.3f} s)")
        check.expect(d <= s.elapsed_ns,
                     f"{s.target}: span lasts {d / 1e9:.3f} s, longer than the client's "
                     f"{s.elapsed_ns / 1e9:.3f} s from request to last byte")
        size = span["attrs"].get("http.response.size")
        check.expect(size == len(s.wire),
                     f"{s.target}: http.response.size {size}, {len(s.wire)} bytes on the wire")
    check.expect(histogram == len(streams),
                 f"http_server_request_duration_seconds_count for {peer.name}: {histogram:g}, "
                 f"{len(streams)} requests made")
    check.done()


# -- 2. a mixed client: keep-alive, close, pipelines, streams ----------------------


@dataclass(frozen=True)
class Site:
    plain: tuple[str, ...]  # keep-alive and Connection: close requests, cycled
    pipeline: tuple[str, ...]  # one pipelined burst: each answered with its own status
    stream: str | None = None  # a short chunked SSE stream, then one more request


UVICORN_SITE = Site(
    plain=("/json/a", "/status/201", "/json/b", "/status/404", "/status/503"),
    pipeline=("/json/p", *(f"/status/{c}" for c in (201, 202, 203, 400, 401, 403, 404, 409, 418))),
    stream="/sse?gaps=0.05,0.05,0.1")
NGINX_SITE = Site(
    plain=("/index.html", "/s/201", "/missing", "/s/204", "/s/503"),
    pipeline=("/index.html", "/missing", *(f"/s/{c}" for c in (201, 202, 203, 204, 400, 401, 418, 503))))


def mixed_client(site: Site, port: int, deadline: float, seed: int) -> list[Conn]:
    """Connections of every kind in turn, until deadline; each one's tally."""
    rng = random.Random(seed)
    plain = itertools.cycle(site.plain[seed % len(site.plain):] + site.plain[:seed % len(site.plain)])
    kinds = ["keep-alive", "pipeline", "close"] + (["stream"] if site.stream else [])
    done = []
    for kind in itertools.cycle(kinds):
        if time.monotonic() >= deadline:
            return done
        c = RawClient(port, kind)
        if kind == "keep-alive":
            for _ in range(rng.randint(2, 6)):
                c.ask([next(plain)])
        elif kind == "pipeline":
            c.ask(list(site.pipeline))
        elif kind == "close":
            c.ask([next(plain)], close=True)
        else:
            c.ask([site.stream])
            c.ask([next(plain)])
        done.append(c.close(expect_eof=kind == "close"))
        time.sleep(PACE_S)
    return done


@pytest.mark.parametrize("server", ["nginx", "uvicorn"])
def test_mixed_client_tally_equals_spans_and_kernel_count(agent, server, tmp_path, tier):
    site = NGINX_SITE if server == "nginx" else UVICORN_SITE
    peer = (Nginx(agent, tmp_path / "nginx", NGINX_PORT, status_locations()) if server == "nginx"
            else Peer(agent, "uvicorn", "wt-mix-uv"))
    with peer:
        deadline = time.monotonic() + (MIX_SECONDS if tier != "syscall" else MIX_SECONDS / 3)  # its second run
        with ThreadPoolExecutor(3) as pool:
            conns = [c for cs in pool.map(lambda i: mixed_client(site, peer.port, deadline, i), range(3))
                     for c in cs]
        tally = sum(len(c.answers) for c in conns)
        spans = settled_spans(agent, peer, tally)
        kernel = poll(lambda: for_process(agent, "sitsprobe_http_server_requests_total", peer.pids, peer.name),
                      lambda n: n >= tally, 5)
        stitched = for_process(agent, "sitsprobe_requests_stitched_total", peer.pids, peer.name)
    kinds = Counter(c.kind for c in conns)
    for c in conns:  # the test's own premise: a pipeline's answers are told apart by status
        if c.kind == "pipeline":
            assert len({s for _, s in c.answers}) == len(site.pipeline), c.answers
    print(f"{server}: {tally} requests on {len(conns)} connections {dict(kinds)}; "
          f"{len(spans)} spans, kernel count {kernel:g}, stitched {stitched:g}")

    check = Checks()
    check.expect(len(spans) == tally, f"{len(spans)} spans for port {peer.port}, client tally {tally} "
                                      f"{losses(agent)}")
    check.expect(kernel == tally, f"sitsprobe_http_server_requests_total for pids {peer.pids}: {kernel:g}, "
                                  f"client tally {tally}")
    check.expect(stitched == tally, f"sitsprobe_requests_stitched_total for {peer.name}: {stitched:g}, "
                                    f"client tally {tally}")
    for ident in ("client.port", "sitsprobe.fd"):
        twins = Counter((s["attrs"].get(ident), s["startTimeUnixNano"], s["endTimeUnixNano"]) for s in spans)
        shared = {k: n for k, n in twins.items() if n > 1}
        check.expect(not shared, f"{sum(shared.values())} spans share ({ident}, start, end) with another, "
                                 f"in {len(shared)} groups, e.g. {next(iter(shared.items()), None)}")
    check_positions(check, conns, spans)
    check.done()


def check_positions(check: Checks, conns: list[Conn], spans: list[dict]) -> None:
    """Each connection's spans, in time order, against its answers in order: a
    span's status and path are the ones at that place, or the span says the
    agent did not see that request's head (and gives no status or path but the right one)."""
    margin = 50_000_000  # the agent's wall clock against ours
    by_port: dict[int, list[int]] = {}
    for i, c in enumerate(conns):
        by_port.setdefault(c.port, []).append(i)
    mine: list[list[dict]] = [[] for _ in conns]
    strays = 0
    for s in spans:  # a client port may come back later: then the span's time tells the connection
        start = int(s["startTimeUnixNano"])
        owner = by_port.get(s["attrs"].get("client.port"), [])
        if len(owner) > 1:  # (only then: the agent's clock follows the wall clock's steps a second late)
            owner = [i for i in owner if conns[i].opened_ns - margin <= start <= conns[i].closed_ns + margin]
        if owner:
            mine[owner[0]].append(s)
        else:
            strays += 1
    check.expect(not strays, f"{strays} spans belong to no connection the client made")
    found: dict[str, list[str]] = {}
    for c, got in zip(conns, mine):
        got.sort(key=lambda s: (int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])))
        if len(got) != len(c.answers):
            found.setdefault(f"{c.kind} connections with a span count unlike their request count",
                             []).append(f"{len(got)} spans for {len(c.answers)} requests")
            continue
        for i, ((path, status), s) in enumerate(zip(c.answers, got)):
            a = s["attrs"]
            span_status, span_path = a.get("http.response.status_code"), a.get("url.path")
            if a.get("sitsprobe.partial") == PARTIAL_HEAD:
                ok = span_status in (None, status) and span_path in (None, path.partition("?")[0])
            else:
                ok = span_status == status and span_path == path.partition("?")[0]
            if not ok:
                found.setdefault(f"{c.kind} answers whose span disagrees", []).append(
                    f"position {i}: client got {status} for {path}, span says status={span_status} "
                    f"path={span_path} partial={a.get('sitsprobe.partial')}")
    for what, examples in found.items():
        check.expect(False, f"{len(examples)} {what}, e.g. {examples[0]}")


# -- 3. trace context wherever the client put it -------------------------------


def _ids(seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    return f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"


def test_openai_client_traceparent_past_the_first_256_bytes(agent, tmp_path):
    openai = pytest.importorskip("openai")
    trace_id, parent = _ids(9)
    record = tmp_path / "raw"
    record.mkdir()
    with Peer(agent, "uvicorn", "wt-openai", "--record", str(record)) as peer:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{peer.port}/v1", api_key="sk-test", max_retries=0,
                               default_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        completion = client.chat.completions.create(
            model="wire-truth-1", messages=[{"role": "user", "content": "say it true"}])
        client.close()
        spans = settled_spans(agent, peer, 1)
    assert completion.choices[0].message.content == "told true"
    raw = b"".join(f.read_bytes() for f in sorted(record.glob("conn-*.raw")))
    start = raw.index(b"POST /v1/chat/completions ")
    at = raw.lower().index(b"\r\ntraceparent:", start) + 2 - start
    assert at > 256, f"the openai client put traceparent at byte {at}: this test needs it past 256"

    check = Checks()
    if check.expect(len(spans) == 1, f"{len(spans)} spans for port {peer.port}, 1 request made"):
        span = spans[0]
        check.expect(span["attrs"].get("url.path") == "/v1/chat/completions", f"url.path {span['attrs']}")
        check.expect(span["traceId"] == trace_id,
                     f"traceId {span['traceId']}, the client's is {trace_id} (traceparent at byte {at})")
        check.expect(span.get("parentSpanId") == parent,
                     f"parentSpanId {span.get('parentSpanId')}, the client's span is {parent} "
                     f"(traceparent at byte {at})")
    check.done()


def test_traceparent_and_tracestate_after_2_kib_of_headers(agent):
    trace_id, parent = _ids(2048)
    filler = "".join(f"x-filler-{i}: {'f' * 48}\r\n" for i in range(40))
    head = (f"GET /json/traced HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: wire-truth/1\r\n{filler}"
            f"traceparent: 00-{trace_id}-{parent}-01\r\ntracestate: vendor=abc\r\n\r\n").encode()
    at, state_at = head.index(b"traceparent:"), head.index(b"tracestate:")
    assert at > 2048
    with Peer(agent, "uvicorn", "wt-tracestate") as peer:
        c = RawClient(peer.port, "traced")
        status, = c.ask_raw(head, ["/json/traced"])
        c.close()
        spans = settled_spans(agent, peer, 1)
    assert status == 200

    check = Checks()
    if check.expect(len(spans) == 1, f"{len(spans)} spans for port {peer.port}, 1 request made"):
        span = spans[0]
        check.expect(span["traceId"] == trace_id, f"traceId {span['traceId']}, sent {trace_id} at byte {at}")
        check.expect(span.get("parentSpanId") == parent,
                     f"parentSpanId {span.get('parentSpanId')}, sent {parent} at byte {at}")
        check.expect(span.get("traceState") == "vendor=abc",
                     f"traceState {span.get('traceState')!r}, sent 'vendor=abc' at byte {state_at}")
    check.done()
