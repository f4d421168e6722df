"""The one quantile definition every table of the report uses.

Nearest rank: the q-quantile of n values is the smallest value with at least
q·n of the values at or below it, i.e. the ⌈q·n⌉-th smallest (the first for
q·n ≤ 1). It is always one of the values (no interpolation), so a P99 is a
request that happened. q is read as the decimal it is written as (0.99 is
99/100 exactly), so no binary rounding moves a rank: ⌈0.99·1000⌉ is 990.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction


def rank(n: int, q: float) -> int:
    """The 1-based nearest rank of the q-quantile among n values (n ≥ 1)."""
    return min(n, max(1, math.ceil(Fraction(str(q)) * n)))


def quantile(ordered: Sequence[float], q: float) -> float | None:
    """The q-quantile of values sorted ascending; None for none."""
    return ordered[rank(len(ordered), q) - 1] if ordered else None


def tail_size(n: int, q: float = 0.99) -> int:
    """How many requests rank above the q-quantile: n − ⌈q·n⌉, at least one
    (of n ≥ 1): the slowest 1 % for q = 0.99. Each is at or above the quantile."""
    return max(1, n - rank(n, q)) if n else 0


def mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def variance(values: Sequence[float]) -> float | None:
    """The population variance (divided by n, not n − 1: every request is counted,
    not sampled), computed around the mean (two passes, no cancellation)."""
    m = mean(values)
    if m is None:
        return None
    return math.fsum((v - m) ** 2 for v in values) / len(values)
