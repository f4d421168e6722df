"""Spans as OTLP, built straight from what the exporter decided: protobuf for the
network, OTLP/JSON for the file.

:class:`SpanData` is one finished span, small and immutable, made on the agent's
loop; each sink encodes a batch of them in its own thread: :func:`encode` into an
``ExportTraceServiceRequest`` (opentelemetry-proto's generated class, from wire
bytes written here), :func:`otlp_json_line` into the same request as a line of
OTLP/JSON. Spans are grouped by resource (one per traced process) in order of
first appearance, under one scope ("sitsprobe", its version). A span costs about
what its attributes number, so both encoders take the usual value types by exact
type first, and keep the encoded KeyValue of a string or an integer: most recur
(method, route, address, port, status, pid).

:func:`network_sink` hands :func:`encode` to the SDK's OTLP exporters as their
translation step, so everything else stays theirs: endpoint, headers, TLS,
compression, timeout, retries.
"""
from __future__ import annotations

import base64
import json
import logging
import math
import struct
import threading
import types
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import NamedTuple

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from sitsprobe import __version__

from . import otlp_settings

log = logging.getLogger(__name__)

SCOPE = ("sitsprobe", __version__)  # every span's instrumentation scope: name, version
SDK_VERSIONS = ">=1.35,<1.46"  # the SDK exporters network_sink works with, as pyproject.toml pins them
# SpanFlags: the parent's remoteness is known; and it is remote
HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps with the file's separators
_str = encode_basestring_ascii  # a str as json.dumps writes it: quoted, escaped, ASCII only
_SCOPE_JSON = _dumps({"name": SCOPE[0], "version": SCOPE[1]})
_KEY_JSON: dict[str, str] = {}  # attribute key -> its KeyValue's text up to the value
_KV_JSON: dict[tuple[str, str | int], str] = {}  # (key, value) -> its KeyValue's text
_MAX_KEYS_KEPT = 4096
_MAX_VALUES_KEPT = 8192  # (key, value) pairs kept, then forgotten all at once: the usual ones come back


class SpanResource:
    """A traced process's resource, encoded once for every span that names it
    (compared by identity: two processes with equal attributes stay two)."""

    __slots__ = ("attributes", "schema_url", "wire", "json")

    def __init__(self, resource: Resource) -> None:
        self.attributes = resource.attributes
        self.schema_url = resource.schema_url
        # a ResourceSpans' resource field, and its schema URL's
        self.wire = _field(b"\x0a", _repeated(b"\x0a", _key_values(self.attributes)))
        if self.schema_url:
            self.wire += _field(b"\x1a", self.schema_url.encode())
        attributes = _attributes_json(self.attributes)
        self.json = f'{{"attributes":[{attributes}]}}' if attributes else "{}"  # as OTLP/JSON text


class SpanData(NamedTuple):
    """One finished span, as both encoders read it."""

    resource: SpanResource
    trace_id: int
    span_id: int
    parent_id: int  # 0: a root
    flags: int  # SpanFlags: HAS_IS_REMOTE, with IS_REMOTE for a remote parent
    trace_state: str  # W3C tracestate, "" for none
    name: str
    kind: int  # OTLP SpanKind number
    start_ns: int  # Unix epoch ns
    end_ns: int
    attributes: Mapping[str, object]
    error: bool  # status ERROR, else UNSET


# -- protobuf -------------------------------------------------------------------------
# Written as protobuf's wire bytes, piece by piece, then parsed once by protobuf's C
# runtime: setting the generated classes' fields one by one cost 13-14 µs for a span
# of 27 attributes, these bytes and the parse 5-6 (bench/bench_spans.py). The field
# numbers are opentelemetry-proto's (trace/v1/trace.proto, common/v1/common.proto).

