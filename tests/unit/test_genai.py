"""sitsprobe.stitch.genai, read as its specification: GenAI meaning from the
bytes the kernel kept of an exchange.

Each fixture in tests/fixtures/genai is a server's response as its API
documentation shows it, stored as the raw HTTP bytes (chunked as the server
chunks: one chunk per event), with the request body it answered. A helper
cuts a response into the writes a server makes and keeps of them what the
kernel would (a peek of each, the last bytes, the first N writes), so each
case says: these bytes, seen this way, mean this.
"""
from __future__ import annotations

import json
import random
import re
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from sitsprobe.export.semconv import span_attributes
from sitsprobe.request import GenAI, Inference, Payload, Request, Stage, Write
from sitsprobe.stitch.genai import from_markers, merge, read
from sitsprobe.stitch.write_scan import DELTA, OUTPUT
from sitsprobe.stitch import write_scan
from sitsprobe.stitch.genai_shapes import MAX_JSON

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "genai"
INDEX = json.loads((FIXTURES / "index.json").read_text())
T0, MS = 1_000_000_000, 1_000_000  # the request's first byte; writes are 1 ms apart
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "qwen2.5-0.5b-instruct-q8_0.gguf"
QWEN_HF = "Qwen/Qwen2.5-0.5B-Instruct"
CLAUDE = "claude-sonnet-4-5"


def at(i: int) -> int:
    """When write i began."""
    return T0 + (i + 1) * MS


def request_body(name: str) -> bytes:
    """As a Python client sends it (json.dumps: messages first, model after)."""
    return json.dumps(json.loads((FIXTURES / f"{name}.request.json").read_text())).encode()


def written(name: str) -> list[bytes]:
    """The response as its server writes it: the head, then each chunk (or the body)."""
    raw = (FIXTURES / f"{name}.http").read_bytes()
    end = raw.index(b"\r\n\r\n") + 4
    parts, body = [raw[:end]], raw[end:]
    if b"transfer-encoding: chunked" not in raw[:end].lower():
        return [*parts, body]
    pos = 0
    while pos < len(body):
        nl = body.index(b"\r\n", pos)
        stop = nl + 2 + int(body[pos:nl], 16) + 2
        parts.append(body[pos:stop])
        pos = stop
    return parts


def coalesced(parts):  # two events per write
    return [parts[0]] + [b"".join(parts[i:i + 2]) for i in range(1, len(parts), 2)]


