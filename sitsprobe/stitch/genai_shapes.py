"""What each GenAI API says in its JSON, for :mod:`sitsprobe.stitch.genai`
(which does the framing: HTTP, chunks, SSE, NDJSON).

A :class:`Shape` is one endpoint family: which request fields mean what
(``ask``, given a getter over the request JSON), what one response object
carries (``look``: a :class:`Look`, for a whole non-stream body and for one
stream event alike), a test for output in an event seen only in part, and
the keys to look for in JSON text that does not parse (a body's visible end).

Text that does not parse is read by :func:`scan`: a key matches only where
its quotes are unescaped, so never inside a JSON string (a prompt's
``\\"model\\"``). Nothing here keeps text: an answer's text is returned only
so that ``json_valid`` can be decided; strings kept are model names, finish
reasons and error types, printable and capped (:func:`label`).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

OPENAI = "openai"  # the OpenAI API shape, whichever engine (vLLM, SGLang, ...) speaks it
TGI = "huggingface.tgi"  # Hugging Face text-generation-inference, native API
OLLAMA = "ollama"
LLAMA_CPP = "llama.cpp"  # the llama.cpp server's native API
SGLANG = "sglang"  # SGLang's native API
ANTHROPIC = "anthropic"  # the Anthropic Messages API shape (vLLM, llama.cpp and gateways speak it too)

MAX_CHOICES = 64  # choices looked at per object
MAX_JSON = 1 << 20  # bytes parsed as one JSON document
MAX_NAME = 256  # characters of a model name kept
MAX_LABEL = 64  # ... of a finish reason or an error type
_MAX_TOKENS = 1 << 62
# a key's opening quote, not an escaped one inside a string; the lookbehind after
# the quote (not before it) lets a search skip to each quote: 4x faster
_UNESCAPED_QUOTE = rb'"(?<!\\")'
# a JSON value as far as a key scan needs it: a short string, an integer, a literal, an opening
_VALUE = rb'("(?:[^"\\]|\\.){0,256}"|-?\d{1,20}(?![\d.eE])|true|false|null|\{|\[)'

Get = Callable[..., Any]  # get("parameters", "max_new_tokens") -> the value, or None


@dataclass(frozen=True, slots=True)
class Ask:
    """What the request asked for."""

    max_tokens: int | None = None
    stream: bool = False
    json: bool = False  # a JSON answer (response_format, format, grammar, json_schema)


@dataclass(frozen=True, slots=True)
class Look:
    """What one response object (a body or a stream event) carries."""

    content: bool = False  # some output: text, reasoning, tool calls, embeddings
    texts: tuple[str, ...] = ()  # the answer's text(s), only to test json_valid
    finish: tuple[str, ...] = ()
    input_tokens: int | None = None
    output_tokens: int | None = None
    model: str | None = None
    done: bool = False  # the object that ends a stream


@dataclass(frozen=True, slots=True)
class Shape:
    provider: str
    operation: str
    ask: Callable[[Get, str], Ask]  # (getter over the request JSON, path)
    look: Callable[[Any], Look]
    partial_content: Callable[[bytes], bool]  # output visible in an event cut short
    input_keys: tuple[str, ...]  # keys counting tokens, for text that does not parse
    output_keys: tuple[str, ...]
    finish_keys: tuple[str, ...]
    stream_kind: str = "sse"  # "sse" or "ndjson": when no Content-Type was seen
    finish_of: Callable[[str], str | None] = lambda v: v  # a finish reason found in text
    usage_headers: tuple[str, str] = ("", "")  # response headers counting (input, output)
    # where two APIs share a path (/generate: TGI's and SGLang's), the one the request speaks
    for_request: Callable[[Get], "Shape"] | None = None
    typed: bool = False  # stream events named by type, only the deltas bearing output (Write.delta_lines)

    def finishes(self, data: bytes) -> list[str]:
        """Finish reasons in JSON text that does not parse."""
        return [f for k in self.finish_keys for v in values(k, data)
                if isinstance(v, str) and (f := self.finish_of(v))]

    def glimpse(self, data: bytes) -> Look:
        """What an event seen only in part shows: output begun, a finish reason,
        the model (a typed stream's first event, too long for the peek, names it)."""
        return Look(content=self.partial_content(data), finish=tuple(self.finishes(data)),
                    model=_str(scan(("model",), data)))


def count(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < _MAX_TOKENS else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _some(v: Any) -> bool:
    return isinstance(v, (str, list, dict)) and len(v) > 0


def loads(data: bytes) -> Any:
    """The JSON value ``data`` is, or None; never raises (depth, huge numbers, bad UTF-8)."""
    if len(data) > MAX_JSON:
        return None
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None


def label(v: Any, cap: int = MAX_LABEL) -> str | None:
    """A string fit to export: printable characters only, stripped, capped."""
    if not isinstance(v, str):
        return None
    v = v[: cap * 4]
    if not v.isprintable():  # rare: the character by character filter only then
        v = "".join(c for c in v if c.isprintable())
    return v.strip()[:cap] or None


def labels(values) -> tuple[str, ...]:
    """Finish reasons fit to export, in order, each once."""
    out: list[str] = []
    for v in values:
        if (v := label(v)) and v not in out:
            out.append(v)
    return tuple(out)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except (ValueError, RecursionError):
        return False


@lru_cache(maxsize=64)
def key_path(path: tuple[str, ...]) -> re.Pattern:
    """``"a": {... "b": VALUE``: each key a member of its parent's object, before
    any object nested in that one (so a match cannot leave the object)."""
    keys = [_UNESCAPED_QUOTE + re.escape(k.encode()) + rb'"\s*:\s*' for k in path]
    return re.compile(rb"\{[^{}]{0,2048}?".join(keys) + _VALUE)


def scan(path: tuple[str, ...], head: bytes, tail: bytes = b"") -> Any:
    """A key path's value in JSON text that does not parse: the first match in
    ``head`` (a document's first bytes), else the last in ``tail`` (its last
    bytes). An object or an array comes back empty: only its presence is known."""
    rx = key_path(path)
    m = rx.search(head[:MAX_JSON])
    if m is None:
        m = next(reversed(list(rx.finditer(tail[-MAX_JSON:]))), None)
    if m is None:
        return None
    return {} if m[1] == b"{" else [] if m[1] == b"[" else loads(m[1])


def getter(data: bytes, head: bytes, tail: bytes) -> Get:
    """``get(*path)`` over a JSON object: ``data`` parsed, or where it does not
    parse, :func:`scan` of the document's first and last bytes."""
    obj = loads(data)
    if not isinstance(obj, dict):
        return lambda *path: scan(path, head, tail)

    def get(*path):
        v = obj
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        return v
    return get


def values(key: str, text: bytes) -> list[Any]:
    """Every value of ``key``, in order, in JSON text that does not parse."""
    return [loads(m[1]) for m in key_path((key,)).finditer(text[:MAX_JSON])]


def last_count(keys: tuple[str, ...], text: bytes) -> int | None:
    """The last count under the first of ``keys`` found, in text that does not parse."""
    for key in keys:
        found = [n for v in values(key, text) if (n := count(v)) is not None]
        if found:
            return found[-1]
    return None


def error_of(obj: Any, status: int | None) -> str | None:
    """An error body's type: OpenAI's ``error.type`` (else ``error.code``), vLLM's
    ``{"object": "error", "type": ...}``; for ``{"error": "message"}`` (TGI,
    Ollama) TGI's ``error_type`` if sent, else the HTTP status as a string
    (``"error"`` inside a 2xx stream). A message is never read."""
    if isinstance(obj, list) and obj:
        obj = obj[0]
    if not isinstance(obj, dict):
        return None
    resp = obj.get("response")
    err = obj.get("error")
    if err is None and isinstance(resp, dict) and isinstance(resp.get("error"), dict):
        err = resp["error"]  # a Responses stream's response.failed
    # vLLM's, OpenAI's, Anthropic's ({"type": "error", "error": {"type": ...}})
    if isinstance(err, dict) or obj.get("object") == "error":
        src = err if isinstance(err, dict) else obj
        kind = src.get("type") or src.get("code")
        return label(str(kind) if isinstance(kind, (str, int)) else None) or "error"
    if isinstance(err, str):
        return label(obj.get("error_type")) or (str(status) if (status or 0) >= 400 else "error")
    if obj.get("type") == "error":  # a Responses stream's error event: its code
        return label(str(obj.get("code") or "")) or "error"
    return None


def _visible(keys: bytes, *more: bytes) -> Callable[[bytes], bool]:
    """Whether an event shows output: a key among ``keys`` ("a|b") with a
    non-empty string value begun, or a match of one of ``more``. The compact
    form servers write ("content":"x) is looked for first, with bytes.find: a
    token's event costs a fifth of the regex's search, which decides the rest."""
    rx = re.compile(b"|".join((_key_str(keys), *more)))
    compact = tuple(b'"' + k + b'":"' for k in keys.split(b"|"))

    def visible(data: bytes) -> bool:
        for key in compact:
            i = data.find(key)
            after = i + len(key)
            if i >= 0 and (i == 0 or data[i - 1] != 0x5C) and data[after:after + 1] not in (b'"', b""):
                return True  # what the regex would match there: the quote is not escaped, the string not empty
        return rx.search(data) is not None
    return visible


def _key_str(keys: bytes) -> bytes:
    """A key among ``keys`` with a non-empty string value begun ("content":"x)."""
    return _UNESCAPED_QUOTE + rb'(?:' + keys + rb')"\s*:\s*"[^"]'


_TOOL_CALLS = _UNESCAPED_QUOTE + rb'tool_calls"\s*:\s*\[\s*\{'
_JSON_TYPES = ("json_object", "json_schema", "json")


# -- OpenAI: chat completions, completions, embeddings ---------------------------------

def _ask_openai(get: Get, path: str) -> Ask:
    limit = count(get("max_completion_tokens"))
    return Ask(max_tokens=limit if limit is not None else count(get("max_tokens")),
               stream=get("stream") is True,
               json=get("response_format", "type") in ("json_object", "json_schema"))


def _look_openai(obj: Any) -> Look:
    if not isinstance(obj, dict):
        return Look()
    content, texts, finish = False, [], []
    choices = obj.get("choices")
    for c in choices[:MAX_CHOICES] if isinstance(choices, list) else ():
        if not isinstance(c, dict):
            continue
        for part in (c.get("delta"), c.get("message")):
            if isinstance(part, dict):
                content = content or any(_some(part.get(k)) for k in (
                    "content", "reasoning_content", "reasoning", "refusal", "tool_calls",
                    "function_call"))
                if isinstance(part.get("content"), str):
                    texts.append(part["content"])
        if isinstance(c.get("text"), str):  # completions
            content = content or bool(c["text"])
            texts.append(c["text"])
        if isinstance(c.get("finish_reason"), str):
            finish.append(c["finish_reason"])
    data = obj.get("data")  # embeddings
    content = content or (isinstance(data, list) and len(data) > 0)
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Look(content=content, texts=tuple(texts), finish=tuple(finish),
                input_tokens=count(usage.get("prompt_tokens")),
                output_tokens=count(usage.get("completion_tokens")),
                model=_str(obj.get("model")), done=bool(finish))


def _openai(operation: str) -> Shape:
    return Shape(OPENAI, operation, _ask_openai, _look_openai,
                 _visible(rb"content|reasoning_content|reasoning|refusal|text", _TOOL_CALLS),
                 ("prompt_tokens",), ("completion_tokens",), ("finish_reason",))


# -- Hugging Face TGI: /generate, /generate_stream -------------------------------------

def _ask_tgi(get: Get, path: str) -> Ask:
    return Ask(max_tokens=count(get("parameters", "max_new_tokens")),
               stream=path.endswith("/generate_stream") or get("stream") is True,
               json=get("parameters", "grammar", "type") in _JSON_TYPES)


def _look_tgi(obj: Any) -> Look:
    if isinstance(obj, list) and obj:  # the Inference API's [{"generated_text": ...}]
        obj = obj[0]
    if not isinstance(obj, dict):
        return Look()
    generated = _str(obj.get("generated_text"))
    token = obj.get("token")
    if isinstance(token, dict):  # a stream event: one token, special ones are no output
        content = _some(token.get("text")) and token.get("special") is not True
    else:
        content = bool(generated)
    details = obj.get("details")
    if not isinstance(details, dict):
        return Look(content=content, texts=(generated,) if generated is not None else ())
    prefill = details.get("prefill")
    inputs = count(details.get("input_length"))  # newer TGI, in stream details
    if inputs is None and isinstance(prefill, list) and prefill:  # decoder_input_details
        inputs = len(prefill)
    reason = _str(details.get("finish_reason"))
    return Look(content=content, texts=(generated,) if generated is not None else (),
                finish=(reason,) if reason else (), input_tokens=inputs,
                output_tokens=count(details.get("generated_tokens")), done=True)


def _tgi_partial(data: bytes) -> bool:
    return (re.search(_key_str(rb"text"), data) is not None
            and re.search(rb'"special"\s*:\s*true', data) is None)


TGI_SHAPE = Shape(TGI, "text_completion", _ask_tgi, _look_tgi, _tgi_partial,
                  ("input_length",), ("generated_tokens",), ("finish_reason",),
                  usage_headers=("x-prompt-tokens", "x-generated-tokens"))


# -- Ollama: /api/chat, /api/generate, /api/embed(dings) -------------------------------

def _ask_ollama(get: Get, path: str) -> Ask:
    fmt = get("format")
    return Ask(max_tokens=count(get("options", "num_predict")),  # -1, -2: no limit
               stream=get("stream") is not False,  # Ollama streams unless told not to
               json=fmt == "json" or isinstance(fmt, dict))


def _look_ollama(obj: Any) -> Look:
    if not isinstance(obj, dict):
        return Look()
    msg = obj.get("message")
    msg = msg if isinstance(msg, dict) else {}
    answer = _str(msg.get("content"))
    if answer is None:
        answer = _str(obj.get("response"))
    content = (bool(answer) or any(_some(msg.get(k)) for k in ("thinking", "tool_calls"))
               or _some(obj.get("thinking"))
               or _some(obj.get("embeddings")) or _some(obj.get("embedding")))
    done = obj.get("done") is True
    reason = _str(obj.get("done_reason"))
    embed = "embeddings" in obj or "embedding" in obj
    return Look(content=content, texts=(answer,) if answer is not None else (),
                finish=(reason,) if reason else (),
                input_tokens=count(obj.get("prompt_eval_count")),
                output_tokens=None if embed else count(obj.get("eval_count")),
                model=_str(obj.get("model")), done=done or embed)


def _ollama(operation: str) -> Shape:
    return Shape(OLLAMA, operation, _ask_ollama, _look_ollama,
                 _visible(rb"content|response|thinking", _TOOL_CALLS),
                 ("prompt_eval_count",), ("eval_count",), ("done_reason",), "ndjson")


# -- llama.cpp server: /completion ------------------------------------------------------

def _ask_llama(get: Get, path: str) -> Ask:
    return Ask(max_tokens=count(get("n_predict")), stream=get("stream") is True,
               json=isinstance(get("json_schema"), dict)
               or get("response_format", "type") in _JSON_TYPES)


_LLAMA_STOP = {"eos": "stop", "word": "stop", "limit": "length", "none": None}


def _llama_finish(v: str) -> str | None:
    return _LLAMA_STOP.get(v, v)


def _look_llama(obj: Any) -> Look:
    if not isinstance(obj, dict):
        return Look()
    answer = _str(obj.get("content"))
    done = obj.get("stop") is True
    if not done:  # a stream event: running counts only, so none are read
        return Look(content=bool(answer), model=_str(obj.get("model")))
    reason = _str(obj.get("stop_type"))
    finish = _llama_finish(reason) if reason else None
    if finish is None:  # older servers: stopped_eos / stopped_word / stopped_limit flags
        finish = next((f for key, f in (("stopped_eos", "stop"), ("stopped_word", "stop"),
                                        ("stopped_limit", "length")) if obj.get(key) is True),
                      None)
    timings = obj.get("timings")
    timings = timings if isinstance(timings, dict) else {}
    inputs = count(obj.get("tokens_evaluated"))
    outputs = count(obj.get("tokens_predicted"))
    return Look(content=bool(answer), texts=(answer,) if answer is not None else (),
                finish=(finish,) if finish else (),
                input_tokens=inputs if inputs is not None else count(timings.get("prompt_n")),
                output_tokens=outputs if outputs is not None else count(timings.get("predicted_n")),
                model=_str(obj.get("model")), done=True)


LLAMA_SHAPE = Shape(LLAMA_CPP, "text_completion", _ask_llama, _look_llama,
                    _visible(rb"content"), ("tokens_evaluated", "prompt_n"),
                    ("tokens_predicted", "predicted_n"), ("stop_type",), finish_of=_llama_finish)


# -- OpenAI Responses: /v1/responses ----------------------------------------------------
# A stream is typed events: deltas carry output; response.created names the model and
# the last (completed, incomplete, failed) carries the whole response with its usage.
# Finish reasons in the chat vocabulary (the API has none): a completed response
# "stop" ("tool_calls" where it called one), an incomplete one its reason
# (max_output_tokens: "length"), a failed or cancelled one its status.

_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed",
                            "response.cancelled"})
