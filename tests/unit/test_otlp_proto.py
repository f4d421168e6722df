"""sitsprobe.export.otlp_spans: requests as OTLP protobuf spans, checked against
what the OpenTelemetry SDK path made of the same requests (the golden file).

``fixtures/otlp_sdk_golden.json`` was recorded from the SDK path (TracerProvider,
BatchSpanProcessor, OtlpJsonFileExporter; commit 5193f36) for the requests of
:func:`cases`, with the clock, host name, environment and container below: per
case, the OTLP/JSON lines its file sink wrote.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import socket
import threading
import time
from http import HTTPStatus
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace import sampling
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceState

from sitsprobe import __version__
from sitsprobe.clock import WallClock
from sitsprobe.export import otlp, otlp_settings, otlp_spans
from sitsprobe.export.otlp import TraceExporter
from sitsprobe.export.otlp_spans import (
    HAS_IS_REMOTE,
    IS_REMOTE,
    SpanData,
    SpanResource,
    encode,
    otlp_json,
    otlp_json_line,
    protobuf_json,
)
from sitsprobe.request import CacheLookup, Endpoint, GenAI, GpuUse, Inference, Request, Stage, TraceParent
from sitsprobe.stitch.join import Span, Trace
from tests.otlp_receiver import GrpcOtlpReceiver, HttpOtlpReceiver
from tests.unit.test_otlp_export import EVERY_VALUE, MORE_VALUES

OFFSET_NS = 1_700_000_000_000_000_000
HOST = "node-7"
ENV = {"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test,k8s.namespace.name=serving"}
PID, COMM = 4242, "engine"
POD = "1f2e3d4c-5b6a-4789-8abc-def012345678"
CID = "ab" * 32
CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331
MS = 1_000_000
T0 = 5_000 * MS


def clock() -> WallClock:
    c = WallClock()
    c.offset_ns = OFFSET_NS
    return c


def write_proc(proc) -> None:
    """A /proc where PID runs in a Kubernetes pod's containerd container."""
    (proc / str(PID)).mkdir(parents=True)
    (proc / str(PID) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")


def http_request(**kw) -> Request:
    fields = dict(
        pid=PID, comm=COMM, fd=17, start_ns=T0, end_ns=T0 + 250 * MS, first_out_ns=T0 + 100 * MS,
        bytes_in=310, bytes_out=1200, local=Endpoint("10.0.0.5", 8000), peer=Endpoint("10.0.0.9", 51234),
        method="POST", target="/v1/completions?stream=false", path="/v1/completions",
        route="/v1/completions", status=200, user_agent="curl/8.5.0",
        segments=(1 * MS, 2 * MS, 200 * MS, 40 * MS, 7 * MS),
    )
    fields.update(kw)
    return Request(**fields)


DECODE_STEPS = 30


def inference_request() -> Request:
    """A chat request an engine served: queue, prefill, 30 batched decode steps,
    detokenize; GPU attributes on prefill and the decode steps; two cache look-ups."""
    t = T0 + 2 * MS
    stages = [Stage("queue", t, t + 3 * MS), Stage("prefill", t + 3 * MS, t + 20 * MS)]
    t += 20 * MS
    for i in range(DECODE_STEPS):  # the batch grows, then shrinks; a gap of 0.1 ms between steps
        stages.append(Stage("decode", t, t + 2 * MS, batch_id=100 + i, batch_size=2 + min(i, 29 - i) // 5))
        t += 2 * MS + MS // 10
    stages.append(Stage("detokenize", t, t + MS // 2))
    on_gpu = ({}, {"sitsprobe.gpu.index": 0, "sitsprobe.gpu.busy_percent": 61.5,
                   "sitsprobe.gpu.busy_signal": "gpm_sm_util", "sitsprobe.gpu.memory_used_bytes": 40 << 30})
    on_gpu += tuple({"sitsprobe.gpu.index": [0, 1], "sitsprobe.gpu.busy_percent": 30.0 + i / 4,
                     "sitsprobe.gpu.busy_signal": "utilization_rates"} for i in range(DECODE_STEPS))
    on_gpu += ({},)
    inf = Inference(request_id=7, model="tiny-gpt", start_ns=T0 + MS, end_ns=t + MS,
                    stages=tuple(stages),
                    cache=(CacheLookup("prefix", "3f2a", True, T0 + 4 * MS),
                           CacheLookup("completion", "9c01", False, T0 + 5 * MS)),
                    input_tokens=103, output_tokens=DECODE_STEPS + 1, kv_bytes=1 << 20)
    genai = GenAI(source="markers", operation="chat", request_model="tiny-gpt", response_model="tiny-gpt",
                  finish_reasons=("stop",), input_tokens=103, output_tokens=DECODE_STEPS + 1,
                  usage_source="markers", first_token_ns=T0 + 22 * MS, last_token_ns=t, answer_empty=False)
    return http_request(start_ns=T0, end_ns=t + 2 * MS, first_out_ns=T0 + 23 * MS,
                        target="/v1/chat/completions", path="/v1/chat/completions", route="/v1/chat/completions",
                        inference=inf, genai=genai,
                        gpu=GpuUse({"sitsprobe.cuda.launches": 412.5, "sitsprobe.cuda.copy_bytes": 65536,
                                    "sitsprobe.cuda.attribution": "process_share"}, on_gpu),
                        traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 1), tracestate="vendor=v1,other=x")


def client_request() -> Request:
    return http_request(direction="client", fd=23, method="GET", target="/v1/models", path="/v1/models",
                        route=None, user_agent="python-httpx/0.27", local=Endpoint("10.0.0.5", 40112),
                        peer=Endpoint("10.0.0.20", 8080), start_ns=T0 + 5 * MS, end_ns=T0 + 9 * MS,
                        first_out_ns=T0 + 8 * MS, segments=None)


TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def cases() -> dict[str, Trace | Request]:
    """What each case exports: a Trace through export_trace, a Request through export."""
    return {
        # a plain HTTP server request whose caller sent a traceparent: our span id is random
        "http_traceparent": http_request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 1),
                                         tracestate="congo=t61rcWkgMzE"),
        # the joiner's root, under its caller's traceparent (and tracestate), with engine children
        "inference": Trace([Span(inference_request(), CALLER_TRACE, 0x1111111111111111)]),
        # a client request the joiner placed under a server span found by the connection
        "client_via_connection": Trace([Span(client_request(), TRACE, 0x2222222222222222,
                                             parent_id=0x3333333333333333, via="connection")]),
        # a joined trace: a root and its outgoing call, found by the thread that made it
        "joined_by_thread": Trace([Span(http_request(), TRACE, 0x4444444444444444),
                                   Span(client_request(), TRACE, 0x5555555555555555,
                                        parent_id=0x4444444444444444, via="thread")]),
        # an error, with no caller: random trace and span ids
        "error": http_request(status=503, end_ns=T0 + 30 * MS, bytes_out=90),
        "incomplete": http_request(status=None, complete=False, first_out_ns=None, end_ns=T0, bytes_out=0),
    }


GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "otlp_sdk_golden.json").read_text())
# ids the cases choose; any other id in the golden file was drawn at random
CHOSEN = {f"{i:032x}" for i in (CALLER_TRACE, TRACE)} | {
    f"{i:016x}" for i in (CALLER_SPAN, 0x1111111111111111, 0x2222222222222222, 0x3333333333333333,
                          0x4444444444444444, 0x5555555555555555)}


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path):
    """The golden file's environment: host name, OTEL_RESOURCE_ATTRIBUTES, a containerised PID."""
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    write_proc(tmp_path / "proc")


