"""The OpenTelemetry semantic conventions, in one place: what a
:class:`~sitsprobe.request.Request` of each protocol becomes as a span
(name, kind, attributes) and which metric it feeds. Exporters carry what
this decides and decide nothing themselves.

By direction (``Request.direction``) and protocol:
  server HTTP/1.1, HTTP/2   ``{method} {route}``: http.*, url.scheme/path/query, server.* the
                            local endpoint, client.* the peer
  client HTTP/1.1, HTTP/2   ``{method}``: http.*, url.full, server.* the server called (the
                            :authority, else the peer), never client.*
  gRPC (``h2.grpc``)        ``pkg.Service/Method``: rpc.*, server.* (server: local; client: the
                            :authority, else the peer), no http.* or url.*
  Redis (``resp``)          ``{command}``: db.system.name, db.operation.name; never a key
  anything else             ``{comm} {protocol} exchange``: sitsprobe.protocol and byte counts
"""
from __future__ import annotations

import re

from opentelemetry.trace import SpanKind

from ..redact import redact_target
from ..request import CLIENT_CLOSED, H2, Request
from ..stitch.protocols import UNFRAMED, http1, resp
from ..stitch.segments import SEGMENTS

# RFC 9110 methods, PATCH and QUERY: the "known" methods of the HTTP conventions.
KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
HTTP2 = "http/2"  # Request.protocol of an HTTP/2 stream, a gRPC call's too (Request.h2)
OTHER = "_OTHER"  # the conventions' value for a method they do not know
# the metrics' names, as Prometheus spells them
HTTP_DURATION = "http_server_request_duration_seconds"  # HTTP server requests only
HTTP_CLIENT_DURATION = "http_client_request_duration_seconds"
RPC_SERVER_DURATION = "rpc_server_call_duration_seconds"
RPC_CLIENT_DURATION = "rpc_client_call_duration_seconds"
DB_CLIENT_DURATION = "db_client_operation_duration_seconds"
UNFRAMED_EXCHANGES = "sitsprobe_unframed_exchanges"  # by protocol: what no protocol framed
GENAI_TTFT = "gen_ai_server_time_to_first_token_seconds"
GENAI_TPOT = "gen_ai_server_time_per_output_token_seconds"
GENAI_DURATION = "gen_ai_server_request_duration_seconds"
GENAI_TOKENS = "gen_ai_server_tokens"  # a counter: the conventions have none for a server's tokens
GENAI_CLIENT_DURATION = "gen_ai_client_operation_duration_seconds"
GENAI_CLIENT_TTFC = "gen_ai_client_operation_time_to_first_chunk_seconds"
GENAI_CLIENT_TPOC = "gen_ai_client_operation_time_per_output_chunk_seconds"
GENAI_CLIENT_TOKENS = "gen_ai_client_token_usage"
# The conventions' metrics as OTLP names them, and their units (otlp_metrics):
# Prometheus spells each the way the Collector's remote write translates it back.
OTLP_NAMES = {
    HTTP_DURATION: ("http.server.request.duration", "s"),
    HTTP_CLIENT_DURATION: ("http.client.request.duration", "s"),
    RPC_SERVER_DURATION: ("rpc.server.call.duration", "s"),
    RPC_CLIENT_DURATION: ("rpc.client.call.duration", "s"),
    DB_CLIENT_DURATION: ("db.client.operation.duration", "s"),
    GENAI_TTFT: ("gen_ai.server.time_to_first_token", "s"),
    GENAI_TPOT: ("gen_ai.server.time_per_output_token", "s"),
    GENAI_DURATION: ("gen_ai.server.request.duration", "s"),
    GENAI_TOKENS: ("gen_ai.server.tokens", "{token}"),
    GENAI_CLIENT_DURATION: ("gen_ai.client.operation.duration", "s"),
    GENAI_CLIENT_TTFC: ("gen_ai.client.operation.time_to_first_chunk", "s"),
    GENAI_CLIENT_TPOC: ("gen_ai.client.operation.time_per_output_chunk", "s"),
    GENAI_CLIENT_TOKENS: ("gen_ai.client.token.usage", "{token}"),
}
# The metrics' labels that are the conventions' attributes, as Prometheus spells
# them (dots as underscores) -> the attribute, as OTLP carries it. The labels
# that are not (process, pid, namespace, pod, container, ...) are the same both ways.
METHOD, ROUTE, STATUS = "http_request_method", "http_route", "http_response_status_code"
SERVER_ADDRESS, SERVER_PORT = "server_address", "server_port"
RPC_SYSTEM, RPC_METHOD, RPC_STATUS = "rpc_system_name", "rpc_method", "rpc_response_status_code"
DB_SYSTEM, DB_OPERATION = "db_system_name", "db_operation_name"
MODEL, TOKEN_TYPE = "gen_ai_request_model", "gen_ai_token_type"
OPERATION, PROVIDER, ERROR_TYPE = "gen_ai_operation_name", "gen_ai_provider_name", "error_type"
LABEL_ATTRIBUTES = {
    METHOD: "http.request.method", ROUTE: "http.route", STATUS: "http.response.status_code",
    SERVER_ADDRESS: "server.address", SERVER_PORT: "server.port",
    RPC_SYSTEM: "rpc.system.name", RPC_METHOD: "rpc.method", RPC_STATUS: "rpc.response.status_code",
    DB_SYSTEM: "db.system.name", DB_OPERATION: "db.operation.name",
    MODEL: "gen_ai.request.model", TOKEN_TYPE: "gen_ai.token.type",
    OPERATION: "gen_ai.operation.name", PROVIDER: "gen_ai.provider.name", ERROR_TYPE: "error.type",
}
# a request's latency segments (stitch.segments), seconds, in SEGMENTS order: they add up to its duration
LATENCY_ATTRIBUTES = tuple(f"sitsprobe.latency.{name}_s" for name in SEGMENTS)
# gRPC's canonical status codes, by number (grpc/doc/statuscodes.md)
GRPC_CODES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED")
# the codes the gRPC conventions count as a server span's error; for a client, any code but OK is
GRPC_SERVER_ERRORS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL",
                                "UNAVAILABLE", "DATA_LOSS"})

