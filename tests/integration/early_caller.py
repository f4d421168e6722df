"""A caller whose every request is one send(): on a blocking socket that
send returns only once all its bytes have moved, so a server that answers
from the head does so before the kernel sees the call begin.

    python early_caller.py PORT POSTS [--each] [--nonblocking] [TAG]

waits for a line on stdin, then sends POSTS times ``POST /early`` with a
64 MiB body, on one kept-alive connection (with --each, a connection of its
own each), and prints each answer's status and body length (http.client
reads them). A connection's first call is answered before the kernel has
seen the connection do anything but connect. With --nonblocking each
connection is made as an event loop makes one: connect() returns at once
(EINPROGRESS) and the caller waits for the socket to be writable.

On a kept-alive connection the next request goes 0.1 s after an answer. A
server that reads whatever has come (uvicorn) may otherwise read the end of
one body and the next request at once, which the kernel takes for the body
(net.c: body_goes_on); nginx reads a body no further than its length.
"""
from __future__ import annotations

import errno
import http.client
import select
import socket
import sys
import time

BODY = b"x" * (64 << 20)


def dial(port: int, nonblocking: bool) -> socket.socket:
    if not nonblocking:
        return socket.create_connection(("127.0.0.1", port))  # blocking: no timeout
    s = socket.socket()
    s.setblocking(False)
    err = s.connect_ex(("127.0.0.1", port))
    if err not in (0, errno.EINPROGRESS):
        raise OSError(err, "connect")
    select.select([], [s], [], 10)
    if err := s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        raise OSError(err, "connect")
    s.setblocking(True)
    return s


def main() -> None:
    port, posts, each = int(sys.argv[1]), int(sys.argv[2]), "--each" in sys.argv
    sys.stdin.readline()
    post = b"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    s = None
    for _ in range(posts):
        if s is None:
            s = dial(port, "--nonblocking" in sys.argv)
        s.sendall(post)
        r = http.client.HTTPResponse(s, method="POST")
        r.begin()
        print(r.status, len(r.read()), flush=True)
        if each:
            s.close()
            s = None
        else:
            time.sleep(0.1)
    if s is not None:
        s.close()


if __name__ == "__main__":
    main()
