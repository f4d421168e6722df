"""Load generator for OpenAI-compatible servers (the reference engine, or any other).

    python examples/loadgen.py --url http://127.0.0.1:8000 --rate 5 --requests 50 --json out.json
    python examples/loadgen.py --url ... --users 4 --requests 40 --stream --turns 3 --shared-prefix 0.5

Open loop (--rate R): sessions arrive as a Poisson process at R per second, each on its own
thread, so a slow response never delays the next arrival. Closed loop (--users N): N users
each run sessions back to back. A session is --turns requests on one keep-alive connection;
with the chat API its messages grow turn by turn (the assistant's replies included), with
the completions API its prompt does. A --shared-prefix share of sessions starts with one
common system prompt (what a prefix cache can reuse). --requests counts HTTP requests.

TTFT is the time to the first server-sent event carrying text when streaming, and the whole
response otherwise. The JSON summary (also printed, without its records) holds the counts by
status, client latency and TTFT percentiles (successful requests), tokens in and out (from
`usage`), and one record per request: id, session, turn, status, start/end/ttft wall-clock
times, path, stream.

Only the standard library is used.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
from collections import Counter
from http.client import HTTPConnection, HTTPSConnection
from urllib.parse import urlsplit

SHARED_PREFIX = ("You are the assistant of a load test for sitsprobe. Answer in one short line, "
                 "plainly, without preamble.")
WORDS = ("kernel socket cache batch token prefix decode latency probe trace span metric queue "
         "tensor redis model window stream request server client agent buffer ring").split()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="open loop: sessions per second (Poisson arrivals)")
    mode.add_argument("--users", type=int, help="closed loop: concurrent users")
    p.add_argument("--requests", type=int, required=True, help="HTTP requests to send in all")
    p.add_argument("--stream", action="store_true", help="ask for server-sent events")
    p.add_argument("--shared-prefix", type=float, default=0.0, metavar="SHARE",
                   help="share (0..1) of sessions whose prompt starts with a common prefix")
    p.add_argument("--turns", type=int, default=1, help="requests per session")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--model", default="sitsprobe-tiny-gpt")
    p.add_argument("--seed", type=int, default=1, help="seed of arrivals and prompts")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument("--json", required=True, metavar="OUT", help="where to write the summary")
    args = p.parse_args(argv)
    if args.rate is not None and args.rate <= 0 or args.users is not None and args.users < 1:
        p.error("--rate must be > 0 and --users >= 1")
    if args.requests < 1 or args.turns < 1 or not 0 <= args.shared_prefix <= 1:
        p.error("--requests and --turns must be >= 1, --shared-prefix within 0..1")
    return args


class Client:
    """Sends one session's requests over one keep-alive connection; records each."""

    def __init__(self, args: argparse.Namespace, records: list, lock: threading.Lock, ids):
        self.args, self.records, self.lock, self.ids = args, records, lock, ids
        url = urlsplit(args.url)
        self.conn_class = HTTPSConnection if url.scheme == "https" else HTTPConnection
        self.netloc, self.base = url.netloc, url.path.rstrip("/")
        self.conn = None

    def session(self, index: int, turns: int) -> None:
        rng = random.Random(self.args.seed * 1_000_003 + index)
        shared = rng.random() < self.args.shared_prefix
        system = SHARED_PREFIX if shared else f"Session {index}: {' '.join(rng.choices(WORDS, k=4))}."
        messages = [{"role": "system", "content": system}]
        prompt = system + "\n"
        for turn in range(turns):
            question = " ".join(rng.choices(WORDS, k=rng.randint(3, 6))) + "?"
            messages.append({"role": "user", "content": question})
            prompt += question + "\n"
            body = {"model": self.args.model, "max_tokens": self.args.max_tokens,
                    "temperature": self.args.temperature, "stream": self.args.stream}
            if self.args.stream:
                body["stream_options"] = {"include_usage": True}
            if self.args.api == "chat":
                path, body["messages"] = "/v1/chat/completions", messages
            else:
                path, body["prompt"] = "/v1/completions", prompt
            reply = self.send(path, body, {"session": index, "turn": turn, "shared_prefix": shared})
            messages.append({"role": "assistant", "content": reply})
            prompt += reply + "\n"
        self.close()

    def send(self, path: str, body: dict, extra: dict) -> str:
        with self.lock:
            rid = next(self.ids)
        rec = {"id": rid, **extra, "path": path, "stream": self.args.stream, "status": None,
               "start": time.time(), "end": None, "ttft": None, "latency_s": None, "ttft_s": None,
               "prompt_tokens": 0, "completion_tokens": 0}
        t0 = time.perf_counter()
        text = ""
        try:
            if self.conn is None:
                self.conn = self.conn_class(self.netloc, timeout=self.args.timeout)
            self.conn.request("POST", self.base + path, body=json.dumps(body),
                              headers={"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            rec["status"] = resp.status
            if self.args.stream and resp.status == 200:
                text = self._read_events(resp, rec, t0)
            elif resp.status == 200:
                data = json.loads(resp.read())
                rec["ttft_s"], rec["ttft"] = time.perf_counter() - t0, time.time()
                choice = data["choices"][0]
                text = choice["message"]["content"] if "message" in choice else choice["text"]
                self._usage(rec, data.get("usage"))
            else:
                rec["error"] = self._error_message(resp.read())
            if resp.will_close:
                self.close()
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            # no response, or a broken one: an error, whatever the status line said
            rec["http_status"], rec["status"] = rec["status"], "error"
            rec["error"] = f"{type(e).__name__}: {e}"
            self.close()
        rec["latency_s"], rec["end"] = time.perf_counter() - t0, time.time()
        with self.lock:
            self.records.append(rec)
        return text

    @staticmethod
    def _error_message(data: bytes) -> str:
        try:
            return json.loads(data)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return data[:200].decode(errors="replace")

    @staticmethod
    def _usage(rec: dict, usage) -> None:
        if isinstance(usage, dict):
            rec["prompt_tokens"] = usage.get("prompt_tokens", 0)
            rec["completion_tokens"] = usage.get("completion_tokens", 0)

    def _read_events(self, resp, rec: dict, t0: float) -> str:
        parts = []
        for line in iter(resp.readline, b""):  # to the end of the body, so the connection stays usable
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            event = json.loads(payload)
            if "error" in event:
                rec["error"] = event["error"].get("message")
                continue
            self._usage(rec, event.get("usage"))
            for choice in event.get("choices") or ():
                piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if piece and rec["ttft"] is None:
                    rec["ttft_s"], rec["ttft"] = time.perf_counter() - t0, time.time()
                parts.append(piece)
        return "".join(parts)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def sessions(requests: int, turns: int) -> list[int]:
    """Turns of each session: full sessions, then one shorter to total ``requests``."""
    full, rest = divmod(requests, turns)
    return [turns] * full + ([rest] if rest else [])


def run(args: argparse.Namespace) -> dict:
    records: list[dict] = []
    lock, ids = threading.Lock(), iter(range(1, args.requests + 1))
    plan = sessions(args.requests, args.turns)
    threads = []
    started = time.perf_counter()
    if args.rate is not None:
        arrivals = random.Random(args.seed)
        due = started
        for index, turns in enumerate(plan):
            due += arrivals.expovariate(args.rate)
            time.sleep(max(0.0, due - time.perf_counter()))
            t = threading.Thread(target=Client(args, records, lock, ids).session, args=(index, turns), daemon=True)
            t.start()
            threads.append(t)
    else:
        queue = iter(enumerate(plan))

        def user():
            client = Client(args, records, lock, ids)
            while True:
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                client.session(*item)

        threads = [threading.Thread(target=user, daemon=True) for _ in range(args.users)]
        for t in threads:
            t.start()
    deadline = time.perf_counter() + args.timeout * args.turns + 5
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    return summarize(args, sorted(records, key=lambda r: r["id"]), time.perf_counter() - started)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(values)

    def rank(p: float) -> float:  # nearest rank
        return round(s[max(0, math.ceil(p * len(s)) - 1)], 6)

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "mean": round(sum(s) / len(s), 6)}


def summarize(args: argparse.Namespace, records: list[dict], duration: float) -> dict:
    ok = [r for r in records if r["status"] == 200]
    return {
        "url": args.url, "mode": "open" if args.rate is not None else "closed",
        "rate": args.rate, "users": args.users, "api": args.api, "stream": args.stream,
        "turns": args.turns, "shared_prefix": args.shared_prefix, "max_tokens": args.max_tokens,
        "requests": args.requests, "requests_sent": len(records),
        "by_status": dict(sorted(Counter(str(r["status"]) for r in records).items())),
        "duration_s": round(duration, 3),
        "throughput_rps": round(len(ok) / duration, 3) if duration > 0 else None,
        "latency_s": percentiles([r["latency_s"] for r in ok]),
        "ttft_s": percentiles([r["ttft_s"] for r in ok if r["ttft_s"] is not None]),
        "tokens_in": sum(r["prompt_tokens"] for r in records),
        "tokens_out": sum(r["completion_tokens"] for r in records),
        "records": records,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = run(args)
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
