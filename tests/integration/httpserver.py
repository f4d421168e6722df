"""A real HTTP/1.1 server for the integration tests, run as a subprocess.

    python httpserver.py --mode sendto|writev|sendmsg|write [--unix PATH]

Every mode reads with recv(2)/read(2) and answers keep-alive HTTP/1.1; the
mode picks the syscall that writes the response. It prints its port, then
serves until killed. Its argv carries "sitsprobe-testserver" so the agent can
select it by command line.

  GET  /status/NNN      -> status NNN, body "status NNN\n"
  POST /echo            -> 200, the request body back
  GET  /chunked/N       -> 200, N chunks (Transfer-Encoding: chunked)
  GET  /sse/N           -> 200, N server-sent events, then close
  GET  /hang            -> never answers (until the process dies)
  GET  /slow/MS         -> 200 after MS milliseconds
  GET  anything else    -> 200, "ok <path>\n"
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time


def send(sock: socket.socket, mode: str, parts: list[bytes]) -> None:
    if mode == "sendto":
        sock.sendall(b"".join(parts))
    elif mode == "writev":
        os.writev(sock.fileno(), parts)
    elif mode == "sendmsg":
        sock.sendmsg(parts)
    else:
        os.write(sock.fileno(), b"".join(parts))


def read_request(sock: socket.socket, mode: str, buf: bytearray) -> tuple[bytes, bytes] | None:
    while b"\r\n\r\n" not in buf:
        data = os.read(sock.fileno(), 65536) if mode == "write" else sock.recv(65536)
        if not data:
            return None
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        data = sock.recv(65536)
        if not data:
            return None
        rest += data
    buf[:] = rest[length:]
    return head, rest[:length]


def respond(sock: socket.socket, mode: str, head: bytes, body: bytes) -> bool:
    method, target = head.split(b" ")[:2]
    path = target.decode()
    if path == "/hang":
        time.sleep(3600)
    if path.startswith("/slow/"):
        time.sleep(int(path.rsplit("/", 1)[1]) / 1000)
    if path.startswith("/chunked/"):
        send(sock, mode, [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"])
        for i in range(int(path.rsplit("/", 1)[1])):
            chunk = f"chunk {i}\n".encode()
            send(sock, mode, [b"%x\r\n" % len(chunk), chunk, b"\r\n"])
        send(sock, mode, [b"0\r\n\r\n"])
        return True
    if path.startswith("/sse/"):
        send(sock, mode, [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          b"Connection: close\r\n\r\n"])
        for i in range(int(path.rsplit("/", 1)[1])):
            send(sock, mode, [f"data: token {i}\n\n".encode()])
        return False
    status = int(path.split("/")[2]) if path.startswith("/status/") else 200
    out = body if method == b"POST" else (f"status {status}\n" if status != 200 else f"ok {path}\n").encode()
    send(sock, mode, [f"HTTP/1.1 {status} X\r\nContent-Length: {len(out)}\r\n\r\n".encode(), out])
    return b"connection: close" not in head.lower()


def serve_conn(sock: socket.socket, mode: str) -> None:
    buf = bytearray()
    with sock:
        while (req := read_request(sock, mode, buf)) is not None:
            if not respond(sock, mode, *req):
                return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="sendto", choices=("sendto", "writev", "sendmsg", "write"))
    ap.add_argument("--tag", default="sitsprobe-testserver")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--unix", help="listen on this Unix socket path instead (prints port 0)")
    a = ap.parse_args()
    if a.unix:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(a.unix)
        srv.listen(256)
        print(0, flush=True)
    else:
        srv = socket.create_server((a.host, a.port), backlog=256)
        print(srv.getsockname()[1], flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve_conn, args=(conn, a.mode), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
