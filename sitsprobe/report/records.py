"""One compact record per request: what `sitsprobe report` computes from.

A :class:`RequestRecord` comes from an exported SERVER span in OTLP/JSON
(:meth:`RequestRecord.from_span`, what a traces file holds) or from the agent's
own :class:`~sitsprobe.request.Request` and the attributes its span gets
(:meth:`RequestRecord.from_request`, for a running agent's recent requests).
Both read the same attribute names through one function, so a request gives
equal records either way. Times are integers in ns, durations floats in s.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..export.semconv import LATENCY_ATTRIBUTES, span_name
from ..stitch.segments import SEGMENTS

# The five latency segments (the methodology's 网络/调度/计算/IO/缓存), each a
# server-span attribute in seconds; together they should make up the duration.
SEGMENT_ATTRIBUTE = dict(zip(SEGMENTS, LATENCY_ATTRIBUTES))

SPAN_KIND_SERVER = 2


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request, as the report sees it. None: not known."""

    trace_id: str | None  # 32 lowercase hex digits, as OTLP/JSON writes it
    name: str  # the server span's name: "POST /v1/chat/completions"
    start_ns: int  # Unix epoch ns (CLOCK_MONOTONIC ns for a record made without a clock)
    end_ns: int
    segments: Mapping[str, float] = field(default_factory=dict)  # SEGMENTS present, seconds
    status: int | None = None  # http.response.status_code
    route: str | None = None
    model: str | None = None  # gen_ai.response.model, else gen_ai.request.model
    finish_reasons: tuple[str, ...] = ()
    ttft_s: float | None = None  # gen_ai.server.time_to_first_token
    tpot_s: float | None = None  # gen_ai.server.time_per_output_token
    output_tokens: int | None = None
    answer_empty: bool | None = None  # sitsprobe.genai.answer_empty
    json_valid: bool | None = None  # sitsprobe.genai.json_valid: only where JSON was asked
    error_type: str | None = None
    genai: bool = False  # the span has gen_ai.* attributes
    stages: Mapping[str, float] = field(default_factory=dict)  # child span name -> seconds, summed
    attributes: Mapping[str, float] = field(default_factory=dict)  # the numeric attributes asked for

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    def segment(self, name: str) -> float:
        """A segment in seconds; 0 where the span has none of that kind."""
        return self.segments.get(name, 0.0)

    @property
    def residual_s(self) -> float:
        """Duration minus the sum of the segments."""
        return self.duration_s - sum(self.segments.values())

    def measure(self, what: str) -> float | None:
        """The value, in seconds, of an SLI measure (see config.Window.measure)."""
        if what == "duration":
            return self.duration_s
        if what == "ttft":
            return self.ttft_s
        if what == "tpot":
            return self.tpot_s
        kind, _, name = what.partition(":")
        if kind == "stage":
            return self.stages.get(name)
        if kind == "attribute":
            return self.attributes.get(name)
        raise ValueError(f"unknown measure {what!r}")

    # -- from a span, from the agent --------------------------------------------

    @classmethod
    def from_span(cls, span: Mapping, children: Iterable[Mapping] = (),
                  keep: Iterable[str] = ()) -> RequestRecord:
        """A record from one OTLP/JSON span (a dict of a file line's
        resourceSpans[].scopeSpans[].spans[]) and its child spans. ``keep``:
        numeric attributes to keep (by name), of the span, else of its first
        child that has it. Raises ValueError where the span has no valid times."""
        keep = tuple(keep)
        start, end = _ns(span.get("startTimeUnixNano")), _ns(span.get("endTimeUnixNano"))
        if start is None or end is None:
            raise ValueError("a span without startTimeUnixNano and endTimeUnixNano")
        trace_id = span.get("traceId")
        rec = from_parts(trace_id if isinstance(trace_id, str) and trace_id else None,
                         str(span.get("name", "")), start, end,
                         decode_attributes(span.get("attributes")), {}, keep, {})
        acc = Children()
        for child in children:
            acc.add(child, keep)
        return acc.apply(rec) if acc else rec

    @classmethod
    def from_request(cls, req: Any, attrs: Mapping[str, Any], *, clock: Any = None,
                     trace_id: int | str | None = None, keep: Iterable[str] = ()) -> RequestRecord:
        """A record from the agent's Request and the attributes its span gets
        (``sitsprobe.export.semconv.span_attributes(req)``): equal to what
        :meth:`from_span` makes of the exported span, given the exporter's
        ``clock`` (a WallClock; without one times stay CLOCK_MONOTONIC) and the
        span's trace id (default: the caller's traceparent's, else unknown)."""
        wall = clock.to_wall_ns if clock is not None else (lambda ns: ns)
        if trace_id is None and req.traceparent is not None:
            trace_id = req.traceparent.trace_id
        if isinstance(trace_id, int):
            trace_id = f"{trace_id:032x}"
        stages: dict[str, int] = {}
        if req.inference is not None:
            for st in req.inference.stages:  # as TraceExporter._engine_spans makes them (a
                # span's ends convert with one offset: its duration is the monotonic one)
                stages[st.name] = stages.get(st.name, 0) + max(0, st.end_ns - st.start_ns)
            for c in req.inference.cache:
                name = f"cache_get {c.cache}"
                stages[name] = stages.get(name, 0)
        return from_parts(trace_id, span_name(req), wall(req.start_ns), wall(req.end_ns),
                          attrs, stages, tuple(keep), {})

    # -- as JSON (the agent's /report/requests.json) ------------------------------

    def to_dict(self) -> dict:
        """Plain JSON values; fields at None or empty left out."""
        out = {name: getattr(self, name) for name in _FIELDS}
        out["segments"], out["stages"] = dict(self.segments), dict(self.stages)
        out["attributes"], out["finish_reasons"] = dict(self.attributes), list(self.finish_reasons)
        return {k: v for k, v in out.items() if v is not None and v != {} and v != []}

    @classmethod
    def from_dict(cls, d: Mapping) -> RequestRecord:
        """The inverse of :meth:`to_dict`; raises TypeError or ValueError on a bad shape."""
        if not isinstance(d, Mapping):
            raise TypeError(f"a record is a JSON object, not {type(d).__name__}")
        start, end = d.get("start_ns"), d.get("end_ns")
        if not _is_int(start) or not _is_int(end):
            raise ValueError("a record without integer start_ns and end_ns")

        def floats(v: Any) -> dict[str, float]:
            return {str(k): float(x) for k, x in (v or {}).items() if _is_num(x)}
        return cls(
            trace_id=_opt(d.get("trace_id"), str), name=str(d.get("name", "")), start_ns=start,
            end_ns=end, segments={s: v for s, v in floats(d.get("segments")).items() if s in SEGMENTS},
            status=_opt(d.get("status"), int), route=_opt(d.get("route"), str),
            model=_opt(d.get("model"), str),
            finish_reasons=tuple(str(x) for x in d.get("finish_reasons") or ()),
            ttft_s=_opt(d.get("ttft_s"), float), tpot_s=_opt(d.get("tpot_s"), float),
            output_tokens=_opt(d.get("output_tokens"), int),
            answer_empty=_opt(d.get("answer_empty"), bool), json_valid=_opt(d.get("json_valid"), bool),
            error_type=_opt(d.get("error_type"), str), genai=bool(d.get("genai", False)),
            stages=floats(d.get("stages")), attributes=floats(d.get("attributes")))


