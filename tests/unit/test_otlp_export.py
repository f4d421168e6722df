"""sitsprobe.export.otlp: requests as OTLP server spans, through real receivers and a file."""
from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
import time
from http import HTTPStatus

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

from sitsprobe.clock import WallClock
from sitsprobe.errors import ConfigError
from sitsprobe.export.otlp import OtlpJsonFileExporter, TraceExporter, otlp_json
from sitsprobe.export.otlp_spans import encode, protobuf_json
from sitsprobe.request import Endpoint, Request, TraceParent
from tests.otlp_receiver import GrpcOtlpReceiver, HttpOtlpReceiver, attributes

OFFSET_NS = 1_700_000_000_000_000_000
CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def clock():
    c = WallClock()
    c.offset_ns = OFFSET_NS
    return c


def request(**kw) -> Request:
    fields = dict(
        pid=4242, comm="vllm", fd=17,
        start_ns=5_000_000_000, end_ns=5_250_000_000, first_out_ns=5_100_000_000,
        bytes_in=310, bytes_out=1200,
        local=Endpoint("10.0.0.5", 8000), peer=Endpoint("10.0.0.9", 51234),
        method="POST", target="/v1/completions?stream=false", path="/v1/completions",
        route="/v1/completions", status=200, user_agent="curl/8.5.0",
    )
    fields.update(kw)
    return Request(**fields)


def export_all(exporter: TraceExporter, *reqs: Request) -> None:
    for r in reqs:
        exporter.export(r)
    exporter.shutdown()


def file_spans(path) -> list[tuple[dict, dict]]:
    """(resource attributes, span) for every span in an OTLP/JSON lines file,
    in the lines written whole so far (the sink's thread may be mid-line)."""
    out = []
    text = path.read_text()
    for line in text[:text.rfind("\n") + 1].splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            out += [(res, span) for ss in rs["scopeSpans"] for span in ss["spans"]]
    return out


@pytest.mark.parametrize("protocol, receiver", [("grpc", GrpcOtlpReceiver), ("http/protobuf", HttpOtlpReceiver)])
def test_span_reaches_a_real_receiver(clock, protocol, receiver):
    req = request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 1))
    with receiver() as rx:
        exporter = TraceExporter(clock=clock, endpoint=rx.endpoint, protocol=protocol, headers={"X-Tenant": "t1"})
        export_all(exporter, req)
        [(resource, span)] = rx.wait_for(1)
    assert rx.headers[0]["x-tenant"] == "t1"

    assert span.name == "POST /v1/completions"
    assert span.kind == Span.SPAN_KIND_SERVER
    assert span.start_time_unix_nano == req.start_ns + OFFSET_NS
    assert span.end_time_unix_nano == req.end_ns + OFFSET_NS
    assert span.trace_id == CALLER_TRACE.to_bytes(16, "big")
    assert span.parent_span_id == CALLER_SPAN.to_bytes(8, "big")
    assert span.span_id not in (b"", CALLER_SPAN.to_bytes(8, "big"))
    assert span.status.code == Status.STATUS_CODE_UNSET
    assert attributes(span.attributes) == {
        "http.request.method": "POST",
        "url.path": "/v1/completions",
        "url.query": "stream=false",
        "url.scheme": "http",
        "http.route": "/v1/completions",
        "http.response.status_code": 200,
        "server.address": "10.0.0.5",
        "server.port": 8000,
        "client.address": "10.0.0.9",
        "client.port": 51234,
        "network.peer.address": "10.0.0.9",
        "network.peer.port": 51234,
        "network.protocol.name": "http",
        "network.protocol.version": "1.1",
        "network.transport": "tcp",
        "user_agent.original": "curl/8.5.0",
        "http.request.size": 310,
        "http.response.size": 1200,
        "process.pid": 4242,
        "sitsprobe.fd": 17,
        "sitsprobe.time_to_first_byte_s": pytest.approx(0.1),
        "sitsprobe.complete": True,
    }
    assert resource["service.name"] == "vllm"
    assert resource["process.pid"] == 4242
    assert resource["process.executable.name"] == "vllm"
    assert resource["telemetry.distro.name"] == "sitsprobe"
    assert resource["host.name"]


