"""GenAI metrics, by the conventions' operation, provider and model: a
traced server's (``gen_ai.server.*``, EngineMetrics) and a traced client's
calls (``gen_ai.client.*``, GenAIClientMetrics), each request counted on the
side that saw it: a gateway traced on both sides counts a call once as its
server's request and once as its own call."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..request import Request
from ..stitch.segments import SEGMENTS
from .buckets import BATCH_BUCKETS, GENAI_DURATION_BUCKETS, TOKEN_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from .semconv import (ERROR_TYPE, GENAI_CLIENT_DURATION, GENAI_CLIENT_TOKENS, GENAI_CLIENT_TPOC, GENAI_CLIENT_TTFC,
                      GENAI_DURATION, GENAI_TOKENS, GENAI_TPOT, GENAI_TTFT, MODEL, OPERATION, PROVIDER, SERVER_ADDRESS,
                      SERVER_PORT, TOKEN_TYPE, error_type)
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


class GenAIClientMetrics:
    """GenAI calls a traced process made (a gateway's to its upstream, an
    application's to a hosted API), by operation, provider, model and the
    server called (server.address/port, bounded as the HTTP client metric's):
    each call's duration, first byte out to last byte in (by error type); its
    tokens, one observation per call and type; and a streamed answer's time to
    its first chunk that carries output (the point a server's time to first
    token marks, read where the client read it) and, for each chunk with output
    after it, the time since the one before (as the conventions' time per
    output chunk: chunks read together, 0; those past capture.max_writes are
    not timed, and not observed)."""

    def __init__(self, who: tuple[str, ...] = ("process",)):
        genai = (*who, OPERATION, PROVIDER, MODEL, SERVER_ADDRESS, SERVER_PORT)
        self.duration = Histograms(GENAI_CLIENT_DURATION,
                                   f"GenAI calls' duration, first request byte sent to the answer's last "
                                   f"byte read ({ERROR_TYPE}: the span's)", (*genai, ERROR_TYPE),
                                   GENAI_DURATION_BUCKETS)
        self.ttfc = Histograms(GENAI_CLIENT_TTFC,
                               "Streamed GenAI calls: first request byte sent to the first chunk with output read",
                               genai, TTFT_BUCKETS)
        self.tpoc = Histograms(GENAI_CLIENT_TPOC,
                               "Streamed GenAI calls: for each chunk with output read after the first, the time "
                               "since the one before", genai, TPOT_BUCKETS)
        self.tokens = Histograms(GENAI_CLIENT_TOKENS,
                                 f"Tokens a GenAI call used ({TOKEN_TYPE}: input, output), from the usage "
                                 "the answer reported, or its stream events counted", (*genai, TOKEN_TYPE),
                                 TOKEN_BUCKETS)

    def observe(self, r: Request, who: tuple[str, ...], server: tuple[str, str]) -> None:
        """who: the request's values of the who labels; server: (address, port), as labelled."""
        g = r.genai
        labels = (*who, g.operation or "", g.provider or "", g.request_model or g.response_model or "", *server)
        self.duration.observe((*labels, error_type(r) or ""), r.duration_ns / 1e9)
        if g.streaming and (ttfc := r.ttft_ns) is not None:
            self.ttfc.observe(labels, ttfc / 1e9)
            for gap in g.chunk_gaps_ns:
                self.tpoc.observe(labels, gap / 1e9)
        for kind, n in (("input", g.input_tokens), ("output", g.output_tokens)):
            if n is not None:
                self.tokens.observe((*labels, kind), n)

    def families(self):
        return [self.duration.family(), self.ttfc.family(), self.tpoc.family(), self.tokens.family()]
