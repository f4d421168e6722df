"""Configuration: embedded defaults, then a YAML file, then command-line overrides.

Every key is checked by one rule from the table `_RULES`; the default values live
in `defaults.yaml` (shipped in the package, and what users copy). Every problem
is raised as one `ConfigError` naming the source, the dotted key and the value.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import stat
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Mapping

import yaml

from .errors import ConfigError


@dataclass(frozen=True)
class Select:
    pids: tuple[int, ...]
    comms: tuple[str, ...]
    cmdline: tuple[str, ...]
    ports: tuple[int, ...]
    rescan_interval_s: float


@dataclass(frozen=True)
class Capture:
    request_bytes: int
    response_bytes: int
    redact_headers: tuple[str, ...]
    keep_query_params: tuple[str, ...]
    genai: bool
    body_bytes: int
    tail_bytes: int
    write_peek_bytes: int
    max_writes: int
    max_payloads: int
    stream_bytes: int
    tls: bool


@dataclass(frozen=True)
class Stitch:
    flush_interval_ms: int
    max_connections: int
    run_queue: bool
    read_waits: bool
    outgoing: bool
    kernel_bins: bool
    join_wait_ms: int


@dataclass(frozen=True)
class Routes:
    templates: tuple[str, ...]
    collapse_ids: bool
    max_routes: int


@dataclass(frozen=True)
class Traces:
    file: str | None
    otlp_endpoint: str | None
    otlp_protocol: str | None
    cpu_budget: float
    max_per_second: int
    keep_slowest: int
    metrics_interval_s: float
    export_delay_ms: int


@dataclass(frozen=True)
class Metrics:
    address: str
    port: int


@dataclass(frozen=True)
class Engine:
    markers: bool
    join_wait_ms: int
    scheduling_stages: tuple[str, ...]  # engine stages whose time is that latency segment's
    io_stages: tuple[str, ...]          # (stitch.segments); any other stage is compute
    cache_stages: tuple[str, ...]
    network_stages: tuple[str, ...]


@dataclass(frozen=True)
class Cache:
    probes: tuple  # CacheProbeSpec, from "redis" or a spec mapping
    resp_mode: bool
    prefix_delimiter: str
    prefix_segments: int
    prefix_regex: str | None
    hash_prefixes: bool
    export_raw_keys: bool
    top_prefixes: int
    bucket_s: float
    subnet_v4: int
    subnet_v6: int


@dataclass(frozen=True)
class Gpu:
    enabled: bool
    interval_ms: int
    cuda_probes: bool
    collapse_drop_ratio: float
    collapse_floor_percent: float
    collapse_sustain_s: float
    collapse_clear_s: float
    collapse_min_working_percent: float
    collapse_min_history_s: float


@dataclass(frozen=True)
class Window:
    """One SLI window of `sitsprobe report`: what it measures and its limit."""

    name: str
    measure: str  # ttft | duration | tpot | stage:<child span name> | attribute:<span attribute>
    window_ms: float


@dataclass(frozen=True)
class Valid:
    """What makes a GenAI response valid (sitsprobe.report.tables.invalid_reasons)."""

    status_classes: tuple[str, ...]  # "2xx" or an exact code "404"
    finish_reasons: tuple[str, ...]
    require_finish_reason: bool
    require_answer: bool
    require_json_valid: bool


@dataclass(frozen=True)
class Tolerance:
    """How far a request's segments may sum from its duration: max(share x duration, min_ms)."""

    share: float
    min_ms: float


@dataclass(frozen=True)
class Report:
    windows: tuple[Window, ...]
    valid: Valid
    uptime_target: float
    recent_requests: int
    tolerance: Tolerance


@dataclass(frozen=True)
class Kubernetes:
    metadata: str  # auto, on, off
    node_name: str
    pod_labels: tuple[str, ...]
    metric_labels: tuple[str, ...]
    max_pods: int


@dataclass(frozen=True)
class Config:
    select: Select
    capture: Capture
    ring_buffer_mib: int
    stitch: Stitch
    routes: Routes
    traces: Traces
    metrics: Metrics
    engine: Engine
    cache: Cache
    gpu: Gpu
    report: Report
    kubernetes: Kubernetes
    duration_s: float | None
    stop_timeout_s: float
    kernel_headers: str | None
    compiled_dir: str | None
    socket_hooks: str
    log_level: str