def test_endpoint_and_protocol_from_the_environment(clock, monkeypatch):
    with HttpOtlpReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)  # the SDK appends /v1/traces
        export_all(TraceExporter(clock=clock), request())
        assert len(rx.wait_for(1)) == 1


def test_grpc_is_the_default_protocol(clock, monkeypatch):
    with GrpcOtlpReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rx.endpoint)
        export_all(TraceExporter(clock=clock), request())
        assert len(rx.wait_for(1)) == 1


def test_an_unsampled_caller_means_no_span(clock, tmp_path):
    path = tmp_path / "t.jsonl"
    unsampled = TraceParent(CALLER_TRACE, CALLER_SPAN, flags=0)
    export_all(TraceExporter(clock=clock, traces_file=str(path)), request(traceparent=unsampled))
    assert path.read_text() == ""


def test_no_endpoint_means_no_network_exporter(clock, tmp_path):
    assert TraceExporter(clock=clock).sinks == ()
    exporter = TraceExporter(clock=clock, traces_file=str(tmp_path / "t.jsonl"))
    assert [type(s) for s in exporter.sinks] == [OtlpJsonFileExporter]
    exporter.shutdown()


@pytest.mark.parametrize("arg, env", [("http/json", None), (None, "zipkin")])
def test_unknown_protocol_is_a_config_error(clock, monkeypatch, arg, env):
    if env:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env)
    with pytest.raises(ConfigError, match="grpc or http/protobuf"):
        TraceExporter(clock=clock, endpoint="http://127.0.0.1:1", protocol=arg)


def test_file_lines_are_otlp_json(clock, tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text("")  # appends to what is there
    exporter = TraceExporter(clock=clock, traces_file=str(path))
    exporter.export(request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 1)))
    assert exporter.force_flush()
    exporter.export(request(pid=7, comm="sglang"))  # no traceparent: a new root
    export_all(exporter)

    assert len(path.read_text().splitlines()) == 2  # one line per export call
    (res1, joined), (res2, root) = file_spans(path)
    assert joined["traceId"] == f"{CALLER_TRACE:032x}"
    assert joined["parentSpanId"] == f"{CALLER_SPAN:016x}"
    assert re.fullmatch(r"[0-9a-f]{16}", joined["spanId"])
    assert joined["kind"] == 2 and joined["name"] == "POST /v1/completions"
    assert int(joined["startTimeUnixNano"]) == 5_000_000_000 + OFFSET_NS
    attrs = {a["key"]: a["value"] for a in joined["attributes"]}
    assert attrs["http.response.status_code"] == {"intValue": "200"}
    assert attrs["sitsprobe.complete"] == {"boolValue": True}
    assert re.fullmatch(r"[0-9a-f]{32}", root["traceId"]) and root["traceId"] != joined["traceId"]
    assert "parentSpanId" not in root
    assert res1["service.name"] == {"stringValue": "vllm"}
    assert res2["service.name"] == {"stringValue": "sglang"}
    assert res2["process.pid"] == {"intValue": "7"}


def test_service_name_and_resource_attributes_from_the_environment(clock, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "inference")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=prod,host.name=node-7")
    path = tmp_path / "t.jsonl"
    export_all(TraceExporter(clock=clock, traces_file=str(path)), request())
    [(resource, _)] = file_spans(path)
    assert resource["service.name"] == {"stringValue": "inference"}
    assert resource["deployment.environment.name"] == {"stringValue": "prod"}
    assert resource["host.name"] == {"stringValue": "node-7"}
    assert resource["process.executable.name"] == {"stringValue": "vllm"}