_FIELDS = tuple(f.name for f in fields(RequestRecord))


class Children:
    """The child spans of one server span, summed by name as they come (a
    file may hold them before or after their parent, in any line)."""

    __slots__ = ("attrs", "stage_ns")

    def __init__(self) -> None:
        self.stage_ns: dict[str, int] = {}
        self.attrs: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self.stage_ns or self.attrs)

    def add(self, child: Mapping, keep: tuple[str, ...] = ()) -> None:
        """One child span (OTLP/JSON); one without valid times adds no stage."""
        start, end = _ns(child.get("startTimeUnixNano")), _ns(child.get("endTimeUnixNano"))
        if start is not None and end is not None:
            name = str(child.get("name", ""))
            self.stage_ns[name] = self.stage_ns.get(name, 0) + max(0, end - start)
        if keep:
            for k, v in numeric(decode_attributes(child.get("attributes")), keep).items():
                self.attrs.setdefault(k, v)

    def apply(self, rec: RequestRecord) -> RequestRecord:
        """``rec`` (made with no children) with these as its stages and kept attributes."""
        return replace(rec, stages=_stages(self.stage_ns), attributes={**self.attrs, **rec.attributes})


def _stages(stage_ns: Mapping[str, int]) -> dict[str, float]:
    return {sys.intern(k): ns / 1e9 for k, ns in stage_ns.items()}