# a gRPC :path, "/pkg.Service/Method" (the shape stitch.protocols.http2 reads one by)
_GRPC_PATH = re.compile(r"/([A-Za-z_][\w.]*/[A-Za-z_]\w*)")

Attributes = dict[str, str | int | float | bool | tuple[str, ...]]


def is_client(req: Request) -> bool:
    """The traced process opened the connection and sent the request."""
    return req.direction == "client"


def is_grpc(req: Request) -> bool:
    return req.protocol == HTTP2 and req.h2 is not None and req.h2.grpc


def is_http(req: Request) -> bool:
    """An HTTP request (HTTP/1.x, or an HTTP/2 stream that is not a gRPC call)."""
    return req.protocol in http1.NAMES or (req.protocol == HTTP2 and not is_grpc(req))


def is_redis(req: Request) -> bool:
    return req.protocol == resp.NAME


def is_unframed(req: Request) -> bool:
    return req.protocol in UNFRAMED


def grpc_status_name(code: int | None) -> str | None:
    """A gRPC status code by its canonical name; an unknown number as its number."""
    if code is None:
        return None
    return GRPC_CODES[code] if 0 <= code < len(GRPC_CODES) else str(code)


def grpc_method(req: Request) -> str:
    """The call's fully-qualified method, ``pkg.Service/Method`` (its :path
    without the leading slash); OTHER for a path of any other shape."""
    m = _GRPC_PATH.fullmatch(req.path) if req.path else None
    return m.group(1) if m else OTHER


