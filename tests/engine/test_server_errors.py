"""Failures inside the engine: a JSON 500 for the client, and the engine keeps serving."""
from __future__ import annotations

import http.client
import json
import socket
import time

from examples.engine.model import GPT
from examples.engine.tokenizer import EOS, encode


def post(server, body: dict):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_an_engine_failure_is_a_500_json_error(server, monkeypatch, capsys):
    def broken(self, tokens, kvs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(GPT, "extend", broken)
    status, data = post(server, {"prompt": "boom", "max_tokens": 4})
    assert status == 500
    error = json.loads(data)["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_error"
    assert "Traceback" not in error["message"]
    assert "simulated kernel failure" in capsys.readouterr().err  # the traceback goes to the log
    monkeypatch.undo()
    status, data = post(server, {"prompt": "fine again", "max_tokens": 4, "temperature": 0})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] >= 1


def test_a_handler_bug_is_a_500_json_error(server, monkeypatch):
    monkeypatch.setattr(type(server.engine), "stats", lambda self: 1 / 0)
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    conn.request("GET", "/v1/engine/stats")
    resp = conn.getresponse()
    assert resp.status == 500 and json.loads(resp.read())["error"]["code"] == "internal_error"


def test_a_client_gone_mid_stream_cancels_its_decoding(server, model):
    prompt = "hang up on me"
    assert len(model.generate_greedy(encode(prompt), 128, EOS)) == 128  # no early EOS to end it anyway
    body = json.dumps({"prompt": prompt, "max_tokens": 128, "temperature": 0, "stream": True}).encode()
    with socket.create_connection(server.server_address[:2], timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert s.recv(64).startswith(b"HTTP/1.1 200")
    scheduler = server.engine.scheduler
    deadline = time.monotonic() + 10
    while scheduler.completed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = scheduler.stats()
    assert (stats["requests_completed"], stats["requests_cancelled"], stats["active"]) == (1, 1, 0)
    assert stats["tokens_generated"] < 128
