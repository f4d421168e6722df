"""HTTP/2 servers no one here wrote, for the HTTP/2 and gRPC tests.

    python h2_peers.py grpc|hypercorn|h2 --tag TAG [--tls CERT KEY]

prints its port on stdout's first line, then serves until killed.

grpc (grpcio, generic handlers: raw bytes, no generated code):
  /demo.Echo/Say      unary: the request back
  /demo.Echo/Count    server streaming: int(request) messages
  /demo.Echo/Missing  unary: aborts NOT_FOUND
  /demo.Echo/Slow     unary: answers after 2 s (the client's deadline is shorter)
  /demo.Echo/Drip     server streaming: int(request) messages, 50 ms apart
hypercorn (h2c with prior knowledge, plain ASGI):
  GET /status/NNN     status NNN, a short body
  GET /big/N          200, N bytes (DATA frames beyond the captured bytes)
h2 (the h2 library's server side, h2c with prior knowledge, under a thin
  socket loop here): the same paths, and
  GET /drip/N         200, N server-sent events, 50 ms apart (the loop ends the
                      connection once a write fails: its client has gone);
  DATA frames of at most 512 bytes, every write a sendmsg of 9-byte slices:
  a vectored write of hundreds of entries (grpc-core writes its frames as
  many small slices too)
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

    def drip(request, context):
        for i in range(int(request)):
            if i:
                time.sleep(0.05)
            yield b"%d" % i

    same = dict(request_deserializer=None, response_serializer=None)
    handler = grpc.method_handlers_generic_handler("demo.Echo", {
        "Say": grpc.unary_unary_rpc_method_handler(say, **same),
        "Count": grpc.unary_stream_rpc_method_handler(count, **same),
        "Missing": grpc.unary_unary_rpc_method_handler(missing, **same),
        "Slow": grpc.unary_unary_rpc_method_handler(slow, **same),
        "Drip": grpc.unary_stream_rpc_method_handler(drip, **same),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def _answer(path: str) -> tuple[int, bytes]:
    kind, _, arg = path.strip("/").partition("/")
    return (int(arg), b"status %s\n" % arg.encode()) if kind == "status" else (200, b"x" * int(arg))


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    status, body = _answer(scope["path"])
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


SLICE = 9  # a frame header fills the first entry of a write, as writev servers keep it
FRAME = 512  # DATA frames at most this long: a write of /big/N carries a frame header every 521 bytes


def serve_h2() -> None:
    import threading

    import h2.config
    import h2.connection
    import h2.events

    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def send(sock: socket.socket, data: bytes) -> None:
        while data:  # at most IOV_MAX (1024) entries a call
            data = data[sock.sendmsg([data[i:i + SLICE] for i in range(0, min(len(data), 1024 * SLICE), SLICE)]):]

    def serve(sock: socket.socket) -> None:
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        c.initiate_connection()
        unsent: dict[int, bytes] = {}  # stream -> the body's bytes its window has not let out yet
        with sock:
            send(sock, c.data_to_send())
            while data := sock.recv(65536):
                for ev in c.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived) and \
                            (path := dict(ev.headers)[b":path"].decode()).startswith("/drip/"):
                        c.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "text/event-stream")])
                        for i in range(int(path[6:])):
                            c.send_data(ev.stream_id, b"data: %d\n\n" % i)
                            try:
                                send(sock, c.data_to_send())
                            except OSError:  # the client has gone (EPIPE, ECONNRESET): close
                                return
                            time.sleep(0.05)
                        c.end_stream(ev.stream_id)
                    elif isinstance(ev, h2.events.RequestReceived):
                        status, body = _answer(path)
                        c.send_headers(ev.stream_id, [(":status", str(status)), ("content-type", "text/plain"),
                                                      ("content-length", str(len(body)))])
                        unsent[ev.stream_id] = body
                for stream, body in list(unsent.items()):
                    while body and (n := min(len(body), FRAME, c.local_flow_control_window(stream))):
                        c.send_data(stream, body[:n], end_stream=n == len(body))
                        body = body[n:]
                    if body:
                        unsent[stream] = body
                    else:
                        del unsent[stream]
                send(sock, c.data_to_send())

    while True:
        threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("server", choices=("grpc", "hypercorn", "h2"))
    ap.add_argument("--tag", default="sitsprobe-testserver")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="hypercorn: HTTPS (h2 by ALPN)")
    a = ap.parse_args()
    if a.server == "grpc":
        serve_grpc()
    elif a.server == "h2":
        serve_h2()
    else:
        serve_hypercorn(a.tls)


if __name__ == "__main__":
    sys.exit(main())
