"""collectors/ against the agent itself.

Every metric and label a dashboard, an alerting rule or a data source link
names must be one the agent exports: the truth is a real exposition from the
agent's own collectors, fed plain inputs where the kernel and NVML would be
(the BPF maps' readers, a recorded NVML), never a list copied by hand. The
same holds for the span attributes the Tempo queries name (spans exported by
the real TraceExporter) and the alert attributes the Loki queries name (a log
record the real AlertExporter sends over OTLP/HTTP). Then the files must agree
with each other: the Collector's pipeline, the compose file, the Grafana
provisioning and the dashboards.

Nothing here runs the Collector, Tempo, Loki, Prometheus or Grafana.
"""
from __future__ import annotations

import gzip
import json
import re
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
import yaml
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sitsprobe import config
from sitsprobe.abi import CF_TUPLE, CH_CLOSE, CH_IN, CH_OUT
from sitsprobe.events import Chunk
from sitsprobe.agent import Agent
from sitsprobe.export.otlp import Counts
from sitsprobe.cache import KernelCacheCounts
from sitsprobe.clock import WallClock
from sitsprobe.containers import Container
from sitsprobe.export.alerts import AlertExporter
from sitsprobe.export.otlp_settings import resolve
from sitsprobe.export.otlp import TraceExporter
from sitsprobe.gpu import CollapseConfig, CollapseDetector, CudaCount, NvmlSampler
from sitsprobe.gpu.collapse import CLEARED, RAISED, Alert
from sitsprobe.gpu.cuda import COPIES, DIRECTIONS, FUNCTIONS
from sitsprobe.gpu.metrics import CollapseMetrics, CudaMetrics, GpuMetrics
from sitsprobe.gpu.recorded import NVMLError_GpuIsLost, RecordedBackend, RecordedGpu
from sitsprobe.gpu.samples import GpuSample
from sitsprobe.gpuwatch import GpuWatch
from sitsprobe.probes import cuda as cuda_probe
from sitsprobe.probes import markers as marker_probe
from sitsprobe.probes import net as net_probe
from sitsprobe.request import H2, CacheLookup, Endpoint, GenAI, Inference, Request, Stage
from sitsprobe.stitch.genai import from_markers
from tests.otlp_receiver import attributes

COLLECTORS = Path(__file__).resolve().parents[2] / "collectors"
DASHBOARDS = COLLECTORS / "grafana" / "dashboards"
PROVISIONING = COLLECTORS / "grafana" / "provisioning"
PID, COMM = 4242, "python"
CID, POD = "ab" * 32, "1f2e3d4c-5b6a-4789-8abc-def012345678"
T0_US = 1_750_000_000_000_000  # the recorded driver's wall clock, µs
S = 1_000_000_000
# labels Prometheus adds to every scraped series; "up" is Prometheus's own series
TARGET_LABELS = frozenset({"job", "instance"})
# Loki's default resource attributes stored as stream (index) labels; the rest
# of an OTLP record's attributes become structured metadata (Loki's docs,
# "Ingesting logs to Loki using OpenTelemetry Collector")
LOKI_INDEX_RESOURCE_ATTRIBUTES = frozenset({
    "cloud.availability_zone", "cloud.region", "container.name", "deployment.environment",
    "k8s.cluster.name", "k8s.container.name", "k8s.cronjob.name", "k8s.daemonset.name",
    "k8s.deployment.name", "k8s.job.name", "k8s.namespace.name", "k8s.pod.name",
    "k8s.replicaset.name", "k8s.statefulset.name", "service.instance.id", "service.name",
    "service.namespace"})


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def compose() -> dict:
    return load_yaml(COLLECTORS / "docker-compose.yaml")


def otelcol() -> dict:
    return load_yaml(COLLECTORS / "otelcol.yaml")


def provisioned_datasources() -> list[dict]:
    return [ds for p in sorted((PROVISIONING / "datasources").glob("*.y*ml"))
            for ds in load_yaml(p)["datasources"]]


# -- the agent's exposition ---------------------------------------------------------


class FakeNetProbe:
    """bpf/net.c's maps, as NetProbe reads them at scrape time."""

    tls = SimpleNamespace(covered={PID: "/usr/lib/x86_64-linux-gnu/libssl.so.3"})  # TlsHooks
    bins = None  # KernelBins: what the kernel counts comes out as the agent's own series

    def counters(self) -> dict[str, int]:
        return {name: i + 1 for i, name in enumerate(net_probe.COUNTERS)} | {"writes_read": 7}

    def status_counts(self) -> dict[tuple[int, int], int]:
        return {(PID, 200): 40, (PID, 503): 2}

    def untracked_counts(self) -> dict[int, int]:
        return {PID: 3}


class FakeMarkerProbe:
    def counters(self) -> dict[str, int]:
        return {name: 1 for name in marker_probe.COUNTERS}


