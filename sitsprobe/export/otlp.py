"""Requests as OTLP spans: server and client spans, with the engine's stages and
cache look-ups as their children.

The spans are built here, from what :mod:`.semconv` decides, as small
:class:`~.otlp_spans.SpanData` records, and each sink -- one OTLP network
exporter, one OTLP/JSON file -- has one bounded queue and one thread that
encodes and sends them in batches (:class:`_Lane`), every traced process's
spans under its own resource. No SDK span objects, no BatchSpanProcessor:
bench/bench_spans.py has a span of an inference request (35 spans) at 4-7 µs
of agent CPU, encoded for either sink, and a plain HTTP request's one span (27
attributes, most of the cost) at 16-20 µs, where the SDK path took 27-39 and
60-87 µs (2 vCPUs). Sampling is still the SDK's samplers':
``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG``.

Each engine stage is a span of its own, a decode step too (the reference engine
marks one per step, some 30 per request). Folding a run of steps into one span
with an event per step would save a quarter of such a request's protobuf
encoding and more than half of its JSON (bench/bench_spans.py), but take the
steps' spans away from what reads them: the report's stage times (summed per
child span name), the GPU attribution per step
(tests/integration/test_gpu_agent.py), Grafana's links from a decode span to its
GPU's alerts (collectors/README.md). So one span per stage it stays.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import sampling
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState

from sitsprobe import __version__
from sitsprobe.clock import WallClock
from sitsprobe.containers import container_of
from sitsprobe.workloads import Workload
from sitsprobe.request import Request
from sitsprobe.stitch.join import Span, Trace, new_id

from . import otlp_settings
from .otlp_spans import (
    HAS_IS_REMOTE,
    IS_REMOTE,
    OtlpJsonFileExporter,
    SpanData,
    SpanResource,
    network_sink,
    otlp_json,
)
from .semconv import cache_attributes, span_attributes, span_kind, span_name, stage_attributes

__all__ = ["TraceExporter", "Counts", "Tally", "counted", "agent_resource", "sink_name", "within",
           "OtlpJsonFileExporter", "otlp_json"]

log = logging.getLogger(__name__)

MAX_BATCH = 512  # spans per export at most
SEND_DELAY_S = 1.0  # a batch goes out when it is full, else within this long (traces.export_delay_ms)
_KINDS = {kind: kind.value + 1 for kind in SpanKind}  # OTLP's SpanKind numbers (the SDK encoder's rule)
_INTERNAL = _KINDS[SpanKind.INTERNAL]
_NO_PARENT = Context()  # the sampler's parent context for a root
_NO_STATE = TraceState()  # a sampled span's trace state when it has none


class TraceExporter:
    """Exports each :class:`Request` as one span (SERVER, or CLIENT for a call
    the traced process made), with its engine stages and cache look-ups as
    children.

    ``endpoint``/``protocol`` (traces.otlp_endpoint, traces.otlp_protocol) sit
    above the standard ``OTEL_EXPORTER_OTLP_*`` variables, by the rules of
    :mod:`.otlp_settings`; with no endpoint from either, no network exporter is made.
    ``sinks`` lists the exporters in use; with none, :meth:`export` does nothing.
    Sampling is the SDK's sampler's (``OTEL_TRACES_SAMPLER``, by default parent-based:
    a caller's traceparent that is not sampled means no span); a request's
    children follow its span's decision, as every standard sampler decides them.
    Every span handed to a sink is accounted for (:meth:`accounting`):
    ``offered == delivered + dropped (queue_full, export_failed, export_error,
    shutdown) + pending``, and pending is 0 after a flush or a shutdown.
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
        send_delay_s: float = SEND_DELAY_S,
        proc: str = "/proc",
        on_cost: Callable[[float], None] = lambda _cpu_s: None,
        workload_of: Callable[[int], Workload | None] = lambda pid: None,
    ) -> None:
        """``on_cost(seconds)``: the CPU time each batch took to encode and
        send, from the sinks' threads (the sampler's budget counts it).
        ``send_delay_s`` (traces.export_delay_ms): how long a span may wait
        for a batch to fill before its sink is sent what there is.
        ``workload_of(pid)``: the process's pod, container and owner, once known."""
        self._workload_of = workload_of
        self._clock = clock
        self._on_cost = on_cost
        self._proc = proc  # where a traced process's cgroup (its container) is read
        self._queue_size = queue_size
        self._send_delay_s = send_delay_s
        otlp = otlp_settings.settings("traces", endpoint=endpoint, protocol=protocol, headers=headers)
        network = network_sink(otlp) if otlp is not None else None
        file = OtlpJsonFileExporter(traces_file) if traces_file else None
        self.sinks: tuple[SpanExporter, ...] = tuple(s for s in (network, file) if s is not None)
        self._sampler = sampling._get_from_env_or_default()  # the SDK's reading of OTEL_TRACES_SAMPLER(_ARG)
        self._host = socket.gethostname()
        self._resources: dict[tuple[int, str], tuple[SpanResource, bool]] = {}  # -> (it, made with a workload)
        self._lanes: list[_Lane] | None = None  # one per sink, made when first needed
        self._lock = threading.Lock()

    def accounting(self) -> dict[str, Counts]:
        """Per sink ("otlp", "file"), what became of the spans handed to it."""
        with self._lock:
            return {lane.name: lane.counts() for lane in self._lanes_now()}

    def export_trace(self, t: Trace, enrich: Callable[[Request], Request] = lambda r: r) -> None:
        """Every span of a joined trace (stitch.join), with the ids it was given."""
        t.exported = True
        for s in t.spans:
            self.export(enrich(s.req), s, t.flags)

    def export(self, req: Request, place: Span | None = None, flags: int = 1) -> None:
        """One request as a span; with ``place``, under the ids the joiner gave it."""
        if not self.sinks:
            return
        if place is not None and place.parent_id is not None:
            parent = SpanContext(place.trace_id, place.parent_id, is_remote=place.via == "connection",
                                 trace_flags=TraceFlags(flags))
        else:
            parent = _remote_parent(req)
        if parent is not None:
            trace_id = parent.trace_id
        else:
            trace_id = place.trace_id if place is not None else new_id(128)
        name, kind = span_name(req), span_kind(req)
        trace_state = self._decide(parent, trace_id, name, kind)
        if trace_state is None:
            return
        attrs = span_attributes(req)
        if place is not None and place.via is not None:
            attrs["sitsprobe.parent.inferred"] = place.via
        with self._lock:
            if not self.sinks:  # shut down meanwhile
                return
            resource = self._resource_of(req.pid, req.comm)
            lanes = self._lanes_now()
        wall = self._clock.to_wall_ns
        state = trace_state.to_header() if trace_state else ""
        span_id = place.span_id if place is not None else new_id(64)
        spans = self._engine_spans(req, resource, trace_id, span_id, state) if req.inference is not None else []
        flags_out = HAS_IS_REMOTE | IS_REMOTE if parent is not None and parent.is_remote else HAS_IS_REMOTE
        spans.append(SpanData(resource, trace_id, span_id, parent.span_id if parent is not None else 0,
                              flags_out, state, name, _KINDS[kind], wall(req.start_ns), wall(req.end_ns),
                              attrs, req.is_error))
        for lane in lanes:
            lane.offer(spans)

    def _decide(self, parent: SpanContext | None, trace_id: int, name: str,
                kind: SpanKind) -> TraceState | None:
        """The sampler's decision on a span: its trace state if sampled (an
        empty one for none), else None. The standard samplers read no
        attributes, so a span sampled out costs none. The default sampler
        (parent-based, else always on) and always-on are decided here as
        they decide, without the context objects their interface takes."""
        if self._sampler is sampling.ALWAYS_ON or self._sampler is sampling.DEFAULT_ON:
            if parent is None:
                return _NO_STATE
            if self._sampler is sampling.DEFAULT_ON and not parent.trace_flags.sampled:
                return None
            return parent.trace_state
        context = _NO_PARENT if parent is None else \
            trace.set_span_in_context(trace.NonRecordingSpan(parent), _NO_PARENT)
        decision = self._sampler.should_sample(context, trace_id, name, kind)
        if not decision.decision.is_sampled():
            return None
        return decision.trace_state if decision.trace_state is not None else _NO_STATE

    def _engine_spans(self, req: Request, resource: SpanResource, trace_id: int, parent_id: int,
                      state: str) -> list[SpanData]:
        """The engine's stages and cache look-ups, as children of the request's span."""
        wall = self._clock.to_wall_ns
        out = []
        for st, attrs in zip(req.inference.stages, stage_attributes(req)):
            out.append(SpanData(resource, trace_id, new_id(64), parent_id, HAS_IS_REMOTE, state, st.name,
                                _INTERNAL, wall(st.start_ns), wall(st.end_ns), attrs, False))
        for c in req.inference.cache:
            out.append(SpanData(resource, trace_id, new_id(64), parent_id, HAS_IS_REMOTE, state,
                                f"cache_get {c.cache}", _INTERNAL, wall(c.ts_ns), wall(c.ts_ns),
                                cache_attributes(c), False))
        return out

    def force_flush(self, timeout_ms: int = 30_000) -> bool:
        """Send everything queued now; whether it all went (delivered or not) in time."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            lanes = self._lanes_now()
        return all([lane.flush(deadline) for lane in lanes])

    def close_process(self, pid: int) -> None:
        """Forget a process that exited: its queued spans go out now, under the
        resource they were made with, and a new process with its pid gets a
        resource of its own. Never waits: a collector that does not answer
        must not hold up the agent."""
        with self._lock:
            for key in [k for k in self._resources if k[0] == pid]:
                del self._resources[key]
            lanes = self._lanes_now()
        for lane in lanes:
            lane.flush(None)

    def shutdown(self, deadline: float | None = None) -> None:
        """Flush every queue, then close the sinks, by ``deadline``
        (time.monotonic()) at most, None: however long it takes. Spans not
        delivered by then are counted as dropped at shutdown; a sink still
        busy (a collector that accepts and never answers) is left to its
        daemon thread. Later exports are ignored."""
        with self._lock:
            lanes = self._lanes_now()
            sinks, self.sinks = self.sinks, ()
        for lane in lanes:
            lane.stop()
        for lane in lanes:
            lane.join(deadline)
            lane.close()
        within(deadline, [sink.shutdown for sink in sinks])

    def _lanes_now(self) -> list[_Lane]:
        """The sinks' lanes (lock held): made once, from the sinks then in use."""
        if self._lanes is None:
            self._lanes = [_Lane(sink, self._queue_size, self._on_cost, self._send_delay_s)
                           for sink in self.sinks]
        return self._lanes

    def _resource_of(self, pid: int, comm: str) -> SpanResource:
        key = (pid, comm)
        made = self._resources.get(key)
        if made is None or (not made[1] and self._workload_of(pid) is not None):  # its pod became known
            workload = self._workload_of(pid)
            made = self._resources[key] = (SpanResource(self._resource(pid, comm, workload)), workload is not None)
        return made[0]

    def _resource(self, pid: int, comm: str, workload: Workload | None = None) -> Resource:
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
        container = container_of(pid, self._proc)
        if container is not None:  # the OpenTelemetry container and k8s conventions
            defaults["container.id"] = container.id
            if container.runtime:
                defaults["container.runtime"] = container.runtime
            if container.pod_uid:
                defaults["k8s.pod.uid"] = container.pod_uid
        if workload is not None:  # k8s.* and service.name from the workload (sitsprobe.workloads)
            defaults.update(workload.attributes())
        return Resource.create({k: v for k, v in defaults.items() if k not in from_env})


