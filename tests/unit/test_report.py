"""sitsprobe.report and `sitsprobe report`: known distributions in, exact tables out.

Traces files are written here through the exporter's own ``otlp_json`` from
real SDK ReadableSpans, so they have exactly the shape `sitsprobe run
--traces-file` writes.
"""
from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import SpanContext, SpanKind

from sitsprobe import cli, config
from sitsprobe.clock import WallClock
from sitsprobe.errors import ConfigError, SitsprobeError
from sitsprobe.export.otlp import TraceExporter, otlp_json
from sitsprobe.export.semconv import span_attributes
from sitsprobe.report import Recent, RequestRecord, build
from sitsprobe.report.bias import head_bound, head_kept, sampling_bias
from sitsprobe.report.load import (
    TimeWindow,
    covered,
    parse_agent,
    parse_duration,
    parse_lines,
    parse_time,
    read_traces,
    select,
)
from sitsprobe.report.quantiles import quantile, rank, tail_size
from sitsprobe.report.render import TEXT_WIDTH, text
from sitsprobe.report.tables import (
    attribution,
    invalid_reasons,
    kept_attributes,
    sli,
    validity,
)
from sitsprobe.request import CacheLookup, GenAI, Inference, Request, Stage, TraceParent

T0 = 1_780_000_000 * 10**9  # 2026-05-28, Unix ns
MS = 1_000_000
RESOURCE = Resource.create({"service.name": "engine"})
SETTINGS = config.load().report


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)


# -- building spans and records ------------------------------------------------------

_ids = random.Random(7)


def server_span(start_ns: int, duration_ms: float, segments_ms: dict | None = None, *,
                trace_id: int | None = None, **attrs) -> ReadableSpan:
    attributes = {f"sitsprobe.latency.{k}_s": v / 1e3 for k, v in (segments_ms or {}).items()}
    attributes.update(attrs)
    ctx = SpanContext(trace_id or _ids.getrandbits(128) | 1, _ids.getrandbits(64) | 1, False)
    return ReadableSpan(name="POST /v1/chat/completions", context=ctx, kind=SpanKind.SERVER,
                        attributes=attributes, start_time=start_ns,
                        end_time=start_ns + round(duration_ms * MS), resource=RESOURCE)


def child_span(parent: ReadableSpan, name: str, start_ns: int, duration_ms: float, **attrs) -> ReadableSpan:
    ctx = SpanContext(parent.context.trace_id, _ids.getrandbits(64) | 1, False)
    return ReadableSpan(name=name, context=ctx, parent=parent.context, kind=SpanKind.INTERNAL,
                        attributes=attrs, start_time=start_ns, end_time=start_ns + round(duration_ms * MS),
                        resource=RESOURCE)


def lines_of(spans: list[ReadableSpan], per_line: int = 512) -> list[str]:
    """OTLP/JSON lines, as OtlpJsonFileExporter writes them (one per exported batch)."""
    return [json.dumps(otlp_json(spans[i:i + per_line]), separators=(",", ":")) + "\n"
            for i in range(0, len(spans), per_line)]


def record(start_ms: float = 0, duration_ms: float = 100, segments_ms: dict | None = None,
           trace_id: str | None = None, **fields) -> RequestRecord:
    start = T0 + round(start_ms * MS)
    return RequestRecord(trace_id=trace_id, name="POST /v1/chat/completions", start_ns=start,
                         end_ns=start + round(duration_ms * MS),
                         segments={k: v / 1e3 for k, v in (segments_ms or {}).items()}, **fields)


FAST = {"network": 10, "scheduling": 20, "compute": 50, "io": 10, "cache": 10}  # 100 ms
SLOW = {"network": 10, "scheduling": 20, "compute": 950, "io": 10, "cache": 10}  # 1000 ms


def known_spans() -> list[ReadableSpan]:
    """1000 requests: 990 of 100 ms, 10 of 1000 ms whose extra time is all compute;
    each with a prefill stage (30 ms) and a zero-length cache look-up; then 5
    exchanges without segments (1 ms)."""
    spans = []
    for i in range(1000):
        slow = i % 100 == 50
        start = T0 + i * 10 * MS
        s = server_span(start, 1000 if slow else 100, SLOW if slow else FAST,
                        **{"http.response.status_code": 200, "gen_ai.request.model": "m",
                           "gen_ai.server.time_to_first_token": 0.2 if slow else 0.05})
        spans += [child_span(s, "prefill", start + MS, 30), child_span(s, "cache_get prefix", start + MS, 0), s]
    spans += [server_span(T0 + i * MS, 1) for i in range(5)]
    return spans


