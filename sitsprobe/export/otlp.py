"""Requests as OTLP server spans, through the OpenTelemetry SDK.

Each traced process gets its own ``TracerProvider`` (so its spans carry its
own Resource: service name, pid, host) and, per sink, its own bounded batch
queue. The sinks themselves -- one OTLP network exporter, one OTLP/JSON file --
are shared by every process.
"""
from __future__ import annotations

import base64
import json
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from sitsprobe import __version__
from sitsprobe.clock import WallClock
from sitsprobe.containers import container_of
from sitsprobe.request import Request
from sitsprobe.stitch.join import Span, Trace

from . import otlp_settings
from .semconv import span_attributes, span_kind, span_name

log = logging.getLogger(__name__)


class TraceExporter:
    """Exports each :class:`Request` as one SERVER span.

    ``endpoint``/``protocol`` (traces.otlp_endpoint, traces.otlp_protocol) sit
    above the standard ``OTEL_EXPORTER_OTLP_*`` variables, by the rules of
    :mod:`.otlp_settings`; with no endpoint from either, no network exporter is made.
    ``sinks`` lists the exporters in use; with none, :meth:`export` does nothing.
    Sampling is the SDK's (``OTEL_TRACES_SAMPLER``, by default parent-based:
    a caller's traceparent that is not sampled means no span).
    Every span handed to a sink is accounted for (:meth:`accounting`):
    ``offered == delivered + dropped (queue_full, export_failed, export_error,
    shutdown) + pending``, and pending is 0 after a flush or a shutdown.
    """

    def __init__(
        self,
        *,
        clock: WallClock,
        endpoint: str | None = None,
        protocol: str | None = None,
        traces_file: str | None = None,
        headers: Mapping[str, str] | None = None,
        queue_size: int = 2048,
        proc: str = "/proc",
    ) -> None:
        self._clock = clock
        self._proc = proc  # where a traced process's cgroup (its container) is read
        self._queue_size = queue_size
        otlp = otlp_settings.settings("traces", endpoint=endpoint, protocol=protocol, headers=headers)
        network = otlp_settings.span_exporter(otlp) if otlp is not None else None
        file = OtlpJsonFileExporter(traces_file) if traces_file else None
        self.sinks: tuple[SpanExporter, ...] = tuple(s for s in (network, file) if s is not None)
        self._host = socket.gethostname()
        self._processes: dict[tuple[int, str], _Process] = {}
        self._closed: dict[str, Counts] = {sink_name(s): Counts() for s in self.sinks}
        self._closing: list[tuple[threading.Thread, list[_BoundedBatch]]] = []  # exited processes
        self._lock = threading.Lock()

    def accounting(self) -> dict[str, Counts]:
        """Per sink ("otlp", "file"), what became of the spans handed to it,
        the processes that exited included."""
        with self._lock:
            out = {sink_name(s): Counts() for s in self.sinks} | {n: c.copy() for n, c in self._closed.items()}
            batches = [b for p in self._processes.values() for b in p.batches]
            batches += [b for _, closing in self._closing for b in closing]
            for b in batches:
                out.setdefault(b.sink_name, Counts()).add(b.counts())
        return out

    def export_trace(self, t: Trace, enrich: Callable[[Request], Request] = lambda r: r) -> None:
        """Every span of a joined trace (stitch.join), with the ids it was given."""
        t.exported = True
        for s in t.spans:
            self.export(enrich(s.req), s, t.flags)

    def export(self, req: Request, place: Span | None = None, flags: int = 1) -> None:
        """One request as a span; with ``place``, under the ids the joiner gave it."""
        if place is not None and place.parent_id is not None:
            ctx = SpanContext(place.trace_id, place.parent_id, is_remote=place.via == "connection",
                              trace_flags=TraceFlags(flags))
        else:
            ctx = _remote_parent(req)
        parent = trace.set_span_in_context(trace.NonRecordingSpan(ctx))
        attrs = span_attributes(req)
        if place is not None and place.via is not None:
            attrs["sitsprobe.parent.inferred"] = place.via
        with self._lock:
            if not self.sinks:
                return
            p = self._process(req.pid, req.comm)
            if place is not None:
                p.ids.preset(place.trace_id, place.span_id)
            span = p.tracer.start_span(
                span_name(req),
                context=parent,
                kind=span_kind(req),
                attributes=attrs,
                start_time=self._clock.to_wall_ns(req.start_ns),
            )
            if req.is_error:
                span.set_status(Status(StatusCode.ERROR))
            if req.inference is not None:
                self._engine_spans(req, span)
            span.end(self._clock.to_wall_ns(req.end_ns))

    def _engine_spans(self, req: Request, parent) -> None:
        """The engine's stages and cache look-ups, as children of the server span."""
        tracer = self._process(req.pid, req.comm).tracer
        ctx = trace.set_span_in_context(parent)
        wall = self._clock.to_wall_ns
        on_gpu = req.gpu.stages if req.gpu is not None else ()
        for i, st in enumerate(req.inference.stages):
            attrs = {"sitsprobe.stage": st.name}
            if st.batch_id:
                attrs.update({"sitsprobe.batch.id": st.batch_id, "sitsprobe.batch.size": st.batch_size})
            if i < len(on_gpu):
                attrs.update(on_gpu[i])
            child = tracer.start_span(st.name, context=ctx, kind=SpanKind.INTERNAL,
                                      attributes=attrs, start_time=wall(st.start_ns))
            child.end(wall(st.end_ns))
        for c in req.inference.cache:
            child = tracer.start_span(f"cache_get {c.cache}", context=ctx, kind=SpanKind.INTERNAL,
                                      attributes={"sitsprobe.cache.name": c.cache,
                                                  "sitsprobe.cache.key": c.key,
                                                  "sitsprobe.cache.hit": c.hit},
                                      start_time=wall(c.ts_ns))
            child.end(wall(c.ts_ns))

    def force_flush(self, timeout_ms: int = 30_000) -> bool:
        with self._lock:
            processes = list(self._processes.values())
        return all([p.provider.force_flush(timeout_ms) for p in processes])

    def close_process(self, pid: int) -> None:
        """Flush and release what a process that exited held (its queues,
        threads), in the background: a collector that does not answer must
        not hold up the agent. Its counts stay in :meth:`accounting`."""
        with self._lock:
            gone = [self._processes.pop(k) for k in list(self._processes) if k[0] == pid]
            if not gone:
                return
            batches = [b for p in gone for b in p.batches]
            t = threading.Thread(target=self._finish, args=(gone, batches), name=f"otlp-close-{pid}",
                                 daemon=True)
            self._closing.append((t, batches))
        t.start()

    def _finish(self, gone: list[_Process], batches: list[_BoundedBatch]) -> None:
        for p in gone:
            p.provider.shutdown()
        with self._lock:
            self._fold(batches)

    def _fold(self, batches: list[_BoundedBatch]) -> None:
        """Move closed batches' final counts into the totals (lock held)."""
        self._closing = [(t, bs) for t, bs in self._closing if bs is not batches]
        for b in batches:
            self._closed.setdefault(b.sink_name, Counts()).add(b.close())

    def shutdown(self, deadline: float | None = None) -> None:
        """Flush every queue, then close the sinks, by ``deadline``
        (time.monotonic()) at most, None: however long it takes. Spans not
        delivered by then are counted as dropped at shutdown; a sink still
        busy (a collector that accepts and never answers) is left to its
        daemon threads. Later exports are ignored."""
        with self._lock:
            sinks, self.sinks = self.sinks, ()
            pids = {pid for pid, _ in self._processes}
        for pid in pids:
            self.close_process(pid)
        with self._lock:
            closing = list(self._closing)
        for t, _ in closing:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:  # what is still closing past the deadline
            for _, batches in list(self._closing):
                self._fold(batches)
        within(deadline, [sink.shutdown for sink in sinks])

    def _process(self, pid: int, comm: str) -> _Process:
        key = (pid, comm)
        if key not in self._processes:
            ids = _PresetIds()
            provider = TracerProvider(resource=self._resource(pid, comm), shutdown_on_exit=False,
                                      id_generator=ids)
            batches = [_BoundedBatch(sink, sink_name(sink), self._queue_size) for sink in self.sinks]
            for batch in batches:
                provider.add_span_processor(batch)
            tracer = provider.get_tracer("sitsprobe", __version__)
            self._processes[key] = _Process(provider, tracer, batches, ids)
        return self._processes[key]

    def _resource(self, pid: int, comm: str) -> Resource:
        # Resource.create lets these override the environment, so leave out
        # whatever OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES already set.
        from_env = OTELResourceDetector().detect().attributes
        defaults = {
            "service.name": comm,
            "service.instance.id": str(uuid.uuid4()),  # the SDK's default is the agent's own
            "process.pid": pid,
            "process.executable.name": comm,
            "host.name": self._host,
            "telemetry.distro.name": "sitsprobe",
            "telemetry.distro.version": __version__,
        }
        container = container_of(pid, self._proc)
        if container is not None:  # the OpenTelemetry container and k8s conventions
            defaults["container.id"] = container.id
            if container.runtime:
                defaults["container.runtime"] = container.runtime
            if container.pod_uid:
                defaults["k8s.pod.uid"] = container.pod_uid
        return Resource.create({k: v for k, v in defaults.items() if k not in from_env})


