"""The agent's metrics over OTLP: the same families /metrics shows, read from
the Prometheus registry at each export (one source of truth, no second set of
instruments to keep in step), translated to OpenTelemetry's spelling.

A family the conventions name goes out under the conventions' metric name and
unit (``http_server_request_duration_seconds`` -> ``http.server.request.duration``,
``s``), its labels as the conventions' attributes (``http_request_method`` ->
``http.request.method``); sitsprobe's own keep their names, with the unit
their suffix says. Histograms are histograms, counters monotonic sums without
``_total``, all cumulative from the agent's start. The Collector's Prometheus
remote write turns each back into the name /metrics gives it."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from opentelemetry.sdk.metrics.export import (AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
                                              Metric, MetricsData, NumberDataPoint, ResourceMetrics,
                                              ScopeMetrics, Sum)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry

from .otlp import Tally, agent_resource, counted
from .otlp_settings import OtlpSettings, metric_exporter
from .semconv import LABEL_ATTRIBUTES, OTLP_NAMES, SERVER_PORT, STATUS

log = logging.getLogger("sitsprobe")
CUMULATIVE = AggregationTemporality.CUMULATIVE
UNITS = (("_seconds", "s"), ("_bytes", "By"), ("_ratio", "1"), ("_watts", "W"), ("_hertz", "Hz"))
_INTEGERS = frozenset({LABEL_ATTRIBUTES[STATUS], LABEL_ATTRIBUTES[SERVER_PORT]})  # int-valued attributes


def otlp_name(family: str) -> tuple[str, str]:
    """(the OTLP metric name, its unit) of a Prometheus family."""
    if family in OTLP_NAMES:
        return OTLP_NAMES[family]
    return family, next((unit for suffix, unit in UNITS if family.endswith(suffix)), "")


def attributes(labels: dict[str, str]) -> dict[str, str | int]:
    """A sample's labels as OTLP attributes; an empty label is no label, as in Prometheus."""
    out: dict[str, str | int] = {}
    for label, value in labels.items():
        if value == "":
            continue
        key = LABEL_ATTRIBUTES.get(label, label)
        out[key] = int(value) if key in _INTEGERS and value.isdigit() else value
    return out


def translate(families: Iterable, start_ns: int, now_ns: int) -> list[Metric]:
    """prometheus_client families (registry.collect()) as OTLP metrics."""
    out = []
    for family in families:
        name, unit = otlp_name(family.name)
        if family.type == "counter":
            points = [NumberDataPoint(attributes(s.labels), start_ns, now_ns, s.value)
                      for s in family.samples if s.name == family.name + "_total"]
            data = Sum(points, CUMULATIVE, is_monotonic=True)
        elif family.type in ("gauge", "info"):
            data = Gauge([NumberDataPoint(attributes(s.labels), start_ns, now_ns, s.value)
                          for s in family.samples if s.name in (family.name, family.name + "_info")])
        elif family.type == "histogram":
            data = Histogram(_histogram_points(family, start_ns, now_ns), CUMULATIVE)
        else:
            continue
        if data.data_points:
            out.append(Metric(name, family.documentation, unit, data))
    return out


def _histogram_points(family, start_ns: int, now_ns: int) -> list[HistogramDataPoint]:
    series: dict[tuple, dict] = {}  # labels but le -> its buckets, count, sum
    for s in family.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        h = series.setdefault(tuple(sorted(labels.items())), {"labels": labels, "le": [], "sum": 0.0})
        if s.name == family.name + "_bucket":
            h["le"].append((float(s.labels["le"]), s.value))
        elif s.name == family.name + "_sum":
            h["sum"] = s.value
    points = []
    for h in series.values():
        cumulative = sorted(h["le"])
        counts = [int(n - before) for n, before in zip((n for _, n in cumulative),
                                                      (0, *(n for _, n in cumulative[:-1])))]
        bounds = [le for le, _ in cumulative if le != float("inf")]
        total = int(cumulative[-1][1]) if cumulative else 0
        points.append(HistogramDataPoint(attributes(h["labels"]), start_ns, now_ns, total, h["sum"],
                                         counts, bounds, min=None, max=None))
    return points


class OtlpMetricsBridge:
    """``otlp``: the "metrics" signal's settings (:func:`.otlp_settings.settings`).
    Exports every ``interval_s`` from a thread of its own, and once more at shutdown."""

    def __init__(self, registry: CollectorRegistry, otlp: OtlpSettings, interval_s: float = 10.0):
        self.tally = Tally()  # data points, by export result
        self._exporter = counted(metric_exporter(otlp), self.tally, _points)
        self._registry = registry
        self._resource = agent_resource()
        self._scope = InstrumentationScope("sitsprobe")
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()  # one export at a time: the timer's or the last one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), name="otlp-metrics", daemon=True)
        self._thread.start()

    def snapshot(self) -> MetricsData:
        metrics = translate(self._registry.collect(), self._start_ns, time.time_ns())
        return MetricsData([ResourceMetrics(self._resource, [ScopeMetrics(self._scope, metrics, "")], "")])

    def export(self) -> None:
        with self._lock:
            try:
                self._exporter.export(self.snapshot())
            except Exception:  # counted as export_error; the next interval tries again
                log.debug("OTLP metrics export failed", exc_info=True)

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.export()

    def shutdown(self) -> None:
        """The last export, then the exporter's shutdown (the agent bounds the wait)."""
        self._stop.set()
        self._thread.join()
        self.export()
        self._exporter.shutdown()
        self.tally.close()


def _points(data: MetricsData) -> int:
    return sum(len(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics)
