"""Servers no one here wrote, for the wire-edge tests, each run as a subprocess:

    python edge_peers.py asgi [--tls CERT KEY]   # uvicorn (h11, asyncio), HTTP/1.1 or over TLS
    python edge_peers.py grpc [--tls CERT KEY]   # grpcio, one unary method on raw bytes (HTTP/2),
                                                 # over TLS: grpcio's own BoringSSL

Each names its process (comm) after itself before it makes a thread, so the
agent's per-process labels tell the peers apart, prints its port, and serves
until killed. Its argv carries "sitsprobe-testserver" (--tag) so the agent can
select it by command line.

The ASGI app answers like httpserver.py: GET /status/NNN -> NNN, POST -> the
body back, anything else -> 200 "ok <path>\\n", always with a Content-Length;
/early -> 200 "early\\n" before the request's body is read.
The gRPC method is /sitsprobe.Greeter/SayHello: b"hello " + the request.
"""
from __future__ import annotations

import argparse
import ctypes
import socket
import subprocess
import sys
from pathlib import Path

TAG = "sitsprobe-testserver"
GREETER, SAY_HELLO = "sitsprobe.Greeter", "SayHello"
COMMS = {"asgi": "sp-edge-asgi", "tls": "sp-edge-tls", "grpc": "sp-edge-grpc", "grpcs": "sp-edge-grpcs"}


def name_process(comm: str) -> None:
    """prctl(PR_SET_NAME): threads made after this inherit the name."""
    ctypes.CDLL(None, use_errno=True).prctl(15, comm.encode()[:15], 0, 0, 0)


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/early":  # answered from the head: uvicorn reads (and drops) the body after
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"6")]})
        await send({"type": "http.response.body", "body": b"early\n"})
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    path = scope["path"]
    status = int(path.split("/")[2]) if path.startswith("/status/") else 200
    out = body if scope["method"] == "POST" else f"ok {path}\n".encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


def serve_asgi(tls: tuple[str, str] | None) -> None:
    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0), backlog=256)
    config = uvicorn.Config(app, http="h11", loop="asyncio", lifespan="off", log_level="warning",
                            access_log=False, timeout_keep_alive=600,
                            ssl_certfile=tls and tls[0], ssl_keyfile=tls and tls[1])
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(config).run(sockets=[sock])


def serve_grpc(tls: tuple[str, str] | None) -> None:
    from concurrent import futures

    import grpc

    def hello(request: bytes, context) -> bytes:
        return b"hello " + request

    handler = grpc.method_handlers_generic_handler(
        GREETER, {SAY_HELLO: grpc.unary_unary_rpc_method_handler(hello)})  # no (de)serializers: bytes
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
    if tls:
        cert, key = (open(f, "rb").read() for f in tls)
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


class Peer:
    """One of the servers above in a subprocess (argv: ... --tag sitsprobe-testserver)."""

    def __init__(self, kind: str, *args: str):
        self.kind = ("grpcs" if kind == "grpc" else "tls") if "--tls" in args else kind
        self.comm = COMMS[self.kind]
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__)), kind, *args, "--tag", TAG],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), f"{kind} peer did not start: {line!r}"
        self.port, self.pid = int(line), self.proc.pid

    def thread_comms(self) -> set[str]:
        """The process's name and each of its threads' now (a library may rename its threads)."""
        names = set()
        for f in Path(f"/proc/{self.pid}/task").glob("*/comm"):
            try:
                names.add(f.read_text().strip())
            except OSError:
                pass
        return names | {self.comm}

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("asgi", "grpc"))
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--tag", default=TAG)
    a = ap.parse_args()
    name_process(COMMS[("grpcs" if a.kind == "grpc" else "tls") if a.tls else a.kind])
    if a.kind == "grpc":
        serve_grpc(tuple(a.tls) if a.tls else None)
    else:
        serve_asgi(tuple(a.tls) if a.tls else None)


if __name__ == "__main__":
    sys.exit(main())
