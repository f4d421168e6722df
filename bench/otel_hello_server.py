"""examples/hello_server.py's handler, instrumented in-process with OpenTelemetry.

    python bench/otel_hello_server.py PORT --spans-file FILE    # one SERVER span per request
    python bench/otel_hello_server.py PORT --plain              # the same server, no OpenTelemetry
    python bench/otel_hello_server.py PORT ... --nagle          # leave Nagle on (as the example does)

This is what a user would do instead of running sitsprobe: wrap the handler so
each request is a SERVER span carrying the HTTP semantic-convention
attributes sitsprobe puts on its spans, through opentelemetry-sdk with a
BatchSpanProcessor (default settings) and a ConsoleSpanExporter writing one
compact JSON span per line to FILE. SIGTERM flushes the processor and exits.

Both modes serve the same Handler class from examples/hello_server.py with the
same ThreadingHTTPServer, so the only difference between them is the
instrumentation. Both set TCP_NODELAY (the stdlib's `disable_nagle_algorithm`)
unless --nagle is given: the stdlib handler writes the headers and the body in
two send()s, and with Nagle on the body waits for the client's delayed ACK,
which caps a keep-alive connection at ~23 requests/s (a ~44 ms stall per
response) whatever the CPU costs are. bench/README.md has the numbers.
"""
from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from hello_server import Handler  # noqa: E402  (the example's handler, unchanged)

_ID = re.compile(r"^(\d+|[0-9a-fA-F]{8,}|[0-9a-fA-F-]{36})$")


def route_of(path: str) -> str:
    """/v1/items/1 -> /v1/items/{id}: what a framework's router would report."""
    return "/".join("{id}" if _ID.match(seg) else seg for seg in path.split("/"))


class _Counting:
    """Counts the bytes that pass through a socket file (http.request/response.size)."""

    def __init__(self, f) -> None:
        self._f, self.n = f, 0

    def readline(self, *a):
        b = self._f.readline(*a)
        self.n += len(b)
        return b

    def read(self, *a):
        b = self._f.read(*a)
        self.n += len(b)
        return b

    def write(self, b):
        self.n += len(b)
        return self._f.write(b)

    def __getattr__(self, name):
        return getattr(self._f, name)


def instrumented(base: type, tracer) -> type:
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    class OTelHandler(base):
        def setup(self):
            super().setup()
            self.rfile, self.wfile = _Counting(self.rfile), _Counting(self.wfile)
            self._in_mark = self._out_mark = 0

        def send_response(self, code, message=None):
            self._status = code
            super().send_response(code, message)

        def _traced(self, method: str, handle) -> None:
            path, _, query = self.path.partition("?")
            route = route_of(path)
            local, peer = self.connection.getsockname(), self.client_address
            attrs = {
                "http.request.method": method, "http.route": route,
                "url.scheme": "http", "url.path": path,
                "server.address": local[0], "server.port": local[1],
                "client.address": peer[0], "client.port": peer[1],
                "network.peer.address": peer[0], "network.peer.port": peer[1],
                "network.transport": "tcp", "network.protocol.name": "http",
                "network.protocol.version": self.request_version.partition("/")[2],
            }
            if query:
                attrs["url.query"] = query
            if ua := self.headers.get("User-Agent"):
                attrs["user_agent.original"] = ua
            ctx = propagate.extract(self.headers)
            with tracer.start_as_current_span(f"{method} {route}", context=ctx, kind=SpanKind.SERVER,
                                              attributes=attrs) as span:
                self._status = None
                handle()
                self.wfile.flush()
                span.set_attribute("http.response.status_code", self._status)
                span.set_attribute("http.request.size", self.rfile.n - self._in_mark)
                span.set_attribute("http.response.size", self.wfile.n - self._out_mark)
                if self._status >= 500:
                    span.set_attribute("error.type", str(self._status))
                    span.set_status(Status(StatusCode.ERROR))
            self._in_mark, self._out_mark = self.rfile.n, self.wfile.n

        def do_GET(self):
            self._traced("GET", super().do_GET)

        def do_POST(self):
            self._traced("POST", super().do_POST)

    return OTelHandler


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("port", type=int)
    ap.add_argument("--spans-file", help="write spans here (JSON, one per line)")
    ap.add_argument("--plain", action="store_true", help="no OpenTelemetry: the example's handler as is")
    ap.add_argument("--nagle", action="store_true", help="leave Nagle's algorithm on, as the example does")
    a = ap.parse_args()
    if not a.plain and not a.spans_file:
        ap.error("--spans-file is needed unless --plain")

    provider = None
    handler = type("BenchHandler", (Handler,), {"disable_nagle_algorithm": not a.nagle})
    if not a.plain:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        out = open(a.spans_file, "a", encoding="utf-8")
        provider = TracerProvider(resource=Resource.create({"service.name": "otel_hello_server"}))
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(
            out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
        trace.set_tracer_provider(provider)
        handler = instrumented(handler, trace.get_tracer("otel_hello_server"))

    server = ThreadingHTTPServer(("127.0.0.1", a.port), handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if provider is not None:
            provider.shutdown()  # flush the batch processor: every span ends up in the file
    return 0


if __name__ == "__main__":
    sys.exit(main())