def test_errors_and_other_shapes(clock, tmp_path):
    path = tmp_path / "t.jsonl"
    export_all(
        TraceExporter(clock=clock, traces_file=str(path)),
        request(status=503),
        request(status=404),
        request(status=None, complete=False, first_out_ns=None, end_ns=5_000_000_000),
        request(method="PURGE", route=None, target="/cache?sig=abc&x=1", path="/cache"),
        request(protocol="unknown", method=None, target=None, path=None, route=None, status=None, user_agent=None),
        request(transport=None, local=None, peer=None),
    )
    spans = [s for _, s in file_spans(path)]
    attrs = [{a["key"]: next(iter(a["value"].values())) for a in s["attributes"]} for s in spans]
    e503, e404, cut, purge, tcp, unix = zip(spans, attrs)

    assert e503[0]["status"] == {"code": 2} and e503[1]["error.type"] == "503"
    assert e404[0]["status"] == {} and "error.type" not in e404[1]
    assert cut[0]["status"] == {"code": 2} and cut[1]["error.type"] == "incomplete"
    assert cut[1]["sitsprobe.complete"] is False
    assert "http.response.status_code" not in cut[1] and "sitsprobe.time_to_first_byte_s" not in cut[1]

    assert purge[0]["name"] == "HTTP /cache"
    assert purge[1]["http.request.method"] == "_OTHER"
    assert purge[1]["http.request.method_original"] == "PURGE"
    assert purge[1]["url.query"] == "sig=abc&x=1"  # as given: enrich() redacts before export
    assert "http.route" not in purge[1]

    assert tcp[0]["name"] == "vllm unknown exchange"
    assert tcp[1]["sitsprobe.protocol"] == "unknown"
    assert tcp[1]["sitsprobe.bytes_in"] == "310"
    assert not any(k.startswith(("http.", "url.", "user_agent.")) for k in tcp[1])
    assert tcp[1]["network.transport"] == "tcp"

    assert unix[1]["http.request.method"] == "POST"  # an HTTP request over a Unix socket:
    assert not any(k.startswith(("network.transport", "network.peer", "server.", "client."))
                   for k in unix[1])  # no claim of TCP, no addresses


def test_http_endpoint_given_in_full_is_kept(clock):
    with HttpOtlpReceiver() as rx:
        exporter = TraceExporter(clock=clock, endpoint=rx.endpoint + "/v1/traces", protocol="http/protobuf")
        export_all(exporter, request())
        assert len(rx.wait_for(1)) == 1


def test_a_full_queue_drops_and_counts(clock, tmp_path, monkeypatch):
    release = threading.Event()
    write = OtlpJsonFileExporter.export

    def blocked_write(self, spans):
        release.wait()
        return write(self, spans)

    monkeypatch.setattr(OtlpJsonFileExporter, "export", blocked_write)
    path = tmp_path / "t.jsonl"
    exporter = TraceExporter(clock=clock, traces_file=str(path), queue_size=8)
    for _ in range(100):
        exporter.export(request())
    dropped = exporter.accounting()["file"].queue_full
    assert dropped >= 100 - 16  # at most one batch taken off the queue, one queue waiting
    release.set()
    exporter.shutdown()
    c = exporter.accounting()["file"]
    assert (c.offered, c.queue_full, c.pending, c.shutdown) == (100, dropped, 0, 0)
    assert len(file_spans(path)) == c.delivered == 100 - dropped


class Sink(SpanExporter):
    """A sink that answers as told: success, failure, raise, or never (a blackhole)."""

    def __init__(self, answer):
        self.answer, self.got = answer, 0
        self.hold = threading.Event()

    def export(self, spans):
        self.got += len(spans)
        if self.answer == "never":
            self.hold.wait()
        if self.answer == "raise":
            raise ConnectionError("collector gone")
        return SpanExportResult.SUCCESS if self.answer == "ok" else SpanExportResult.FAILURE

    def shutdown(self):
        if self.answer == "never":
            self.hold.wait()


@pytest.mark.parametrize("answer, reason", [("ok", None), ("fail", "export_failed"),
                                            ("raise", "export_error")])
def test_every_span_is_delivered_or_dropped_with_its_reason(clock, answer, reason):
    exporter = TraceExporter(clock=clock)
    exporter.sinks = (Sink(answer),)
    for pid in (1, 1, 2):
        exporter.export(request(pid=pid))
    exporter.close_process(2)  # an exited process's spans are still accounted for
    exporter.shutdown()
    (name, c), = exporter.accounting().items()
    assert (name, c.offered, c.pending) == ("otlp", 3, 0)
    assert c.delivered == (3 if reason is None else 0)
    assert {r: getattr(c, r) for r in c.REASONS if getattr(c, r)} == ({} if reason is None else {reason: 3})


