"""Issue 11: GenAI from the wire, no markers. Servers no one here wrote
(`transformers serve`, Hugging Face's OpenAI-compatible server: chat
completions and the Responses API) driven by two clients no one here wrote
(the official `openai` client and `huggingface_hub`'s InferenceClient), and our reference engine with and
without its markers: what the spans say about each request (model, tokens,
time to first token, stream events) must equal what the client received.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from unittest import mock

import pytest

from .conftest import HERE, Engine, Owned, TraceFile, accepts, children, free_port, running_agent, wait_until
from .tiny_model import build

openai = pytest.importorskip("openai")
huggingface_hub = pytest.importorskip("huggingface_hub")
TRANSFORMERS = Path(sys.executable).with_name("transformers")
PROMPTS = ["the quick brown fox", "jumps over", "the lazy dog 7", "fox fox fox", "over the"]


class TransformersServe(Owned):
    """`transformers serve` on a tiny model built in the test, on the CPU."""

    def __init__(self, d: Path):
        if not TRANSFORMERS.exists():
            pytest.skip(f"no {TRANSFORMERS}: pip install 'transformers[serving]' (the test extras have it)")
        self.model = str(build(d / "tiny"))
        self.port = free_port()
        self.log = d / "serve.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.proc = subprocess.Popen([str(TRANSFORMERS), "serve", self.model, "--port", str(self.port),
                                      "--host", "127.0.0.1", "--device", "cpu"],
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env)
        wait_until(self._up, 120, f"transformers serve on :{self.port} ({self.log})")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"transformers serve exited:\n{self.log.read_text()}")
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).status == 200
        except OSError:
            return False


def chat(client: str, base_url: str):
    """The client's chat call, taking the OpenAI API's keyword arguments."""
    if client == "openai":
        return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0).chat.completions.create
    hf = huggingface_hub.InferenceClient(base_url=base_url, api_key="none")
    return hf.chat_completion


def drive(base_url: str, model: str, rounds: int = 2, max_tokens: int = 8, client: str = "openai",
          **params) -> list[dict]:
    """Streaming (with and without usage) and plain requests; what the client saw of each."""
    create = chat(client, base_url)
    seen = []
    for i in range(rounds):
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            r = create(model=model, messages=messages, max_tokens=max_tokens, **params)
            seen.append({"client": client, "stream": False, "model": r.model, "usage": r.usage,
                         "finish": r.choices[0].finish_reason})
            for usage in (True, False):
                t0 = time.monotonic()
                ttft, chunks, content, last, finish = None, 0, 0, None, None
                extra = {"stream_options": {"include_usage": True}} if usage else {}
                for ch in create(model=model, messages=messages, max_tokens=max_tokens, stream=True,
                                 **extra, **params):
                    chunks += 1
                    last = ch
                    finish = finish or next((c.finish_reason for c in ch.choices if c.finish_reason), None)
                    if ch.choices and ch.choices[0].delta.content:
                        content += 1
                        ttft = ttft if ttft is not None else time.monotonic() - t0
                seen.append({"client": client, "stream": True, "model": last.model, "usage": last.usage,
                             "ttft": ttft, "chunks": chunks, "content_chunks": content, "finish": finish})
    return seen


FINISH = {"completed": "stop"}  # a Responses status as a finish reason (stitch.genai_shapes); incomplete: its reason


def drive_responses(base_url: str, model: str, max_tokens: int = 8) -> list[dict]:
    """The Responses API through the openai client, plain and streamed; what it saw of each."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    seen = []
    for prompt in PROMPTS[:3]:
        r = client.responses.create(model=model, input=prompt, max_output_tokens=max_tokens)
        seen.append({"stream": False, "model": r.model, "usage": r.usage,
                     "finish": FINISH.get(r.status, r.status)})
        events = list(client.responses.create(model=model, input=prompt, max_output_tokens=max_tokens,
                                              stream=True))
        last = events[-1].response
        seen.append({"stream": True, "model": last.model, "usage": last.usage, "events": len(events),
                     "finish": FINISH.get(last.status, last.status),
                     "content": sum(1 for e in events if e.type.endswith(".delta") and e.delta)})
    return seen


