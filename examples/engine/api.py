"""The OpenAI-compatible HTTP API over the stdlib's ThreadingHTTPServer (HTTP/1.1, keep-alive).

    POST /v1/completions        {"prompt": str, ...}
    POST /v1/chat/completions   {"messages": [{"role", "content"}], ...}
    GET  /health | /v1/models | /v1/engine/stats

Each completion request is one ``markers.request`` on the accepted socket, with the
stages tokenize, queue and detokenize marked here (prefill and decode in the scheduler).
"""
from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import traceback
from dataclasses import asdict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from sitsprobe import markers

from . import protocol, tokenizer
from .completion_cache import CompletionCache
from .model import GPT, MODEL_NAME
from .protocol import APIError
from .scheduler import EngineError, GenParams, Overloaded, Scheduler

MAX_BODY_BYTES = 1 << 20
GET_ROUTES = ("/health", "/v1/models", "/v1/engine/stats")
POST_ROUTES = ("/v1/completions", "/v1/chat/completions")


class Engine:
    """The model, its scheduler and caches: what the HTTP handlers serve from."""

    def __init__(self, model: GPT, scheduler: Scheduler, completion_cache: CompletionCache | None = None,
                 timeout_s: float = 60.0):
        self.model, self.scheduler, self.completion_cache = model, scheduler, completion_cache
        self.timeout_s = timeout_s
        self.started = time.time()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def next_request_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def stats(self) -> dict:
        s = self.scheduler
        return {
            "model": MODEL_NAME, "device": str(self.model.device), "model_seed": self.model.seed,
            "config": asdict(self.model.cfg), "uptime_s": round(time.time() - self.started, 3),
            "batching": s.stats(),
            "prefix_cache": s.prefix_cache.stats() if s.prefix_cache else None,
            "completion_cache": self.completion_cache.stats() if self.completion_cache else None,
        }


class ClientGone(Exception):
    pass