class Collect(SpanExporter):
    """A sink that keeps every batch it is given."""

    def __init__(self) -> None:
        self.batches: list[list[SpanData]] = []

    @property
    def spans(self) -> list[SpanData]:
        return [s for b in self.batches for s in b]

    def export(self, spans) -> SpanExportResult:
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def exported(what: Trace | Request, proc) -> list[SpanData]:
    """The spans TraceExporter makes of a case."""
    exporter = TraceExporter(clock=clock(), proc=str(proc))
    sink = Collect()
    exporter.sinks = (sink,)
    if isinstance(what, Trace):
        exporter.export_trace(what)
    else:
        exporter.export(what)
    exporter.shutdown()
    return sink.spans


def spans_of(doc: dict) -> list[tuple[dict, dict, dict]]:
    """(resource, scope, span) for every span of an OTLP/JSON request, in order."""
    return [(rs["resource"], ss["scope"], span) for rs in doc.get("resourceSpans", ())
            for ss in rs["scopeSpans"] for span in ss["spans"]]


class Ids:
    """Ids compared: a chosen one must be equal; one drawn at random in the
    golden file must be matched by one drawn here, the same one wherever it recurs."""

    def __init__(self) -> None:
        self.drawn: dict[str, str] = {}

    def same(self, old: str | None, new: str | None) -> bool:
        if old is None or old in CHOSEN:
            return new == old
        return new not in CHOSEN and self.drawn.setdefault(old, new) == new and len(new) == len(old)


