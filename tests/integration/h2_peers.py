"""HTTP/2 servers no one here wrote, for the HTTP/2 and gRPC tests.

    python h2_peers.py grpc|hypercorn --tag TAG [--tls CERT KEY]

prints its port on stdout's first line, then serves until killed.

grpc (grpcio, generic handlers: raw bytes, no generated code):
  /demo.Echo/Say      unary: the request back
  /demo.Echo/Count    server streaming: int(request) messages
  /demo.Echo/Missing  unary: aborts NOT_FOUND
  /demo.Echo/Slow     unary: answers after 2 s (the client's deadline is shorter)
hypercorn (h2c with prior knowledge, plain ASGI):
  GET /status/NNN     status NNN, a short body
  GET /big/N          200, N bytes (DATA frames beyond the captured bytes)
"""
from __future__ import annotations

import argparse
import socket
import sys
import time


def serve_grpc() -> None:
    from concurrent import futures

    import grpc

    def say(request, context):
        return request

    def count(request, context):
        for i in range(int(request)):
            yield b"%d" % i

    def missing(request, context):
        context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    def slow(request, context):
        time.sleep(2)
        return request

    same = dict(request_deserializer=None, response_serializer=None)
    handler = grpc.method_handlers_generic_handler("demo.Echo", {
        "Say": grpc.unary_unary_rpc_method_handler(say, **same),
        "Count": grpc.unary_stream_rpc_method_handler(count, **same),
        "Missing": grpc.unary_unary_rpc_method_handler(missing, **same),
        "Slow": grpc.unary_unary_rpc_method_handler(slow, **same),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    kind, _, arg = scope["path"].strip("/").partition("/")
    status, body = (int(arg), b"status %s\n" % arg.encode()) if kind == "status" else (200, b"x" * int(arg))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve_hypercorn(tls: list[str] | None) -> None:
    import asyncio

    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    if tls:  # h2 over TLS, by ALPN
        config.certfile, config.keyfile = tls
    print(port, flush=True)
    asyncio.run(serve(asgi, config))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("server", choices=("grpc", "hypercorn"))
    ap.add_argument("--tag", default="sitsprobe-testserver")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="hypercorn: HTTPS (h2 by ALPN)")
    a = ap.parse_args()
    serve_grpc() if a.server == "grpc" else serve_hypercorn(a.tls)


if __name__ == "__main__":
    sys.exit(main())
