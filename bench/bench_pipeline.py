"""What a traced request costs the agent's userspace, from the exchange the
kernel hands it to the OTLP/JSON line in its traces file: the whole Python
path of `sitsprobe run` (stitch, metrics, join, sample, span, encode, write),
without the kernel or the ring buffer, so that it is quiet enough to compare
a change against the one before it on a noisy machine.

Reproduce (no root, no network; about 30 s):

    .venv/bin/python bench/bench_pipeline.py
    .venv/bin/python bench/bench_pipeline.py --requests 20000 --repeat 7
    .venv/bin/python bench/bench_pipeline.py --genai     # streamed chat completions
    .venv/bin/python bench/bench_pipeline.py --engine    # the same, with the engine's markers

The exchanges are what the kernel gave the agent for nginx serving a paced
client's keep-alive GETs (`bench/paced_client.py`, 8 connections): the same
request and response heads, sizes, endpoints and timings, one connection
after another, and flagged as the kernel flags those of a path it counts
itself (CF_BINNED: their metrics come from its counts, they cross the ring
for a trace only). Each run feeds them to a real sitsprobe.agent.Agent, with
every request traced (traces.cpu_budget 0) to a file, and shuts the
exporter down (the last lines written). Printed, best of --repeat runs: CPU
per request of the agent's main thread (time.thread_time: from the exchange
to the span handed to the sink) and of the whole process (time.process_time:
plus the file sink's thread, which encodes and writes).

--engine: what the reference engine (examples/engine) makes of each such
stream, ahead of it: the markers of one request (its begin and end, usage,
tokenize, queue, prefill with its prefix look-up, h2d, d2h, a decode step a
token past the first, each a batch of its own, and a detokenize a token) in
the order the engine calls them, then its writes and its exchange, as the
agent's loop has them (markers first). Every request is traced: 39 spans.

--genai: streamed chat completions as bench/bench_genai.py's server writes
them (the response head, --events content events, the final event with
usage, [DONE] and the last chunk, each its own write), each write a Beat
before its exchange, with the payload pieces the kernel keeps under the
default capture settings. Every such request is read for its gen_ai.*
meaning and remembered for `sitsprobe report`, traced or not, so this mode
prints two lines: every request traced, and none (traces.max_per_second 1).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from sitsprobe import config  # noqa: E402
from bench.bench_genai import PATH, request_body, stream_writes  # noqa: E402
from sitsprobe.abi import CF_BINNED, CF_BODY, CF_TCP, CF_TUPLE  # noqa: E402
from sitsprobe.agent import Agent  # noqa: E402
from sitsprobe.events import Beat, Exchange, MarkerEvent  # noqa: E402
from sitsprobe.export.otlp import TraceExporter  # noqa: E402
from sitsprobe.request import Endpoint, Payload, Write  # noqa: E402

PID, CONNS, PORT = 4242, 8, 38881
ENGINE_TOKENS, ENGINE_SPANS = 16, 39  # bench_cost's engine load: --max-tokens 16, and the spans it makes
SHAPE = 1116503485011412577  # the kernel's hash of "GET" and "/index.html"
REQ = b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:38881\r\nUser-Agent: sitsprobe-paced\r\n\r\n"
RESP = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Thu, 03 Dec 2026 11:10:39 GMT\r\n"
        b"Content-Type: text/html\r\nContent-Length: 380\r\nLast-Modified: Thu, 03 Dec 2026 11:10:36 GMT\r\n"
        b"Connection: keep-alive\r\nETag: \"6b114e2c-17c\"\r\nAccept-Ranges: bytes\r\n\r\n")


def exchanges(n: int, start_ns: int) -> list[Exchange]:
    """n exchanges of CONNS keep-alive connections, 500 µs apart (2,000 req/s)."""
    out = []
    for i in range(n):
        t = start_ns + i * 500_000
        fd = 5 + i % CONNS
        out.append(Exchange(
            tgid=PID, fd=fd, comm="nginx", reason=1, start_ns=t, last_in_ns=t, first_out_ns=t + 35_000,
            last_out_ns=t + 68_000, bytes_in=len(REQ), bytes_out=len(RESP) + 380,
            flags=CF_TUPLE | CF_TCP | CF_BINNED,
            local=Endpoint("127.0.0.1", PORT), peer=Endpoint("127.0.0.1", 39290 + fd), status=200,
            pipeline=0, req=REQ, resp=RESP, runq_ns=17_000, shape=SHAPE))
    return out


def streamed(n: int, start_ns: int, events: int) -> list[tuple[list[Beat], Exchange]]:
    """n streamed chat completions of CONNS keep-alive connections, 2 ms apart,
    each with its writes 20 µs apart, cut and counted as the kernel does."""
    body = request_body()
    head = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUser-Agent: wrk\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (PATH.encode(), PORT, len(body)))
    token, final, done, last = stream_writes(events)
    resp_head = (b"HTTP/1.1 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.7\r\n"
                 b"Date: Fri, 04 Dec 2026 23:00:00 GMT\r\nContent-Type: text/event-stream\r\n"
                 b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
    writes = [resp_head, *[token] * events, final, done, last]
    response, request = b"".join(writes), head + body
    out = []
    for i in range(n):
        t = start_ns + i * 2_000_000
        fd = 5 + i % CONNS
        key = (PID, fd, t, 0)
        beats = [Beat(key, Write(t + 50_000 + k * 20_000, len(w), w[:384])) for k, w in enumerate(writes)]
        end = beats[-1].write.ts_ns
        out.append((beats, Exchange(
            tgid=PID, fd=fd, comm="python3", reason=1, start_ns=t, last_in_ns=t + 5_000,
            first_out_ns=t + 50_000, last_out_ns=end, bytes_in=len(request), bytes_out=len(response),
            flags=CF_TUPLE | CF_TCP | CF_BODY, local=Endpoint("127.0.0.1", PORT),
            peer=Endpoint("127.0.0.1", 39290 + fd), status=200, pipeline=0, req=request[:256],
            resp=response[:256], runq_ns=17_000,
            payload=Payload(request_body=body[:512], request_tail=request[-512:],
                            response_tail=response[-512:], writes_total=len(writes)))))
    return out


def engine_markers(exs: list[tuple[list[Beat], Exchange]], tokens: int) -> list[tuple[list, list[Beat], Exchange]]:
    """Each streamed exchange of ``exs`` with the markers the reference engine
    calls for it, between its request's start and its first write."""
    out = []
    for i, (beats, ex) in enumerate(exs):
        rid, t, tid = 1 + i, ex.start_ns, PID + 1 + ex.fd
        step = (beats[0].write.ts_ns - t) // (3 * tokens + 8)
        clock = iter(range(t + step, t + 10**9, step))
        ev = [MarkerEvent("request_begin", t, PID, tid, rid, fd=ex.fd, name="tiny-gpt")]

        def stage(name: str, batch_id: int = 0) -> None:
            begin = next(clock)
            ev.append(MarkerEvent("range", next(clock), PID, tid, 0 if batch_id else rid, batch_id, name=name,
                                  begin_ns=begin))
        for name in ("tokenize", "queue", "prefill", "prefix_lookup"):
            stage(name)
        ev.append(MarkerEvent("cache_get", next(clock), PID, tid, rid, name="prefix", key=f"p/{i % 64}",
                              hit=i % 4 > 0))
        stage("h2d")
        stage("d2h")
        for k in range(1, tokens):
            batch_id = i * tokens + k
            ev.append(MarkerEvent("batch", next(clock), PID, tid, batch_id=batch_id, request_ids=(rid,)))
            stage("decode", batch_id)
        for _ in range(tokens):
            stage("detokenize")
        ev.append(MarkerEvent("usage", next(clock), PID, tid, rid, input_tokens=112, output_tokens=tokens,
                              kv_bytes=1 << 20))
        ev.append(MarkerEvent("request_end", ex.last_out_ns, PID, tid, rid))
        out.append((ev, beats, ex))
    return out