def test_a_blackhole_collector_cannot_hold_up_the_stop(clock):
    exporter = TraceExporter(clock=clock)
    sink = exporter.sinks = (Sink("never"),)
    for pid in (1, 2, 3):
        exporter.export(request(pid=pid))
    t0 = time.monotonic()
    exporter.shutdown(deadline=t0 + 0.5)
    took = time.monotonic() - t0
    assert took < 2.0, took  # the bound, not the collector, decides
    c = exporter.accounting()["otlp"]
    assert (c.offered, c.delivered, c.shutdown, c.pending) == (3, 0, 3, 0)
    sink[0].hold.set()  # the collector answers at last: nothing is counted twice
    time.sleep(0.2)
    assert exporter.accounting()["otlp"].shutdown == 3 and exporter.accounting()["otlp"].delivered == 0


def test_close_process_sends_its_spans_and_export_after_shutdown_is_ignored(clock, tmp_path):
    path = tmp_path / "t.jsonl"
    exporter = TraceExporter(clock=clock, traces_file=str(path))
    exporter.export(request(pid=1))
    exporter.export(request(pid=2))
    exporter.close_process(1)  # never waits: the agent's loop never waits for a collector
    deadline = time.monotonic() + 5
    while not file_spans(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    # one queue per sink: the exited process's span goes now, with whatever else was queued
    assert sorted(res["process.pid"]["intValue"] for res, _ in file_spans(path)) == ["1", "2"]
    exporter.export(request(pid=1))  # a new process with the exited one's pid: a resource of its own
    exporter.shutdown()
    first, _, again = (res for res, _ in file_spans(path))
    assert first["process.pid"] == again["process.pid"]
    assert first["service.instance.id"] != again["service.instance.id"]
    exporter.export(request(pid=3))
    assert len(file_spans(path)) == 3


# --- otlp_json of SDK spans (as tests and tools make them): what it always was ---------------


class Collect(SpanExporter):
    def __init__(self) -> None:
        self.spans: list = []

    def export(self, spans) -> SpanExportResult:
        self.spans += spans
        return SpanExportResult.SUCCESS


EVERY_VALUE = {
    "str": "text",
    "str.empty": "",
    "str.unicode": "naïve ☃",
    "int": 42,
    "int.zero": 0,
    "int.negative": -7,
    "int.max": 2**63 - 1,
    "int.min": -(2**63),
    "float": 1.5,
    "float.zero": 0.0,
    "float.integral": 3.0,
    "float.tiny": 5e-324,
    "float.nan": math.nan,
    "float.inf": math.inf,
    "float.-inf": -math.inf,
    "bool.true": True,
    "bool.false": False,
    "list.str": ["a", "", "c"],
    "list.int": [1, -2, 2**63 - 1],
    "list.float": [0.5, math.inf],
    "list.bool": [True, False],
    "list.empty": [],
    "tuple.int": (3, 4),
}
# Kinds this SDK's attributes also hold (newer SDKs: bytes, None, mappings, mixed lists).
MORE_VALUES = {
    "bytes": b"\x00\xffid",
    "bytes.empty": b"",
    "none": None,
    "map": {"a": 1, "b": ["x", 2.5], "c": {"d": True}},
    "map.empty": {},
    "list.mixed": [1, "two", 3.0, None, b"\x01"],
    "list.nested": [[1, 2], []],
    "int.enum": HTTPStatus.OK,
}


def varied_spans() -> list[ReadableSpan]:
    """Spans of every shape the encoders must agree on, across resources and scopes."""
    sink = Collect()

    def provider(resource: Resource, **limits) -> TracerProvider:
        p = TracerProvider(resource=resource, span_limits=SpanLimits(**limits), shutdown_on_exit=False)
        p.add_span_processor(SimpleSpanProcessor(sink))
        return p

    vllm = provider(Resource.create({"service.name": "vllm", "process.pid": 4242, "tags": ["a", "b"]}))
    sglang = provider(Resource({"service.name": "sglang"}, schema_url="https://opentelemetry.io/schemas/1.26.0"))
    tight = provider(Resource({"service.name": "tight"}), max_attributes=2, max_events=1, max_links=1,
                     max_event_attributes=1, max_link_attributes=1)
    bare = provider(Resource({}))
    scopes = [
        vllm.get_tracer("sitsprobe", "1.2.3"),
        vllm.get_tracer("other", None, schema_url="https://example.com/schema"),
        vllm.get_tracer("scoped", "0.1", attributes={"scope.attr": 1, "scope.list": [True]}),
        sglang.get_tracer("sitsprobe", "1.2.3"),
        tight.get_tracer(""),
        bare.get_tracer("bare"),
    ]
    sitsprobe, other, scoped, sg, tight_tracer, bare_tracer = scopes

    remote = SpanContext(CALLER_TRACE, CALLER_SPAN, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "v1"), ("other", "x")]))
    local_link = SpanContext(0x1, 0x2, is_remote=False, trace_flags=TraceFlags(1))
    remote_ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))

    t = OFFSET_NS
    root = sitsprobe.start_span("root", kind=SpanKind.SERVER, attributes=EVERY_VALUE, start_time=t)
    child = sitsprobe.start_span("child", context=trace.set_span_in_context(root), kind=SpanKind.CLIENT,
                                 start_time=t + 1)
    child.set_status(StatusCode.ERROR, "upstream timed out")
    child.end(t + 2)
    root.set_status(StatusCode.ERROR)
    root.end(t + 3)

    joined = other.start_span("joined", context=remote_ctx, kind=SpanKind.PRODUCER, start_time=t + 4,
                              links=[trace.Link(local_link, {"link.kind": "follows", "link.n": [1, 2]}),
                                     trace.Link(remote)])
    joined.add_event("first", {"e.str": "x", "e.float": 2.5, "e.list": ["a"]}, timestamp=t + 5)
    joined.add_event("bare", timestamp=t + 6)
    joined.set_status(StatusCode.OK)
    joined.end(t + 7)

    s = scoped.start_span("", kind=SpanKind.CONSUMER, attributes=MORE_VALUES, start_time=t + 8)
    s.set_attribute("too.big", 2**64)  # protobuf's int64 cannot hold it: both encoders leave it out
    s.end(t + 9)

    sg.start_span("sglang internal", start_time=t + 10).end(t + 11)
    # Interleaved with the resources before it, so that grouping keeps first-appearance order.
    sitsprobe.start_span("late", kind=SpanKind.SERVER, start_time=t + 12).end(t + 13)

    crowded = tight_tracer.start_span(
        "crowded", context=remote_ctx, attributes={"a": 1, "b": 2, "c": 3, "d": 4}, start_time=t + 14,
        links=[Link(remote), Link(local_link, {"x": 1, "y": 2})],  # the SDK keeps the newest
    )
    crowded.add_event("pushed out", timestamp=t + 15)
    crowded.add_event("kept", {"p": 1, "q": 2}, timestamp=t + 16)
    crowded.end(t + 17)

    bare_tracer.start_span("bare", start_time=t + 18).end(t + 19)

    spans = list(sink.spans)
    # An equal Resource that is another object, and a span with no scope at all.
    twin = Resource.create({"service.name": "vllm", "process.pid": 4242, "tags": ["a", "b"]})
    spans.append(ReadableSpan("twin", context=spans[0].context, resource=twin, attributes={"k": "v"},
                              start_time=t + 20, end_time=t + 21,
                              instrumentation_scope=spans[0].instrumentation_scope))
    spans.append(ReadableSpan("unscoped", context=spans[0].context, parent=spans[0].context,
                              resource=bare.resource, start_time=0, end_time=None))
    return spans


