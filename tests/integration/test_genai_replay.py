"""Issue 11: recorded streams in the shapes of vLLM, SGLang, TGI, Ollama, llama.cpp and Anthropic
(written from their API docs into tests/fixtures/genai) replayed through a
real server (uvicorn + Starlette, one event per write, as those servers
write them) to a real client over loopback. The spans' gen_ai.* attributes
must be what the recorded answers hold (the unit tests' table of them), also
when every answer comes in 7-byte writes or with invalid UTF-8 in its text;
answers cut off halfway and hostile requests never crash the agent, and no
prompt or answer text reaches a span.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..unit.test_genai import AS_WRITTEN, FIXTURES, INDEX
from .conftest import Owned, running_agent, wait_until

HERE = Path(__file__).resolve().parent


class Replay(Owned):
    def __init__(self, gap_ms: float = 2.0, layout: str = "events", server: str = "uvicorn",
                 tls: tuple[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "genai_replay.py"), "--port", "0", "--gap-ms", str(gap_ms),
             "--host", "127.0.0.1", "--layout", layout, "--server", server, *(("--tls", *tls) if tls else ())],
            stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().split()[1])
        assert self.proc.stdout.readline().strip() == "ready"


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        try:
            return r.status, r.read()
        except http.client.IncompleteRead as e:  # --layout truncated
            return r.status, e.partial
    finally:
        c.close()


def request_for(name: str) -> bytes:
    """The fixture's request; for an error fixture, as the replay server is asked for it."""
    body = json.loads((FIXTURES / f"{name}.request.json").read_bytes())
    if INDEX[name].get("error"):
        body["inputs" if "inputs" in body else "model"] = "error"
    return json.dumps(body).encode()


ATTRIBUTE = {  # GenAI field -> the span attribute it is exported as
    "operation": "gen_ai.operation.name", "provider": "gen_ai.provider.name",
    "request_model": "gen_ai.request.model", "response_model": "gen_ai.response.model",
    "max_tokens": "gen_ai.request.max_tokens", "finish_reasons": "gen_ai.response.finish_reasons",
    "input_tokens": "gen_ai.usage.input_tokens", "output_tokens": "gen_ai.usage.output_tokens",
    "usage_source": "sitsprobe.genai.usage_source", "error_type": "error.type",
    "events": "sitsprobe.genai.stream_events", "content_events": "sitsprobe.genai.content_events",
    "answer_empty": "sitsprobe.genai.answer_empty", "json_valid": "sitsprobe.genai.json_valid",
}


def expected(name: str) -> dict:
    """What the recorded answer holds, as tests/unit/test_genai.py's table says it
    (written from each server's API docs), timing aside: as span attributes."""
    want = AS_WRITTEN[name]
    return {attr: list(want[f]) if f == "finish_reasons" else want[f]
            for f, attr in ATTRIBUTE.items() if f in want}


def test_recorded_servers_replayed_come_out_as_recorded(tmp_path):
    """Each layout its own replay server, one agent tracing the three."""
    (tmp_path / "agent").mkdir()
    layouts = ("events", "split", "mangled")
    with contextlib.ExitStack() as owned:
        servers = {layout: owned.enter_context(Replay(layout=layout)) for layout in layouts}
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [s.proc.pid for s in servers.values()], "cmdline": []}, {}, {}))
        names = sorted(INDEX)
        spans = {}
        for layout, server in servers.items():
            wait_until(lambda: agent.tracks(server.proc.pid), 15, f"the agent to track the {layout} server")
            for name in names:
                status, _ = post(server.port, INDEX[name]["path"], request_for(name))
                assert status < 500 or INDEX[name].get("error"), (layout, name)  # Anthropic's overload: 529
            spans[layout] = sorted(agent.traces.wait_for_port(server.port, len(names), timeout=30),
                                   key=lambda s: int(s["startTimeUnixNano"]))
    wrong = []
    for layout in layouts:
        for name, span in zip(names, spans[layout]):
            want = expected(name)
            if layout == "mangled":  # an answer asked for as JSON is no longer JSON
                want.pop("sitsprobe.genai.json_valid", None)
            got = {k: span["attrs"].get(k) for k in want}
            if got != want:
                wrong.append(f"{layout} {name}: {got} != {want}")
            if INDEX[name]["stream"] and "gen_ai.server.time_to_first_token" not in span["attrs"]:
                wrong.append(f"{layout} {name}: a stream with no time to first token")
    assert not wrong, "\n".join(wrong)
    # the fixtures' answers say SECRET-ANSWER
    assert "SECRET" not in json.dumps([s["attrs"] for layout in layouts for s in spans[layout]])