def run(exs: list, traces: Path, cap: int = 0) -> tuple[float, float, int]:
    """(main thread µs, process µs, lines written) per request for one pass;
    ``cap``: traces.max_per_second (0: every request traced)."""
    conf = config.load(None, {"select.pids": [PID], "traces.cpu_budget": 0, "traces.max_per_second": cap,
                              "traces.keep_slowest": 0, "traces.file": str(traces)})
    agent = Agent(conf)
    agent.tracked[PID] = "nginx"
    agent.probe = types.SimpleNamespace(bins=None)  # no kernel: nothing is counted there
    agent._start_cache(CollectorRegistry())  # the cache table an engine's look-ups go to (no probes)
    agent.exporter = TraceExporter(clock=agent.clock, traces_file=str(traces), on_cost=agent.sampler.charge,
                                   queue_size=64 * len(exs))  # faster than real time: room for them all
    cpu0, main0 = time.process_time(), time.thread_time()
    for ex in exs:
        if not isinstance(ex, Exchange):  # a stream: its writes first, as the ring has them
            *marks, beats, ex = ex
            for m in marks[0] if marks else ():  # and an engine's markers before them
                agent._on_marker(m)
            for beat in beats:
                agent.stitcher.on_beat(beat)
        agent._on_exchange(ex)
    end = time.monotonic_ns() + 10**12  # whatever the joiner still holds
    agent._send(agent.joiner.expire(end), end)
    main = time.thread_time() - main0
    agent.exporter.shutdown()
    cpu = time.process_time() - cpu0
    spans = sum(line.count(b'"spanId"') for line in traces.read_bytes().splitlines())
    traces.unlink()
    return 1e6 * main / len(exs), 1e6 * cpu / len(exs), spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--genai", action="store_true", help="streamed chat completions instead of nginx GETs")
    ap.add_argument("--engine", action="store_true",
                    help="streamed chat completions of the reference engine, its markers with them")
    ap.add_argument("--events", type=int, default=32, help="--genai: content events a response")
    args = ap.parse_args()
    git = os.popen(f"git -C {ROOT} rev-parse --short HEAD").read().strip()
    if args.engine:
        print(f"git {git}; {args.requests} streamed chat completions of the reference engine "
              f"({ENGINE_TOKENS} tokens, {ENGINE_SPANS} spans) a run, best of {args.repeat}")
        exs = engine_markers(streamed(args.requests, time.monotonic_ns(), ENGINE_TOKENS), ENGINE_TOKENS)
        passes(exs, args.repeat, "every request traced", spans_each=ENGINE_SPANS)
        return
    if not args.genai:
        print(f"git {git}; {args.requests} nginx GETs a run, best of {args.repeat}")
        passes(exchanges(args.requests, time.monotonic_ns()), args.repeat, "every request traced")
        return
    print(f"git {git}; {args.requests} streamed chat completions ({args.events} content events, "
          f"{args.events + 4} writes) a run, best of {args.repeat}")
    exs = streamed(args.requests, time.monotonic_ns(), args.events)
    passes(exs, args.repeat, "every request traced")
    passes(exs, args.repeat, "none traced", cap=1)


def passes(exs: list, repeat: int, what: str, cap: int = 0, spans_each: int = 1) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(exs, Path(tmp) / "traces.jsonl", cap) for _ in range(repeat)]
    spans = {s for _, _, s in runs}
    if not cap and spans != {len(exs) * spans_each}:
        sys.exit(f"expected {len(exs) * spans_each} spans a run, the file had {sorted(spans)}")
    main_us, all_us = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"{what}:")
    print(f"  agent main thread: {main_us:5.1f} µs a request (exchange to span)")
    print(f"  whole process:     {all_us:5.1f} µs a request (plus encoding and writing the line)")


if __name__ == "__main__":
    main()