def test_otlp_json_of_sdk_spans_for_every_shape():
    doc = otlp_json(varied_spans())  # the SDK's own encoding, through protobuf's JSON mapping
    # The shapes are all there: the twin resource joins the first, "unscoped" has a scope of its own.
    groups = [[[s.get("name", "") for s in ss["spans"]] for ss in rs["scopeSpans"]] for rs in doc["resourceSpans"]]
    assert groups == [
        [["child", "root", "late", "twin"], ["joined"], [""]],
        [["sglang internal"]],
        [["crowded"]],
        [["bare"], ["unscoped"]],
    ]
    assert doc["resourceSpans"][3] == {
        "resource": {},
        "scopeSpans": [
            {"scope": {"name": "bare"}, "spans": [doc["resourceSpans"][3]["scopeSpans"][0]["spans"][0]]},
            {"scope": {}, "spans": [{"traceId": doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"],
                                     "spanId": doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"],
                                     "parentSpanId": doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"],
                                     "flags": 0x100, "name": "unscoped", "kind": 1, "status": {}}]},
        ],
    }
    encoded = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    by_name = {s.get("name", ""): s for s in encoded}
    assert by_name["child"]["status"] == {"code": 2, "message": "upstream timed out"}
    assert by_name["root"]["status"] == {"code": 2} and "parentSpanId" not in by_name["root"]
    assert by_name["child"]["parentSpanId"] == by_name["root"]["spanId"]
    assert by_name["child"]["flags"] == 0x100
    assert by_name["joined"]["flags"] == 0x300 and by_name["joined"]["traceState"] == "vendor=v1,other=x"
    assert by_name["joined"]["links"][1] == {"traceId": f"{CALLER_TRACE:032x}", "spanId": f"{CALLER_SPAN:016x}",
                                             "flags": 0x300}
    assert by_name["joined"]["events"][0]["timeUnixNano"] == str(OFFSET_NS + 5)
    assert by_name["crowded"]["droppedAttributesCount"] == 2
    assert by_name["crowded"]["droppedEventsCount"] == 1 and by_name["crowded"]["droppedLinksCount"] == 1
    assert by_name["crowded"]["events"][0]["droppedAttributesCount"] == 1
    assert by_name["crowded"]["links"][0]["droppedAttributesCount"] == 1
    root_attrs = {a["key"]: a["value"] for a in by_name["root"]["attributes"]}
    assert root_attrs["int.max"] == {"intValue": str(2**63 - 1)}
    assert root_attrs["float.nan"] == {"doubleValue": "NaN"}
    assert root_attrs["list.empty"] == {"arrayValue": {}}
    assert "too.big" not in {a["key"] for a in by_name[""]["attributes"]}


