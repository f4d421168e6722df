"""Every PromQL expression the dashboards, the alerting rules and the data
source links hold, asked of a real Prometheus (Debian's) scraping the demo
(examples/demo.py: the agent on the reference engine under load) and a
second agent with the Redis preset on a real redis-server under a client's
GETs. Each must return data, unless it is about something neither has (a
GPU, calls out of the traced process): those are listed, by what they need;
and more than zero, unless it counts what a healthy run has none of.
The rules themselves are loaded too, and must evaluate."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.unit.test_collectors import COLLECTORS, prometheus_queries

from .conftest import ROOT, RedisServer, free_port, wait_until
from .test_cache_agent import Client

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus (Debian's package) is needed: "
                                                          "scripts/setup.sh installs it")
# what the demo cannot feed, by the metric names an expression reads
NEEDS = {"a GPU (NVML, CUDA)": re.compile(r"\bsitsprobe_(gpu|cuda)_"),
         "calls out of the traced process": re.compile(r"\b(http_client|rpc_client|db_client|gen_ai_client)_"),
         "a gRPC server": re.compile(r"\brpc_server_")}
# what a healthy run counts none of: losses, drops, server errors (and the alerts on them)
NONE_WHEN_HEALTHY = re.compile(r'_lost_total|_dropped_total|status_code=~"5\.\."')
WINDOW = "30s"  # $__rate_interval and the rules' windows, for a test a minute long


def filled(expr: str, process: str) -> str:
    """An expression as Grafana would send it, every variable chosen as "all"."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", WINDOW, expr)
    expr = re.sub(r"\[\d+m\]", f"[{WINDOW}]", expr)
    expr = re.sub(r'=~"\$\{?\w+(:\w+)?\}?"', '=~".+"', expr)
    expr = re.sub(r'="\$\{?job\}?"', '="sitsprobe"', expr)
    return re.sub(r'="\$\{?span_tag\}?"', f'="{process}"', expr)


def asked(expr: str) -> tuple[str, str | None]:
    """(the query to send, the label it must carry): a variable's label_values
    asks its series for the label; an alert asks for what it compares."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", expr, re.S)
    if m:
        return m.group(1), m.group(2)
    return re.sub(r"\s*(==|!=|>=|<=|>|<)\s*[\d.]+\s*$", "", expr), None


class Prometheus:
    def __init__(self, tmp_path, *targets: str):
        self.port = free_port()
        rules = tmp_path / "rules.yml"
        shutil.copy(COLLECTORS / "rules" / "sitsprobe.yml", rules)
        conf = tmp_path / "prometheus.yml"
        conf.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "sitsprobe", "static_configs": [{"targets": list(targets)}]}]}))
        self.log = tmp_path / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"))

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            return False

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def data(self, query: str, label: str | None) -> float | None:
        """The largest number the query returns (with the label, if one is
        asked for); None if it returns none."""
        d = self.api("query", query=query)
        rows = [d["result"]] if d["resultType"] == "scalar" else [
            r["value"] for r in d["result"] if label is None or label in r["metric"]]
        values = [float(v) for _, v in rows if not math.isnan(float(v))]
        return max(values) if values else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def redis_load(port: int, stop: threading.Event) -> None:
    """GETs of keys under two prefixes, half of them set: hits and misses."""
    c = Client(port, "127.0.0.1")  # (redis's protected mode refuses 127.0.0.2)
    for i in range(50):
        c.call(b"SET", b"user:%d" % i, b"x")
    while not stop.wait(0.01):
        for prefix in (b"user", b"session"):
            c.call(b"GET", b"%s:%d" % (prefix, time.monotonic_ns() % 100))


def test_every_dashboard_and_rule_expression_returns_data_from_the_demo(tmp_path):
    demo_port, redis_agent_port = free_port(), free_port()
    demo = subprocess.Popen(
        [sys.executable, "examples/demo.py", "--duration", "90", "--metrics-port", str(demo_port),
         "--traces-file", str(tmp_path / "traces.jsonl")],
        cwd=ROOT, stdout=(tmp_path / "demo.out").open("w"), stderr=(tmp_path / "demo.log").open("w"))
    redis = RedisServer()
    conf = tmp_path / "redis-agent.yaml"
    conf.write_text(yaml.safe_dump({"select": {"ports": [redis.port]}, "metrics": {"port": redis_agent_port},
                                    "cache": {"probes": ["redis"], "resp_mode": True, "bucket_s": 1}}))
    redis_agent = subprocess.Popen([sys.executable, "-m", "sitsprobe.cli", "run", "-c", str(conf),
                                    "--duration", "90"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=(tmp_path / "redis-agent.log").open("w"))
    stop = threading.Event()
    load = threading.Thread(target=redis_load, args=(redis.port, stop), daemon=True)
    prom = Prometheus(tmp_path, f"127.0.0.1:{demo_port}", f"127.0.0.1:{redis_agent_port}")
    try:
        wait_until(lambda: healthy(redis_agent_port), 60, f"the Redis agent (its log: {tmp_path / 'redis-agent.log'})")
        load.start()
        wait_until(prom.ready, 30, "Prometheus to start")
        wait_until(lambda: prom.data('count(up{job="sitsprobe"} == 1) == 2', None), 60,
                   f"Prometheus to scrape both agents (the demo's log: {tmp_path / 'demo.log'})")
        process = wait_until(lambda: prom.api("query", query="sitsprobe_tracked_process_info{process!~'redis.*'}")[
            "result"], 30, "the demo's engine to be tracked")[0]["metric"]["process"]
        queries, needs = [], {}
        for where, expr, _ in prometheus_queries():
            need = next((what for what, names in NEEDS.items() if names.search(expr)), None)
            if need is None:
                queries.append((where, *asked(filled(expr, process))))
            else:
                needs.setdefault(need, []).append(where)
        assert len(queries) > 30, queries

        def missing():
            return [(where, q) for where, q, label in queries if prom.data(q, label) is None]

        def flat():  # read 0 although the demo is busy
            return [(where, q) for where, q, label in queries
                    if not NONE_WHEN_HEALTHY.search(q) and prom.data(q, label) == 0]

        # a rate needs two scrapes; the slow tail's counters grow only when a request
        # is at or above the p99, which a 30 s window may not hold: ask again a while
        deadline = time.monotonic() + 90
        while (left := missing()) + (zeros := flat()) and time.monotonic() < deadline:
            time.sleep(3)
        print(f"{len(queries) - len(left)} of {len(queries)} expressions returned data; not fed by the demo: "
              + "; ".join(f"{len(w)} need {what}" for what, w in needs.items()))
        assert not left, f"{len(left)} expressions returned no data from the demo:\n" + "\n".join(
            f"{where}: {q}" for where, q in left)
        assert not zeros, "expressions that read 0 although the demo is busy:\n" + "\n".join(
            f"{where}: {q}" for where, q in zeros)
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        assert rules and all(r["health"] == "ok" for r in rules), [
            (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    finally:
        stop.set()
        prom.stop()
        stopped = time.monotonic()
        for p in (demo, redis_agent):
            p.terminate()
            p.wait(30)
        stopped = time.monotonic() - stopped
        redis.stop()
    # a stop (SIGTERM) ends the demo within the agent's stop_timeout_s, with its traces drawn
    out = (tmp_path / "demo.out").read_text()
    assert demo.returncode == 0 and stopped < 15, (demo.returncode, stopped, out[-2000:])
    assert f"traces: {tmp_path / 'traces.jsonl'}" in out and "one trace (" in out, out[-2000:]