DEFAULTS_SOURCE = "<defaults>"
OVERRIDES_SOURCE = "<command line>"


class _Bad(Exception):  # a value broke a rule; suffix: where below the key, e.g. "[2]"
    def __init__(self, expected: str, got: Any, suffix: str = ""):
        self.expected, self.got, self.suffix = expected, got, suffix


class _Shown(str):  # text shown as is after "got" (ConfigError shows repr otherwise)
    def __repr__(self) -> str:
        return str(self)


def _show(v: Any) -> Any:
    if v is None or isinstance(v, bool):
        return _Shown({None: "null", True: "true", False: "false"}[v])
    return v


Rule = Callable[[Any], Any]


def _rule(desc: str, ok: Callable[[Any], bool], conv: Callable[[Any], Any] = lambda v: v) -> Rule:
    def check(v: Any) -> Any:
        if not ok(v):
            raise _Bad(desc, v)
        return conv(v)
    check.desc = desc  # type: ignore[attr-defined]
    return check


def _int(lo: int, hi: int | None = None, pow2: bool = False) -> Rule:
    desc = ("a power-of-two integer " if pow2 else "an integer ") + (f"{lo}..{hi}" if hi is not None else f">= {lo}")
    return _rule(desc, lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v
                 and (hi is None or v <= hi) and not (pow2 and v & (v - 1)))


def _num(lo: float, hi: float | None = None, above: bool = False) -> Rule:
    desc = f"a number > {lo}" if above else f"a number {lo}..{hi}"
    return _rule(desc, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                 and (v > lo if above else lo <= v <= hi), float)  # type: ignore[operator]


def _str(desc: str = "a non-empty string", ok: Callable[[str], bool] = bool, conv=lambda v: v) -> Rule:
    return _rule(desc, lambda v: isinstance(v, str) and ok(v), conv)