class _Cached:
    """A completion served from the completion cache, shaped like a scheduler Handle."""

    kv_bytes = 0

    def __init__(self, value: dict):
        self._tokens, self.finish_reason = value["tokens"], value["finish_reason"]

    def tokens(self, timeout: float = 0):
        yield from self._tokens


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sitsprobe-engine/0.1"
    server: "EngineServer"

    # -- plumbing --

    def log_message(self, format, *args):  # noqa: A002
        if self.server.access_log:
            super().log_message(format, *args)

    def send_error(self, code, message=None, explain=None):
        """Errors the stdlib raises itself (bad request line, unsupported method) as JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # no version parsed: answer with a status line anyway
            self.request_version = "HTTP/1.0"
        phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else "error"
        try:
            self._send_json(code, APIError(code, message or phrase, code=phrase.lower().replace(" ", "_")).body())
        except ClientGone:
            pass

    def _send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
        except OSError as e:
            raise ClientGone() from e

    def _start_stream(self) -> None:
        """200 and event-stream headers; the body goes out chunked (HTTP/1.0: until close)."""
        self._streaming = True
        self._chunked = self.request_version != "HTTP/1.0"
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding" if self._chunked else "Connection",
                             "chunked" if self._chunked else "close")
            self.end_headers()
        except OSError as e:
            raise ClientGone() from e

    def _send_chunk(self, data: bytes) -> None:
        """One piece of a streamed body; b"" ends it (HTTP/1.0: the connection's close does)."""
        frame = b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data
        try:
            if frame:
                self.wfile.write(frame)
        except OSError as e:
            raise ClientGone() from e

    def _send_event(self, body) -> None:
        self._send_chunk(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n\n")

    def _read_json(self):
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise APIError(411, "chunked request bodies are not supported: send Content-Length", code="length_required")
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise APIError(400, "bad Content-Length header", code="invalid_header") from None
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise APIError(413, f"the request body is {length} bytes; the limit is {MAX_BODY_BYTES}",
                           code="request_too_large")
        data = self.rfile.read(length)
        if len(data) < length:
            raise ClientGone()
        if not data:
            raise APIError(400, "the request body is empty: expected a JSON object", code="invalid_json")
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None

    def _discard_body(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if self.headers.get("Transfer-Encoding") or not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
        elif length:
            self.rfile.read(length)

    def _route_error(self, path: str) -> APIError:
        if path in GET_ROUTES + POST_ROUTES:
            return APIError(405, f"{self.command} is not allowed on {path}", code="method_not_allowed")
        return APIError(404, f"no route {self.command} {path}", code="unknown_url")

    def _reply(self, fn) -> None:
        """Run a route; its errors become JSON error responses (or, once a stream has
        begun, a closed connection)."""
        self._streaming = False
        try:
            fn()
        except ClientGone:
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - never a traceback to the client
            if not isinstance(e, APIError):
                traceback.print_exc(file=sys.stderr)
                self.close_connection = True
                e = APIError(500, "internal error", type="server_error", code="internal_error")
            if self._streaming:
                self.close_connection = True
            else:
                try:
                    self._send_json(e.status, e.body())
                except ClientGone:
                    self.close_connection = True

    # -- routes --

    def do_GET(self):
        path = urlsplit(self.path).path
        engine = self.server.engine

        def route():
            if path == "/health":
                self._send_json(200, {"status": "ok"})
            elif path == "/v1/models":
                self._send_json(200, {"object": "list", "data": [
                    {"id": MODEL_NAME, "object": "model", "created": int(engine.started), "owned_by": "sitsprobe"}]})
            elif path == "/v1/engine/stats":
                self._send_json(200, engine.stats())
            else:
                raise self._route_error(path)

        self._reply(route)

    def do_POST(self):
        path = urlsplit(self.path).path
        if self.command == "POST" and path in POST_ROUTES:
            self._completion(chat=path == "/v1/chat/completions")
            return

        def route():
            self._discard_body()
            raise self._route_error(path)

        self._reply(route)

    do_PUT = do_DELETE = do_PATCH = do_POST

    # -- completions --

    def _completion(self, chat: bool) -> None:
        rid = self.server.engine.next_request_id()
        try:
            fd = self.connection.fileno()
        except OSError:
            fd = -1
        with markers.request(rid, fd, model=MODEL_NAME):
            self._reply(lambda: self._generate(rid, chat))

    def _generate(self, rid: int, chat: bool) -> None:
        engine = self.server.engine
        req = protocol.parse(self._read_json(), chat, MODEL_NAME)
        with markers.range("tokenize", request_id=rid):
            prompt = tokenizer.encode(req.prompt)
        protocol.check_length(len(prompt), req.max_tokens, engine.model.cfg.context)
        cache, key, source = engine.completion_cache, None, None
        if cache is not None and req.temperature == 0:
            key = cache.key(prompt, req.max_tokens)
            value = cache.get(key, rid)
            source = _Cached(value) if value is not None else None
        if source is None:
            try:
                source = engine.scheduler.submit(rid, prompt, GenParams(req.max_tokens, req.temperature, req.seed))
            except Overloaded as e:
                raise APIError(429, f"the engine is overloaded: {e}", type="server_error", code="overloaded") from None
            except EngineError as e:
                raise APIError(503, str(e), type="server_error", code="unavailable") from None
            with markers.range("queue", request_id=rid):
                admitted = source.admitted.wait(engine.timeout_s)
            if not admitted:
                source.cancel()
                raise APIError(503, f"waited {engine.timeout_s}s in the engine's queue",
                               type="server_error", code="queue_timeout")
        emit = _Emit(self, req, rid, len(prompt))
        try:
            ids = emit.stream(source) if req.stream else emit.whole(source)
        finally:
            if hasattr(source, "cancel"):
                source.cancel()  # a no-op once it finished; stops decoding for a client gone
            emit.usage(source)
        fresh = not isinstance(source, _Cached)
        if key is not None and fresh and ids is not None and source.finish_reason in ("stop", "length"):
            cache.put(key, ids, source.finish_reason)


class _Emit:
    """Writes one completion's response, whole or as server-sent events."""

    def __init__(self, handler: Handler, req: protocol.GenRequest, rid: int, prompt_tokens: int):
        self.h, self.req, self.rid, self.prompt_tokens = handler, req, rid, prompt_tokens
        self.out = protocol.Responses(req, rid)
        self.ids: list[int] = []
        self._usage_sent = False

    def usage(self, source) -> None:
        """markers.usage, once, before the last bytes of the response go out."""
        if not self._usage_sent:
            self._usage_sent = True
            markers.usage(self.rid, input_tokens=self.prompt_tokens, output_tokens=len(self.ids),
                          kv_bytes=source.kv_bytes)

    def whole(self, source) -> list[int]:
        try:
            self.ids = list(source.tokens(self.h.server.engine.timeout_s))
        except EngineError as e:
            raise APIError(500, f"generation failed: {e}", type="server_error", code="engine_error") from None
        with markers.range("detokenize", request_id=self.rid):
            text = tokenizer.decode(self.ids)
        self.usage(source)
        body = self.out.whole(text, source.finish_reason, protocol.usage(self.prompt_tokens, len(self.ids)))
        self.h._send_json(200, body)
        return self.ids

    def stream(self, source) -> list[int] | None:
        h = self.h
        h._start_stream()
        if self.req.chat:
            h._send_event(self.out.chunk(role=True))
        detok = tokenizer.Detokenizer()
        try:
            for token in source.tokens(h.server.engine.timeout_s):
                self.ids.append(token)
                with markers.range("detokenize", request_id=self.rid):
                    piece = detok.feed(token)
                if piece:
                    h._send_event(self.out.chunk(piece))
        except EngineError as e:
            self.usage(source)
            error = APIError(500, f"generation failed: {e}", type="server_error", code="engine_error")
            h._send_event(error.body())
            h._send_chunk(b"")
            return None
        tail = detok.flush()
        if tail:
            h._send_event(self.out.chunk(tail))
        self.usage(source)
        h._send_event(self.out.chunk(finish_reason=source.finish_reason))
        if self.req.include_usage:
            h._send_event(self.out.usage_chunk(protocol.usage(self.prompt_tokens, len(self.ids))))
        h._send_event(b"[DONE]")
        h._send_chunk(b"")
        return self.ids


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, engine: Engine, access_log: bool = False):
        self.engine, self.access_log = engine, access_log
        super().__init__(address, Handler)