def agent_resource() -> Resource:
    """The agent's own resource, for its metrics and alerts: service.name
    "sitsprobe" and one stable instance per node (the node's name where the
    environment gives one, as the Helm chart does), so a restarted agent
    continues its series instead of starting new ones under a random id."""
    from_env = OTELResourceDetector().detect().attributes
    node = from_env.get("k8s.node.name") or from_env.get("host.name") or socket.gethostname()
    defaults = {"service.instance.id": str(node), "host.name": socket.gethostname()}
    return Resource.create({"service.name": "sitsprobe",
                            **{k: v for k, v in defaults.items() if k not in from_env}})


def _remote_parent(req: Request) -> SpanContext:
    """The caller's span from its traceparent; an invalid one (a new root) without."""
    tp = req.traceparent
    if tp is None:
        return trace.INVALID_SPAN_CONTEXT
    state = TraceState.from_header([req.tracestate]) if req.tracestate else None
    return SpanContext(tp.trace_id, tp.span_id, is_remote=True, trace_flags=TraceFlags(tp.flags),
                       trace_state=state)


class _PresetIds(RandomIdGenerator):
    """Random ids, but the next span's as the joiner chose them (a child
    may have gone out first, naming this span as its parent)."""

    def __init__(self) -> None:
        self._trace = self._span = 0

    def preset(self, trace_id: int, span_id: int) -> None:
        self._trace, self._span = trace_id, span_id

    def generate_span_id(self) -> int:  # asked after the trace id, if that was asked at all
        span, self._span, self._trace = self._span, 0, 0
        return span or super().generate_span_id()

    def generate_trace_id(self) -> int:  # asked only for a root
        tid, self._trace = self._trace, 0
        return tid or super().generate_trace_id()


