"""What turning a request into spans costs the agent: the OpenTelemetry SDK path
it had beside the path it has (sitsprobe.export.otlp), per exported span.

Reproduce (no root, no network):

    .venv/bin/python bench/bench_spans.py                 # best of 7 runs, about 20 s
    .venv/bin/python bench/bench_spans.py --repeat 9 --requests 4000

Each cell is CPU time (time.process_time: every thread, the caller's and the
sink's) from a stitched Request to encoded bytes, divided by the spans made:

- "SDK path": what export.otlp did before: a TracerProvider per process,
  tracer.start_span/end per span, a BatchSpanProcessor (queue, batches of 512,
  its thread); protobuf by the SDK's encoder (encode_spans), OTLP/JSON by the
  hand encoder the file sink had (the same output). Kept here, as the baseline.
- "now": TraceExporter with SpanData records, each sink encoding its batches
  in its own thread: protobuf by otlp_spans.encode, OTLP/JSON by the real file
  sink (OtlpJsonFileExporter).

"protobuf" stops at the serialised ExportTraceServiceRequest (what the network
sink hands gRPC or HTTP: the transport costs both paths the same); "OTLP/JSON"
writes the lines to a file. Both paths pay semconv.span_attributes, shown on
its own. The requests: a plain HTTP/1.1 server request (27 attributes), and an
inference request of 32 engine stages (queue, prefill, 29 decode steps with
batch and GPU attributes, detokenize) and 2 cache look-ups: 35 spans. The last
rows fold the decode steps into one span with a span event per step (their
times, batch and GPU attributes as event attributes), to show what that would
save; per request, since the span counts differ.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags  # noqa: E402

from sitsprobe import __version__  # noqa: E402
from sitsprobe.clock import WallClock  # noqa: E402
from sitsprobe.export import otlp_spans  # noqa: E402
from sitsprobe.export.otlp import TraceExporter  # noqa: E402
from sitsprobe.export.otlp_spans import OtlpJsonFileExporter, encode  # noqa: E402
from sitsprobe.export.semconv import (  # noqa: E402
    cache_attributes,
    span_attributes,
    span_kind,
    span_name,
    stage_attributes,
)
from sitsprobe.request import (  # noqa: E402
    CacheLookup,
    Endpoint,
    GenAI,
    GpuUse,
    Inference,
    Request,
    Stage,
    TraceParent,
)

MS = 1_000_000
T0 = 5_000 * MS
DECODE_STEPS = 29
NAMES = {"protobuf": "protobuf", "json": "OTLP/JSON"}


def http_request(**kw) -> Request:
    fields = dict(
        pid=4242, comm="engine", fd=17, start_ns=T0, end_ns=T0 + 250 * MS, first_out_ns=T0 + 100 * MS,
        bytes_in=310, bytes_out=1200, local=Endpoint("10.0.0.5", 8000), peer=Endpoint("10.0.0.9", 51234),
        method="POST", target="/v1/completions?stream=false", path="/v1/completions",
        route="/v1/completions", status=200, user_agent="curl/8.5.0",
        traceparent=TraceParent(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1),
        segments=(1 * MS, 2 * MS, 200 * MS, 40 * MS, 7 * MS),
    )
    fields.update(kw)
    return Request(**fields)


def inference_request() -> Request:
    t = T0 + 2 * MS
    stages = [Stage("queue", t, t + 3 * MS), Stage("prefill", t + 3 * MS, t + 20 * MS)]
    t += 20 * MS
    for i in range(DECODE_STEPS):
        stages.append(Stage("decode", t, t + 2 * MS, batch_id=100 + i, batch_size=4))
        t += 2 * MS + MS // 10
    stages.append(Stage("detokenize", t, t + MS // 2))
    gpu = {"sitsprobe.gpu.index": 0, "sitsprobe.gpu.busy_percent": 61.5, "sitsprobe.gpu.busy_signal": "gpm_sm_util",
           "sitsprobe.gpu.memory_used_bytes": 40 << 30}
    on_gpu = ({}, gpu) + tuple(dict(gpu, **{"sitsprobe.gpu.busy_percent": 30.0 + i}) for i in range(DECODE_STEPS))
    inf = Inference(request_id=7, model="tiny-gpt", start_ns=T0 + MS, end_ns=t + MS, stages=tuple(stages),
                    cache=(CacheLookup("prefix", "3f2a", True, T0 + 4 * MS),
                           CacheLookup("completion", "9c01", False, T0 + 5 * MS)),
                    input_tokens=103, output_tokens=DECODE_STEPS + 1, kv_bytes=1 << 20)
    genai = GenAI(source="markers", operation="chat", request_model="tiny-gpt", response_model="tiny-gpt",
                  finish_reasons=("stop",), input_tokens=103, output_tokens=DECODE_STEPS + 1,
                  usage_source="markers", first_token_ns=T0 + 22 * MS, last_token_ns=t, answer_empty=False)
    return http_request(end_ns=t + 2 * MS, first_out_ns=T0 + 23 * MS, target="/v1/chat/completions",
                        path="/v1/chat/completions", route="/v1/chat/completions", inference=inf, genai=genai,
                        gpu=GpuUse({"sitsprobe.cuda.launches": 412.5, "sitsprobe.cuda.copy_bytes": 65536,
                                    "sitsprobe.cuda.attribution": "process_share"}, on_gpu))


def folded(req: Request) -> tuple[Request, list[tuple[Stage, dict]]]:
    """``req`` with its decode steps (consecutive) as one stage, and the steps with
    their GPU attributes, that would become that span's events."""
    inf, on_gpu = req.inference, req.gpu.stages
    at = [i for i, st in enumerate(inf.stages) if st.name == "decode"]
    first, end = at[0], at[-1] + 1
    steps = [(inf.stages[i], on_gpu[i]) for i in at]
    one = Stage("decode", steps[0][0].start_ns, steps[-1][0].end_ns)
    return req._replace(inference=replace(inf, stages=inf.stages[:first] + (one,) + inf.stages[end:]),
                        gpu=replace(req.gpu, stages=on_gpu[:first] + ({},) + on_gpu[end:])), steps


