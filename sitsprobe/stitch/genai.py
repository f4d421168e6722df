"""GenAI meaning read from the wire: a request's model, limits and usage, its
answer stream's timing, from the payload bytes the kernel kept
(:class:`~sitsprobe.request.Payload`), whatever server the agent watches, or
whatever a traced client calls (its reads of the answer are the "writes",
timed when each read returned).

Endpoints are matched by path suffix (:mod:`.genai_shapes`). The provider
(``gen_ai.provider.name``) is the API the bytes speak, not the engine behind
it: ``openai`` (a well-known OpenTelemetry value) for the OpenAI shape,
whether vLLM, SGLang, llama.cpp or Ollama serves it; lower-case custom values
for the native APIs: ``huggingface.tgi`` (vendor.product, as the well-known
``aws.bedrock``), ``ollama`` and ``llama.cpp``.

Any piece may be cut. The request is parsed when its pieces join up to its
Content-Length, else read by keys (:func:`.genai_shapes.scan`). The response
is its head (past any ``100 Continue``), then each write's first bytes,
dechunked; a write seen in part leaves a gap, after which a write starts an
event if it looks like one. Where the bytes leave a choice:

* an event counts when its start was seen, at the time of the write it
  begins in; one seen in part bears content when a non-empty output field
  has begun in what is visible (``"content":"x``). ``events_approximate``:
  some write was not seen whole, or at all; the counts are a floor then, and
  ``answer_empty`` is not claimed (it is False for a non-stream response);
* the response's tail (its last bytes) gives usage, finish reasons and the
  model the writes did not, never events: the writes counted those;
* usage: the body's own (or TGI's ``x-prompt-tokens``/``x-generated-tokens``
  headers) is ``body``; a stream's usage chunk or final object,
  ``stream_usage``; with neither, a stream's content events are its output
  tokens (``counted_events``);
* ``error_type`` comes from an error body (:func:`.genai_shapes.error_of`) or
  an error event in a stream; a 4xx/5xx whose body does not say (or was not
  seen) has its status code; ``answer_empty`` and ``json_valid`` are None then;
* a body sent gzip- or deflate-encoded (a gateway's compression, asked for by
  the clients' ``Accept-Encoding``) is read as it was before, from its start to
  the first bytes not seen (an encoded stream cannot be entered in the
  middle), at most ``MAX_JSON`` bytes of it; ``content_encoding`` names the
  encoding. Another (br, zstd) leaves the body unread but for its status.

:func:`read` never raises on any bytes, and its work is bounded by what the
kernel kept: each byte is scanned a fixed number of times, a JSON parse is
capped at ``MAX_JSON`` bytes, events at ``MAX_EVENTS``. No prompt or answer
text reaches a GenAI record.
"""
from __future__ import annotations

import bisect
import re
import zlib
from itertools import repeat
from operator import itemgetter, sub
from typing import NamedTuple

from ..request import GenAI, Payload, Request, Write
from . import genai_shapes as shapes
from .genai_shapes import MAX_NAME, Shape, label, loads
from .http import ResponseHead, head_apart, parse_request_heads, parse_response_head
from .write_scan import counted

__all__ = ["from_markers", "merge", "read"]

MAX_EVENTS = 1 << 16  # stream events looked at
# Events parsed as JSON: those up to the first with output (it decides the
# time to first token), and the last CLOSING_PARSED (finish reasons, usage,
# the model, an error); the ones between are glanced at for output only:
# parsing each token's event cost ~13 µs a write.
CLOSING_PARSED = 4

_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,16})(?:;[^\r\n]{0,256})?\r?\n")
_FRAMING = re.compile(rb"\r\n[0-9a-fA-F]{1,16}(?:;[^\r\n]{0,256})?\r\n")
# each alternative begins with a fixed byte, so the regex skips ahead as fast as
# a search (a leading \r? would be tried at every byte: 5x slower); with no \r
# in the text, bytes.find does it (10x)
_SEPARATORS = {"sse": re.compile(rb"\n\r?\n|\r\n\r?\n|\r\r"), "ndjson": re.compile(rb"\r?\n")}
_PLAIN = {"sse": b"\n\n", "ndjson": b"\n"}  # the separator where no \r is
_STARTS = {"sse": re.compile(rb"(?:data|event|id|retry)?:"), "ndjson": re.compile(rb"\s*\{")}


class _Piece(NamedTuple):  # a tuple: a stream makes one a write
    ts_ns: int  # the write it came in
    data: bytes
    gap: bool  # bytes before it were not seen