def server_endpoint(req: Request) -> tuple[str, int | None] | None:
    """The server's (address, port): for a server request its own endpoint;
    for a client request the server it called: the HTTP/2 :authority when
    it was sent (its port, else the peer's), else the peer it connected to."""
    if not is_client(req):
        return (req.local.address, req.local.port) if req.local is not None else None
    peer_port = req.peer.port if req.peer is not None else None
    authority = req.h2.authority if req.h2 is not None else None
    if authority:
        host, port = _split_authority(authority)
        if host:
            return host, peer_port if port is None else port
    return (req.peer.address, peer_port) if req.peer is not None else None


def span_kind(req: Request) -> SpanKind:
    return SpanKind.CLIENT if is_client(req) else SpanKind.SERVER


def span_name(req: Request) -> str:
    if is_grpc(req):
        method = grpc_method(req)
        return "grpc" if method == OTHER else method  # no method known: {rpc.system.name}
    if is_http(req):
        method = req.method if req.method in KNOWN_METHODS else "HTTP"
        if is_client(req):
            g = req.genai
            if g is not None and g.operation:  # an inference call: the GenAI conventions' name
                return f"{g.operation} {g.request_model}" if g.request_model else g.operation
            return method  # a client has no route template: {http.request.method}
        return f"{method} {req.route or req.path or 'unknown'}"
    if is_redis(req):
        return req.method or "redis"
    return f"{req.comm} {req.protocol} exchange"


def span_attributes(req: Request) -> Attributes:
    attrs: dict[str, str | int | float | bool | None] = {
        "process.pid": req.pid,
        "sitsprobe.fd": req.fd,
        "sitsprobe.complete": req.complete,
        "sitsprobe.partial": req.partial,
        "network.transport": req.transport,  # None (not TCP) is left out below
        "error.type": error_type(req),
    }
    if req.first_out_ns is not None:
        attrs["sitsprobe.time_to_first_byte_s"] = (req.first_out_ns - req.start_ns) / 1e9
    attrs.update(_endpoints(req))
    if is_grpc(req):
        attrs.update(_grpc(req))
    elif is_http(req):
        attrs.update(_http(req))
    elif is_redis(req):
        attrs.update({"db.system.name": "redis", "db.operation.name": req.method,
                      "sitsprobe.bytes_in": req.bytes_in, "sitsprobe.bytes_out": req.bytes_out})
    else:
        attrs.update({"sitsprobe.protocol": req.protocol, "sitsprobe.bytes_in": req.bytes_in,
                      "sitsprobe.bytes_out": req.bytes_out})
    if req.protocol == HTTP2 and req.h2 is not None:
        attrs.update(_http2(req.h2))
    if req.genai is not None:
        attrs.update(_gen_ai(req))
    if req.inference is not None:  # what only the engine's markers tell
        attrs["sitsprobe.engine.request_id"] = req.inference.request_id
        attrs["sitsprobe.kv_cache.peak_bytes"] = req.inference.kv_bytes
    if req.segments is not None:
        attrs.update(zip(LATENCY_ATTRIBUTES, (ns / 1e9 for ns in req.segments)))
    if req.gpu is not None:
        attrs.update(req.gpu.request)
    return {k: v for k, v in attrs.items() if v is not None}


def _endpoints(req: Request) -> dict:
    """server.* is the server's side whichever side we are; client.* only on
    a server span (a client span's own endpoint is no client.address)."""
    attrs = {}
    server = server_endpoint(req)
    if server is not None:
        attrs["server.address"], attrs["server.port"] = server
    if req.peer is not None:
        attrs["network.peer.address"], attrs["network.peer.port"] = req.peer.address, req.peer.port
        if not is_client(req):
            attrs["client.address"], attrs["client.port"] = req.peer.address, req.peer.port
    return attrs