def step_attributes(st: Stage, gpu: dict) -> dict:
    return {"sitsprobe.batch.id": st.batch_id, "sitsprobe.batch.size": st.batch_size, **gpu}


# -- the SDK path, as export.otlp had it ----------------------------------------------

class SdkPath:
    """TraceExporter.export of before: a TracerProvider per process, a span per
    request and per stage and cache look-up, a BatchSpanProcessor per sink."""

    def __init__(self, clock: WallClock, sink: SpanExporter, resource) -> None:
        self._clock = clock
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(sink, max_queue_size=1 << 20, max_export_batch_size=512))
        self.tracer = self.provider.get_tracer("sitsprobe", __version__)

    def export(self, req: Request) -> None:
        tp = req.traceparent
        ctx = SpanContext(tp.trace_id, tp.span_id, is_remote=True, trace_flags=TraceFlags(tp.flags))
        parent = trace.set_span_in_context(trace.NonRecordingSpan(ctx))
        wall = self._clock.to_wall_ns
        span = self.tracer.start_span(span_name(req), context=parent, kind=span_kind(req),
                                      attributes=span_attributes(req), start_time=wall(req.start_ns))
        if req.is_error:
            span.set_status(Status(StatusCode.ERROR))
        if req.inference is not None:
            child_ctx = trace.set_span_in_context(span)
            for st, attrs in zip(req.inference.stages, stage_attributes(req)):
                self.tracer.start_span(st.name, context=child_ctx, kind=SpanKind.INTERNAL, attributes=attrs,
                                       start_time=wall(st.start_ns)).end(wall(st.end_ns))
            for c in req.inference.cache:
                self.tracer.start_span(f"cache_get {c.cache}", context=child_ctx, kind=SpanKind.INTERNAL,
                                       attributes=cache_attributes(c),
                                       start_time=wall(c.ts_ns)).end(wall(c.ts_ns))
        span.end(wall(req.end_ns))

    def flush(self) -> None:
        self.provider.force_flush()


