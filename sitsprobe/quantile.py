"""One quantile rule for every number read off a histogram (`top`, the demo's
status line): Prometheus's ``histogram_quantile``, so what a person reads
here is what a Grafana panel over the same buckets shows."""
from __future__ import annotations

import math


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over cumulative (upper bound, count)
    pairs: linear inside the bucket the rank falls in; the highest finite
    bound when it falls in +Inf. None without observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            break
        lower, below = upper, count
    if math.isinf(upper):
        return lower
    if upper <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / (count - below)