def _http(req: Request) -> dict:
    name, _, version = req.protocol.partition("/")
    known = req.method is None or req.method in KNOWN_METHODS
    target = _target(req)
    attrs = {
        "http.request.method": req.method if known else OTHER,
        "http.request.method_original": None if known else req.method,
        "http.response.status_code": req.status,
        # a request the agent saw none of, or whose head it did not capture, has no size
        "http.request.size": None if req.partial not in (None, http1.RESPONSE_CUT_OFF, CLIENT_CLOSED)
        else req.bytes_in,
        "http.response.size": req.bytes_out,
        "network.protocol.name": name,
        "network.protocol.version": version or None,
        "user_agent.original": req.user_agent,
    }
    if is_client(req):
        attrs["url.full"] = _url_full(req, target)
    else:
        attrs.update({
            "http.route": req.route,
            "url.scheme": (req.h2.scheme if req.h2 is not None else None) or ("https" if req.tls else "http"),
            "url.path": req.path,
            "url.query": (target or "").partition("?")[2].partition("#")[0] or None,
        })
    return attrs


def _target(req: Request) -> str | None:
    """The request-target to export: HTTP/1.1's as enrich() redacted it; an
    HTTP/2 :path has no enrich() step, so every query value is redacted here."""
    if req.protocol == HTTP2:
        return redact_target(req.target)
    return req.target


def _url_full(req: Request, target: str | None) -> str | None:
    """scheme://server[:port]target for an origin-form target, the target
    itself for an absolute-form one (a request to a proxy); else not known."""
    if target is None:
        return None
    target = target.partition("#")[0]
    if target.startswith(("http://", "https://")):
        return target
    if not target.startswith("/"):  # "*", or a CONNECT's authority-form
        return None
    scheme = (req.h2.scheme if req.h2 is not None else None) or ("https" if req.tls else "http")
    if req.h2 is not None and req.h2.authority:
        return f"{scheme}://{req.h2.authority.rpartition('@')[2]}{target}"  # never a userinfo
    server = server_endpoint(req)
    if server is None:
        return None
    host, port = server
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}{'' if port is None else f':{port}'}{target}"