def agent_resource() -> Resource:
    """The agent's own resource, for its metrics and alerts: service.name
    "sitsprobe" and one stable instance per node (the node's name where the
    environment gives one, as the Helm chart does), so a restarted agent
    continues its series instead of starting new ones under a random id."""
    from_env = OTELResourceDetector().detect().attributes
    node = from_env.get("k8s.node.name") or from_env.get("host.name") or socket.gethostname()
    defaults = {"service.instance.id": str(node), "host.name": socket.gethostname()}
    return Resource.create({"service.name": "sitsprobe",
                            **{k: v for k, v in defaults.items() if k not in from_env}})


def _remote_parent(req: Request) -> SpanContext | None:
    """The caller's span from its traceparent; None (a new root) without, or with an invalid one."""
    tp = req.traceparent
    if tp is None:
        return None
    state = TraceState.from_header([req.tracestate]) if req.tracestate else None
    ctx = SpanContext(tp.trace_id, tp.span_id, is_remote=True, trace_flags=TraceFlags(tp.flags),
                      trace_state=state)
    return ctx if ctx.is_valid else None


class _Lane:
    """One sink's bounded queue of spans and the daemon thread (started with
    the first span) that sends them: up to MAX_BATCH spans per export, as soon
    as that many wait, else within ``send_delay_s``, or at once when flushed. It counts
    every span it is offered: turned away by the full queue (``queue_size``
    spans queued or in flight), or what the sink did with it. Once closed
    (the agent stopped), whatever was pending is dropped at shutdown and
    later results are not counted."""

    def __init__(self, sink: SpanExporter, queue_size: int,
                 on_cost: Callable[[float], None] = lambda _cpu_s: None,
                 send_delay_s: float = SEND_DELAY_S) -> None:
        self.sink = sink
        self._send_delay_s = send_delay_s
        self._on_cost = on_cost
        self.name = sink_name(sink)
        self._size = queue_size
        self._queue: deque[list[SpanData]] = deque()  # a request's spans per entry
        self._counts = Counts()
        self._waiting = 0  # spans queued or in flight
        self._queued = 0  # of those, queued
        self._taken = 0  # spans ever taken off the queue; and all of them whose export returned:
        self._done = 0
        self._flush_to = 0  # send without waiting until this many have been taken
        self._stopping = self._closed = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def offer(self, spans: list[SpanData]) -> None:
        n = len(spans)
        with self._cond:
            if self._stopping:
                return
            self._counts.offered += n
            room = self._size - self._waiting
            if n > room:
                self._counts.queue_full += n - room
                spans = spans[:room]
            if spans:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=f"otlp-{self.name}", daemon=True)
                    self._thread.start()
                self._queue.append(spans)
                self._queued += len(spans)
                self._waiting += len(spans)
                if self._queued >= MAX_BATCH:
                    self._cond.notify_all()

    def counts(self) -> Counts:
        with self._cond:
            return self._counts.copy()

    def flush(self, deadline: float | None) -> bool:
        """Send what is queued now, and wait until its export returns or
        ``deadline`` (time.monotonic()) passes; None: do not wait."""
        with self._cond:
            target = self._taken + self._queued
            self._flush_to = max(self._flush_to, target)
            self._cond.notify_all()
            if deadline is None:
                return False
            return self._cond.wait_for(lambda: self._done >= target or self._closed,
                                       max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Take no more spans; send what is queued, then let the thread end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self, deadline: float | None) -> None:
        if self._thread is not None:
            self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """The final counts: whatever is still pending was dropped at shutdown."""
        with self._cond:
            if not self._closed:
                self._closed = True
                self._counts.shutdown += self._waiting
                self._waiting = self._queued = 0
                self._queue.clear()
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(self._due, self._send_delay_s)
                batch = self._take()
                if not batch and (self._stopping or self._closed):
                    return
            if batch:
                self._send(batch)

    def _due(self) -> bool:
        return self._queued >= MAX_BATCH or self._flush_to > self._taken or self._stopping

    def _take(self) -> list[SpanData]:
        """Up to MAX_BATCH spans off the queue (lock held)."""
        batch: list[SpanData] = []
        while self._queue and len(batch) < MAX_BATCH:
            spans = self._queue.popleft()
            room = MAX_BATCH - len(batch)
            if len(spans) > room:  # a long request: the rest goes in the next batch
                self._queue.appendleft(spans[room:])
                spans = spans[:room]
            batch += spans
        self._queued -= len(batch)
        self._taken += len(batch)
        return batch

    def _send(self, batch: list[SpanData]) -> None:
        began = time.thread_time()
        try:
            result = self.sink.export(batch)
        except Exception as e:  # an exporter's bug must not kill the thread
            log.warning("span export raised %s: %s", type(e).__name__, e)
            result = None
        self._on_cost(time.thread_time() - began)
        n = len(batch)
        with self._cond:
            self._done += n
            if not self._closed:
                self._waiting -= n
                c = self._counts
                if result == SpanExportResult.SUCCESS:
                    c.delivered += n
                elif result is None:
                    c.export_error += n
                else:
                    c.export_failed += n
            self._cond.notify_all()


