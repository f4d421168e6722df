"""The agent's counters and gauges over OTLP: the same families /metrics
shows, read from the Prometheus registry at each OTLP export (so there is one
source of truth and no second set of instruments to keep in step)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from .otlp import Tally, agent_resource, counted
from .otlp_settings import OtlpSettings, metric_exporter


class OtlpMetricsBridge:
    """``otlp``: the "metrics" signal's settings (:func:`.otlp_settings.settings`)."""

    def __init__(self, registry: CollectorRegistry, otlp: OtlpSettings, interval_s: float = 10.0):
        self.tally = Tally()  # data points, by export result
        exporter = counted(metric_exporter(otlp), self.tally, _points)
        self._registry = registry
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_s * 1000)
        # shut down by the agent, within its stop bound: never by an atexit hook that waits
        self._provider = MeterProvider(metric_readers=[reader], resource=agent_resource(),
                                       shutdown_on_exit=False)
        meter = self._provider.get_meter("sitsprobe")
        for family in registry.collect():
            if family.type == "counter":
                meter.create_observable_counter(family.name + "_total", [self._reader(family.name, "_total")],
                                                description=family.documentation)
            elif family.type == "gauge":
                meter.create_observable_gauge(family.name, [self._reader(family.name, "")],
                                              description=family.documentation)

    def _reader(self, name: str, suffix: str):
        def observe(_options: CallbackOptions):
            for family in self._registry.collect():
                if family.name == name:
                    return [Observation(s.value, dict(s.labels)) for s in family.samples
                            if s.name == name + suffix]
            return []
        return observe

    def shutdown(self) -> None:
        self._provider.shutdown()
        self.tally.close()


def _points(data) -> int:
    return sum(len(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics)
