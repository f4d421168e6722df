"""Prometheus endpoint: request histograms from stitched Requests, exact
counters and self-metrics read from the kernel's maps at scrape time."""
from __future__ import annotations

import os
import selectors
import threading
import urllib.parse
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import MetricsHandler

from ..containers import Container
from ..workloads import Workload
from ..request import Request
from ..stitch.protocols import http1
from ..stitch.segments import SEGMENTS
from .buckets import DURATION_BUCKETS, SEGMENT_BUCKETS
from .genai_metrics import EngineMetrics, GenAIClientMetrics
from .semconv import (DB_CLIENT_DURATION, DB_OPERATION, DB_SYSTEM, HTTP_CLIENT_DURATION, HTTP_DURATION,
                      KNOWN_METHODS, METHOD, OTHER, ROUTE, RPC_CLIENT_DURATION, RPC_METHOD, RPC_SERVER_DURATION,
                      RPC_STATUS, RPC_SYSTEM, SERVER_ADDRESS, SERVER_PORT, STATUS, UNFRAMED_EXCHANGES,
                      grpc_method, grpc_status_name, is_client, is_grpc, is_http, is_redis, is_unframed,
                      server_endpoint)
from .series import Histograms, LabelCap

# Labels that come from the traffic, bounded per process (as routes are by
# RouteMapper's max_routes): past this many distinct values, the rest fold.
PROCESS = ("process",)  # who a request's series belong to: the process's name (and its pod's labels)
MAX_SERVERS = 64  # (server_address, server_port) pairs a client metric keeps; then "_other"
MAX_METHODS = 256  # gRPC methods, Redis commands; then "_OTHER"
FOLDED = "_other"


def _server_labels(r: Request, cap: LabelCap) -> tuple[str, str]:
    server = server_endpoint(r)
    address, port = server if server is not None else ("", None)
    return cap(r.comm, (address, "" if port is None else str(port)))


