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
import os
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags,
                                 TraceState)

from sitsprobe import __version__
from sitsprobe.clock import WallClock
from sitsprobe.containers import container_of
from sitsprobe.errors import ConfigError
from sitsprobe.request import Request

from .semconv import span_attributes, span_kind, span_name

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http/protobuf")


class TraceExporter:
    """Exports each :class:`Request` as one SERVER span.

    ``endpoint``/``protocol`` fall back to the standard ``OTEL_EXPORTER_OTLP_*``
    variables; with no endpoint from either, no network exporter is made.
    ``sinks`` lists the exporters in use; with none, :meth:`export` does nothing.
    Sampling is the SDK's (``OTEL_TRACES_SAMPLER``, by default parent-based:
    a caller's traceparent that is not sampled means no span).
    A span that finds its process's queue full (``queue_size`` spans waiting)
    is dropped and counted in :attr:`dropped_by_queue`.
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
        network = _network_exporter(endpoint or None, _resolve_protocol(protocol), headers)
        file = OtlpJsonFileExporter(traces_file) if traces_file else None
        self.sinks: tuple[SpanExporter, ...] = tuple(s for s in (network, file) if s is not None)
        self._host = socket.gethostname()
        self._processes: dict[tuple[int, str], _Process] = {}
        self._dropped_by_closed = 0
        self._lock = threading.Lock()

    @property
    def dropped_by_queue(self) -> int:
        with self._lock:
            live = sum(b.dropped for p in self._processes.values() for b in p.batches)
            return self._dropped_by_closed + live

    def export(self, req: Request) -> None:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(_remote_parent(req)))
        with self._lock:
            if not self.sinks:
                return
            span = self._process(req.pid, req.comm).tracer.start_span(
                span_name(req),
                context=parent,
                kind=span_kind(req),
                attributes=span_attributes(req),
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
        """Flush and release what a process that exited held (its queues, threads)."""
        with self._lock:
            gone = [self._processes.pop(k) for k in list(self._processes) if k[0] == pid]
            self._dropped_by_closed += sum(b.dropped for p in gone for b in p.batches)
        for p in gone:
            p.provider.shutdown()

    def shutdown(self) -> None:
        """Flush every queue, then close the sinks; later exports are ignored."""
        with self._lock:
            sinks, self.sinks = self.sinks, ()
            pids = {pid for pid, _ in self._processes}
        for pid in pids:
            self.close_process(pid)
        for sink in sinks:
            sink.shutdown()

    def _process(self, pid: int, comm: str) -> _Process:
        key = (pid, comm)
        if key not in self._processes:
            provider = TracerProvider(resource=self._resource(pid, comm), shutdown_on_exit=False)
            batches = [_BoundedBatch(sink, self._queue_size) for sink in self.sinks]
            for batch in batches:
                provider.add_span_processor(batch)
            tracer = provider.get_tracer("sitsprobe", __version__)
            self._processes[key] = _Process(provider, tracer, batches)
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


def _resolve_protocol(arg: str | None) -> str:
    """``arg``, else the standard variables, else grpc (the Python SDK's default)."""
    if arg:
        return _checked_protocol(arg, "traces", "otlp_protocol")
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        if value := os.environ.get(var):
            return _checked_protocol(value, "environment", var)
    return "grpc"


def _checked_protocol(value: str, source: str, key: str) -> str:
    if value not in PROTOCOLS:
        raise ConfigError(source, key, " or ".join(PROTOCOLS), value)
    return value


def _network_exporter(
    endpoint: str | None, protocol: str, headers: Mapping[str, str] | None
) -> SpanExporter | None:
    """The OTLP exporter for ``endpoint``; None if it and the environment name none."""
    env = os.environ
    if not (endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    headers = {k.lower(): v for k, v in headers.items()} if headers else None
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = True if endpoint and endpoint.startswith("http://") else None
        return OTLPSpanExporter(endpoint=endpoint, insecure=insecure, headers=headers)

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint and not urlsplit(endpoint).path.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
    return OTLPSpanExporter(endpoint=endpoint, headers=headers)


@dataclass
class _Process:
    provider: TracerProvider
    tracer: trace.Tracer
    batches: list[_BoundedBatch]


class _Lane(SpanExporter):
    """One batch queue's way into a shared sink; counts the spans taken off the queue."""

    def __init__(self, sink: SpanExporter) -> None:
        self.sink = sink
        self.taken = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
        return self.sink.export(spans)

    def shutdown(self) -> None:
        """The sink is shared: TraceExporter.shutdown closes it, once."""


class _BoundedBatch(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans its full queue turns away.

    It admits a span only while fewer than ``queue_size`` wait, so the SDK's
    own queue never overflows (the SDK would drop silently, logging each one).
    """

    def __init__(self, sink: SpanExporter, queue_size: int) -> None:
        self._lane = _Lane(sink)
        super().__init__(self._lane, max_queue_size=queue_size, max_export_batch_size=min(512, queue_size))
        self._queue_size = queue_size
        self.queued = 0
        self.dropped = 0

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if self.queued - self._lane.taken >= self._queue_size:
            self.dropped += 1
            return
        self.queued += 1
        super().on_end(span)


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