def read(req: Request) -> GenAI | None:
    """What ``req`` was as generative AI, from its payload; None unless it is a
    POST to a known GenAI endpoint with a payload."""
    shape = shapes.shape_of(req.path)
    if req.method != "POST" or shape is None or req.payload is None:
        return None
    get = _request(req, req.payload)
    if shape.for_request is not None:
        shape = shape.for_request(get)
    ask = shape.ask(get, (req.path or "").rstrip("/"))
    g = GenAI(source="wire", operation=shape.operation, provider=shape.provider,
              request_model=label(get("model"), MAX_NAME), max_tokens=ask.max_tokens,
              json_requested=ask.json)
    return _response(req, req.payload, shape, g, ask.stream)


def from_markers(req: Request) -> GenAI | None:
    """The engine's own account of ``req`` (its markers), in the same shape."""
    inf = req.inference
    if inf is None:
        return None
    shape = shapes.shape_of(req.path)
    told = bool(inf.input_tokens or inf.output_tokens)  # (0, 0): no usage marker came
    return GenAI(source="markers", operation=shape.operation if shape else "text_completion",
                 provider=shape.provider if shape else None,
                 request_model=label(inf.model, MAX_NAME),
                 input_tokens=inf.input_tokens if told else None,
                 output_tokens=inf.output_tokens if told else None,
                 usage_source="markers" if told else None,
                 first_token_ns=inf.first_token_ns(), last_token_ns=inf.last_decode_ns())


def merge(markers: GenAI | None, wire: GenAI | None) -> GenAI | None:
    """The markers' numbers where they have them (model, tokens, token times),
    the wire's for the rest (response model, finish reasons, the stream's
    shape, errors, the answer's flags)."""
    if markers is None or wire is None:
        return markers or wire
    told = markers.usage_source is not None
    return wire._replace(
        source="markers", operation=wire.operation or markers.operation,
        provider=wire.provider or markers.provider,
        request_model=markers.request_model or wire.request_model,
        input_tokens=markers.input_tokens if told else wire.input_tokens,
        output_tokens=markers.output_tokens if told else wire.output_tokens,
        usage_source=markers.usage_source if told else wire.usage_source,
        first_token_ns=_either(markers.first_token_ns, wire.first_token_ns),
        last_token_ns=_either(markers.last_token_ns, wire.last_token_ns))


# -- the request ----------------------------------------------------------------------

def _request(req: Request, p: Payload) -> shapes.Get:
    """A getter over the request's JSON, whole if its pieces make it whole."""
    end = req.head.find(b"\r\n\r\n")
    in_head = req.head[end + 4:] if end >= 0 else b""
    prefix = in_head if in_head.startswith(p.request_body) else p.request_body
    if p.request_size is not None:  # the protocol's own count (HTTP/2's DATA)
        total = p.request_size
    else:
        heads = parse_request_heads(req.head, limit=1)
        total = heads[0].content_length if heads else None
    whole = _join(prefix, p.request_tail, total)
    return shapes.getter(prefix if whole is None else whole, prefix, p.request_tail)


def _join(prefix: bytes, tail: bytes, total: int | None) -> bytes | None:
    """All ``total`` bytes of something from its first and last ones, if they meet."""
    if total is None or len(prefix) >= total:
        return None if total is None else prefix[:total]
    tail = tail[-total:] if total else b""
    start = total - len(tail)
    return prefix[:start] + tail if tail and start <= len(prefix) else None


# -- the response ---------------------------------------------------------------------