@dataclass
class _Process:
    provider: TracerProvider
    tracer: trace.Tracer
    batches: list[_BoundedBatch]
    ids: _PresetIds


@dataclass
class Counts:
    """What became of the spans offered to one sink."""

    offered: int = 0
    delivered: int = 0
    queue_full: int = 0  # the process's queue held queue_size spans already
    export_failed: int = 0  # the sink answered failure (after the exporter's own retries)
    export_error: int = 0  # the sink raised
    shutdown: int = 0  # still queued or in flight when the agent stopped

    REASONS = ("queue_full", "export_failed", "export_error", "shutdown")

    @property
    def pending(self) -> int:
        return self.offered - self.delivered - sum(getattr(self, r) for r in self.REASONS)

    def add(self, other: Counts) -> None:
        for f in ("offered", "delivered", *self.REASONS):
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def copy(self) -> Counts:
        return replace(self)


class Tally:
    """Counts for one signal's exporter (metric points, log records): what
    was offered, and each export's result. Closed when the agent stops:
    whatever is pending then was dropped at shutdown, and later results of
    exports still in flight are not counted."""

    def __init__(self) -> None:
        self._counts = Counts()
        self._closed = False
        self._lock = threading.Lock()

    def offer(self, n: int) -> None:
        with self._lock:
            if not self._closed:
                self._counts.offered += n

    def result(self, n: int, outcome: str) -> None:
        with self._lock:
            if not self._closed:
                setattr(self._counts, outcome, getattr(self._counts, outcome) + n)

    def counts(self) -> Counts:
        with self._lock:
            return self._counts.copy()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._counts.shutdown = self._counts.pending


