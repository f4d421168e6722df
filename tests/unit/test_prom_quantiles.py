"""Histogram quantiles: the buckets resolve what is measured, and the demo's
status line reads them exactly as `top` (and Grafana) does."""
from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sitsprobe.export.buckets import TPOT_BUCKETS, TTFT_BUCKETS
from sitsprobe.export.series import Histograms
from sitsprobe.top.model import parse, quantile


class _One:
    def __init__(self, h: Histograms):
        self.h = h

    def collect(self):
        yield self.h.family()


def _observed(values, buckets) -> Histograms:
    h = Histograms("gen_ai_server_time_per_output_token_seconds", "TPOT", ("process", "model"), buckets)
    for v in values:
        h.observe(("python3", "tiny"), v)
    return h


def _top_quantile(h: Histograms, q: float) -> float:
    registry = CollectorRegistry()
    registry.register(_One(h))
    cur = parse(generate_latest(registry).decode(), at=10.0)
    buckets = [(float(dict(k)["le"]), v) for k, v in cur.series(h.name + "_bucket").items()]
    return quantile(q, buckets)


def test_sub_millisecond_decode_steps_are_resolved():
    # the reference engine on a CPU: TPOT around 0.6 ms, a tail near 3 ms
    rng = random.Random(7)
    values = [rng.uniform(0.0005, 0.0007) for _ in range(990)] + [0.0031] * 10
    h = _observed(values, TPOT_BUCKETS)
    assert 0.0005 <= h.quantile(0.5) <= 0.001  # it read 5 ms with a first bucket of 10 ms
    assert 0.0025 <= h.quantile(0.995) <= 0.005


def test_a_gpu_engines_tens_of_milliseconds_are_resolved_too():
    rng = random.Random(8)
    h = _observed([rng.uniform(0.03, 0.05) for _ in range(1000)], TTFT_BUCKETS)
    assert 0.02 <= h.quantile(0.5) <= 0.06


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_the_demo_reads_the_quantile_top_reads(q):
    rng = random.Random(9)
    h = _observed([rng.lognormvariate(-5, 0.8) for _ in range(500)], TTFT_BUCKETS)
    assert h.quantile(q) == pytest.approx(_top_quantile(h, q))