def _response(req: Request, p: Payload, shape: Shape, g: GenAI, asked_stream: bool) -> GenAI:
    p, head = _final_response(p, req.status)
    status = head.status if head else req.status
    encoding = _encoding(head)
    decoded, carried = True, {}
    if encoding is None and (quick := _chunk_each(p.writes, head)) is not None:
        events, chunks_ended, kind = quick
    else:
        pieces, chunks_ended = _body(p, head)
        # a body apart from its head (HTTP/2) ends with its stream, as a chunked one with its last chunk
        chunks_ended = chunks_ended or (p.response_headers is not None and req.complete)
        if encoding is not None:
            g = g._replace(content_encoding=encoding)
            pieces, decoded = _decoded(pieces, encoding)
            if not pieces and not decoded:  # nothing readable: only the status says anything
                return g._replace(error_type=str(status) if (status or 0) >= 400 else None)
        kind = _kind(head, pieces, shape, asked_stream, status)
        if kind == "json":
            return _whole(req, p, shape, g, head, status, pieces)
        events = _events(pieces, kind, carried)
    g, ended = _stream(shape, g, events, status)
    g, unsure = _unseen_events(g, p, events, kind, shape, carried) if encoding is None else (g, not decoded)
    tail = _tail_text(p.response_tail) if encoding is None else b""
    approximate = p.writes_total > len(p.writes) or unsure
    if p.writes_total > len(p.writes) and p.response_tail and encoding is None:
        last_chunk = head is not None and head.chunked and p.response_tail.endswith(b"0\r\n\r\n")
        g = _untimed_writes(req, g, p, kind, shape, tail, last_chunk)
    ended = ended or _ended_in(tail, kind, shape)
    sure = not approximate and g.error_type is None and (ended or chunks_ended)
    empty = False if g.content_events else True if sure else None
    g = _fill(g._replace(events_approximate=approximate, answer_empty=empty, stream_ended=ended), shape,
              tail, "stream_usage", final=True)
    if g.usage_source is None and g.events and (g.content_events or not approximate):
        g = g._replace(output_tokens=g.content_events, usage_source="counted_events")
    return g


def _unseen_events(g: GenAI, p: Payload, events: list[tuple[int, bytes]], kind: str,
                   shape: Shape, carried: dict[int, bytes]) -> tuple[GenAI, bool]:
    """``g`` with what the peeks of writes longer than them did not show, and
    whether any count is still unsure. The kernel counts the lines of such a
    write (bpf/write_scan.h): its events (SSE: lines that begin ``data:``, one
    per event of these APIs; NDJSON: lines that end ``}``), those whose start
    the peek showed counted already, and a ``[DONE]`` no event; and its output
    (typed events, the Responses API's and Anthropic's: the deltas; else the
    output keys' non-empty strings begun, a special token's aside). Output the
    peek did not show, in an event it hid or cut before its output field, is
    content at the time of that write: a server that coalesces tokens under
    load, a client that reads several at once. ``carried``: what a write's
    peek held of an event begun in an earlier one (a read that split it):
    output the kernel counted there is the earlier write's, shown already."""
    cut = [w for w in p.writes if len(w.peek) < w.size]
    if not cut:
        return g, False
    cut_at = {w.ts_ns for w in cut}
    seen: dict[int, int] = {}  # write time -> events whose start it showed ...
    shown: dict[int, int] = {}  # ... and of those, the ones it showed output in
    done_seen = False
    for ts, data in events:
        done_seen = done_seen or data == b"[DONE]"
        if ts in cut_at:
            seen[ts] = seen.get(ts, 0) + 1
            shown[ts] = shown.get(ts, 0) + shape.partial_content(data)
    unsure, extra, content, first, last = False, 0, 0, g.first_token_ns, g.last_token_ns
    # [DONE] is in the last cut write only if no write past those kept came after it
    at_end = p.writes_total <= len(p.writes)
    for w in cut:
        if not w.scanned:
            unsure = True  # not counted (a write the kernel could not read whole)
            continue
        unsure = unsure or w.scanned < w.size
        # what it held of an event begun in an earlier write: counted here, read there
        before = counted(carried[w.ts_ns]) if w.ts_ns in carried else None
        hidden = _lines(w, kind) - seen.get(w.ts_ns, 0) - (_lines(before, kind) if before else 0)
        if kind == "sse" and not done_seen and hidden > 0 and w is cut[-1] and at_end:
            if b"[DONE]" in p.response_tail:
                hidden -= 1
            elif not p.response_tail:  # the end not known (a write of more pieces than kept): a
                unsure = True  # [DONE] among the lines counted would be counted as an event
        hidden = max(hidden, 0)
        extra += hidden
        told = _output(w, shape) - (_output(before, shape) if before else 0)
        showed = shown.get(w.ts_ns, 0)
        # at most one an event the peek did not show as output: those it hid, those it cut short;
        # fewer than it showed, in a write counted whole: an event it cut short looked like output
        # and was not (TGI's last token, its "special":true past the peek)
        tokens = min(told - showed, hidden + seen.get(w.ts_ns, 0) - showed)
        if tokens < 0 and w.scanned == w.size:
            content += tokens
        elif tokens > 0:
            content += tokens
            first = w.ts_ns if first is None else min(first, w.ts_ns)
            last = w.ts_ns if last is None else max(last, w.ts_ns)
    if not extra and not content:
        return g, unsure
    return g._replace(events=g.events + extra, content_events=g.content_events + content,
                      first_token_ns=first, last_token_ns=last), unsure


