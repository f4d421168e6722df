"""A GenAI server that answers from the recorded responses in
tests/fixtures/genai, as the real servers write them (not a test: a helper
for the integration tests, and for trying the agent by hand):

    python tests/integration/genai_replay.py --port 8000 --gap-ms 5

It prints ``ready`` once it listens (``port N`` first, with ``--port 0``).
``--server`` picks who serves it: uvicorn (HTTP/1.1, the default), or over
HTTP/2 with prior knowledge (h2c, as gateways and gRPC-style clients speak
it) hypercorn (Python, the h2 library) or granian (Rust, hyper's h2);
``--tls CERT KEY``: hypercorn over TLS instead, HTTP/2 by ALPN.
A POST to a fixture's path (/v1/chat/completions, /v1/completions,
/v1/embeddings, /v1/responses, /generate (TGI's or SGLang's, by the
request's keys), /generate_stream, /api/chat, /api/generate, /completion),
or to one ending in it (a gateway's /openai/v1/chat/completions),
gets the fixture for that path and for whether the request asks
to stream (as each API decides: Ollama streams unless told not to, TGI on
/generate_stream); model (TGI: inputs) "error" asks for the error fixture.
A stream is written one event per write, ``--gap-ms`` apart, with uvicorn's
chunked framing, as vLLM's server writes it; an OpenAI stream keeps its usage
chunk only when the request sets stream_options.include_usage. Anything else
is a 404 with an OpenAI-style error body.

``--layout`` writes every answer otherwise, as a network or a broken server
may deliver it: ``split`` in 7-byte writes (events cut across writes, a
body's Content-Length kept), ``mangled`` with invalid UTF-8 in every string
that carries text (and is not empty), ``truncated`` cut off halfway, the connection dropped.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "genai"
_OWN_HEADERS = {"content-length", "transfer-encoding", "date", "server", "content-type"}


class Recorded:
    """One fixture's response: status, headers, and its body as its server wrote it."""

    def __init__(self, name: str, meta: dict):
        self.name, self.path = name, meta["path"]
        self.stream, self.error = meta["stream"], meta.get("error", False)
        self.keys = meta.get("keys", ())  # the request's, where two APIs share the path (/generate)
        raw = (FIXTURES / f"{name}.http").read_bytes()
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        fields = [line.partition(":") for line in lines[1:]]
        self.headers = {k.strip().lower(): v.strip() for k, _, v in fields}
        self.media_type = self.headers.get("content-type", "application/json")
        chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        self.writes = _chunks(body) if chunked else [body]

    def extra_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k not in _OWN_HEADERS and v}