def _varint(n: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + _varint(len(payload)) + payload


_BYTES = [bytes((i,)) for i in range(0x80)]
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_UINT64 = 2**64 - 1
_SCOPE_WIRE = _field(b"\x0a", InstrumentationScope(name=SCOPE[0], version=SCOPE[1]).SerializeToString())
_STATUS_UNSET = b"\x7a\x00"  # an empty status, as the SDK's encoder sends
_STATUS_ERROR = _field(b"\x7a", Status(code=Status.STATUS_CODE_ERROR).SerializeToString())
_KEY_WIRE: dict[str, bytes] = {}  # attribute key -> its KeyValue's key field and value tag
_KV_WIRE: dict[tuple[str, str | int], bytes] = {}  # (key, value) -> its KeyValue, after its length


def encode(spans: Sequence[SpanData]) -> ExportTraceServiceRequest:
    """``spans`` as one ExportTraceServiceRequest."""
    return ExportTraceServiceRequest.FromString(encode_wire(spans))


def encode_wire(spans: Sequence[SpanData]) -> bytes:
    """``spans`` as the bytes of one ExportTraceServiceRequest."""
    groups: dict[SpanResource, list[bytes]] = {}
    for s in spans:
        out = groups.get(s.resource)
        if out is None:
            out = groups[s.resource] = [_SCOPE_WIRE]
        out.append(_span_wire(s))
    return b"".join(
        _field(b"\x0a", r.wire + _field(b"\x12", b"".join(scope_spans))) for r, scope_spans in groups.items())


def _span_wire(s: SpanData) -> bytes:
    """One Span field of a ScopeSpans."""
    name = s.name.encode()
    return _field(b"\x12", b"".join((
        b"\x0a\x10", s.trace_id.to_bytes(16, "big"),
        b"\x12\x08", s.span_id.to_bytes(8, "big"),
        _field(b"\x1a", s.trace_state.encode()) if s.trace_state else b"",
        b"\x22\x08" + s.parent_id.to_bytes(8, "big") if s.parent_id else b"",
        b"\x2a", _varint(len(name)), name,
        b"\x30", _varint(s.kind),
        b"\x39", _pack_fixed64(s.start_ns),
        b"\x41", _pack_fixed64(s.end_ns),
        _repeated(b"\x4a", _key_values(s.attributes)),
        _STATUS_ERROR if s.error else _STATUS_UNSET,
        b"\x85\x01", _pack_fixed32(s.flags),
    )))


def _repeated(tag: bytes, items: list[bytes]) -> bytes:
    """A repeated field of ``items``, each a message's length and bytes."""
    return tag + tag.join(items) if items else b""


def _key_values(attributes: Mapping[str, object]) -> list[bytes]:
    """``attributes`` as KeyValue messages, each after its length (the field's tag
    is the caller's: a Span's and a Resource's differ). The usual types are
    written by exact type, the fast path, and the KeyValue of a string or an
    integer is kept, for the many that recur. A value that cannot be encoded
    loses its attribute, with a warning, as in the SDK's encoder."""
    out = []
    kept, keys = _KV_WIRE, _KEY_WIRE
    for key, value in attributes.items():
        t = type(value)
        if t is str or t is int:  # not a bool: True would find 1's
            kv = kept.get((key, value))
            if kv is not None:
                out.append(kv)
                continue
        try:
            k = keys.get(key)
            if k is None:
                k = _field(b"\x0a", key.encode()) + b"\x12"
                if len(keys) < _MAX_KEYS_KEPT:
                    keys[key] = k
            if t is str:  # v: the AnyValue, after its length
                v = _field(b"\x0a", value.encode())
                v = _varint(len(v)) + v
            elif t is int and _INT64_MIN <= value <= _INT64_MAX:
                v = b"\x18" + _varint(value & _UINT64)
                v = _varint(len(v)) + v
            elif t is float:
                v = b"\x09\x21" + _pack_double(value)  # 9: the tag and 8 bytes
            elif t is bool:
                v = b"\x02\x10\x01" if value else b"\x02\x10\x00"
            else:
                av = AnyValue()
                _set_value(av, value)
                v = av.SerializeToString()
                v = _varint(len(v)) + v
        except (TypeError, ValueError) as e:
            log.warning("cannot encode attribute %s: %s", key, e)
            continue
        kv = k + v
        kv = _varint(len(kv)) + kv
        if t is str or t is int:
            if len(kept) >= _MAX_VALUES_KEPT:
                kept.clear()
            kept[key, value] = kv
        out.append(kv)
    return out


def _set_value(av, value: object) -> None:
    """Any other attribute value into the AnyValue ``av`` (the kinds :func:`_value` takes)."""
    if isinstance(value, str):
        av.string_value = value
    elif isinstance(value, bool):
        av.bool_value = value
    elif isinstance(value, int):
        av.int_value = value
    elif isinstance(value, float):
        av.double_value = value
    elif value is None:
        av.SetInParent()  # an empty AnyValue
    elif isinstance(value, bytes):
        av.bytes_value = value
    elif isinstance(value, Sequence):
        av.array_value.SetInParent()
        for v in value:
            _set_value(av.array_value.values.add(), v)
    elif isinstance(value, Mapping):
        av.kvlist_value.SetInParent()
        for k, v in value.items():
            _set_value(av.kvlist_value.values.add(key=str(k)).value, v)
    else:
        raise TypeError(f"invalid attribute value type {type(value).__name__}: {value!r}")


# -- OTLP/JSON ------------------------------------------------------------------------

def otlp_json_line(spans: Sequence[SpanData]) -> str:
    """``spans`` as one OTLP/JSON ExportTraceServiceRequest on one line (without
    its newline): the file sink's line.

    What protobuf's JSON mapping of :func:`encode` gives (:func:`protobuf_json`):
    int64 and fixed64 values as decimal strings, enums as numbers, bytes as
    base64, fields at their default left out; trace and span ids as lowercase
    hex, as OTLP/JSON wants. Written as text, piece by piece, exactly as
    ``json.dumps(doc, separators=(",", ":"))`` writes such a document (ASCII
    only, floats by repr): a dict for every field and json.dumps cost some four
    times as much for a span of 27 attributes.
    """
    groups: dict[SpanResource, list[str]] = {}
    for s in spans:
        groups.setdefault(s.resource, []).append(_span_json(s))
    if not groups:
        return "{}"
    out = []
    for resource, encoded in groups.items():
        schema = f',"schemaUrl":{_str(resource.schema_url)}' if resource.schema_url else ""
        out.append(f'{{"resource":{resource.json},"scopeSpans":[{{"scope":{_SCOPE_JSON},"spans":['
                   f'{",".join(encoded)}]}}]{schema}}}')
    return f'{{"resourceSpans":[{",".join(out)}]}}'


def otlp_json(spans: Sequence) -> dict:
    """``spans`` as one OTLP/JSON ExportTraceServiceRequest, a dict: the file
    sink's line (:func:`otlp_json_line`), parsed. SDK spans (ReadableSpan, as
    tests and tools make them) are encoded by the SDK's own encoder."""
    if spans and not isinstance(spans[0], SpanData):
        return protobuf_json(encode_spans(spans))
    return json.loads(otlp_json_line(spans))


def protobuf_json(request: ExportTraceServiceRequest) -> dict:
    """protobuf's own JSON mapping of ``request``, ids made hex: the reference
    :func:`otlp_json` equals (slow: for SDK spans and for tests)."""
    doc = MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for obj in (span, *span.get("links", ())):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64decode(obj[key]).hex()
    return doc


def _span_json(s: SpanData) -> str:
    out = f'{{"traceId":"{s.trace_id:032x}","spanId":"{s.span_id:016x}"'
    if s.trace_state:
        out += f',"traceState":{_str(s.trace_state)}'
    if s.parent_id:
        out += f',"parentSpanId":"{s.parent_id:016x}"'
    out += f',"flags":{s.flags}'
    if s.name:
        out += f',"name":{_str(s.name)}'
    out += f',"kind":{s.kind}'
    if s.start_ns:
        out += f',"startTimeUnixNano":"{s.start_ns}"'
    if s.end_ns:
        out += f',"endTimeUnixNano":"{s.end_ns}"'
    if attributes := _attributes_json(s.attributes):
        out += f',"attributes":[{attributes}]'
    return out + (',"status":{"code":2}}' if s.error else ',"status":{}}')  # 2: STATUS_CODE_ERROR


def _attributes_json(attributes: Mapping[str, object]) -> str:
    """``attributes`` as OTLP/JSON KeyValues, comma-separated: the usual types by
    exact type (the fast path, as in :func:`_key_values`), the others by
    :func:`_value`. A value that cannot be encoded loses its attribute, with a warning.
    Each key's text is written once (_KEY_JSON): the agent's keys are a few hundred;
    a string's or an integer's KeyValue too (_KV_JSON), for the many that recur."""
    out = []
    kept, keys = _KV_JSON, _KEY_JSON
    for key, value in attributes.items():
        t = type(value)
        if t is str or t is int:  # not a bool: True would find 1's
            kv = kept.get((key, value))
            if kv is not None:
                out.append(kv)
                continue
        k = keys.get(key)
        if k is None:
            k = '{"key":' + _str(key) + ',"value":'
            if len(keys) < _MAX_KEYS_KEPT:
                keys[key] = k
        if t is str:
            kv = k + '{"stringValue":' + _str(value) + "}}"
        elif t is int and _INT64_MIN <= value <= _INT64_MAX:
            kv = f'{k}{{"intValue":"{value}"}}}}'
        elif t is float and math.isfinite(value):
            out.append(k + '{"doubleValue":' + repr(value) + "}}")  # as json.dumps writes a float
            continue
        elif t is bool:
            out.append(k + ('{"boolValue":true}}' if value else '{"boolValue":false}}'))
            continue
        else:
            try:
                out.append(k + _dumps(_value(value)) + "}")
            except (TypeError, ValueError) as e:  # as the SDK's encoder: lose the one attribute
                log.warning("cannot encode attribute %s: %s", key, e)
            continue
        if len(kept) >= _MAX_VALUES_KEPT:
            kept.clear()
        kept[key, value] = kv
        out.append(kv)
    return ",".join(out)


def _value(value: object) -> dict:
    """An attribute value as an OTLP/JSON AnyValue."""
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"int64 out of range: {value}")
        return {"intValue": str(int(value))}
    if isinstance(value, float):
        if not math.isfinite(value):  # JSON has no NaN or infinities: protobuf's names for them
            return {"doubleValue": "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"}
        return {"doubleValue": value}
    if value is None:
        return {}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [_value(v) for v in value]} if value else {}}
    if isinstance(value, Mapping):
        kvs = [{"key": str(k), "value": _value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": kvs} if kvs else {}}
    raise TypeError(f"invalid attribute value type {type(value).__name__}: {value!r}")


# -- the sinks ----------------------------------------------------------------------

class OtlpJsonFileExporter(SpanExporter):
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per line per export
    (:func:`otlp_json_line`).

    The format of the OpenTelemetry Collector's ``file`` exporter: camelCase
    fields, enums as numbers, trace and span ids as lowercase hex.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[SpanData]) -> SpanExportResult:
        line = otlp_json_line(spans) + "\n"
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                log.warning("cannot write traces to %s: %s", self.path, e)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def network_sink(otlp: otlp_settings.OtlpSettings):
    """The SDK's OTLP span exporter for ``otlp`` (:func:`otlp_settings.span_exporter`),
    its translation step -- where it turns SDK spans into an ExportTraceServiceRequest --
    replaced by :func:`encode`: its ``export`` then takes a sequence of SpanData, and
    everything after the translation stays the SDK's (serialising, compression, the
    size limit, retries with backoff, its own metrics).

    Written against opentelemetry-exporter-otlp-proto-grpc and -http 1.45.2. The step
    is, over gRPC, the exporter's ``_translate_data`` (with ``_count_data`` for its
    metrics, from 1.44), the same since before 1.25; over HTTP, ``export``'s call of
    its module's ``encode_spans``, since 1.35 (before, through ``_serialize_spans``).
    Hence the range pyproject.toml pins (SDK_VERSIONS); an exporter of another shape
    is refused here, at start, rather than found out by lost spans.
    """
    exporter = otlp_settings.span_exporter(otlp)
    cls = type(exporter)
    if otlp.protocol == "grpc":
        if not callable(getattr(cls, "_translate_data", None)):
            raise RuntimeError(f"{cls.__module__}.{cls.__name__} has no _translate_data to hand spans to: "
                               f"install opentelemetry-exporter-otlp{SDK_VERSIONS}")
        exporter._translate_data = encode
        exporter._count_data = len
        return exporter
    export = cls.export
    if "encode_spans" not in export.__code__.co_names:
        raise RuntimeError(f"{cls.__module__}.{cls.__name__}.export no longer calls encode_spans: "
                           f"install opentelemetry-exporter-otlp{SDK_VERSIONS}")
    # the SDK's own export, as a function whose globals have encode() for encode_spans
    ours = types.FunctionType(export.__code__, {**export.__globals__, "encode_spans": encode},
                              export.__name__, export.__defaults__, export.__closure__)
    exporter.export = types.MethodType(ours, exporter)
    return exporter
