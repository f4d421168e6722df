"""The reference engine under the load generator, with the agent attached:
one trace per request, each with the engine's stages inside it, checked
against the load generator's own records and the engine's own counters."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections import defaultdict

import pytest

from .conftest import ROOT, Engine, wait_until

AGENT_SELECT = {"cmdline": [r"engine/serve\.py .*--model-seed 7\b"]}  # this module's engine only
REQUESTS = 24


@pytest.fixture(scope="module")
def engine(agent, tmp_path_factory):
    d = tmp_path_factory.mktemp("engine")
    e = Engine(d, "--max-window-ms", "20", "--model-seed", "7")
    wait_until(lambda: agent.tracks(e.pid), 15, "the agent to track the engine")
    wait_until(lambda: f"engine markers: attached to {d}/" in agent.log.read_text(), 15,
               "the agent to attach to the engine's markers")
    yield e.port
    e.stop()


def load(port: int, out, *extra: str) -> dict:
    subprocess.run([sys.executable, "examples/loadgen.py", "--url", f"http://127.0.0.1:{port}",
                    "--rate", "8", "--requests", str(REQUESTS), "--shared-prefix", "0.6",
                    "--max-tokens", "6", "--json", str(out), *extra],
                   cwd=ROOT, check=True, capture_output=True, timeout=180)
    return json.loads(out.read_text())


def traces(agent, port: int, n: int) -> list[tuple[dict, list[dict]]]:
    """(server span, its children) for each request the engine served."""
    servers = agent.traces.wait_for_port(port, n, timeout=30)
    servers = [s for s in servers if s["attrs"].get("url.path", "").startswith("/v1/")]
    children = defaultdict(list)
    for s in agent.traces.spans():
        if s.get("parentSpanId"):
            children[s["parentSpanId"]].append(s)
    return [(s, sorted(children[s["spanId"]], key=lambda c: int(c["startTimeUnixNano"])))
            for s in servers]


def test_every_request_is_one_trace_with_its_stages_inside(agent, engine, tmp_path):
    summary = load(engine, tmp_path / "load.json", "--stream")
    assert summary["by_status"] == {"200": REQUESTS}
    got = traces(agent, engine, REQUESTS)
    assert len(got) == REQUESTS
    records = sorted(summary["records"], key=lambda r: r["start"])
    for server, kids in got:
        a = server["attrs"]
        assert a["gen_ai.request.model"] == "sitsprobe-tiny-gpt"
        assert int(a["gen_ai.usage.output_tokens"]) >= 1
        assert int(a["sitsprobe.kv_cache.peak_bytes"]) > 0
        start, end = int(server["startTimeUnixNano"]), int(server["endTimeUnixNano"])
        names = [k["name"] for k in kids if not k["name"].startswith("cache_get")]
        assert {"tokenize", "queue", "prefill", "decode", "detokenize"} <= set(names), names
        assert names.index("prefill") < names.index("decode"), names
        for k in kids:  # every stage inside its request, in time order
            assert start <= int(k["startTimeUnixNano"]) <= int(k["endTimeUnixNano"]) <= end
        decode = next(k for k in kids if k["name"] == "decode")
        assert int(decode["attrs"]["sitsprobe.batch.size"]) >= 1
        # the client's own TTFT (first streamed text) bounds the agent's (end of prefill);
        # the client's request is one whose round trip contains the server span
        around = [r for r in records if r["start"] * 1e9 <= start and end <= r["end"] * 1e9]
        assert around, "no client request contains this server span"
        ttft = float(a["gen_ai.server.time_to_first_token"])
        assert any(ttft <= r["ttft_s"] for r in around), (ttft, [r["ttft_s"] for r in around])


def test_every_prefix_cache_hit_the_engine_counted_is_in_the_traces(agent, engine, tmp_path):
    def stats():
        with urllib.request.urlopen(f"http://127.0.0.1:{engine}/v1/engine/stats", timeout=5) as r:
            return json.loads(r.read())["prefix_cache"]

    before = stats()
    seen_before = {s["spanId"] for s in agent.traces.spans()}
    load(engine, tmp_path / "load.json", "--turns", "3")
    after = stats()
    got = traces(agent, engine, 2 * REQUESTS + 2)  # the last test's, this one's, and its two looks at the stats
    hits = misses = 0
    for server, kids in got:
        if server["spanId"] in seen_before:
            continue
        for k in kids:
            if k["name"] == "cache_get prefix":
                hits += k["attrs"]["sitsprobe.cache.hit"] is True
                misses += k["attrs"]["sitsprobe.cache.hit"] is False
    assert hits == after["hits"] - before["hits"] > 0
    assert misses == after["misses"] - before["misses"]
    ratio = agent.metric("sitsprobe_engine_cache_hit_ratio", cache="prefix")
    assert 0 < ratio <= 1
    assert agent.metric("gen_ai_server_time_to_first_token_seconds_count") >= 2 * REQUESTS