def inference_request(start_ns: int, **kw) -> Request:
    """A chat request an instrumented engine served: stages, a batched decode, a cache look-up."""
    inf = Inference(
        request_id=7, model="tiny-gpt", start_ns=start_ns + 1_000_000, end_ns=start_ns + 40_000_000,
        stages=(Stage("queue", start_ns + 1_000_000, start_ns + 5_000_000),
                Stage("prefill", start_ns + 5_000_000, start_ns + 15_000_000),
                Stage("decode", start_ns + 15_000_000, start_ns + 38_000_000, batch_id=3, batch_size=2)),
        cache=(CacheLookup("prefix", "3f2a", True, start_ns + 6_000_000),),
        input_tokens=103, output_tokens=12, kv_bytes=1 << 20)
    fields = dict(
        pid=PID, comm=COMM, fd=17, start_ns=start_ns, end_ns=start_ns + 40_000_000,
        first_out_ns=start_ns + 16_000_000, bytes_in=310, bytes_out=1200,
        local=Endpoint("10.0.0.5", 8000), peer=Endpoint("10.0.0.9", 51234), method="POST",
        target="/v1/chat/completions", path="/v1/chat/completions", route="/v1/chat/completions",
        status=200, inference=inf,
        head=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUser-Agent: loadgen/1\r\n\r\n")
    fields.update(kw)
    r = Request(**fields)
    return r._replace(genai=from_markers(r))  # as the stitcher joins them


def collapse_detector() -> CollapseDetector:
    """A detector that has raised one alert: two minutes working, then starved under demand."""
    d = CollapseDetector(CollapseConfig())
    t = 1000 * S
    for busy, on_cpu, seconds in ((70.0, 0.3, 120), (5.0, 0.99, 20)):
        for _ in range(seconds * 5):
            t += S // 5
            d.observe_demand(0, PID, t, 4)
            d.observe_host(PID, t, on_cpu, 0.01)
            d.observe_cuda(PID, t, 0.02, 0.1)
            d.observe_gpu(0, t, busy, (), 0.5)
    assert d.active(), "the fixture meant to raise a collapse alert"
    return d


class FakeMonotonic:
    def __init__(self):
        self.now = 10 * S

    def __call__(self) -> int:
        return self.now


def gpu_sampler() -> NvmlSampler:
    """The real sampler over a recorded NVML: GPU 0 offers GPM (every reading),
    GPU 1 only utilization rates and falls off the bus once (an error count)."""
    backend = RecordedBackend([
        RecordedGpu(uuid="GPU-0", name="NVIDIA H200", gpm=True, sm_util=61.0, sm_occupancy=30.0,
                    rates=(60.0, 20.0), memory=(40 << 30, 141 << 30), power_mw=412_000,
                    sm_clock_mhz=1980, pcie_kb_per_s=(1000, 2000), throttle_mask=0x4,
                    processes=[(PID, T0_US, 58.0, 10.0)], compute_pids=[PID]),
        RecordedGpu(uuid="GPU-1", name="NVIDIA H200", rates=(5.0, 1.0)),
    ], now_us=T0_US)
    mono = FakeMonotonic()
    clock = WallClock()
    clock.offset_ns = T0_US * 1000 - mono.now
    s = NvmlSampler(backend, clock=clock, monotonic_ns=mono)
    s.open()
    s.tick()  # opens GPU 0's first GPM window
    mono.now += S // 5
    backend.fail[(1, "utilization_rates")] = NVMLError_GpuIsLost()
    s.tick()
    del backend.fail[(1, "utilization_rates")]
    mono.now += S // 5
    s.tick()
    return s


def cuda_counts() -> list[CudaCount]:
    """What CudaProbe.counts() reads from bpf/cuda.c: every function, copies in every direction."""
    out = []
    for f in FUNCTIONS:
        for d in (DIRECTIONS if f in COPIES else ("",)):
            out.append(CudaCount(PID, f, d, 10, 1, 4096, 2_000_000))
    return out


def h2_chunks(t: int) -> list[Chunk]:
    """One GET over HTTP/2 (the h2 library on both ends), as a traced server reads and writes it."""
    import h2.config
    import h2.connection

    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    client.send_headers(1, [(":method", "GET"), (":path", "/v1/models"), (":scheme", "http"),
                            (":authority", "engine")], end_stream=True)
    out, chunks = client.data_to_send(), []

    def chunk(direction: int, data: bytes) -> Chunk:
        return Chunk(PID, 9, t + len(chunks), direction, len(data), CF_TUPLE, Endpoint("10.0.0.5", 8000),
                     Endpoint("10.0.0.9", 51000), data)
    chunks.append(chunk(CH_IN, out))
    server.initiate_connection()
    server.receive_data(out)
    server.send_headers(1, [(":status", "200")])
    server.send_data(1, b"{}", end_stream=True)
    chunks.append(chunk(CH_OUT, server.data_to_send()))
    return chunks + [chunk(CH_CLOSE, b"")]


def agent_registry() -> CollectorRegistry:
    """The agent's registry as Agent.start builds it, with fakes only where bcc,
    root or NVML would be: the BPF maps' readers and the GPU layer's inputs."""
    cfg = config.load(overrides={"select.pids": [PID], "metrics.port": 0})
    agent = Agent(cfg)
    agent.probe, agent.markers = FakeNetProbe(), FakeMarkerProbe()
    counts = {"otlp": Counts(offered=9, delivered=5, queue_full=1, export_failed=1, export_error=1,
                             shutdown=1)}
    agent.exporter = SimpleNamespace(accounting=lambda: counts, export_trace=lambda t, enrich: None)
    agent.hooks, agent.ready = {"tcp_sendmsg": "tracepoint tcp:tcp_sendmsg_locked"}, True
    agent.tracked[PID] = agent.names[PID] = COMM
    agent.containers[PID] = Container(CID, "containerd", POD)
    registry = CollectorRegistry()
    agent._start_cache(registry)
    agent.cache_stats.kernel = lambda: {  # CacheProbe.kernel_counts: bpf/cache.c's maps
        "redis": KernelCacheCounts(hits=5, misses=3, filtered=1, lost=1, inflight_lost=1,
                                   duration_ns=80_000, latency=tuple([0] * 11 + [8] + [0] * 53))}
    agent._register_metrics(registry)
    # GpuWatch.start's collectors (CudaMetrics: what it registers once CudaProbe loads)
    registry.register(GpuMetrics(gpu_sampler(), agent.names.get, {PID: agent.containers[PID]}.get))
    registry.register(CudaMetrics(cuda_counts, lambda: {c: 1 for c in cuda_probe.COUNTERS},
                                  agent.names.get))
    registry.register(CollapseMetrics(collapse_detector()))

    now = 100 * S
    agent._release([inference_request(now), inference_request(now + S, status=503),
                     inference_request(now + 2 * S, protocol="tls", method=None, route=None,
                                       status=None, inference=None)], now + 3 * S)
    agent.metrics.observe_batches([1, 2, 4])
    call = inference_request(now)._replace(direction="client", inference=None, genai=None,
                                           local=Endpoint("10.0.0.5", 40000), peer=Endpoint("10.0.0.7", 8080))
    grpc = call._replace(protocol="http/2", method="POST", path="/pkg.Svc/Get", target="/pkg.Svc/Get",
                         h2=H2(stream_id=1, grpc=True, grpc_status=0))
    chat = call._replace(genai=GenAI(source="wire", operation="chat", provider="openai", request_model="m",
                                     input_tokens=3, output_tokens=5, streaming=True,
                                     first_token_ns=call.start_ns + S // 10, chunk_gaps_ns=(S // 100,)))
    for r in (call, chat, call._replace(protocol="resp", method="GET"), grpc, grpc._replace(direction="server")):
        agent.metrics.observe(r)  # the calls it made (HTTP, GenAI, Redis, gRPC) and a gRPC call it served
    for ch in h2_chunks(now):  # an HTTP/2 connection it served, framed by stitch.streams
        agent._on_chunk(ch)
    for key, hit, peer in ((b"user:1", True, Endpoint("10.1.2.3", 5000)),
                           (b"session:9", False, Endpoint("10.1.3.9", 5001))):
        agent.cache_stats.add("redis", key, hit, now, peer)
    return registry


@pytest.fixture(scope="module")
def exposition() -> dict[str, dict[str, set[str]]]:
    """series name (as Prometheus stores it: _total, _bucket, _sum, _count) ->
    label -> the values seen; each series also carries the target labels."""
    text = generate_latest(agent_registry()).decode()
    series: dict[str, dict[str, set[str]]] = {}
    empty = []
    for family in text_string_to_metric_families(text):
        if not family.samples:
            empty.append(family.name)
        for s in family.samples:
            labels = series.setdefault(s.name, defaultdict(set))
            for k, v in s.labels.items():
                labels[k].add(v)
    assert not empty, f"the fixture leaves these families without samples (no labels to check): {empty}"
    series["up"] = defaultdict(set)
    for labels in series.values():
        for t in TARGET_LABELS:
            labels.setdefault(t, set())
    return series


def test_the_exposition_has_what_the_agent_exports(exposition):
    # a histogram is stored as _bucket/_sum/_count, a counter with _total
    assert "http_server_request_duration_seconds_bucket" in exposition
    assert "le" in exposition["http_server_request_duration_seconds_bucket"]
    assert "le" not in exposition["http_server_request_duration_seconds_count"]
    assert "http_server_request_duration_seconds" not in exposition
    assert "sitsprobe_events_lost_total" in exposition and "sitsprobe_events_lost" not in exposition
    assert exposition["sitsprobe_events_lost_total"]["reason"] >= {"ring_buffer_full", "connection_table_full"}
    assert "sitsprobe_gpu_utilization_collapse" in exposition


# -- PromQL: which metrics and labels a query names, and which labels it yields ------


class PromQLError(Exception):
    pass


_TOKENS = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<num>0x[0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![\w:]))
  | (?P<dur>\d+(?:ms|s|m|h|d|w|y))
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}@])
""", re.X)
AGGREGATIONS = frozenset({"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                          "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"})
BINARY = {"or": 1, "and": 2, "unless": 2, "==": 3, "!=": 3, "<=": 3, "<": 3, ">=": 3, ">": 3,
          "+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6}
SET_OPS = frozenset({"and", "or", "unless"})
SCALAR = None  # what a scalar expression yields instead of a label set


def tokenize(expr: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(expr):
        m = _TOKENS.match(expr, i)
        if not m:
            raise PromQLError(f"cannot read {expr[i:i + 20]!r}")
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
        i = m.end()
    return out


def unquote(s: str) -> str:
    return s[1:-1].encode().decode("unicode_escape") if s[0] != "`" else s[1:-1]


class PromQL:
    """Parses one expression, checking each selector against the exposition and
    each grouping against the labels its operand can carry. ``problems`` lists
    what is wrong; ``labels`` is the label set the whole expression yields."""

    def __init__(self, expr: str, series: dict, jobs: set[str]):
        self.series, self.jobs = series, jobs
        self.problems: list[str] = []
        self.tokens = tokenize(expr)
        self.i = 0
        self.labels = self.expression()
        if self.i != len(self.tokens):
            raise PromQLError(f"unexpected {self.peek()[1]!r}")

    def peek(self, k: int = 0) -> tuple[str, str]:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise PromQLError(f"expected {value!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def label_list(self) -> list[str]:
        self.take("(")
        names = []
        while self.peek()[1] != ")":
            names.append(self.take()[1])
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return names

    def expression(self, min_prec: int = 1):
        lhs = self.unary()
        while True:
            op = self.peek()[1]
            prec = BINARY.get(op)
            if prec is None or prec < min_prec:
                return lhs
            self.take()
            if self.peek()[1] == "bool":
                self.take()
            on = ignoring = None
            group, extra = None, []
            if self.peek()[1] in ("on", "ignoring"):
                kind = self.take()[1]
                names = self.label_list()
                on, ignoring = (names, None) if kind == "on" else (None, names)
            if self.peek()[1] in ("group_left", "group_right"):
                group = self.take()[1]
                if self.peek()[1] == "(":
                    extra = self.label_list()
            rhs = self.expression(prec + (0 if op == "^" else 1))
            lhs = self.binary(op, lhs, rhs, on, ignoring, group, extra)

    def binary(self, op, lhs, rhs, on, ignoring, group, extra):
        if lhs is SCALAR or rhs is SCALAR:
            return rhs if lhs is SCALAR else lhs
        for names, side in ((on or [], lhs), (on or [], rhs)):
            for n in names:
                if n not in side:
                    self.problems.append(f"on({n}) with {op}: one side has no label {n}")
        if group == "group_left":
            self._need(extra, rhs, f"group_left with {op}")
            return lhs | set(extra)
        if group == "group_right":
            self._need(extra, lhs, f"group_right with {op}")
            return rhs | set(extra)
        if op in SET_OPS:
            return lhs | rhs if op == "or" else lhs
        if on is not None:
            return frozenset(on)
        drop = set(ignoring or ())
        if lhs - drop != rhs - drop:
            self.problems.append(f"the sides of {op} carry different labels ({sorted(lhs - drop)} vs "
                                 f"{sorted(rhs - drop)}): one-to-one matching would find nothing")
        return lhs - drop

    def _need(self, names, have, where: str) -> None:
        for n in names:
            if n not in have:
                self.problems.append(f"{where}: no label {n} to group by (has {sorted(have)})")

    def unary(self):
        if self.peek()[1] in ("-", "+"):
            self.take()
            return self.unary()
        result = self.primary()
        while self.peek()[0] == "range" or self.peek()[1] in ("offset", "@"):
            if self.take()[1] in ("offset", "@"):
                self.take()
        return result

    def primary(self):
        kind, value = self.peek()
        if kind == "num" or value in ("Inf", "NaN"):
            self.take()
            return SCALAR
        if kind == "str":
            self.take()
            return SCALAR
        if value == "(":
            self.take()
            inner = self.expression()
            self.take(")")
            return inner
        if kind != "ident":
            raise PromQLError(f"unexpected {value!r}")
        if value in AGGREGATIONS and self.peek(1)[1] in ("(", "by", "without"):
            return self.aggregation()
        if self.peek(1)[1] == "(":
            return self.call()
        return self.selector()

    def aggregation(self):
        op = self.take()[1]
        grouping = None
        if self.peek()[1] in ("by", "without"):
            grouping = (self.take()[1], self.label_list())
        args = self.args()
        if self.peek()[1] in ("by", "without"):
            grouping = (self.take()[1], self.label_list())
        vector = args[-1]
        if vector is SCALAR:
            raise PromQLError(f"{op} over a scalar")
        if grouping is None:
            return frozenset() if op not in ("topk", "bottomk", "limitk", "limit_ratio") else vector
        kind, names = grouping
        self._need(names, vector, f"{op} {kind}")
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return vector
        return frozenset(names) if kind == "by" else vector - set(names)

    def args(self) -> list:
        self.take("(")
        out = []
        while self.peek()[1] != ")":
            out.append(self.expression())
            if self.peek()[1] == ",":
                self.take()
        self.take(")")
        return out

    def call(self):
        name = self.take()[1]
        if name in ("label_replace", "label_join"):
            raise PromQLError(f"{name} makes labels this check cannot follow")
        args = self.args()
        vectors = [a for a in args if a is not SCALAR]
        if name in ("time", "scalar", "pi") or not vectors:
            return frozenset() if name == "vector" else SCALAR
        if name == "histogram_quantile":
            if "le" not in vectors[0]:
                self.problems.append("histogram_quantile over series without le (not a _bucket)")
            return vectors[0] - {"le"}
        return vectors[0]

    def selector(self):
        name = self.take()[1]
        matchers = []
        if self.peek()[1] == "{":
            self.take()
            while self.peek()[1] != "}":
                label, op, value = self.take()[1], self.take()[1], self.take()
                if value[0] != "str":
                    raise PromQLError(f"matcher {label}{op} needs a string")
                matchers.append((label, op, unquote(value[1])))
                if self.peek()[1] == ",":
                    self.take()
            self.take("}")
        labels = self.series.get(name)
        if labels is None:
            self.problems.append(f"{name}: the agent exports no such series")
            return frozenset(TARGET_LABELS)
        for label, op, value in matchers:
            if label not in labels:
                self.problems.append(f"{name}{{{label}{op}{value!r}}}: {name} has no label {label} "
                                     f"(has {sorted(labels)})")
            elif op == "=" and "$" not in value:
                known = self.jobs if label == "job" else labels[label]
                if label != "instance" and value not in known:
                    self.problems.append(f"{name}{{{label}={value!r}}}: no such value "
                                         f"(the agent's: {sorted(known)})")
        return frozenset(labels)


# Grafana's variables, as they would be interpolated (values do not matter here)
_GRAFANA_VARS = re.compile(r"\$\{__span\.tags(?:\.\w+|\[\"[^\"]+\"\])\}|\$\{?[\w.]+(?::\w+)?\}?")


def check_promql(expr: str, series: dict, jobs: set[str], legend: str = "") -> tuple[list[str], frozenset | None]:
    try:
        q = PromQL(expr, series, jobs)
    except PromQLError as e:
        return [f"cannot parse ({e})"], SCALAR
    problems = list(q.problems)
    wanted = set(re.findall(r"\{\{\s*\$?(?:labels\.)?\$?(\w+)\s*\}\}", legend))
    if q.labels is not SCALAR:
        missing = wanted - q.labels
        if missing:
            problems.append(f"legend/annotation names {sorted(missing)}, which the result does not carry "
                            f"(it carries {sorted(q.labels)})")
    return problems, q.labels


def scrape_jobs(*files: str) -> set[str]:
    return {job["job_name"] for f in files for job in load_yaml(COLLECTORS / f)["scrape_configs"]}


def otlp_metrics_job() -> str:
    """The job the Collector gives the agent's OTLP metrics (transform/otlp_job)."""
    statements = otelcol()["processors"]["transform/otlp_job"]["metric_statements"][0]["statements"]
    return re.search(r'"service\.name"\], "([^"]+)"\)', statements[0]).group(1)


