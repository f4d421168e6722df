"""The OpenTelemetry semantic conventions, in one place: what a
:class:`~sitsprobe.request.Request` of each protocol becomes as a span
(name, kind, attributes) and which metric it feeds. Exporters carry what
this decides and decide nothing themselves.
"""
from __future__ import annotations

from opentelemetry.trace import SpanKind

from ..request import Request
from ..stitch.protocols import UNFRAMED, http1, resp
from ..stitch.segments import SEGMENTS

# RFC 9110 methods, PATCH and QUERY: the "known" methods of the HTTP conventions.
KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
HTTP_DURATION = "http_server_request_duration_seconds"  # HTTP requests only
UNFRAMED_EXCHANGES = "sitsprobe_unframed_exchanges"  # by protocol: what no protocol framed
# a request's latency segments (stitch.segments), seconds, in SEGMENTS order: they add up to its duration
LATENCY_ATTRIBUTES = tuple(f"sitsprobe.latency.{name}_s" for name in SEGMENTS)

Attributes = dict[str, str | int | float | bool | tuple[str, ...]]


def is_http(req: Request) -> bool:
    return req.protocol == http1.NAME


def is_unframed(req: Request) -> bool:
    return req.protocol in UNFRAMED


def span_kind(req: Request) -> SpanKind:
    return SpanKind.CLIENT if req.direction == "client" else SpanKind.SERVER


def span_name(req: Request) -> str:
    if is_http(req):
        method = req.method if req.method in KNOWN_METHODS else "HTTP"
        return f"{method} {req.route or req.path or 'unknown'}"
    if req.protocol == resp.NAME:
        return req.method or "redis"
    return f"{req.comm} {req.protocol} exchange"


def span_attributes(req: Request) -> Attributes:
    attrs: dict[str, str | int | float | bool | None] = {
        "process.pid": req.pid,
        "sitsprobe.fd": req.fd,
        "sitsprobe.complete": req.complete,
        "sitsprobe.partial": req.partial,
        "network.transport": req.transport,  # None (not TCP) is left out below
        "error.type": _error_type(req),
    }
    if req.first_out_ns is not None:
        attrs["sitsprobe.time_to_first_byte_s"] = (req.first_out_ns - req.start_ns) / 1e9
    if req.local is not None:
        attrs["server.address"] = req.local.address
        attrs["server.port"] = req.local.port
    if req.peer is not None:
        attrs["client.address"] = attrs["network.peer.address"] = req.peer.address
        attrs["client.port"] = attrs["network.peer.port"] = req.peer.port
    if is_http(req):
        attrs.update(_http(req))
    elif req.protocol == resp.NAME:
        attrs.update({"db.system.name": "redis", "db.operation.name": req.method,
                      "sitsprobe.bytes_in": req.bytes_in, "sitsprobe.bytes_out": req.bytes_out})
    else:
        attrs.update({"sitsprobe.protocol": req.protocol, "sitsprobe.bytes_in": req.bytes_in,
                      "sitsprobe.bytes_out": req.bytes_out})
    if req.genai is not None:
        attrs.update(_gen_ai(req))
        attrs["error.type"] = attrs["error.type"] or req.genai.error_type
    if req.inference is not None:  # what only the engine's markers tell
        attrs["sitsprobe.engine.request_id"] = req.inference.request_id
        attrs["sitsprobe.kv_cache.peak_bytes"] = req.inference.kv_bytes
    if req.segments is not None:
        attrs.update(zip(LATENCY_ATTRIBUTES, (ns / 1e9 for ns in req.segments)))
    if req.gpu is not None:
        attrs.update(req.gpu.request)
    return {k: v for k, v in attrs.items() if v is not None}


def _http(req: Request) -> dict:
    name, _, version = req.protocol.partition("/")
    known = req.method is None or req.method in KNOWN_METHODS
    return {
        "http.request.method": req.method if known else "_OTHER",
        "http.request.method_original": None if known else req.method,
        "http.route": req.route,
        "http.response.status_code": req.status,
        # a request the agent saw none of, or whose head it did not capture, has no size
        "http.request.size": None if req.partial else req.bytes_in,
        "http.response.size": req.bytes_out,
        "url.scheme": "http",
        "url.path": req.path,
        "url.query": (req.target or "").partition("?")[2].partition("#")[0] or None,
        "network.protocol.name": name,
        "network.protocol.version": version or None,
        "user_agent.original": req.user_agent,
    }


def _gen_ai(req: Request) -> dict:
    """``req.genai`` (from the wire, the markers, or both merged) as the GenAI
    conventions' attributes, and sitsprobe's own on how it was read."""
    g = req.genai
    ttft, tpot = req.ttft_ns, req.tpot_ns
    return {
        "gen_ai.operation.name": g.operation,
        "gen_ai.provider.name": g.provider,
        "gen_ai.request.model": g.request_model,
        "gen_ai.request.max_tokens": g.max_tokens,
        "gen_ai.response.model": g.response_model,
        "gen_ai.response.finish_reasons": g.finish_reasons or None,
        "gen_ai.usage.input_tokens": g.input_tokens,
        "gen_ai.usage.output_tokens": g.output_tokens,
        "gen_ai.server.time_to_first_token": None if ttft is None else ttft / 1e9,
        "gen_ai.server.time_per_output_token": None if tpot is None else tpot / 1e9,
        "sitsprobe.genai.source": g.source,
        "sitsprobe.genai.usage_source": g.usage_source,
        "sitsprobe.genai.stream_events": g.events if g.streaming else None,
        "sitsprobe.genai.content_events": g.content_events if g.streaming else None,
        "sitsprobe.genai.max_stall_s": None if g.max_gap_ns is None else g.max_gap_ns / 1e9,
        "sitsprobe.genai.events_approximate": True if g.events_approximate else None,
        "sitsprobe.genai.answer_empty": g.answer_empty,
        "sitsprobe.genai.json_valid": g.json_valid,
    }


def _error_type(req: Request) -> str | None:
    if req.status is not None and req.status >= 500:
        return str(req.status)
    return None if req.complete else "incomplete"
