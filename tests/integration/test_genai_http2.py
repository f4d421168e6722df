"""GenAI over HTTP/2: the recorded answers of vLLM, SGLang, TGI, Ollama, llama.cpp, Anthropic
(tests/fixtures/genai) served over h2c by two servers no one here wrote,
hypercorn (Python, the h2 library) and granian (Rust, hyper's h2), to two
clients no one here wrote, httpx (HTTP/2 with prior knowledge, as the
official `openai` client runs on it) and curl (nghttp2). The spans' gen_ai.*
attributes must be what the recorded answers hold, as over HTTP/1.1
(tests/integration/test_genai_replay.py); and a streamed chat the `openai`
client reads over HTTP/2 must say what that client received.
"""
from __future__ import annotations

import contextlib
import json
import subprocess

import pytest

from ..unit.test_genai import INDEX
from .conftest import running_agent, wait_until
from .test_genai_replay import Replay, expected, request_for
from .test_tls import certificate  # noqa: F401 (a fixture)

httpx = pytest.importorskip("httpx")
pytest.importorskip("h2")
pytest.importorskip("hypercorn")
pytest.importorskip("granian")
SERVERS = ("hypercorn", "granian")


def post_httpx(client, port: int, path: str, body: bytes) -> int:
    r = client.post(f"http://127.0.0.1:{port}{path}", content=body,
                    headers={"content-type": "application/json"})
    assert r.http_version == "HTTP/2"
    return r.status_code


def post_curl(port: int, path: str, body: bytes) -> int:
    out = subprocess.run(
        ["curl", "-sS", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
         "-H", "content-type: application/json", "--data-binary", "@-", f"http://127.0.0.1:{port}{path}"],
        input=body, capture_output=True, timeout=10, check=True).stdout.decode()
    version, code = out.split()
    assert version == "2", out
    return int(code)


def test_recorded_servers_over_http2_come_out_as_recorded(tmp_path):
    """Every fixture, to each server, from each client: one agent tracing both servers."""
    (tmp_path / "agent").mkdir()
    names = sorted(INDEX)
    with contextlib.ExitStack() as owned:
        servers = {name: owned.enter_context(Replay(server=name)) for name in SERVERS}
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [s.proc.pid for s in servers.values()], "cmdline": []}, {}, {}))
        client = owned.enter_context(httpx.Client(http1=False, http2=True, timeout=10))
        spans = {}
        for server, replay in servers.items():
            wait_until(lambda: agent.tracks(replay.proc.pid), 15, f"the agent to track {server}")
            for name in names:  # httpx keeps one connection: every stream after the first
                status = post_httpx(client, replay.port, INDEX[name]["path"], request_for(name))
                assert status < 500 or INDEX[name].get("error"), (server, name)  # rides on HPACK's dynamic table
            for name in names:  # curl: a connection each
                status = post_curl(replay.port, INDEX[name]["path"], request_for(name))
                assert status < 500 or INDEX[name].get("error"), (server, name)
            got = agent.traces.wait_for_port(replay.port, 2 * len(names), timeout=30)
            spans[server] = sorted(got, key=lambda s: int(s["startTimeUnixNano"]))
    wrong = []
    for server in SERVERS:
        assert len(spans[server]) == 2 * len(names), server
        for client, (name, span) in zip(["httpx"] * len(names) + ["curl"] * len(names),
                                        zip(names * 2, spans[server])):
            a = span["attrs"]
            want = expected(name)
            got = {k: a.get(k) for k in want}
            if got != want:
                wrong.append(f"{server} {client} {name}: {got} != {want}")
            if a.get("network.protocol.version") != "2" or a.get("url.path") != INDEX[name]["path"]:
                wrong.append(f"{server} {client} {name}: not the HTTP/2 stream to its path: {a}")
            if INDEX[name]["stream"] and "gen_ai.server.time_to_first_token" not in a:
                wrong.append(f"{server} {client} {name}: a stream with no time to first token")
    assert not wrong, "\n".join(wrong)
    assert "SECRET" not in json.dumps([s["attrs"] for v in spans.values() for s in v])


def test_a_chat_the_openai_client_streams_over_http2_says_what_it_received(tmp_path, certificate):
    """The official client on httpx's HTTP/2, to each h2c server and to hypercorn
    over TLS (h2 by ALPN, read through the libssl uprobes)."""
    openai = pytest.importorskip("openai")
    (tmp_path / "agent").mkdir()
    with contextlib.ExitStack() as owned:
        servers = {name: owned.enter_context(Replay(server=name, gap_ms=5)) for name in SERVERS}
        servers["hypercorn over TLS"] = owned.enter_context(Replay(server="hypercorn", gap_ms=5, tls=certificate))
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [s.proc.pid for s in servers.values()], "cmdline": []}, {}, {}))
        for server, replay in servers.items():
            tls = server.endswith("TLS")
            wait_until(lambda: agent.tracks(replay.proc.pid), 15, f"the agent to track {server}")
            if tls:
                wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=replay.proc.pid) == 1, 10,
                           "the agent to hook hypercorn's libssl")
            http = owned.enter_context(httpx.Client(http1=False, http2=True, verify=False))
            scheme = "https" if tls else "http"
            chat = openai.OpenAI(base_url=f"{scheme}://127.0.0.1:{replay.port}/v1", api_key="none",
                                 max_retries=0, http_client=http).chat.completions.create
            chunks = content = 0
            for ch in chat(model="meta-llama/Llama-3.1-8B-Instruct", stream=True,
                           messages=[{"role": "user", "content": "SECRET-PROMPT"}],
                           stream_options={"include_usage": True}):
                chunks += 1
                content += bool(ch.choices and ch.choices[0].delta.content)
                model, usage = ch.model, ch.usage or None
            (span,) = agent.traces.wait_for_port(replay.port, 1, timeout=20)
            a = span["attrs"]
            assert (a["sitsprobe.genai.stream_events"], a["sitsprobe.genai.content_events"],
                    a["gen_ai.response.model"], a["gen_ai.usage.input_tokens"],
                    a["gen_ai.usage.output_tokens"]) == (
                chunks, content, model, usage.prompt_tokens, usage.completion_tokens), (server, a)
            assert (a["network.protocol.version"], a["url.scheme"]) == ("2", scheme), (server, a)
            assert a["gen_ai.request.model"] == model and a["gen_ai.server.time_to_first_token"] > 0