class RequestMetrics:
    """A Collector over plain dicts: observing a request is a dict lookup and a
    bisect, cheap enough for every request at tens of thousands per second."""

    def __init__(self, who: tuple[str, ...] = PROCESS):
        """who: the labels that say whose every series is, process first (and,
        with pod metadata, kubernetes.metric_labels), their values from
        who_of(request)."""
        self._lock = threading.Lock()
        W = self.labels = who
        self.who_of: Callable[[Request], tuple[str, ...]] = lambda r: (r.comm,) + ("",) * (len(W) - 1)
        self._http = Histograms(
            HTTP_DURATION,
            "Duration of HTTP server requests, first byte in to last byte out, seen in the kernel",
            (*W, METHOD, ROUTE, STATUS), DURATION_BUCKETS)
        servers = f"; {SERVER_ADDRESS}/{SERVER_PORT}: the first {MAX_SERVERS} pairs a process called, " \
                  f"the rest {FOLDED}"
        methods = f"; at most {MAX_METHODS} methods a process, the rest {OTHER}"
        self._http_client = Histograms(
            HTTP_CLIENT_DURATION,
            "Duration of HTTP requests a traced process sent, first byte out to last byte in" + servers,
            (*W, METHOD, SERVER_ADDRESS, SERVER_PORT, STATUS), DURATION_BUCKETS)
        self._rpc_server = Histograms(
            RPC_SERVER_DURATION,
            f"Duration of gRPC calls served, first byte in to last byte out; {RPC_STATUS}: the gRPC "
            "code's name" + methods, (*W, RPC_SYSTEM, RPC_METHOD, RPC_STATUS), DURATION_BUCKETS)
        self._rpc_client = Histograms(
            RPC_CLIENT_DURATION,
            f"Duration of gRPC calls a traced process made, first byte out to last byte in; {RPC_STATUS}: "
            "the gRPC code's name" + methods, (*W, RPC_SYSTEM, RPC_METHOD, RPC_STATUS), DURATION_BUCKETS)
        self._db_client = Histograms(
            DB_CLIENT_DURATION,
            f"Duration of Redis commands a traced process sent ({DB_OPERATION}: the first command of an "
            "exchange), first byte out to last byte in" + servers
            + f"; at most {MAX_METHODS} operations a process, the rest {OTHER}",
            (*W, DB_SYSTEM, DB_OPERATION, SERVER_ADDRESS, SERVER_PORT), DURATION_BUCKETS)
        # each metric's traffic-made labels, bounded per process
        self._http_servers = LabelCap(MAX_SERVERS, (FOLDED, FOLDED))
        self._db_servers = LabelCap(MAX_SERVERS, (FOLDED, FOLDED))
        self._rpc_methods = {"server": LabelCap(MAX_METHODS, OTHER), "client": LabelCap(MAX_METHODS, OTHER)}
        self._db_operations = LabelCap(MAX_METHODS, OTHER)
        self._bytes: dict[tuple[str, str], list[int]] = {}
        self._unframed: dict[tuple[str, str], int] = {}
        self._segments = Histograms(
            "sitsprobe_request_segment_seconds",
            "Each served request's latency by segment (network, scheduling, compute, io, cache): "
            "one observation per segment per request, adding up to the request's duration",
            (*W, "segment"), SEGMENT_BUCKETS)
        self._engine = EngineMetrics(W)
        self._genai_client = GenAIClientMetrics(W)
        # the kernel's counts since the last look ((process, method, route, status), BinDelta),
        # read at every scrape (probes.bins); None: the kernel counts nothing
        self.bins: Callable[[], list] | None = None

    def take_bins(self, rows: Callable[[], list]) -> None:
        """Requests counted in the kernel join the HTTP server, segment and
        byte metrics, exactly as if each had been observed here. rows: (the
        who labels, method, route, status), BinDelta."""
        n = len(self.labels)
        with self._lock:
            for labels, d in rows():
                who = labels[:n]
                self._http.add(labels, d.durations, d.sum_ns / 1e9)
                for name, counts, total in zip(SEGMENTS, d.segments, d.segment_sums_ns):
                    self._segments.add((*who, name), counts, total / 1e9)
                b = self._bytes.get((*who, http1.NAME))
                if b is None:
                    b = self._bytes[(*who, http1.NAME)] = [0, 0, 0]
                b[0] += d.bytes_in
                b[1] += d.bytes_out
                b[2] += d.count

    def http_quantile(self, q: float) -> float | None:
        """Of every HTTP server request's duration, in seconds."""
        with self._lock:
            return self._http.quantile(q)

    def observe(self, r: Request) -> None:
        w = self.who_of(r)
        if r.binned:  # its HTTP, segment and byte metrics come from the kernel (take_bins)
            if r.genai is not None:
                with self._lock:
                    self._engine.observe(r, w)
            return
        with self._lock:
            seconds = r.duration_ns / 1e9
            if is_grpc(r):
                side = "client" if is_client(r) else "server"
                method = self._rpc_methods[side](r.comm, grpc_method(r))
                labels = (*w, "grpc", method, grpc_status_name(r.h2.grpc_status) or "")
                (self._rpc_client if side == "client" else self._rpc_server).observe(labels, seconds)
            elif is_http(r) and is_client(r):
                method = r.method if r.method in KNOWN_METHODS else OTHER
                labels = (*w, method, *_server_labels(r, self._http_servers),
                          str(r.status) if r.status else "")
                self._http_client.observe(labels, seconds)
            elif is_http(r):
                labels = (*w, r.method or "_OTHER", r.route or "", str(r.status) if r.status else "")
                self._http.observe(labels, seconds)
            elif is_redis(r) and is_client(r):
                operation = self._db_operations(r.comm, r.method or "")
                labels = (*w, "redis", operation, *_server_labels(r, self._db_servers))
                self._db_client.observe(labels, seconds)
            elif is_unframed(r):
                key = (*w, r.protocol)
                self._unframed[key] = self._unframed.get(key, 0) + 1
            if r.genai is not None and is_client(r):
                self._genai_client.observe(r, w, _server_labels(r, self._http_servers))
            elif r.genai is not None:
                self._engine.observe(r, w)
            if r.segments is not None and not is_client(r):  # a call's time is its caller's segment
                for name, ns in zip(SEGMENTS, r.segments):
                    self._segments.observe((*w, name), ns / 1e9)
            b = self._bytes.get((*w, r.protocol))
            if b is None:
                b = self._bytes[(*w, r.protocol)] = [0, 0, 0]
            b[0] += r.bytes_in
            b[1] += r.bytes_out
            b[2] += 1

    def quantile_ttft(self, q: float) -> float | None:
        with self._lock:
            return self._engine.ttft.quantile(q)

    def cache_hit_ratio(self, cache: str) -> float | None:
        with self._lock:
            rows = [v for key, v in self._engine.cache.items() if key[-1] == cache]
        hits, total = sum(r[0] for r in rows), sum(r[0] + r[1] for r in rows)
        return hits / total if total else None

    def observe_batches(self, sizes: list[int]) -> None:
        with self._lock:
            for n in sizes:
                self._engine.batch.observe((), n)

    def collect(self):
        W = self.labels
        size_in = CounterMetricFamily("sitsprobe_request_bytes", "Bytes received in requests",
                                      labels=(*W, "protocol"))
        size_out = CounterMetricFamily("sitsprobe_response_bytes", "Bytes sent in responses",
                                       labels=(*W, "protocol"))
        stitched = CounterMetricFamily("sitsprobe_requests_stitched",
                                       "Requests stitched from kernel events (every protocol, "
                                       "and connection-level exchanges), or counted in the kernel",
                                       labels=(*W, "protocol"))
        unframed = CounterMetricFamily(UNFRAMED_EXCHANGES,
                                       "Exchanges no protocol framed, by what they look like "
                                       "(tls, http2, websocket, unknown): never in the HTTP metrics",
                                       labels=(*W, "protocol"))
        if self.bins is not None:
            self.take_bins(self.bins)
        with self._lock:
            families = [self._http.family(), self._http_client.family(), self._rpc_server.family(),
                        self._rpc_client.family(), self._db_client.family(), self._segments.family(),
                        *self._engine.families(), *self._genai_client.families()]
            for key, (bin_, bout, n) in self._bytes.items():
                size_in.add_metric(list(key), bin_)
                size_out.add_metric(list(key), bout)
                stitched.add_metric(list(key), n)
            for key, n in self._unframed.items():
                unframed.add_metric(list(key), n)
        yield from (*families, size_in, size_out, stitched, unframed)