def counted(exporter, tally: Tally, size, offer: bool = True):
    """``exporter`` with its export() counting each batch's items (``size(batch)``)
    into ``tally`` by result; with ``offer``, as offered too (else the caller
    offers them, when it hands them over)."""
    inner = exporter.export

    def export(batch, *args, **kwargs):
        n = size(batch)
        if offer:
            tally.offer(n)
        try:
            result = inner(batch, *args, **kwargs)
        except Exception:
            tally.result(n, "export_error")
            raise
        tally.result(n, "delivered" if getattr(result, "name", "") == "SUCCESS" else "export_failed")
        return result

    exporter.export = export
    return exporter


class _Lane(SpanExporter):
    """One batch queue's way into a shared sink: counts what the sink did
    with each batch. Once closed (the agent stopped), later results are not
    counted: those spans were counted as dropped at shutdown."""

    def __init__(self, sink: SpanExporter) -> None:
        self.sink = sink
        self.delivered = self.failed = self.errors = 0
        self.closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.sink.export(spans)
        except Exception as e:  # an exporter's bug must not kill the batch thread
            log.warning("span export raised %s: %s", type(e).__name__, e)
            result = None
        if not self.closed:
            if result == SpanExportResult.SUCCESS:
                self.delivered += len(spans)
            elif result is None:
                self.errors += len(spans)
            else:
                self.failed += len(spans)
        return result or SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """The sink is shared: TraceExporter.shutdown closes it, once."""


class _BoundedBatch(BatchSpanProcessor):
    """A BatchSpanProcessor that counts every span it is given: turned away
    by its full queue, or passed to its sink and what the sink did with it.

    It admits a span only while fewer than ``queue_size`` wait, so the SDK's
    own queue never overflows (the SDK would drop silently, logging each one).
    """

    def __init__(self, sink: SpanExporter, sink_name: str, queue_size: int) -> None:
        self._lane = _Lane(sink)
        super().__init__(self._lane, max_queue_size=queue_size, max_export_batch_size=min(512, queue_size))
        self.sink_name = sink_name
        self._queue_size = queue_size
        self.queued = 0
        self.dropped = 0

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        lane = self._lane
        if self.queued - lane.delivered - lane.failed - lane.errors >= self._queue_size:
            self.dropped += 1
            return
        self.queued += 1
        super().on_end(span)

    def counts(self) -> Counts:
        lane = self._lane
        return Counts(offered=self.queued + self.dropped, delivered=lane.delivered,
                      queue_full=self.dropped, export_failed=lane.failed, export_error=lane.errors)

    def close(self) -> Counts:
        """The final counts, once (then none): whatever is still pending was
        dropped at shutdown."""
        if self._lane.closed:
            return Counts()
        self._lane.closed = True
        c = self.counts()
        c.shutdown = c.pending
        return c


def sink_name(sink: SpanExporter) -> str:
    """The name a trace sink's counts go by: "file" or "otlp"."""
    return "file" if isinstance(sink, OtlpJsonFileExporter) else "otlp"


def within(deadline: float | None, calls: list) -> None:
    """Run ``calls`` one after another in a daemon thread and wait for them
    until ``deadline`` (time.monotonic()), or for ever with None."""
    if not calls:
        return
    t = threading.Thread(target=lambda: [c() for c in calls], name="otlp-shutdown", daemon=True)
    t.start()
    t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


class OtlpJsonFileExporter(SpanExporter):
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per line per export.

    The format of the OpenTelemetry Collector's ``file`` exporter: camelCase
    fields, enums as numbers, trace and span ids as lowercase hex.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(otlp_json(spans), separators=(",", ":")) + "\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                log.warning("cannot write traces to %s: %s", self.path, e)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def otlp_json(spans: Sequence[ReadableSpan]) -> dict:
    """``spans`` as one OTLP/JSON ExportTraceServiceRequest.

    What protobuf's JSON mapping of the SDK's own encoding (``encode_spans``)
    gives, ids aside, built straight from the spans: int64 and fixed64 values
    as decimal strings, enums as numbers, bytes as base64, fields at their
    default left out. Trace and span ids are lowercase hex, as OTLP/JSON wants.
    Spans are grouped by resource, then by scope, in order of first appearance.
    """
    by_resource: dict[Resource, dict[InstrumentationScope | None, list[dict]]] = {}
    # A Resource hashes by serialising its attributes: look each object up once.
    by_id: dict[int, dict[InstrumentationScope | None, list[dict]]] = {}
    for span in spans:
        resource = span.resource
        scopes = by_id.get(id(resource))
        if scopes is None:
            scopes = by_id[id(resource)] = by_resource.setdefault(resource, {})
        scopes.setdefault(span.instrumentation_scope, []).append(_span(span))
    if not by_resource:
        return {}
    return {"resourceSpans": [_resource_spans(r, scopes) for r, scopes in by_resource.items()]}


