"""Servers no one here wrote, for the wire-truth tests: uvicorn+Starlette,
aiohttp and nginx, as their users run them.

    python peers.py uvicorn|aiohttp --tag sitsprobe-testserver [--name COMM] [--record DIR]
                    [--tls CERT KEY] [--host ADDRESS] [--gzip MIN]

prints its port on stdout's first line, then serves until killed. Its argv
carries the tag so the agent selects it by command line; it listens on
127.0.0.1, or on --host (``::``: IPv6 and IPv4 both, the latter mapped).
--name sets the process's comm (what the agent's `process` label shows), so
each server's metrics can be told apart from the others'. --record (uvicorn) appends the
bytes each connection received, exactly as read, to DIR/conn-N.raw. --gzip
(uvicorn) compresses responses of MIN bytes or more through Starlette's
GZipMiddleware, for the clients that accept it (their Accept-Encoding).

  GET  /sse?first=S&gaps=A,B,...  text/event-stream: headers at once, the first
                                  event S seconds later, then one event after
                                  each gap (len(gaps) + 1 events), then the end
  GET  /json/ANY                  200, a small JSON body
  GET  /status/NNN                status NNN, body "status NNN\\n"
  POST /v1/chat/completions       (uvicorn) a fixed OpenAI chat completion; with
                                  "stream": true and ?events=N (both servers), N
                                  OpenAI chunks and [DONE], a write each, at once
                                  (uvicorn: or &gap=S seconds apart; &linger=S
                                  between [DONE] and the body's end; &abort=K: the
                                  handler raises before event K, and uvicorn
                                  closes the connection mid-body)
  GET  /ws                        a WebSocket that echoes each message (uvicorn:
                                  through wsproto)

`status_locations` gives nginx one location per status.
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import json
import os
import socket
import sys

PR_SET_NAME = 15
COMPLETION = {
    "id": "chatcmpl-wiretruth", "object": "chat.completion", "created": 1700000000,
    "model": "wire-truth-1",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "told true"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def event(i: int) -> bytes:
    return f"data: token {i}\n\n".encode()


def chunks(n: int):
    """An OpenAI chat stream of n tokens, as SSE events, then [DONE]."""
    for i in range(n):
        yield b'data: {"object":"chat.completion.chunk","model":"flood-1","choices":[{"index":0,' \
              b'"delta":{"content":"t%d"}}]}\n\n' % i
    yield b"data: [DONE]\n\n"


def sse_schedule(query) -> tuple[float, list[float]]:
    """(pause before the first event, gaps between events) from ?first=&gaps=."""
    gaps = [float(g) for g in query.get("gaps", "").split(",") if g]
    return float(query.get("first", 0)), gaps


# -- uvicorn + Starlette --------------------------------------------------------


def starlette_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route, WebSocketRoute

    async def sse(request):
        first, gaps = sse_schedule(request.query_params)

        async def events():
            await asyncio.sleep(first)
            yield event(0)
            for i, gap in enumerate(gaps, 1):
                await asyncio.sleep(gap)
                yield event(i)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def as_json(request):
        return JSONResponse({"path": request.url.path})

    async def status(request):
        code = request.path_params["code"]
        return PlainTextResponse(f"status {code}\n", status_code=code)

    async def chat(request):
        try:
            stream = json.loads(await request.body()).get("stream") is True
        except (ValueError, AttributeError):  # not a JSON object: the fixed completion
            stream = False
        if not stream:
            return JSONResponse(COMPLETION)

        async def events():
            gap, linger = (float(request.query_params.get(k, 0)) for k in ("gap", "linger"))
            abort = int(request.query_params.get("abort", -1))
            for i, chunk in enumerate(chunks(int(request.query_params["events"]))):
                if i == abort:  # uvicorn closes the connection mid-body: the server's abort
                    raise RuntimeError(f"the server gives up after {i} events")
                if i:  # not after the last: a client may hang up once it has [DONE]
                    await asyncio.sleep(gap)
                yield chunk
            await asyncio.sleep(linger)  # ... as the openai client does: before the stream's end

        return StreamingResponse(events(), media_type="text/event-stream")

    async def echo(ws):
        await ws.accept()
        while (msg := await ws.receive())["type"] == "websocket.receive":
            if msg.get("text") is not None:
                await ws.send_text(msg["text"])
            else:
                await ws.send_bytes(msg["bytes"])

    return Starlette(routes=[
        Route("/sse", sse), Route("/json/{rest:path}", as_json), Route("/status/{code:int}", status),
        Route("/v1/chat/completions", chat, methods=["POST"]), WebSocketRoute("/ws", echo),
    ])


def recording_protocol(directory: str):
    """uvicorn's own HTTP/1.1 protocol, keeping what each connection received."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    numbers = itertools.count()

    class Recording(AutoHTTPProtocol):
        def connection_made(self, transport):
            self._record = open(os.path.join(directory, f"conn-{next(numbers)}.raw"), "ab", buffering=0)
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            self._record.write(data)
            super().data_received(data)

        def connection_lost(self, exc):
            self._record.close()
            super().connection_lost(exc)

    return Recording