def _lines(w, kind: str) -> int:
    """A write's events as the kernel counts them (a Write, or a write_scan.Counted)."""
    return w.data_lines if kind == "sse" else w.json_lines


def _output(w, shape: Shape) -> int:
    """A write's output begun as the kernel counts it (a Write, or a write_scan.Counted)."""
    return w.delta_lines if shape.typed else w.output_lines - w.special_lines


def _untimed_writes(req: Request, g: GenAI, p: Payload, kind: str, shape: Shape, tail: bytes,
                    chunk_end: bool) -> GenAI:
    """``g`` with the writes past those kept (capture.max_writes: a long
    answer), counted, not timed: each is taken for one event, as streaming
    servers write a token a write (a floor where one held several); of them,
    a ``[DONE]``, a chunked body's last chunk (``chunk_end``: the tail ends in
    it; a server that saw its client hang up at ``[DONE]`` writes none) and
    the stream's closing events (as its tail shows them; the caller adds
    nothing without a tail) are no content. The last token was written by
    the response's end, the one time known past the kept writes: the time
    per output token stays the whole answer's, not its first writes'."""
    events = p.writes_total - len(p.writes) - (b"[DONE]" in tail) - chunk_end
    content = events - _closing_events(p.response_tail, kind, shape)
    if events <= 0:
        return g
    if content <= 0:
        return g._replace(events=g.events + events)
    return g._replace(events=g.events + events, content_events=g.content_events + content,
                      last_token_ns=max(req.end_ns, g.last_token_ns or 0))


def _ended_in(text: bytes, kind: str, shape: Shape) -> bool:
    """Whether a stream's last bytes (``_tail_text``) end in its end (a write's
    peek may have hidden it): ``[DONE]``, or its API's last event; where that
    event began before them (llama.cpp's and the Responses API's are long),
    the finish reason they show of it."""
    for _, data in reversed(_events([_Piece(0, text, True)], kind)):
        if data == b"[DONE]":
            return True
        if (obj := loads(data)) is not None:
            return shape.look(obj).done
        break
    return bool(shape.finishes(text))


def _closing_events(tail: bytes, kind: str, shape: Shape) -> int:
    """How many events without output end the stream, as its tail shows them."""
    text = _tail_text(tail)
    n = 0
    for _, data in reversed(_events([_Piece(0, text, True)], kind)):
        if data == b"[DONE]":
            continue
        obj = loads(data)
        if obj is None or shape.look(obj).content:
            break
        n += 1
    return n


# Content-Encoding -> zlib's wbits for it: gzip's header, or zlib's (deflate as
# RFC 9110 has it; a raw deflate stream, as some servers send, is tried after)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _encoding(head: ResponseHead | None) -> str | None:
    """The body's Content-Encoding (lower case); None: none, or identity."""
    enc = head.headers.get("content-encoding", "").strip().lower() if head is not None else ""
    return None if enc in ("", "identity") else label(enc, MAX_NAME)


def _decoded(pieces: list[_Piece], encoding: str) -> tuple[list[_Piece], bool]:
    """The body's pieces as they were before ``encoding`` (gzip, deflate), each
    at the time of the write that brought it, from the first to the first
    after a gap, at most MAX_JSON bytes in all; and whether that was the whole
    body. An encoding not undone here, or bytes that do not inflate: nothing
    (or what came before them), and False."""
    wbits = _WBITS.get(encoding)
    if wbits is None or not pieces or pieces[0].gap:
        return [], False
    out, left, d = [], shapes.MAX_JSON, zlib.decompressobj(wbits)
    for i, pc in enumerate(pieces):
        if pc.gap:
            return out, False
        try:
            data = d.decompress(pc.data, left)
        except zlib.error:
            if i or wbits != zlib.MAX_WBITS:
                return out, False
            wbits, d = -zlib.MAX_WBITS, zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate
            try:
                data = d.decompress(pc.data, left)
            except zlib.error:
                return [], False
        if data:
            out.append(_Piece(pc.ts_ns, data, False))
            left -= len(data)
        if d.unconsumed_tail or not left:
            return out, False  # past MAX_JSON
    return out, d.eof


