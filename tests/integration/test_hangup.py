"""A streamed answer cut short, by its client or by its server.

A client that hangs up mid-answer (a user's stop button, a client's
timeout) is the client's doing: the server's span says
`sitsprobe.partial=client_closed` and `error.type=client_closed`, with no
error status. A server that gives up mid-answer is the server's:
`response_cut_off`, `error.type=incomplete`, status ERROR. The kernel tells
them apart by what the server saw of its peer before the connection ended:
an end-of-file read, a write that the peer's reset failed (EPIPE,
ECONNRESET), or, on the socket tier, TCP's CLOSE_WAIT.

Peers no one here wrote: uvicorn (asyncio reads the end of file),
gunicorn's sync worker (it never reads again: its writes fail), nginx in
front of uvicorn; the openai client, httpx and requests. The number of
events the agent read from an aborted answer is the number the client got.
Each tier is run (TIERS).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from .conftest import HERE, TAG, Nginx, Owned, accepts, children, free_port, port_for_later, wait_until

pytestmark = pytest.mark.integration
TIERS = ("socket", "syscall")
RUN_TAG = f"{TAG}-hangup-{os.getpid()}"
NGINX_PORT = port_for_later()  # bound minutes after this module is imported
AGENT_SELECT = {"cmdline": [re.escape(RUN_TAG)], "comms": [], "ports": [NGINX_PORT]}
ASK = {"model": "wire-truth-1", "messages": [{"role": "user", "content": "hello"}], "stream": True}
EVENTS, READ, ABORT = 9, 2, 3  # events an answer has; read before hanging up; sent before the abort
GAP = 0.05  # seconds between events: the client's hang-up lands mid-answer

CLIENT_CLOSED = (False, "client_closed", "client_closed", {})  # (complete, partial, error.type, status)
SERVER_ABORT = (False, "response_cut_off", "incomplete", {"code": 2})


def outcome(span: dict) -> tuple:
    a = span["attrs"]
    return a["sitsprobe.complete"], a.get("sitsprobe.partial"), a.get("error.type"), span["status"]


def chats(agent, pids) -> list[dict]:
    """The chat completion server spans of these processes so far, oldest first."""
    return sorted((s for p in pids for s in agent.traces.for_pid(p)
                   if s["attrs"].get("url.path") == "/v1/chat/completions" and s.get("kind") != 3),
                  key=lambda s: int(s["startTimeUnixNano"]))


def server_spans(agent, pids, n: int) -> list[dict]:
    """The first n chat completion server spans of these processes, once there are as many."""
    return wait_until(lambda: len(s := chats(agent, pids)) >= n and s[:n], 15, f"{n} chat completion spans")


@pytest.fixture(scope="module")
def uvicorn(agent):
    proc = subprocess.Popen([sys.executable, str(HERE / "peers.py"), "uvicorn", "--tag", RUN_TAG,
                             "--name", "hangup-uv"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        wait_until(lambda: agent.tracks(proc.pid), 15, "the agent to track uvicorn")
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait()


class GunicornSync(Owned):
    """gunicorn's sync worker serving stream_wsgi.py; tracked by the agent."""

    def __init__(self, agent):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--worker-class", "sync", "--bind", f"127.0.0.1:{self.port}",
             "--chdir", str(HERE), "--name", RUN_TAG, "stream_wsgi:app"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.until(lambda: (c := children(self.proc.pid)) and c[0], 15, "gunicorn's worker")
        self.until(lambda: agent.tracks(self.pid), 10, "the agent to track gunicorn's worker")
        self.until(lambda: accepts(self.port), 10, f"gunicorn on port {self.port}")


def test_uvicorn_told_a_stop_from_the_openai_client_from_its_own_abort(agent, uvicorn):
    import openai

    pid, port = uvicorn
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(**ASK, extra_query={"events": EVENTS, "gap": GAP})
    got = [chunk for chunk, _ in zip(stream, range(READ))]
    stream.close()  # the stop button
    aborted, error = [], None
    try:
        for chunk in client.chat.completions.create(**ASK, extra_query={"events": EVENTS, "abort": ABORT}):
            aborted.append(chunk)
    except Exception as e:  # httpx's RemoteProtocolError: the body ended before its last chunk
        error = e
    assert len(got) == READ and len(aborted) == ABORT and error is not None, (len(got), len(aborted), error)
    stopped, broken = server_spans(agent, [pid], 2)
    assert outcome(stopped) == CLIENT_CLOSED, stopped["attrs"]
    assert outcome(broken) == SERVER_ABORT, broken["attrs"]
    assert broken["attrs"]["sitsprobe.genai.stream_events"] == len(aborted)  # what the client got
    assert READ <= stopped["attrs"]["sitsprobe.genai.stream_events"] < EVENTS