def serve_uvicorn(sock: socket.socket, record: str | None, tls: list[str] | None = None,
                  gzip: int | None = None) -> None:
    import uvicorn
    from starlette.middleware.gzip import GZipMiddleware

    app = starlette_app() if gzip is None else GZipMiddleware(starlette_app(), minimum_size=gzip)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            http=recording_protocol(record) if record else "auto", ws="wsproto",
                            **({"ssl_certfile": tls[0], "ssl_keyfile": tls[1]} if tls else {}))
    uvicorn.Server(config).run(sockets=[sock])


# -- aiohttp ---------------------------------------------------------------------


def aiohttp_app():
    from aiohttp import web

    async def sse(request):
        first, gaps = sse_schedule(request.query)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # a StreamResponse sends its headers here
        await asyncio.sleep(first)
        await resp.write(event(0))
        for i, gap in enumerate(gaps, 1):
            await asyncio.sleep(gap)
            await resp.write(event(i))
        await resp.write_eof()
        return resp

    async def as_json(request):
        return web.json_response({"path": request.path})

    async def status(request):
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"status {code}\n")

    async def chat_stream(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks(int(request.query["events"])):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def echo(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == web.WSMsgType.TEXT:
                await ws.send_str(msg.data)
            elif msg.type == web.WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", echo)
    app.router.add_post("/v1/chat/completions", chat_stream)
    app.router.add_get("/sse", sse)
    app.router.add_get("/json/{rest:.*}", as_json)
    app.router.add_get("/status/{code}", status)
    return app


def serve_aiohttp(sock: socket.socket) -> None:
    from aiohttp import web

    web.run_app(aiohttp_app(), sock=sock, print=None, access_log=None, handle_signals=False)


# -- nginx -------------------------------------------------------------------------

NGINX_STATUSES = (201, 202, 203, 204, 400, 401, 403, 409, 418, 503)

def status_locations() -> str:
    """`location = /s/NNN { return NNN ...; }` for each of NGINX_STATUSES, for
    tests/nginx.py's static site (index.html through sendfile, 404 for a
    missing file)."""
    return "\n".join(f"        location = /s/{code} {{ return {code}{_nginx_body(code)}; }}"
                     for code in NGINX_STATUSES)


def _nginx_body(code: int) -> str:
    return "" if code == 204 else f' "s{code}\\n"'


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("server", choices=("uvicorn", "aiohttp"))
    ap.add_argument("--tag", default="sitsprobe-testserver")
    ap.add_argument("--name", help="the process's comm (15 bytes at most)")
    ap.add_argument("--record", help="uvicorn: append each connection's received bytes under this folder")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="uvicorn: serve HTTPS")
    ap.add_argument("--host", default="127.0.0.1", help="the address to listen on (:: is dual-stack)")
    ap.add_argument("--gzip", type=int, metavar="MIN", help="uvicorn: compress responses of MIN bytes on")
    a = ap.parse_args()
    if a.name:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NAME, a.name.encode()[:15], 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_SET_NAME, {a.name!r})")
    v6 = ":" in a.host
    sock = socket.create_server((a.host, 0), backlog=256, family=socket.AF_INET6 if v6 else socket.AF_INET,
                                dualstack_ipv6=a.host == "::")
    sock.setblocking(False)
    print(sock.getsockname()[1], flush=True)
    if a.server == "uvicorn":
        serve_uvicorn(sock, a.record, a.tls, a.gzip)
    else:
        serve_aiohttp(sock)


if __name__ == "__main__":
    sys.exit(main())