# -- quantiles ------------------------------------------------------------------------

def test_nearest_rank_quantiles():
    assert rank(1000, 0.99) == 990 and rank(100, 0.99) == 99 and rank(1, 0.99) == 1
    assert rank(1005, 0.99) == 995 and rank(10, 0.05) == 1 and rank(10, 1) == 10
    values = list(range(1, 101))
    assert quantile(values, 0.99) == 99 and quantile(values, 0.5) == 50 and quantile(values, 1) == 100
    assert quantile([7.0], 0.99) == 7.0 and quantile([], 0.99) is None
    assert [tail_size(n) for n in (0, 1, 50, 100, 150, 1000, 1005)] == [0, 1, 1, 1, 1, 10, 10]


# -- records ----------------------------------------------------------------------------

def test_record_from_an_otlp_json_span_and_its_children():
    s = server_span(T0, 120, {"network": 2, "compute": 100}, trace_id=0xABC,
                    **{"http.response.status_code": 200, "http.route": "/v1/chat/completions",
                       "gen_ai.request.model": "asked", "gen_ai.response.model": "answered",
                       "gen_ai.response.finish_reasons": ("stop", "length"),
                       "gen_ai.server.time_to_first_token": 0.04,
                       "gen_ai.server.time_per_output_token": 0.005, "gen_ai.usage.output_tokens": 17,
                       "sitsprobe.genai.answer_empty": False, "sitsprobe.genai.json_valid": True,
                       "rag.retrieval_s": 0.011})
    kids = [child_span(s, "decode", T0 + 50 * MS, 2), child_span(s, "decode", T0 + 60 * MS, 3),
            child_span(s, "prefill", T0 + 10 * MS, 30, **{"rag.hits": 4})]
    doc = json.loads(lines_of([*kids, s])[0])
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    rec = RequestRecord.from_span(spans[-1], spans[:-1], keep=("rag.retrieval_s", "rag.hits", "nothing"))
    assert rec.trace_id == f"{0xABC:032x}" and rec.name == "POST /v1/chat/completions"
    assert (rec.start_ns, rec.end_ns, rec.duration_s) == (T0, T0 + 120 * MS, 0.12)
    assert rec.segments == {"network": 0.002, "compute": 0.1}
    assert rec.segment("io") == 0.0 and rec.residual_s == pytest.approx(0.018)
    assert (rec.status, rec.route, rec.model) == (200, "/v1/chat/completions", "answered")
    assert rec.finish_reasons == ("stop", "length")
    assert (rec.ttft_s, rec.tpot_s, rec.output_tokens) == (0.04, 0.005, 17)
    assert (rec.answer_empty, rec.json_valid, rec.error_type, rec.genai) == (False, True, None, True)
    assert rec.stages == {"decode": 0.005, "prefill": 0.03}
    assert rec.attributes == {"rag.retrieval_s": 0.011, "rag.hits": 4.0}
    assert rec.measure("stage:decode") == 0.005 and rec.measure("attribute:rag.hits") == 4.0
    assert rec.measure("stage:nothing") is None and rec.measure("ttft") == 0.04
    assert RequestRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec
    bare = RequestRecord.from_span({"startTimeUnixNano": "5", "endTimeUnixNano": "9", "kind": 2})
    assert (bare.genai, bare.segments, bare.trace_id, bare.json_valid) == (False, {}, None, None)
    with pytest.raises(ValueError):
        RequestRecord.from_span({"name": "no times", "kind": 2})


