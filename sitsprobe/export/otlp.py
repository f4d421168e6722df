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
import os
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from sitsprobe import __version__
from sitsprobe.clock import WallClock
from sitsprobe.errors import ConfigError
from sitsprobe.request import Request

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http/protobuf")
# RFC 9110 methods, PATCH and QUERY: the "known" methods of the HTTP conventions.
KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
# Query parameters whose values the conventions say to redact in url.query.
SECRET_QUERY_KEYS = frozenset({"AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature"})


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
    ) -> None:
        self._clock = clock
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
                kind=SpanKind.SERVER,
                attributes=span_attributes(req),
                start_time=self._clock.to_wall_ns(req.start_ns),
            )
            if req.is_error:
                span.set_status(Status(StatusCode.ERROR))
            span.end(self._clock.to_wall_ns(req.end_ns))

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
        return Resource.create({k: v for k, v in defaults.items() if k not in from_env})


def span_name(req: Request) -> str:
    if req.protocol == "tcp":
        return f"{req.comm} tcp exchange"
    method = req.method if req.method in KNOWN_METHODS else "HTTP"
    return f"{method} {req.route or req.path or 'unknown'}"


def span_attributes(req: Request) -> dict[str, str | int | float | bool]:
    attrs: dict[str, str | int | float | bool | None] = {
        "process.pid": req.pid,
        "sitsprobe.fd": req.fd,
        "sitsprobe.complete": req.complete,
        "network.transport": "tcp",
        "error.type": _error_type(req),
    }
    if req.first_out_ns is not None:
        attrs["sitsprobe.time_to_first_byte_s"] = (req.first_out_ns - req.start_ns) / 1e9
    if req.local is not None:
        attrs["server.address"] = req.local.address
        attrs["server.port"] = req.local.port
    if req.peer is not None:
        attrs["client.address"] = attrs["network.peer.address"] = req.peer.address
        attrs["client.port"] = attrs["network.peer.port"] = req.peer.port
    if req.protocol == "tcp":
        attrs["sitsprobe.bytes_in"] = req.bytes_in
        attrs["sitsprobe.bytes_out"] = req.bytes_out
    else:
        name, _, version = req.protocol.partition("/")
        known = req.method is None or req.method in KNOWN_METHODS
        attrs.update({
            "http.request.method": req.method if known else "_OTHER",
            "http.request.method_original": None if known else req.method,
            "http.route": req.route,
            "http.response.status_code": req.status,
            "http.request.size": req.bytes_in,
            "http.response.size": req.bytes_out,
            "url.scheme": "http",
            "url.path": req.path,
            "url.query": _query(req.target),
            "network.protocol.name": name,
            "network.protocol.version": version or None,
            "user_agent.original": req.user_agent,
        })
    return {k: v for k, v in attrs.items() if v is not None}


def _error_type(req: Request) -> str | None:
    if req.status is not None and req.status >= 500:
        return str(req.status)
    return None if req.complete else "incomplete"


def _query(target: str | None) -> str | None:
    query = (target or "").partition("?")[2]
    if not query:
        return None
    params = (p.partition("=") for p in query.split("&"))
    return "&".join(k + s + ("REDACTED" if k in SECRET_QUERY_KEYS else v) for k, s, v in params)


def _remote_parent(req: Request) -> SpanContext:
    """The caller's span from its traceparent; an invalid one (a new root) without."""
    tp = req.traceparent
    if tp is None:
        return trace.INVALID_SPAN_CONTEXT
    return SpanContext(tp.trace_id, tp.span_id, is_remote=True, trace_flags=TraceFlags(tp.flags))


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
    """``spans`` as one OTLP/JSON ExportTraceServiceRequest."""
    doc = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return doc


def _hex_ids(obj: dict) -> None:
    # Protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants hex ids.
    for key in ("traceId", "spanId", "parentSpanId"):
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()
