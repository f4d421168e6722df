"""The sampling-bias check: the P99 every request gives next to the P99 that
head sampling of the same requests would show.

Head sampling decides by trace id, as OpenTelemetry's ``TraceIdRatioBased``
sampler does (W3C trace ids are random): a trace is kept when the low 64
bits of its id are below round(ratio·2⁶⁴). Applied here to each record's
trace id, it keeps exactly the requests such a sampler would have kept.
One head-sampled set is one draw; the spread of many seeded random draws at
the same ratio shows how far a 1 % sample's P99 can wander. Fewer than
``min_kept`` kept requests give no number: a P99 of 30 values is their
maximum, not a tail estimate.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .quantiles import quantile
from .records import RequestRecord

MIN_KEPT = 100  # kept requests needed before a sampled P99 is shown
DRAWS = 100
_LOW64 = (1 << 64) - 1


def head_bound(ratio: float) -> int:
    """TraceIdRatioBased's bound: trace ids whose low 64 bits are below it are kept."""
    return round(ratio * (1 << 64))


def head_kept(trace_id: str, ratio: float) -> bool | None:
    """Whether a head sampler at ``ratio`` keeps this trace; None: not a trace id."""
    try:
        tid = int(trace_id, 16)
    except (TypeError, ValueError):
        return None
    if not 0 < tid < 1 << 128:
        return None
    return tid & _LOW64 < head_bound(ratio)


@dataclass(frozen=True)
class Bias:
    requests: int
    exact_p99_ms: float | None  # from every request
    ratio: float
    with_trace_id: int  # records a head sampler could decide on
    kept: int  # ... and kept
    head_p99_ms: float | None  # P99 of the kept; None: fewer than min_kept
    head_error: float | None  # (head − exact) / exact
    draws: int
    seed: int
    draw_median_ms: float | None  # of the P99s of `draws` random samples at `ratio`;
    draw_p5_ms: float | None  # None: fewer than min_kept expected per sample
    draw_p95_ms: float | None
    min_kept: int


def sampling_bias(records: Sequence[RequestRecord], ratio: float = 0.01, draws: int = DRAWS,
                  seed: int = 0, min_kept: int = MIN_KEPT) -> Bias:
    """The exact P99 of duration over every record; the P99 over those a head
    sampler at ``ratio`` keeps (by trace id; records without one cannot be
    decided and are left out of it); and the median and 5-95 % range of the
    P99 over ``draws`` random samples, each keeping every request with
    probability ``ratio`` (seeded: the same input gives the same numbers).
    Quantiles are nearest-rank (:mod:`.quantiles`)."""
    durations = sorted(r.duration_s * 1e3 for r in records)
    exact = quantile(durations, 0.99)
    decided = [(r, k) for r in records if r.trace_id is not None
               and (k := head_kept(r.trace_id, ratio)) is not None]
    kept = sorted(r.duration_s * 1e3 for r, k in decided if k)
    head = quantile(kept, 0.99) if len(kept) >= min_kept else None
    median = p5 = p95 = None
    if durations and len(durations) * ratio >= min_kept:
        rng = random.Random(seed)
        p99s = sorted(p for _ in range(draws)
                      if (p := quantile(_bernoulli(durations, ratio, rng), 0.99)) is not None)
        median, p5, p95 = (quantile(p99s, q) for q in (0.5, 0.05, 0.95))
    return Bias(len(records), exact, ratio, len(decided), len(kept), head,
                None if head is None or not exact else (head - exact) / exact,
                draws, seed, median, p5, p95, min_kept)


def _bernoulli(ordered: Sequence[float], p: float, rng: random.Random) -> list[float]:
    """Each value kept with probability p, in order (so still sorted): the
    gaps between kept ones are geometric, drawn directly, so a draw costs
    about p·n random numbers, not n."""
    if p >= 1:
        return list(ordered)
    out, i, log_q = [], -1, math.log1p(-p)
    while True:
        i += 1 + int(math.log(1.0 - rng.random()) / log_q)
        if i >= len(ordered):
            return out
        out.append(ordered[i])
