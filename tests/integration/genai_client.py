"""A process that calls a GenAI server as applications do, for the agent to
trace (not a test: a helper for tests/integration/test_genai_client.py):

    python genai_client.py --base http://127.0.0.1:8000 --client openai

It prints ``ready``, waits for a line on stdin (the test's agent tracks it by
then), makes its calls one after the other, prints one JSON line per call
with what the client itself received, and exits.

``--client``:
  httpx, aiohttp  each recorded request of tests/fixtures/genai (``--fixtures``),
                  posted as recorded and read to its end: {name, status}; httpx
                  over HTTP/2 with prior knowledge with ``--http2``
  openai          the official client (on httpx; HTTP/2 with ``--http2``): a
                  streamed chat with usage, a chat, a streamed completion
  anthropic       the official client: a streamed message, a message
A stream's line counts what the client's iterator gave: every chunk (event;
not for anthropic, whose SDK hides the wire's pings), the ones with output,
and the time from the call to the first of those.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "genai"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPT = [{"role": "user", "content": "SECRET-PROMPT"}]


def recorded_request(name: str) -> tuple[str, bytes]:
    """A fixture's (path, request body); an error fixture's asks the replay server for it."""
    meta = json.loads((FIXTURES / "index.json").read_text())[name]
    body = json.loads((FIXTURES / f"{name}.request.json").read_bytes())
    if meta.get("error"):
        body["inputs" if "inputs" in body else "model"] = "error"
    return meta["path"], json.dumps(body).encode()


def with_httpx(base: str, names: list[str], http2: bool):
    import httpx

    with httpx.Client(http1=not http2, http2=http2, timeout=30, verify=False) as c:
        for name in names:
            path, body = recorded_request(name)
            r = c.post(base + path, content=body, headers={"content-type": "application/json"})
            yield {"name": name, "status": r.status_code, "http_version": r.http_version}


def with_aiohttp(base: str, names: list[str]):
    import aiohttp

    async def calls():
        out = []
        async with aiohttp.ClientSession() as s:
            for name in names:
                path, body = recorded_request(name)
                async with s.post(base + path, data=body, headers={"content-type": "application/json"}) as r:
                    await r.read()
                    out.append({"name": name, "status": r.status})
        return out
    yield from asyncio.run(calls())


def streamed(call, output) -> tuple[dict, list]:
    """A stream call() makes, read through the SDK's iterator: its events,
    those with output (output(event)), the time from the call to the first of
    those; and the events."""
    t0, first, got = time.perf_counter(), None, []
    for ev in call():
        got.append(ev)
        if first is None and output(ev):
            first = time.perf_counter() - t0
    return {"events": len(got), "content": sum(map(output, got)), "ttfc_s": first}, got


def with_openai(base: str, http2: bool):
    import httpx
    import openai

    api = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                        http_client=httpx.Client(http1=not http2, http2=http2, verify=False))
    s, got = streamed(lambda: api.chat.completions.create(model=MODEL, messages=PROMPT, stream=True,
                                                          stream_options={"include_usage": True}),
                      lambda ch: bool(ch.choices and ch.choices[0].delta.content))
    usage = got[-1].usage
    yield {"call": "chat stream", "asked": MODEL, **s, "model": got[0].model, "input_tokens": usage.prompt_tokens,
           "output_tokens": usage.completion_tokens}
    r = api.chat.completions.create(model=MODEL, messages=PROMPT)
    yield {"call": "chat", "asked": MODEL, "model": r.model, "input_tokens": r.usage.prompt_tokens,
           "output_tokens": r.usage.completion_tokens, "finish_reason": r.choices[0].finish_reason}
    s, got = streamed(lambda: api.completions.create(model=MODEL, prompt="SECRET-PROMPT", stream=True),
                      lambda ch: bool(ch.choices and ch.choices[0].text))
    # no usage sent: its output tokens are the chunks with output, as the conventions count them
    yield {"call": "completions stream", "asked": MODEL, **s, "model": got[0].model, "output_tokens": s["content"],
           "finish_reason": [c.choices[0].finish_reason for c in got if c.choices and c.choices[0].finish_reason][-1]}


def with_anthropic(base: str):
    import anthropic

    api = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0)
    ask = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": PROMPT}
    s, got = streamed(lambda: api.messages.create(**ask, stream=True),
                      lambda ev: ev.type == "content_block_delta" and bool(ev.delta.text))
    del s["events"]  # the SDK hides the wire's ping events
    start = next(e.message for e in got if e.type == "message_start")
    end = next(e for e in got if e.type == "message_delta")
    yield {"call": "messages stream", "asked": ask["model"], **s, "model": start.model, "input_tokens": start.usage.input_tokens,
           "output_tokens": end.usage.output_tokens, "finish_reason": end.delta.stop_reason}
    m = api.messages.create(**ask)
    u = m.usage  # the conventions' input tokens include the prompt cache's
    yield {"call": "messages", "asked": ask["model"], "model": m.model, "output_tokens": u.output_tokens, "finish_reason": m.stop_reason,
           "input_tokens": u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    ap.add_argument("--base", required=True, help="the server, scheme://host:port")
    ap.add_argument("--client", choices=("httpx", "aiohttp", "openai", "anthropic"), required=True)
    ap.add_argument("--fixtures", default="", help="httpx, aiohttp: the recorded requests to post, comma-separated")
    ap.add_argument("--http2", action="store_true", help="httpx, openai: HTTP/2 (h2c with prior knowledge)")
    args = ap.parse_args()
    names = [n for n in args.fixtures.split(",") if n]
    print("ready", flush=True)
    sys.stdin.readline()
    calls = {"httpx": lambda: with_httpx(args.base, names, args.http2),
             "aiohttp": lambda: with_aiohttp(args.base, names),
             "openai": lambda: with_openai(args.base, args.http2),
             "anthropic": lambda: with_anthropic(args.base)}[args.client]
    for line in calls():
        print(json.dumps(line), flush=True)
    os._exit(0)  # at once, as a killed caller does: its last reads and its exit reach the agent together


if __name__ == "__main__":
    main()