def prometheus_queries() -> list[tuple[str, str, str]]:
    """(where, expr, legend or annotation text) for every PromQL query in collectors/."""
    out = []
    for file, board in dashboards().items():
        for v in board["templating"]["list"]:
            if v.get("datasource", {}).get("type") == "prometheus":
                query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                assert v.get("definition", query) == query, f"{file} variable {v['name']}: definition and query differ"
                out.append((f"{file} variable {v['name']}", query, ""))
        for p in all_panels(board):
            for t in p.get("targets", []):
                if t.get("datasource", p.get("datasource", {})).get("type") == "prometheus":
                    legend = t.get("legendFormat", "")
                    out.append((f"{file} panel {p['title']!r}", t["expr"], "" if legend == "__auto" else legend))
    for path in sorted((COLLECTORS / "rules").glob("*.yml")):
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                text = " ".join((rule.get("labels") or {}).values()) + " ".join(
                    (rule.get("annotations") or {}).values())
                text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", r"{{\1}}", text)
                out.append((f"rules/{path.name} {rule.get('alert') or rule.get('record')}", rule["expr"], text))
    for ds in provisioned_datasources():
        t2m = ds.get("jsonData", {}).get("tracesToMetrics")
        if t2m:
            tags = ", ".join(f'{t.get("value") or t["key"]}="$span_tag"' for t in t2m["tags"])
            for q in t2m["queries"]:
                out.append((f"datasource {ds['name']} tracesToMetrics {q['name']!r}",
                            q["query"].replace("$$__tags", tags).replace("$__tags", tags), ""))
    return out