def assert_like_golden(name: str, doc: dict, in_order: bool = False) -> None:
    """``doc`` (one OTLP/JSON request) says field by field what the SDK path's lines
    said; ``in_order``: with each span's fields in the same order too."""
    old = [x for line in GOLDEN[name] for x in spans_of(line)]
    new = spans_of(doc)
    assert [s["name"] for _, _, s in new] == [s["name"] for _, _, s in old]
    ids, instances = Ids(), {}
    for (old_res, old_scope, old_span), (new_res, new_scope, new_span) in zip(old, new):
        assert new_scope == old_scope == {"name": "sitsprobe", "version": __version__}
        old_attrs, new_attrs = ({a["key"]: a["value"] for a in r["attributes"]} for r in (old_res, new_res))
        # a random instance per process (a UUID), the same for every span of it
        old_attrs.pop("service.instance.id")
        instance = new_attrs.pop("service.instance.id")["stringValue"]
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", instance)
        assert instances.setdefault(new_attrs["process.pid"]["intValue"], instance) == instance
        # the SDK's version, as Resource.create has it: the one installed
        old_attrs["telemetry.sdk.version"] = {"stringValue": sdk_version}
        assert list(new_attrs) == list(old_attrs) and new_attrs == old_attrs
        assert (list(new_span) if in_order else set(new_span)) == (list(old_span) if in_order else set(old_span))
        for key in ("traceId", "spanId", "parentSpanId"):
            assert ids.same(old_span.get(key), new_span.get(key)), (new_span["name"], key)
        for key in set(old_span) - {"traceId", "spanId", "parentSpanId"}:
            assert new_span[key] == old_span[key], (new_span["name"], key)


@pytest.mark.parametrize("name", list(cases()))
def test_spans_are_what_the_sdk_made_of_the_same_requests(name, tmp_path):
    spans = exported(cases()[name], tmp_path / "proc")
    request = encode(spans)
    assert_like_golden(name, protobuf_json(request))  # the protobuf messages, field by field
    assert_like_golden(name, otlp_json(spans), in_order=True)  # the file sink's line
    assert otlp_json(spans) == protobuf_json(request)


def test_each_decode_step_is_a_span_of_its_own(tmp_path):
    """One span per engine stage, repeated decode steps included: their times,
    batches and GPU readings are the steps' own."""
    req = inference_request()
    spans = exported(Trace([Span(req, CALLER_TRACE, 0x1111111111111111)]), tmp_path / "proc")
    decodes = [s for s in spans if s.name == "decode"]
    steps = [st for st in req.inference.stages if st.name == "decode"]
    assert len(decodes) == len(steps) == DECODE_STEPS
    assert [(s.start_ns, s.end_ns) for s in decodes] == [(st.start_ns + OFFSET_NS, st.end_ns + OFFSET_NS)
                                                         for st in steps]
    assert [s.attributes["sitsprobe.batch.id"] for s in decodes] == [st.batch_id for st in steps]
    assert decodes[3].attributes["sitsprobe.gpu.busy_percent"] == 30.75
    assert len({s.span_id for s in spans}) == len(spans) == len(req.inference.stages) + 2 + 1