def _split_authority(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` (``[v6]:port`` too) as (host, port); a port that is no number is None."""
    authority = authority.rpartition("@")[2]  # userinfo is deprecated, and never exported
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
    else:
        host, port = authority, ""
    return host, int(port) if port.isascii() and port.isdigit() and int(port) < 65536 else None


def _http2(h2: H2) -> dict:
    return {
        "sitsprobe.http2.stream_id": h2.stream_id,
        "sitsprobe.http2.flow_control_wait_s": h2.flow_control_wait_ns / 1e9,
        "sitsprobe.http2.reset_code": h2.reset_code,
        "sitsprobe.http2.connection_window_updates": h2.window_updates,
    }


def _grpc(req: Request) -> dict:
    """The gRPC conventions: rpc.method is the fully-qualified method, the
    status its code's name. The status message is not exported (it may
    carry user data)."""
    h2 = req.h2
    method = grpc_method(req)
    return {
        "rpc.system.name": "grpc",
        "rpc.method": method,
        "rpc.method_original": req.path if method == OTHER else None,
        "rpc.response.status_code": grpc_status_name(h2.grpc_status),
        "sitsprobe.rpc.request_messages": h2.request_messages,
        "sitsprobe.rpc.response_messages": h2.response_messages,
        "network.protocol.name": "http",
        "network.protocol.version": "2",
        "sitsprobe.bytes_in": req.bytes_in,
        "sitsprobe.bytes_out": req.bytes_out,
    }


def _gen_ai(req: Request) -> dict:
    """``req.genai`` (from the wire, the markers, or both merged) as the GenAI
    conventions' attributes, and sitsprobe's own on how it was read. A
    server's span has its time to first token and per output token; a
    call's (a client span), its time to the first chunk with output."""
    g, client = req.genai, is_client(req)
    ttft, tpot = req.ttft_ns, req.tpot_ns
    ttft_s = None if ttft is None else ttft / 1e9
    return {
        "gen_ai.operation.name": g.operation,
        "gen_ai.provider.name": g.provider,
        "gen_ai.request.model": g.request_model,
        "gen_ai.request.max_tokens": g.max_tokens,
        "gen_ai.response.model": g.response_model,
        "gen_ai.response.finish_reasons": g.finish_reasons or None,
        "gen_ai.usage.input_tokens": g.input_tokens,
        "gen_ai.usage.output_tokens": g.output_tokens,
        "gen_ai.server.time_to_first_token": None if client else ttft_s,
        "gen_ai.server.time_per_output_token": None if client or tpot is None else tpot / 1e9,
        "gen_ai.response.time_to_first_chunk": ttft_s if client and g.streaming else None,
        "sitsprobe.genai.source": g.source,
        "sitsprobe.genai.usage_source": g.usage_source,
        "sitsprobe.genai.stream_events": g.events if g.streaming else None,
        "sitsprobe.genai.content_events": g.content_events if g.streaming else None,
        "sitsprobe.genai.max_stall_s": None if g.max_gap_ns is None else g.max_gap_ns / 1e9,
        "sitsprobe.genai.events_approximate": True if g.events_approximate else None,
        "sitsprobe.genai.answer_empty": g.answer_empty,
        "sitsprobe.genai.json_valid": g.json_valid,
        "sitsprobe.genai.content_encoding": g.content_encoding,
    }


def is_error(req: Request) -> bool:
    """Whether the span's status is ERROR: the protocol has an error.type (a
    server's 5xx, a client's 4xx or 5xx, a gRPC code that is an error for the
    side that saw it, an exchange cut short), but a client that hung up is no
    error of the server's; or a GenAI answer sent as a success named an error
    (an error event in a 200 stream: the server failed mid-answer). A GenAI
    4xx a server gave keeps its error.type and no ERROR, as any server 4xx."""
    kind = _error_type(req)
    if kind is not None:
        return kind != CLIENT_CLOSED
    return req.genai is not None and req.genai.error_type is not None and (req.status or 0) < 400


def error_type(req: Request) -> str | None:
    """A span's error.type (and its duration metric's, where the conventions
    give it one): the error its GenAI answer named (an error body's type or
    code, an error event: the GenAI conventions prefer the provider's), else
    the protocol's (_error_type)."""
    return (req.genai.error_type if req.genai is not None else None) or _error_type(req)


def _error_type(req: Request) -> str | None:
    """gRPC: the status code's name, when it is an error for that side (a
    server's: GRPC_SERVER_ERRORS; a client's: any but OK). HTTP: the status,
    from 500 for a server, from 400 for a client (gRPC with no grpc-status
    too). Else "incomplete" for an exchange cut short, "client_closed" for a
    server's answer its client hung up on (no error of the server's)."""
    if is_grpc(req) and req.h2.grpc_status is not None:
        name = grpc_status_name(req.h2.grpc_status)
        if name != "OK" and (is_client(req) or name in GRPC_SERVER_ERRORS):
            return name
    elif req.status is not None:
        client_http = is_client(req) and (req.protocol in http1.NAMES or req.protocol == HTTP2)
        if req.status >= (400 if client_http else 500):
            return str(req.status)
    if req.complete:
        return None
    return CLIENT_CLOSED if req.partial == CLIENT_CLOSED else "incomplete"


def stage_attributes(req: Request) -> list[dict[str, object]]:
    """Attributes of each engine stage's span, in stage order: its name, its
    batch, and the GPU's state then where the GPU layer attributed one."""
    on_gpu = req.gpu.stages if req.gpu is not None else ()
    out = []
    for i, st in enumerate(req.inference.stages):
        attrs: dict[str, object] = {"sitsprobe.stage": st.name}
        if st.batch_id:
            attrs.update({"sitsprobe.batch.id": st.batch_id, "sitsprobe.batch.size": st.batch_size})
        if i < len(on_gpu):
            attrs.update(on_gpu[i])
        out.append(attrs)
    return out


def cache_attributes(c) -> dict[str, object]:
    """Attributes of a cache look-up's span (an engine's CacheLookup)."""
    return {"sitsprobe.cache.name": c.cache, "sitsprobe.cache.key": c.key, "sitsprobe.cache.hit": c.hit}
