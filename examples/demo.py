"""The demo: sitsprobe watching a local HTTP server under load.

    sudo scripts/demo.sh [--duration 20] [--traces-file sitsprobe-traces.jsonl]

Starts examples/hello_server.py, drives it with a few keep-alive clients,
and runs the agent on it: traces go to the file (OTLP/JSON lines), metrics to
http://127.0.0.1:9102/metrics. A line a second shows what the agent sees.
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sitsprobe import config
from sitsprobe.agent import Agent

HERE = Path(__file__).parent
PATHS = ["/v1/items/1", "/v1/items/2", "/v1/users/42", "/slow/report", "/missing", "/boom"]


def load(port: int, stop: threading.Event, sent: list[int]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    while not stop.is_set():
        conn.request("GET", random.choices(PATHS, weights=[30, 30, 20, 5, 3, 1])[0])
        conn.getresponse().read()
        sent[0] += 1
        time.sleep(random.uniform(0, 0.004))
    conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--traces-file", default="sitsprobe-traces.jsonl")
    ap.add_argument("--metrics-port", type=int, default=9102)
    ap.add_argument("--clients", type=int, default=4)
    a = ap.parse_args()
    logging.basicConfig(level="WARNING", format="%(levelname)s %(message)s")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(HERE / "hello_server.py"), str(port)])
    Path(a.traces_file).unlink(missing_ok=True)
    conf = config.load(overrides={
        "select.pids": [server.pid], "traces.file": a.traces_file,
        "metrics.port": a.metrics_port, "metrics.address": "127.0.0.1"})
    agent = Agent(conf)
    print(f"sitsprobe demo: loading probes, then watching hello_server[{server.pid}] on :{port}")
    stop, sent, threads = threading.Event(), [0], []
    try:
        agent.start()
        time.sleep(0.2)
        for _ in range(a.clients):
            threads.append(threading.Thread(target=load, args=(port, stop, sent), daemon=True))
            threads[-1].start()
        end, last = time.monotonic() + a.duration, 0
        while time.monotonic() < end:
            agent.run(threading.Event(), duration_s=1.0)
            seen = agent.requests_seen
            lost = agent.probe.counters()["lost"]
            print(f"  client sent {sent[0]:6d} | agent stitched {seen:6d} ({seen - last:4d}/s) | "
                  f"lost {lost} | traced {agent.sampler.exported:6d}", flush=True)
            last = seen
    finally:
        stop.set()
        for t in threads:
            t.join(2)
        agent.close()
        server.kill()
    print(f"\ntraces: {a.traces_file} (OTLP/JSON, one ExportTraceServiceRequest per line)")
    with open(a.traces_file) as f:
        span = json.loads(f.readline())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    attrs = {kv["key"]: list(kv["value"].values())[0] for kv in span["attributes"]}
    took = (int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])) / 1e6
    print(f"first span: {span['name']!r} status {attrs.get('http.response.status_code')} "
          f"{took:.2f} ms, trace {span['traceId']}")
    print(f"metrics were at http://127.0.0.1:{a.metrics_port}/metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
