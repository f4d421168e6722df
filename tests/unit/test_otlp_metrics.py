"""The agent's metrics over OTLP, to a real gRPC receiver: the conventions'
names, units and attributes, histograms as histograms, counters without
_total, and names that the Collector's Prometheus remote write turns back
into exactly the ones /metrics shows."""
from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry

from sitsprobe.export.otlp_metrics import OtlpMetricsBridge, otlp_name
from sitsprobe.export.otlp_settings import resolve
from sitsprobe.export.prom import DURATION_BUCKETS, RequestMetrics
from tests.otlp_receiver import GrpcOtlpReceiver, attributes
from tests.unit.test_semconv_calls import MS, call, grpc, served

# the remote-write translator's unit suffixes (opentelemetry-collector-contrib, prometheus translator)
PROM_UNITS = {"s": "seconds", "By": "bytes", "W": "watts", "Hz": "hertz"}


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """What the Collector's remote write calls an OTLP metric (add_metric_suffixes on)."""
    out = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    suffix = PROM_UNITS.get(unit) or ("ratio" if unit == "1" and kind == "gauge" else "")
    if suffix and not out.endswith("_" + suffix):
        out += "_" + suffix
    return out + "_total" if kind == "sum" and not out.endswith("_total") else out


@pytest.fixture
def exported():
    m = RequestMetrics()
    for r in (served(), served(end_ns=served().start_ns + 300 * MS), served(status=404), call(), grpc(5)):
        m.observe(r)
    registry = CollectorRegistry()
    registry.register(m)
    with GrpcOtlpReceiver() as rx:
        bridge = OtlpMetricsBridge(registry, resolve("metrics", endpoint=rx.endpoint, protocol="grpc", env={}),
                                   interval_s=3600)
        bridge.export()
        bridge.shutdown()  # and once more, the last
        yield registry, rx, bridge


def test_http_server_duration_is_the_conventions_histogram(exported):
    _, rx, _ = exported
    m = rx.metrics.metric("http.server.request.duration")
    assert m is not None and m.unit == "s" and m.HasField("histogram")
    points = {attributes(p.attributes)["http.response.status_code"]: p for p in m.histogram.data_points}
    ok = points[200]
    assert attributes(ok.attributes) == {"process": "api", "http.request.method": "GET",
                                         "http.route": "/v1/items/{id}", "http.response.status_code": 200}
    assert list(ok.explicit_bounds) == list(DURATION_BUCKETS)
    assert ok.count == 2 == sum(ok.bucket_counts) and ok.sum == pytest.approx(0.32)
    assert ok.bucket_counts[DURATION_BUCKETS.index(0.025)] == 1  # 20 ms
    assert ok.bucket_counts[DURATION_BUCKETS.index(0.5)] == 1  # 300 ms
    assert points[404].count == 1
    assert m.histogram.aggregation_temporality == 2  # cumulative


def test_calls_and_grpc_carry_the_conventions_attributes(exported):
    _, rx, _ = exported
    client = rx.metrics.metric("http.client.request.duration").histogram.data_points[0]
    assert attributes(client.attributes) == {"process": "api", "http.request.method": "GET",
                                             "server.address": "10.0.0.7", "server.port": 8080,
                                             "http.response.status_code": 200}
    rpc = rx.metrics.metric("rpc.server.call.duration").histogram.data_points[0]
    assert attributes(rpc.attributes) == {"process": "api", "rpc.system.name": "grpc",
                                          "rpc.method": "shop.v1.Catalog/GetItem",
                                          "rpc.response.status_code": "NOT_FOUND"}


def test_counters_are_monotonic_sums_without_total(exported):
    _, rx, _ = exported
    assert not [n for n in rx.metrics.names() if n.endswith("_total")]
    stitched = rx.metrics.metric("sitsprobe_requests_stitched")
    assert stitched.sum.is_monotonic and stitched.sum.aggregation_temporality == 2
    assert sum(v for _, v in rx.metrics.points("sitsprobe_requests_stitched")) == 5
    assert rx.metrics.metric("sitsprobe_request_bytes").unit == "By"


def test_remote_write_gives_back_the_names_of_the_exposition(exported):
    registry, rx, _ = exported
    shown = {f.name + ("_total" if f.type == "counter" else "") for f in registry.collect() if f.samples}
    sent = {prometheus_name(m.name, m.unit, m.WhichOneof("data"))
            for req in rx.metrics.requests for rm in req.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}
    assert sent == shown
    assert otlp_name("sitsprobe_request_segment_seconds") == ("sitsprobe_request_segment_seconds", "s")


def test_every_point_is_counted_and_the_last_export_comes_at_shutdown(exported):
    _, rx, bridge = exported
    assert len(rx.metrics.requests) == 2  # the one asked for, and shutdown's
    assert bridge.tally.counts().delivered == rx.metrics.point_count() > 0
