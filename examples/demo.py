"""The demo: sitsprobe watching the reference inference engine under load.

    scripts/demo.sh (as root) [--duration 30] [--rate 6] [--traces-file sitsprobe-traces.jsonl]

Starts examples/engine/serve.py (a tiny GPT on the CPU), drives it with
examples/loadgen.py (streaming chat sessions, half of them sharing a prompt
prefix), and runs the agent on it: one trace per request, with the engine's
stages inside, goes to the traces file (OTLP/JSON lines); metrics to
http://127.0.0.1:9102/metrics. A line a second shows what the agent sees; at
the end one trace is drawn.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sitsprobe import config
from sitsprobe.agent import Agent

HERE = Path(__file__).parent


def start_engine() -> tuple[subprocess.Popen, int]:
    engine = subprocess.Popen([sys.executable, str(HERE / "engine" / "serve.py"), "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    line = engine.stdout.readline()
    if not line.startswith("listening on"):
        raise SystemExit(f"the engine did not start: {line!r}")
    return engine, int(line.rsplit(":", 1)[1])


def live_line(agent: Agent, last: int) -> str:
    seen = agent.requests_seen
    ttft = agent.metrics.quantile_ttft(0.5)
    lost = agent.probe.counters()["lost"]
    hit = agent.metrics.cache_hit_ratio("prefix")
    return (f"  requests {seen:5d} ({seen - last:3d}/s) | ttft p50 "
            f"{'   -  ' if ttft is None else f'{ttft * 1000:5.1f}ms'} | prefix hits "
            f"{'  - ' if hit is None else f'{hit:4.0%}'} | traced {agent.sampler.exported:5d} | lost {lost}")


def draw(traces_file: str) -> None:
    spans = [s for line in open(traces_file) for rs in json.loads(line)["resourceSpans"]
             for ss in rs["scopeSpans"] for s in ss["spans"]]
    kids: dict[str, list] = {}
    for s in spans:
        kids.setdefault(s.get("parentSpanId", ""), []).append(s)
    roots = [s for s in spans if s["kind"] == 2 and s["spanId"] in kids]
    if not roots:
        return
    root = roots[len(roots) // 2]
    t0 = int(root["startTimeUnixNano"])

    def show(s, depth):
        a = {kv["key"]: list(kv["value"].values())[0] for kv in s.get("attributes", [])}
        start = (int(s["startTimeUnixNano"]) - t0) / 1e6
        took = (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e6
        extra = ", ".join(f"{k}={a[k]}" for k in ("http.response.status_code", "gen_ai.usage.input_tokens",
                                                   "gen_ai.usage.output_tokens", "sitsprobe.batch.size",
                                                   "sitsprobe.cache.hit") if k in a)
        print(f"  {start:8.2f}ms {took:8.2f}ms  {'  ' * depth}{s['name']}  {extra}")

    print(f"\none trace ({root['traceId']}):\n     start     took")
    show(root, 0)
    for k in sorted(kids.get(root["spanId"], []), key=lambda c: int(c["startTimeUnixNano"])):
        show(k, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--rate", type=float, default=6, help="chat sessions a second")
    ap.add_argument("--traces-file", default="sitsprobe-traces.jsonl")
    ap.add_argument("--metrics-port", type=int, default=9102)
    a = ap.parse_args()
    logging.basicConfig(level="WARNING", format="%(levelname)s %(message)s")
    # a stop is an event the loop reads, not an exception: raised in the main thread it could land in
    # a ring buffer's callback, where ctypes prints and swallows it, and the demo would run on
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    engine, port = start_engine()
    Path(a.traces_file).unlink(missing_ok=True)
    conf = config.load(overrides={
        "select.pids": [engine.pid], "traces.file": a.traces_file,
        "metrics.port": a.metrics_port, "metrics.address": "127.0.0.1"})
    agent = Agent(conf)
    print(f"sitsprobe demo: loading probes, then watching the engine[{engine.pid}] on :{port}")
    print(f"  the full live view, from another terminal: .venv/bin/sitsprobe top --url "
          f"http://127.0.0.1:{a.metrics_port}")
    load = None
    try:
        agent.start()
        agent.run(stop, duration_s=1.0)  # attach to the engine's markers
        load = subprocess.Popen(
            [sys.executable, str(HERE / "loadgen.py"), "--url", f"http://127.0.0.1:{port}",
             "--rate", str(a.rate), "--requests", str(int(a.rate * 2 * a.duration)), "--stream",
             "--turns", "2", "--shared-prefix", "0.5", "--max-tokens", "12", "--json", "/dev/null"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end, last = time.monotonic() + a.duration, 0
        while not stop.is_set() and time.monotonic() < end and load.poll() is None:
            agent.run(stop, duration_s=1.0)
            print(live_line(agent, last), flush=True)
            last = agent.requests_seen
    finally:
        if load is not None:
            load.kill()
        agent.close()
        engine.kill()
    print(f"\ntraces: {a.traces_file} (OTLP/JSON, one ExportTraceServiceRequest per line)")
    draw(a.traces_file)
    print(f"\nmetrics were at http://127.0.0.1:{a.metrics_port}/metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