def test_otlp_json_is_strict_json_and_one_line():
    spans = varied_spans()
    text = json.dumps(otlp_json(spans), separators=(",", ":"), allow_nan=False)
    assert "\n" not in text
    assert json.loads(text) == protobuf_json(encode_spans(spans))


def test_otlp_json_equals_the_protobuf_encoding_for_exported_requests(clock):
    """The file sink's JSON and the network's protobuf, built apart, say the same."""
    sink = Collect()
    exporter = TraceExporter(clock=clock, queue_size=64)
    exporter.sinks = (sink,)
    export_all(
        exporter,
        request(traceparent=TraceParent(CALLER_TRACE, CALLER_SPAN, 1)),
        request(pid=7, comm="sglang", status=503),
        request(protocol="unknown", method=None, target=None, path=None, route=None, status=None, user_agent=None),
        request(pid=7, comm="sglang", complete=False, status=None, first_out_ns=None),
    )
    assert len(sink.spans) == 4
    assert otlp_json(sink.spans) == protobuf_json(encode(sink.spans))
    assert otlp_json([]) == protobuf_json(encode([])) == {}


def test_a_containerised_process_names_its_container_and_pod(clock, tmp_path):
    uid = "1f2e3d4c-5b6a-4789-8abc-def012345678"
    cid = "ab" * 32
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n")
    exporter = TraceExporter(clock=clock, traces_file=str(tmp_path / "t.jsonl"), proc=str(tmp_path / "proc"))
    export_all(exporter, request(), request()._replace(pid=7))
    by_pid = {res["process.pid"]["intValue"]: res for res, _ in file_spans(tmp_path / "t.jsonl")}
    assert by_pid["4242"]["container.id"] == {"stringValue": cid}
    assert by_pid["4242"]["container.runtime"] == {"stringValue": "containerd"}
    assert by_pid["4242"]["k8s.pod.uid"] == {"stringValue": uid}
    assert "container.id" not in by_pid["7"]


def test_agent_resource_is_one_stable_instance_per_node(monkeypatch):
    from sitsprobe.export.otlp import agent_resource

    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    here = agent_resource().attributes
    assert here["service.name"] == "sitsprobe"
    assert here["service.instance.id"] == here["host.name"] == socket.gethostname()
    assert agent_resource().attributes["service.instance.id"] == here["service.instance.id"]
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=gpu-node-7,host.name=gpu-node-7")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "vllm")  # meant for the traced processes' spans
    on_node = agent_resource().attributes
    assert on_node["service.instance.id"] == on_node["host.name"] == "gpu-node-7"
    assert on_node["service.name"] == "sitsprobe"