def test_the_file_sink_writes_the_golden_lines(tmp_path):
    """What the SDK path wrote for a trace of chosen ids, but for the resource's random instance."""
    path = tmp_path / "t.jsonl"
    exporter = TraceExporter(clock=clock(), traces_file=str(path), proc=str(tmp_path / "proc"))
    exporter.export_trace(cases()["joined_by_thread"])
    exporter.shutdown()
    [line] = path.read_text().splitlines()
    doc = json.loads(line)
    [golden] = GOLDEN["joined_by_thread"]
    for rs, old in zip(doc["resourceSpans"], golden["resourceSpans"]):
        rs["resource"] = old["resource"]  # its service.instance.id
    compact = (",", ":")  # the SDK path's lines were json.dumps with these
    assert line == json.dumps(json.loads(line), separators=compact)
    assert json.dumps(doc, separators=compact) == json.dumps(golden, separators=compact)  # in its order too


def test_each_batch_reports_what_it_cost(tmp_path):
    """The sampler's CPU budget hears what the sink's thread spent on a batch."""
    costs: list[float] = []
    exporter = TraceExporter(clock=clock(), traces_file=str(tmp_path / "t.jsonl"), proc=str(tmp_path / "proc"),
                             on_cost=costs.append)
    exporter.export_trace(cases()["joined_by_thread"])
    exporter.shutdown()
    assert len(costs) == 1 and 0 < costs[0] < 1


@pytest.mark.parametrize("protocol, receiver", [("grpc", GrpcOtlpReceiver), ("http/protobuf", HttpOtlpReceiver)])
def test_the_network_gets_one_resource_per_process_and_the_same_spans(tmp_path, monkeypatch, protocol, receiver):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    with receiver() as rx:
        path = tmp_path / "t.jsonl"
        exporter = TraceExporter(clock=clock(), endpoint=rx.endpoint, protocol=protocol, traces_file=str(path),
                                 proc=str(tmp_path / "proc"), headers={"X-Tenant": "t1"})
        exporter.export_trace(cases()["inference"])
        exporter.export(http_request(pid=7, comm="sglang"))
        exporter.shutdown()
        rx.wait_for(DECODE_STEPS + 7)
    [request] = rx.requests
    assert rx.headers[0]["x-tenant"] == "t1"
    assert [len(rs.scope_spans[0].spans) for rs in request.resource_spans] == [DECODE_STEPS + 6, 1]
    [line] = path.read_text().splitlines()
    assert protobuf_json(request) == json.loads(line)  # what went over the wire is what the file says


def test_a_lone_span_waits_for_its_batch_as_long_as_the_send_delay_says(tmp_path):
    """traces.export_delay_ms: a span that no batch fills goes out within it,
    not within the default second (SEND_DELAY_S) either way."""
    sent = {}
    for delay in (0.05, 30):
        exporter = TraceExporter(clock=clock(), proc=str(tmp_path / "proc"), send_delay_s=delay)
        exporter.sinks = (sink := Collect(),)
        exporter.export(http_request())
        deadline = time.monotonic() + otlp.SEND_DELAY_S + 0.5
        while not sink.batches and time.monotonic() < deadline:
            time.sleep(0.01)
        sent[delay] = [len(b) for b in sink.batches]
        exporter.shutdown()
    assert sent == {0.05: [1], 30: []}