def label_values_query(query: str, series: dict, jobs: set[str]) -> list[str]:
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query, re.S)
    if not m:
        return check_promql(query, series, jobs)[0]
    problems, labels = check_promql(m.group(1), series, jobs)
    if labels is not SCALAR and m.group(2) not in labels:
        problems.append(f"label_values: {m.group(2)} is not a label of {m.group(1)}")
    return problems


def test_every_prometheus_query_names_real_metrics_and_labels(exposition):
    jobs = scrape_jobs("prometheus.yml", "prometheus-kubernetes.yml") | {otlp_metrics_job()}
    queries = prometheus_queries()
    assert len(queries) > 50  # the dashboards, the rules, the data source links
    problems = []
    for where, expr, legend in queries:
        expr = _GRAFANA_VARS.sub(lambda m: "5m" if m.group().startswith("$__") else m.group(), expr)
        if where.endswith(tuple(f"variable {v}" for v in ("job", "instance", "process", "cache", "gpu"))):
            found = label_values_query(expr, exposition, jobs)
        else:
            found = check_promql(expr, exposition, jobs, legend)[0]
        problems += [f"{where}: {p}\n    {expr}" for p in found]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("expr, legend, problem", [
    ("rate(sitsprobe_events_lost[5m])", "", "no such series"),  # a counter without _total
    ("histogram_quantile(0.9, sum by (le) (rate(http_server_request_duration_seconds[5m])))", "",
     "no such series"),  # a histogram without _bucket
    ("histogram_quantile(0.9, sum by (le) (rate(http_server_request_duration_seconds_count[5m])))", "",
     "no label le"),
    ('sitsprobe_engine_batch_size_count{process="x"}', "", "has no label process"),
    ("sum by (gpu) (rate(sitsprobe_cuda_calls_total[5m]))", "", "no label gpu"),
    ('sitsprobe_traces_total{outcome="exported"}', "", "no such value"),
    ("sum by (route) (rate(http_server_request_duration_seconds_count[5m]))", "{{status}}",
     "does not carry"),
    ("sum(rate(sitsprobe_cache_lookups_total[5m])) / sum by (cache) (rate(sitsprobe_cache_lookups_total[5m]))",
     "", "different labels"),
    ('up{job="sitsprobes"}', "", "no such value"),
])
def test_the_query_check_catches(exposition, expr, legend, problem):
    problems, _ = check_promql(expr, exposition, {"sitsprobe"}, legend)
    assert any(problem in p for p in problems), problems


