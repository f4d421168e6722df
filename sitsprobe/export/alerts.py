"""Alerts out: OTLP log records (and the agent's own log) for each raised or
cleared GPU utilization collapse."""
from __future__ import annotations

import json
import logging

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

from ..clock import WallClock
from ..gpu.collapse import RAISED, Alert
from .otlp import Tally, agent_resource, counted
from .otlp_settings import OtlpSettings, log_exporter

log = logging.getLogger("sitsprobe")


class AlertExporter:
    """``otlp``: the "logs" signal's settings (:func:`.otlp_settings.settings`);
    None: alerts go to the agent's own log only."""

    def __init__(self, clock: WallClock, otlp: OtlpSettings | None):
        self._clock = clock
        self._provider = None
        self.tally: Tally | None = None  # log records, offered at emit(), by export result
        if otlp is not None:
            self.tally = Tally()
            exporter = counted(log_exporter(otlp), self.tally, len, offer=False)
            # shut down by the agent, within its stop bound: never by an atexit hook that waits
            self._provider = LoggerProvider(resource=agent_resource(), shutdown_on_exit=False)
            self._provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
            self._logger = self._provider.get_logger("sitsprobe.alerts")
        self.sent = 0

    def emit(self, a: Alert, process: str = "") -> None:
        raised = a.state == RAISED
        body = (f"GPU {a.gpu} utilization collapse {'raised' if raised else 'cleared'}: {a.cause}"
                + (f" ({process}[{a.pid}])" if a.pid else ""))
        log.log(logging.WARNING if raised else logging.INFO, "%s %s", body,
                json.dumps(a.evidence, default=str, sort_keys=True))
        if self._provider is None:
            return
        self._logger.emit(
            timestamp=self._clock.to_wall_ns(a.window_end_ns),
            severity_number=SeverityNumber.WARN if raised else SeverityNumber.INFO,
            severity_text="WARN" if raised else "INFO",
            body=body,
            event_name="sitsprobe.gpu.utilization_collapse",
            attributes={
                "gpu": a.gpu, "process.pid": a.pid, "sitsprobe.cause": a.cause,
                "sitsprobe.alert.state": a.state,
                "sitsprobe.evidence": json.dumps(a.evidence, default=str, sort_keys=True),
                "sitsprobe.window.start": self._clock.to_wall_ns(a.window_start_ns),
                "sitsprobe.window.end": self._clock.to_wall_ns(a.window_end_ns),
                **({"process.executable.name": process} if process else {}),
            })
        self.tally.offer(1)
        self.sent += 1

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
            self.tally.close()