def sdk_otlp_json(spans) -> dict:
    """The file sink's hand encoder of SDK spans, as it was (for these spans: one
    resource and scope, no events or links)."""
    out = []
    for s in spans:
        ctx, parent = s.context, s.parent
        d = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
        if ctx.trace_state:
            d["traceState"] = ctx.trace_state.to_header()
        if parent is not None:
            d["parentSpanId"] = f"{parent.span_id:016x}"
        d["flags"] = 0x300 if parent is not None and parent.is_remote else 0x100
        d["name"] = s.name
        d["kind"] = s.kind.value + 1
        d["startTimeUnixNano"], d["endTimeUnixNano"] = str(s.start_time), str(s.end_time)
        if s.attributes:
            d["attributes"] = [{"key": k, "value": otlp_spans._value(v)} for k, v in s.attributes.items()]
        d["status"] = {"code": s.status.status_code.value} if s.status.status_code.value else {}
        out.append(d)
    resource = {"attributes": [{"key": k, "value": otlp_spans._value(v)} for k, v in spans[0].resource.attributes.items()]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [
        {"scope": {"name": "sitsprobe", "version": __version__}, "spans": out}]}]}


# -- the sinks: encode, write, nothing else ---------------------------------------------

class Encode(SpanExporter):
    """Encodes each batch with ``fn``; with ``path``, writes the text to that file."""

    def __init__(self, fn, path: Path | None = None) -> None:
        self.fn = fn
        self.file = open(path, "w") if path is not None else None

    def export(self, spans) -> SpanExportResult:
        out = self.fn(spans)
        if self.file is not None:
            self.file.write(out)
            self.file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self.file is not None:
            self.file.close()


def with_events(request, steps, wall):
    """The folded decode span of every request in a batch (protobuf) given its steps as
    events, written as otlp_spans writes a span's fields: Span.events (11) of Event
    time_unix_nano (1), name (2), attributes (3)."""
    for rs in request.resource_spans:
        for m in rs.scope_spans[0].spans:
            if m.name == "decode":
                m.MergeFromString(b"".join(otlp_spans._field(b"\x5a", b"".join((
                    b"\x09", otlp_spans._pack_fixed64(wall(st.start_ns)), b"\x12\x06decode",
                    otlp_spans._repeated(b"\x1a", otlp_spans._key_values(step_attributes(st, gpu))))))
                    for st, gpu in steps))
    return request


def line_with_events(spans, steps, wall) -> str:
    """otlp_json_line of a batch (of one process), the folded decode spans given their steps as events."""
    texts = []
    for s in spans:
        text = otlp_spans._span_json(s)
        if s.name == "decode":
            events = ",".join(f'{{"timeUnixNano":"{wall(st.start_ns)}","name":"decode","attributes":['
                              f'{otlp_spans._attributes_json(step_attributes(st, gpu))}]}}' for st, gpu in steps)
            at = text.rindex(',"status":')
            text = f'{text[:at]},"events":[{events}]{text[at:]}'
        texts.append(text)
    return (f'{{"resourceSpans":[{{"resource":{spans[0].resource.json},"scopeSpans":[{{"scope":'
            f'{otlp_spans._SCOPE_JSON},"spans":[{",".join(texts)}]}}]}}]}}\n')


def line(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":")) + "\n"


