"""Real OTLP receivers for tests: gRPC and HTTP/protobuf, on 127.0.0.1.

Both collect every ``ExportTraceServiceRequest`` they are sent, with the
request's headers (gRPC metadata), and answer as a Collector would; the
metrics and logs services (``.metrics``, ``.logs``) keep their requests too.
"""
from __future__ import annotations

import gzip
import errno
import os
import random
import socket
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import (
    LogsServiceServicer,
    add_LogsServiceServicer_to_server,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceServicer,
    add_MetricsServiceServicer_to_server,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
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
    request, response = ExportTraceServiceRequest, ExportTraceServiceResponse

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


class _Service:
    """One signal's service: every request it was sent, kept as is, with its headers."""

    def __init__(self) -> None:
        self.requests: list = []
        self.headers: list[dict[str, str]] = []  # per request, names lowercase

    def _collect(self, request, headers: dict[str, str]) -> None:
        self.headers.append(headers)
        self.requests.append(request)

    def Export(self, request, context):  # noqa: N802 (the gRPC method's name)
        self._collect(request, {k.lower(): v for k, v in context.invocation_metadata()})
        return self.response()


class _Metrics(_Service, MetricsServiceServicer):
    """OTLP metrics: every ExportMetricsServiceRequest."""

    request, response = ExportMetricsServiceRequest, ExportMetricsServiceResponse

    def names(self) -> set[str]:
        """The name of every metric received so far."""
        return {m.name for req in list(self.requests) for rm in req.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}

    def point_count(self) -> int:
        """Data points received, every export and metric."""
        return sum(len(getattr(m, m.WhichOneof("data")).data_points)
                   for req in list(self.requests) for rm in req.resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics)

    def metric(self, name: str):
        """Metric `name` (its proto) as the last export that has it sent it; None if none did."""
        for req in reversed(self.requests):
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == name:
                            return m
        return None

    def points(self, name: str) -> list[tuple[dict, float]]:
        """(attributes, value) of the data points of sum or gauge `name`, in the last export that has it."""
        m = self.metric(name)
        if m is None:
            return []
        data = m.sum if m.HasField("sum") else m.gauge
        return [(attributes(p.attributes), p.as_double or p.as_int) for p in data.data_points]


class _Logs(_Service, LogsServiceServicer):
    """OTLP logs: every ExportLogsServiceRequest."""

    request, response = ExportLogsServiceRequest, ExportLogsServiceResponse

    def records(self) -> list[tuple[dict, LogRecord]]:
        """Every log record received so far, with its resource's attributes."""
        return [(attributes(rl.resource.attributes), record)
                for req in list(self.requests) for rl in req.resource_logs
                for sl in rl.scope_logs for record in sl.log_records]


@dataclass(frozen=True)
class Tls:
    """A receiver's TLS: its certificate and key (PEM files), and the CA that
    client certificates must come from (None: no client certificate asked for)."""

    certificate: str
    key: str
    client_ca: str | None = None


class GrpcOtlpReceiver(_Receiver, TraceServiceServicer):
    def __init__(self, tls: Tls | None = None, port: int = 0) -> None:
        """port 0: any free one; a given one: a receiver restarted where the agent sends."""
        super().__init__()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        add_TraceServiceServicer_to_server(self, self._server)
        self.metrics, self.logs = _Metrics(), _Logs()
        add_MetricsServiceServicer_to_server(self.metrics, self._server)
        add_LogsServiceServicer_to_server(self.logs, self._server)
        if tls is None:
            port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            port = self._server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials(
                [(Path(tls.key).read_bytes(), Path(tls.certificate).read_bytes())],
                root_certificates=Path(tls.client_ca).read_bytes() if tls.client_ca else None,
                require_client_auth=tls.client_ca is not None))
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self._server.start()

    def Export(self, request, context):  # noqa: N802 (the gRPC method's name)
        self._collect(request, {k.lower(): v for k, v in context.invocation_metadata()})
        return ExportTraceServiceResponse()

    def close(self) -> None:
        """Stop taking calls; one in flight is answered first (aborted, its data
        would be here while the exporter counted it failed, and no count could add up)."""
        self._server.stop(grace=0.5).wait()


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        rx = self.server.receiver
        service = {"/v1/traces": rx, "/v1/metrics": rx.metrics, "/v1/logs": rx.logs}.get(self.path)
        if service is None or self.headers.get("Content-Type") != "application/x-protobuf":
            self._reply(404 if service is None else 415, b"")
            return
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        service._collect(service.request.FromString(body), {k.lower(): v for k, v in self.headers.items()})
        self._reply(200, service.response().SerializeToString())

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
    """OTLP/HTTP with protobuf bodies at /v1/traces, /v1/metrics and /v1/logs."""

    def __init__(self, tls: Tls | None = None) -> None:
        super().__init__()
        self.metrics, self.logs = _Metrics(), _Logs()
        self._server = _HttpServer(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls.certificate, tls.key)
            if tls.client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(tls.client_ca)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class RotelOtlpReceiver(GrpcOtlpReceiver):
    """Rotel, a real OpenTelemetry collector (in Rust, from PyPI's ``rotel``), takes
    OTLP/HTTP and OTLP/gRPC at ``endpoint`` and ``grpc_endpoint`` and forwards all
    it receives over gRPC to this GrpcOtlpReceiver, where the tests read it. What
    is kept is what Rotel made of the requests (headers included): an
    implementation of the receiving side that is not ours."""

    def __init__(self, log_path: str | os.PathLike) -> None:
        import rotel

        super().__init__()
        sink = self.endpoint
        http_port, grpc_port = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{http_port}"
        self.grpc_endpoint = f"http://127.0.0.1:{grpc_port}"
        self._log = open(log_path, "w")
        self._proc = subprocess.Popen(
            [str(Path(rotel.__file__).parent / "rotel-agent"), "start",
             "--otlp-http-endpoint", f"127.0.0.1:{http_port}", "--otlp-grpc-endpoint", f"127.0.0.1:{grpc_port}",
             "--exporter", "otlp", "--otlp-exporter-endpoint", sink, "--otlp-exporter-protocol", "grpc",
             "--batch-timeout", "100ms", "--pid-file", f"{log_path}.pid", "--log-file", f"{log_path}.daemon"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not all(accepts(p) for p in (http_port, grpc_port)):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"rotel did not start: {Path(log_path).read_text()}")
            time.sleep(0.05)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        super().close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_for_later(ports: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """A TCP port free now on 127.0.0.1 and ::1 that no connection takes
    meanwhile: one below the kernel's ephemeral range, from which free_port()'s
    come and every client's connect() takes its own. For a port a module
    chooses when it is imported and a server binds minutes later (a test saw
    nginx refused its free_port(): "Address already in use")."""
    try:
        low = int(Path(ports).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    for _ in range(100):
        port = random.randrange(max(1024, low // 2), low)
        if all(_bindable(family, host, port) for family, host in ((socket.AF_INET, "127.0.0.1"),
                                                                   (socket.AF_INET6, "::1"))):
            return port
    raise RuntimeError(f"no free port below {low} in 100 tries")


def _bindable(family: int, host: str, port: int) -> bool:
    try:
        with socket.socket(family) as s:
            s.bind((host, port))
    except OSError as e:
        return e.errno != errno.EADDRINUSE  # a machine without IPv6 takes the port on IPv4 alone
    return True


def accepts(port: int) -> bool:
    """Whether something listens on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
