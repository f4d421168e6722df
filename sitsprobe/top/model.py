"""`sitsprobe top`'s model: pure functions from two metric pages to the rows
the view shows. Rates and ratios are over the interval between the pages;
quantiles come from histogram bucket deltas, interpolated inside the bucket
as Prometheus's histogram_quantile does. No terminal and no network here."""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ..quantile import histogram_quantile

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
SORTS = ("req/s", "err%", "p99", "process")  # what `s` cycles through, in order


@dataclass(frozen=True)
class Snapshot:
    at: float  # unix time of the scrape
    samples: dict[str, dict[Labels, float]]  # sample name -> labels -> value

    def series(self, name: str) -> dict[Labels, float]:
        return self.samples.get(name, {})


@dataclass(frozen=True)
class HttpRow:
    process: str
    pids: tuple[str, ...]
    rate: float  # responses/s
    error_ratio: float | None  # 5xx share; None without responses
    p50: float | None  # seconds
    p99: float | None
    pods: tuple[str, ...] = ()  # "namespace/pod" of its pids, where the agent knows them


@dataclass(frozen=True)
class EngineRow:
    """One (process, model): GenAI requests seen on the wire or by the engine's markers."""
    process: str
    model: str
    rate: float | None  # requests/s; None: no request histogram for this model
    output_tokens_rate: float | None  # output tokens/s; None: no token counter
    ttft_p50: float | None  # seconds, time to first token
    ttft_p99: float | None
    tpot_p50: float | None  # time per output token
    tpot_p99: float | None
    slow_segment: str | None  # where the slow tail's time went most in the interval
    slow_share: float | None  # ... that segment's share of the slow tail's seconds


@dataclass(frozen=True)
class PrefixCacheRow:
    """An engine process's prefix-cache look-ups, by process (the cache is the engine's)."""
    process: str
    hits: float | None  # hit ratio over the interval; None without look-ups in it
    hits_total: float | None  # ... since the engine started


@dataclass(frozen=True)
class CacheRow:
    cache: str
    rate: float  # look-ups/s
    miss_ratio: float | None
    top_miss_prefix: str | None  # the key prefix with the most misses in the interval
    top_miss_rate: float


@dataclass(frozen=True)
class GpuRow:
    gpu: str
    busy: float | None  # ratio, by `signal`
    signal: str
    memory_used: float | None  # bytes
    memory_total: float | None
    power: float | None  # watts
    top_process: tuple[str, str, float] | None  # (name, pid, SM ratio) of the busiest process
    collapsed: bool


@dataclass(frozen=True)
class AlertRow:
    gpu: str
    cause: str
    pid: int = 0
    process: str = ""
    busy_percent: float | None = None
    working_percent: float | None = None
    demand: float | None = None
    since_unix: float | None = None


@dataclass(frozen=True)
class View:
    at: float
    seconds: float
    processes: int
    events_rate: float
    lost_total: float
    lost_by_reason: dict[str, float]  # non-zero reasons only
    http: list[HttpRow]
    engine: list[EngineRow]  # by process, then model
    batch_mean: float | None
    batch_rate: float  # batched steps/s
    caches: list[CacheRow]
    gpus: list[GpuRow] = field(default_factory=list)
    alerts: list[AlertRow] = field(default_factory=list)
    spans_rate: float = 0.0  # spans delivered/s, every sink
    spans_dropped: dict[str, float] = field(default_factory=dict)  # "sink reason" -> since start, non-zero
    prefix_caches: list[PrefixCacheRow] = field(default_factory=list)  # by process
    gpu_sampling: bool | None = None  # the agent samples its GPUs; None: it does not say