class KernelMetrics:
    """Counts the kernel keeps, read at scrape time (no per-event cost)."""

    LOSS = {"lost": "ring_buffer_full", "conn_overflow": "connection_table_full",
            "uncounted": "connection_tables_full_uncounted",
            "bodies_full": "payload_table_full", "writes_lost": "write_ring_full",
            "chunks_lost": "stream_ring_full",
            "writes_unheld": "write_queue_full",
            "notices_lost": "notice_ring_full", "inflight_lost": "inflight_table_full",
            "marker_lost": "marker_ring_full", "marker_batch_ids_dropped": "marker_batch_ids_dropped",
            "marker_ranges_unmatched": "marker_range_begin_not_kept"}
    # sampler_counts' keys besides the outcomes of sitsprobe_traces_total, each
    # reported when given (TraceSampler's budget_per_second, cost_per_trace, cpu_seconds)
    SAMPLER_NUMBERS = ("budget_per_second", "cost_per_trace_seconds", "cpu_seconds")

    def __init__(self, counters: Callable[[], dict[str, int]],
                 status_rows: Callable[[], dict[tuple[str, str, int], int]],
                 gauges: Callable[[], dict[str, float]],
                 sampler_counts: Callable[[], dict[str, float]],
                 tracked: Callable[[], dict[int, str]],
                 container: Callable[[int], Container | None] = lambda pid: None,
                 untracked: Callable[[], dict[tuple[str, str], int]] = dict,
                 workload: Callable[[int], Workload | None] = lambda pid: None):
        """status_rows: (pid, process, status) -> responses; untracked: (pid,
        process) -> of those, on untracked connections. pid "": the totals
        of the processes of that name that exited. sampler_counts: outcome
        (seen, sampled, sampled_out) -> requests, and SAMPLER_NUMBERS."""
        self._counters, self._status, self._untracked = counters, status_rows, untracked
        self._gauges, self._sampler = gauges, sampler_counts
        self._tracked, self._container, self._workload = tracked, container, workload

    def collect(self):
        requests = CounterMetricFamily(
            "sitsprobe_http_server_requests",
            "HTTP responses sent, counted in the kernel (exact even when events are lost)",
            labels=("pid", "process", STATUS))
        for (pid, name, status), n in sorted(self._status().items()):
            requests.add_metric([pid, name, str(status)], n)
        yield requests
        untracked = CounterMetricFamily(
            "sitsprobe_http_server_requests_untracked",
            "HTTP responses sent on connections the full connection table could not track: "
            "counted above, never stitched (stitch.max_connections)", labels=("pid", "process"))
        for (pid, name), n in sorted(self._untracked().items()):
            untracked.add_metric([pid, name], n)
        yield untracked
        c = self._counters()
        yield CounterMetricFamily("sitsprobe_events_received", "Exchange events submitted by the kernel",
                                  value=c["exchanges"])
        yield CounterMetricFamily(
            "sitsprobe_write_events_received",
            "Response write events of POST exchanges (capture.genai) read from the kernel (a first "
            "write's more peeks are events of their own); those it could not send: "
            "sitsprobe_events_lost_total{reason=\"write_ring_full\"}",
            value=c["writes_read"])
        if c.get("binned"):
            yield CounterMetricFamily(
                "sitsprobe_requests_counted_in_kernel",
                "HTTP/1.x requests counted into the HTTP metrics in the kernel (stitch.kernel_bins); "
                "those no trace was chosen for never reached the agent: sitsprobe_traces_total sampled_out",
                value=c["binned"])
        lost = CounterMetricFamily("sitsprobe_events_lost", "Events the kernel could not deliver, by reason",
                                   labels=("reason",))
        for key, reason in self.LOSS.items():
            if key in c:
                lost.add_metric([reason], c[key])
        yield lost
        traces = CounterMetricFamily("sitsprobe_traces", "Requests offered to the trace sampler (seen), "
                                     "and what it decided: sampled (exported), sampled_out",
                                     labels=("outcome",))
        sampler = dict(self._sampler())
        numbers = {k: sampler.pop(k) for k in self.SAMPLER_NUMBERS if k in sampler}
        for outcome, n in sampler.items():
            traces.add_metric([outcome], n)
        yield traces
        yield from self._sampler_numbers(numbers)
        info = GaugeMetricFamily("sitsprobe_tracked_process_info",
                                 "Processes traced now, with their container and pod (join on pid); "
                                 "namespace, pod, container and owner from the Kubernetes API (kubernetes.metadata)",
                                 labels=("pid", "process", "container_id", "pod_uid", "namespace", "pod",
                                         "container", "owner_kind", "owner"))
        for pid, comm in sorted(self._tracked().items()):
            c = self._container(pid)
            w = self._workload(pid)
            info.add_metric([str(pid), comm, c.id if c else "", c.pod_uid if c else "",
                             *((w.namespace, w.pod, w.container, w.owner_kind, w.owner_name) if w else ("",) * 5)], 1)
        yield info
        for name, value in self._gauges().items():
            yield GaugeMetricFamily(f"sitsprobe_{name}", name.replace("_", " "), value=value)

    @staticmethod
    def _sampler_numbers(n: dict[str, float]):
        """What a trace count means: how many the sampler may let out, and at what CPU cost."""
        if "budget_per_second" in n:
            yield GaugeMetricFamily(
                "sitsprobe_trace_budget_per_second",
                "Traces the sampler may export at once in the current 1-second window: the CPU "
                "traces.cpu_budget allows (less what windows that overspent owe) over sitsprobe_trace_cost_seconds, "
                "at least 10; or traces.max_per_second without a CPU budget; never above traces.max_per_second "
                "when set; +Inf: no budget. Past it, errors and the slowest few still go out",
                value=n["budget_per_second"])
        if "cost_per_trace_seconds" in n:
            yield GaugeMetricFamily(
                "sitsprobe_trace_cost_seconds",
                "Agent CPU seconds one exported trace costs (spans made and sent), as the sampler estimates "
                "it from recent windows; the budget is traces.cpu_budget divided by this",
                value=n["cost_per_trace_seconds"])
        if "cpu_seconds" in n:
            yield CounterMetricFamily(
                "sitsprobe_trace_cpu_seconds",
                "Agent CPU seconds spent tracing: turning sampled requests into spans and exporting them. "
                "Its rate is the share of one core tracing takes, which the sampler holds to traces.cpu_budget",
                value=n["cpu_seconds"])