def test_agent_side_record_equals_the_file_side_one(tmp_path):
    """RequestRecord.from_request(req, span_attributes(req)) is what from_span
    makes of the span TraceExporter writes for the same request."""
    clock = WallClock()
    clock.offset_ns = T0
    inf = Inference(request_id=3, model="tiny", start_ns=1_000 * MS, end_ns=1_090 * MS,
                    stages=(Stage("queue", 1_001 * MS, 1_010 * MS), Stage("prefill", 1_010 * MS, 1_030 * MS),
                            Stage("decode", 1_030 * MS, 1_050 * MS, batch_id=1, batch_size=2),
                            Stage("decode", 1_050 * MS, 1_070 * MS, batch_id=2, batch_size=2)),
                    cache=(CacheLookup("prefix", "k1", True, 1_012 * MS),),
                    input_tokens=10, output_tokens=5)
    req = Request(pid=1, comm="python", fd=5, start_ns=1_000 * MS, end_ns=1_100 * MS,
                  first_out_ns=1_031 * MS, bytes_in=300, bytes_out=900, method="POST",
                  target="/v1/chat/completions", path="/v1/chat/completions", route="/v1/chat/completions",
                  status=200, inference=inf, traceparent=TraceParent(0x1234ABCD, 0x99, 1),
                  genai=GenAI(source="markers", operation="chat", request_model="tiny",
                              finish_reasons=("stop",), input_tokens=10, output_tokens=5,
                              first_token_ns=1_030 * MS, last_token_ns=1_070 * MS, answer_empty=False))
    path = tmp_path / "t.jsonl"
    exporter = TraceExporter(clock=clock, traces_file=str(path))
    exporter.export(req)
    exporter.shutdown()
    (from_file,) = read_traces(str(path)).records
    from_agent = RequestRecord.from_request(req, span_attributes(req), clock=clock)
    assert from_agent == from_file
    assert from_file.stages == {"queue": 0.009, "prefill": 0.02, "decode": 0.04, "cache_get prefix": 0.0}
    assert from_file.trace_id == f"{0x1234ABCD:032x}" and from_file.ttft_s == 0.03
    assert from_file.genai and from_file.model == "tiny" and from_file.output_tokens == 5
    assert RequestRecord.from_dict(json.loads(json.dumps(from_agent.to_dict()))) == from_agent


# -- loading -------------------------------------------------------------------------------

def test_garbage_lines_are_counted_never_fatal(tmp_path):
    good = lines_of([server_span(T0, 10, FAST), server_span(T0 + MS, 20, FAST)], per_line=1)
    cut = good[0][: len(good[0]) // 2] + "\n"
    path = tmp_path / "t.jsonl"
    with open(path, "wb") as f:
        f.write("".join([good[0], "not json at all\n", cut, "\n", "[1, 2]\n",
                         '{"resourceSpans": 5}\n', "[" * 100_000 + "\n", good[1]]).encode())
        f.write(b"\xff\xfe\x00binary\n")
        f.write(b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"kind":2,"name":"no times"},7]}]}]}\n')
        f.write(b"{}\n")
    loaded = read_traces(str(path))
    assert len(loaded.records) == 2
    assert (loaded.lines, loaded.skipped, loaded.bad_spans) == (10, 6, 1)
    assert loaded.problems[0] == "line 2: not JSON (Expecting value at character 1)"
    assert loaded.problems[1].startswith("line 3: cut short")
    assert loaded.problems[2] == ("line 5: not an OTLP/JSON ExportTraceServiceRequest "
                                  "(a JSON list, not an ExportTraceServiceRequest object)")
    assert len(loaded.problems) == 5  # the rest only counted
    with pytest.raises(SitsprobeError, match="cannot read the traces file"):
        read_traces(str(tmp_path / "missing.jsonl"))


def test_children_join_their_parent_from_any_line():
    s = server_span(T0, 100, FAST, trace_id=0xAAA)
    early, late = child_span(s, "prefill", T0, 30), child_span(s, "decode", T0 + 40 * MS, 5)
    other_trace = server_span(T0, 100, FAST, trace_id=0xBBB)
    # a child of another trace with the same span id must not join
    stray = ReadableSpan(name="decode", context=SpanContext(0xBBB, 77, False), parent=s.context,
                         kind=SpanKind.INTERNAL, start_time=T0, end_time=T0 + 9 * MS, resource=RESOURCE)
    loaded = parse_lines(lines_of([early, s, other_trace, late, stray], per_line=2), "<test>")
    first, second = loaded.records
    assert first.stages == {"prefill": 0.03, "decode": 0.005} and second.stages == {}