def _final_response(p: Payload, status: int | None = None) -> tuple[Payload, ResponseHead | None]:
    """``p`` from the final response's head on, past interim 1xx ones (100
    Continue), and that head (None: its first write is no response head). A
    head that came apart from the body has ``status``."""
    if p.response_headers is not None:
        return p, head_apart(status, p.response_headers)
    writes = p.writes
    for _ in range(4):
        head = parse_response_head(writes[0].peek) if writes else None
        if head is None or head.status >= 200 or head.head_size is None:
            break
        w, rest = writes[0], writes[0].peek[head.head_size:]
        writes = (Write(w.ts_ns, w.size - head.head_size, rest),) * bool(rest) + writes[1:]
    else:
        head = parse_response_head(writes[0].peek) if writes else None
    if writes is p.writes:
        return p, head
    return p._replace(writes=writes, writes_total=p.writes_total - (len(p.writes) - len(writes))), head


def _body(p: Payload, head: ResponseHead | None) -> tuple[list[_Piece], bool]:
    """The body as seen, in pieces, each marked when bytes before it were
    missed; and whether a chunked body's last chunk was seen."""
    if not p.writes:
        return [], False
    w0 = p.writes[0]
    known = head is not None and head.head_size is not None
    segments = [(w0.ts_ns, w0.peek[head.head_size:], max(0, w0.size - len(w0.peek)), False)
                ] if known else []
    segments += [(w.ts_ns, w.peek, max(0, w.size - len(w.peek)), False) for w in p.writes[1:]]
    if not known and segments:  # what came before the first write after the head is not known
        segments[0] = (*segments[0][:3], True)
    if head is not None and (head.chunked or head.complete):
        chunked = head.chunked
    else:  # not told: chunked if the body's first bytes are a chunk size line
        chunked = _SIZE_LINE.match(next((s[1] for s in segments if s[1]), b"")) is not None
    if chunked:
        return _dechunk(segments)
    out, gap = [], False
    for ts, data, unseen, missed in segments:
        gap = gap or missed
        if data:
            out.append(_Piece(ts, data, gap))
            gap = False
        gap = gap or unseen > 0
    return out, False


def _dechunk(segments) -> tuple[list[_Piece], bool]:
    """Chunked transfer-coding undone across writes: (ts, visible, unseen
    after, missed before) each. Unseen bytes inside a chunk's data leave a
    gap; unseen framing loses the place, found again at a write that starts
    with a chunk size line. A size that lies costs the body, never more."""
    out: list[_Piece] = []
    mode, left, line, gap = "size", 0, b"", False
    for ts, data, unseen, missed in segments:
        if missed:
            mode, gap = "lost", True
        if mode == "lost":
            if _SIZE_LINE.match(data) is None:
                continue
            mode, line = "size", b""
        if mode == "size" and not line and not unseen and data[-2:] == b"\r\n" \
                and (m := _SIZE_LINE.match(data)) and (n := int(m[1], 16)) \
                and len(data) == (e := m.end()) + n + 2:
            out.append(_Piece(ts, data[e:-2], gap))  # the common write: one whole chunk
            gap = False
            continue
        buf, i = [], 0
        while i < len(data) and mode in ("size", "data"):
            if mode == "data":
                take = min(left, len(data) - i)
                buf.append(data[i:i + take])
                i, left = i + take, left - take
                mode = "data" if left else "size"
                continue
            nl = data.find(b"\n", i)
            if nl < 0:
                line += data[i:]
                i, mode = len(data), "lost" if len(line) > 300 else mode
                continue
            size, line, i = (line + data[i:nl]).strip(b"\r \t"), b"", nl + 1
            m = _SIZE_LINE.fullmatch(size + b"\n")
            if size and m is None:
                mode = "lost"
            elif size:
                left = int(m[1], 16)
                mode = "data" if left else "done"
        if any(buf):
            out.append(_Piece(ts, b"".join(buf), gap))
            gap = False
        if unseen and mode == "data" and unseen <= left + 2:  # within the chunk and its CRLF
            mode, left, gap = ("data", left - unseen, True) if unseen <= left else ("size", 0, True)
        elif unseen and mode != "done":
            mode = "lost"
        gap = gap or mode == "lost"
    return out, mode == "done"