class JoinMetrics:
    """How requests found their traces (stitch.join), and whose TLS is read."""

    def __init__(self, joined: Callable[[], dict[str, int]], timed_out: Callable[[], int],
                 tls: Callable[[], dict[int, tuple[str, str]]]):
        """tls: pid -> (process, the libssl its plaintext is read through)."""
        self._joined, self._timed_out, self._tls = joined, timed_out, tls

    def collect(self):
        joins = CounterMetricFamily("sitsprobe_trace_joins", "Requests given a parent span from what the "
                                    "kernel linked, by how: thread, process (a worker thread's), "
                                    "connection (a traced caller's call), traceparent (a call carrying "
                                    "the header its process's request was sent)", labels=("via",))
        for via, n in self._joined().items():
            joins.add_metric([via], n)
        yield joins
        yield CounterMetricFamily("sitsprobe_trace_joins_timed_out", "Requests that waited "
                                  "stitch.join_wait_ms for what they belong to, and went out alone",
                                  value=self._timed_out())
        tls = GaugeMetricFamily("sitsprobe_tls_processes", "Traced processes whose TLS plaintext is read "
                                "through uprobes on their libssl", labels=("pid", "process", "library"))
        for pid, (comm, library) in sorted(self._tls().items()):
            tls.add_metric([str(pid), comm, library], 1)
        yield tls


