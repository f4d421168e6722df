"""GenAI calls a traced process makes: a gateway's to its upstream, an
application's to a hosted API. The caller's client spans must carry what the
answers held, as a server's spans do, read from what the client read:

- every recorded answer (tests/fixtures/genai) posted by httpx and by aiohttp
  (its own HTTP/1.1 stack) to uvicorn, and by httpx over h2c to hypercorn,
  the callers traced and not the server: each client span's gen_ai.* is the
  unit tests' table of the answer;
- the official `openai` client (over HTTP/1.1, and over TLS with HTTP/2 by
  ALPN, read through the libssl uprobes) and `anthropic` client, both ends
  traced: each call's client span says what that client received (model,
  tokens, finish, events), its time to the first chunk with output lies
  between the server's pause before it and the client's own clock, and each
  call is counted once in gen_ai.client.* and once in gen_ai.server.*;
- the same clients calling Node's http (tests/integration/replay_node.js),
  which sends a response's head with its first event in one write: both
  ends' spans say what the client received.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..unit.test_genai import INDEX
from .conftest import Owned, running_agent, wait_until
from .test_genai_replay import Replay, expected
from .test_tls import certificate  # noqa: F401 (a fixture)

HERE = Path(__file__).resolve().parent
SERVER, CLIENT = 2, 3  # OTLP/JSON's SPAN_KIND_SERVER, SPAN_KIND_CLIENT
GAP_MS = 40  # between a stream's events, as the replay server writes them


class Caller(Owned):
    """tests/integration/genai_client.py: calls once told to, prints what it received."""

    def __init__(self, base: str, client: str, *args: str):
        self.client = client
        self.proc = subprocess.Popen([sys.executable, str(HERE / "genai_client.py"), "--base", base,
                                     "--client", client, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def call(self) -> list[dict]:
        """Tells it to go; what it received, a dict a call, once it is done."""
        out, _ = self.proc.communicate("go\n", timeout=60)
        assert self.proc.returncode == 0, out
        return [json.loads(line) for line in out.splitlines()]


def client_spans(agent, pid: int, n: int) -> list[dict]:
    """A process's n client spans, in the order it made the calls."""
    spans = wait_until(lambda: len(s := [x for x in agent.traces.for_pid(pid) if x["kind"] == CLIENT]) >= n and s,
                       30, f"{n} client spans of {pid}")
    return sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))


def as_called(name: str, status: int) -> dict:
    """A recorded answer's attributes on its caller's span: a server's, but for
    a refusal the answer does not name, which is an error to its client (its status)."""
    want = expected(name)
    if status >= 400 and want.get("error.type") is None:
        want["error.type"] = str(status)
    return want