# A write of a token, as streaming servers make it: one chunk of one event of
# one line, HEX, then (by kind) what comes before the line, what ends the
# chunk, and the chunk's size less the line's: SSE's "\r\ndata:" LINE
# "\n\n\r\n" (a size of 5 + n + 2), NDJSON's "\r\n" LINE "\n\r\n" (n + 1).
_ONE_LINE_CHUNK = {"sse": (b"\r\ndata:", b"\n\n\r\n", 7), "ndjson": (b"\r\n", b"\n\r\n", 1)}
_HEX = b"0123456789abcdefABCDEF"
_LAST_CHUNK = (5, b"0\r\n\r\n")
_SIZE_PEEK = itemgetter(1, 2)  # of a Write


def _chunk_each(writes: tuple[Write, ...], head: ResponseHead | None
                ) -> tuple[list[tuple[int, bytes]], bool, str] | None:
    """The events of a chunked SSE or NDJSON response written as streaming
    servers write it (each write after the head whole, and one chunk of one
    event of one line; the last chunk alone in the last write if it came),
    read with a few passes of C over all the writes rather than a Python loop
    over each: the same events as _body and _events make of them, whether the
    last chunk came, and the kind; else None, and they read it."""
    if head is None or not head.chunked or head.head_size is None or len(writes) > MAX_EVENTS:
        return None
    ctype = head.headers.get("content-type", "").lower()  # as _kind tells the kind
    kind = "sse" if ctype.startswith("text/event-stream") else "ndjson" if "ndjson" in ctype else None
    w0, rest = writes[0], writes[1:]
    if kind is None or w0.size != len(w0.peek) or not rest:
        return None
    before, end, framing = _ONE_LINE_CHUNK[kind]
    if ended := _SIZE_PEEK(rest[-1]) == _LAST_CHUNK:
        rest = rest[:-1]
    sizes, peeks = zip(*map(_SIZE_PEEK, rest)) if rest else ((), ())
    times = [w.ts_ns for w in rest]
    if first := w0.peek[head.head_size:]:  # the head's write began the body
        sizes, peeks, times = (len(first), *sizes), (first, *peeks), [w0.ts_ns, *times]
    if not peeks or sum(sizes) != sum(map(len, peeks)):
        return None  # a write not seen whole
    parts = b"".join(peeks).split(end)
    if len(parts) != len(peeks) + 1 or parts.pop():
        return None  # a write that does not end a chunk, or ends more than one
    hexes, seps, lines = zip(*map(bytes.partition, parts, repeat(before)))
    lens, hex_lens, joined = list(map(len, lines)), set(map(len, hexes)), b"".join(lines)
    if set(seps) != {before} or b"".join(hexes).translate(None, _HEX) or b"\n" in joined \
            or b"\r" in joined or min(hex_lens) < 1 or max(hex_lens) > 16 \
            or set(map(sub, map(int, hexes, repeat(16)), lens)) != {framing}:
        return None  # not one chunk of one line, of its true size
    return [(ts, d) for ts, d in zip(times, map(bytes.strip, lines)) if d], ended, kind


def _kind(head, pieces: list[_Piece], shape: Shape, asked_stream: bool, status) -> str:
    """"sse", "ndjson" or "json": by Content-Type, else by the first bytes and the request."""
    ctype = head.headers.get("content-type", "").lower() if head else ""
    if ctype.startswith("text/event-stream"):
        return "sse"
    if "ndjson" in ctype:
        return "ndjson"
    if ctype or (status or 0) >= 400:
        return "json"
    if pieces and pieces[0].data.lstrip().startswith(b"data:"):
        return "sse"
    return shape.stream_kind if asked_stream else "json"


def _events(pieces: list[_Piece], kind: str, carried: dict[int, bytes] | None = None) -> list[tuple[int, bytes]]:
    """(time of the write it begins in, its data) of each event whose start was
    seen. A run of pieces after a gap starts an event only if it looks like one.
    ``carried`` is given, for each write that carried on an event begun before
    it, the bytes of that event it held."""
    sep, runs = _SEPARATORS[kind], []
    for piece in pieces:
        if piece.gap or not runs:
            runs.append([])
        runs[-1].append(piece)
    out, looked = [], 0
    for run in runs:
        if (each := _one_event_each(run[:MAX_EVENTS - looked], kind)) is not None:
            out += [(ts, data) for ts, data in each if data]
            looked += len(each)
            continue
        blocks = _blocks(run, kind, sep, carried)[:MAX_EVENTS - looked]
        looked += len(blocks)
        for ts, block in blocks:
            if kind == "sse":  # the event's data: lines, joined; comments and the like are none
                lines = [ln[5:].removeprefix(b" ") for ln in block.splitlines()
                         if ln.startswith(b"data:")]
                block = b"\n".join(lines) if lines else b""
            if block := block.strip():
                out.append((ts, block))
    return out


