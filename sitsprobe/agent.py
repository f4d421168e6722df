"""The agent: load the probes, follow the selected processes, stitch, export."""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
import time
from dataclasses import replace

from prometheus_client import CollectorRegistry

from . import procs, tracefs
from .clock import WallClock
from .config import Config
from .containers import Container, container_of
from .errors import ProbeAttachError, SitsprobeError
from .events import CF_BINNED, Chunk, Exchange, MarkerEvent, ProcessNotice
from .export import otlp_settings
from .export.otlp import TraceExporter, within
from .export.prom import (
    FOLDED,
    PROCESS,
    Http2Metrics,
    JoinMetrics,
    KernelMetrics,
    LabelCap,
    RequestMetrics,
    SignalAccounting,
    SpanAccounting,
    serve,
)
from .export.semconv import is_client, span_attributes
from .losses import LossLog, loss_totals
from .probes.retry import Retry, refused_for_now
from .report.recent import Recent
from .report.records import RequestRecord
from .report.tables import kept_attributes
from .request import Request
from .routes import RouteMapper
from .sampling import CpuMeter, TraceSampler
from .stitch import genai
from .stitch.engine import EngineJoin
from .stitch.exchange import Stitcher, enrich, exited
from .stitch.join import Joiner, Trace
from .stitch.protocols.http2_payload import Limits
from .stitch.streams import StreamStitcher
from .stitch.protocols import http1, resp
from .stitch.segments import StageSegments, segments

log = logging.getLogger("sitsprobe")


TLS_LOOK_EVERY_S = 2.0  # a traced process without libssl mapped: looked at again this often
EXIT_WAIT_S = 1.0  # an exit heard waits this long at most for the rings to be drained

def selector_of(config: Config) -> procs.Selector:
    """select.*; with none of it set, the processes the cache probes name:
    their pid, their process selector, or the program they probe (a probe on
    a library names none)."""
    s = config.select
    chosen = procs.Selector(pids=s.pids, comms=s.comms, cmdline=s.cmdline, ports=s.ports)
    if not chosen.empty():
        return chosen
    pids, comms, cmdline = [], [], []
    for p in config.cache.probes:
        if p.pid != -1:
            pids.append(p.pid)
        elif p.process is not None:
            pids += p.process.pids
            comms += p.process.comms
            cmdline += p.process.cmdline
        elif p.binary and ".so" not in os.path.basename(p.binary) and ("/" in p.binary or shutil.which(p.binary)):
            comms.append(os.path.basename(p.binary)[:15])
    return procs.Selector(pids=tuple(dict.fromkeys(pids)), comms=tuple(dict.fromkeys(comms)),
                          cmdline=tuple(dict.fromkeys(cmdline)))