def parse(text: str, at: float) -> Snapshot:
    """A Prometheus text page as a Snapshot. Raises ValueError on a malformed page."""
    samples: dict[str, dict[Labels, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name][tuple(sorted(s.labels.items()))] = s.value
    return Snapshot(at, dict(samples))


def parse_alerts(body: str) -> list[AlertRow]:
    """The agent's /alerts.json. Raises ValueError when it is not a list of alerts."""
    data = json.loads(body)
    if not isinstance(data, list):
        raise ValueError(f"expected a JSON list of alerts, got {type(data).__name__}")
    rows = []
    for a in data:
        try:
            ev = a.get("evidence") or {}
            rows.append(AlertRow(str(a["gpu"]), str(a["cause"]), int(a.get("pid") or 0),
                                 str(a.get("process") or ""), _num(ev.get("busy_percent")),
                                 _num(ev.get("working_level_percent")), _num(ev.get("demand")),
                                 _num(a.get("since_unix"))))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an alert: {a!r}") from e
    return rows


def _num(v: object) -> float | None:
    return None if v is None else float(v)


quantile = histogram_quantile  # the one rule, shared with the demo


def diff(prev: Snapshot, cur: Snapshot, seconds: float, alerts: list[AlertRow] | None = None) -> View:
    """What happened between two scrapes `seconds` apart. `alerts` comes from
    /alerts.json; None falls back to the collapse gauge (cause only)."""
    d = _Delta(prev, cur)
    lost = {dict(k).get("reason", ""): v for k, v in cur.series("sitsprobe_events_lost_total").items() if v}
    batch_n = sum(d.counter("sitsprobe_engine_batch_size_count").values())
    batch_sum = sum(d.counter("sitsprobe_engine_batch_size_sum").values())
    return View(
        at=cur.at, seconds=seconds,
        processes=len(cur.series("sitsprobe_tracked_process_info")),
        events_rate=sum(d.counter("sitsprobe_events_received_total").values()) / seconds,
        lost_total=sum(lost.values()), lost_by_reason=lost,
        http=_http(d, seconds), engine=_engine(d, seconds), prefix_caches=_prefix_caches(d),
        batch_mean=batch_sum / batch_n if batch_n else None, batch_rate=batch_n / seconds,
        caches=_caches(d, seconds), gpus=_gpus(cur),
        alerts=alerts if alerts is not None else _gauge_alerts(cur),
        spans_rate=sum(d.counter("sitsprobe_spans_delivered_total").values()) / seconds,
        spans_dropped={f"{dict(k).get('sink', '')} {dict(k).get('reason', '')}": v
                       for k, v in cur.series("sitsprobe_spans_dropped_total").items() if v},
        gpu_sampling=None if not (g := cur.series("sitsprobe_gpu_sampling")) else bool(sum(g.values())))


def sort_http(rows: list[HttpRow], key: str) -> list[HttpRow]:
    """Rows by one of SORTS: busiest, most errors or slowest first; by name."""
    if key == "process":
        return sorted(rows, key=lambda r: r.process)
    value = {"req/s": lambda r: r.rate, "err%": lambda r: r.error_ratio,
             "p99": lambda r: r.p99}[key]
    return sorted(rows, key=lambda r: (value(r) is None, -(value(r) or 0), r.process))


class _Delta:
    """Counter increases between two snapshots; a series that went down was reset."""

    def __init__(self, prev: Snapshot, cur: Snapshot):
        self.prev, self.cur = prev, cur

    def counter(self, name: str) -> dict[Labels, float]:
        before = self.prev.series(name)
        out = {}
        for labels, value in self.cur.series(name).items():
            inc = value - before.get(labels, 0.0)
            out[labels] = inc if inc >= 0 else value
        return out

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        """Increases of the sums over every label but `keys`. The sums, not
        each series: when a process exits, its series go and its counts join
        its name's totals (pid ""), which is no increase. A sum that fell
        (the agent restarted) counts from zero."""
        sums = []
        for snap in (self.prev, self.cur):
            total: dict[tuple[str, ...], float] = defaultdict(float)
            for labels, value in snap.series(name).items():
                lab = dict(labels)
                total[tuple(lab.get(k, "") for k in keys)] += value
            sums.append(total)
        before, now = sums
        return {group: (v - before.get(group, 0.0) if v >= before.get(group, 0.0) else v)
                for group, v in now.items()}

    def quantiles(self, histogram: str, qs: tuple[float, ...], *keys: str) -> dict[tuple, list]:
        """Quantiles of a histogram's observations in the interval, grouped by `keys`."""
        groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for (*group, le), n in self.by(f"{histogram}_bucket", *keys, "le").items():
            groups[tuple(group)].append((float(le), n))
        return {g: [quantile(q, b) for q in qs] for g, b in groups.items()}


def _http(d: _Delta, seconds: float) -> list[HttpRow]:
    """By process: responses from the kernel's exact counter, latency from the histogram."""
    counts = d.by("sitsprobe_http_server_requests_total", "process", "http_response_status_code")
    pids: dict[str, set[str]] = defaultdict(set)
    for labels in d.cur.series("sitsprobe_http_server_requests_total"):
        lab = dict(labels)
        if lab.get("pid"):  # pid "": the totals of exited processes of that name
            pids[lab.get("process", "")].add(lab["pid"])
    lat = d.quantiles("http_server_request_duration_seconds", (0.5, 0.99), "process")
    pod_of = {lab["pid"]: f"{lab['namespace']}/{lab['pod']}" for lab in map(dict, d.cur.series(
        "sitsprobe_tracked_process_info")) if lab.get("pod") and lab.get("pid")}
    rows = []
    for proc in sorted({p for p, _ in counts} | {p for p, in lat}):
        total = sum(n for (p, _), n in counts.items() if p == proc)
        errors = sum(n for (p, s), n in counts.items() if p == proc and s.startswith("5"))
        p50, p99 = lat.get((proc,), [None, None])
        rows.append(HttpRow(proc, tuple(sorted(pids[proc])), total / seconds,
                            errors / total if total else None, p50, p99,
                            tuple(sorted({pod_of[p] for p in pids[proc] if p in pod_of}))))
    return rows


def _engine(d: _Delta, seconds: float) -> list[EngineRow]:
    """By (process, model), every model any GenAI series names: a model with
    requests but no token timings shows None there, and so on."""
    keys = ("process", "gen_ai_request_model")
    requests = d.by("gen_ai_server_request_duration_seconds_count", *keys)
    output = {(p, m): n for (p, m, t), n in d.by("gen_ai_server_tokens_total", *keys, "gen_ai_token_type").items()
              if t == "output"}
    ttft = d.quantiles("gen_ai_server_time_to_first_token_seconds", (0.5, 0.99), *keys)
    tpot = d.quantiles("gen_ai_server_time_per_output_token_seconds", (0.5, 0.99), *keys)
    slow: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)  # (process, model) -> segment -> s
    for (p, m, seg), n in d.by("sitsprobe_gen_ai_slow_tail_segment_seconds_total", *keys, "segment").items():
        slow[(p, m)][seg] = n
    rows = []
    for key in sorted(set(requests) | set(output) | set(ttft) | set(tpot) | set(slow)):
        t50, t99 = ttft.get(key, [None, None])
        p50, p99 = tpot.get(key, [None, None])
        by_segment = slow.get(key, {})
        tail = sum(by_segment.values())
        top = max(by_segment, key=lambda s: (by_segment[s], s)) if tail > 0 else None
        rows.append(EngineRow(*key, _per(requests.get(key), seconds), _per(output.get(key), seconds),
                              t50, t99, p50, p99, top, by_segment[top] / tail if top else None))
    return rows