def test_answers_cut_off_halfway_neither_crash_the_agent_nor_leak_text(tmp_path):
    (tmp_path / "agent").mkdir()
    capture = {"capture": {"write_peek_bytes": 1024}}  # TGI's head is 450 bytes: its Content-Length, read
    with Replay(layout="truncated") as server, running_agent(
            tmp_path / "agent", {"pids": [server.proc.pid], "cmdline": []}, {}, capture) as agent:
        wait_until(lambda: agent.tracks(server.proc.pid), 15, "the agent to track the replay server")
        names = sorted(INDEX)
        for name in names:
            post(server.port, INDEX[name]["path"], request_for(name))
        spans = agent.traces.wait_for_port(server.port, len(names), timeout=30)
        assert agent.alive()
    assert len(spans) == len(names)
    for name, span in zip(names, sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))):
        a = span["attrs"]
        assert a.get("gen_ai.request.model") == expected(name).get("gen_ai.request.model"), name
        assert (a["sitsprobe.complete"], a.get("sitsprobe.partial")) == (False, "response_cut_off"), (name, a)
    assert "SECRET" not in json.dumps([s["attrs"] for s in spans])  # the fixtures' answers say SECRET-ANSWER



def padded(model: str, before: int, after: int) -> bytes:
    """A streamed chat request whose model sits `before` bytes into its body and
    `after` bytes before its end, text around it."""
    head = '{"messages": [{"role": "user", "content": "' + "p" * before + '"}], "model": '
    return (head + json.dumps(model) + ', "stream": true, "stop": ["' + "s" * after + '"]}').encode()


def test_what_the_kernel_copies_is_bounded_by_the_config(tmp_path):
    """capture.body_bytes and max_writes reach the kernel: a model 2 kB into the
    body is read with body_bytes 4096 (past the default's 512), one 5 kB in and
    5 kB before the end is past every byte kept and so not known (never
    guessed); a stream longer than max_writes has its later events counted,
    not timed."""
    (tmp_path / "agent").mkdir()
    capture = {"capture": {"body_bytes": 4096, "max_writes": 3}}
    with Replay() as server, running_agent(tmp_path / "agent", {"pids": [server.proc.pid], "cmdline": []},
                                           {}, capture) as agent:
        wait_until(lambda: agent.tracks(server.proc.pid), 15, "the agent to track the replay server")
        for body in (padded("near-model", 2000, 2000), padded("far-model", 5000, 5000)):
            assert post(server.port, "/v1/chat/completions", body)[0] == 200
        near, far = sorted((s["attrs"] for s in agent.traces.wait_for_port(server.port, 2)),
                           key=lambda a: a["http.request.size"])
    assert near["gen_ai.request.model"] == "near-model" and "gen_ai.request.model" not in far, (near, far)
    for a in (near, far):  # vllm_chat_stream: 6 events in 7 writes, those past the third counted, not timed
        assert a["gen_ai.response.model"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert a["sitsprobe.genai.events_approximate"] is True, a
        assert "gen_ai.server.time_to_first_token" in a, a

HOSTILE = [
    b'{"model": "SECRET-PROMPT' + b"\\u0000" * 50 + b'", "messages": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
    b'{"model": 1e999999, "max_tokens": 99999999999999999999999999999, "messages": []}',
    b"\xff\xfe SECRET-PROMPT \x00\x01\x02" * 300,
    b'{"messages":[{"role":"user","content":"SECRET-PROMPT \\"model\\": \\"injected\\""}],"stream":true,'
    b'"model":"' + b"m" * 5000 + b'"}',
    b'data: {"choices":[{"delta":{"content":"SECRET-PROMPT"}}]}\n\n' * 40,
]


def test_hostile_requests_neither_crash_the_agent_nor_leak_text(tmp_path):
    (tmp_path / "agent").mkdir()
    with Replay() as server, running_agent(tmp_path / "agent", {"pids": [server.proc.pid], "cmdline": []},
                                           {}, {}) as agent:
        wait_until(lambda: agent.tracks(server.proc.pid), 15, "the agent to track the replay server")
        paths = ["/v1/chat/completions", "/generate_stream", "/api/chat", "/completion"]
        for i, body in enumerate(HOSTILE * 2):
            post(server.port, paths[i % len(paths)], body)
        spans = agent.traces.wait_for_port(server.port, len(HOSTILE) * 2, timeout=30)
        assert agent.alive()
    text = json.dumps([s["attrs"] for s in spans])
    assert "SECRET" not in text and "injected" not in text
    assert all(len(s["attrs"].get("gen_ai.request.model", "")) <= 256 for s in spans)



def post_first_byte_alone(port: int, path: str, body: bytes) -> bytes:
    """A POST whose first byte goes alone, then the rest (as Go's servers read a
    kept-alive connection's next request); the answer, to the server's close."""
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request[:1])
        time.sleep(0.05)  # the server's read returns that byte alone
        s.sendall(request[1:])
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_a_request_read_a_byte_first_keeps_its_meaning(tmp_path):
    """Ollama's recorded answers, each request's head read in two pieces: the
    spans' gen_ai.* attributes are what the answers hold, as when it is read
    whole (the kernel decides what of a POST to keep from its head)."""
    (tmp_path / "agent").mkdir()
    names = sorted(n for n in INDEX if n.startswith("ollama_"))
    with contextlib.ExitStack() as owned:
        server = owned.enter_context(Replay())
        agent = owned.enter_context(running_agent(tmp_path / "agent", {"pids": [server.proc.pid], "cmdline": []},
                                                  {}, {}))
        wait_until(lambda: agent.tracks(server.proc.pid), 15, "the agent to track the replay server")
        for name in names:
            answer = post_first_byte_alone(server.port, INDEX[name]["path"], request_for(name))
            assert answer.startswith(b"HTTP/1.1 "), (name, answer[:200])
        spans = sorted(agent.traces.wait_for_port(server.port, len(names), timeout=30),
                       key=lambda s: int(s["startTimeUnixNano"]))
    assert len(spans) == len(names)
    wrong = []
    for name, span in zip(names, spans):
        want = expected(name)
        got = {k: span["attrs"].get(k) for k in want}
        if got != want:
            wrong.append(f"{name}: {got} != {want}")
    assert not wrong, "\n".join(wrong)