# SpanFlags: whether the parent (or linked) context's remoteness is known, and is remote.
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200
_KINDS = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _resource_spans(resource: Resource, scopes: Mapping[InstrumentationScope | None, list[dict]]) -> dict:
    out = {
        "resource": _with_attributes({}, resource.attributes),
        "scopeSpans": [_scope_spans(scope, spans) for scope, spans in scopes.items()],
    }
    if resource.schema_url:
        out["schemaUrl"] = resource.schema_url
    return out


def _scope_spans(scope: InstrumentationScope | None, spans: list[dict]) -> dict:
    if scope is None:
        return {"scope": {}, "spans": spans}
    encoded: dict = {}
    if scope.name:
        encoded["name"] = scope.name
    if scope.version:
        encoded["version"] = scope.version
    out = {"scope": _with_attributes(encoded, scope.attributes), "spans": spans}
    if scope.schema_url:
        out["schemaUrl"] = scope.schema_url
    return out


def _span(span: ReadableSpan) -> dict:
    ctx = span.context
    parent = span.parent
    out = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ctx.trace_state.to_header()
    if parent is not None:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    out["flags"] = _flags(parent)
    if span.name:
        out["name"] = span.name
    out["kind"] = _KINDS[span.kind]
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    _with_attributes(out, span.attributes, span.dropped_attributes)
    if events := span.events:
        out["events"] = [_event(e) for e in events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if links := span.links:
        out["links"] = [_link(link) for link in links]
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status: dict = {}
    if code := span.status.status_code.value:
        status["code"] = code
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    return out


def _flags(ctx: SpanContext | None) -> int:
    return _FLAG_HAS_IS_REMOTE | _FLAG_IS_REMOTE if ctx is not None and ctx.is_remote else _FLAG_HAS_IS_REMOTE


def _event(event: Event) -> dict:
    out: dict = {}
    if event.timestamp:
        out["timeUnixNano"] = str(event.timestamp)
    if event.name:
        out["name"] = event.name
    return _with_attributes(out, event.attributes, event.dropped_attributes)


def _link(link: Link) -> dict:
    ctx = link.context
    out = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    _with_attributes(out, link.attributes, link.dropped_attributes)
    out["flags"] = _flags(ctx)
    return out


def _with_attributes(out: dict, attributes: Mapping[str, object] | None, dropped: int = 0) -> dict:
    """``out`` given ``attributes`` and ``droppedAttributesCount``, each only if there are any."""
    if attributes:
        encoded = []
        for key, value in attributes.items():
            try:
                encoded.append({"key": key, "value": _value(value)})
            except (TypeError, ValueError) as e:  # as the SDK's encoder: lose the one attribute
                log.warning("cannot encode attribute %s: %s", key, e)
        if encoded:
            out["attributes"] = encoded
    if dropped:
        out["droppedAttributesCount"] = dropped
    return out


def _value(value: object) -> dict:
    """An attribute value as an OTLP/JSON AnyValue."""
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"int64 out of range: {value}")
        return {"intValue": str(int(value))}
    if isinstance(value, float):
        if not math.isfinite(value):  # JSON has no NaN or infinities: protobuf's names for them
            return {"doubleValue": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
        return {"doubleValue": value}
    if value is None:
        return {}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_value(v) for v in value]} if value else {}}
    if isinstance(value, Mapping):
        kvs = [{"key": str(k), "value": _value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": kvs} if kvs else {}}
    raise TypeError(f"invalid attribute value type {type(value).__name__}: {value!r}")