def sink(path: str, encoding: str, clock: WallClock, tmp: Path, steps) -> SpanExporter:
    """What each path's sink does to a batch: encode it (and write it, for the file)."""
    wall = clock.to_wall_ns
    if path == "sdk":
        if encoding == "protobuf":
            return Encode(lambda spans: encode_spans(spans).SerializePartialToString())
        return Encode(lambda spans: line(sdk_otlp_json(spans)), tmp / "sdk.jsonl")
    if steps:  # the folded request: its decode span gets the steps as events
        if encoding == "protobuf":
            return Encode(lambda spans: with_events(encode(spans), steps, wall).SerializePartialToString())
        return Encode(lambda spans: line_with_events(spans, steps, wall), tmp / "now.jsonl")
    if encoding == "protobuf":
        return Encode(lambda spans: encode(spans).SerializePartialToString())
    return OtlpJsonFileExporter(str(tmp / "now.jsonl"))


def run(path: str, encoding: str, req: Request, n: int, tmp: Path, steps=None) -> tuple[float, int]:
    """CPU µs per span, and spans per request, for n copies of req through one path."""
    clock = WallClock()
    if path == "sdk":
        resource = TraceExporter(clock=clock)._resource(req.pid, req.comm)
        exporter = SdkPath(clock, sink(path, encoding, clock, tmp, steps), resource)
        export, flush, close = exporter.export, exporter.flush, exporter.provider.shutdown
    else:
        exporter = TraceExporter(clock=clock, queue_size=1 << 20)
        exporter.sinks = (sink(path, encoding, clock, tmp, steps),)
        export, flush, close = exporter.export, exporter.force_flush, exporter.shutdown
    export(req)
    flush()  # the provider, the resource, the threads: made before the clock starts
    t0 = time.process_time()
    for _ in range(n):
        export(req)
    flush()
    cpu = time.process_time() - t0
    close()
    spans = 1 + (len(req.inference.stages) + len(req.inference.cache) if req.inference is not None else 0)
    return cpu / (n * spans) * 1e6, spans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="plain HTTP requests per run (inference: a tenth)")
    ap.add_argument("--repeat", type=int, default=7, help="runs per cell; the best is shown")
    args = ap.parse_args()
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[key]
    http, inference = http_request(), inference_request()
    folded_req, steps = folded(inference)
    print(f"# {' '.join(sys.argv)}  (python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")
    n = args.requests
    t0 = time.process_time()
    for _ in range(n):
        span_attributes(http)
    print(f"semconv.span_attributes alone: {(time.process_time() - t0) / n * 1e6:.1f} µs per HTTP request, "
          "in both paths' numbers below")
    print("\nCPU µs per exported span (best of %d)" % args.repeat)
    print(f"{'request':<34}{'spans':>6}  {'encoding':<10}{'SDK path':>10}{'now':>9}{'faster':>8}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        per_request = {}
        for label, req, count in (("plain HTTP server request", http, n), ("inference, 32 stages", inference, n // 10)):
            for encoding in ("protobuf", "json"):
                runs = {"sdk": [], "now": []}
                for _ in range(args.repeat):  # the paths take turns: a noisy machine's drift hits both
                    for path in runs:
                        runs[path].append(run(path, encoding, req, count, tmp))
                (sdk, spans), (now, _) = min(runs["sdk"]), min(runs["now"])
                print(f"{label:<34}{spans:>6}  {NAMES[encoding]:<10}{sdk:>10.1f}{now:>9.1f}{sdk / now:>7.1f}×")
                if req is inference:
                    per_request[encoding] = now * spans
        print(f"\nDecode steps folded into one span with {DECODE_STEPS} events: CPU µs per inference request (now)")
        for encoding in ("protobuf", "json"):
            us, spans = min(run("now", encoding, folded_req, n // 10, tmp, steps) for _ in range(args.repeat))
            print(f"  {NAMES[encoding]:<10} a span per step ({spans + DECODE_STEPS - 1} spans) "
                  f"{per_request[encoding]:5.0f}   folded ({spans} spans) {us * spans:5.0f}   "
                  f"saves {1 - us * spans / per_request[encoding]:4.0%}")

if __name__ == "__main__":
    main()