def test_time_window():
    recs = [record(start_ms=i * 1000, duration_ms=100) for i in range(10)]  # end at i s + 100 ms
    kept, window = select(recs, last_s=3)
    assert [r.start_ns for r in kept] == [r.start_ns for r in recs[6:]]
    assert window.explicit and window.seconds == 3.0
    kept, window = select(recs)
    assert len(kept) == 10 and not window.explicit and window.seconds == 9.1
    since, until = T0 + 2 * 10**9, T0 + 5 * 10**9
    kept, window = select(recs, since, until)
    assert len(kept) == 3 and window.seconds == 3.0 and window.explicit
    kept, window = select(recs, since_ns=T0 + 8 * 10**9)
    assert len(kept) == 2 and window.start_ns == T0 + 8 * 10**9 and window.end_ns == recs[-1].end_ns
    assert select([], last_s=5) == ([], None)
    assert [parse_duration(t) for t in ("90s", "5m", "1.5h", "2d", "250ms", "30")] == \
        [90, 300, 5400, 172800, 0.25, 30]
    for bad in ("5 parsecs", "0s", "-5m", ""):
        with pytest.raises(SitsprobeError, match="--last: expected a positive duration"):
            parse_duration(bad)
    assert parse_time("2026-05-28T20:26:40Z", "--since") == T0
    assert parse_time("2026-05-28T22:26:40+02:00", "--since") == T0
    assert parse_time("2026-05-28 20:26:40", "--since") == T0  # no offset: UTC
    assert parse_time("1780000000.5", "--until") == T0 + 500 * MS
    with pytest.raises(SitsprobeError, match="--until: expected an ISO 8601 time"):
        parse_time("yesterday", "--until")


# -- latency attribution ---------------------------------------------------------------------

def test_attribution_of_a_known_distribution():
    loaded = parse_lines(lines_of(known_spans()), "<test>")
    a = attribution(loaded.records, SETTINGS.tolerance)
    assert (a.requests, a.without_segments, a.tail_requests) == (1000, 5, 10)
    assert a.p99_ms == pytest.approx(100) and a.tail_min_ms == pytest.approx(1000)
    rows = {r.segment: r for r in a.rows}
    assert list(rows) == ["network", "scheduling", "compute", "io", "cache", "residual"]
    # the slow tail: the 10 slow requests, 95 % compute
    for name, p99, share in [("network", 10, 0.01), ("scheduling", 20, 0.02), ("compute", 950, 0.95),
                             ("io", 10, 0.01), ("cache", 10, 0.01)]:
        assert rows[name].tail_p99_ms == pytest.approx(p99), name
        assert rows[name].tail_share == pytest.approx(share), name
    # all requests: 990 x 50 ms + 10 x 950 ms of compute in 990 x 100 + 10 x 1000 ms
    c = rows["compute"]
    assert c.mean_ms == pytest.approx(59) and c.share == pytest.approx(59_000 / 109_000)
    assert c.variance_ms2 == pytest.approx((990 * 50**2 + 10 * 950**2) / 1000 - 59**2)  # 8019
    assert rows["scheduling"].mean_ms == pytest.approx(20) and rows["scheduling"].variance_ms2 == pytest.approx(0)
    assert rows["network"].share == pytest.approx(10_000 / 109_000)
    assert rows["residual"].tail_share == pytest.approx(0, abs=1e-9)
    assert sum(r.share for r in a.rows) == pytest.approx(1)
    assert sum(r.tail_share for r in a.rows) == pytest.approx(1)
    assert a.residual.over == 0 and a.residual.max_abs_ms == pytest.approx(0, abs=1e-6)


def test_segments_that_do_not_add_up_are_reported():
    recs = [record(i * 200, 100, FAST, trace_id=f"{i + 1:032x}") for i in range(99)]
    recs.append(record(99 * 200, 130, FAST, trace_id="00000000000000000000000000000bad"))  # 30 ms unexplained
    a = attribution(recs, SETTINGS.tolerance)
    res = a.residual
    assert res.over == 1 and res.worst_trace_id == "00000000000000000000000000000bad"
    assert res.max_abs_ms == pytest.approx(30) and res.worst_ms == pytest.approx(30)
    assert res.mean_ms == pytest.approx(0.3)
    out = text(build(recs, SETTINGS), parse_lines([], "<test>"))
    line = next(x for x in out.splitlines() if x.startswith("residual (duration - sum of segments)"))
    assert "max |r| 30.00 ms" in line and "1 of 100 requests off by more" in out
    assert "worst: trace 00000000000000000000000000000bad, +30.00 ms" in out
    # segments that overshoot count too; the tolerance is max(share x duration, min_ms)
    over = record(0, 100, {"compute": 104})
    tol = config.Tolerance(share=0.05, min_ms=0.5)
    assert attribution([over], tol).residual.over == 0  # 4 ms < 5 % of 100 ms
    assert attribution([over], config.Tolerance(share=0.01, min_ms=0.5)).residual.over == 1
    assert attribution([record(0, 2, {"compute": 1.6})], tol).residual.over == 0  # 0.4 ms < 0.5 ms
    assert attribution([record(0, 2, {"compute": 1.4})], tol).residual.over == 1
    none = attribution([record(0, 5)], tol)
    assert (none.requests, none.without_segments, none.rows, none.residual) == (0, 1, (), None)


