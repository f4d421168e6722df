"""A caller whose every request is one send(): on a blocking socket that
send returns only once all its bytes have moved, so a server that answers
from the head does so before the kernel sees the call begin.

    python early_caller.py PORT POSTS [TAG]

waits for a line on stdin, then on one kept-alive connection sends POSTS
times ``POST /early`` with a 64 MiB body, and prints each answer's status
and body length (http.client reads them), 0.1 s apart. The first is the
connection's first call: the answer may come before the kernel has seen
the connection do anything but connect.
"""
from __future__ import annotations

import http.client
import socket
import sys
import time

BODY = b"x" * (64 << 20)


def main() -> None:
    port, posts = int(sys.argv[1]), int(sys.argv[2])
    sys.stdin.readline()
    post = b"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    with socket.create_connection(("127.0.0.1", port)) as s:  # blocking: no timeout
        for _ in range(posts):
            s.sendall(post)
            r = http.client.HTTPResponse(s, method="POST")
            r.begin()
            print(r.status, len(r.read()), flush=True)
            time.sleep(0.1)  # the server has read the body by the next request (net.c: body_goes_on)


if __name__ == "__main__":
    main()