def from_parts(trace_id: str | None, name: str, start_ns: int, end_ns: int, attrs: Mapping[str, Any],
               stage_ns: Mapping[str, int], keep: tuple[str, ...],
               child_attrs: Mapping[str, float]) -> RequestRecord:
    """The one place attribute names become fields, for every way in."""
    def num(key: str) -> float | None:
        v = attrs.get(key)
        return float(v) if _is_num(v) and math.isfinite(v) else None

    def integer(key: str) -> int | None:
        v = attrs.get(key)
        return v if _is_int(v) else None

    def text(key: str) -> str | None:
        v = attrs.get(key)
        return sys.intern(v) if isinstance(v, str) and v else None

    def flag(key: str) -> bool | None:
        v = attrs.get(key)
        return v if isinstance(v, bool) else None

    segments = {s: v for s in SEGMENTS if (v := num(SEGMENT_ATTRIBUTE[s])) is not None}
    reasons = attrs.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, str):
        reasons = (reasons,)
    kept = {**child_attrs, **numeric(attrs, keep)} if keep else {}
    return RequestRecord(
        trace_id=trace_id.lower() if trace_id else None,
        name=sys.intern(name), start_ns=start_ns, end_ns=end_ns, segments=segments,
        status=integer("http.response.status_code"), route=text("http.route"),
        model=text("gen_ai.response.model") or text("gen_ai.request.model"),
        finish_reasons=tuple(sys.intern(str(r)) for r in reasons or () if isinstance(r, str)),
        ttft_s=num("gen_ai.server.time_to_first_token"),
        tpot_s=num("gen_ai.server.time_per_output_token"),
        output_tokens=integer("gen_ai.usage.output_tokens"),
        answer_empty=flag("sitsprobe.genai.answer_empty"), json_valid=flag("sitsprobe.genai.json_valid"),
        error_type=text("error.type"), genai=any(k.startswith("gen_ai.") for k in attrs),
        stages=_stages(stage_ns), attributes=kept)


def numeric(attrs: Mapping[str, Any], keep: Iterable[str]) -> dict[str, float]:
    """Those of ``keep`` that ``attrs`` has as finite numbers, as floats."""
    return {k: float(v) for k in keep if _is_num(v := attrs.get(k)) and math.isfinite(v)}


def decode_attributes(encoded: Any) -> dict[str, Any]:
    """OTLP/JSON attributes ([{key, value: AnyValue}]) as a plain dict: intValue
    (a decimal string) as int, doubleValue as float ("NaN", "Infinity" too),
    arrayValue as a tuple, kvlistValue as a dict. Malformed entries are left out."""
    out: dict[str, Any] = {}
    if not isinstance(encoded, list):
        return out
    for kv in encoded:
        if isinstance(kv, Mapping) and isinstance(kv.get("key"), str):
            try:
                out[kv["key"]] = _any_value(kv.get("value"))
            except (TypeError, ValueError):
                continue
    return out


def _any_value(v: Any) -> Any:
    if not isinstance(v, Mapping) or not v:
        return None
    if "stringValue" in v:
        return str(v["stringValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return int(v["intValue"])  # a decimal string, or a number from a lenient writer
    if "doubleValue" in v:
        return float(v["doubleValue"])  # float("NaN"), float("Infinity") as protobuf writes them
    if "arrayValue" in v:
        return tuple(_any_value(x) for x in (v["arrayValue"] or {}).get("values", ()))
    if "kvlistValue" in v:
        return decode_attributes((v["kvlistValue"] or {}).get("values"))
    if "bytesValue" in v:
        return str(v["bytesValue"])  # base64, kept as text
    return None


def _ns(v: Any) -> int | None:
    """A fixed64 time: a decimal string (or an integer); None if neither or 0."""
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    return v if _is_int(v) and v > 0 else None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt(v: Any, kind: type) -> Any:
    if v is None:
        return None
    if kind is bool:
        if not isinstance(v, bool):
            raise TypeError(f"expected true or false, got {v!r}")
        return v
    if kind in (int, float) and not _is_num(v):
        raise TypeError(f"expected a number, got {v!r}")
    return kind(v)
