"""The one object every sink reads: a request the agent saw, stitched.

Timestamps are CLOCK_MONOTONIC nanoseconds (the kernel's ``bpf_ktime_get_ns``
and Python's ``time.monotonic_ns`` share that clock); sinks convert to
wall-clock time with :mod:`sitsprobe.clock` at export, nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Endpoint(NamedTuple):  # NamedTuples where one is made per exchange or stage: a third of the cost
    address: str  # "127.0.0.1", "::1"
    port: int


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A W3C ``traceparent`` the caller sent: our server span becomes its child."""

    trace_id: int  # 128-bit, never 0
    span_id: int  # 64-bit, never 0: the caller's span, our parent
    flags: int  # 8-bit trace-flags; bit 0 = sampled


class Link(NamedTuple):
    """What the kernel says a request belongs to (sitsprobe.stitch.join): for
    a client request, the server exchange its thread was serving when it
    began; for a server request, the traced client connection at the other
    end of its own (``start_ns`` 0)."""

    pid: int
    fd: int
    start_ns: int
    by_process: bool = False  # the process's latest request: the calling thread read none
    stream: int = 0  # a server HTTP/2 stream's link: the caller's call is the stream of this id


@dataclass(frozen=True, slots=True)
class H2:
    """What an HTTP/2 stream adds to its request (sitsprobe.stitch.protocols.http2);
    with ``grpc``, the stream is a gRPC call."""

    stream_id: int
    authority: str | None = None  # :authority
    scheme: str | None = None  # :scheme
    grpc: bool = False  # content-type application/grpc*
    grpc_status: int | None = None  # from the trailers (or a trailers-only response)
    grpc_message: str | None = None
    request_messages: int | None = None  # gRPC length-prefixed messages each way; None: not known
    response_messages: int | None = None
    flow_control_wait_ns: int = 0  # time the sender waited on a zero flow-control window
    reset_code: int | None = None  # RST_STREAM error code, if the stream was reset
    window_updates: int = 0  # WINDOW_UPDATEs the sender got on its connection, by the stream's end


class Stage(NamedTuple):
    """An engine stage (queue, prefill, a decode step, ...) a request went through."""

    name: str
    start_ns: int
    end_ns: int
    batch_id: int = 0  # a batched step: the batch, and how many requests it served
    batch_size: int = 0


@dataclass(frozen=True, slots=True)
class CacheLookup:
    cache: str  # "prefix", "completion", "redis"
    key: str  # as the engine named it (a digest or prefix, never a raw prompt)
    hit: bool
    ts_ns: int


@dataclass(frozen=True, slots=True)
class Inference:
    """What an instrumented engine said about one request, through its markers."""

    request_id: int
    model: str
    start_ns: int
    end_ns: int
    stages: tuple[Stage, ...] = ()
    cache: tuple[CacheLookup, ...] = ()
    input_tokens: int = 0
    output_tokens: int = 0
    kv_bytes: int = 0  # KV-cache bytes held at the peak

    def first_token_ns(self) -> int | None:
        """When the first output token existed: the end of prefill."""
        ends = [s.end_ns for s in self.stages if s.name == "prefill"]
        return min(ends) if ends else None

    def last_decode_ns(self) -> int | None:
        ends = [s.end_ns for s in self.stages if s.name == "decode"]
        return max(ends) if ends else None


class Write(NamedTuple):  # a tuple: a stream makes one a token, and it is made in a third of the time
    """One response write (a send call) of an exchange the kernel kept payload
    for; of a traced client's call, one read of the answer."""

    ts_ns: int  # when the send began (a client's read: returned)
    size: int  # bytes the call sent (read)
    peek: bytes  # its first bytes (capture.write_peek_bytes at most)
    data_lines: int = 0  # in a write longer than its peek, the kernel counted lines that begin
    json_lines: int = 0  # "data:" (SSE events) and that end "}" (NDJSON objects) ...
    scanned: int = 0  # ... in its first `scanned` bytes (0: not counted, the peek is all of it)
    delta_lines: int = 0  # ... and typed events that carry output (Responses, Anthropic: their deltas)
    output_lines: int = 0  # ... and output keys' non-empty strings begun ("content":"x) ...
    special_lines: int = 0  # ... and special tokens ("special":true: TGI's </s>, no output)


