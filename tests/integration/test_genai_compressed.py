"""GenAI meaning from bodies sent compressed: the official clients ask for it
(openai's and requests' Accept-Encoding: gzip, deflate), and servers and
gateways give it. Starlette's GZipMiddleware compresses uvicorn's answers;
nginx's gzip compresses a plain server's answers it proxies, streams too.
The usage, model and finish reason the agent reads from the compressed
bytes are the clients' own, and the same as it reads from the plain bytes
behind nginx; a stream's events are as many as the client counted.

nginx writes each chunk of a proxied stream with writev, as three entries
(its size line, its data, its CRLF): the kernel keeps a write's first bytes
and the response's last ones across the entries, so the plain stream
through nginx is read whole too.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .conftest import HERE, TAG, Nginx, port_for_later, wait_until

pytestmark = pytest.mark.integration
TIERS = ("socket", "syscall")  # the pieces of a vectored write are gathered by the same code on each
RUN_TAG = f"{TAG}-compressed-{os.getpid()}"
NGINX_PORT = port_for_later()  # bound minutes after this module is imported
AGENT_SELECT = {"cmdline": [re.escape(RUN_TAG)], "comms": [], "ports": [NGINX_PORT]}
ASK = {"model": "wire-truth-1", "messages": [{"role": "user", "content": "hello"}]}
EVENTS = 9


@pytest.fixture(scope="module")
def upstreams(agent):
    """{"plain": its (pid, port), "gzip": uvicorn behind GZipMiddleware}."""
    procs, served = [], {}
    try:
        for kind, extra in (("plain", []), ("gzip", ["--gzip", "100"])):
            proc = subprocess.Popen([sys.executable, str(HERE / "peers.py"), "uvicorn", "--tag", RUN_TAG,
                                     "--name", f"gz-{kind}", *extra], stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            served[kind] = (proc.pid, int(proc.stdout.readline()))
            wait_until(lambda p=proc: agent.tracks(p.pid), 15, f"the agent to track the {kind} server")
        yield served
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def chat_spans(agent, pids, n: int) -> list[dict]:
    """The n chat completion server spans of these processes (nginx's calls
    to its upstream are client spans), oldest first."""
    return wait_until(lambda: len(s := sorted((x for p in pids for x in agent.traces.for_pid(p)
                                               if x["attrs"].get("url.path", "").endswith("/v1/chat/completions")
                                               and x.get("kind") != 3),
                                              key=lambda x: int(x["startTimeUnixNano"]))) >= n and s,
                      15, f"{n} chat completion spans")


def said(span: dict) -> tuple:
    a = span["attrs"]
    return (a.get("gen_ai.usage.input_tokens"), a.get("gen_ai.usage.output_tokens"),
            a.get("gen_ai.response.model"), tuple(a.get("gen_ai.response.finish_reasons") or ()))


def told(completion) -> tuple:
    """What the client parsed of a (non-stream) completion."""
    u = completion.usage
    return u.prompt_tokens, u.completion_tokens, completion.model, tuple(c.finish_reason for c in completion.choices)


def test_starlette_s_gzip_read_through_the_openai_and_requests_clients(agent, upstreams):
    import openai
    import requests

    pid, port = upstreams["gzip"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(**ASK)
    assert raw.headers["content-encoding"] == "gzip"  # compressed on the wire, or this proves nothing
    via_openai = told(raw.parse())
    r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=ASK, timeout=10)
    assert r.headers["Content-Encoding"] == "gzip"
    body = r.json()
    via_requests = (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"], body["model"],
                    tuple(c["finish_reason"] for c in body["choices"]))
    spans = chat_spans(agent, [pid], 2)
    assert [said(s) for s in spans] == [via_openai, via_requests]
    assert {s["attrs"]["sitsprobe.genai.content_encoding"] for s in spans} == {"gzip"}


def test_nginx_s_gzip_in_front_of_a_plain_server_streams_too(agent, upstreams, tmp_path):
    import openai

    upstream_pid, upstream = upstreams["plain"]
    proxy = "proxy_http_version 1.1; proxy_buffering off;"
    locations = (f"        gzip on; gzip_types application/json text/event-stream; gzip_min_length 100;\n"
                 f"        location /v1/ {{ proxy_pass http://127.0.0.1:{upstream}; {proxy} }}\n"
                 f"        location /plain/v1/ {{ gzip off; proxy_pass http://127.0.0.1:{upstream}/v1/; {proxy} }}")
    with Nginx(agent, tmp_path / "nginx", port=NGINX_PORT, locations=locations) as nginx:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{NGINX_PORT}/v1", api_key="none", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(**ASK)
        assert raw.headers["content-encoding"] == "gzip"
        whole = told(raw.parse())
        streamed = client.chat.completions.with_raw_response.create(**ASK, stream=True,
                                                                     extra_query={"events": EVENTS})
        assert streamed.headers["content-encoding"] == "gzip"
        chunks = list(streamed.parse())
        content = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
        assert len(chunks) == content == EVENTS
        plain = openai.OpenAI(base_url=f"http://127.0.0.1:{NGINX_PORT}/plain/v1", api_key="none", max_retries=0)
        for gap in (0, 0.02):  # at once (nginx writes several chunks at a time), then one by one
            raw = plain.chat.completions.with_raw_response.create(**ASK, stream=True,
                                                                  extra_query={"events": EVENTS, "gap": gap})
            assert "content-encoding" not in raw.headers
            assert len(list(raw.parse())) == EVENTS
        front, behind = chat_spans(agent, nginx.workers, 4), chat_spans(agent, [upstream_pid], 4)
        assert said(front[0]) == said(behind[0]) == whole
        for f, b in zip(front[1:], behind[1:]):  # the gzip stream, the plain ones
            a = f["attrs"]
            # (not events_approximate: with the machine busy it is said at times, all nine
            # events counted and no write lost; why is not pinned down yet)
            assert (a["sitsprobe.genai.stream_events"], a["sitsprobe.complete"]) == (EVENTS, True), a
            assert b["attrs"]["gen_ai.usage.output_tokens"] == content
        # an event a write's first bytes cut before its output shows is no content (a floor:
        # tests/unit/test_genai.py); written one by one, none is cut
        gzipped, at_once, one_by_one = (f["attrs"]["sitsprobe.genai.content_events"] for f in front[1:])
        assert gzipped == one_by_one == content and 0 < at_once <= content
        assert [s["attrs"].get("sitsprobe.genai.content_encoding") for s in front + behind] == \
            ["gzip", "gzip", None, None, None, None, None, None]


def test_a_client_that_hangs_up_at_done_got_the_whole_answer_and_one_that_hangs_up_before_did_not(
        agent, upstreams):
    """The openai client closes the connection as soon as it reads [DONE]
    (it reads no further: the chunked body's last chunk may still be on its
    way). The answer was whole: no cut, no error. A client that stops
    reading halfway and closes (a user's stop button) cut it: still said."""
    import httpx
    import openai

    pid, port = upstreams["plain"]
    before = len(agent.traces.for_pid(pid))  # the other tests' requests through nginx came here too
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    got = list(client.chat.completions.create(**ASK, stream=True, extra_query={"events": EVENTS, "linger": 0.3}))
    assert len(got) == EVENTS
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c, \
            c.stream("POST", "/v1/chat/completions", params={"events": EVENTS, "gap": 0.05},
                     json={**ASK, "stream": True}) as r:
        read = [line for _, line in zip(range(3), r.iter_lines()) if line]
    assert len(read) == 2  # two events (a blank line between): then the client hangs up
    done, stopped = wait_until(lambda: len(s := agent.traces.for_pid(pid)) >= before + 2 and s, 15,
                               "the two streams' spans")[before:before + 2]
    a = done["attrs"]
    assert (a["sitsprobe.complete"], a.get("sitsprobe.partial"), a.get("error.type"), done["status"]) == \
        (True, None, None, {})
    assert (a["sitsprobe.genai.stream_events"], a["sitsprobe.genai.content_events"]) == (EVENTS, EVENTS)
    a = stopped["attrs"]  # the client's doing, not the server's: no error status
    assert (a["sitsprobe.complete"], a.get("sitsprobe.partial"), a.get("error.type"), stopped["status"]) == \
        (False, "client_closed", "client_closed", {})
    assert a["sitsprobe.genai.content_events"] < EVENTS


WRITEV_SERVER = r'''
import socket, sys
events = [b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i
          for i in range(int(sys.argv[1]))] + [b"data: [DONE]\n\n"]
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    pieces = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"]
    for e in events:  # as nginx writes a chunk: its size line, its data, its CRLF
        pieces += [b"%x\r\n" % len(e), e, b"\r\n"]
    conn.sendmsg(pieces + [b"0\r\n\r\n"])  # the whole answer in one call
    conn.close()
'''


def test_a_stream_written_in_one_call_of_more_pieces_than_are_walked(agent, tmp_path):
    """One sendmsg of 3 pieces an event, the last chunk the last of them. Two
    events (10 pieces): the tail is the answer's end, and every event is
    counted. Six (22) are more than the tail walks (16): the end is not known
    and is not claimed either way (not cut off), and the count says it is
    approximate: a [DONE] among the lines counted cannot be told apart."""
    import requests

    script = tmp_path / f"writev_{RUN_TAG}.py"
    script.write_text(WRITEV_SERVER)
    for events in (2, 6):
        proc = subprocess.Popen([sys.executable, str(script), str(events)], stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())
            wait_until(lambda: agent.tracks(proc.pid), 15, "the agent to track the writev server")
            r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={**ASK, "stream": True}, timeout=10)
            assert r.text.count("data: ") == events + 1
            [span] = chat_spans(agent, [proc.pid], 1)
            a = span["attrs"]
            assert (a["sitsprobe.complete"], a.get("sitsprobe.partial")) == (True, None), a
            if events == 2:
                assert (a["sitsprobe.genai.stream_events"], a.get("sitsprobe.genai.events_approximate")) == (2, None)
            else:
                assert a["sitsprobe.genai.events_approximate"] and events <= a["sitsprobe.genai.stream_events"] <= events + 1
        finally:
            proc.kill()
            proc.wait()