def _regex(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _Bad(_regex.desc, v)  # type: ignore[attr-defined]
    try:
        re.compile(v)
    except re.error as e:
        raise _Bad(f"a valid regular expression ({e})", v) from None
    return v


_regex.desc = "a regular expression (string)"  # type: ignore[attr-defined]


def _list(item: Rule, unique: bool = False) -> Rule:
    def check(v: Any) -> tuple:
        if v is None:  # `pids:` with every item commented out
            return ()
        if not isinstance(v, list):
            raise _Bad(check.desc, v)  # type: ignore[attr-defined]
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except _Bad as e:
                raise _Bad(e.expected, e.got, f"[{i}]{e.suffix}") from None
            if unique and out[-1] in out[:-1]:
                raise _Bad(f"no item twice (item {out.index(out[-1])} is the same)", x, f"[{i}]")
        return tuple(out)
    check.desc = f"a list of {'distinct ' if unique else ''}items, each {item.desc}"  # type: ignore[attr-defined]
    return check


def _opt(inner: Rule) -> Rule:
    def check(v: Any) -> Any:
        try:
            return None if v is None else inner(v)
        except _Bad as e:
            raise _Bad(check.desc, e.got) if not e.suffix else e from None  # type: ignore[attr-defined]
    check.desc = "null or " + inner.desc  # type: ignore[attr-defined]
    return check


def _choice(*options: str) -> Rule:
    return _rule("one of: " + ", ".join(options), lambda v: isinstance(v, str) and v in options)


_BOOL = _rule("true or false", lambda v: isinstance(v, bool))


def _cache_probes(v: Any) -> tuple:
    """A list of cache probes: a preset name ("redis") or a spec mapping."""
    from .cache.spec import specs_from_list
    if not isinstance(v, list):
        raise _Bad("a list of cache probes (\"redis\" or a mapping)", v)
    items = [{"preset": x} if isinstance(x, str) else x for x in v]
    try:
        return specs_from_list(items, "", "")
    except ConfigError as e:
        raise _Bad(e.expected, _Shown(repr(e.got) if e.got is not None else "nothing"), e.key) from None

_PATH = _str("a non-empty path")


def _fields(cls: type, rules: Mapping[str, Rule]) -> Rule:
    """A mapping of named settings, each checked by its rule, made into ``cls``.
    Layered: keys a layer leaves out keep the value of the layer below (the
    defaults at least), as keys of a section do."""
    names = list(rules)

    def check(v: Any, below: Any = None) -> Any:
        if not isinstance(v, Mapping):
            raise _Bad(check.desc, v)  # type: ignore[attr-defined]
        got = dict(dataclasses.asdict(below)) if below is not None else {}
        for key, value in v.items():
            key = str(key)
            if key not in rules:
                close = difflib.get_close_matches(key, names, n=1)
                raise _Bad("one of the keys " + ", ".join(names),
                           _Shown("an unknown key" + (f" (did you mean {close[0]}?)" if close else "")),
                           f".{key}")
            try:
                got[key] = rules[key](value)
            except _Bad as e:
                raise _Bad(e.expected, e.got, f".{key}{e.suffix}") from None
        missing = [k for k in names if k not in got]
        if missing:  # nothing below to keep: a window's keys, or a packaging bug
            raise _Bad("a value (the key is required)", _Shown("none"), f".{missing[0]}")
        return cls(**{k: got[k] for k in names})
    check.desc = f"a mapping of {', '.join(names)}"  # type: ignore[attr-defined]
    check.layered = True  # type: ignore[attr-defined]
    return check


_MEASURE = re.compile(r"(ttft|duration|tpot)|(stage|attribute):\S.*")


def _measure(v: Any) -> str:
    if not isinstance(v, str) or not _MEASURE.fullmatch(v):
        raise _Bad(_measure.desc, v)  # type: ignore[attr-defined]
    return v


_measure.desc = "ttft, duration, tpot, stage:<child span name> or attribute:<span attribute>"  # type: ignore[attr-defined]
_window = _fields(Window, {"name": _str(), "measure": _measure, "window_ms": _num(0, above=True)})


def _windows(v: Any) -> tuple:
    """The SLI windows: a list of {name, measure, window_ms}, names unique."""
    items = _list(_window)(v)
    seen: set[str] = set()
    for i, w in enumerate(items):
        if w.name in seen:
            raise _Bad("a name no other window has", w.name, f"[{i}].name")
        seen.add(w.name)
    return items


_windows.desc = "a list of windows, each a mapping of name, measure, window_ms"  # type: ignore[attr-defined]
_STATUS_CLASS = _rule('a status class "1xx".."5xx" or a code 100..599',
                      lambda v: isinstance(v, (str, int)) and not isinstance(v, bool)
                      and re.fullmatch(r"[1-5](xx|\d\d)", str(v)) is not None, str)

# The one table: dotted key -> rule. Order here is the order of `dump`.
_RULES: dict[str, Rule] = {
    "select.pids": _list(_int(1)),
    "select.comms": _list(_str("a string of 1..15 characters", lambda s: 1 <= len(s) <= 15)),
    "select.cmdline": _list(_regex),
    "select.ports": _list(_int(1, 65535)),
    "select.rescan_interval_s": _num(0.05, 60),
    "capture.request_bytes": _int(16, 4096),
    "capture.response_bytes": _int(16, 1024),
    "capture.redact_headers": _list(_str("a non-empty header name", conv=str.lower)),
    "capture.keep_query_params": _list(_str("a non-empty parameter name")),
    "capture.genai": _BOOL,
    "capture.body_bytes": _int(16, 4096),
    "capture.tail_bytes": _int(16, 4096, pow2=True),
    "capture.write_peek_bytes": _int(16, 1024),
    "capture.max_writes": _int(1, 1048576),
    "capture.max_payloads": _int(16, 1048576),
    # net.c keeps twice this per CPU, in one per-CPU map value: 32 KiB at most
    "capture.stream_bytes": _int(256, 8192, pow2=True),
    "capture.tls": _BOOL,
    "ring_buffer_mib": _int(1, 1024, pow2=True),
    "stitch.flush_interval_ms": _int(10, 60000),
    "stitch.max_connections": _int(64, 1048576),
    "stitch.run_queue": _BOOL,
    "stitch.read_waits": _BOOL,
    "stitch.outgoing": _BOOL,
    "stitch.kernel_bins": _BOOL,
    "kubernetes.metadata": _choice("auto", "on", "off"),
    "kubernetes.node_name": _str('a node name, or "" ($NODE_NAME, else the host name)', lambda s: True),
    "kubernetes.pod_labels": _list(_str("a label key (string)", lambda s: 1 <= len(s) <= 317)),
    "kubernetes.metric_labels": _list(_choice("namespace", "pod", "container", "owner"), unique=True),
    "kubernetes.max_pods": _int(1, 100000),
    "stitch.join_wait_ms": _int(0, 600000),
    "routes.templates": _list(_str('a string starting with "/"', lambda s: s.startswith("/"))),
    "routes.collapse_ids": _BOOL,
    "routes.max_routes": _int(1, 100000),
    "traces.file": _opt(_PATH),
    "traces.otlp_endpoint": _opt(_str("an http:// or https:// URL",
                                      lambda s: re.match(r"https?://[^/\s]", s) is not None)),
    "traces.otlp_protocol": _opt(_choice("grpc", "http/protobuf")),
    "traces.cpu_budget": _num(0, 1),
    "traces.max_per_second": _int(0),
    "traces.keep_slowest": _int(0),
    "traces.metrics_interval_s": _num(0.1, 3600),
    "traces.export_delay_ms": _int(10, 60000),
    "metrics.address": _str(),
    "metrics.port": _int(0, 65535),
    "engine.markers": _BOOL,
    "engine.join_wait_ms": _int(0, 60000),
    "engine.scheduling_stages": _list(_str("a stage name")),
    "engine.io_stages": _list(_str("a stage name")),
    "engine.cache_stages": _list(_str("a stage name")),
    "engine.network_stages": _list(_str("a stage name")),
    "cache.probes": _cache_probes,
    "cache.resp_mode": _BOOL,
    "cache.prefix_delimiter": _str(),
    "cache.prefix_segments": _int(1, 64),
    "cache.prefix_regex": _opt(_regex),
    "cache.hash_prefixes": _BOOL,
    "cache.export_raw_keys": _BOOL,
    "cache.top_prefixes": _int(1, 100000),
    "cache.bucket_s": _num(0.1, 3600),
    "cache.subnet_v4": _int(0, 32),
    "cache.subnet_v6": _int(0, 128),
    "gpu.enabled": _BOOL,
    "gpu.interval_ms": _int(10, 10000),
    "gpu.cuda_probes": _BOOL,
    "gpu.collapse_drop_ratio": _num(0.01, 0.99),
    "gpu.collapse_floor_percent": _num(0, 100),
    "gpu.collapse_sustain_s": _num(0.1, 3600),
    "gpu.collapse_clear_s": _num(0.1, 3600),
    "gpu.collapse_min_working_percent": _num(0, 100),
    "gpu.collapse_min_history_s": _num(0, 3600),
    "report.windows": _windows,
    "report.valid": _fields(Valid, {
        "status_classes": _list(_STATUS_CLASS),
        "finish_reasons": _list(_str("a non-empty finish reason")),
        "require_finish_reason": _BOOL,
        "require_answer": _BOOL,
        "require_json_valid": _BOOL,
    }),
    "report.uptime_target": _num(0, 1),
    "report.recent_requests": _int(0, 1_000_000),
    "report.tolerance": _fields(Tolerance, {"share": _num(0, 1), "min_ms": _num(0, 60000)}),
    "duration_s": _opt(_num(0, above=True)),
    "stop_timeout_s": _num(0.5, 120),
    "kernel_headers": _opt(_PATH),
    "compiled_dir": _opt(_PATH),
    "socket_hooks": _choice("auto", "socket", "syscall"),
    "log_level": _choice("debug", "info", "warning", "error"),
}
_SECTIONS = {"select": Select, "capture": Capture, "stitch": Stitch, "routes": Routes,
             "traces": Traces, "metrics": Metrics, "engine": Engine,
             "cache": Cache, "gpu": Gpu, "report": Report, "kubernetes": Kubernetes}


def _unknown(source: str, name: str, word: str, choices: list[str]) -> ConfigError:
    err = ConfigError(source, name, "one of: " + ", ".join(choices))
    close = difflib.get_close_matches(word, choices, n=1)
    err.args = (f"{source}: {name}: unknown key (expected one of: {', '.join(choices)})"
                + (f"; did you mean {close[0]}?" if close else ""),)
    return err


def _apply(layer: Mapping, source: str, out: dict[str, Any], dotted: bool) -> None:
    """Check every value of one layer and store it under its dotted key in `out`."""
    items: list[tuple[str, str, Any]] = []  # (section or "", key within it, value)
    for key, value in layer.items():
        key = str(key)
        if key not in _SECTIONS:
            items.append(("", key, value))
        elif isinstance(value, Mapping):
            items += [(key, str(k), v) for k, v in value.items()]
        elif value is not None:  # None: a section left empty
            raise ConfigError(source, key, "a mapping of settings", _show(value))
    for section, key, value in items:
        name = f"{section}.{key}" if section else key
        if name not in _RULES or ("." in key and not dotted):
            level = section or (key.partition(".")[0] if dotted and "." in key else "")
            if level in _SECTIONS:
                choices = [k.partition(".")[2] for k in _RULES if k.startswith(level + ".")]
                raise _unknown(source, name, name.partition(".")[2], choices)
            choices = [k for k in _RULES if "." not in k] + list(_SECTIONS)
            raise _unknown(source, name, name, list(_RULES) if dotted and "." in key else choices)
        rule = _RULES[name]
        try:
            out[name] = rule(value, out.get(name)) if getattr(rule, "layered", False) else rule(value)
        except _Bad as e:
            raise ConfigError(source, name + e.suffix, e.expected, _show(e.got)) from None


# libyaml's parser where PyYAML was built with it (its wheels are): the
# defaults alone take 9 ms to parse in Python, 0.7 ms through it, every start
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, where, "valid YAML", _Shown(f"a syntax error ({problem})")) from None


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _read(path: str | os.PathLike) -> tuple[str, str]:
    """The file's text. Anything but a regular file is refused before it is
    opened: opening a FIFO waits for a writer, forever."""
    source = os.fspath(path)
    try:
        mode = os.stat(source).st_mode
        if not stat.S_ISREG(mode):
            what = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
            raise ConfigError(source, "file", "a regular file", _Shown(what))
        with open(source, encoding="utf-8") as f:
            return f.read(), source
    except FileNotFoundError:
        raise ConfigError(source, "file", "an existing configuration file", _Shown("no such file")) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(source, "file", "a readable UTF-8 YAML file", _Shown(str(e))) from None