class Http2Metrics:
    """HTTP/2 connections framed by the agent (stitch.streams), by process."""

    DOCS = {
        "connections": "HTTP/2 connections the agent framed",
        "partial": "of those, connections not decoded whole (their start missed, bytes not "
                   "captured, a header block it could not decode): their streams say why",
        "frame_errors": "malformed HTTP/2 frames seen (counted and skipped, never attributed)",
        "skipped_bytes": "HTTP/2 bytes not decoded once a connection's framing was lost",
        "window_updates_in": "WINDOW_UPDATE frames the traced process received (its peer let it send more)",
        "window_updates_out": "WINDOW_UPDATE frames the traced process sent",
        "payloads_not_kept": "POST streams to GenAI endpoints whose payload was not kept "
                             "(capture.max_payloads were kept at once): no gen_ai.* attributes",
    }

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]):
        self._counts = counts

    def collect(self):
        families = {what: CounterMetricFamily(f"sitsprobe_http2_{what}", doc, labels=("process",))
                    for what, doc in self.DOCS.items()}
        for (process, what), n in sorted(self._counts().items()):
            families[what].add_metric([process], n)
        yield from families.values()


class SpanAccounting:
    """What became of the spans handed to each trace sink (otlp, file):
    offered = delivered + dropped{reason} + pending, pending 0 after a flush."""

    def __init__(self, accounting: Callable[[], dict]):
        self._accounting = accounting

    def collect(self):
        offered = CounterMetricFamily("sitsprobe_spans_offered", "Spans handed to a trace sink",
                                      labels=("sink",))
        delivered = CounterMetricFamily("sitsprobe_spans_delivered",
                                        "Spans the sink took: the collector answered success, "
                                        "or the file was written", labels=("sink",))
        dropped = CounterMetricFamily("sitsprobe_spans_dropped",
                                      "Spans lost on the way to a sink, by reason: queue_full, "
                                      "export_failed (the collector failed or was unreachable, after "
                                      "retries), export_error, shutdown (not delivered when the agent "
                                      "stopped)", labels=("sink", "reason"))
        pending = GaugeMetricFamily("sitsprobe_spans_pending", "Spans queued or in flight to a sink now",
                                    labels=("sink",))
        for sink, c in sorted(self._accounting().items()):
            offered.add_metric([sink], c.offered)
            delivered.add_metric([sink], c.delivered)
            for reason in c.REASONS:
                dropped.add_metric([sink, reason], getattr(c, reason))
            pending.add_metric([sink], c.pending)
        yield from (offered, delivered, dropped, pending)


