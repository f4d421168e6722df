"""Real OTLP trace receivers for tests: gRPC and HTTP/protobuf, on 127.0.0.1.

Both collect every ``ExportTraceServiceRequest`` they are sent, with the
request's headers (gRPC metadata), and answer as a Collector would.
"""
from __future__ import annotations

import gzip
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceServicer,
    add_MetricsServiceServicer_to_server,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def value(v: AnyValue):
    """An OTLP AnyValue as the Python value it holds."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def attributes(kvs: list[KeyValue]) -> dict:
    return {kv.key: value(kv.value) for kv in kvs}


class _Receiver:
    endpoint: str

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.headers: list[dict[str, str]] = []  # per request, names lowercase
        self._span_count = 0
        self._cond = threading.Condition()

    def _collect(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._cond:
            self.requests.append(request)
            self.headers.append(headers)
            self._span_count += n
            self._cond.notify_all()

    def spans(self) -> list[tuple[dict, Span]]:
        """Every span received so far, with its resource's attributes."""
        with self._cond:
            requests = list(self.requests)
        return [
            (attributes(rs.resource.attributes), span)
            for request in requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def wait_for(self, n: int, timeout: float = 5.0) -> list[tuple[dict, Span]]:
        """The spans, once at least ``n`` have arrived; TimeoutError if they don't."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._span_count >= n, timeout):
                raise TimeoutError(f"{self._span_count} of {n} spans arrived within {timeout}s")
        return self.spans()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Metrics(MetricsServiceServicer):
    """OTLP metrics: every ExportMetricsServiceRequest, kept as is."""

    def __init__(self) -> None:
        self.requests: list = []

    def Export(self, request, context):  # noqa: N802
        self.requests.append(request)
        return ExportMetricsServiceResponse()

    def points(self, name: str) -> list[tuple[dict, float]]:
        """(attributes, value) of the data points of metric `name`, in the last export that has it."""
        for req in reversed(self.requests):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == name:
                            data = m.sum if m.HasField("sum") else m.gauge
                            return [(attributes(p.attributes), p.as_double or p.as_int)
                                    for p in data.data_points]
        return []


class GrpcOtlpReceiver(_Receiver, TraceServiceServicer):
    def __init__(self) -> None:
        super().__init__()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        add_TraceServiceServicer_to_server(self, self._server)
        self.metrics = _Metrics()
        add_MetricsServiceServicer_to_server(self.metrics, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server.start()

    def Export(self, request, context):  # noqa: N802 (the gRPC method's name)
        self._collect(request, {k.lower(): v for k, v in context.invocation_metadata()})
        return ExportTraceServiceResponse()

    def close(self) -> None:
        self._server.stop(grace=None)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/traces":
            self._reply(404, b"")
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        self.server.receiver._collect(request, {k.lower(): v for k, v in self.headers.items()})
        self._reply(200, ExportTraceServiceResponse().SerializeToString())

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    receiver: HttpOtlpReceiver


class HttpOtlpReceiver(_Receiver):
    def __init__(self) -> None:
        super().__init__()
        self._server = _HttpServer(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