class Agent:
    def __init__(self, config: Config, gpu_backend=None, net_ahead=None):
        """gpu_backend: the NVML boundary (None: the real libnvidia-ml); tests
        and replays pass a sitsprobe.gpu.recorded.RecordedBackend. net_ahead:
        net.c's compile, begun already (probes.ahead.NetAhead); else start()
        begins it."""
        self.config = config
        self._gpu_backend = gpu_backend
        self._net_ahead = net_ahead
        self.selector = selector_of(config)
        self._scan = procs.Rescan(self.selector, memo=procs.ListenMemo())
        self._notices_lost = 0
        self._exited: dict[int, float] = {}  # processes gone -> when heard, retired once the rings are drained
        if self.selector.empty():
            raise SitsprobeError(
                "nothing to trace: give --pid, --comm, --cmdline or --port, or a --cache-probe "
                "on a program, or set select.* in the config file")
        self.clock = WallClock()
        self.metrics = RequestMetrics(self._series_labels())
        self.metrics.who_of = lambda r: self._who(r.pid, r.comm)
        self._pod_of: dict[int, tuple[str, ...]] = {}  # pid -> its pod's values of the labels, once known
        self._pods_named = LabelCap(config.kubernetes.max_pods, FOLDED)  # pods the series name
        self.sampler = TraceSampler(config.traces.max_per_second, config.traces.keep_slowest,
                                    cpu_budget=config.traces.cpu_budget)
        self.joiner = Joiner(config.stitch.join_wait_ms * 1_000_000)
        self._tls_next: dict[int, float] = {}  # pid -> when to look for its libssl again
        self._tls_said: set[int] = set()  # pids whose opaque TLS the log explained
        routes = RouteMapper(list(config.routes.templates), config.routes.collapse_ids, config.routes.max_routes)
        cap = config.capture
        self.stitcher = Stitcher(routes, writes_per_exchange=cap.max_writes)
        self.streams = StreamStitcher(
            routes, lambda pid: self.tracked.get(pid, "?"),
            Limits(cap.body_bytes, cap.tail_bytes, cap.write_peek_bytes, cap.max_writes) if cap.genai else None,
            cap.max_payloads)
        self.engine = EngineJoin(config.engine.join_wait_ms * 1_000_000)
        self.recent = Recent(config.report.recent_requests) if config.report.recent_requests else None
        self._report_keep = kept_attributes(config.report.windows)
        e = config.engine
        self._stage_segments = StageSegments(e.scheduling_stages, e.io_stages, e.cache_stages,
                                             e.network_stages)
        self._redact = frozenset(cap.redact_headers)
        self._keep_query = frozenset(cap.keep_query_params)
        self.tracked: dict[int, str] = {}  # pid -> comm
        self._thread_names: dict[tuple[int, str], str] = {}  # (pid, a thread's comm) -> the process's
        self.names = procs.Names()  # pid -> comm: the traced, and the last few thousand that exited
        # the kernel's counts of processes that exited, by name: (name, status) -> responses
        self._exited_status: dict[tuple[str, int], int] = {}
        self._exited_untracked: dict[str, int] = {}
        self.containers: dict[int, Container | None] = {}  # tracked pid -> its container
        self.hooks: dict[str, str] = {}
        self.ready = False
        self.requests_seen = 0
        # what tracing costs this thread, charged to the sampler's budget;
        # _metering: inside an exchange whose every cost is tracing's
        self._tracing_cpu, self._metering = CpuMeter(self.sampler.charge), False
        self._shapes: dict[int, tuple[str, str] | None] = {}  # the kernel's shape -> (method, route)
        self.probe = None
        self.markers = None
        self._rings = None  # RingWait over every probe's rings, from start()
        # engines whose markers library could not be probed: for good (None), or refused
        # by the kernel for the moment and tried again when its Retry is due
        self._unprobed: dict[int, Retry | None] = {}
        self.cache = None  # CacheProbe
        self.cache_stats = None
        self.gpu = None
        self.otlp_metrics = None
        self.workloads = None
        self._runtime_node: str | None = None  # with no API: the node whose runtime state names pods
        self._runtime_pods: dict[str, object] = {}  # container id -> its Workload from that state, or None
        self._host_root = None  # where that state is read (runtime_state.host_root)
        self._final_sampled: dict[str, int] = {}
        self.exporter = None
        self.http = None
        self.losses = LossLog(lambda: loss_totals(
            self._counters(), self.cache_stats and self.cache_stats.kernel))

    # -- start-up -----------------------------------------------------------------

    def otlp(self, signal: str):
        """Where ``signal`` ("metrics", "logs") goes over OTLP, by the rules the
        traces follow too: traces.otlp_* above the OTEL_EXPORTER_OTLP_* variables;
        None when no endpoint is set for it."""
        t = self.config.traces
        return otlp_settings.settings(signal, endpoint=t.otlp_endpoint, protocol=t.otlp_protocol)

    def start(self) -> None:
        from .probes.ahead import NetAhead
        from .probes.memory import release_compiler
        from .probes.net import NetProbe
        from .probes.net_plan import load_net
        from .probes.ring import RingWait

        mounted = tracefs.ensure_mounted()
        if mounted:
            log.info("mounted %s", ", ".join(mounted))
        ahead = self._net_ahead = self._net_ahead or NetAhead(self.config)
        try:
            net, self.probe = load_net(self.config, lambda flags: NetProbe(
                flags, self._on_exchange, self._on_notice, self._process_name, self.stitcher.on_beat,
                self._on_chunk, compiled=ahead.take(flags), kept=ahead.kept))
        finally:
            ahead.close()  # a compile for a guess the probe belied goes
        self.hooks = {point: str(h) for point, h in net.hooks.items() if h}
        self._rings = RingWait(self.probe.ring_fds())
        if self.probe.bins is not None:
            self.metrics.bins = self._bin_rows  # read at every scrape
            self._kernel_sampling()
            log.info("plain HTTP/1.x requests are counted in the kernel once their route is known; "
                     "only those chosen for a trace reach the agent (stitch.kernel_bins)")
        self.workloads = self._start_workloads()
        t = self.config.traces
        self.exporter = TraceExporter(clock=self.clock, endpoint=t.otlp_endpoint,
                                      protocol=t.otlp_protocol, traces_file=t.file,
                                      on_cost=self.sampler.charge, workload_of=self.workload_of,
                                      send_delay_s=t.export_delay_ms / 1000)
        registry = CollectorRegistry()
        self._start_cache(registry)
        if self.config.gpu.enabled:
            self._start_gpu(registry)
        self._register_metrics(registry)
        if self.config.metrics.port:
            self._serve_metrics(registry)
        if (otlp := self.otlp("metrics")) is not None:
            from .export.otlp_metrics import OtlpMetricsBridge
            self.otlp_metrics = OtlpMetricsBridge(registry, otlp,
                                                  self.config.traces.metrics_interval_s)
        self.probe.select_ports(self.config.select.ports)
        self._rescan()
        release_compiler()  # every program is loaded: the compiler's pages and heap go
        self.ready = True
        log.info("tracing %d process(es): %s", len(self.tracked),
                 ", ".join(f"{c}[{p}]" for p, c in sorted(self.tracked.items())) or "none yet")

    def _start_workloads(self):
        """The watch of this node's pods (sitsprobe.workloads), or None, said once."""
        from . import workloads

        k = self.config.kubernetes
        if k.metadata == "off":
            return None
        where = workloads.api_configured()
        fallback = ("pods are named from the container runtime's state on the host (containerd, CRI-O) "
                    "where it is readable, else known by the UID and container id in their cgroups")
        if where is None:
            log.log(logging.WARNING if k.metadata == "on" else logging.INFO,
                    "no Kubernetes API here (no service account, no $KUBECONFIG): %s", fallback)
            self._runtime_node = workloads.node_name(k.node_name)
            return None
        w = workloads.Workloads(workloads.node_name(k.node_name), k.pod_labels)
        try:
            w.start()
        except Exception as e:  # a kubeconfig that does not load
            log.warning("Kubernetes API (%s) not usable: %s; %s", where, e, fallback)
            self._runtime_node = w.node
            return None
        log.info("pods of node %s named from the Kubernetes API (%s)", w.node, where)
        return w

    def _series_labels(self) -> tuple[str, ...]:
        """Whose a request series is: process and, with pod metadata
        (kubernetes.metadata), the pod's labels kubernetes.metric_labels names."""
        from .workloads import api_configured
        k = self.config.kubernetes
        on = k.metadata == "on" or (k.metadata == "auto" and api_configured() is not None)
        return PROCESS + k.metric_labels if on else PROCESS

    def _who(self, pid: int, comm: str) -> tuple[str, ...]:
        """A process's values of the series' labels (RequestMetrics.labels);
        past kubernetes.max_pods pods, a new one's name is _other."""
        labels = self.metrics.labels[1:]
        if not labels:
            return (comm,)
        pod = self._pod_of.get(pid)
        if pod is None:
            w = self.workload_of(pid)
            if w is None:
                return (comm, *("",) * len(labels))
            values = {"namespace": w.namespace, "pod": self._pods_named("", w.pod), "container": w.container,
                      "owner": f"{w.owner_kind}/{w.owner_name}" if w.owner_kind else ""}
            pod = self._pod_of[pid] = tuple(values[name] for name in labels)
        return (comm, *pod)

    def workload_of(self, pid: int):
        """The traced process's pod, container and owner, once the API has named
        them; with no API, what its container runtime's state says (no owner)."""
        c = self.containers.get(pid)
        if self.workloads is not None:
            return self.workloads.of(c)
        if self._runtime_node is None or c is None:
            return None
        if c.id not in self._runtime_pods:
            from .runtime_state import host_root, runtime_workload
            if self._host_root is None:
                self._host_root = host_root()
            if len(self._runtime_pods) >= 4096:  # containers come and go
                self._runtime_pods.clear()
            self._runtime_pods[c.id] = runtime_workload(c, self._runtime_node, self._host_root)
        return self._runtime_pods[c.id]

    def _start_cache(self, registry: CollectorRegistry) -> None:
        """Cache look-ups from every source (probes, RESP bytes, engine markers) in one table."""
        c = self.config.cache
        from .cache import CacheStats, PrefixExtractor
        self.cache_stats = CacheStats(
            PrefixExtractor(c.prefix_delimiter, c.prefix_segments, c.prefix_regex,
                            c.hash_prefixes, c.export_raw_keys),
            top_k=c.top_prefixes, bucket_s=c.bucket_s, subnet_v4=c.subnet_v4, subnet_v6=c.subnet_v6)
        if c.probes:
            from .probes.cache import CacheProbe
            self.cache = CacheProbe(c.probes, self.cache_stats.observe)
            self.cache_stats.kernel = self.cache.kernel_counts
            self._rings.add(self.cache.ring_fds())
            self.hooks.update(self.cache.hooks())
        registry.register(self.cache_stats)

    def heatmap_png(self) -> bytes:
        import io

        from .cache import render_png
        buf = io.BytesIO()
        render_png(self.cache_stats, buf, clock=self.clock)
        return buf.getvalue()

    def heatmap_text(self) -> bytes:
        from .cache import render_text
        return render_text(self.cache_stats).encode()

    def alerts_json(self) -> bytes:
        """The GPU alerts raised now, with their evidence (what `sitsprobe top` shows)."""
        active = self.gpu.detector.active() if self.gpu is not None else {}
        return json.dumps([
            {"gpu": a.gpu, "pid": a.pid, "process": self.names.get(a.pid, "") if a.pid else "",
             "cause": a.cause, "since_unix": self.clock.to_wall_ns(a.window_start_ns) / 1e9,
             "evidence": a.evidence}
            for _, a in sorted(active.items())], default=str).encode()

    def _start_gpu(self, registry: CollectorRegistry) -> None:
        from .export.alerts import AlertExporter
        from .gpu import CollapseConfig
        from .gpuwatch import GpuWatch
        from .probes.cuda import cflags as cuda_cflags

        g = self.config.gpu
        self.gpu = GpuWatch(
            clock=self.clock, name_of=lambda pid: self.names.get(pid, "?"),
            interval_s=g.interval_ms / 1000, cuda_probes=g.cuda_probes,
            collapse=CollapseConfig(drop_ratio=g.collapse_drop_ratio,
                                    floor_percent=g.collapse_floor_percent,
                                    sustain_s=g.collapse_sustain_s, clear_s=g.collapse_clear_s,
                                    min_working_percent=g.collapse_min_working_percent,
                                    min_history_s=g.collapse_min_history_s),
            alerts=AlertExporter(self.clock, self.otlp("logs")),
            backend=self._gpu_backend)
        if not self.gpu.start(registry, cuda_cflags()):
            self.gpu.close()  # nothing to sample: no request pays for a GPU lookup
            self.gpu = None
            log.info("GPU layer off: spans carry no GPU attributes, no collapse alerts")
            return
        if self.gpu.cuda is not None:
            self.hooks["cuda"] = "uprobe libcudart/libcuda"

    def _register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(self.metrics)
        registry.register(SpanAccounting(self.exporter.accounting))
        registry.register(Http2Metrics(self.streams.counts))
        registry.register(JoinMetrics(lambda: dict(self.joiner.joined), lambda: self.joiner.timed_out,
                                      lambda: {pid: (self.tracked.get(pid, "?"), lib)
                                               for pid, lib in self.probe.tls.covered.items()}))
        registry.register(SignalAccounting(self._signal_tallies))
        registry.register(KernelMetrics(
            self._counters, self._status_rows, self._gauges,
            lambda: {**self._sampled(),
                     **({"budget_per_second": b} if math.isfinite(b := self.sampler.budget_per_second)
                        else {}),  # no budget: no gauge (OTLP takes no infinity)
                     "cost_per_trace_seconds": self.sampler.cost_per_trace,
                     "cpu_seconds": self.sampler.cpu_seconds},
            lambda: dict(self.tracked), self.containers.get, self._untracked_rows, self.workload_of))

    def _sampled(self) -> dict[str, int]:
        """What became of the requests seen: the sampler's counts, and the
        requests the kernel counted and kept (no trace chosen) as sampled out."""
        unsent = self.probe.counters()["unsent"] if self.probe is not None and self.probe.bins else 0
        s = self.sampler
        return {"seen": s.seen + unsent, "sampled": s.exported, "sampled_out": s.dropped + unsent}

    def _serve_metrics(self, registry: CollectorRegistry) -> None:
        m = self.config.metrics
        try:
            pages = {"/heatmap.png": ("image/png", lambda _query: self.heatmap_png()),
                     "/heatmap.txt": ("text/plain; charset=utf-8", lambda _query: self.heatmap_text()),
                     "/alerts.json": ("application/json", lambda _query: self.alerts_json()),
                     "/report/requests.json": ("application/json", self.recent_json)}
            self.http = serve(registry, m.address, m.port, lambda: self.ready, pages)
        except OSError as e:
            raise SitsprobeError(f"cannot serve metrics on {m.address}:{m.port}: {e.strerror}; "
                                 "set --metrics-port (0 disables it)") from e

    def _counters(self) -> dict[str, int]:
        counters = self.probe.counters() | {"writes_unheld": self.stitcher.writes_dropped}
        if self.markers is not None:
            counters |= {f"marker_{k}": v for k, v in self.markers.counters().items()}
        return counters

    def _gauges(self) -> dict[str, float]:
        return {"probes_attached": len(self.hooks) if self.ready else 0,
                "tracked_processes": len(self.tracked),
                "gpu_sampling": int(self.gpu is not None and self.gpu.sampler is not None)}

    # -- processes ----------------------------------------------------------------

    def _track(self, info: procs.ProcInfo, tls: bool = True) -> None:
        self.probe.track(info.pid)
        if tls:
            self._tls(info.pid, time.monotonic())
        tables: dict = {}  # the namespace's listening sockets, read once for both
        listening = procs.listening_ports(info.pid, tables=tables)
        # a connection whose local port nothing listens on was opened, not accepted (one accepted
        # from a listener another process holds is neither, and left alone)
        listened = procs.ports_listened_on(info.pid, tables=tables) if self.config.stitch.outgoing else None
        seeded, dialed = set(), 0
        for fd, local, peer in procs.established(info.pid):
            if local.port in listening:  # a server-side connection made before we started
                self.probe.seed(info.pid, fd, info.comm, local, peer)
                seeded.add(fd)
            elif listened is not None and local.port not in listened:  # its pool of upstream connections
                self.probe.seed(info.pid, fd, info.comm, local, peer, client=True)
                dialed += 1
        # threads already waiting in a read on them: their next request is framed too
        reads = procs.blocked_reads(info.pid, seeded) if seeded else []
        adopted = self.probe.adopt_reads(
            info.pid, reads, lambda: procs.blocked_reads(info.pid, seeded)) if reads else 0
        log.info("tracking %s[%d]%s", info.comm, info.pid,
                 f": {len(seeded)} connection(s) from before, {adopted} read(s) in progress"
                 if seeded else "")
        if dialed:
            log.info("%s[%d]: %d connection(s) it opened before, followed as a client's", info.comm,
                     info.pid, dialed)
        # tracked (as /metrics shows it) once its connections from before are followed too
        self.containers[info.pid] = container_of(info.pid)
        self.tracked[info.pid] = self.names[info.pid] = info.comm

    def _tls(self, pid: int, now: float) -> None:
        """Read pid's TLS through its libssl, if it maps one yet (Python loads
        ssl when first imported): looked for again every few seconds until then."""
        if not self.config.capture.tls or now < self._tls_next.get(pid, 0.0):
            return
        if self.probe.tls.attach(pid) is None:
            self._tls_next[pid] = now + TLS_LOOK_EVERY_S
        else:
            self._tls_next[pid] = float("inf")

    def _say_tls(self, pid: int) -> None:
        """Once per process: its TLS stays opaque, and why."""
        from .probes.tls import tls_status

        self._tls_said.add(pid)
        if self.config.capture.tls:
            log.info("%s[%d]: TLS not decrypted: %s", self.tracked.get(pid, "?"), pid, tls_status(pid)[1])

    def _process_name(self, pid: int, thread: str) -> str:
        """The name an exchange made by a thread named ``thread`` goes by: the
        process's (/proc/PID/comm, its main thread's), read once per pid and
        thread name. Its I/O threads' names ("event_engine") are not the
        server's, and a process that renamed itself is known by its new name."""
        name = self._thread_names.get((pid, thread))
        if name is None:
            info = procs.read_info(pid)
            name = info.comm if info is not None else self.names.get(pid, thread)
            if pid in self.tracked:
                self.tracked[pid] = self.names[pid] = name
                self._thread_names[(pid, thread)] = name
        return name

    def _retire_exited(self) -> None:
        """Retire the processes that exited, once every ring is drained. A
        process that exits right after a call puts its last bytes and its exit
        in the rings together, and its exit notice is read before the streams
        ring (libbpf drains rings in the order they were opened) or before a
        drain that its budget cut short: retired at once, its last HTTP/2
        streams were read as a new connection's, their headers undecoded. A
        load that keeps cutting the drains short waits at most EXIT_WAIT_S."""
        if not self._exited:
            return
        readers = (self.markers, self.cache, self.probe)
        drained, now = all(r.drained() for r in readers if r is not None), time.monotonic()
        for pid, heard in list(self._exited.items()):
            if drained or now - heard > EXIT_WAIT_S:
                del self._exited[pid]
                self._retire(pid)

    def _retire(self, pid: int) -> None:
        """A process that exited: everything it held is reported and folded
        into its name's totals, and only then is it no longer tracked (so a
        reader that sees it gone sees its counts folded)."""
        self._thread_names = {k: v for k, v in self._thread_names.items() if k[0] != pid}
        self.probe.untrack(pid)
        self.engine.instrumented.discard(pid)
        self._unprobed.pop(pid, None)
        if self.gpu is not None:
            self.gpu.forget(pid)
        for ex in self.probe.forget(pid):
            self._take(ex, self.stitcher.on_flush(exited(ex), final=True))
        self.stitcher.forget(pid)
        self.probe.tls.forget(pid)
        self._tls_next.pop(pid, None)
        self._tls_said.discard(pid)
        self._emit(self.streams.forget(pid, time.monotonic_ns()))
        self.joiner.forget(pid)
        self._fold_counts(pid)
        if self.probe.bins is not None:
            self.metrics.take_bins(lambda: self._bin_rows(pid, remove=True))
        self.names.retire(pid)
        self.exporter.close_process(pid)
        self.containers.pop(pid, None)
        self._pod_of.pop(pid, None)
        comm = self.tracked.pop(pid, None)
        if comm is not None:
            log.info("%s[%d] exited", comm, pid)

    def _fold_counts(self, pid: int) -> None:
        """An exited process's kernel counts join its name's totals (pid ""):
        none is lost, and exited processes leave one series per name."""
        statuses, untracked = self.probe.take_counts(pid)
        name = self.names.get(pid, "?")
        for status, n in statuses.items():
            self._exited_status[(name, status)] = self._exited_status.get((name, status), 0) + n
        if untracked:
            self._exited_untracked[name] = self._exited_untracked.get(name, 0) + untracked

    def _status_rows(self) -> dict[tuple[str, str, int], int]:
        """sitsprobe_http_server_requests_total's rows: (pid, process, status) -> count."""
        rows = {(str(t), self.names.get(t, "?"), s): n for (t, s), n in self.probe.status_counts().items()}
        for (name, status), n in self._exited_status.items():
            rows[("", name, status)] = n
        return rows

    def _untracked_rows(self) -> dict[tuple[str, str], int]:
        rows = {(str(t), self.names.get(t, "?")): n for t, n in self.probe.untracked_counts().items()}
        rows.update({("", name): n for name, n in self._exited_untracked.items()})
        return rows

    def _rescan(self) -> None:
        if (lost := self.probe.notices_lost()) != self._notices_lost:  # an exec unheard of
            self._notices_lost = lost
            self._scan.read_all()
        found = self._scan(known=self.tracked)
        for pid, info in found.items():
            if pid not in self.tracked:
                self._track(info, tls=False)  # below, after the other probes' compiles
            elif info.comm != self.tracked[pid]:  # it renamed itself (prctl, setproctitle)
                self.tracked[pid] = self.names[pid] = info.comm
                self._thread_names = {k: v for k, v in self._thread_names.items() if k[0] != pid}
        for pid in [p for p in self.tracked if p not in found and procs.read_info(p) is None]:
            self._exited.setdefault(pid, time.monotonic())
        if self.cache is not None:
            self.cache.rescan()
        if self.config.engine.markers:
            self._find_engines()
        # last: the first libssl found starts the TLS programs' compile, on a
        # thread, and a compile here after it (the markers') would wait for it
        now = time.monotonic()
        for pid in list(self.tracked):
            self._tls(pid, now)

    def _marker_probe(self):
        """The engine-marker probe, compiled when the first traced process
        that loads the markers library is found: an agent whose engines never
        call our markers (vLLM, TGI, llama.cpp ...) never pays its compile
        or its ring."""
        if self.markers is None:
            from .probes.markers import MarkerProbe
            from .probes.memory import release_compiler

            try:
                self.markers = MarkerProbe(None, self._on_marker)
            except Exception as e:  # noqa: BLE001 (bcc raises Exception) a compile or load that failed
                raise ProbeAttachError("markers", "bpf/markers.c", str(e)) from e
            release_compiler()
            self.hooks["engine_markers"] = f"{MarkerProbe.hook} libsitsprobe_markers"
            if self._rings is not None:
                self._rings.add(self.markers.ring_fds())
        return self.markers

    def _find_engines(self) -> None:
        """Traced processes that load the markers library: probe the library,
        and from then on hold their requests for their markers. One whose
        library cannot be probed is said once and traced without its stages:
        it must not stop the agent, nor hold its requests for nothing. Where
        the kernel refused the probe's load for the moment (probes/retry.py),
        it is tried again, at a rescan once its wait is over."""
        from .probes.markers import find_marker_libraries

        for pid in self.tracked:
            if pid in self.engine.instrumented:
                continue  # a process keeps the libraries it has: look once
            if pid in self._unprobed and not ((retry := self._unprobed[pid]) and retry.due()):
                continue
            libs = find_marker_libraries(pids=[pid])
            try:
                for path in libs:
                    if self._marker_probe().attach(path):
                        log.info("engine markers: attached to %s", path)
            except ProbeAttachError as e:
                if refused_for_now(e):
                    retry = self._unprobed.get(pid) or Retry()
                    log.warning("%s: %s[%d] is traced without its engine stages until it is tried again, "
                                "in %.0f s", e, self.tracked[pid], pid, retry.refused())
                else:
                    retry = None
                    log.warning("%s: %s[%d] is traced without its engine stages",
                                e, self.tracked[pid], pid)
                self._unprobed[pid] = retry
                continue
            self._unprobed.pop(pid, None)
            if libs:  # its requests wait for their markers from now on, even the first
                self.engine.instrumented.add(pid)

    def _on_notice(self, n: ProcessNotice) -> None:
        if n.kind == "exit":
            self._exited.setdefault(n.tgid, time.monotonic())
            return
        if n.kind == "exec":
            self._scan.fresh(n.tgid)  # a new program may yet rename itself as it starts
        info = procs.read_info(n.tgid)
        if n.tgid not in self.tracked:
            if info is not None and (n.kind == "listen" or self.selector.matches(info)):
                self._track(info)
            elif n.kind == "listen":  # gone already: the kernel's entry must go too
                self.probe.untrack(n.tgid)
        elif info is None or not self.selector.matches(info, procs.listening_ports(n.tgid)):
            log.info("%s[%d] became %s, which is not selected", self.tracked[n.tgid], n.tgid,
                     info.comm if info else "?")
            self._retire(n.tgid)  # it exec'd into another program
        elif info.comm != self.tracked[n.tgid]:
            self.tracked[n.tgid] = self.names[n.tgid] = info.comm
            self._thread_names = {k: v for k, v in self._thread_names.items() if k[0] != n.tgid}

    # -- events -------------------------------------------------------------------

    def _on_marker(self, ev: MarkerEvent) -> None:
        self.engine.on_marker(ev)
        if ev.kind == "cache_get" and self.cache_stats is not None:
            self.cache_stats.add(ev.name, ev.key, bool(ev.hit), ev.ts_ns)

    def _on_chunk(self, ch: Chunk) -> None:
        self._emit(self.streams.on_chunk(ch))

    def _on_exchange(self, ex: Exchange) -> None:
        if not ex.flags & CF_BINNED:
            self._take(ex, self.stitcher.on_exchange(ex))
            return
        # the kernel counted it, and sent it for a trace only: what it costs
        # here is tracing's, charged to the budget (its export charges itself)
        began, self._metering = self._tracing_cpu.start(), True
        try:
            self._take(ex, [r._replace(binned=True) for r in self.stitcher.on_exchange(ex)])
        finally:
            self._metering = False
        self._tracing_cpu.stop(began)

    def _take(self, ex: Exchange, requests: list[Request]) -> None:
        """Requests stitched from ex (none: a duplicate of one already reported)."""
        if self.config.cache.resp_mode and requests and requests[0].protocol == resp.NAME:
            for key, hit in resp.resp_get_results(ex.req, ex.resp):
                self.cache_stats.add("redis-resp", key, hit, ex.start_ns, ex.peer)
        if ex.shape and ex.shape not in self._shapes and len(requests) == 1:
            self._learn(ex.shape, requests[0])
        self._emit(requests)

    def _learn(self, shape: int, r: Request) -> None:
        """The kernel may count the exchanges of this method and path from now
        on, when its route is the path itself: the shape is a hash of the raw
        method and path, so each path a route folds (ids) would be a series
        of its own; those keep coming here."""
        if (r.protocol == http1.NAME and r.direction == "server" and r.method and r.route == r.path
                and self.probe.bins is not None):
            # None: the kernel's shapes map is full; not asked again for this one
            self._shapes[shape] = (r.method, r.route) if self.probe.bins.learn(shape) else None

    def _bin_rows(self, pid: int | None = None, remove: bool = False):
        """The kernel's counts since the last look, labelled as the agent's own."""
        rows = []
        for d in self.probe.bins.deltas(pid, remove):
            method, route = self._shapes.get(d.shape) or ("_OTHER", "unknown")
            who = self._who(d.tgid, self.tracked.get(d.tgid) or self.names.get(d.tgid, "?"))
            rows.append(((*who, method, route, str(d.status) if d.status else ""), d))
        return rows

    def _kernel_sampling(self) -> None:
        """What the kernel sends of the requests it counts: every one without a
        trace budget; else errors, the slowest (past the p99 so far) and
        the budget's rate and a little more: each one sent costs the agent its
        stitching whether the sampler exports it or not."""
        budget = self.sampler.budget_per_second
        p99 = self.metrics.http_quantile(0.99)
        self.probe.bins.sample(not math.isfinite(budget), 1.2 * budget + 5 if math.isfinite(budget) else 0,
                               p99 * 1e9 if p99 else 0)

    def _emit(self, requests: list[Request]) -> None:
        now = time.monotonic_ns()
        ready = []
        for r in requests:
            ready += self.engine.on_request(r, now)
        self._release(ready, now)

    def _enrich(self, r: Request) -> Request:
        """What only a traced request pays for: its headers, its GPU use; and
        its engine's cache keys as the cache.prefix_* settings export them
        (raw only with cache.export_raw_keys)."""
        r = enrich(r, self._redact, self._keep_query)
        inf = r.inference
        if inf is not None and inf.cache:
            extract = self.cache_stats.extract
            r = r._replace(inference=replace(inf, cache=tuple(replace(c, key=extract(c.key))
                                                              for c in inf.cache)))
        return r if self.gpu is None else self.gpu.attribute(r)

    def _understood(self, r: Request) -> Request:
        """What every request gets, traced or not (its metrics need it): its
        GenAI meaning, from the wire and the markers, and its latency
        segments. The payload pieces go once read."""
        if r.payload is not None or r.inference is not None:
            wire = genai.read(r) if r.payload is not None else None
            r = r._replace(genai=genai.merge(genai.from_markers(r), wire), payload=None)
            if r.partial in (http1.RESPONSE_CUT_OFF, http1.CLIENT_CLOSED) and r.genai is not None and \
                    r.genai.stream_ended:
                # the answer's own end was sent ([DONE]) and the client hung up before the
                # chunked terminator came (the openai client closes at [DONE]): no cut, no error
                r = r._replace(complete=True, partial=None)
        waits = self.gpu.device_waits(r.pid, r.start_ns, r.end_ns) if self.gpu is not None else ()
        return r._replace(segments=segments(r, self._stage_segments, waits))

    def recent_json(self, query: dict[str, str]) -> bytes:
        """/report/requests.json[?window_s=N]: the recent GenAI requests, for `sitsprobe report`."""
        window = query.get("window_s")
        try:
            window_s = None if window is None else float(window)
        except ValueError:
            raise ValueError(f"window_s: expected seconds, got {window!r}") from None
        return self.recent.to_json(window_s)

    def _remember(self, r: Request) -> None:
        """A GenAI request served, for `sitsprobe report --agent`: every one,
        before sampling, so its P99 is exact (a traced client's calls are not
        the node's service: a gateway's would count each request twice).
        Without a trace of its own yet, its head-sampling draw uses an id made
        from the request."""
        trace = r.traceparent.trace_id if r.traceparent is not None else \
            hash((r.pid, r.fd, r.start_ns)) & ((1 << 128) - 1)
        self.recent.add(RequestRecord.from_request(r, span_attributes(r), clock=self.clock,
                                                   trace_id=trace, keep=self._report_keep))

    def _release(self, requests: list[Request], now: int) -> None:
        for r in requests:
            r = self._understood(r)
            if r.genai is not None and self.recent is not None and not is_client(r):
                self._remember(r)
            self.requests_seen += 1
            self.metrics.observe(r)
            if r.protocol == "tls" and r.pid not in self._tls_said:
                self._say_tls(r.pid)
            self._send(self.joiner.add(r, now), now)

    def _send(self, traces: list[Trace], now: int) -> None:
        """Joined traces to the sampler; the late parts of ones it let out, out."""
        for t in traces:
            for chosen in (t,) if t.late else self.sampler.offer(t, now):
                self._export(chosen)

    def _export(self, t: Trace) -> None:
        """A trace out, its CPU charged to the sampler's budget (what the
        exporter's sender spends is charged by the exporter; inside an
        exchange the kernel sent for a trace only, with that exchange)."""
        if self._metering:
            self.exporter.export_trace(t, self._enrich)
            return
        began = self._tracing_cpu.start()
        self.exporter.export_trace(t, self._enrich)
        self._tracing_cpu.stop(began)

    def _flush(self, everything: bool = False) -> dict[int, float]:
        """Report responses whose framing says they are done (with
        ``everything``, all that are open, as they stand); return requests
        in flight by pid."""
        in_flight: dict[int, float] = {}
        now = time.monotonic_ns()  # the kernel's clock (bpf_ktime_get_ns)
        for ex, state in self.probe.open_exchanges():
            if everything or (state == 2 and self.stitcher.due(ex, now)
                              and (not ex.flags & CF_BINNED or self.probe.claim(ex))):
                # a CF_BINNED one only once claimed, so that the kernel does not count it
                # too; at the end (everything) the kernel will not report it
                if requests := self.stitcher.on_flush(ex, final=everything):
                    self._take(ex, requests)  # none: reported on an earlier tick
                self.probe.dismiss(ex)  # done: neither looked at again nor in flight
            else:
                in_flight[ex.tgid] = in_flight.get(ex.tgid, 0) + 1
        return in_flight

    # -- the loop -----------------------------------------------------------------

    def run(self, stop: threading.Event, duration_s: float | None = None) -> None:
        deadline = time.monotonic() + duration_s if duration_s else None
        flush_every = self.config.stitch.flush_interval_ms / 1000
        rescan_every = self.config.select.rescan_interval_s
        next_flush = next_rescan = next_second = time.monotonic()
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            # asleep until a tick is due, unless a ring could fill before (probes/ring.py)
            due = min(next_flush, next_second, next_rescan, deadline or next_flush)
            self._rings.wait(due - time.monotonic())
            if self.markers is not None:
                self.markers.consume()  # markers first: their requests are about to end
            if self.cache is not None:
                self.cache.consume()
            self.probe.consume()
            self._retire_exited()
            self.probe.tls.attach_waiting()  # once its programs are loaded (a thread's work)
            now = time.monotonic()
            if now >= next_flush:
                in_flight = self._flush()
                self._engine_tick(time.monotonic_ns())
                if self.gpu is not None:
                    self.gpu.tick(list(self.tracked), self._demand(in_flight))
                self._send(self.joiner.expire(time.monotonic_ns()), time.monotonic_ns())
                for t in self.sampler.flush(time.monotonic_ns()):
                    self._export(t)
                self.losses.tick(now)  # a loss said as it starts, lasts and stops
                next_flush = now + flush_every
            if now >= next_second:
                if step := self.clock.follow():
                    log.info("the wall clock moved %+.1f ms; exported times follow it", step / 1e6)
                if self.probe.bins is not None:
                    self.metrics.take_bins(self._bin_rows)
                    self._kernel_sampling()
                next_second = now + 1
            if now >= next_rescan:
                self._rescan()
                next_rescan = now + rescan_every

    def _demand(self, open_exchanges: dict[int, float]) -> dict[int, tuple[float, float]]:
        """(in flight, queued) per pid. An engine's queued requests are open
        exchanges too: what the network sees beyond the engine's own count
        (requests not yet begun there) is in flight with the rest."""
        engine = self.engine.demand(self.markers.open_ranges() if self.markers is not None else ())
        out = {}
        for pid in set(open_exchanges) | set(engine):
            begun, queued = engine.get(pid, (0, 0))
            out[pid] = (max(open_exchanges.get(pid, 0), begun) - queued, float(queued))
        return out

    def _engine_tick(self, now: int, everything: bool = False) -> None:
        self._release(self.engine.due(now, everything), now)
        if self.engine.batch_sizes:
            self.metrics.observe_batches(self.engine.batch_sizes)
            self.engine.batch_sizes.clear()

    def close(self) -> None:
        """Drain, report what is still open, flush the exporters, then detach
        every probe: the flush within config.stop_timeout_s of the call,
        whatever the collector does. What is not delivered by then is counted
        as dropped at shutdown, and the log says what became of it all. (The
        kernel takes a uprobe off in some 0.1 s, one after another, and each
        process whose TLS is read has 8: a node's worth outlasts the bound.)"""
        deadline = time.monotonic() + self.config.stop_timeout_s
        self.ready = False
        if self.workloads is not None:
            self.workloads.stop()
        try:
            if self.markers is not None:
                self.markers.consume()
            if self.probe is not None:
                self.probe.consume()
                self._flush(everything=True)
                self._emit(self.streams.close_all(time.monotonic_ns()))
                self._engine_tick(time.monotonic_ns(), everything=True)
                self._send(self.joiner.expire(time.monotonic_ns(), everything=True), time.monotonic_ns())
                for t in self.sampler.flush():
                    self._export(t)
                self.losses.finish()  # the totals, if anything was lost
            # the metrics' last export reads the probes' maps: before they go, in half the time left
            half = time.monotonic() + max(0.0, deadline - time.monotonic()) / 2
            within(half, [x.shutdown for x in (self.otlp_metrics,) if x is not None])
        finally:
            tallies = self._signal_tallies()
            self._final_sampled = self._sampled()  # the kernel's part, read while its maps are there
            try:
                if self.exporter is not None:
                    self.exporter.shutdown(deadline)
            finally:
                self._detach(deadline)
            for tally in tallies.values():  # what a shutdown past the bound still held
                tally.close()
        if self.exporter is not None:
            self._log_accounting(tallies)
        if self.http is not None:
            self.http.close()

    def _detach(self, deadline: float) -> None:
        """Every probe off, even if a step before failed. The GPU layer's
        alert exporter is flushed last in its close(), within the deadline."""
        if self._net_ahead is not None:
            self._net_ahead.close()  # a start that failed before taking it
        if self.gpu is not None:
            gpu, self.gpu = self.gpu, None
            within(deadline, [gpu.close])
        if self.cache is not None:
            self.cache.consume()
            self.cache.close()
            self.cache = None
        if self.markers is not None:
            self.markers.close()
            self.markers = None
        if self.probe is not None:
            self.probe.close()
            self.probe = None
        if self._rings is not None:
            self._rings.close()
            self._rings = None

    def _signal_tallies(self) -> dict:
        """OTLP metrics and alert logs, where they are exported: signal -> Tally."""
        out = {}
        if self.otlp_metrics is not None:
            out["metrics"] = self.otlp_metrics.tally
        alerts = self.gpu.alerts_tally if self.gpu is not None else None
        if alerts is not None:
            out["logs"] = alerts
        return out

    def _log_accounting(self, tallies: dict) -> None:
        """The stop's summary: what became of every span, metric point and log record."""
        def said(counts: dict) -> str:
            return "; ".join(
                f"{name}: {c.delivered} delivered"
                + "".join(f", {getattr(c, r)} {r.replace('_', ' ')}" for r in c.REASONS if getattr(c, r))
                for name, c in sorted(counts.items()))

        s = self._final_sampled
        log.info("traces: %d requests seen, %d sampled, %d sampled out; spans: %s",
                 s["seen"], s["sampled"], s["sampled_out"], said(self.exporter.accounting()) or "no sink")
        if tallies:
            log.info("OTLP %s", said({f"{signal} ({'points' if signal == 'metrics' else 'records'})": t.counts()
                                      for signal, t in tallies.items()}))