class Payload(NamedTuple):
    """What the kernel kept of one exchange's payloads beyond the request head
    (of an HTTP/2 stream, the agent: stitch.protocols.http2_payload), for
    :mod:`sitsprobe.stitch.genai`; bounded by ``capture.genai``, never
    exported. Pieces may overlap one another and the head: each says where
    it comes from, none is assumed whole."""

    request_body: bytes = b""  # the first bytes of the request body
    request_tail: bytes = b""  # the last bytes of the request
    response_tail: bytes = b""  # the last bytes of the response
    writes: tuple[Write, ...] = ()  # the response's writes in order, the first (with the head) first
    writes_total: int = 0  # every response write, including any past those kept
    # Where the protocol keeps the head apart from the body (HTTP/2: HEADERS and DATA frames), the
    # request body's size (None: its end not seen) and the response's header fields; the writes are
    # then the body's (its DATA frames), with no head in the first.
    request_size: int | None = None
    response_headers: dict[str, str] | None = None


class GenAI(NamedTuple):
    """A request as generative AI: read from the wire (:mod:`sitsprobe.stitch.genai`)
    or told by the engine's markers; one shape, so both give the same
    attributes. Times are CLOCK_MONOTONIC ns; None: not known. A NamedTuple:
    reading a stream revises it a few times, and _replace costs a quarter of
    what dataclasses.replace does on these 23 fields."""

    source: str  # "wire" or "markers" (the markers' numbers win where both exist)
    operation: str | None = None  # gen_ai.operation.name: chat, text_completion, embeddings
    provider: str | None = None  # gen_ai.provider.name: the API the bytes speak (openai, ollama, ...)
    request_model: str | None = None
    response_model: str | None = None
    max_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()
    input_tokens: int | None = None
    output_tokens: int | None = None
    usage_source: str | None = None  # "body", "stream_usage", "counted_events" or "markers"
    streaming: bool = False
    first_token_ns: int | None = None  # the first content-bearing event was written
    last_token_ns: int | None = None  # the last one was
    events: int = 0  # stream events (SSE data events, NDJSON lines), [DONE] not counted
    content_events: int = 0  # of those, the ones that carried output
    max_gap_ns: int | None = None  # longest gap between events after the first token
    chunk_gaps_ns: tuple[int, ...] = ()  # from each event with output to the next (the timed ones)
    events_approximate: bool = False  # some writes were not seen whole: counts are a floor
    error_type: str | None = None  # from an OpenAI-style error body
    answer_empty: bool | None = None  # no output at all (None: could not tell)
    json_requested: bool = False  # response_format asked for JSON
    json_valid: bool | None = None  # ... and the answer parsed (None: not asked, or not all seen)
    content_encoding: str | None = None  # the response body's (gzip, ...): read decoded where it can be
    stream_ended: bool = False  # the stream's own end was sent: [DONE], or its API's last event


@dataclass(frozen=True, slots=True)
class GpuUse:
    """What the GPU did for one request (sitsprobe.gpu.attribution): attributes
    for its server span, and for each of its engine stages, aligned with
    Inference.stages (empty for a stage that is not GPU compute)."""

    request: dict
    stages: tuple[dict, ...]


# sitsprobe.partial of a server's answer that its client hung up on before it ended (a stop
# button, a client's timeout): the client's doing, so no error of the server's
CLIENT_CLOSED = "client_closed"


