"""A paced HTTP/1.1 GET client: requests at a fixed rate over keep-alive connections.

    python bench/paced_client.py --url http://127.0.0.1:8080/index.html --rate 2000 \
        --seconds 5 [--conns 8]

wrk2 is not in Debian, and wrk sends as fast as it can, so bench_cost.py paces
its load with this. Request i of the run is due at start + i / rate; the
connections take the requests in turn (connection k sends i = k, k + conns,
...), each a thread with a blocking socket, sleeping until its next request is
due and sending it at once when it is late (it does not skip any, so a slow
server gets the same number of requests, later). Prints one JSON object:
requests sent and answered (2xx/3xx), errors, the rate achieved (answered over
the run's wall time), how many were sent over 1 ms late, and latency
percentiles (from send to the response's last byte; the time a late request
waited to be sent is not in it). Standard library only.
"""
from __future__ import annotations

import argparse
import json
import math
import socket
import sys
import threading
import time
from urllib.parse import urlsplit


class Conn:
    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.addr, self.request = (host, port), request
        self.sock: socket.socket | None = None
        self.buf = b""

    def get(self) -> int:
        """One request, its whole response read; the status code."""
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=10)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
        self.sock.sendall(self.request)
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise ValueError("chunked responses are not supported")
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        while len(self.buf) < length:
            self._more()
        self.buf = self.buf[length:]
        if close:
            self.close()
        return status

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def run(url: str, rate: float, seconds: float, conns: int) -> dict:
    u = urlsplit(url)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    request = f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUser-Agent: sitsprobe-paced\r\n\r\n".encode()
    total = int(rate * seconds)
    lat: list[list[float]] = [[] for _ in range(conns)]
    stats = [{"sent": 0, "ok": 0, "errors": 0, "late": 0} for _ in range(conns)]
    start = time.perf_counter() + 0.05  # every thread started before the first is due

    def worker(k: int) -> None:
        c, st, mine = Conn(u.hostname, u.port or 80, request), stats[k], lat[k]
        for i in range(k, total, conns):
            due = start + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            elif wait < -1e-3:
                st["late"] += 1
            t0 = time.perf_counter()
            st["sent"] += 1
            try:
                status = c.get()
            except (OSError, ValueError, IndexError) as e:
                st["errors"] += 1
                st.setdefault("error", f"{type(e).__name__}: {e}")
                c.close()
                continue
            mine.append(time.perf_counter() - t0)
            if 200 <= status < 400:
                st["ok"] += 1
            else:
                st["errors"] += 1
        c.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    out = {key: sum(s[key] for s in stats) for key in ("sent", "ok", "errors", "late")}
    errs = [s["error"] for s in stats if "error" in s]
    every = sorted(x for xs in lat for x in xs)

    def pct(p: float) -> float | None:
        return round(every[max(0, math.ceil(p * len(every)) - 1)] * 1e3, 3) if every else None

    out.update(url=url, rate=rate, conns=conns, requests=total, wall_s=round(wall, 3),
               achieved_rps=round(out["ok"] / wall, 1) if wall > 0 else None,
               p50_ms=pct(0.5), p99_ms=pct(0.99), first_error=errs[0] if errs else None)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--rate", type=float, required=True, help="requests per second")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--conns", type=int, default=8, help="keep-alive connections (default 8)")
    a = ap.parse_args(argv)
    if a.rate <= 0 or a.seconds <= 0 or a.conns < 1:
        ap.error("--rate and --seconds must be > 0, --conns >= 1")
    print(json.dumps(run(a.url, a.rate, a.seconds, a.conns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