def genai_spans(agent, port: int, n: int) -> list[dict]:
    """The n server spans of port, in the order their requests began."""
    spans = agent.traces.wait_for_port(port, n, timeout=30)
    return sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))


def test_transformers_serve_with_the_openai_and_huggingface_clients(tmp_path):
    (tmp_path / "agent").mkdir()
    with TransformersServe(tmp_path) as serve, \
            running_agent(tmp_path / "agent", {"ports": [serve.port], "cmdline": []}, {}, {}) as agent:
        wait_until(lambda: agent.tracks(serve.proc.pid), 15, "the agent to track transformers serve")
        url = f"http://127.0.0.1:{serve.port}/v1"
        seen = drive(url, serve.model)
        # the Hub's offline switch (tiny_model sets it: no download) would refuse a local server too
        with mock.patch.object(huggingface_hub.constants, "HF_HUB_OFFLINE", False):
            seen += drive(url, serve.model, rounds=1, client="huggingface_hub")
        responses = drive_responses(url, serve.model)
        every = genai_spans(agent, serve.port, len(seen) + len(responses))
        spans = [s for s in every if s["attrs"].get("url.path") == "/v1/chat/completions"]
        answered = [s for s in every if s["attrs"].get("url.path") == "/v1/responses"]
        page = agent.scrape()
        tokens = {t: agent.metric("gen_ai_server_tokens_total", page, gen_ai_request_model=serve.model,
                                  gen_ai_token_type=t) for t in ("input", "output")}
        report = subprocess.run([sys.executable, "-m", "sitsprobe.cli", "report", "--agent",
                                 agent.metrics_url, "--json"], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)  # the agent's own record of every GenAI request, sampled or not
    assert doc["attribution"]["requests"] == len(seen) + len(responses), doc
    assert doc["attribution"]["residual"]["over"] == 0, doc
    assert (len(spans), len(answered)) == (len(seen), len(responses))
    wrong = []
    for i, (s, c) in enumerate(zip(spans, seen)):
        a = s["attrs"]
        expect = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                  "gen_ai.request.model": serve.model, "gen_ai.response.model": c["model"],
                  "gen_ai.request.max_tokens": 8, "sitsprobe.genai.source": "wire",
                  "gen_ai.response.finish_reasons": [c["finish"]]}
        if c["usage"] is not None:
            expect |= {"gen_ai.usage.input_tokens": c["usage"].prompt_tokens,
                       "gen_ai.usage.output_tokens": c["usage"].completion_tokens,
                       "sitsprobe.genai.usage_source": "stream_usage" if c["stream"] else "body"}
        else:  # a stream without usage: the content events, counted
            expect |= {"gen_ai.usage.output_tokens": c["content_chunks"],
                       "sitsprobe.genai.usage_source": "counted_events"}
        if c["stream"]:
            expect |= {"sitsprobe.genai.stream_events": c["chunks"]}
        got = {k: a.get(k) for k in expect}
        if got != expect:
            wrong.append(f"request {i} ({c['client']}, {'stream' if c['stream'] else 'plain'}): {got} != {expect}")
        ttft, ttfb = a.get("gen_ai.server.time_to_first_token"), a.get("sitsprobe.time_to_first_byte_s")
        if c["stream"] and c["ttft"] is None and ttft is not None:  # a random model may answer blanks
            wrong.append(f"request {i}: time to first token {ttft}, but the client saw no content")
        elif c["stream"] and c["ttft"] is not None and (ttft is None or not ttfb < ttft <= c["ttft"]):
            wrong.append(f"request {i}: time to first token {ttft} not after the headers ({ttfb}) "
                             f"and within the client's {c['ttft']}")
    for i, (s, c) in enumerate(zip(answered, responses)):  # the Responses API
        a = s["attrs"]
        expect = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                  "gen_ai.request.model": serve.model, "gen_ai.response.model": c["model"],
                  "gen_ai.request.max_tokens": 8, "gen_ai.response.finish_reasons": [c["finish"]],
                  "gen_ai.usage.input_tokens": c["usage"].input_tokens,
                  "gen_ai.usage.output_tokens": c["usage"].output_tokens,
                  "sitsprobe.genai.usage_source": "stream_usage" if c["stream"] else "body"}
        if c["stream"]:
            expect |= {"sitsprobe.genai.stream_events": c["events"], "sitsprobe.genai.content_events": c["content"]}
        got = {k: a.get(k) for k in expect}
        if got != expect:
            wrong.append(f"response {i} ({'stream' if c['stream'] else 'plain'}): {got} != {expect}")
        if c["stream"] and c["content"] and "gen_ai.server.time_to_first_token" not in a:
            wrong.append(f"response {i}: a stream with output and no time to first token")
    assert not wrong, "\n".join(wrong)
    # the token counter, against the client's usage (a stream without usage: its content events)
    assert tokens == {
        "input": sum(c["usage"].prompt_tokens for c in seen if c["usage"] is not None)
        + sum(c["usage"].input_tokens for c in responses),
        "output": sum(c["usage"].completion_tokens if c["usage"] is not None else c["content_chunks"] for c in seen)
        + sum(c["usage"].output_tokens for c in responses)}, tokens