def test_recorded_answers_a_traced_caller_reads_come_out_as_recorded(tmp_path):
    """httpx and aiohttp over HTTP/1.1 to uvicorn, httpx over h2c to hypercorn: one agent tracing the callers."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("hypercorn")
    (tmp_path / "agent").mkdir()
    names = sorted(INDEX)
    with contextlib.ExitStack() as owned:
        h1 = owned.enter_context(Replay())
        h2 = owned.enter_context(Replay(server="hypercorn"))
        fixtures = ("--fixtures", ",".join(names))
        callers = {"httpx": owned.enter_context(Caller(f"http://127.0.0.1:{h1.port}", "httpx", *fixtures)),
                   "aiohttp": owned.enter_context(Caller(f"http://127.0.0.1:{h1.port}", "aiohttp", *fixtures)),
                   "httpx h2c": owned.enter_context(Caller(f"http://127.0.0.1:{h2.port}", "httpx", "--http2",
                                                           *fixtures))}
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [c.proc.pid for c in callers.values()], "cmdline": []}, {}, {}))
        wrong = []
        for label, caller in callers.items():
            wait_until(lambda: agent.tracks(caller.proc.pid), 15, f"the agent to track {label}")
            received = caller.call()
            assert [r["name"] for r in received] == names
            spans = client_spans(agent, caller.proc.pid, len(names))
            assert len(spans) == len(names), label
            for r, span in zip(received, spans):
                want, a = as_called(r["name"], r["status"]), span["attrs"]
                got = {k: a.get(k) for k in want}
                if got != want:
                    wrong.append(f"{label} {r['name']}: {got} != {want}")
                if not a.get("url.full", "").endswith(INDEX[r["name"]]["path"]) or a.get("server.port") not in (
                        h1.port, h2.port):
                    wrong.append(f"{label} {r['name']}: not the call to its path: {a}")
                if INDEX[r["name"]]["stream"] and not a.get("gen_ai.response.time_to_first_chunk"):
                    wrong.append(f"{label} {r['name']}: a stream with no time to first chunk")
                named = " ".join(want[k] for k in ("gen_ai.operation.name", "gen_ai.request.model") if want.get(k))
                if span["name"] != named:  # the GenAI conventions' name of an inference call
                    wrong.append(f"{label} {r['name']}: named {span['name']!r}, not {named!r}")
        assert not wrong, "\n".join(wrong)
        spans = [s for c in callers.values() for s in agent.traces.for_pid(c.proc.pid)]
        assert not any("gen_ai.server.time_to_first_token" in s["attrs"] for s in spans)
        assert "SECRET" not in json.dumps([s["attrs"] for s in spans])  # the fixtures' answers say SECRET-ANSWER


TALLIED = {"model": "gen_ai.response.model", "input_tokens": "gen_ai.usage.input_tokens",
           "output_tokens": "gen_ai.usage.output_tokens", "events": "sitsprobe.genai.stream_events",
           "content": "sitsprobe.genai.content_events"}


def test_the_official_clients_calls_say_what_each_client_received(tmp_path, certificate):
    """openai over HTTP/1.1 and over TLS (HTTP/2 by ALPN), anthropic over HTTP/1.1;
    callers and servers traced, as a gateway is on both its sides."""
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    (tmp_path / "agent").mkdir()
    with contextlib.ExitStack() as owned:
        h1 = owned.enter_context(Replay(gap_ms=GAP_MS))
        tls = owned.enter_context(Replay(server="hypercorn", gap_ms=GAP_MS, tls=certificate))
        callers = {"openai": owned.enter_context(Caller(f"http://127.0.0.1:{h1.port}", "openai")),
                   "openai TLS h2": owned.enter_context(Caller(f"https://127.0.0.1:{tls.port}", "openai", "--http2")),
                   "anthropic": owned.enter_context(Caller(f"http://127.0.0.1:{h1.port}", "anthropic"))}
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [p.proc.pid for p in (h1, tls, *callers.values())], "cmdline": []}, {}, {}))
        calls = streams = output = chunks = 0
        for label, caller in callers.items():
            wait_until(lambda: agent.tracks(caller.proc.pid), 15, f"the agent to track {label}")
            if label.endswith("TLS h2"):
                wait_until(lambda: agent.metric("sitsprobe_tls_processes", pid=caller.proc.pid) == 1, 10,
                           "the agent to hook the caller's libssl")
            received = caller.call()
            spans = client_spans(agent, caller.proc.pid, len(received))
            assert len(spans) == len(received), label
            for r, span in zip(received, spans):
                a = span["attrs"]
                told = {attr: r[k] for k, attr in TALLIED.items() if k in r}
                assert {attr: a.get(attr) for attr in told} == told, (label, r["call"], a)
                if "finish_reason" in r:
                    assert a["gen_ai.response.finish_reasons"] == [r["finish_reason"]], (label, r["call"], a)
                if r.get("ttfc_s") is not None:  # the agent read it before the client's iterator gave it
                    assert 0 < a["gen_ai.response.time_to_first_chunk"] <= r["ttfc_s"], (label, r["call"], a)
                if r["call"] == "chat stream":  # its first output came a pause after its role's chunk
                    assert a["gen_ai.response.time_to_first_chunk"] >= GAP_MS / 1000, (label, a)
                operation = "text_completion" if r["call"].startswith("completions") else "chat"
                assert span["name"] == f"{operation} {r['asked']}", (label, r["call"], span["name"])
                assert a["network.protocol.version"] == ("2" if label.endswith("h2") else "1.1"), (label, a)
                assert a["url.full"].startswith("https://" if "TLS" in label else "http://"), (label, a)
            calls += len(received)
            streams += sum(1 for r in received if "ttfc_s" in r)
            chunks += sum(r["content"] - 1 for r in received if "ttfc_s" in r)  # each after the first
            output += sum(r["output_tokens"] for r in received if "output_tokens" in r)
        # each call counted once on each side: the callers' as calls, the servers' as requests served
        want = {"gen_ai_client_operation_duration_seconds_count": calls,
                "gen_ai_server_request_duration_seconds_count": calls,
                "gen_ai_client_operation_time_to_first_chunk_seconds_count": streams,
                "gen_ai_client_operation_time_per_output_chunk_seconds_count": chunks}
        wait_until(lambda: all(agent.metric(k) == n for k, n in want.items()), 15,
                   f"{want} (have {[agent.metric(k) for k in want]})")
        page = agent.scrape()
        assert agent.metric("gen_ai_client_token_usage_sum", page, gen_ai_token_type="output") == output
        assert agent.metric("gen_ai_server_tokens_total", page, gen_ai_token_type="output") == output
        by_server = [agent.metric("gen_ai_client_operation_duration_seconds_count", page, server_port=p)
                     for p in (h1.port, tls.port)]
        assert by_server == [3 + 2, 3]  # openai's and anthropic's calls; openai's over TLS


class NodeReplay(Owned):
    """tests/integration/replay_node.js: the recorded answers, Node's http writing them."""

    def __init__(self, gap_ms: float):
        node = shutil.which("node") or shutil.which("nodejs")
        if node is None:
            pytest.skip("no Node.js: .ci/run installs the nodejs package")
        self.proc = subprocess.Popen([node, str(HERE / "replay_node.js"), str(gap_ms)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline().split()[1])
        assert self.proc.stdout.readline().strip() == "ready"


def test_a_head_sent_with_the_first_event_leaves_the_event_readable(tmp_path):
    """Node's http sends a response's head with its first write, so a
    stream's head and first event (Anthropic's message_start, the one event
    that tells the input tokens; OpenAI's first chunk) go out in one write
    longer than a write's peek, and the client reads them in one read. The
    openai and anthropic clients call Node, all traced: each call's client
    span, and Node's span for it, say what the client received. (The peek
    showed the head alone: both spans had no input tokens for Anthropic.)"""
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    (tmp_path / "agent").mkdir()
    with contextlib.ExitStack() as owned:
        node = owned.enter_context(NodeReplay(GAP_MS))
        base = f"http://127.0.0.1:{node.port}"
        callers = {"openai": owned.enter_context(Caller(base, "openai")),
                   "anthropic": owned.enter_context(Caller(base, "anthropic"))}
        agent = owned.enter_context(running_agent(
            tmp_path / "agent", {"pids": [node.proc.pid, *(c.proc.pid for c in callers.values())],
                                 "cmdline": []}, {}, {}))
        wait_until(lambda: all(agent.tracks(p.proc.pid) for p in (node, *callers.values())), 15,
                   "the agent to track Node and the callers")
        wrong, served = [], 0
        for label, caller in callers.items():
            received = caller.call()
            calls = client_spans(agent, caller.proc.pid, len(received))
            served += len(received)
            answers = wait_until(lambda: len(s := [x for x in agent.traces.for_pid(node.proc.pid)
                                                   if x["kind"] == SERVER]) >= served and s,
                                 30, f"Node's {served} server spans")
            answers = sorted(answers, key=lambda s: int(s["startTimeUnixNano"]))[served - len(received):]
            for r, call, answer in zip(received, calls, answers):
                told = {attr: r[k] for k, attr in TALLIED.items() if k in r}
                for side, span in (("client", call), ("Node", answer)):
                    got = {attr: span["attrs"].get(attr) for attr in told}
                    if got != told:
                        wrong.append(f"{label} {r['call']} {side}: {got} != {told}")
        assert not wrong, "\n".join(wrong)