# -- SLIs, EIPR and uptime ----------------------------------------------------------------

def test_sli_windows_and_no_data():
    recs = [record(i, 100 + i, FAST, ttft_s=(80 + i) / 1e3, stages={"prefill": 0.02}) for i in range(100)]
    recs += [record(0, 900)]  # no ttft, no stages, no segments
    windows = [*SETTINGS.windows, config.Window("prefill", "stage:prefill", 20),
               config.Window("tpot", "tpot", 10), config.Window("rag", "attribute:rag.retrieval_s", 120)]
    rows = {r.name: r for r in sli(recs, windows)}
    assert rows["rag_retrieval"].requests == 0 and rows["rag_retrieval"].share_within is None
    assert rows["rag_retrieval"].p99_ms is None and rows["rag_retrieval"].p99_met is None
    ft = rows["first_token"]  # ttft 80..179 ms against 95 ms
    assert (ft.requests, ft.within, ft.share_within) == (100, 16, 0.16)
    assert ft.p99_ms == pytest.approx(178) and ft.p99_met is False
    e2e = rows["end_to_end"]  # 100..199 ms and one 900 ms, against 350 ms
    assert (e2e.requests, e2e.within) == (101, 100) and e2e.p99_ms == pytest.approx(199) and e2e.p99_met
    assert rows["prefill"].share_within == 1.0 and rows["prefill"].p99_met
    assert rows["tpot"].requests == 0 and rows["rag"].requests == 0
    assert kept_attributes(windows) == ("rag.retrieval_s",)


def genai(i: int, **fields) -> RequestRecord:
    base = {"status": 200, "finish_reasons": ("stop",), "genai": True, "model": "m"}
    return record(i * 100, 50, FAST, **{**base, **fields})


def test_eipr_and_semantic_uptime_with_invalid_responses():
    recs = [genai(0, status=503, error_type="503"), genai(1, finish_reasons=("content_filter",)),
            genai(2, answer_empty=True), genai(3, json_valid=False), genai(4, finish_reasons=()),
            genai(5, finish_reasons=("stop", "tool_calls")), genai(6, status=None, error_type="incomplete"),
            genai(7, status=204), genai(8, finish_reasons=("length",), json_valid=True, answer_empty=False),
            genai(9, finish_reasons=(), error_type="client_closed")]  # a user's stop button
    recs += [genai(i) for i in range(10, 100)]
    recs += [record(i * 100, 5) for i in range(3)]  # not GenAI: not counted
    valid = SETTINGS.valid
    assert invalid_reasons(recs[0], valid) == ["status", "error"]
    assert invalid_reasons(recs[4], valid) == []  # no finish reason known: no fault by default
    assert invalid_reasons(recs[6], valid) == ["no_status", "error"]
    assert invalid_reasons(recs[9], valid) == ["client_closed"]  # not the server's error
    _, window = select(recs, T0, T0 + 10 * 10**9)
    v = validity(recs, valid, SETTINGS.uptime_target, window)
    assert (v.counted, v.not_genai, v.valid) == (100, 3, 93)
    assert v.window_s == 10.0 and v.eipr == pytest.approx(9.3)
    assert v.uptime == pytest.approx(0.93) and v.target == 0.999 and v.met is False
    assert v.invalid == {"status": 1, "no_status": 1, "error": 2, "client_closed": 1, "finish_reason": 2,
                         "empty_answer": 1, "json_invalid": 1}
    strict = config.Valid(status_classes=("200",), finish_reasons=("stop", "length"), require_finish_reason=True,
                          require_answer=False, require_json_valid=False)
    v = validity(recs, strict, 0.9, window)
    assert v.valid == 93 - 1 + 1 + 1 - 1  # no finish reason and 204 now fail; empty and bad JSON pass
    assert v.invalid["no_finish_reason"] == 2 and v.met is True  # recs[4]'s, and the stopped one's
    _, implicit = select(recs)  # oldest start to newest end: 0 .. 9.95 s
    v = validity(recs, valid, 0.9, implicit)
    assert v.window_s == pytest.approx(9.95) and v.eipr == pytest.approx(93 / 9.95) and v.met is True
    none = validity([record(0, 5)], valid, 0.999, implicit)
    assert (none.counted, none.eipr, none.uptime, none.met) == (0, None, None, None)


# -- the sampling-bias check ------------------------------------------------------------------

