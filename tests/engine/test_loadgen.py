"""examples/loadgen.py against a real engine: the summary's counts match what was sent."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import LOADGEN, ROOT


def loadgen(engine, tmp_path, *args: str) -> dict:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(LOADGEN), "--url", engine.url, "--json", str(out), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert json.loads(proc.stdout) == {k: v for k, v in summary.items() if k != "records"}
    return summary


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_open_loop_summary_matches(engine, tmp_path, stream):
    before = engine.get("/v1/engine/stats")["batching"]["requests_submitted"]
    args = ["--rate", "25", "--requests", "12", "--turns", "3", "--shared-prefix", "0.5", "--max-tokens", "8"]
    summary = loadgen(engine, tmp_path, *args, *(["--stream"] if stream else []))
    records = summary["records"]
    assert summary["requests_sent"] == len(records) == 12 and summary["by_status"] == {"200": 12}
    assert sorted(r["id"] for r in records) == list(range(1, 13))
    assert sorted((r["session"], r["turn"]) for r in records) == [(s, t) for s in range(4) for t in range(3)]
    assert all(r["path"] == "/v1/chat/completions" and r["stream"] is stream for r in records)
    assert all(r["start"] <= r["ttft"] <= r["end"] for r in records if r["ttft"] is not None)
    assert summary["tokens_in"] == sum(r["prompt_tokens"] for r in records) > 0
    assert summary["tokens_out"] == sum(r["completion_tokens"] for r in records) > 0
    for session in range(4):  # the conversation grows turn by turn
        sizes = [r["prompt_tokens"] for r in sorted(records, key=lambda r: r["turn"]) if r["session"] == session]
        assert sizes == sorted(sizes) and len(set(sizes)) == 3
    lat = summary["latency_s"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"]
    assert summary["ttft_s"]["p50"] is not None
    assert engine.get("/v1/engine/stats")["batching"]["requests_submitted"] == before + 12


def test_closed_loop_completions_and_error_statuses(engine, tmp_path):
    summary = loadgen(engine, tmp_path, "--users", "3", "--requests", "7", "--api", "completions",
                      "--max-tokens", "200")  # over the engine's limit: every request is a 400
    assert summary["mode"] == "closed" and summary["requests_sent"] == 7
    assert summary["by_status"] == {"400": 7} and summary["latency_s"]["p50"] is None
    assert all(r["path"] == "/v1/completions" and "128" in r["error"] for r in summary["records"])