def _per(n: float | None, seconds: float) -> float | None:
    return None if n is None else n / seconds


def _prefix_caches(d: _Delta) -> list[PrefixCacheRow]:
    """Each engine process with prefix-cache look-ups: its hit ratio in the interval and since start."""
    lookups = {(p, r): n for (c, p, r), n in d.by("sitsprobe_engine_cache_lookups_total",
                                                  "cache", "process", "result").items() if c == "prefix"}
    since_start = {dict(k).get("process", ""): v
                   for k, v in d.cur.series("sitsprobe_engine_cache_hit_ratio").items()
                   if dict(k).get("cache") == "prefix"}
    rows = []
    for proc in sorted({p for p, _ in lookups} | set(since_start)):
        hits = lookups.get((proc, "hit"), 0.0)
        total = hits + lookups.get((proc, "miss"), 0.0)
        rows.append(PrefixCacheRow(proc, hits / total if total else None, since_start.get(proc)))
    return rows


def _caches(d: _Delta, seconds: float) -> list[CacheRow]:
    lookups = d.by("sitsprobe_cache_lookups_total", "cache", "prefix", "result")
    rows = []
    for cache in sorted({c for c, _, _ in lookups}):
        total = sum(n for (c, _, _), n in lookups.items() if c == cache)
        misses = {p: n for (c, p, r), n in lookups.items() if c == cache and r == "miss" and n > 0}
        top = max(misses, key=lambda p: (misses[p], p), default=None)
        rows.append(CacheRow(cache, total / seconds, sum(misses.values()) / total if total else None,
                             top, misses.get(top, 0.0) / seconds))
    return rows


def _by_gpu(cur: Snapshot, name: str) -> dict[str, float]:
    return {dict(k).get("gpu", ""): v for k, v in cur.series(name).items()}


def _gpus(cur: Snapshot) -> list[GpuRow]:
    busy = _by_gpu(cur, "sitsprobe_gpu_busy_ratio")
    signal = {dict(k).get("gpu", ""): dict(k).get("signal", "")
              for k in cur.series("sitsprobe_gpu_busy_ratio")}
    used = _by_gpu(cur, "sitsprobe_gpu_memory_used_bytes")
    total = _by_gpu(cur, "sitsprobe_gpu_memory_total_bytes")
    power = _by_gpu(cur, "sitsprobe_gpu_power_watts")
    collapsed = {g for g, v in _by_gpu(cur, "sitsprobe_gpu_utilization_collapse").items() if v}
    top: dict[str, tuple[str, str, float]] = {}
    for labels, value in cur.series("sitsprobe_gpu_process_sm_utilization_ratio").items():
        lab = dict(labels)
        gpu = lab.get("gpu", "")
        if gpu not in top or value > top[gpu][2]:
            top[gpu] = (lab.get("process", ""), lab.get("pid", ""), value)
    rows = []
    for gpu in sorted(set(busy) | set(used) | set(power), key=_gpu_order):
        rows.append(GpuRow(gpu, busy.get(gpu), signal.get(gpu, ""), used.get(gpu), total.get(gpu),
                           power.get(gpu), top.get(gpu), gpu in collapsed))
    return rows


def _gauge_alerts(cur: Snapshot) -> list[AlertRow]:
    raised = [(dict(k).get("gpu", ""), dict(k).get("cause", "unknown"))
              for k, v in cur.series("sitsprobe_gpu_utilization_collapse").items() if v]
    return [AlertRow(gpu, cause) for gpu, cause in sorted(raised, key=lambda r: (_gpu_order(r[0]), r[1]))]


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
