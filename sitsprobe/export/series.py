"""Labelled series over plain dicts, for the Collectors that observe every
request (prom.RequestMetrics, genai_metrics): a histogram's observe is a
dict lookup and a bisect; labels that come from traffic are bounded per
process (LabelCap)."""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence

from prometheus_client.core import HistogramMetricFamily

from ..quantile import histogram_quantile


class Histograms:
    """Labelled histograms over plain lists; not thread-safe (callers lock)."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]):
        self.name, self.doc, self.labels, self.buckets = name, doc, labels, buckets
        self._series: dict[tuple[str, ...], list] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        h = self._series.get(labels)
        if h is None:
            h = self._series[labels] = [[0] * (len(self.buckets) + 1), 0.0]
        h[0][bisect.bisect_left(self.buckets, value)] += 1
        h[1] += value

    def add(self, labels: tuple[str, ...], counts: Sequence[int], total: float) -> None:
        """Observations binned elsewhere, in these buckets (+Inf last), and their sum."""
        h = self._series.get(labels)
        if h is None:
            h = self._series[labels] = [[0] * (len(self.buckets) + 1), 0.0]
        h[0] = [a + b for a, b in zip(h[0], counts)]
        h[1] += total

    def quantile(self, q: float, where: Callable[[tuple[str, ...]], bool] | None = None) -> float | None:
        """Over all series (or those whose labels ``where`` takes), summed, as
        histogram_quantile (and `top`) reads the buckets."""
        series = self._series.values() if where is None else \
            [h for labels, h in self._series.items() if where(labels)]
        counts = [sum(c) for c in zip(*(h[0] for h in series))]
        cumulative = list(itertools.accumulate(counts))
        return histogram_quantile(q, list(zip((*self.buckets, float("inf")), cumulative)))

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for labels, (counts, total) in self._series.items():
            acc, buckets = 0, []
            for bound, n in zip((*map(str, self.buckets), "+Inf"), counts):
                acc += n
                buckets.append((bound, acc))
            fam.add_metric(list(labels), buckets, total)
        return fam


class LabelCap:
    """At most ``limit`` distinct values per process; past them, ``other``.
    A value once kept stays kept. Not thread-safe (callers lock)."""

    def __init__(self, limit: int, other):
        self.limit, self.other = limit, other
        self._kept: dict[str, set] = {}  # process -> values kept

    def __call__(self, process: str, value):
        kept = self._kept.get(process)
        if kept is None:
            kept = self._kept[process] = set()
        if value in kept:
            return value
        if len(kept) >= self.limit:
            return self.other
        kept.add(value)
        return value