def _one_event_each(run: list[_Piece], kind: str) -> list[tuple[int, bytes]] | None:
    """The events of a run in which each piece is one whole event, as servers
    write a token each (SSE: one ``data:`` line and the blank line; NDJSON: one
    line): (time, its data, b"" for a blank one) each, read without a scan;
    else None."""
    datas = [pc.data for pc in run]
    text = b"".join(datas)
    if b"\r" in text:
        return None
    if kind == "sse":
        if text.count(b"\n") == 2 * len(datas) and all(d[:5] == b"data:" and d[-2:] == b"\n\n"
                                                         for d in datas):
            return [(pc.ts_ns, pc.data[5:-2].strip()) for pc in run]
    elif text.count(b"\n") == len(datas) and all(d[-1:] == b"\n" for d in datas) \
            and (not run[0].gap or _STARTS[kind].match(text)):
        return [(pc.ts_ns, pc.data.strip()) for pc in run]
    return None


def _blocks(run: list[_Piece], kind: str, sep: re.Pattern,
            carried: dict[int, bytes] | None = None) -> list[tuple[int, bytes]]:
    """(time of the write it begins in, its bytes) of each event of a run of
    pieces, between the separators; and in ``carried``, what a piece held of
    an event begun in one before it."""
    text = b"".join(pc.data for pc in run)
    starts = [0]
    for pc in run[:-1]:
        starts.append(starts[-1] + len(pc.data))
    ends = _separators(kind, sep, text)
    pos = 0
    if run[0].gap and not _STARTS[kind].match(text):
        pos = ends[0][1] if ends else len(text)
    ends.append((len(text), len(text)))
    blocks = []
    for start, after in ends:
        if start > pos:
            first = bisect.bisect_right(starts, pos)
            blocks.append((run[first - 1].ts_ns, text[pos:start]))
            if carried is not None:
                for i in range(first, bisect.bisect_left(starts, start)):
                    carried[run[i].ts_ns] = text[starts[i]:after]  # its end and separator
        pos = max(pos, after)
    return blocks


def _separators(kind: str, sep: re.Pattern, text: bytes) -> list[tuple[int, int]]:
    """Where the events' separators are in ``text``: (start, end) each."""
    if b"\r" in text:
        return [m.span() for m in sep.finditer(text)]
    plain, out = _PLAIN[kind], []
    i = text.find(plain)
    while i >= 0:
        out.append((i, i + len(plain)))
        i = text.find(plain, i + len(plain))
    return out


def _stream(shape: Shape, g: GenAI, events: list[tuple[int, bytes]], status):
    """``g`` with what the stream's events say, and whether its end was seen."""
    times, content_at, finish, error = [], [], [], None
    model = inputs = outputs = None
    done = False
    closing, i = len(events) - CLOSING_PARSED, 0
    while i < len(events):
        if content_at and i < closing:  # mid-stream, up to the closing events: a token or not, by a glance
            glance, mid = shape.partial_content, [e for e in events[i:closing] if e[1] != b"[DONE]"]
            done, at = done or len(mid) < closing - i, len(times)
            times += [ts for ts, _ in mid]
            content_at += [at + k for k, (_, data) in enumerate(mid) if glance(data)]
            i = closing
            continue
        ts, data = events[i]
        i += 1
        if data == b"[DONE]":
            done = True
            continue
        times.append(ts)
        obj = loads(data)
        if (err := shapes.error_of(obj, status)) is not None:
            error = error or err
            continue
        lk = shape.look(obj) if obj is not None else shape.glimpse(data)
        if lk.content:
            content_at.append(len(times) - 1)
        finish += lk.finish
        model, done = model or lk.model, done or lk.done
        # the last count of each is the final one: Anthropic's stream counts the input at its
        # start and the output at its end
        inputs = lk.input_tokens if lk.input_tokens is not None else inputs
        outputs = lk.output_tokens if lk.output_tokens is not None else outputs
    after = times[content_at[0]:] if content_at else []
    output = [times[k] for k in content_at]
    return g._replace(
        streaming=True, events=len(times), content_events=len(content_at),
        first_token_ns=times[content_at[0]] if content_at else None,
        last_token_ns=times[content_at[-1]] if content_at else None,
        max_gap_ns=max(map(sub, after[1:], after), default=None), chunk_gaps_ns=tuple(map(sub, output[1:], output)),
        response_model=label(model, MAX_NAME), finish_reasons=shapes.labels(finish),
        input_tokens=inputs, output_tokens=outputs, error_type=error,
        usage_source=None if inputs is None and outputs is None else "stream_usage"), done