def test_a_batch_holds_512_spans_at_most_and_goes_without_a_flush(tmp_path):
    exporter = TraceExporter(clock=clock(), proc=str(tmp_path / "proc"), queue_size=4096, send_delay_s=0.05)
    sink = Collect()
    exporter.sinks = (sink,)
    exporter.export(http_request())  # alone: the timer sends it (not the default second: a test's wait)
    deadline = time.monotonic() + 3
    while not sink.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [len(b) for b in sink.batches] == [1]
    for _ in range(20):  # 20 requests of 36 spans: a request may straddle two batches
        exporter.export_trace(cases()["inference"])
    assert exporter.force_flush()
    sizes = [len(b) for b in sink.batches[1:]]
    assert sum(sizes) == 20 * (DECODE_STEPS + 6) and max(sizes) == otlp.MAX_BATCH
    exporter.shutdown()
    c = exporter.accounting()["otlp"]
    assert (c.offered, c.delivered, c.pending) == (1 + 20 * (DECODE_STEPS + 6),) * 2 + (0,)


# --- sampling: the SDK's samplers, by OTEL_TRACES_SAMPLER -----------------------------

def sampled(monkeypatch, tmp_path, sampler: str, arg: str | None, *what) -> list[str]:
    """Which of ``what`` (requests, traces) became spans, by their span ids."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    exporter = TraceExporter(clock=clock(), proc=str(tmp_path / "proc"))
    sink = Collect()
    exporter.sinks = (sink,)
    for w in what:
        exporter.export_trace(w) if isinstance(w, Trace) else exporter.export(w)
    exporter.shutdown()
    return [f"{s.span_id:x}" for s in sink.spans]


LOW, HIGH = 0x0000000000000000_1000000000000000, 0x0000000000000000_F000000000000000  # below and above half


def test_samplers_from_the_environment(monkeypatch, tmp_path):
    root = lambda trace_id, span_id, flags=1: Trace([Span(http_request(), trace_id, span_id)], flags=flags)
    unsampled_caller = http_request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 0))
    sampled_caller = Trace([Span(http_request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 1)),
                                 CALLER_TRACE, 0xC)])
    local_unsampled = Trace([Span(http_request(), TRACE, 0xD, parent_id=0xE, via="thread")], flags=0)
    everything = (root(LOW, 0xA), root(HIGH, 0xB), unsampled_caller, sampled_caller, local_unsampled)
    assert sampled(monkeypatch, tmp_path, "parentbased_always_on", None, *everything) == ["a", "b", "c"]
    every = sampled(monkeypatch, tmp_path, "always_on", None, *everything)  # the unsampled caller's too
    assert len(every) == 5 and [every[i] for i in (0, 1, 3, 4)] == ["a", "b", "c", "d"]
    assert sampled(monkeypatch, tmp_path, "always_off", None, *everything) == []
    assert sampled(monkeypatch, tmp_path, "parentbased_always_off", None, *everything) == ["c"]
    assert TraceIdRatioBased(0.5).bound > LOW and TraceIdRatioBased(0.5).bound < HIGH
    assert sampled(monkeypatch, tmp_path, "traceidratio", "0.5", root(LOW, 0xA), root(HIGH, 0xB)) == ["a"]
    assert sampled(monkeypatch, tmp_path, "parentbased_traceidratio", "0.5", *everything) == ["a", "c"]


@pytest.mark.parametrize("name", ["parentbased_always_on", "always_on"])
def test_the_default_samplers_decide_as_the_sdks_own(monkeypatch, tmp_path, name):
    """parentbased_always_on and always_on are decided without the SDK's
    sampler call; the same sampler, as an object of its own, goes through
    that call. Both give the same spans, ids and trace states."""
    def spans(sampler):
        random.seed(7)  # the ids of requests exported alone are drawn
        exporter = TraceExporter(clock=clock(), proc=str(tmp_path / "proc"))
        if sampler is not None:
            exporter._sampler = sampler
        exporter.sinks = (sink := Collect(),)
        for w in what:
            exporter.export_trace(w) if isinstance(w, Trace) else exporter.export(w)
        exporter.shutdown()
        return [(s.trace_id, s.span_id, s.parent_id, s.flags, s.trace_state) for s in sink.spans]

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
    states = ("vendor=v1,other=x", None)
    what = [*cases().values(),
            *(Trace([Span(http_request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, flags),
                                       tracestate=state), CALLER_TRACE, 0xC0 + flags)])
              for flags in (0, 1) for state in states)]
    fast = spans(None)
    assert TraceExporter(clock=clock(), proc=str(tmp_path / "proc"))._sampler is \
        {"parentbased_always_on": sampling.DEFAULT_ON, "always_on": sampling.ALWAYS_ON}[name]
    own = sampling.ParentBased(sampling.StaticSampler(sampling.Decision.RECORD_AND_SAMPLE)) \
        if name == "parentbased_always_on" else sampling.StaticSampler(sampling.Decision.RECORD_AND_SAMPLE)
    assert fast == spans(own)
    assert ("vendor=v1,other=x" in {s[4] for s in fast}) and len(fast) > len(what)


def test_an_unsampled_request_takes_its_children_with_it(monkeypatch, tmp_path):
    inference = Trace([Span(inference_request()._replace(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 0)),
                            CALLER_TRACE, 0x1111111111111111)])
    assert sampled(monkeypatch, tmp_path, "parentbased_always_on", None, inference) == []


# --- the two encoders agree, and agree with the SDK's, on every attribute value -------

def test_every_attribute_value_encodes_alike(caplog):
    values = {**EVERY_VALUE, **MORE_VALUES, "too.big": 2**64, "gpus": [0, 1], "float.big": 1e300,
              "float.negative_zero": -0.0, "str.escapes": 'a "quote", \\ \n\t\x00\u2028 ☃ 𝄞'}
    resources = [SpanResource(Resource.create({"service.name": n, "tags": ["a", "b"]})) for n in ("a", "b")]
    spans = [SpanData(resources[i % 2], 1 << 100 | i, i + 1, 0 if i % 3 else 7, 0x100, "k=v" if i else "",
                      f"span {i}", 1 + i % 5, OFFSET_NS + i, OFFSET_NS + 2 * i, values if i < 2 else {}, i == 1)
             for i in range(6)]
    doc, line = otlp_json(spans), otlp_json_line(spans)
    assert doc == protobuf_json(encode(spans))
    assert line == json.dumps(doc, separators=(",", ":"), allow_nan=False)  # json.dumps's text: strict, one line
    # grouped by resource in order of first appearance, one scope each
    assert [[s["name"] for s in ss["spans"]] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]] == [
        ["span 0", "span 2", "span 4"], ["span 1", "span 3", "span 5"]]
    [first] = [s for _, _, s in spans_of(doc) if s["name"] == "span 0"]
    attrs = {a["key"]: a["value"] for a in first["attributes"]}
    assert "too.big" not in attrs and "cannot encode attribute too.big" in caplog.text
    assert attrs["float.nan"] == {"doubleValue": "NaN"} and attrs["int.enum"] == {"intValue": "200"}
    # and as the SDK's own encoder has them
    sdk = ReadableSpan("span 0", context=SpanContext(1, 2, False), kind=SpanKind.INTERNAL, attributes=values,
                       resource=Resource.create({}), start_time=1, end_time=2)
    assert attrs == {a["key"]: a["value"] for _, _, s in spans_of(otlp_json([sdk])) for a in s["attributes"]}
    assert otlp_json([]) == {} and encode([]).ByteSize() == 0


def test_the_wire_bytes_are_what_the_sdks_encoder_makes_of_the_same_spans(caplog):
    """encode() writes protobuf's wire bytes by hand and keeps the KeyValues of
    recurring strings and integers: random spans, whose keys come back with
    other values and other types (True after 1, "1" after 1), must give what
    the SDK's own encoder gives, byte for byte once serialised."""
    rng = random.Random(13)
    keys = ["k", "http.route", "server.port", "x" * 200, "naïve ☃", "\ud800"]
    values = ["", "1", "GET", "/v1/chat/completions", "é" * 70, "a\x00b", "\udcff", 0, 1, -1, 127, 128, 300,
              2**31, 2**63 - 1, -(2**63), 2**63, True, False, 0.0, -0.0, 1.5, 1e300, math.nan, math.inf,
              HTTPStatus.OK, b"\x00\xff", [1, "a", 2.5], (), {"m": [True]}, None]
    resources = [Resource.create({"service.name": n, "process.pid": i}) for i, n in enumerate(("a", "b", "c"))]
    wrapped = {id(r): SpanResource(r) for r in resources}
    ours, sdks = [], []
    for i in range(600):
        resource = rng.choice(resources)
        attrs = {rng.choice(keys): rng.choice(values) for _ in range(rng.randrange(12))}
        trace_id, span_id = rng.getrandbits(128) or 1, rng.getrandbits(64) or 1
        parent = rng.choice([None, SpanContext(trace_id, rng.getrandbits(64) or 1, is_remote=rng.random() < 0.5)])
        state = rng.choice(["", "k=v", "vendor=" + "x" * 200])
        name = rng.choice(["GET /", "", "decode", "ü" * 100])
        kind = rng.choice(list(SpanKind))
        start = OFFSET_NS + rng.getrandbits(40)
        end = start + rng.choice([0, 1, 2**40])
        error = rng.random() < 0.3
        flags = HAS_IS_REMOTE | (IS_REMOTE if parent is not None and parent.is_remote else 0)
        ours.append(SpanData(wrapped[id(resource)], trace_id, span_id, parent.span_id if parent else 0, flags,
                             state, name, kind.value + 1, start, end, attrs, error))
        context = SpanContext(trace_id, span_id, False, trace_state=TraceState.from_header([state]))
        sdks.append(ReadableSpan(name, context=context, parent=parent, kind=kind, attributes=attrs,
                                 resource=resource, start_time=start, end_time=end,
                                 status=Status(StatusCode.ERROR if error else StatusCode.UNSET),
                                 instrumentation_scope=InstrumentationScope(*otlp_spans.SCOPE)))
    for first in range(0, len(ours), 100):  # batches: the kept KeyValues outlive each
        mine, theirs = encode(ours[first:first + 100]), encode_spans(sdks[first:first + 100])
        assert mine.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True), (
            protobuf_json(mine), protobuf_json(theirs))
    assert "cannot encode attribute" in caplog.text  # the lone surrogates, 2**63