@dataclass
class Counts:
    """What became of the spans offered to one sink."""

    offered: int = 0
    delivered: int = 0
    queue_full: int = 0  # the sink's queue held queue_size spans already
    export_failed: int = 0  # the sink answered failure (after the exporter's own retries)
    export_error: int = 0  # the sink raised
    shutdown: int = 0  # still queued or in flight when the agent stopped

    REASONS = ("queue_full", "export_failed", "export_error", "shutdown")

    @property
    def pending(self) -> int:
        return self.offered - self.delivered - sum(getattr(self, r) for r in self.REASONS)

    def copy(self) -> Counts:
        return replace(self)


class Tally:
    """Counts for one signal's exporter (metric points, log records): what
    was offered, and each export's result. Closed when the agent stops:
    whatever is pending then was dropped at shutdown, and later results of
    exports still in flight are not counted."""

    def __init__(self) -> None:
        self._counts = Counts()
        self._closed = False
        self._lock = threading.Lock()

    def offer(self, n: int) -> None:
        with self._lock:
            if not self._closed:
                self._counts.offered += n

    def result(self, n: int, outcome: str) -> None:
        with self._lock:
            if not self._closed:
                setattr(self._counts, outcome, getattr(self._counts, outcome) + n)

    def counts(self) -> Counts:
        with self._lock:
            return self._counts.copy()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._counts.shutdown = self._counts.pending


def counted(exporter, tally: Tally, size, offer: bool = True):
    """``exporter`` with its export() counting each batch's items (``size(batch)``)
    into ``tally`` by result; with ``offer``, as offered too (else the caller
    offers them, when it hands them over)."""
    inner = exporter.export

    def export(batch, *args, **kwargs):
        n = size(batch)
        if offer:
            tally.offer(n)
        try:
            result = inner(batch, *args, **kwargs)
        except Exception:
            tally.result(n, "export_error")
            raise
        tally.result(n, "delivered" if getattr(result, "name", "") == "SUCCESS" else "export_failed")
        return result

    exporter.export = export
    return exporter


def sink_name(sink: SpanExporter) -> str:
    """The name a trace sink's counts go by: "file" or "otlp"."""
    return "file" if isinstance(sink, OtlpJsonFileExporter) else "otlp"


def within(deadline: float | None, calls: list) -> None:
    """Run ``calls`` one after another in a daemon thread and wait for them
    until ``deadline`` (time.monotonic()), or for ever with None."""
    if not calls:
        return
    t = threading.Thread(target=lambda: [c() for c in calls], name="otlp-shutdown", daemon=True)
    t.start()
    t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
