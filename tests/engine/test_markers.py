"""What the engine tells sitsprobe.markers, recorded by patching the marker functions
(the engine looks them up on the module at each call)."""
from __future__ import annotations

import http.client
import json
import threading
import time
from contextlib import contextmanager

import pytest

from sitsprobe import markers


@pytest.fixture
def recorded(monkeypatch):
    events, lock = [], threading.Lock()

    def note(*event):
        with lock:
            events.append(event)

    @contextmanager
    def request(request_id, sock_fd, model=""):
        note("request-begin", request_id, sock_fd, model)
        yield
        note("request-end", request_id)

    @contextmanager
    def range_(name, request_id=0, batch_id=0, request_ids=()):
        note("begin", name, request_id, batch_id, tuple(request_ids))
        yield
        note("end", name, request_id, batch_id)

    monkeypatch.setattr(markers, "request", request)
    monkeypatch.setattr(markers, "range", range_)
    monkeypatch.setattr(markers, "cache_get", lambda cache, key, hit, request_id=0:
                        note("cache_get", cache, key, hit, request_id))
    monkeypatch.setattr(markers, "usage", lambda request_id, input_tokens=0, output_tokens=0, kv_bytes=0:
                        note("usage", request_id, input_tokens, output_tokens, kv_bytes))
    return events


def wait_for(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_is_one_marked_request(recorded, server, model, stream):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    prompt = "<|system|>A prompt long enough to have a block or two for the prefix cache.\n"
    status, data = post(conn, "/v1/completions", {"prompt": prompt, "max_tokens": 5, "temperature": 0,
                                                  "stream": stream})
    conn.close()
    assert status == 200
    wait_for(lambda: recorded[-1][0] == "request-end")  # the handler may still be returning
    begin, *inner, end = recorded
    assert begin[0] == "request-begin" and end == ("request-end", begin[1])
    rid, fd, name = begin[1:]
    assert rid >= 1 and fd > 2 and name == "sitsprobe-tiny-gpt"
    names = [e[1] for e in inner if e[0] == "begin"]
    assert names[:3] == ["tokenize", "queue", "prefill"] and "decode" in names and "detokenize" in names
    decodes = [e for e in inner if e[:2] == ("begin", "decode")]
    assert decodes and all(e[4] == (rid,) for e in decodes)
    assert [e[3] for e in decodes] == sorted({e[3] for e in decodes})  # increasing step ids
    assert sum(1 for e in inner if e[0] == "begin") == sum(1 for e in inner if e[0] == "end")
    (cache,) = [e for e in inner if e[0] == "cache_get"]
    assert cache[1] == "prefix" and cache[3] is False and cache[4] == rid and len(cache[2]) == 16
    (usage,) = [e for e in inner if e[0] == "usage"]
    prompt_tokens = len(prompt.encode()) + 1
    output = usage[3]
    assert usage[:3] == ("usage", rid, prompt_tokens) and 0 <= output <= 5
    assert usage[4] == (prompt_tokens + output - (output == 5)) * model.new_kv(1).bytes_per_token
    assert inner.index(usage) > max(i for i, e in enumerate(inner) if e[:2] == ("end", "detokenize"))


def test_a_bad_request_is_marked_too(recorded, server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    status, _ = post(conn, "/v1/chat/completions", {"messages": "not a list"})
    status404, _ = post(conn, "/v1/nothing", {})
    conn.close()
    assert (status, status404) == (400, 404)
    wait_for(lambda: recorded[-1][0] == "request-end")
    assert [e[0] for e in recorded] == ["request-begin", "request-end"]  # the 404 is no completion