def test_the_wire_and_the_markers_agree_on_the_reference_engine(tmp_path):
    """One workload, the engine run with its markers and without. Each run's
    spans against what its client received: in both, the model, the finish
    reason and, where the server sent usage, the tokens equal the client's
    (the markers' numbers in one, the wire's in the other; two runs, since a
    batched decode may end at a different token); a stream without usage
    counts its content events, at most its tokens. The median time to first
    token agrees within 5 ms or 50 % (the wire's is the first content write,
    the markers' the end of prefill: earlier by a detokenize and a write)."""
    ttft, files = {}, {}
    for mode, args in (("markers", ()), ("wire", ("--no-markers",))):
        d = tmp_path / mode
        (d / "agent").mkdir(parents=True)
        engine = Engine(d, *args)
        try:
            with running_agent(d / "agent", {"pids": [engine.pid], "cmdline": []}, {}, {}) as agent:
                wait_until(functools.partial(agent.tracks, engine.pid), 15, "the agent to track the engine")
                seen = drive(f"{engine.url}/v1", "sitsprobe-tiny-gpt", rounds=1,
                             temperature=0)  # greedy: a sampled EOS first would leave nothing to count
                spans = [s["attrs"] for s in genai_spans(agent, engine.port, len(seen))]
                files[mode] = agent.traces.path
        finally:
            engine.stop()
        assert {a["sitsprobe.genai.source"] for a in spans} == {mode}
        wrong = []
        for i, (a, c) in enumerate(zip(spans, seen)):
            expect = {"gen_ai.request.model": "sitsprobe-tiny-gpt", "gen_ai.response.model": c["model"],
                      "gen_ai.response.finish_reasons": [c["finish"]]}
            if c["usage"] is not None:
                expect |= {"gen_ai.usage.input_tokens": c["usage"].prompt_tokens,
                           "gen_ai.usage.output_tokens": c["usage"].completion_tokens}
            got = {k: a.get(k) for k in expect}
            if got != expect:
                wrong.append(f"{mode} request {i}: {got} != {expect}")
            if c["usage"] is None and mode == "wire" and not 0 < a["gen_ai.usage.output_tokens"] <= 8:
                wrong.append(f"{mode} request {i}: {a['gen_ai.usage.output_tokens']} counted events")
        assert not wrong, "\n".join(wrong)
        ttft[mode] = statistics.median(a["gen_ai.server.time_to_first_token"] for a in spans
                                       if "gen_ai.server.time_to_first_token" in a)
    t_m, t_w = ttft["markers"], ttft["wire"]
    print(f"time to first token, median: wire {t_w * 1e3:.2f} ms, markers {t_m * 1e3:.2f} ms")
    assert abs(t_w - t_m) <= max(0.005, 0.5 * t_m), (t_w, t_m)
    for mode, path in files.items():
        check_report(path, mode)