_RESPONSE_REASONS = {"max_output_tokens": "length"}
# a status or a reason found in text that does not parse (a stream's last event, too long
# for the peek, read from the tail): what it says of the finish
_RESPONSE_TEXT = {**_RESPONSE_REASONS, "completed": "stop", "incomplete": None, "in_progress": None,
                  "queued": None}


def _ask_responses(get: Get, path: str) -> Ask:
    return Ask(max_tokens=count(get("max_output_tokens")), stream=get("stream") is True,
               json=get("text", "format", "type") in ("json_object", "json_schema"))


def _look_responses(obj: Any) -> Look:
    if not isinstance(obj, dict):
        return Look()
    kind = obj.get("type")
    if not isinstance(kind, str):  # a whole body: the response object
        return _look_response(obj, True)
    if kind.endswith(".delta"):  # text, reasoning, a tool call's arguments
        return Look(content=_some(obj.get("delta")))
    resp = obj.get("response")
    if not isinstance(resp, dict):
        return Look()
    look = _look_response(resp, False)  # its output repeats the deltas: no content of its own
    return look if kind in _RESPONSE_ENDS else Look(model=look.model)


def _look_response(resp: dict, content: bool) -> Look:
    output = resp.get("output")
    texts, has, tool = [], False, False
    for item in output[:MAX_CHOICES] if isinstance(output, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") if isinstance(item.get("content"), list) else ():
                if isinstance(part, dict):
                    text = part.get("text") if part.get("type") == "output_text" else part.get("refusal")
                    has = has or _some(text)
                    if isinstance(text, str) and part.get("type") == "output_text":
                        texts.append(text)
        elif item.get("type") is not None:  # reasoning, a function call, a tool's call
            has, tool = True, tool or item.get("type") == "function_call"
    status = resp.get("status")
    details = resp.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if status == "completed":
        finish = ("tool_calls",) if tool else ("stop",)
    elif status == "incomplete" and isinstance(reason, str):
        finish = (_RESPONSE_REASONS.get(reason, reason),)
    elif status in ("failed", "cancelled", "incomplete"):
        finish = (status,)
    else:
        finish = ()
    usage = resp.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return Look(content=content and has, texts=tuple(texts) if content else (), finish=finish,
                input_tokens=count(usage.get("input_tokens")), output_tokens=count(usage.get("output_tokens")),
                model=_str(resp.get("model")), done=bool(finish))


RESPONSES_SHAPE = Shape(OPENAI, "chat", _ask_responses, _look_responses, _visible(rb"delta"),
                        ("input_tokens",), ("output_tokens",), ("status", "reason"),
                        finish_of=lambda v: _RESPONSE_TEXT.get(v, v), typed=True)


# -- Anthropic Messages: /v1/messages -------------------------------------------------------
# A stream: message_start (the model, the input tokens), content block deltas (the output),
# message_delta (the stop reason, the output tokens), message_stop. Input tokens are the
# prompt's whole: those read from and written to the prompt cache are counted apart.

_CACHED = ("cache_read_input_tokens", "cache_creation_input_tokens")


def _ask_anthropic(get: Get, path: str) -> Ask:
    return Ask(max_tokens=count(get("max_tokens")), stream=get("stream") is True,
               json=get("output_format", "type") == "json_schema")


def _anthropic_usage(usage: Any) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    inputs = count(usage.get("input_tokens"))
    if inputs is not None:
        inputs += sum(count(usage.get(k)) or 0 for k in _CACHED)
    return inputs, count(usage.get("output_tokens"))


def _look_anthropic(obj: Any) -> Look:
    if not isinstance(obj, dict):
        return Look()
    kind = obj.get("type")
    if kind == "content_block_delta":
        delta = obj.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        return Look(content=any(_some(delta.get(k)) for k in ("text", "partial_json", "thinking")))
    if kind == "message_start":
        obj, kind = obj.get("message"), "start"
        if not isinstance(obj, dict):
            return Look()
    if kind == "message_delta":
        delta = obj.get("delta")
        reason = _str(delta.get("stop_reason")) if isinstance(delta, dict) else None
        inputs, outputs = _anthropic_usage(obj.get("usage"))
        return Look(finish=(reason,) if reason else (), input_tokens=inputs, output_tokens=outputs,
                    done=reason is not None)
    if kind == "message_stop":
        return Look(done=True)
    if kind not in ("message", "start"):
        return Look()
    texts, content = [], False
    blocks = obj.get("content")
    for b in blocks[:MAX_CHOICES] if isinstance(blocks, list) else ():
        if isinstance(b, dict):
            text = b.get("text")
            if isinstance(text, str):
                texts.append(text)
            content = content or _some(text) or b.get("type") in ("tool_use", "thinking", "server_tool_use")
    reason = _str(obj.get("stop_reason"))
    inputs, outputs = _anthropic_usage(obj.get("usage"))
    if kind == "start":  # its output count is a running one: the delta's is the count
        return Look(model=_str(obj.get("model")), input_tokens=inputs)
    return Look(content=content, texts=tuple(texts), finish=(reason,) if reason else (), input_tokens=inputs,
                output_tokens=outputs, model=_str(obj.get("model")), done=True)


ANTHROPIC_SHAPE = Shape(ANTHROPIC, "chat", _ask_anthropic, _look_anthropic,
                        _visible(rb"text|partial_json|thinking"), ("input_tokens",), ("output_tokens",),
                        ("stop_reason",), typed=True)


# -- SGLang's native API: /generate (TGI's path too) --------------------------------------

def _ask_sglang(get: Get, path: str) -> Ask:
    return Ask(max_tokens=count(get("sampling_params", "max_new_tokens")), stream=get("stream") is True,
               json=get("sampling_params", "json_schema") is not None)


def _look_sglang(obj: Any) -> Look:
    if isinstance(obj, list) and obj:  # a batch: its first
        obj = obj[0]
    if not isinstance(obj, dict):
        return Look()
    text = _str(obj.get("text"))
    meta = obj.get("meta_info")
    meta = meta if isinstance(meta, dict) else {}
    finish = meta.get("finish_reason")
    kind = _str(finish.get("type")) if isinstance(finish, dict) else None
    return Look(content=bool(text), texts=(text,) if text is not None else (), finish=(kind,) if kind else (),
                input_tokens=count(meta.get("prompt_tokens")),
                output_tokens=count(meta.get("completion_tokens")),
                done=kind is not None)


SGLANG_SHAPE = Shape(SGLANG, "text_completion", _ask_sglang, _look_sglang, _visible(rb"text"),
                     ("prompt_tokens",), ("completion_tokens",), ("type",))


def _generate(get: Get) -> Shape:
    """/generate is TGI's and SGLang's: SGLang's request has its prompt in
    "text" (or "input_ids") and its limits in "sampling_params", TGI's in
    "inputs" and "parameters"."""
    if get("inputs") is None and any(get(k) is not None for k in ("text", "input_ids", "sampling_params")):
        return SGLANG_SHAPE
    return TGI_SHAPE


# Longest suffix first: /v1/completions is OpenAI's, /completions llama.cpp's.
ENDPOINTS: tuple[tuple[str, Shape], ...] = tuple(sorted((
    ("/v1/chat/completions", _openai("chat")),
    ("/v1/completions", _openai("text_completion")),
    ("/v1/embeddings", _openai("embeddings")),
    ("/v1/responses", RESPONSES_SHAPE),
    ("/v1/messages", ANTHROPIC_SHAPE),
    ("/generate", replace(TGI_SHAPE, for_request=_generate)),
    ("/generate_stream", TGI_SHAPE),
    ("/api/chat", _ollama("chat")),
    ("/api/generate", _ollama("text_completion")),
    ("/api/embed", _ollama("embeddings")),
    ("/api/embeddings", _ollama("embeddings")),
    ("/completion", LLAMA_SHAPE),
    ("/completions", LLAMA_SHAPE),
), key=lambda e: -len(e[0])))


def shape_of(path: str | None) -> Shape | None:
    """The endpoint family a request path names, by suffix, so that a gateway's
    prefix (``/openai/v1/chat/completions``) does not hide it."""
    p = (path or "").rstrip("/")
    return next((shape for suffix, shape in ENDPOINTS if p.endswith(suffix)), None)