def test_gunicorn_s_sync_worker_whose_writes_fail_after_requests_hangs_up(agent):
    import requests

    with GunicornSync(agent) as gunicorn:
        url = f"http://127.0.0.1:{gunicorn.port}/v1/chat/completions"
        with requests.post(url, params={"events": EVENTS, "gap": GAP}, json=ASK, stream=True, timeout=10) as r:
            got = [line for line, _ in zip((x for x in r.iter_lines() if x), range(READ))]
        with pytest.raises(requests.exceptions.ChunkedEncodingError):  # the body ended before its last chunk
            with requests.post(url, params={"events": EVENTS, "abort": ABORT}, json=ASK, stream=True,
                               timeout=10) as r:
                aborted = []
                for line in r.iter_lines():
                    if line:
                        aborted.append(line)
        assert len(got) == READ and len(aborted) == ABORT, (got, aborted)
        stopped, broken = server_spans(agent, [gunicorn.pid], 2)
    assert outcome(stopped) == CLIENT_CLOSED, stopped["attrs"]
    assert outcome(broken) == SERVER_ABORT, broken["attrs"]
    assert broken["attrs"]["sitsprobe.genai.stream_events"] == len(aborted)


def test_nginx_and_the_server_behind_it_both_tell_the_client_s_hang_up(agent, uvicorn, tmp_path):
    import httpx

    upstream_pid, upstream = uvicorn
    locations = (f"        location /v1/ {{ proxy_pass http://127.0.0.1:{upstream}; "
                 f"proxy_http_version 1.1; proxy_buffering off; }}")
    before = len(chats(agent, [upstream_pid]))  # the other tests' requests came here too
    with Nginx(agent, tmp_path / "nginx", port=NGINX_PORT, locations=locations) as nginx:
        with httpx.Client(base_url=f"http://127.0.0.1:{NGINX_PORT}") as c, \
                c.stream("POST", "/v1/chat/completions", params={"events": EVENTS, "gap": GAP}, json=ASK) as r:
            got = [line for line, _ in zip((x for x in r.iter_lines() if x), range(READ))]
        assert len(got) == READ
        front = server_spans(agent, nginx.workers, 1)[0]
    behind = server_spans(agent, [upstream_pid], before + 1)[before]
    assert outcome(front) == CLIENT_CLOSED, front["attrs"]
    assert outcome(behind) == CLIENT_CLOSED, behind["attrs"]  # nginx, its client, hung up in turn


def curl_stream(port: int, query: str, *, max_time: float | None = None) -> tuple[int, list[bytes]]:
    """curl as an HTTP/1.0 client (the servers then end the answer by closing):
    (its exit status, the events it got, [DONE] left out)."""
    out = subprocess.run(["curl", "-s", "-N", "--http1.0", *(["--max-time", str(max_time)] if max_time else []),
                          "-H", "Content-Type: application/json", "--data", json.dumps(ASK),
                          f"http://127.0.0.1:{port}/v1/chat/completions?{query}"], capture_output=True, timeout=30)
    events = [line for line in out.stdout.split(b"\n") if line.startswith(b"data: ") and line != b"data: [DONE]"]
    return out.returncode, events


def test_an_answer_only_the_close_ends_is_cut_by_the_client_that_closes_first(agent, uvicorn):
    """To an HTTP/1.0 client, uvicorn and gunicorn send a stream with no
    length and no chunks: the server's close is its end, so the close alone
    says nothing. curl reading it whole: complete. curl giving up mid-answer
    (--max-time): the client closed first, client_closed."""
    if shutil.which("curl") is None:
        pytest.skip("no curl: .ci/run installs it")
    with GunicornSync(agent) as gunicorn:
        for pid, port in (uvicorn, (gunicorn.pid, gunicorn.port)):
            before = len(chats(agent, [pid]))
            whole = curl_stream(port, f"events={EVENTS}")
            cut = curl_stream(port, f"events={EVENTS}&gap=0.2", max_time=0.5)
            assert (whole[0], len(whole[1]), cut[0]) == (0, EVENTS, 28), (whole, cut)  # 28: curl's timeout
            assert 0 < len(cut[1]) < EVENTS
            done, stopped = server_spans(agent, [pid], before + 2)[before:]
            assert outcome(done) == (True, None, None, {}), done["attrs"]
            assert done["attrs"]["sitsprobe.genai.stream_events"] == len(whole[1])
            assert outcome(stopped) == CLIENT_CLOSED, stopped["attrs"]
            assert done["attrs"]["network.protocol.version"] == "1.0"