def test_an_sdk_exporter_of_another_shape_is_refused_at_start(monkeypatch):
    class Elsewhere(SpanExporter):
        def export(self, spans):  # no encode_spans here: sitsprobe's hand-off would be lost
            return SpanExportResult.SUCCESS

    monkeypatch.setattr(otlp_settings, "span_exporter", lambda s: Elsewhere())
    with pytest.raises(RuntimeError, match="no longer calls encode_spans"):
        TraceExporter(clock=clock(), endpoint="http://127.0.0.1:1", protocol="http/protobuf")


def test_export_never_waits_for_a_sink(tmp_path):
    hold = threading.Event()

    class Stuck(Collect):
        def export(self, spans):
            hold.wait()
            return super().export(spans)

    exporter = TraceExporter(clock=clock(), proc=str(tmp_path / "proc"), queue_size=64)
    exporter.sinks = (Stuck(),)
    t0 = time.monotonic()
    for _ in range(100):
        exporter.export_trace(cases()["inference"])
    assert time.monotonic() - t0 < 2.0
    hold.set()
    exporter.shutdown()
    c = exporter.accounting()["otlp"]
    assert c.offered == 100 * (DECODE_STEPS + 6) and c.pending == 0
    assert c.delivered == 64 and c.queue_full == c.offered - 64  # queued or in flight: 64 at most