def split(parts):  # each event across two writes
    return [parts[0]] + [x for p in parts[1:] for x in (p[:len(p) // 2], p[len(p) // 2:])]


def head_with_body(parts):  # the first event in the head's write
    return [parts[0] + parts[1], *parts[2:]]


def one_write(parts):  # the whole body at once
    return [parts[0], b"".join(parts[1:])]


HEAD_PEEKS = 4  # bpf/sitsprobe.h: a response's first write keeps this many peeks (its head, its first event)


def exchange(name: str, parts: list[bytes], *, peek: int | None = None, kept: int | None = None,
             tail: int = 0, head: int | None = None, head_body: int | None = None,
             body: int | None = None, request_tail: int = 0, path: str | None = None,
             body_bytes: bytes | None = None, counted: bool = False) -> Request:
    """What the kernel keeps of fixture ``name`` answered in ``parts``: each
    write's first ``peek`` bytes (the first write's, HEAD_PEEKS times that),
    the first ``kept`` writes, the response's last ``tail`` bytes; the
    request's head with ``head_body`` bytes of its body (or
    its first ``head`` bytes), the body's first ``body`` bytes and last
    ``request_tail``; with ``counted``, the line feeds of each write cut
    short, as the kernel counts them."""
    raw = b"".join(parts)
    path = path or INDEX[name]["path"]
    data = request_body(name) if body_bytes is None else body_bytes
    headers = (f"POST {path} HTTP/1.1\r\nHost: engine:8000\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode()
    request = headers + data
    if head_body is not None:
        head = len(headers) + head_body
    writes = tuple(Write(at(i), len(p), p if peek is None else p[:peek * (HEAD_PEEKS if i == 0 else 1)],
                         *(write_scan.counted(p) if counted and peek is not None and len(p) > peek else ()))
                   for i, p in enumerate(parts))
    payload = Payload(request_body=data[:body] if body is not None else data,
                      request_tail=data[-request_tail:] if request_tail else b"",
                      response_tail=raw[-tail:] if tail else b"",
                      writes=writes[:kept] if kept else writes, writes_total=len(writes))
    return Request(pid=7, comm="engine", fd=9, start_ns=T0, end_ns=writes[-1].ts_ns,
                   first_out_ns=writes[0].ts_ns, bytes_in=len(request), bytes_out=len(raw),
                   method="POST", target=path, path=path, route=path,
                   status=int(raw[9:12]) if raw[9:12].isdigit() else None,
                   head=request[:head] if head is not None else request, payload=payload)


def chat(**kw) -> dict:
    return {"operation": "chat", "provider": "openai", **kw}


def completion(provider: str, **kw) -> dict:
    return {"operation": "text_completion", "provider": provider, **kw}


def stream(events: int, content: int, first: int, last: int, **kw) -> dict:
    """A stream of ``events``, ``content`` of them with output, the first in
    write ``first``, the last in ``last``, each 1 ms after the one before
    (those with output one after the other, unless ``chunk_gaps_ns`` says)."""
    return {"streaming": True, "events": events, "content_events": content,
            "first_token_ns": at(first), "last_token_ns": at(last), "max_gap_ns": MS,
            "answer_empty": False, "stream_ended": True, "chunk_gaps_ns": (MS,) * (content - 1), **kw}


# -- every fixture, as its server writes it: the whole GenAI record --------------------

AS_WRITTEN = {
    # role-only chunk (write 1), three content chunks (2-4), a finish chunk, a usage chunk, [DONE]
    "vllm_chat_stream": chat(
        request_model=LLAMA, response_model=LLAMA, max_tokens=64, finish_reasons=("stop",),
        input_tokens=31, output_tokens=3, usage_source="stream_usage", **stream(6, 3, 2, 4)),
    # no usage asked for: the content events are the output tokens
    "vllm_completions_stream": completion(
        "openai", request_model=LLAMA, response_model=LLAMA, max_tokens=4,
        finish_reasons=("length",), output_tokens=4, usage_source="counted_events",
        **stream(4, 4, 1, 4)),
    "vllm_chat": chat(
        request_model=LLAMA, response_model=LLAMA, max_tokens=128, finish_reasons=("stop",),
        input_tokens=42, output_tokens=9, usage_source="body", answer_empty=False,
        json_requested=True, json_valid=True),
    "vllm_completions": completion(
        "openai", request_model=LLAMA, response_model=LLAMA, max_tokens=16,
        finish_reasons=("length",), input_tokens=6, output_tokens=16, usage_source="body",
        answer_empty=False),
    "vllm_error": chat(request_model="error", error_type="NotFoundError"),
    "openai_error": completion("openai", request_model="error", max_tokens=999999,
                               error_type="invalid_request_error"),
    "openai_embeddings": {
        "operation": "embeddings", "provider": "openai", "request_model": "text-embedding-3-small",
        "response_model": "text-embedding-3-small", "input_tokens": 8, "usage_source": "body",
        "answer_empty": False},
    # prompt tokens: the prefill's length (decoder_input_details)
    "tgi_generate": completion(
        "huggingface.tgi", max_tokens=20, finish_reasons=("length",), input_tokens=3,
        output_tokens=20, usage_source="body", answer_empty=False),
    # the final event's token is special (</s>): an event, not content
    "tgi_generate_stream": completion(
        "huggingface.tgi", max_tokens=32, finish_reasons=("eos_token",), input_tokens=5,
        output_tokens=4, usage_source="stream_usage", **stream(4, 3, 1, 3)),
    "tgi_error": completion("huggingface.tgi", max_tokens=20, error_type="validation"),
    # Ollama streams unless "stream": false
    "ollama_chat_stream": chat(
        provider="ollama", request_model="llama3.2", response_model="llama3.2", max_tokens=64,
        finish_reasons=("stop",), input_tokens=26, output_tokens=3, usage_source="stream_usage",
        **stream(4, 3, 1, 3)),
    "ollama_generate_stream": completion(
        "ollama", request_model="llama3.2", response_model="llama3.2", max_tokens=2,
        finish_reasons=("length",), input_tokens=26, output_tokens=2, usage_source="stream_usage",
        **stream(3, 2, 1, 2)),
    # "format": "json", cut by the length limit: the answer is not JSON
    "ollama_chat": chat(
        provider="ollama", request_model="llama3.2", response_model="llama3.2", max_tokens=8,
        finish_reasons=("length",), input_tokens=20, output_tokens=8, usage_source="body",
        answer_empty=False, json_requested=True, json_valid=False),
    "ollama_generate": completion(
        "ollama", request_model="llama3.2", response_model="llama3.2", finish_reasons=("stop",),
        input_tokens=26, output_tokens=290, usage_source="body", answer_empty=False),
    "ollama_error": chat(provider="ollama", request_model="error", error_type="404"),
    # stop_type "eos" is a stop, "limit" a length
    "llamacpp_completion_stream": completion(
        "llama.cpp", response_model=QWEN, max_tokens=16, finish_reasons=("stop",),
        input_tokens=6, output_tokens=3, usage_source="stream_usage", **stream(4, 3, 1, 3)),
    "llamacpp_completion": completion(
        "llama.cpp", response_model=QWEN, max_tokens=16, finish_reasons=("length",),
        input_tokens=6, output_tokens=16, usage_source="body", answer_empty=False,
        json_requested=True, json_valid=True),
    # OpenAI's Responses API (vLLM's /v1/responses): cut by max_output_tokens, a "length"
    "openai_responses": chat(
        request_model=QWEN_HF, response_model=QWEN_HF, max_tokens=16, finish_reasons=("length",),
        input_tokens=12, output_tokens=16, usage_source="body", answer_empty=False),
    # 11 typed events: created, in_progress, item and part added, three text deltas (writes 5-7),
    # text, part and item done, completed (the usage): no [DONE]
    "openai_responses_stream": chat(
        request_model=QWEN_HF, response_model=QWEN_HF, max_tokens=64, finish_reasons=("stop",),
        input_tokens=14, output_tokens=3, usage_source="stream_usage", **stream(11, 3, 5, 7)),
    # Anthropic's Messages API: the input tokens count those read from the prompt cache (2048)
    "anthropic_messages": chat(
        provider="anthropic", request_model=CLAUDE, response_model=CLAUDE, max_tokens=1024,
        finish_reasons=("end_turn",), input_tokens=2060, output_tokens=6, usage_source="body",
        answer_empty=False),
    # message_start (the input), block start, a ping, three text deltas (writes 4-6), block stop,
    # message_delta (the stop reason, the output), message_stop
    "anthropic_messages_stream": chat(
        provider="anthropic", request_model=CLAUDE, response_model=CLAUDE, max_tokens=256,
        finish_reasons=("max_tokens",), input_tokens=472, output_tokens=256, usage_source="stream_usage",
        **stream(9, 3, 4, 6)),
    "anthropic_error": chat(provider="anthropic", request_model="error", max_tokens=64,
                            error_type="overloaded_error"),
    # SGLang's /generate (TGI's path): meta_info's counts and finish_reason.type
    "sglang_generate": completion(
        "sglang", max_tokens=16, finish_reasons=("length",), input_tokens=4, output_tokens=16,
        usage_source="body", answer_empty=False),
    "sglang_generate_stream": completion(
        "sglang", max_tokens=32, finish_reasons=("stop",), input_tokens=4, output_tokens=3,
        usage_source="stream_usage", **stream(3, 3, 1, 3)),
}


def test_every_fixture_has_its_case():
    assert sorted(AS_WRITTEN) == sorted(INDEX)


@pytest.mark.parametrize("name", sorted(AS_WRITTEN))
def test_each_api_as_its_server_writes_it(name):
    assert read(exchange(name, written(name))) == GenAI(source="wire", **AS_WRITTEN[name])


# -- the same streams written otherwise: (events, content events, first, last, max gap in ms)

@pytest.mark.parametrize(("name", "cut", "expect"), [
    ("vllm_chat_stream", coalesced, (6, 3, 1, 2, 1)),  # role + first content share write 1
    ("vllm_chat_stream", split, (6, 3, 3, 7, 2)),  # an event's time: the write it begins in
    ("vllm_chat_stream", head_with_body, (6, 3, 1, 3, 1)),
    ("vllm_chat_stream", one_write, (6, 3, 1, 1, 0)),
    ("vllm_completions_stream", head_with_body, (4, 4, 0, 3, 1)),
    ("tgi_generate_stream", split, (4, 3, 1, 5, 2)),
    ("ollama_chat_stream", coalesced, (4, 3, 1, 2, 1)),
    ("ollama_generate_stream", split, (3, 2, 1, 3, 2)),
    ("llamacpp_completion_stream", coalesced, (4, 3, 1, 2, 1)),
])
def test_however_the_writes_fall_the_events_are_the_same(name, cut, expect):
    g = read(exchange(name, cut(written(name))))
    events, content, first, last, gap = expect
    assert (g.events, g.content_events, g.first_token_ns, g.last_token_ns, g.max_gap_ns) == (
        events, content, at(first), at(last), gap * MS)
    assert g.finish_reasons == AS_WRITTEN[name]["finish_reasons"]
    assert g.output_tokens == AS_WRITTEN[name]["output_tokens"] and not g.events_approximate
    # from each event with output to the next: those that shared a write, 0
    assert len(g.chunk_gaps_ns) == content - 1 and sum(g.chunk_gaps_ns) == g.last_token_ns - g.first_token_ns
    assert (0 in g.chunk_gaps_ns) == (cut in (coalesced, one_write))


# -- what the kernel did not keep: counts are a floor, the tail fills usage ------------

@pytest.mark.parametrize(("name", "seen", "expect"), [
    # 64 bytes of each write: every event's start, no vLLM content (it comes later in a chunk)
    ("vllm_chat_stream", {"peek": 64},
     {"events": 6, "content_events": 0, "first_token_ns": None, "usage_source": None,
      "finish_reasons": (), "answer_empty": None}),
    # ... and the last 300 bytes: the usage chunk and finish reason, never more events
    ("vllm_chat_stream", {"peek": 64, "tail": 300},
     {"events": 6, "content_events": 0, "input_tokens": 31, "output_tokens": 3,
      "usage_source": "stream_usage", "finish_reasons": ("stop",), "response_model": LLAMA}),
    # an event seen in part: content if an output field has begun in what is visible
    ("vllm_chat_stream", {"peek": 200},
     {"events": 6, "content_events": 3, "first_token_ns": at(2), "output_tokens": 3,
      "usage_source": "counted_events"}),
    # TGI's token text is visible in 64 bytes; the closing </s>'s "special" is not: content
    ("tgi_generate_stream", {"peek": 64},
     {"events": 4, "content_events": 4, "first_token_ns": at(1), "last_token_ns": at(4)}),
    ("llamacpp_completion_stream", {"peek": 64, "tail": 300},
     {"events": 4, "content_events": 3, "input_tokens": 6, "output_tokens": 3,
      "usage_source": "stream_usage", "finish_reasons": ("stop",)}),
    # the first 4 writes of 9 kept: what they hold, and the rest from the tail
    ("vllm_chat_stream", {"kept": 4},
     {"events": 3, "content_events": 2, "last_token_ns": at(3), "output_tokens": 2,
      "usage_source": "counted_events", "answer_empty": False}),
    # ... and with the tail: the writes not kept counted as an event each, less the closing one
    # and the last chunk; the last token by the response's end (the last chunk's write)
    ("ollama_chat_stream", {"kept": 3, "tail": 400},
     {"events": 4, "content_events": 3, "input_tokens": 26, "output_tokens": 3,
      "usage_source": "stream_usage", "finish_reasons": ("stop",), "last_token_ns": at(5)}),
])
def test_a_stream_seen_in_part(name, seen, expect):
    g = read(exchange(name, written(name), **seen))
    assert g.events_approximate
    assert {k: getattr(g, k) for k in expect} == expect


@pytest.mark.parametrize(("name", "seen", "expect"), [
    # head and body cut at 64 bytes: the body's end, in the tail, still has usage and finish
    ("vllm_chat", {"peek": 64, "tail": 300},
     {"input_tokens": 42, "output_tokens": 9, "usage_source": "body", "finish_reasons": ("stop",),
      "response_model": None, "answer_empty": None, "json_valid": None}),
    # first bytes and last bytes that meet: parsed whole
    ("vllm_chat", {"peek": 300, "tail": 400},
     {"input_tokens": 42, "response_model": LLAMA, "answer_empty": False, "json_valid": True}),
    ("ollama_generate", {"peek": 64},
     {"input_tokens": None, "usage_source": None, "answer_empty": None,
      "request_model": "llama3.2"}),
    ("vllm_error", {"peek": 64}, {"error_type": "404", "answer_empty": None}),  # the status
])
def test_a_body_seen_in_part(name, seen, expect):
    g = read(exchange(name, written(name), **seen))
    assert {k: getattr(g, k) for k in expect} == expect


def coalesce_by(n):
    def layout(parts):  # n events per write: a server catching up under load
        return [parts[0]] + [b"".join(parts[i:i + n]) for i in range(1, len(parts), n)]
    return layout


# Ways a stream's parts (its head first) share writes, as groups of the parts' indexes: a
# server catching up under load, a client that reads several at once (its first read with the head)
SHARED = {"two a write": lambda n: [[0], *([i, i + 1][:n - i] for i in range(1, n, 2))],
          "three a write": lambda n: [[0], *(list(range(i, min(i + 3, n))) for i in range(1, n, 3))],
          "the body at once": lambda n: [[0], list(range(1, n))],
          "the head with one": lambda n: [[0, 1], *([i] for i in range(2, n))],
          "the head with two": lambda n: [[0, 1, 2], *([i] for i in range(3, n))],
          "all at once": lambda n: [list(range(n))]}
EXACT = ("events", "content_events", "output_tokens", "finish_reasons", "usage_source", "answer_empty",
         "events_approximate", "stream_ended", "response_model", "input_tokens")


@pytest.mark.parametrize("name", [n for n in sorted(INDEX) if INDEX[n]["stream"]])
@pytest.mark.parametrize("layout", SHARED)
def test_however_events_share_writes_past_their_peek_the_record_is_the_streams(name, layout):
    """Past a write's peek (the default 384 bytes) the kernel counts its events
    and its output begun (bpf/write_scan.h): the record is the stream's, its
    first and last token at the writes that hold them."""
    parts = written(name)
    groups = SHARED[layout](len(parts))
    truth = read(exchange(name, parts))
    g = read(exchange(name, [b"".join(parts[i] for i in grp) for grp in groups], peek=384, counted=True,
                      tail=512))
    assert {f: getattr(g, f) for f in EXACT} == {f: getattr(truth, f) for f in EXACT}
    at_write = {i: at(k) for k, grp in enumerate(groups) for i in grp}  # part -> when its write began
    part = {at(i): i for i in range(len(parts))}
    assert (g.first_token_ns, g.last_token_ns) == (at_write[part[truth.first_token_ns]],
                                                   at_write[part[truth.last_token_ns]])


@pytest.mark.parametrize("name", [n for n in sorted(INDEX) if INDEX[n]["stream"]])
def test_a_read_that_ends_inside_an_event_leaves_its_counts_to_the_event(name):
    """A read may end inside an event (a client that reads what has come, a
    big event on a real network): here the first ends just before the first
    output, and the second, past its peek, holds the rest of that event and
    all the others. The kernel counts that output, and that event's line end,
    in the second read, but the event began in the first and is read whole
    across the two: counted once. (It was counted twice: one content event
    too many in six of the nine streams, and one NDJSON event too many in
    Ollama's.)"""
    parts = written(name)
    raw, truth = b"".join(parts), read(exchange(name, parts))
    typed = name.startswith(("anthropic", "openai_responses"))
    split = (DELTA if typed else OUTPUT).search(raw, len(parts[0])).start()  # where the kernel counts it
    first, rest = raw[:split], raw[split:]
    # the first read whole, the second past its peek (Anthropic's head is long: the first
    # is past its peek too, and its first event in the first write's more peeks)
    peek = len(first) if len(rest) > len(first) else 384
    g = read(exchange(name, [first, rest], peek=peek, counted=True, tail=512))
    assert {f: getattr(g, f) for f in EXACT} == {f: getattr(truth, f) for f in EXACT}


@pytest.mark.parametrize("name", ["vllm_chat_stream", "tgi_generate_stream", "ollama_generate_stream"])
def test_a_stream_that_coalesced_once_is_counted_exactly(name):
    parts = written(name)
    parts = [*parts[:3], b"".join(parts[3:6]), *parts[6:]]  # three events in one write, mid-stream
    truth = read(exchange(name, written(name)))
    g = read(exchange(name, parts, peek=max(len(p) for p in parts[1:3]) + 8, counted=True, tail=512))
    assert (g.events, g.content_events, g.events_approximate) == (truth.events, truth.content_events, False)


def long_answer(name: str, tokens: int) -> list[bytes]:
    """Fixture ``name``'s stream with its first content event written ``tokens``
    times, and its usage saying so (a long answer: a reasoning model's)."""
    head, *chunks = written(name)
    body = [c.partition(b"\r\n")[2][:-2] for c in chunks if c != b"0\r\n\r\n"]
    first = next(i for i, b in enumerate(body) if read_content(name, b))
    body[first:first + 1] = [body[first]] * tokens
    body = [re.sub(rb'("completion_tokens"|"eval_count"):\d+', rb"\1:%d" % tokens, b) for b in body]
    return [head, *(b"%x\r\n%s\r\n" % (len(b), b) for b in body), b"0\r\n\r\n"]


def read_content(name: str, event: bytes) -> bool:
    """Whether one event of fixture ``name`` carries output, as read alone."""
    return read(exchange(name, [written(name)[0], b"%x\r\n%s\r\n" % (len(event), event), b"0\r\n\r\n"])
                ).content_events == 1


@pytest.mark.parametrize("name", ["vllm_chat_stream", "ollama_chat_stream"])
def test_a_stream_longer_than_the_writes_kept_is_counted_whole_and_timed_by_its_end(name):
    """capture.max_writes (here 50) of an answer of 400 tokens: the writes not
    kept are counted, an event each, and the last token is taken at the
    response's end, so the time per output token is the answer's, not that of
    its first 50 writes (a quarter of it, before)."""
    parts = long_answer(name, 400)
    whole = exchange(name, parts, tail=512)
    cut = exchange(name, parts, tail=512, kept=50)
    g, w = read(cut), read(whole)
    assert (g.events, g.content_events, g.output_tokens) == (w.events, w.content_events, w.output_tokens)
    assert w.output_tokens == 400 and w.content_events > 400 and g.events_approximate
    r, rw = cut._replace(genai=g), whole._replace(genai=w)
    assert r.tpot_ns == pytest.approx(rw.tpot_ns, rel=0.02)
    assert (g.first_token_ns, g.last_token_ns) == (w.first_token_ns, cut.end_ns)


@pytest.mark.parametrize("name", ["vllm_chat_stream", "ollama_chat_stream"])
def test_a_long_stream_whose_server_wrote_no_last_chunk_is_counted_whole(name):
    """The client hung up at the stream's end (the openai client does, at
    [DONE]) and the server, seeing it, wrote no chunked body's last chunk
    (uvicorn): of the writes not kept, none is that chunk's to take off."""
    parts = long_answer(name, 400)
    assert parts[-1] == b"0\r\n\r\n"
    whole = read(exchange(name, parts, tail=512))
    g = read(exchange(name, parts[:-1], tail=512, kept=50))
    assert (g.events, g.content_events, g.output_tokens) == (whole.events, whole.content_events, whole.output_tokens)


def test_uncounted_events_past_a_peek_leave_the_count_a_floor():
    name = "vllm_chat_stream"
    g = read(exchange(name, coalesce_by(3)(written(name)), peek=160))
    assert g.events_approximate and g.events < read(exchange(name, written(name))).events


def test_no_content_at_all_is_an_empty_answer():
    parts = written("vllm_chat_stream")
    role_finish_done = [parts[0], parts[1], parts[5], parts[7], parts[8]]  # no content, no usage
    g = read(exchange("vllm_chat_stream", role_finish_done))
    assert (g.events, g.content_events, g.answer_empty) == (2, 0, True)
    assert (g.first_token_ns, g.output_tokens, g.usage_source) == (None, 0, "counted_events")
    assert read(exchange("vllm_chat_stream", role_finish_done[:3])).answer_empty  # finished
    assert read(exchange("vllm_chat_stream", role_finish_done[:2])).answer_empty is None  # not yet


def sse(*events: bytes) -> list[bytes]:
    """An SSE response written one chunk per event."""
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    return [head, *(b"%x\r\n%s\r\n" % (len(e), e) for e in events), b"0\r\n\r\n"]


def test_server_sent_events_as_the_spec_frames_them():
    delta = b'{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}'
    parts = sse(b": keep-alive\n\n",  # a comment: no event
                b"data: " + delta + b"\n\n",
                b"data: not json\n\n",  # a data event all the same, without output
                b"event: message\r\nid: 7\r\ndata: " + delta + b"\r\n\r\n",  # CRLF lines
                b"data: [DONE]\n\n")
    g = read(exchange("vllm_chat_stream", parts))
    assert (g.events, g.content_events, g.first_token_ns, g.last_token_ns) == (3, 2, at(2), at(4))
    assert (g.answer_empty, g.output_tokens, g.usage_source) == (False, 2, "counted_events")


@pytest.mark.parametrize(("name", "groups", "first"), [
    # transformers serve's writes: created with in_progress; the item and part added with the
    # first delta; each later delta; the three ends; completed
    ("openai_responses_stream", [(1, 2), (3, 4, 5), (6,), (7,), (8, 9, 10), (11,), (12,)], 2),
    # Anthropic's: the start, block start and ping, then each delta; the ends in one write
    ("anthropic_messages_stream", [(1,), (2, 3, 4), (5,), (6,), (7, 8, 9), (10,)], 2),
])
def test_typed_events_coalesced_past_the_peek_count_only_their_deltas(name, groups, first):
    """Writes of several typed events, seen by their first 200 bytes: the
    hidden ones count as events; as output only the deltas the kernel counted,
    and the first token is the write the first one came in."""
    parts = written(name)
    writes = [parts[0], *(b"".join(parts[i] for i in g) for g in groups)]
    g = read(exchange(name, writes, peek=200, counted=True, tail=512))
    want = AS_WRITTEN[name]
    assert (g.events, g.content_events, g.output_tokens, g.first_token_ns) == (
        want["events"], want["content_events"], want["output_tokens"], at(first))


@pytest.mark.parametrize("name", ["openai_responses_stream", "anthropic_messages_stream", "vllm_chat_stream"])
def test_the_model_of_a_stream_whose_events_are_longer_than_the_peek(name):
    """The default peek (384 bytes) cuts the Responses API's first event (the
    whole response object, 540 bytes); the model it names early is read all
    the same, as from any event seen in part."""
    g = read(exchange(name, written(name), peek=384, counted=True, tail=512))
    assert g.response_model == AS_WRITTEN[name]["response_model"]


def test_a_responses_stream_that_fails_says_its_error_and_a_tool_call_is_output():
    """The Responses API's error event and its response.failed name the error by
    its code; a function call's arguments are output, and its response's finish
    reason is "tool_calls"."""
    def event(kind: str, **fields) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps({"type": kind, **fields}).encode())
    failed = read(exchange("openai_responses_stream", sse(
        event("response.created", response={"model": QWEN_HF, "status": "in_progress"}),
        event("response.output_text.delta", delta="x"),
        event("error", code="server_error", message="SECRET-ANSWER"),
        event("response.failed", response={"status": "failed", "error": {"code": "server_error"}}))))
    assert (failed.error_type, failed.content_events, failed.response_model) == ("server_error", 1, QWEN_HF)
    called = read(exchange("openai_responses_stream", sse(
        event("response.function_call_arguments.delta", delta='{"city"'),
        event("response.completed", response={"status": "completed", "usage": {"input_tokens": 9, "output_tokens": 4},
                                              "output": [{"type": "function_call", "arguments": '{"city"}'}]}))))
    assert (called.content_events, called.finish_reasons, called.output_tokens, called.stream_ended) == (
        1, ("tool_calls",), 4, True)


# -- bodies a gateway compressed (the clients' Accept-Encoding asks for it)

def encoded(parts: list[bytes], encoding: str = "gzip") -> list[bytes]:
    """``parts`` (a head, then a body's writes) as a gateway compressing them
    sends them: Content-Encoding named, the body encoded by zlib (gzip's
    container, zlib's, or raw deflate) and flushed at each write as a stream
    is, one chunk a write, the last chunk after."""
    wbits = {"gzip": 31, "deflate": 15, "raw deflate": -15}[encoding]
    head, body = parts[0], b"".join(parts[1:])
    chunked = b"transfer-encoding: chunked" in head.lower()
    plain = [p for p in _dechunked(parts[1:])] if chunked else [body]
    z = zlib.compressobj(6, zlib.DEFLATED, wbits)
    out = [z.compress(p) + z.flush(zlib.Z_SYNC_FLUSH) for p in plain]
    out[-1] += z.flush()
    head = re.sub(rb"(?i)content-length: \d+\r\n", b"", head).replace(b"\r\n\r\n", b"\r\n") + \
        b"content-encoding: " + encoding.split()[-1].encode() + b"\r\n" + \
        (b"" if chunked else b"transfer-encoding: chunked\r\n") + b"\r\n"
    return [head, *(b"%x\r\n%s\r\n" % (len(c), c) for c in out if c), b"0\r\n\r\n"]


def _dechunked(chunks: list[bytes]) -> list[bytes]:
    return [c[c.index(b"\r\n") + 2:-2] for c in chunks if not c.startswith(b"0\r\n")]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw deflate"])
@pytest.mark.parametrize("name", ["vllm_chat", "vllm_chat_stream", "ollama_chat_stream", "tgi_generate"])
def test_a_body_the_gateway_compressed_reads_as_the_plain_one(name, encoding):
    plain = read(exchange(name, written(name)))
    g = read(exchange(name, encoded(written(name), encoding)))
    assert g == plain._replace(content_encoding=encoding.split()[-1])


def test_a_compressed_stream_is_read_up_to_the_first_bytes_not_seen():
    name = "vllm_chat_stream"
    parts = encoded(written(name))
    plain = read(exchange(name, written(name)))
    g = read(exchange(name, parts[:3] + parts[4:]))  # the third event's write not kept
    assert g.events_approximate and 0 < g.events < plain.events
    assert g.first_token_ns == plain.first_token_ns and g.content_encoding == "gzip"
    whole_tail = read(exchange(name, parts, kept=2, tail=512))  # an encoded tail alone says nothing
    assert whole_tail.events_approximate and whole_tail.events < plain.events


def test_an_encoding_not_undone_or_a_bomb_reads_nothing_and_never_raises():
    name = "vllm_chat"
    br = [written(name)[0].replace(b"\r\n\r\n", b"\r\ncontent-encoding: br\r\n\r\n"), b"\x1b\x2d" * 40]
    g = read(exchange(name, br))
    assert (g.content_encoding, g.usage_source, g.response_model, g.request_model) == ("br", None, None, LLAMA)
    bomb = zlib.compress(b"{" + b" " * (64 << 20), 9)  # 64 MiB of one JSON object's spaces
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: deflate\r\n" + \
        b"content-length: %d\r\n\r\n" % len(bomb)
    r = exchange(name, [head, bomb])
    tracemalloc.start()
    try:
        g = read(r)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert g.content_encoding == "deflate" and g.usage_source is None
    assert peak < 8 * MAX_JSON, f"{peak / 2**20:.1f} MiB"  # inflated no further than MAX_JSON (a few copies)
    junk = read(exchange(name, encoded(written(name))[:1] + [b"5\r\nnot z\r\n", b"0\r\n\r\n"]))
    assert junk.content_encoding == "gzip" and junk.usage_source is None


def test_an_interim_100_continue_is_not_the_response():
    name, interim = "vllm_chat_stream", b"HTTP/1.1 100 Continue\r\n\r\n"
    g = read(exchange(name, [interim, *written(name)]))  # its own write: all a write later
    assert (g.events, g.content_events, g.first_token_ns, g.finish_reasons) == (
        6, 3, at(3), ("stop",))
    assert not g.events_approximate
    head, *rest = written(name)
    g = read(exchange(name, [interim + head, *rest]))
    assert (g.events, g.first_token_ns, g.input_tokens) == (6, at(2), 31)


# -- the request ----------------------------------------------------------------------

def test_a_request_read_from_its_first_and_last_bytes():
    name = "vllm_chat_stream"
    assert request_body(name).index(b'"model": "meta') > 150  # the model comes after the messages
    g = read(exchange(name, written(name), head_body=0, body=100, request_tail=130))
    assert (g.request_model, g.max_tokens) == (LLAMA, 64)
    g = read(exchange(name, written(name), head_body=0, body=100))
    assert (g.request_model, g.max_tokens) == (None, None)


def test_a_key_inside_a_string_is_never_read():
    name = "vllm_chat_stream"
    data = request_body(name)
    assert b'\\"model\\": \\"SECRET-PROMPT-MODEL\\"' in data  # the prompt's own "model"
    cut = data.index(b"SECRET-PROMPT-MODEL") + 40  # past it, before the real one
    g = read(exchange(name, written(name), head_body=0, body=cut))
    assert g.request_model is None and g.max_tokens is None
    g = read(exchange(name, written(name), head_body=0, body=cut, request_tail=130))
    assert g.request_model == LLAMA


def test_the_request_decides_streaming_where_the_response_head_was_not_seen():
    ollama = read(exchange("ollama_chat_stream", written("ollama_chat_stream"), peek=40))
    assert ollama.streaming and ollama.events == 4  # NDJSON, by Ollama's default
    tgi = read(exchange("tgi_generate_stream", written("tgi_generate_stream"), peek=40))
    assert tgi.streaming and tgi.events == 4  # SSE, seen in the data: lines


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("POST", "/v1/chat/completions", ("chat", "openai")),
    ("POST", "/openai/v1/chat/completions", ("chat", "openai")),  # behind a gateway's prefix
    ("POST", "/v1/completions", ("text_completion", "openai")),
    ("POST", "/v1/embeddings", ("embeddings", "openai")),
    ("POST", "/generate", ("text_completion", "huggingface.tgi")),
    ("POST", "/generate_stream", ("text_completion", "huggingface.tgi")),
    ("POST", "/api/chat", ("chat", "ollama")),
    ("POST", "/api/generate", ("text_completion", "ollama")),
    ("POST", "/api/embed", ("embeddings", "ollama")),
    ("POST", "/api/embeddings", ("embeddings", "ollama")),
    ("POST", "/completion", ("text_completion", "llama.cpp")),
    ("POST", "/completions", ("text_completion", "llama.cpp")),
    ("POST", "/v1/models", None),
    ("POST", "/health", None),
    ("GET", "/v1/chat/completions", None),
])
def test_endpoints(method, path, kind):
    r = exchange("vllm_chat", written("vllm_chat"), path=path)._replace(method=method)
    g = read(r)
    assert (g and (g.operation, g.provider)) == kind
    assert read(r._replace(payload=None)) is None


# -- the markers, and both --------------------------------------------------------------

def test_the_markers_numbers_win_and_the_wire_fills_the_rest():
    inf = Inference(request_id=3, model="tiny", start_ns=T0 + 10, end_ns=at(9),
                    stages=(Stage("prefill", T0 + 10, T0 + 500_000), Stage("decode", at(1), at(5))),
                    input_tokens=5, output_tokens=4)
    r = exchange("vllm_chat_stream", written("vllm_chat_stream"))._replace(inference=inf)
    markers = from_markers(r)
    assert markers == GenAI(source="markers", operation="chat", provider="openai",
                            request_model="tiny", input_tokens=5, output_tokens=4,
                            usage_source="markers", first_token_ns=T0 + 500_000,
                            last_token_ns=at(5))
    g = merge(markers, read(r))
    assert (g.source, g.request_model, g.input_tokens, g.output_tokens, g.usage_source) == (
        "markers", "tiny", 5, 4, "markers")
    assert (g.first_token_ns, g.last_token_ns) == (T0 + 500_000, at(5))
    assert (g.response_model, g.finish_reasons, g.events, g.content_events, g.max_gap_ns) == (
        LLAMA, ("stop",), 6, 3, MS)
    untold = from_markers(r._replace(inference=Inference(3, "", T0, at(9))))  # no usage marker
    both = merge(untold, read(r))
    assert (both.request_model, both.input_tokens, both.usage_source) == (LLAMA, 31, "stream_usage")
    assert merge(markers, None) is markers and merge(None, None) is None
    assert from_markers(r) is not None and from_markers(r._replace(inference=None)) is None


def test_an_error_inside_a_success_is_the_servers_and_a_refusal_is_not():
    """A 200 stream that ends in an error event (the engine failed mid-answer)
    is an ERROR span with the event's type; a 4xx the server gave names its
    type and stays a server 4xx (no ERROR); Anthropic's 529 is both."""
    broken = exchange("vllm_chat_stream", sse(
        b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n',
        b'data: {"error":{"type":"InternalServerError","message":"SECRET-ANSWER"}}\n\n'))
    refused, overloaded = (exchange(n, written(n)) for n in ("vllm_error", "anthropic_error"))
    for r, kind, error in ((broken, "InternalServerError", True), (refused, "NotFoundError", False),
                           (overloaded, "overloaded_error", True)):
        r = r._replace(genai=read(r))
        assert (span_attributes(r)["error.type"], r.is_error) == (kind, error), r.genai


def test_span_attributes_of_a_wire_read_request():
    r = exchange("vllm_chat_stream", written("vllm_chat_stream"))
    r = r._replace(genai=read(r))
    a = span_attributes(r)
    assert {k: v for k, v in a.items() if k.startswith(("gen_ai.", "sitsprobe.genai."))} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": LLAMA, "gen_ai.request.max_tokens": 64,
        "gen_ai.response.model": LLAMA, "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 31, "gen_ai.usage.output_tokens": 3,
        "gen_ai.server.time_to_first_token": (at(2) - T0) / 1e9,
        "gen_ai.server.time_per_output_token": (at(4) - at(2)) / 2 / 1e9,
        "sitsprobe.genai.source": "wire", "sitsprobe.genai.usage_source": "stream_usage",
        "sitsprobe.genai.stream_events": 6, "sitsprobe.genai.content_events": 3,
        "sitsprobe.genai.max_stall_s": 0.001, "sitsprobe.genai.answer_empty": False}
    assert r.ttft_ns == at(2) - T0 and r.tpot_ns == MS
    cut = exchange("vllm_chat_stream", written("vllm_chat_stream"), peek=64)
    cut_attrs = span_attributes(cut._replace(genai=read(cut)))
    assert cut_attrs["sitsprobe.genai.events_approximate"] is True
    err = exchange("openai_error", written("openai_error"))
    assert span_attributes(err._replace(genai=read(err)))["error.type"] == "invalid_request_error"


