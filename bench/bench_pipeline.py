"""What a traced request costs the agent's userspace, from the exchange the
kernel hands it to the OTLP/JSON line in its traces file: the whole Python
path of `sitsprobe run` (stitch, metrics, join, sample, span, encode, write),
without the kernel or the ring buffer, so that it is quiet enough to compare
a change against the one before it on a noisy machine.

Reproduce (no root, no network; about 30 s):

    .venv/bin/python bench/bench_pipeline.py
    .venv/bin/python bench/bench_pipeline.py --requests 20000 --repeat 7

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

from sitsprobe import config  # noqa: E402
from sitsprobe.abi import CF_BINNED, CF_TCP, CF_TUPLE  # noqa: E402
from sitsprobe.agent import Agent  # noqa: E402
from sitsprobe.events import Exchange  # noqa: E402
from sitsprobe.export.otlp import TraceExporter  # noqa: E402
from sitsprobe.request import Endpoint  # noqa: E402

PID, CONNS, PORT = 4242, 8, 38881
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


def run(exs: list[Exchange], traces: Path) -> tuple[float, float, int]:
    """(main thread µs, process µs, lines written) per request for one pass."""
    conf = config.load(None, {"select.pids": [PID], "traces.cpu_budget": 0, "traces.max_per_second": 0,
                              "traces.file": str(traces)})
    agent = Agent(conf)
    agent.tracked[PID] = "nginx"
    agent.probe = types.SimpleNamespace(bins=None)  # no kernel: nothing is counted there
    agent.exporter = TraceExporter(clock=agent.clock, traces_file=str(traces),
                                   on_cost=agent.sampler.charge)
    cpu0, main0 = time.process_time(), time.thread_time()
    for ex in exs:
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
    args = ap.parse_args()
    exs = exchanges(args.requests, time.monotonic_ns())
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run(exs, Path(tmp) / "traces.jsonl") for _ in range(args.repeat)]
    spans = {s for _, _, s in runs}
    if spans != {args.requests}:
        sys.exit(f"expected {args.requests} spans a run, the file had {sorted(spans)}")
    main_us, all_us = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"git {os.popen(f'git -C {ROOT} rev-parse --short HEAD').read().strip()}; "
          f"{args.requests} nginx GETs a run, best of {args.repeat}")
    print(f"agent main thread: {main_us:5.1f} µs a request (exchange to span)")
    print(f"whole process:     {all_us:5.1f} µs a request (plus encoding and writing the line)")


if __name__ == "__main__":
    main()