class SignalAccounting:
    """The agent's own metric points and alert log records over OTLP, the way
    SpanAccounting counts spans: offered = delivered + dropped{reason} + pending."""

    def __init__(self, tallies: Callable[[], dict]):
        self._tallies = tallies  # signal -> otlp.Tally

    def collect(self):
        tallies = self._tallies()
        if not tallies:  # no OTLP metrics, no alert logs: nothing to account for
            return
        offered = CounterMetricFamily("sitsprobe_telemetry_offered",
                                      "Items handed to an OTLP exporter: metric data points, log records",
                                      labels=("signal",))
        delivered = CounterMetricFamily("sitsprobe_telemetry_delivered",
                                        "Items the collector took (it answered success)", labels=("signal",))
        dropped = CounterMetricFamily("sitsprobe_telemetry_dropped",
                                      "Items lost on the way to the collector, by reason", labels=("signal", "reason"))
        for signal, tally in sorted(tallies.items()):
            c = tally.counts()
            offered.add_metric([signal], c.offered)
            delivered.add_metric([signal], c.delivered)
            for reason in c.REASONS:
                dropped.add_metric([signal, reason], getattr(c, reason))
        yield from (offered, delivered, dropped)


METRICS_PATHS = ("/metrics", "/metrics/inference")


class MetricsServer(ThreadingHTTPServer):
    """The metrics port, served on a thread of its own until close(), which
    returns as soon as that thread has ended. (serve_forever looks for a
    shutdown() only between waits of half a second: every stop waited for
    one, and shorter waits wake an idle agent more often. A pipe wakes it.)"""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler) -> None:
        super().__init__(address, handler)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as ready:
            ready.register(self, selectors.EVENT_READ)
            ready.register(self._wake_r, selectors.EVENT_READ)
            while not any(key.fileobj == self._wake_r for key, _ in ready.select()):
                self._handle_request_noblock()  # a thread for each request (daemon_threads)

    def close(self) -> None:
        """Stop serving, and close the port."""
        os.write(self._wake_w, b"\0")
        self._thread.join()
        self.server_close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def serve(registry: CollectorRegistry, address: str, port: int, healthy: Callable[[], bool],
          pages: dict[str, tuple[str, Callable[[dict[str, str]], bytes]]] | None = None) -> MetricsServer:
    """/metrics in the Prometheus text format (and at /metrics/inference, the
    path the SITS2026 scrape configuration uses), /healthz 200 once
    healthy(), and `pages`: path -> (content type, body maker of the query's
    parameters), e.g. the cache heatmaps. A maker's ValueError is the
    client's 400; any other path is a 404 that lists the ones there are."""
    metrics = MetricsHandler.factory(registry)
    pages = dict(pages or {})

    class Handler(metrics):
        def do_GET(self):
            path, _, query = self.path.partition("?")
            if path == "/healthz":
                ok = healthy()
                self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"starting\n")
            elif path in pages:
                kind, make = pages[path]
                try:
                    body = make(dict(urllib.parse.parse_qsl(query)))
                except ValueError as e:
                    self._send(400, "text/plain; charset=utf-8", f"{e}\n".encode())
                    return
                self._send(200, kind, body)
            elif path in METRICS_PATHS:
                super().do_GET()  # the query may name the series wanted (name[]=...)
            else:
                known = ", ".join((*METRICS_PATHS, "/healthz", *sorted(pages)))
                self._send(404, "text/plain; charset=utf-8", f"no page {path}; there are: {known}\n".encode())

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return MetricsServer((address, port), Handler)