# -- any bytes at all -----------------------------------------------------------------

HOSTILE = [b"[" * 5000, b'{"a":' * 3000, b"9" * 5000, b"-" + b"9" * 40, b"\x00" * 64,
           b"\xff\xfe\xc3", b"data: not json\n\n", b"data:\n\n", b"data: [DONE]\n\n",
           b"ffffffffffffffff\r\n", b"\r\n0\r\n\r\n", b"1\r\n", b"\r\n\r\n",
           b'"model":"\x01\x7f\x1b[31m"', b'"model":' + b"7" * 30, b"HTTP/1.1 100 Continue\r\n\r\n",
           b'"prompt_tokens":-5,"completion_tokens":1e400', b'{"error":{"type":["x"]}}',
           b'"finish_reason":"' + b"x" * 300 + b'"', b'"content":"', b"\\", b'\\"', b"\n",
           b'{"choices":[{"delta":{"content":"x"}}]}\n', "é☃".encode(), b"HTTP/1.1 200 OK\r\n"]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(4)):
        op = rng.randrange(4)
        at_ = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(at_, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[at_:at_] = rng.choice(HOSTILE)
        elif op == 2:
            del b[at_:at_ + rng.randrange(1, 64)]
        else:
            b = b[:at_]
    return bytes(b)


NAMING = ("model", "finish_reason", "done_reason", "stop_type", "type", "code", "error_type", "reason", "status",
          "stop_reason")


def named_in(*pieces: bytes, status: int | None) -> set[str]:
    """Every string a GenAI record may carry from ``pieces``: a value of a key that
    names a model, a finish reason or an error type; what those map to; the status."""
    found = {"error", "stop", "length", str(status)}
    for key in NAMING:
        rx = re.compile(rb'"' + key.encode() + rb'"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
        for m in (m for data in pieces for m in rx.finditer(data)):
            try:
                v = json.loads(m[1].decode("utf-8", "replace"))
            except ValueError:
                continue
            found.add(v if isinstance(v, str) else str(v))
    return {"".join(c for c in v if c.isprintable()).strip()[:256] for v in found} | found


def strings(g: GenAI) -> list[str]:
    return [v for v in (g.request_model, g.response_model, g.error_type, *g.finish_reasons) if v]


def check(g: GenAI | None, r: Request, allowed: set[str], case) -> None:
    assert g is not None, case
    for v in strings(g):
        assert v in allowed or any(v in a for a in allowed), (case, v)  # (capped: a prefix)
        assert v.isprintable() and 0 < len(v) <= 256 and v == v.strip(), (case, v)
    assert all(len(v) <= 64 for v in (*g.finish_reasons, g.error_type or ""))
    assert 0 <= g.content_events <= g.events and (g.output_tokens or 0) >= 0
    if not any("SECRET" in a for a in allowed):  # no prompt or answer text, anywhere
        shown = repr(g) + repr(span_attributes(r._replace(genai=g)))
        assert "SECRET" not in shown, (case, shown)


@pytest.mark.parametrize("name", sorted(INDEX))
def test_no_prompt_or_answer_text_however_it_was_seen(name):
    for cut in (lambda p: p, coalesced, split, one_write):
        for seen in ({}, {"peek": 64}, {"peek": 200, "tail": 300}, {"kept": 2, "tail": 5000},
                     {"head_body": 0, "body": 60, "request_tail": 60}):
            r = exchange(name, cut(written(name)), **seen)
            allowed = named_in(b"".join(written(name)), request_body(name), status=r.status)
            check(read(r), r, allowed, (name, seen))


def test_no_bytes_make_it_raise_or_tell_what_they_should_not():
    rng = random.Random(20241104)
    names = sorted(INDEX)
    started = time.monotonic()
    for case in range(3000):
        name = rng.choice(names)
        raw = mutate(rng, b"".join(written(name)))
        body = mutate(rng, request_body(name))
        cuts = sorted(rng.sample(range(len(raw) + 1), min(len(raw) + 1, rng.randrange(1, 14))))
        parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
        r = exchange(name, parts, peek=rng.choice([None, None, 0, 1, 16, 64, 200]),
                     kept=rng.choice([None, None, 1, 3]), tail=rng.choice([0, 64, 300, 5000]),
                     head=rng.choice([None, 20, 200]), body=rng.choice([None, 0, 50, 150]),
                     request_tail=rng.choice([0, 40, 130]), body_bytes=body)
        check(read(r), r, named_in(raw, body, status=r.status), (case, name))
    assert time.monotonic() - started < 30


def test_no_encoded_bytes_make_it_raise():
    """Compressed bodies mutated and cut: read, never raised on, bounded; what
    a damaged stream inflates to is not the server's, so only the shape of
    the record is checked."""
    rng = random.Random(1952)
    names = sorted(INDEX)
    for case in range(1500):
        name = rng.choice(names)
        raw = mutate(rng, b"".join(encoded(written(name), rng.choice(["gzip", "deflate", "raw deflate"]))))
        cuts = sorted(rng.sample(range(len(raw) + 1), min(len(raw) + 1, rng.randrange(1, 10))))
        parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
        r = exchange(name, parts, peek=rng.choice([None, None, 16, 64, 200]),
                     kept=rng.choice([None, None, 1, 3]), tail=rng.choice([0, 64, 300]))
        g = read(r)
        check(g, r, set(strings(g)) | named_in(raw, status=r.status), (case, name))


def test_the_work_is_bounded_by_what_was_kept():
    event = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    parts = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"] + [event] * 20_000
    started = time.monotonic()
    g = read(exchange("vllm_chat_stream", parts))
    assert (g.events, g.content_events) == (20_000, 20_000)
    assert time.monotonic() - started < 2


def test_the_quick_output_glance_says_what_the_regex_says():
    """genai_shapes._visible looks for the compact "content":"x with bytes.find
    before its regex: on strings made of the pieces that matter (escaped quotes,
    empty values, spaces, the other keys) both say the same."""
    from sitsprobe.stitch import genai_shapes as shapes
    keys = rb"content|reasoning_content|reasoning|refusal|text"
    regex = re.compile(b"|".join((shapes._key_str(keys), shapes._TOOL_CALLS)))
    glance = shapes._visible(keys, shapes._TOOL_CALLS)
    atoms = [b'"', b"\\", b":", b" ", b"x", b"content", b'"content":"', b'\\"content":"', b'"content": "',
             b'"text":"', b"tool_calls", b"[", b"{", b"}"]
    rng = random.Random(20261202)
    said = {True: 0, False: 0}
    for _ in range(30_000):
        data = b"".join(rng.choice(atoms) for _ in range(rng.randrange(9)))
        expect = regex.search(data) is not None
        assert glance(data) is expect, data
        said[expect] += 1
    assert min(said.values()) > 3_000  # both answers were put to the test


CHUNKED_STREAMS = ["vllm_chat_stream", "vllm_completions_stream", "tgi_generate_stream",
                   "llamacpp_completion_stream", "ollama_chat_stream", "ollama_generate_stream"]


def test_a_token_a_write_is_read_in_one_pass_as_the_general_reading_reads_it():
    """genai._chunk_each reads a chunked SSE or NDJSON stream whose every
    write is one chunk of one event at once; on any bytes it either declines
    (None) or gives the events, the end and the kind that _body, _events and
    _kind give, write by write.
    Run on the fixtures as written, cut otherwise and mutated, and on a
    stdlib server's token stream (bench_genai's)."""
    from sitsprobe.stitch import genai as g
    rng = random.Random(20261204)
    cuts = [lambda p: p, coalesced, split, head_with_body, one_write]
    agreed = {"sse": 0, "ndjson": 0, "declined": 0}
    for case in range(4000):
        name = rng.choice(CHUNKED_STREAMS)
        parts = rng.choice(cuts)(written(name))
        if case % 3 == 1:  # some writes mutated, some peeks short, the last chunk kept or not
            parts = [mutate(rng, p) if rng.random() < 0.1 else p for p in parts]
            parts = parts[:-1] if rng.random() < 0.2 else parts
        elif case % 3 == 2:  # bytes put in a chunk's data, its size kept true
            parts = [rechunk(rng, p) if rng.random() < 0.1 else p for p in parts]
        r = exchange(name, parts, peek=rng.choice([None] * 8 + [64, 200]))
        p, head = g._final_response(r.payload)
        quick = g._chunk_each(p.writes, head)
        if quick is None:
            agreed["declined"] += 1
            continue
        pieces, ended = g._body(p, head)
        kind = g._kind(head, pieces, g.shapes.shape_of(r.path), True, head.status)
        assert quick == (g._events(pieces, kind), ended, kind), (case, name, parts)
        agreed[kind] += 1
    assert min(agreed.values()) > 300  # each way was put to the test


def rechunk(rng: random.Random, part: bytes) -> bytes:
    """A chunk with bytes that matter to its framing put in its data, and its
    size line made true, written in a way the chunked coding allows or not."""
    size, crlf, data = part.partition(b"\r\n")
    if not crlf or not data.endswith(b"\r\n"):
        return part
    data = bytearray(data[:-2])
    at_ = rng.randrange(len(data) + 1)
    data[at_:at_] = rng.choice([b"\n", b"\r", b"\n\n", b"\r\n", b"data:", b" ", b"\n\n\r\n", b"\n\r\n",
                                b"0\r\n\r\n"])
    size_line = rng.choice([b"%x", b"%X", b"0%x", b"0x%x", b" %x", b"%x ", b"+%x", b"%x;ext=1"])
    return size_line % len(data) + b"\r\n%s\r\n" % bytes(data)


def test_a_stdlib_servers_token_stream_takes_the_one_pass():
    from bench.bench_genai import stream_writes
    from sitsprobe.stitch import genai as g
    token, final, done, last = stream_writes(32)
    head = (b"HTTP/1.1 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11.7\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    r = exchange("vllm_chat_stream", [head, *[token] * 32, final, done, last])
    p, h = g._final_response(r.payload)
    events, ended, kind = g._chunk_each(p.writes, h)
    assert (len(events), ended, kind) == (34, True, "sse") and events[-1] == (at(34), b"[DONE]")
    got = read(r)
    assert (got.events, got.content_events, got.output_tokens, got.finish_reasons) == (33, 32, 32, ("stop",))