# -- spans and alert records, as the agent exports them ----------------------------------


@pytest.fixture(scope="module")
def span_attributes(tmp_path_factory) -> tuple[set[str], set[str]]:
    """(span attribute names, resource attribute names) of a traced inference
    request on a GPU, written by the real TraceExporter to an OTLP/JSON file."""
    tmp = tmp_path_factory.mktemp("spans")
    (tmp / "proc" / str(PID)).mkdir(parents=True)
    (tmp / "proc" / str(PID) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n")
    clock = WallClock()
    start = 100 * S
    watch = GpuWatch(clock=clock, name_of=lambda pid: COMM, interval_s=0.2, cuda_probes=False,
                     collapse=CollapseConfig(), alerts=AlertExporter(clock, None))
    for ts in range(start, start + 60_000_000, 10_000_000):
        watch.timeline.add_sample(GpuSample(gpu=0, uuid="GPU-0", ts_ns=ts, window_ns=10_000_000,
                                            signal="gpm_sm_util", busy_percent=60.0,
                                            memory_used_bytes=40 << 30))
    for ts, launches in ((start - S, 0), (start + S, 500)):
        watch.timeline.add_process(PID, ts, (0,), launches, launches * 4096, 1)
    exporter = TraceExporter(clock=clock, traces_file=str(tmp / "traces.jsonl"), proc=str(tmp / "proc"))
    exporter.export(watch.attribute(inference_request(start)))
    exporter.shutdown()
    spans, resources = set(), set()
    for line in (tmp / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            resources |= {a["key"] for a in rs["resource"]["attributes"]}
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    spans |= {a["key"] for a in span.get("attributes", [])}
    assert any(k.startswith("sitsprobe.gpu.") for k in spans), "the fixture meant a span on a GPU"
    assert any(k.startswith("k8s.") for k in resources), "the fixture meant a process in a pod"
    return spans, resources


class _LogsReceiver(BaseHTTPRequestHandler):
    received: list[ExportLogsServiceRequest] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.append(ExportLogsServiceRequest.FromString(body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def alert_record() -> dict:
    """What Loki receives for a raised and a cleared collapse alert: the resource
    and record attributes the real AlertExporter sends over OTLP/HTTP."""
    _LogsReceiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LogsReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        otlp = resolve("logs", endpoint=f"http://127.0.0.1:{server.server_port}", protocol="http/protobuf",
                       env={})
        exporter = AlertExporter(WallClock(), otlp)
        for state in (RAISED, CLEARED):
            exporter.emit(Alert(gpu=0, pid=PID, cause="cpu_bound", state=state, window_start_ns=S,
                                window_end_ns=6 * S, evidence={"busy": 3.0, "working": 74.0}), COMM)
        exporter.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    resource, records = {}, []
    for request in _LogsReceiver.received:
        for rl in request.resource_logs:
            resource.update(attributes(rl.resource.attributes))
            for sl in rl.scope_logs:
                records += [attributes(r.attributes) for r in sl.log_records]
    assert len(records) == 2, records
    return {"resource": resource, "records": records}


def test_alert_records_name_gpu_process_cause_evidence_and_window(alert_record):
    raised = alert_record["records"][0]
    assert (raised["gpu"], raised["process.pid"], raised["process.executable.name"]) == (0, PID, COMM)
    assert raised["sitsprobe.cause"] == "cpu_bound"
    assert json.loads(raised["sitsprobe.evidence"]) == {"busy": 3.0, "working": 74.0}
    assert raised["sitsprobe.window.end"] - raised["sitsprobe.window.start"] == 5 * S


def loki_name(attribute: str) -> str:
    """How Loki names an OTLP attribute: every character but [A-Za-z0-9_] becomes _."""
    return re.sub(r"[^A-Za-z0-9_]", "_", attribute)


_LOGQL_SELECTOR = re.compile(r'\s*\{(.*?)\}')
_LOGQL_MATCHER = re.compile(r'\s*(\w+)\s*(=~|!~|!=|=)\s*"((?:\\.|[^"\\])*)"\s*,?')
_LOGQL_STAGE = re.compile(r'\s*\|\s*(\w+)\s*(=~|!~|!=|==|>=|<=|=|>|<)\s*"((?:\\.|[^"\\])*)"'
                          r'|\s*(?:\|=|\|~|!=|!~)\s*"(?:\\.|[^"\\])*"')


def logql_names(query: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(stream matchers, label filters) of a LogQL log query: selector plus label and line filters."""
    m = _LOGQL_SELECTOR.match(query)
    if not m:
        raise ValueError(f"no stream selector in {query!r}")
    stream = [x.groups() for x in _LOGQL_MATCHER.finditer(m.group(1))]
    filters, i = [], m.end()
    while i < len(query.rstrip()):
        s = _LOGQL_STAGE.match(query, i)
        if not s:
            raise ValueError(f"cannot read {query[i:]!r} in {query!r}")
        if s.group(1):
            filters.append(s.group(1, 2, 3))
        i = s.end()
    return stream, filters


def loki_queries() -> list[tuple[str, str, str]]:
    """(where, LogQL query, the text that names its fields) in dashboards and data sources."""
    out = []
    for file, board in dashboards().items():
        for a in board["annotations"]["list"]:
            if a.get("datasource", {}).get("type") == "loki":
                text = " ".join((a.get("titleFormat", ""), a.get("textFormat", ""),
                                 " ".join("{{%s}}" % k for k in a.get("tagKeys", "").split(",") if k)))
                out.append((f"{file} annotation {a['name']!r}", a["expr"], text))
        for p in all_panels(board):
            for t in p.get("targets", []):
                if t.get("datasource", p.get("datasource", {})).get("type") == "loki":
                    out.append((f"{file} panel {p['title']!r}", t["expr"], t.get("legendFormat", "")))
    for ds in provisioned_datasources():
        t2l = ds.get("jsonData", {}).get("tracesToLogsV2")
        if t2l:
            out.append((f"datasource {ds['name']} tracesToLogsV2", t2l["query"],
                        " ".join("{{%s}}" % t.get("value", t["key"]) for t in t2l["tags"])))
    return out


def loki_problems(alert_record: dict, queries: list[tuple[str, str, str]]) -> list[str]:
    """What in these LogQL queries the agent's alert records do not carry, as Loki stores them."""
    resource, records = alert_record["resource"], alert_record["records"]
    index = {loki_name(k): {str(v)} for k, v in resource.items() if k in LOKI_INDEX_RESOURCE_ATTRIBUTES}
    fields = defaultdict(set)  # structured metadata: record attributes, the other resource attributes
    for attrs in [*records, {k: v for k, v in resource.items() if k not in LOKI_INDEX_RESOURCE_ATTRIBUTES}]:
        for k, v in attrs.items():
            fields[loki_name(k)].add(str(v))
    problems = []
    for where, query, text in queries:
        query = _GRAFANA_VARS.sub("$var", query.replace("$$", "$"))
        try:
            stream, filters = logql_names(query)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            continue
        for name, op, value in stream:
            if name not in index:
                problems.append(f"{where}: stream label {name} is not one Loki indexes for the "
                                f"agent's alerts ({sorted(index)})")
            elif op == "=" and value not in index[name]:
                problems.append(f"{where}: {name}={value!r}, but the agent sends {sorted(index[name])}")
        for name, op, value in filters:
            if name not in fields:
                problems.append(f"{where}: no field {name} in the agent's alert records ({sorted(fields)})")
            elif op == "=" and "$" not in value and value not in fields[name]:
                problems.append(f"{where}: {name}={value!r}, but the agent sends {sorted(fields[name])}")
        for name in re.findall(r"\{\{\s*(\w+)\s*\}\}", text):
            if name not in fields and name not in index:
                problems.append(f"{where}: shows {{{{{name}}}}}, which the alert records do not carry")
    return problems


def test_loki_queries_name_the_alert_attributes_the_agent_sends(alert_record):
    queries = loki_queries()
    assert len(queries) >= 3  # the GPU dashboard's annotation and logs panel, Tempo's trace-to-logs link
    problems = loki_problems(alert_record, queries)
    assert not problems, "\n".join(problems)
    gpu_board = dashboards()["gpus.json"]
    annotation, = [a for a in gpu_board["annotations"]["list"] if a.get("datasource", {}).get("type") == "loki"]
    shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", annotation["titleFormat"] + annotation["textFormat"]))
    assert {loki_name("gpu"), loki_name("sitsprobe.cause")} <= shown | set(annotation["tagKeys"].split(","))


@pytest.mark.parametrize("query, problem", [
    ('{service_name="sitsprobe"} | cause="cpu_bound"', "no field cause"),
    ('{service_name="sitsprobe"} | sitsprobe.cause="cpu_bound"', "cannot read"),
    ('{service_name="sitsprobe"} | sitsprobe_alert_state="firing"', "but the agent sends"),
    ('{service_name="sitsprobe-agent"}', "but the agent sends"),
    ('{gpu="0"}', "is not one Loki indexes"),
])
def test_the_logql_check_catches(alert_record, query, problem):
    problems = loki_problems(alert_record, [("probe", query, "")])
    assert any(problem in p for p in problems), problems


def test_tempo_queries_and_links_name_real_span_attributes(span_attributes):
    spans, resources = span_attributes
    problems = []
    checked = 0
    for file, board in dashboards().items():
        for p in all_panels(board):
            for t in p.get("targets", []):
                if t.get("datasource", p.get("datasource", {})).get("type") != "tempo":
                    continue
                for scope, name in re.findall(r"\b(span|resource)\.([A-Za-z_][\w.]*[\w])", t["query"]):
                    checked += 1
                    if name not in (spans if scope == "span" else resources):
                        problems.append(f"{file} {p['title']!r}: {scope}.{name} is not on sitsprobe's spans")
    for ds in provisioned_datasources():
        for link in ("tracesToLogsV2", "tracesToMetrics"):
            for tag in ds.get("jsonData", {}).get(link, {}).get("tags", []):
                checked += 1
                if tag["key"] not in spans | resources:
                    problems.append(f"datasource {ds['name']} {link}: no attribute {tag['key']} on sitsprobe's spans")
            query = ds.get("jsonData", {}).get(link, {}).get("query", "")
            for name in re.findall(r'__span\.tags\["([^"]+)"\]', query):
                checked += 1
                if name not in spans | resources:
                    problems.append(f"datasource {ds['name']} {link}: no attribute {name} on sitsprobe's spans")
    assert checked >= 6
    assert not problems, "\n".join(problems)


# -- Grafana: dashboards and provisioning ---------------------------------------------------


def all_panels(board: dict) -> list[dict]:
    out = []
    for p in board.get("panels", []):
        out.append(p)
        out += p.get("panels", [])  # a collapsed row holds its panels
    return out


def datasource_refs(board: dict) -> list[tuple[str, dict]]:
    refs = []
    for v in board.get("templating", {}).get("list", []):
        if "datasource" in v:
            refs.append((f"variable {v['name']}", v["datasource"]))
    for a in board.get("annotations", {}).get("list", []):
        if not a.get("builtIn"):
            refs.append((f"annotation {a['name']}", a["datasource"]))
    for p in all_panels(board):
        if p["type"] == "row":
            continue
        refs.append((f"panel {p['title']!r}", p["datasource"]))
        refs += [(f"panel {p['title']!r} target {t['refId']}", t["datasource"]) for t in p.get("targets", [])]
    return refs


def test_dashboards_parse_and_name_only_provisioned_datasources():
    sources = {ds["uid"]: ds["type"] for ds in provisioned_datasources()}
    assert len(sources) == len(provisioned_datasources()), "datasource uids must be unique"
    boards = dashboards()
    assert set(boards) == {"inference-requests.json", "caches.json", "gpus.json", "agent-health.json"}
    uids = [b["uid"] for b in boards.values()]
    assert len(set(uids)) == len(uids), f"dashboard uids repeat: {uids}"
    titles = [b["title"] for b in boards.values()]
    assert len(set(titles)) == len(titles)
    problems = []
    for file, board in boards.items():
        ids = [p["id"] for p in all_panels(board)]
        if len(set(ids)) != len(ids):
            problems.append(f"{file}: panel ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}")
        for where, ref in datasource_refs(board):
            if sources.get(ref.get("uid")) != ref.get("type"):
                problems.append(f"{file} {where}: datasource {ref} is not provisioned "
                                f"({sources})")
        names = {v["name"] for v in board["templating"]["list"]}
        if not {"job", "instance"} <= names:
            problems.append(f"{file}: no job/instance variables ({sorted(names)})")
    assert not problems, "\n".join(problems)


def test_each_dashboard_shows_what_it_is_for():
    exprs = {file: " ".join(t.get("expr", "") + t.get("query", "") for p in all_panels(b)
                            for t in p.get("targets", []))
             for file, b in dashboards().items()}
    want = {
        "inference-requests.json": ["http_server_request_duration_seconds_bucket", "by (http_route, http_response_status_code)",
                                    "sitsprobe_http_server_requests_total", "sitsprobe_engine_batch_size",
                                    "gen_ai_server_time_to_first_token_seconds", "resource.service.name"],
        "caches.json": ["sum by (prefix)", 'result="miss"', "sitsprobe_cache_lookup_duration_seconds_bucket"],
        "gpus.json": ["sitsprobe_gpu_busy_ratio", "sitsprobe_gpu_utilization_ratio", "sitsprobe_gpu_memory_used_bytes",
                      "sitsprobe_gpu_power_watts", "sitsprobe_gpu_sm_clock_hertz",
                      "sitsprobe_gpu_pcie_throughput_bytes_per_second", "sitsprobe_gpu_throttle_reason",
                      "sitsprobe_gpu_process_sm_utilization_ratio", "sitsprobe_cuda_calls_total",
                      "sitsprobe_cuda_sync_seconds_total", "sitsprobe_cuda_memcpy_bytes_total",
                      "sitsprobe_gpu_utilization_collapse"],
        "agent-health.json": ["sitsprobe_events_lost_total", "by (instance, reason)", "sitsprobe_events_received_total",
                              "sitsprobe_traces_total", "sitsprobe_requests_stitched_total"],
    }
    for file, needles in want.items():
        for needle in needles:
            assert needle in exprs[file], f"{file} lost {needle}"
    caches = dashboards()["caches.json"]
    assert any(p["type"] == "heatmap" and "by (prefix)" in p["targets"][0]["expr"] for p in all_panels(caches))
    gpus = dashboards()["gpus.json"]
    assert any(a.get("datasource", {}).get("type") == "loki" for a in gpus["annotations"]["list"])


def test_dashboard_variables_default_to_the_scraped_job():
    jobs = scrape_jobs("prometheus.yml")
    for file, board in dashboards().items():
        job, = [v for v in board["templating"]["list"] if v["name"] == "job"]
        assert job["current"]["value"] in jobs, file


def host_port(url: str) -> tuple[str, int]:
    u = urlsplit(url if "://" in url else f"//{url}")
    return u.hostname, u.port


def container_ports(service: dict) -> set[int]:
    """The ports a compose service offers other services: expose, and the container side of ports."""
    ports = {int(p) for p in service.get("expose", [])}
    for p in service.get("ports", []):
        ports.add(int(str(p).split(":")[-1].split("/")[0]))
    return ports


def published_ports(service: dict) -> set[int]:
    return {int(str(p).split(":")[-1].split("/")[0]) for p in service.get("ports", [])}


def listening_port(name: str, service: dict) -> set[int]:
    """What each backend's own configuration says it listens on, where it says."""
    if name == "tempo":
        cfg = load_yaml(COLLECTORS / "tempo.yaml")
        ports = {cfg["server"]["http_listen_port"]}
        for proto in cfg["distributor"]["receivers"]["otlp"]["protocols"].values():
            ports.add(int(proto["endpoint"].rsplit(":", 1)[1]))
        return ports
    if name == "loki":
        return {load_yaml(COLLECTORS / "loki.yaml")["server"]["http_listen_port"]}
    if name == "otelcol":
        return {int(p["endpoint"].rsplit(":", 1)[1])
                for p in otelcol()["receivers"]["otlp"]["protocols"].values()} | {8888}
    return container_ports(service)  # prometheus (9090) and grafana (3000): their defaults


def check_endpoint(where: str, url: str, services: dict) -> list[str]:
    host, port = host_port(url)
    if host not in services:
        return [f"{where}: {url} names {host}, not a service of docker-compose.yaml ({sorted(services)})"]
    if port not in container_ports(services[host]):
        return [f"{where}: {url}: {host} does not expose port {port} ({sorted(container_ports(services[host]))})"]
    if port not in listening_port(host, services[host]):
        return [f"{where}: {url}: {host}'s own configuration does not listen on {port}"]
    return []


def test_datasources_and_dashboard_provider_match_the_compose_file():
    services = compose()["services"]
    problems = []
    uids = {ds["uid"] for ds in provisioned_datasources()}
    for ds in provisioned_datasources():
        problems += check_endpoint(f"datasource {ds['name']}", ds["url"], services)
        j = ds.get("jsonData", {})
        refs = [j.get(k, {}).get("datasourceUid") for k in ("tracesToLogsV2", "tracesToMetrics",
                                                            "serviceMap", "lokiSearch")]
        refs += [d["datasourceUid"] for d in j.get("exemplarTraceIdDestinations", [])]
        problems += [f"datasource {ds['name']} links to {r}, not provisioned" for r in refs if r and r not in uids]
    grafana = services["grafana"]
    mounts = dict(v.split(":")[:2][::-1] for v in grafana["volumes"] if v.startswith("./"))
    assert mounts.get("/etc/grafana/provisioning") == "./grafana/provisioning"
    provider, = load_yaml(PROVISIONING / "dashboards" / "sitsprobe.yaml")["providers"]
    assert mounts.get(provider["options"]["path"]) == "./grafana/dashboards", (provider, mounts)
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(provider["options"]["path"] + "/")
    assert (DASHBOARDS / home.rsplit("/", 1)[1]).is_file()
    assert not problems, "\n".join(problems)


# -- the Collector and the compose file ---------------------------------------------------------


def test_collector_pipeline_components_are_all_defined_and_used():
    cfg = otelcol()
    problems = []
    used = defaultdict(set)
    for name, pipeline in cfg["service"]["pipelines"].items():
        assert name.split("/")[0] in ("traces", "metrics", "logs"), name
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                used[kind].add(component)
                if component not in (cfg.get(kind) or {}):
                    problems.append(f"pipeline {name}: {kind[:-1]} {component} is not defined")
        if pipeline["processors"][0] != "memory_limiter":
            problems.append(f"pipeline {name}: memory_limiter must come first")
        if pipeline["processors"][-1] != "batch":
            problems.append(f"pipeline {name}: batch must come last")
    for kind in ("receivers", "processors", "exporters", "connectors"):
        for component in cfg.get(kind) or {}:
            if component not in used[kind]:
                problems.append(f"{kind[:-1]} {component} is defined but in no pipeline")
    for ext in cfg["service"].get("extensions", []):
        if ext not in cfg.get("extensions", {}):
            problems.append(f"extension {ext} is not defined")
    pipelines = cfg["service"]["pipelines"]
    assert {"traces", "metrics", "logs"} <= set(pipelines)
    assert [e.split("/")[0] for e in pipelines["traces"]["exporters"]] == ["otlp"]
    assert [e.split("/")[0] for e in pipelines["metrics"]["exporters"]] == ["prometheusremotewrite"]
    assert [e.split("/")[0] for e in pipelines["logs"]["exporters"]] == ["otlphttp"]
    assert not problems, "\n".join(problems)


def test_collector_exporters_reach_services_the_compose_file_runs():
    services = compose()["services"]
    problems = []
    for name, exporter in otelcol()["exporters"].items():
        problems += check_endpoint(f"exporter {name}", exporter["endpoint"], services)
        if exporter["endpoint"].startswith("http://") or "tls" in exporter:
            if not exporter.get("tls", {}).get("insecure"):
                problems.append(f"exporter {name}: plain-text endpoint without tls.insecure")
    loki = otelcol()["exporters"]["otlphttp/loki"]["endpoint"]
    assert urlsplit(loki).path == "/otlp", "Loki's native OTLP endpoint (the exporter adds /v1/logs)"
    prw = otelcol()["exporters"]["prometheusremotewrite"]["endpoint"]
    assert urlsplit(prw).path == "/api/v1/write"
    assert "--web.enable-remote-write-receiver" in services["prometheus"]["command"]
    tempo_rw = load_yaml(COLLECTORS / "tempo.yaml")["metrics_generator"]["storage"]["remote_write"]
    problems += [e for rw in tempo_rw for e in check_endpoint("tempo remote_write", rw["url"], services)]
    assert not problems, "\n".join(problems)


def test_collector_receives_on_the_ports_the_compose_file_publishes():
    services = compose()["services"]
    otlp = otelcol()["receivers"]["otlp"]["protocols"]
    published = published_ports(services["otelcol"])
    for proto, want in (("grpc", 4317), ("http", 4318)):
        host, port = otlp[proto]["endpoint"].rsplit(":", 1)
        assert host == "0.0.0.0", f"otlp {proto} must listen on every interface inside its container"
        assert int(port) == want and want in published, (proto, port, published)
    # and nothing else claims the agent's OTLP ports on the host
    for name, service in services.items():
        if name != "otelcol":
            assert not published_ports(service) & {4317, 4318}, name


def test_prometheus_scrapes_the_agent_and_the_collector():
    services = compose()["services"]
    prom = load_yaml(COLLECTORS / "prometheus.yml")
    agent_port = config.load().metrics.port
    targets = {job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
               for job in prom["scrape_configs"]}
    host, port = targets["sitsprobe"][0].rsplit(":", 1)
    assert int(port) == agent_port, "the agent's metrics.port default"
    assert host == "host.docker.internal"
    assert "host.docker.internal:host-gateway" in services["prometheus"]["extra_hosts"]
    problems = []
    for job, ts in targets.items():
        for t in ts:
            if not t.startswith("host.docker.internal:"):
                problems += check_endpoint(f"scrape job {job}", t, services)
    rule_mount = [v for v in services["prometheus"]["volumes"] if v.startswith("./rules:")]
    assert rule_mount and prom["rule_files"][0].startswith(rule_mount[0].split(":")[1] + "/")
    assert not problems, "\n".join(problems)


def test_kubernetes_scrape_example_keeps_the_dashboards_labels():
    job, = load_yaml(COLLECTORS / "prometheus-kubernetes.yml")["scrape_configs"]
    assert job["job_name"] == "sitsprobe"
    for rule in job["relabel_configs"]:
        target = rule.get("target_label")
        assert target is None or target.startswith("__") or target in TARGET_LABELS, (
            f"relabelling to {target}: the dashboards use only {sorted(TARGET_LABELS)} besides "
            "the agent's own labels")


def test_compose_pins_images_and_mounts_files_that_exist():
    services = compose()["services"]
    assert {"otelcol", "tempo", "loki", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (COLLECTORS / source).exists(), f"{name} mounts {source}, which is not in collectors/"
        for dep in service.get("depends_on", []):
            assert dep in services, f"{name} depends on {dep}"
    assert "contrib" in services["otelcol"]["image"]  # transform and prometheusremotewrite live there


def test_every_yaml_file_parses():
    files = sorted([*COLLECTORS.rglob("*.yaml"), *COLLECTORS.rglob("*.yml")])
    assert len(files) >= 9
    for path in files:
        assert isinstance(load_yaml(path), dict), path
