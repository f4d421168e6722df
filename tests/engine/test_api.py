"""The HTTP API of a real engine subprocess, through the official openai client and raw HTTP."""
from __future__ import annotations

import http.client
import json

import openai
import pytest

MODEL = "sitsprobe-tiny-gpt"


@pytest.fixture(scope="module")
def client(engine):
    with openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0, timeout=30) as c:
        yield c


def test_completions_whole_and_streamed(client):
    prompt = "The engine answers the official client: "
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert whole.object == "text_completion" and whole.model == MODEL
    choice = whole.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens == len(prompt) + 1  # bytes + BOS
    assert 1 <= whole.usage.completion_tokens <= 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_whole_and_streamed(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    whole = client.chat.completions.create(model="any-name-echoed", messages=messages, max_tokens=10,
                                           temperature=0)
    assert whole.object == "chat.completion" and whole.model == "any-name-echoed"
    message = whole.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert whole.usage.prompt_tokens == len("<|system|>Be brief.\n<|user|>Hello?\n<|assistant|>") + 1
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_seeded_sampling_over_http(client):
    def ask(seed):
        return client.completions.create(model=MODEL, prompt="sample", max_tokens=16, temperature=1.0,
                                         seed=seed).choices[0].text

    assert ask(3) == ask(3)


def test_health_models_and_stats(engine):
    assert engine.get("/health") == {"status": "ok"}
    assert [m["id"] for m in engine.get("/v1/models")["data"]] == [MODEL]
    stats = engine.get("/v1/engine/stats")
    assert stats["model"] == MODEL and stats["device"] == "cpu"
    assert {"hits", "misses", "entries", "bytes"} <= stats["prefix_cache"].keys()
    assert stats["batching"]["max_window_ms"] == 5 and stats["completion_cache"] is None


BAD = [
    # (method, path, raw body, status, param, code)
    ("POST", "/v1/completions", b"{not json", 400, None, "invalid_json"),
    ("POST", "/v1/completions", b"", 400, None, "invalid_json"),
    ("POST", "/v1/completions", b"[1, 2]", 400, None, "invalid_type"),
    ("POST", "/v1/completions", b'{"max_tokens": 4}', 400, "prompt", "missing_required_parameter"),
    ("POST", "/v1/completions", b'{"prompt": 42}', 400, "prompt", "invalid_type"),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": "4"}', 400, "max_tokens", "invalid_type"),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": true}', 400, "max_tokens", "invalid_type"),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 129}', 400, "max_tokens", "invalid_value"),
    ("POST", "/v1/completions", b'{"prompt": "x", "temperature": -1}', 400, "temperature", "invalid_value"),
    ("POST", "/v1/completions", b'{"prompt": "x", "stream": "yes"}', 400, "stream", "invalid_type"),
    ("POST", "/v1/completions", b'{"prompt": "x", "n": 2}', 400, "n", "invalid_value"),
    ("POST", "/v1/completions", json.dumps({"prompt": "x" * 500, "max_tokens": 100}).encode(), 400,
     "max_tokens", "context_length_exceeded"),
    ("POST", "/v1/chat/completions", b'{"prompt": "x"}', 400, "messages", "missing_required_parameter"),
    ("POST", "/v1/chat/completions", b'{"messages": []}', 400, "messages", "invalid_type"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400,
     "messages[0].role", "invalid_value"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', 400,
     "messages[0].content", "invalid_type"),
    ("GET", "/v1/completions", None, 405, None, "method_not_allowed"),
    ("POST", "/v1/nowhere", b"{}", 404, None, "unknown_url"),
    ("GET", "/nowhere", None, 404, None, "unknown_url"),
]


@pytest.mark.parametrize("method,path,body,status,param,code", BAD, ids=[f"{b[0]} {b[1]} {b[4]} {b[5]}" for b in BAD])
def test_bad_requests_get_json_errors(engine, method, path, body, status, param, code):
    conn = http.client.HTTPConnection(engine.host, engine.port, timeout=10)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == status and resp.getheader("Content-Type") == "application/json"
    error = json.loads(resp.read())["error"]
    assert error.keys() == {"message", "type", "param", "code"}
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert error["message"] and "Traceback" not in error["message"]
    conn.request("GET", "/health")  # the connection stays usable after the error
    assert conn.getresponse().read() == b'{"status": "ok"}'
    conn.close()


def test_a_malformed_request_line_gets_a_json_error(engine):
    import socket

    with socket.create_connection((engine.host, engine.port), timeout=10) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        data = s.makefile("rb").read()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") or head.startswith(b"HTTP/1.0 400")
    assert json.loads(body)["error"]["code"] == "bad_request"