class Request(NamedTuple):
    """One request/response exchange on a server connection (a NamedTuple:
    immutable, and built for every request, so cheap to build).

    ``protocol`` names the protocol that framed it (sitsprobe.stitch.protocols):
    ``"http/1.1"`` (``"http/1.0"`` once a traced one is enriched), ``"http/2"`` (gRPC too: see ``h2``),
    ``"resp"``; or, for a connection-level exchange with no
    method, path or status, what it looks like: ``"tls"``, ``"http2"``,
    ``"unknown"``.
    """

    pid: int
    comm: str
    fd: int
    start_ns: int  # first byte of the request received
    end_ns: int  # last byte of the response sent (== start_ns if none was)
    first_out_ns: int | None  # first byte of the response sent
    bytes_in: int
    bytes_out: int
    local: Endpoint | None = None
    peer: Endpoint | None = None
    protocol: str = "http/1.1"
    method: str | None = None
    target: str | None = None  # request-target as sent, query included
    path: str | None = None  # target without the query
    route: str | None = None  # low-cardinality path template for metrics
    status: int | None = None
    user_agent: str | None = None
    traceparent: TraceParent | None = None
    complete: bool = True  # False: the process exited or closed mid-request
    head: bytes = b""  # captured request bytes, for enrich(); never exported
    inference: Inference | None = None  # joined from the engine's markers
    gpu: GpuUse | None = None  # added to traced requests where the GPU layer runs
    transport: str | None = "tcp"  # None: not seen on TCP (a Unix socket, most likely)
    direction: str = "server"  # "server": this process answered; "client": it asked
    partial: str | None = None  # why the exchange is not framed whole (protocols' constants, CLIENT_CLOSED)
    tracestate: str | None = None  # W3C tracestate, with the traceparent
    trace_headers: tuple[bytes, bytes] | None = None  # (traceparent, tracestate) raw values the
    # kernel found past the captured head: the first is parsed when stitched, the second by
    # enrich(); never exported
    payload: Payload | None = None  # body bytes kept for stitch.genai; never exported
    genai: GenAI | None = None  # what the request was as generative AI, from the wire or markers
    last_in_ns: int = 0  # last request byte received (0: not known)
    send_ns: int = 0  # time spent inside the response's send calls
    runq_ns: int = 0  # run-queue wait of the thread serving it meanwhile
    read_wait_ns: int = 0  # that thread's time in other reads (files, pipes, a dependency's socket)
    cache_wait_ns: int = 0  # ... of which, reads of a Redis (RESP) reply: cache look-ups
    segments: tuple[int, int, int, int, int] | None = None  # ns in network, scheduling, compute,
    # io, cache (sitsprobe.stitch.segments): they add up to the duration
    link: Link | None = None  # what it belongs to, by the kernel's account (stitch.join)
    h2: H2 | None = None  # an HTTP/2 stream (protocol "http/2"): its stream, gRPC status, messages
    tls: bool = False  # framed from the plaintext a TLS library handed over (probes.tls)
    calls: int = 0  # requests the kernel linked to this one (its outgoing calls; a traced callee)
    binned: bool = False  # its metrics were counted in the kernel (probes.bins): not again here

    @property
    def ttft_ns(self) -> int | None:
        """Time to first token: first request byte in to the first token (the end
        of prefill by the markers, else the first content-bearing write)."""
        t = self.genai.first_token_ns if self.genai else None
        return None if t is None else max(0, t - self.start_ns)

    @property
    def tpot_ns(self) -> float | None:
        """Time per output token after the first."""
        g = self.genai
        if g is None or g.output_tokens is None or g.output_tokens < 2:
            return None
        first, last = g.first_token_ns, g.last_token_ns
        if first is None or last is None or last <= first:
            return None
        return (last - first) / (g.output_tokens - 1)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def is_error(self) -> bool:
        """Whether its span's status is ERROR: the conventions' rule, in export.semconv."""
        from .export.semconv import is_error  # (semconv reads Request: imported when first asked)
        return is_error(self)


def _replace_by_index(cls: type):
    """A NamedTuple's _replace, the same in what it does (new values by name,
    ValueError for a name it has not), built for one class: the generic one
    pops every one of a Request's 40 fields from the keywords, 1.3 µs a call
    whatever is replaced; a request is replaced three times or more on its
    way to a span. This one sets the named ones by index: 0.5 µs."""
    index = {f: i for i, f in enumerate(cls._fields)}
    new = tuple.__new__

    def _replace(self, /, **kwds):
        values = list(self)
        for name, value in kwds.items():
            i = index.get(name)
            if i is None:
                raise ValueError(f"Got unexpected field names: {[k for k in kwds if k not in index]!r}")
            values[i] = value
        return new(cls, values)

    _replace.__doc__ = f"Return a new {cls.__name__} object replacing specified fields with new values"
    return _replace


Request._replace = _replace_by_index(Request)  # typing.NamedTuple forbids it in the body