def test_head_sampling_is_trace_id_ratio_based():
    bound = head_bound(0.01)
    assert bound == round(0.01 * 2**64)
    high = 0x0AF7651916CD43DD << 64
    assert head_kept(f"{high | (bound - 1):032x}", 0.01) is True
    assert head_kept(f"{high | bound:032x}", 0.01) is False
    assert head_kept("not hex", 0.01) is None and head_kept("0" * 32, 0.01) is None
    sdk = TraceIdRatioBased(0.01)
    rng = random.Random(3)
    for tid in [rng.getrandbits(128) | 1 for _ in range(5000)] + [high | (bound - 1), high | bound]:
        expected = sdk.should_sample(None, tid, "x").decision.is_sampled()
        assert head_kept(f"{tid:032x}", 0.01) is expected


def test_exact_and_head_sampled_p99_of_constructed_trace_ids():
    """20 000 requests of 1..20 000 ms; trace ids made so that a 1 % head
    sampler keeps exactly every 100th (durations 1, 101, ..., 19 901 ms)."""
    bound = head_bound(0.01)
    recs = []
    for i in range(20_000):
        low = i if i % 100 == 0 else bound + i
        recs.append(record(i, i + 1, trace_id=f"{(i + 1) << 64 | low:032x}"))
    recs.append(record(0, 5))  # no trace id: counted in the exact P99, undecidable for a head sampler
    b = sampling_bias(recs, 0.01, seed=1)
    # rank 19 801 of 20 001; the extra 5 ms request moves every value from 5 ms up one place
    assert b.requests == 20_001 and b.exact_p99_ms == pytest.approx(19_800)
    assert (b.with_trace_id, b.kept) == (20_000, 200)
    assert b.head_p99_ms == pytest.approx(19_701)  # rank 198 of the 200 kept
    assert b.head_error == pytest.approx((19_701 - 19_800) / 19_800)
    assert b.draw_p5_ms <= b.draw_median_ms <= b.draw_p95_ms
    assert 18_000 < b.draw_median_ms < 20_001
    assert sampling_bias(recs, 0.01, seed=1) == b  # seeded: the same numbers every time
    everything = sampling_bias(recs[:-1], 1.0)
    assert everything.kept == 20_000 and everything.head_p99_ms == everything.exact_p99_ms
    assert everything.draw_p5_ms == everything.draw_p95_ms == everything.exact_p99_ms


def test_too_few_kept_is_no_number():
    recs = [record(i, 100 + i, trace_id=f"{_ids.getrandbits(128) | 1:032x}") for i in range(1000)]
    b = sampling_bias(recs, 0.01)
    assert b.exact_p99_ms == pytest.approx(1089)
    assert b.kept < 100 and b.head_p99_ms is None and b.head_error is None
    assert b.draw_median_ms is None and b.draw_p5_ms is None
    out = text(build(recs, SETTINGS), parse_lines([], "<test>"))
    assert "head-sampled at 1 % by trace id  too few to estimate" in out
    assert "100 random 1 % samples           too few to estimate: 10 expected per sample" in out


# -- the agent's store ------------------------------------------------------------------------