def check_report(path: Path, mode: str) -> None:
    """`sitsprobe report` on a traces file the suite made: every request's five
    segments add up to its duration (report.tolerance), and the exact P99 is
    the P99 of the very spans in the file."""
    out = subprocess.run([sys.executable, "-m", "sitsprobe.cli", "report", str(path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    durations = sorted(int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])
                       for s in TraceFile(path).spans() if s["kind"] == 2)
    a = doc["attribution"]
    assert a["requests"] == len(durations), (mode, a["requests"], len(durations))
    assert a["residual"]["over"] == 0, (mode, a["residual"])
    nearest_rank = durations[math.ceil(0.99 * len(durations)) - 1]
    assert doc["bias"]["exact_p99_ms"] == pytest.approx(nearest_rank / 1e6), mode
    shares = {r["segment"]: r["share"] or 0 for r in a["rows"]}
    if mode == "markers":  # the engine names its queue (its batching window), cache look-up and copies
        assert shares["scheduling"] > 0.1 and shares["cache"] > 0 and shares["io"] > 0, shares
    else:  # without markers its queue cannot be told from its model
        assert shares["compute"] > 0.5 and shares["cache"] == shares["io"] == 0, shares


@contextlib.contextmanager
def streaming_server(name: str):
    """(the pid that serves, its port): uvicorn (peers.py), or gunicorn's
    sync worker (stream_wsgi.py), serving OpenAI chat streams."""
    if name == "uvicorn":
        proc = subprocess.Popen([sys.executable, str(HERE / "peers.py"), "uvicorn"],
                                stdout=subprocess.PIPE, text=True)
        port = int(proc.stdout.readline())
    else:
        pytest.importorskip("gunicorn", reason="gunicorn is a test extra (pyproject.toml)")
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--worker-class", "sync", "--bind",
                                 f"127.0.0.1:{port}", "--chdir", str(HERE), "stream_wsgi:app"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = proc.pid if name == "uvicorn" else \
            wait_until(lambda: children(proc.pid)[:1], 15, "gunicorn's worker")[0]
        yield pid, port
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
@pytest.mark.parametrize("events", [120, 8], ids=["past-max-writes", "within-max-writes"])
def test_an_answer_is_counted_whole_though_the_client_hung_up_before_its_end(tmp_path, events, server):
    """A server streams `events` tokens 4 ms apart, a write each, to the
    openai client; the agent times only the first 16 writes
    (capture.max_writes). The rest are counted: the span has every event the
    client received, and the time per output token is the whole answer's,
    not its first writes'. The client hangs up as soon as it reads [DONE],
    and the server ends the chunked body 50 ms later: uvicorn has seen the
    hang-up and writes no end; gunicorn's sync worker writes it, into a
    closed peer whose reset ends the connection inside that write (the
    socket tier sees TCP's close within the call). Either way nothing is
    lost: the kernel once dropped such a write and counted a write event
    lost, and a long answer was then counted an event short, as it was
    where no end was written."""
    import httpx  # noqa: F401 (the openai client's transport)

    (tmp_path / "agent").mkdir()
    with streaming_server(server) as (pid, port), \
            running_agent(tmp_path / "agent", {"pids": [pid], "cmdline": []}, {},
                          {"capture": {"max_writes": 16}}) as agent:
        wait_until(lambda: agent.tracks(pid), 15, f"the agent to track {server}")
        wait_until(lambda: accepts(port), 15, f"{server} on :{port}")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        arrived = [time.monotonic() for ch in client.chat.completions.create(
            model="flood-1", messages=[{"role": "user", "content": "hi"}], stream=True,
            extra_query={"events": events, "gap": 0.004, "linger": 0.05}) if ch.choices[0].delta.content]
        (span,) = genai_spans(agent, port, 1)
        lost = agent.metric("sitsprobe_events_lost_total", reason="write_ring_full")
    a = span["attrs"]
    assert len(arrived) == events
    assert (a["sitsprobe.genai.stream_events"], a["sitsprobe.genai.content_events"], a["gen_ai.usage.output_tokens"],
            a.get("sitsprobe.genai.events_approximate", False), a["sitsprobe.complete"], a.get("error.type"),
            lost) == (events, events, events, events > 16, True, None, 0), a  # whole: no cut, no stop
    if events > 16:  # the whole answer's pace, where only the first writes were timed
        tpot = (arrived[-1] - arrived[0]) / (events - 1)
        assert a["gen_ai.server.time_per_output_token"] == pytest.approx(tpot, rel=0.25), (tpot, a)
