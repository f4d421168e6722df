"""GenAI metrics, by the conventions' operation, provider and model: a
traced server's (``gen_ai.server.*``, EngineMetrics)."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..request import Request
from ..stitch.segments import SEGMENTS
from .buckets import BATCH_BUCKETS, GENAI_DURATION_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from .semconv import (ERROR_TYPE, GENAI_DURATION, GENAI_TOKENS, GENAI_TPOT, GENAI_TTFT, MODEL, OPERATION, PROVIDER,
                      TOKEN_TYPE, error_type)
from .series import Histograms

SLOW_REFRESH = 64  # observations between re-reading a model's p99 duration


class EngineMetrics:
    """GenAI server metrics from requests whose GenAI meaning is known (the
    wire, the markers), by process, and by the conventions' operation,
    provider and model (the duration also by error type); and, per model,
    where the slow tail's time went: the segments of the requests at or
    above the model's p99 duration (re-read from its histogram every
    SLOW_REFRESH requests)."""

    def __init__(self, who: tuple[str, ...] = ("process",)):
        self.who = who
        genai = (*who, OPERATION, PROVIDER, MODEL)
        self.ttft = Histograms(GENAI_TTFT,
                               "Time to first token: first request byte in to the first output "
                               "(the first content event written, or the end of prefill)",
                               genai, TTFT_BUCKETS)
        self.tpot = Histograms(GENAI_TPOT, "Time per output token after the first", genai, TPOT_BUCKETS)
        self.duration = Histograms(GENAI_DURATION,
                                   f"Inference request duration, seen from the network ({ERROR_TYPE}: "
                                   "the span's error.type, client_closed for an answer its client left)",
                                   (*genai, ERROR_TYPE), GENAI_DURATION_BUCKETS)
        self.batch = Histograms("sitsprobe_engine_batch_size", "Requests served per batched step",
                                (), BATCH_BUCKETS)
        self.cache: dict[tuple[str, ...], list[int]] = {}  # (*who, cache) -> [hits, misses]
        self.tokens: dict[tuple[str, ...], int] = {}  # (*who, operation, provider, model, type) -> tokens
        self.slow: dict[tuple[str, ...], list] = {}  # (*who, model) -> [p99 s, seen, seconds by segment]

    def observe(self, r: Request, who: tuple[str, ...] | None = None) -> None:
        """who: the request's values of the who labels (its process's name alone by default)."""
        g = r.genai
        who = who or (r.comm,)
        model = g.request_model or g.response_model or ""
        labels = (*who, g.operation or "", g.provider or "", model)
        seconds = r.duration_ns / 1e9
        self.duration.observe((*labels, error_type(r) or ""), seconds)
        if (ttft := r.ttft_ns) is not None:
            self.ttft.observe(labels, ttft / 1e9)
        if (tpot := r.tpot_ns) is not None:
            self.tpot.observe(labels, tpot / 1e9)
        for kind, n in (("input", g.input_tokens), ("output", g.output_tokens)):
            if n:
                key = (*labels, kind)
                self.tokens[key] = self.tokens.get(key, 0) + n
        if r.segments is not None:
            self._slow((*who, model), seconds, r.segments)
        for c in r.inference.cache if r.inference is not None else ():
            counts = self.cache.setdefault((*who, c.cache), [0, 0])
            counts[0 if c.hit else 1] += 1

    def _slow(self, key: tuple[str, ...], seconds: float, segments: tuple[int, ...]) -> None:
        """key: (*who, model); its p99 is over the model's duration series, every error type's."""
        slow = self.slow.get(key)
        if slow is None:
            slow = self.slow[key] = [0.0, 0, [0.0] * len(SEGMENTS)]
        slow[1] += 1
        if slow[1] % SLOW_REFRESH == 1:
            n = len(self.who)
            slow[0] = self.duration.quantile(
                0.99, lambda labels: labels[:n] == key[:n] and labels[n + 2] == key[n]) or 0.0
        if seconds >= slow[0]:
            for i, ns in enumerate(segments):
                slow[2][i] += ns / 1e9

    def families(self):
        lookups = CounterMetricFamily("sitsprobe_engine_cache_lookups",
                                      "Engine cache look-ups (prefix, completion), by result",
                                      labels=(*self.who, "cache", "result"))
        ratio = GaugeMetricFamily("sitsprobe_engine_cache_hit_ratio",
                                  "Hits over look-ups since start", labels=(*self.who, "cache"))
        for key, (hits, misses) in self.cache.items():
            lookups.add_metric([*key, "hit"], hits)
            lookups.add_metric([*key, "miss"], misses)
            ratio.add_metric(list(key), hits / (hits + misses))
        tokens = CounterMetricFamily(GENAI_TOKENS, f"Tokens in and out ({TOKEN_TYPE}: input, output), "
                                     "from the usage the server reported, or its stream events counted",
                                     labels=(*self.who, OPERATION, PROVIDER, MODEL, TOKEN_TYPE))
        for key, n in self.tokens.items():
            tokens.add_metric(list(key), n)
        slow = CounterMetricFamily("sitsprobe_gen_ai_slow_tail_segment_seconds",
                                   "Of requests at or above their model's p99 duration, the seconds "
                                   "spent in each latency segment: where the slow tail's time goes",
                                   labels=(*self.who, MODEL, "segment"))
        for key, (_, _, by_segment) in self.slow.items():
            for name, v in zip(SEGMENTS, by_segment):
                slow.add_metric([*key, name], v)
        return [self.ttft.family(), self.tpot.family(), self.duration.family(), self.batch.family(),
                lookups, ratio, tokens, slow]