def _whole(req: Request, p: Payload, shape: Shape, g: GenAI, head, status,
           pieces: list[_Piece]) -> GenAI:
    """A non-stream body: parsed when the writes and the tail make the response
    whole, else read by keys from what was seen of it."""
    seen = []  # the writes' bytes up to the first one not seen whole
    for w in p.writes:
        seen.append(w.peek)
        if len(w.peek) < w.size:
            break
    kept_all = p.writes and p.writes_total <= len(p.writes)
    total = sum(w.size for w in p.writes) if kept_all else req.bytes_out
    raw = _join(b"".join(seen), p.response_tail, total)
    rh = head if p.response_headers is not None else parse_response_head(raw) if raw else None
    obj = None
    if raw is not None and rh is not None and rh.head_size is not None:
        body = raw[rh.head_size:]
        if rh.chunked:
            body = b"".join(pc.data for pc in _dechunk([(0, body, 0, False)])[0])
        if g.content_encoding is not None:
            plain, whole = _decoded([_Piece(0, body, False)], g.content_encoding)
            body = b"".join(pc.data for pc in plain) if whole else b""
        obj = loads(body)
    if obj is None:  # an encoded tail cannot be read alone
        tail = _tail_text(p.response_tail) if g.content_encoding is None else b""
        text = b"\n\x00\n".join([pc.data for pc in pieces] + [tail])
        g = _fill(g._replace(error_type=str(status) if (status or 0) >= 400 else None), shape,
                  text, "body")
    elif (error := shapes.error_of(obj, status)) is not None or (status or 0) >= 400:
        return g._replace(error_type=error or str(status))
    else:
        lk = shape.look(obj)
        told = lk.input_tokens is not None or lk.output_tokens is not None
        valid = all(map(shapes.is_json, lk.texts)) if g.json_requested and lk.texts else None
        g = g._replace(response_model=label(lk.model, MAX_NAME),
                    finish_reasons=shapes.labels(lk.finish), input_tokens=lk.input_tokens,
                    output_tokens=lk.output_tokens, usage_source="body" if told else None,
                    answer_empty=not lk.content, json_valid=valid)
    if g.usage_source is None and head is not None:  # the server's own count, in headers (TGI)
        n_in, n_out = (_number(head.headers.get(k, "")) for k in shape.usage_headers)
        if n_in is not None or n_out is not None:
            g = g._replace(input_tokens=n_in, output_tokens=n_out, usage_source="body")
    return g


def _fill(g: GenAI, shape: Shape, text: bytes, source: str, final: bool = False) -> GenAI:
    """Usage, finish reasons and the model, where ``g`` lacks them, from JSON
    text that does not parse; of several counts the last is the final one. A
    count is filled apart from the other (Anthropic's input comes first in a
    stream, its output last: a stream seen in part may show either alone).
    ``final``: the text is a stream's last bytes, so a count there is the
    answer's, over one its events gave (a running count, SGLang's, whose last
    event a write's peek hid)."""
    n_in = shapes.last_count(shape.input_keys, text) if final or g.input_tokens is None else None
    n_out = shapes.last_count(shape.output_keys, text) if final or g.output_tokens is None else None
    if n_in is not None or n_out is not None:
        g = g._replace(input_tokens=g.input_tokens if n_in is None else n_in,
                       output_tokens=g.output_tokens if n_out is None else n_out,
                       usage_source=g.usage_source or source)
    more = shape.finishes(text)
    model = g.response_model or label(shapes.scan(("model",), text), MAX_NAME)
    return g._replace(finish_reasons=shapes.labels([*g.finish_reasons, *more]),
                   response_model=model)


def _tail_text(tail: bytes) -> bytes:
    """The response's last bytes without a head (of a short response) and with
    chunk framing taken out, well enough to find keys in."""
    h = parse_response_head(tail) if tail.startswith(b"HTTP/1.") else None
    return _FRAMING.sub(b"", tail[h.head_size:] if h and h.head_size else tail)


def _number(v: str) -> int | None:
    return shapes.count(int(v)) if v.isascii() and v.isdigit() and len(v) <= 18 else None


def _either(a, b):
    return a if a is not None else b