def test_recent_is_bounded_and_thread_safe():
    store = Recent(max_records=500)
    threads = [threading.Thread(target=lambda k=k: [store.add(record(k * 1000 + i, 10)) for i in range(1000)])
               for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = store.records()
    assert len(held) == 500 and store.added == 4000 and store.evicted == 3500
    assert store.added == len(held) + store.evicted
    newest = max(r.end_ns for r in held)
    assert all(r.end_ns >= newest - 2 * 10**9 for r in store.records(window_s=2))
    loaded = parse_agent(store.to_json(), "http://agent")
    assert loaded.records == held and loaded.evicted == 3500
    # it holds every request only from its oldest on: a window reaching earlier is cut there
    assert loaded.complete_since_ns == held[0].end_ns
    asked = TimeWindow(held[0].end_ns - 10**9, newest, True)
    assert covered(asked, loaded) == TimeWindow(held[0].end_ns, newest, True)
    assert parse_agent(Recent().to_json(), "http://agent").complete_since_ns is None
    with pytest.raises(ValueError):
        Recent(0)


def test_bad_agent_pages():
    with pytest.raises(SitsprobeError, match="not a report page"):
        parse_agent(b"<html>", "http://agent")
    loaded = parse_agent(b'{"requests": [{"start_ns": 1, "end_ns": 2}, 5, {"name": "x"}]}', "http://agent")
    assert len(loaded.records) == 1 and loaded.skipped == 2


# -- configuration ---------------------------------------------------------------------------

def test_report_config_defaults_and_layers(tmp_path):
    r = config.load().report
    assert [(w.name, w.measure, w.window_ms) for w in r.windows] == [
        ("rag_retrieval", "stage:rag_retrieval", 120), ("context_injection", "stage:context_injection", 45),
        ("first_token", "ttft", 95), ("end_to_end", "duration", 350)]
    assert r.valid == config.Valid(("2xx",), ("stop", "length"), False, True, True)
    assert r.uptime_target == 0.999 and r.tolerance == config.Tolerance(0.05, 0.5)
    path = tmp_path / "c.yaml"
    path.write_text("report:\n  valid: {require_answer: false, status_classes: [2xx, 404]}\n"
                    "  tolerance: {min_ms: 2}\n  windows: [{name: ttft, measure: ttft, window_ms: 80}]\n")
    r = config.load(path).report
    assert r.valid.require_answer is False and r.valid.status_classes == ("2xx", "404")
    assert r.valid.finish_reasons == ("stop", "length")  # what the file leaves out keeps the default
    assert r.tolerance == config.Tolerance(0.05, 2.0) and len(r.windows) == 1
    assert config.load(path, {"report.valid": {"require_json_valid": False}}).report.valid.require_answer is False
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(config.dump(config.load(path)))
    assert config.load(dumped) == config.load(path)


@pytest.mark.parametrize("text, message", [
    ("report:\n  windows: [{name: a, measure: latency, window_ms: 5}]\n",
     ("report.windows[0].measure: expected ttft, duration, tpot, stage:<child span name> or "
      "attribute:<span attribute>, got 'latency'")),
    ("report:\n  windows: [{name: a, measure: ttft, window_ms: 0}]\n",
     "report.windows[0].window_ms: expected a number > 0, got 0"),
    ("report:\n  windows: [{name: a, measure: ttft}]\n",
     "report.windows[0].window_ms: expected a value (the key is required), got none"),
    ("report:\n  windows: [{name: a, measure: ttft, window_ms: 1}, {name: a, measure: tpot, window_ms: 1}]\n",
     "report.windows[1].name: expected a name no other window has, got 'a'"),
    ("report:\n  valid: {finish_reason: [stop]}\n",
     ("report.valid.finish_reason: expected one of the keys status_classes, finish_reasons, "
      "require_finish_reason, require_answer, require_json_valid, got an unknown key "
      "(did you mean finish_reasons?)")),
    ("report:\n  valid: {status_classes: [2XX]}\n",
     "report.valid.status_classes[0]: expected a status class \"1xx\"..\"5xx\" or a code 100..599, got '2XX'"),
    ("report:\n  valid: strict\n",
     ("report.valid: expected a mapping of status_classes, finish_reasons, require_finish_reason, "
      "require_answer, require_json_valid, got 'strict'")),
    ("report:\n  uptime_target: 99.9\n", "report.uptime_target: expected a number 0..1, got 99.9"),
    ("report:\n  tolerance: {share: 5}\n", "report.tolerance.share: expected a number 0..1, got 5"),
])
def test_report_config_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert str(info.value) == f"{path}: {message}"


def test_the_helm_chart_takes_the_report_section(tmp_path):
    from tests.unit.test_helm import effective_config, refused, render
    values = {"config": {"report": {"windows": [{"name": "ttft", "measure": "ttft", "window_ms": 80}],
                                    "valid": {"status_classes": ["2xx", 404]}, "uptime_target": 0.99}}}
    r = effective_config(render(values), tmp_path).report
    assert r.windows == (config.Window("ttft", "ttft", 80.0),) and r.valid.status_classes == ("2xx", "404")
    assert "at '/config/report/windows/0/measure'" in refused(
        {"config": {"report": {"windows": [{"name": "x", "measure": "latency", "window_ms": 1}]}}})


# -- the command line ---------------------------------------------------------------------

@pytest.fixture
def traces(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(lines_of(known_spans())) + "garbage line\n")
    return path


def test_cli_prints_the_three_tables(traces, capsys):
    assert cli.main(["report", str(traces)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(len(line) <= TEXT_WIDTH for line in lines), max(lines, key=len)
    assert lines[0] == f"sitsprobe report: {traces}"
    assert "1,005 requests, 2026-05-28 20:26:40 to 20:26:50 UTC" in lines[1]
    assert "1 line skipped (line 7: not JSON (Expecting value at character 1))" in out.replace("\n  ", " ")
    for title in ("Latency attribution:", "SLIs:", "Sampling bias:"):
        assert sum(line.startswith(title) for line in lines) == 1, title
    compute = next(line for line in lines if line.startswith("compute "))
    assert compute.split() == ["compute", "950.00", "95.0", "%", "59.00", "8,019.00", "54.1", "%"]
    rag = next(line for line in lines if line.startswith("rag_retrieval "))
    assert "no data" in rag and "%" not in rag
    first_token = next(line for line in lines if line.startswith("first_token "))
    assert first_token.split() == ["first_token", "ttft", "95", "1,000", "99.0", "%", "50.00", "yes"]
    assert "EIPR: no data" not in out and "semantic uptime: no data" not in out
    assert "exact, every request             100.00 ms (1,005 requests)" in out


def test_cli_json_and_png(traces, tmp_path, capsys):
    png = tmp_path / "a.png"
    assert cli.main(["report", str(traces), "--json", "--png", str(png), "--sample-ratio", "0.5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"source", "input", "window", "attribution", "sli", "validity", "bias"}
    assert doc["input"]["skipped"] == 1 and doc["requests"] == 1005
    rows = {r["segment"]: r for r in doc["attribution"]["rows"]}
    assert rows["compute"]["tail_share"] == pytest.approx(0.95)
    assert [r["name"] for r in doc["sli"]] == ["rag_retrieval", "context_injection", "first_token", "end_to_end"]
    assert doc["sli"][0]["share_within"] is None
    assert doc["bias"]["ratio"] == 0.5 and doc["bias"]["head_p99_ms"] is not None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_window_and_config(traces, tmp_path, capsys):
    conf = tmp_path / "c.yaml"
    conf.write_text("report:\n  windows: [{name: prefill, measure: 'stage:prefill', window_ms: 25}]\n")
    assert cli.main(["report", str(traces), "--last", "1s", "--config", str(conf), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # the newest ends at 10.5 s (a slow one started at 9.5 s): those ending from 9.5 s on are
    # the 59 fast ones started from 9.4 s and the slow ones started at 8.5 s and 9.5 s
    assert doc["requests"] == 61 and doc["window"]["seconds"] == 1.0
    assert doc["sli"] == [{"name": "prefill", "measure": "stage:prefill", "how": "child spans 'prefill', summed",
                           "window_ms": 25.0, "requests": 61, "within": 0, "share_within": 0.0,
                           "p99_ms": pytest.approx(30), "p99_met": False}]


@pytest.mark.parametrize("argv, message", [
    (["report"], "give a TRACES_FILE or --agent URL"),
    (["report", "x.jsonl", "--agent", "http://a:1"], "give a TRACES_FILE or --agent URL"),
    (["report", "x.jsonl", "--sample-ratio", "0"], "--sample-ratio: expected a number 0 < RATIO <= 1"),
    (["report", "x.jsonl", "--last", "5m", "--since", "0"], "--last: use it alone"),
    (["report", "x.jsonl", "--since", "10", "--until", "5"], "is not before --until"),
    (["report", "x.jsonl", "--last", "soon"], "--last: expected a positive duration"),
])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sitsprobe: ") and message in err and err.count("\n") == 1


class _Agent(BaseHTTPRequestHandler):
    store: Recent
    asked: list

    def do_GET(self):
        url = urlparse(self.path)
        self.asked.append(self.path)
        if url.path != "/report/requests.json":
            self.send_error(404)
            return
        window = parse_qs(url.query).get("window_s")
        body = self.store.to_json(float(window[0]) if window else None)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_cli_reads_a_running_agent(capsys):
    store = Recent()
    for i in range(300):
        store.add(genai(i, trace_id=f"{i + 1:032x}", finish_reasons=("stop",) if i % 100 else ("content_filter",)))
    handler = type("Handler", (_Agent,), {"store": store, "asked": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert cli.main(["report", "--agent", url, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["requests"] == 300 and doc["validity"]["valid"] == 297
        assert doc["source"] == url
        assert cli.main(["report", "--agent", url, "--last", "10s"]) == 0
        assert "101 requests" in capsys.readouterr().out  # those that ended in the last 10 s
        assert handler.asked[-1] == "/report/requests.json?window_s=10"
        assert cli.main(["report", "--agent", url + "/nothing"]) == 2
        assert "HTTP 404; is the agent older than this command?" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
    assert cli.main(["report", "--agent", url]) == 2
    assert f"cannot reach the agent at {url}" in capsys.readouterr().err