def test_the_anthropic_client_over_http1_and_http2_receives_what_the_spans_say(tmp_path):
    """The official anthropic client (Messages API: a message, a stream, an
    overloaded error) against the recorded answers, served by uvicorn and, over
    h2c, by hypercorn: each span's usage, stop reason, model and stream events
    are what the client received."""
    anthropic = pytest.importorskip("anthropic")

    (tmp_path / "agent").mkdir()
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 256, "messages": [{"role": "user", "content": "SECRET-PROMPT"}]}
    with contextlib.ExitStack() as owned:
        servers = {"uvicorn": owned.enter_context(Replay()),
                   "hypercorn": owned.enter_context(Replay(server="hypercorn"))}
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [s.proc.pid for s in servers.values()], "cmdline": []}, {}, {}))
        for name, server in servers.items():
            wait_until(lambda: agent.tracks(server.proc.pid), 15, f"the agent to track {name}")
            http = owned.enter_context(anthropic.DefaultHttpxClient(http1=name == "uvicorn", http2=name == "hypercorn"))
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="none",
                                         max_retries=0, http_client=http)
            m = client.messages.create(**ask)
            u = m.usage
            told = [(u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens, u.output_tokens,
                     m.model, [m.stop_reason], None)]
            events = list(client.messages.create(**ask, stream=True))
            start = next(e.message for e in events if e.type == "message_start")
            end = next(e for e in events if e.type == "message_delta")
            told.append((start.usage.input_tokens, end.usage.output_tokens, start.model, [end.delta.stop_reason],
                         sum(1 for e in events if e.type == "content_block_delta" and e.delta.text)))
            with pytest.raises(anthropic.APIStatusError) as refused:
                client.messages.create(**{**ask, "model": "error"})
            spans = sorted(agent.traces.wait_for_port(server.port, 3, timeout=20),
                           key=lambda s: int(s["startTimeUnixNano"]))
            said = [(a.get("gen_ai.usage.input_tokens"), a.get("gen_ai.usage.output_tokens"),
                     a.get("gen_ai.response.model"), a.get("gen_ai.response.finish_reasons"),
                     a.get("sitsprobe.genai.content_events")) for a in (s["attrs"] for s in spans[:2])]
            assert said == told, name
            a = spans[2]["attrs"]
            assert (a["error.type"], a["http.response.status_code"]) == (
                refused.value.body["error"]["type"], refused.value.status_code), name
            assert {s["attrs"]["gen_ai.provider.name"] for s in spans} == {"anthropic"}
            assert {s["attrs"]["network.protocol.version"] for s in spans} == {"1.1" if name == "uvicorn" else "2"}