def load(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the file at `path`, then `overrides` ({"select.pids": [1], ...})."""
    layers = [(resources.files(__package__).joinpath("defaults.yaml").read_text("utf-8"), DEFAULTS_SOURCE)]
    if path is not None:
        layers.append(_read(path))
    flat: dict[str, Any] = {}
    for text, source in layers:
        data = _parse(text, source)
        if data is None:  # empty file
            continue
        if not isinstance(data, Mapping):
            raise ConfigError(source, "top level", "a mapping of settings (key: value)",
                              _Shown(f"a {type(data).__name__}"))
        _apply(data, source, flat, dotted=False)
    _apply(overrides or {}, OVERRIDES_SOURCE, flat, dotted=True)
    missing = [k for k in _RULES if k not in flat]
    if missing:  # a packaging bug, not a user error
        raise ConfigError(DEFAULTS_SOURCE, missing[0], "a default value")
    top = {k: v for k, v in flat.items() if "." not in k}
    for name, cls in _SECTIONS.items():
        top[name] = cls(**{k.partition(".")[2]: v for k, v in flat.items() if k.startswith(name + ".")})
    return Config(**top)


def dump(config: Config) -> str:
    """The effective configuration as YAML that `load` reads back to an equal Config."""
    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):  # a nested dataclass, as asdict left it
            return {k: plain(x) for k, x in v.items()}
        return v.to_dict() if hasattr(v, "to_dict") else v
    data = {f.name: ({k: plain(x) for k, x in dataclasses.asdict(getattr(config, f.name)).items()}
                     if f.name in _SECTIONS else getattr(config, f.name))
            for f in dataclasses.fields(config)}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