def _chunks(body: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(body):
        nl = body.index(b"\r\n", pos)
        size = int(body[pos:nl], 16)
        if size == 0:
            break
        out.append(body[nl + 2:nl + 2 + size])
        pos = nl + 2 + size + 2
    return out


def wants_stream(path: str, body: dict) -> bool:
    if path.endswith("/generate_stream"):
        return True
    if path.startswith("/api/"):
        return body.get("stream", True) is not False
    return body.get("stream") is True


def without_usage(event: bytes) -> bool:
    """An OpenAI stream's usage chunk (``"choices": []`` and a usage), to leave out."""
    try:
        obj = json.loads(event.partition(b"data:")[2])
    except ValueError:
        return False
    return isinstance(obj, dict) and obj.get("choices") == [] and "usage" in obj


LAYOUTS = ("events", "split", "mangled", "truncated")
SPLIT = 7  # bytes a write, for --layout split
_TEXT = re.compile(rb'("(?:content|text|response|generated_text|message)"\s*:\s*")(?=[^"])')  # not empty


def laid_out(writes: list[bytes], layout: str) -> list[bytes]:
    """A response's writes as --layout asks."""
    if layout == "mangled":
        return [_TEXT.sub(lambda m: m.group(1) + b"\xff\xfe\xc3", w) for w in writes]
    whole = b"".join(writes)
    if layout == "split":
        return [whole[i:i + SPLIT] for i in range(0, len(whole), SPLIT)]
    if layout == "truncated":
        return [whole[:len(whole) // 2]]
    return writes


class Truncated(Exception):
    """Raised mid-answer: uvicorn drops the connection, as a crashed server would."""


def app(gap_s: float, layout: str = "events") -> Starlette:
    index = json.loads((FIXTURES / "index.json").read_text())
    recorded = [Recorded(name, meta) for name, meta in index.items()]

    async def answer(request: Request) -> Response:
        path = request.url.path
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        error = "error" in (body.get("model"), body.get("inputs"))
        stream = wants_stream(path, body)
        served = max((r.path for r in recorded if path.endswith(r.path)), key=len, default=None)
        found = [r for r in recorded if r.path == served and r.error == error
                 and (error or r.stream == stream) and all(k in body for k in r.keys)]
        if not found:
            return JSONResponse({"error": {"message": f"no fixture for {path} stream={stream}",
                                           "type": "NotFoundError", "code": 404}}, 404)
        r = found[0]
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        events = laid_out([e for e in r.writes if usage or not without_usage(e)], layout)
        if not r.stream and layout in ("events", "mangled"):
            return Response(events[0], r.status, r.extra_headers(), r.media_type)
        headers = r.extra_headers()
        if not r.stream:  # one body, in pieces: its length said, as the server would
            headers["content-length"] = str(len(b"".join(r.writes)))

        async def written():
            for i, event in enumerate(events):
                if i and gap_s and r.stream:
                    await asyncio.sleep(gap_s)
                yield event
            if layout == "truncated":
                raise Truncated(r.name)
        return StreamingResponse(written(), r.status, headers, r.media_type)

    return Starlette(routes=[Route("/{path:path}", answer, methods=["POST"])])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="0: any free port, printed")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="between a stream's events")
    ap.add_argument("--layout", choices=LAYOUTS, default="events", help="how answers are written (above)")
    ap.add_argument("--server", choices=("uvicorn", "hypercorn", "granian"), default="uvicorn",
                    help="uvicorn: HTTP/1.1; hypercorn, granian: HTTP/2 (h2c, prior knowledge)")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="hypercorn: over TLS (h2 by ALPN)")
    args = ap.parse_args(argv)
    application = app(args.gap_ms / 1000, args.layout)
    if args.tls and args.server != "hypercorn":
        ap.error("--tls: with --server hypercorn only")
    if args.server != "uvicorn":
        serve_h2(args.server, application, args.host, args.port, args.tls)
        return
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(128)
    if args.port == 0:
        print(f"port {sock.getsockname()[1]}", flush=True)
    print("ready", flush=True)  # connections queue on the listening socket until served
    config = uvicorn.Config(application, log_level="critical", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def serve_h2(server: str, application: Starlette, host: str, port: int, tls: list[str] | None) -> None:
    """hypercorn or granian serving HTTP/2, in this process (neither takes a
    bound socket: the port is found free, then bound by the server)."""
    if port == 0:
        with socket.create_server((host, 0)) as probe:
            port = probe.getsockname()[1]
        print(f"port {port}", flush=True)
    threading.Thread(target=_say_ready, args=(host, port), daemon=True).start()
    if server == "hypercorn":
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind, config.loglevel = [f"{host}:{port}"], "WARNING"
        if tls:
            config.certfile, config.keyfile = tls
        asyncio.run(serve(application, config))
    else:
        from granian.constants import HTTPModes, Interfaces
        from granian.server.embed import Server

        asyncio.run(Server(application, host, port, interface=Interfaces.ASGI, http=HTTPModes.http2,
                           log_enabled=False).serve())


def _say_ready(host: str, port: int) -> None:
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            time.sleep(0.05)
            continue
        print("ready", flush=True)
        return


if __name__ == "__main__":
    main(sys.argv[1:])
