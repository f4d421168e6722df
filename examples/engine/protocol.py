"""The OpenAI wire format: request validation and response/chunk bodies.

Validation raises APIError, which renders as OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .tokenizer import chat_prompt

MAX_TOKENS_LIMIT = 128
DEFAULT_MAX_TOKENS = 16
CHAT_ROLES = ("system", "developer", "user", "assistant")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error"):  # noqa: A002
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenRequest:
    chat: bool
    prompt: str  # the text to tokenize (chat: the templated conversation)
    model: str
    max_tokens: int
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool


def _bad(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _opt(body: dict, name: str, kinds: tuple, what: str, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise _bad(f"'{name}' must be {what}, got {type(value).__name__}", name, "invalid_type")
    return value


def _content(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise _bad(f"'{where}' must be a string or a list of text parts", where, "invalid_type")


def parse(body, chat: bool, default_model: str) -> GenRequest:
    """Validate a /v1/completions (chat=False) or /v1/chat/completions body."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_type")
    if chat:
        messages = body.get("messages")
        if messages is None:
            raise _bad("missing required parameter: 'messages'", "messages", "missing_required_parameter")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty array", "messages", "invalid_type")
        turns = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _bad(f"'messages[{i}]' must be an object", f"messages[{i}]", "invalid_type")
            if m.get("role") not in CHAT_ROLES:
                raise _bad(f"'messages[{i}].role' must be one of {', '.join(CHAT_ROLES)}", f"messages[{i}].role")
            turns.append((m["role"], _content(m.get("content"), f"messages[{i}].content")))
        prompt = chat_prompt(turns)
    else:
        if "prompt" not in body:
            raise _bad("missing required parameter: 'prompt'", "prompt", "missing_required_parameter")
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("'prompt' must be a string (or an array of one string)", "prompt", "invalid_type")
    max_tokens = _opt(body, "max_tokens", (int,), "an integer", None)
    if max_tokens is None and chat:
        max_tokens = _opt(body, "max_completion_tokens", (int,), "an integer", None)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise _bad(f"'max_tokens' must be 1..{MAX_TOKENS_LIMIT}, got {max_tokens}", "max_tokens")
    temperature = float(_opt(body, "temperature", (int, float), "a number", 1.0))
    if not 0 <= temperature <= 2:
        raise _bad(f"'temperature' must be 0..2, got {temperature}", "temperature")
    if _opt(body, "n", (int,), "an integer", 1) != 1:
        raise _bad("only n=1 is supported", "n")
    options = _opt(body, "stream_options", (dict,), "an object", {})
    return GenRequest(
        chat=chat, prompt=prompt,
        model=_opt(body, "model", (str,), "a string", default_model),
        max_tokens=max_tokens, temperature=temperature,
        seed=_opt(body, "seed", (int,), "an integer", None),
        stream=_opt(body, "stream", (bool,), "a boolean", False),
        include_usage=bool(options.get("include_usage", False)),
    )


def check_length(prompt_tokens: int, max_tokens: int, context: int) -> None:
    if prompt_tokens + max_tokens > context:
        raise APIError(400, f"this model's context is {context} tokens; the prompt has {prompt_tokens} "
                       f"and max_tokens asks for {max_tokens} more", param="max_tokens",
                       code="context_length_exceeded")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Responses:
    """Builds the bodies of one request's response, whole or as stream chunks."""

    def __init__(self, req: GenRequest, request_id: int):
        self.req = req
        self.id = f"{'chatcmpl' if req.chat else 'cmpl'}-{request_id}"
        self.created = int(time.time())

    def _base(self, object_: str) -> dict:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.req.model}

    def whole(self, text: str, finish_reason: str, usage_: dict) -> dict:
        if self.req.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage_}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage_}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False) -> dict:
        if self.req.chat:
            delta = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._base("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage_: dict) -> dict:
        object_ = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {**self._base(object_), "choices": [], "usage": usage_}
