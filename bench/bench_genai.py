"""What the GenAI wire capture and the run-queue hooks cost a streaming
inference server, per request, measured side by side in one run.

    sudo .venv/bin/python bench/bench_genai.py [--seconds 5] [--rounds 3] [--events 32] [--per-write 1]

The server is this file's --serve mode: a stdlib ThreadingHTTPServer (HTTP/1.1
keep-alive, TCP_NODELAY) answering POST /v1/chat/completions with an
OpenAI-shaped SSE stream (chunked, text/event-stream) and no sleeping: the
response head, --events content events, a final event with finish_reason and
usage, `data: [DONE]` and the last chunk, each in its own write: events + 4
writes a response. --per-write N puts N content events in each write (a
server catching up under load), so that the kernel counts the lines of the
writes longer than their peek (bpf/write_scan.h). wrk -t1 -c4 POSTs a ~600-byte body shaped like the openai
client's (model and max_tokens after the messages) from a Lua script.

Configurations, run in turn every round (a b c d e f, a b c d e f, ...) so that
the machine's noise is shared between them:

  (a)  no agent
  (b)  the agent tracing the server (select.cmdline), capture.genai false and
       stitch.run_queue false: the HTTP exchange capture alone
  (c)  capture.genai true, run_queue false: plus a POST's payload pieces (body
       start, request and response tails) and a ring-buffer event per response
       write, and userspace reading them into gen_ai.* attributes
  (d)  both true (the defaults): plus sched:sched_switch and sched_wakeup
  (e)  the agent tracing only an idle `sleep` (--pid), run_queue false; the
       server untraced
  (f)  the same with run_queue true: what the sched hooks cost a process the
       agent does not trace (they fire on every context switch of the node)

The agent is the CLI (`sitsprobe run --config FILE`, traces to a file, default
traces.max_per_second), started before each of (b)..(f) and stopped (SIGTERM)
after it, so (a) runs with none of its BPF attached. CPU comes from /proc
(psutil) for the server and the agent and from wait4() for wrk; the agent's
/metrics gives what the kernel counted, what was stitched and lost, and the
output tokens read from the wire. Helpers come from bench/bench_http.py.
Needs root and wrk.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import _med, code  # noqa: E402  (bench_protocols imports them from here)
from bench.bench_http import (  # noqa: E402
    SITSPROBE,
    Agent,
    BpfStats,
    Result,
    Wrk,
    _f,
    _first,
    _us,
    cpu_s,
    free_port,
    machine,
    run_wrk as _run_wrk,
    scrape,
    stop,
    sys_s,
    total,
    wait_until,
)

PATH = "/v1/chat/completions"
CONNS = 4
EXTRA_WRITES = 4  # head, final event (finish_reason + usage), [DONE], last chunk
PROMPT_TOKENS = 112  # what the final event's usage says (the server reads no tokens)

LABELS = {
    "a": "(a) no agent",
    "b": "(b) genai off, runq off",
    "c": "(c) genai on, runq off",
    "d": "(d) genai on, runq on",
    "e": "(e) idle pid, runq off",
    "f": "(f) idle pid, runq on",
}
TRACED = ("b", "c", "d")
IDLE = ("e", "f")
WIRE_LOSSES = ("write_ring_full", "payload_table_full")  # the exchange itself still arrives
CAPTURE = {"b": (False, False), "c": (True, False), "d": (True, True),  # (genai, run_queue)
           "e": (True, False), "f": (True, True)}

LEGEND = """\
req/s: wrk's, median over rounds, and its range; vs(a): the median of each
round's req/s over that round's (a). p50, p99: wrk's (to the stream's end),
medians. CPU us per request (= ms per 1000 requests): user+sys time over the
measured run divided by wrk's request count, for the server, the agent (from
wrk's start until it has stitched, or counted as lost, all the kernel
counted) and wrk; "all" is their sum. agent us/wr: the agent's CPU per
response write ((b) gets no write events: its figure is the baseline for (c)
and (d)). sys srv/wrk: the system part of the server's and wrk's time, where
BPF programs run."""


# -- the streaming server (--serve) ----------------------------------------------

def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def stream_writes(events: int) -> tuple[bytes, bytes, bytes, bytes]:
    """The writes after the head: a content event (written `events` times),
    the final event, [DONE] and the last chunk."""
    token = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"bench",'
             b'"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n')
    final = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"bench",'
             b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
             b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
             % (PROMPT_TOKENS, events, PROMPT_TOKENS + events))
    return chunk(token), chunk(final), chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"


def serve(port: int, events: int, per_write: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    token, final, done, last = stream_writes(events)
    writes = [token * min(per_write, events - i) for i in range(0, events, per_write)]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive
        disable_nagle_algorithm = True  # TCP_NODELAY, as production servers set

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != PATH:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()  # one write (wfile is unbuffered: one sendall a write)
            write = self.wfile.write
            for w in writes:
                write(w)
            write(final)
            write(done)
            write(last)

        def log_message(self, *_args):
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def request_body(size: int = 600) -> bytes:
    """A chat request the way the openai client sends it: messages first, then
    model and the other parameters; the user message padded to `size` bytes."""
    def body(pad: int) -> bytes:
        return json.dumps({
            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "Summarise this text: " + "lorem ipsum " * pad}],
            "model": "bench", "max_tokens": 64, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.7,
        }, separators=(",", ":")).encode()
    pad = 0
    while len(body(pad + 1)) <= size:
        pad += 1
    return body(pad)


def lua_script(body: bytes) -> str:
    return ("wrk.method = \"POST\"\n"
            f"wrk.body = [==[{body.decode()}]==]\n"
            "wrk.headers[\"Content-Type\"] = \"application/json\"\n"
            "wrk.headers[\"Accept\"] = \"application/json\"\n"
            "wrk.headers[\"Authorization\"] = \"Bearer sk-bench\"\n"
            "wrk.headers[\"User-Agent\"] = \"OpenAI/Python 1.54.0\"\n")


def start_server(tmp: Path, port: int, events: int, tag: str, per_write: int = 1) -> subprocess.Popen:
    with open(tmp / "server.log", "w") as log:  # wrk's resets at the end of each run may print there
        p = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--events", str(events),
                              "--per-write", str(per_write), "--tag", tag], stdout=log, stderr=subprocess.STDOUT)
    wait_until(lambda: _streams(port), 15, f"the stream server on :{port}")
    return p


def _streams(port: int) -> bool:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{PATH}", data=request_body(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=1) as r:
            return r.status == 200 and b"data: [DONE]" in r.read()
    except OSError:
        return False


# -- load -------------------------------------------------------------------------

def run_wrk(url: str, script: Path, seconds: float) -> Wrk:
    """bench_http.run_wrk with a Lua script (wrk -s): POST and a body."""
    return _run_wrk(url, CONNS, seconds, script=script)


# -- one measurement --------------------------------------------------------------

def agent_config(tmp: Path, config: str, tag: str) -> Path:
    """The agent's config file for a configuration (JSON is YAML); checked with
    `sitsprobe config` so that a bad key fails here, not mid-run."""
    genai, run_queue = CAPTURE[config]
    doc = {"capture": {"genai": genai}, "stitch": {"run_queue": run_queue}}
    if config in TRACED:
        doc["select"] = {"cmdline": [tag]}  # in the server's command line only
    path = tmp / f"agent-{config}.yaml"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    subprocess.run([str(SITSPROBE), "config", "-c", str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


class StreamAgent(Agent):
    """bench_http's Agent, counting as lost only what leaves an exchange
    unstitched, so that `settled` waits for the agent's backlog of exchanges:
    a lost write event (write_ring_full) or payload (payload_table_full) still
    leaves its exchange to stitch. Those two are in `wire_counts`."""

    def counts(self) -> dict[str, float]:
        m = scrape(self.port)
        lost = sum(v for labels, v in m.get("sitsprobe_events_lost_total", [])
                   if labels.get("reason") not in WIRE_LOSSES)
        return {"kernel": total(m, "sitsprobe_http_server_requests_total"),
                "stitched": total(m, "sitsprobe_requests_stitched_total"),
                "lost": lost, "traced": total(m, "sitsprobe_traces_total", outcome="sampled")}

    def wire_counts(self) -> dict[str, float]:
        """What the GenAI reading produced, and each loss reason."""
        m = scrape(self.port)
        out = {"out_tokens": total(m, "gen_ai_server_tokens_total", gen_ai_token_type="output"),
               "ttft": total(m, "gen_ai_server_time_to_first_token_seconds_count"),
               "writes_read": total(m, "sitsprobe_write_events_received_total")}
        for labels, v in m.get("sitsprobe_events_lost_total", []):
            key = f"lost:{labels.get('reason', '?')}"
            out[key] = out.get(key, 0) + v
        return out


def measure(config: str, rnd: int, url: str, script: Path, a: argparse.Namespace,
            server: psutil.Process, agent: StreamAgent | None) -> Result:
    warm = run_wrk(url, script, a.warmup).requests if a.warmup > 0 else 0
    if agent:
        agent.settled()  # the warm-up's backlog, outside the measured window
        before, wire0 = agent.counts(), agent.wire_counts()
        a0 = cpu_s(agent.ps)
    s0, k0 = cpu_s(server), sys_s(server)
    stats = BpfStats(agent.prog_ids if agent else set())
    if stats.prog_ids:
        with stats:
            w = run_wrk(url, script, a.seconds)
    else:
        w = run_wrk(url, script, a.seconds)
    r = Result("genai", config, rnd, w, cpu_s(server) - s0, sys_s(server) - k0,
               warmup_requests=warm, bpf=stats.delta)
    line = (f"  round {rnd}  {LABELS[config]:24} {w.rps:7.0f} req/s  p50 {w.p50_ms:5.2f} ms"
            f"  p99 {w.p99_ms:6.2f} ms")
    if agent:
        r.counts, r.catch_up_s = agent.settled(before, w.requests if config in TRACED else 0)
        r.agent_cpu_s = cpu_s(agent.ps) - a0
        r.agent_startup_s = agent.startup_s
        wire1 = agent.wire_counts()
        r.counts.update({k: v - wire0.get(k, 0) for k, v in wire1.items()})
        line += f"  (agent up in {agent.startup_s:.1f} s)"
    print(line, flush=True)
    return r


# -- report -----------------------------------------------------------------------

def _rows(results: list[Result], config: str) -> list[Result]:
    return [r for r in results if r.config == config]


def _ratios(results: list[Result], config: str, base: str = "a") -> list[float]:
    ref = {r.round: r.wrk.rps for r in _rows(results, base)}
    return [r.wrk.rps / ref[r.round] for r in _rows(results, config) if r.round in ref]


def table(results: list[Result], configs: list[str], writes: int) -> list[str]:
    out = [f"{'':23} {'':15} {'':5} {'':11} | {'CPU us per request':^23} | {'agent':>5} {'sys':>7}",
           (f"{'config':23} {'req/s    range':>15} {'vs(a)':>5} {'p50ms p99ms':>11} |"
            f" {'srv':>5} {'agent':>5} {'wrk':>4} {'all':>5} | {'us/wr':>5} {'srv/wrk':>7}")]
    for c in configs:
        rs = _rows(results, c)
        if not rs:
            continue
        rps = [r.wrk.rps for r in rs]
        spread = f"{min(rps):.0f}-{max(rps):.0f}" if len(rs) > 1 else ""
        srv = _med(_us(r.server_cpu_s, r.wrk.requests) for r in rs)
        agent = _med(_us(r.agent_cpu_s, r.wrk.requests) for r in rs)
        wrk = _med(_us(r.wrk.cpu_s, r.wrk.requests) for r in rs)
        sys_ = (f"{_med(_us(r.server_sys_s, r.wrk.requests) for r in rs):.0f}"
                f"/{_med(_us(r.wrk.sys_s, r.wrk.requests) for r in rs):.0f}")
        out.append(
            f"{LABELS[c]:23} {_med(rps):5.0f} {spread:>9} {_med(_ratios(results, c)):5.2f}"
            f" {_med(r.wrk.p50_ms for r in rs):5.2f} {_med(r.wrk.p99_ms for r in rs):5.2f} |"
            f" {srv:5.0f} {_f(agent, '5.0f')} {wrk:4.0f} {srv + (agent or 0) + wrk:5.0f} |"
            f" {_f(agent / writes if c in TRACED else None, '5.2f')} {sys_:>7}")
    lost = []
    for c in configs:
        rs = [r for r in _rows(results, c) if c in TRACED and r.counts.get("kernel")]
        if rs:
            ex = _med(r.counts["lost"] / r.counts["kernel"] for r in rs)
            wr = _med(r.counts.get("lost:write_ring_full", 0) / (r.counts["kernel"] * writes) for r in rs)
            lost.append(f"{c} {ex:.0%}/{wr:.0%}")
    return out + ["events lost, exchanges/writes (median share): " + ", ".join(lost)] if lost else out


def differences(results: list[Result], writes: int) -> list[str]:
    """Per-round differences of CPU per request, then their median: what
    turning one thing on added, for the server (all of it in-kernel: the
    probes) and for the agent."""
    def per_round(config, field):
        return {r.round: _us(getattr(r, field), r.wrk.requests) for r in _rows(results, config)}

    out = []
    for hi, lo, what in (("c", "b", "GenAI capture (c)-(b)"), ("d", "c", "run-queue hooks (d)-(c)")):
        parts = []
        for field, who in (("server_cpu_s", "server"), ("server_sys_s", "of it sys"), ("agent_cpu_s", "agent")):
            h, lw = per_round(hi, field), per_round(lo, field)
            d = _med(h[k] - lw[k] for k in h.keys() & lw.keys() if h[k] is not None and lw[k] is not None)
            if d is not None:
                parts.append(f"{who} {d:+.1f} us/req ({d / writes:+.2f} us/write)")
        ratio = _ratios(results, hi, lo)
        if parts and ratio:
            out.append(f"{what}: req/s x{_med(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f});")
            out.append("  " + ", ".join(parts))
    return out


def accounting(results: list[Result]) -> list[str]:
    out = [(f"{'run':5} {'wrk reqs':>8} {'kernel':>6} {'k-wrk':>5} {'stitched':>8} {'lost':>5}"
            f" {'wr read':>7} {'wr lost':>7} {'traced':>6} {'tok/req':>7} {'ttft':>6} {'CPU s':>5} {'us/st':>5}"
            f" {'us/wr':>5} {'lag s':>5}")]
    notes = []
    for r in results:
        if r.agent_cpu_s is None:
            continue
        k = r.counts
        diff = f"{k['kernel'] - r.wrk.requests:5.0f}" if r.config in TRACED else f"{'-':>5}"
        tok = f"{k['out_tokens'] / k['stitched']:7.1f}" if k.get("stitched") else f"{'-':>7}"
        out.append(f"{r.config + ' r' + str(r.round):5} {r.wrk.requests:8d} {k['kernel']:6.0f} {diff}"
                   f" {k['stitched']:8.0f} {k['lost']:5.0f} {k.get('writes_read', 0):7.0f}"
                   f" {k.get('lost:write_ring_full', 0):7.0f}"
                   f" {k['traced']:6.0f} {tok} {k.get('ttft', 0):6.0f} {r.agent_cpu_s:5.2f}"
                   f" {_f(_us(r.agent_cpu_s, k['stitched']) if k['stitched'] else None, '5.0f')}"
                   f" {_f(_us(r.agent_cpu_s, k['writes_read']) if k.get('writes_read') else None, '5.1f')}"
                   f" {_f(r.catch_up_s, '5.1f')}")
        notes += [f"  {r.config} r{r.round}: {name[5:]} {v:.0f}" for name, v in k.items()
                  if name.startswith("lost:") and v]
    return out + (["losses by reason:", *notes] if notes else [])


def bpf_lines(results: list[Result], config: str, top: int = 10) -> list[str]:
    """--bpf-stats: the agent's programs during one configuration, per request."""
    rs = [r for r in _rows(results, config) if r.bpf]
    if not rs:
        return []
    reqs = sum(r.wrk.requests for r in rs)
    names: dict[str, list[int]] = {}
    for r in rs:
        for name, (ns, cnt) in r.bpf.items():
            acc = names.setdefault(name, [0, 0])
            acc[0] += ns
            acc[1] += cnt
    out = [f"{LABELS[config]}: BPF run time {sum(n for n, _ in names.values()) / reqs:.0f} ns per request",
           f"  {'program':40} {'runs/req':>8} {'ns/run':>7} {'ns/req':>7}"]
    for name, (ns, cnt) in sorted(names.items(), key=lambda kv: -kv[1][0])[:top]:
        if cnt:
            out.append(f"  {name[:40]:40} {cnt / reqs:8.2f} {ns / cnt:7.0f} {ns / reqs:7.0f}")
    return out


# -- main -------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5, help="wrk duration of each measurement (default 5)")
    ap.add_argument("--rounds", type=int, default=3, help="times each configuration is measured (default 3)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="wrk seconds before each measurement, 0 = none (default 1)")
    ap.add_argument("--events", type=int, default=32,
                    help="content events per streamed response (default 32)")
    ap.add_argument("--per-write", type=int, default=1,
                    help="content events a write (default 1: one each, as servers write them)")
    ap.add_argument("--no-idle", action="store_true",
                    help="skip (e) and (f), the untraced-server runs (two agent starts a round fewer)")
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time each of the agent's BPF programs (kernel.bpf_stats_enabled) "
                         "during (b)..(f); adds a little in-kernel cost of its own")
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the server itself
    ap.add_argument("--tag", help=argparse.SUPPRESS)  # in the server's command line, for select.cmdline
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.events, a.per_write)
        return 0
    if os.geteuid() != 0:
        print("bench_genai: run as root (the agent loads BPF)", file=sys.stderr)
        return 2
    for tool in ("wrk",) + (("bpftool",) if a.bpf_stats else ()):
        if not shutil.which(tool):
            print(f"bench_genai: {tool} is not installed (scripts/setup.sh installs it)", file=sys.stderr)
            return 2

    writes = -(-a.events // a.per_write) + EXTRA_WRITES
    body = request_body()
    argv = " ".join(shlex.quote(x) for x in sys.argv[1:])
    env = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get("PYTHONPATH") else ""
    print(f"reproduce: cd {ROOT} && {env}.venv/bin/python bench/bench_genai.py {argv}".rstrip())
    print(machine()[0])
    print(f"         python {sys.version.split()[0]}, wrk {_first(['wrk', '-v']).split()[1]}")
    print(f"code: {code()}")
    print(f"each measurement: {a.warmup:g} s wrk warm-up, then {a.seconds:g} s measured; "
          f"{a.rounds} round(s), configurations interleaved\n", flush=True)

    configs = ["a", *TRACED, *([] if a.no_idle else IDLE)]
    tmp = Path(tempfile.mkdtemp(prefix="sitsprobe-bench-genai-"))
    tag = f"sitsprobe-bench-genai-{os.getpid()}"
    script = tmp / "chat.lua"
    script.write_text(lua_script(body))
    confs = {c: agent_config(tmp, c, tag) for c in configs if c != "a"}
    results: list[Result] = []
    port = free_port()
    url = f"http://127.0.0.1:{port}{PATH}"
    idle = subprocess.Popen(["sleep", "86400"])  # (e)/(f): a process the agent tracks that never talks
    server = None
    try:
        server = start_server(tmp, port, a.events, tag, a.per_write)
        srv = psutil.Process(server.pid)
        for rnd in range(1, a.rounds + 1):
            for c in configs:
                agent = None
                if c != "a":
                    follow = server.pid if c in TRACED else idle.pid
                    select = ["--config", str(confs[c])] + ([] if c in TRACED else ["--pid", str(idle.pid)])
                    agent = StreamAgent(select, [follow], tmp, f"{c}-r{rnd}", a.bpf_stats)
                try:
                    if agent and agent.tracked() != {follow}:
                        print(f"  warning: {c} r{rnd}: the agent tracks {sorted(agent.tracked())}", flush=True)
                    results.append(measure(c, rnd, url, script, a, srv, agent))
                finally:
                    if agent:
                        agent.stop()
    finally:
        for p in (server, idle):
            if p:
                stop(p)

    print(f"\nload avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nstdlib ThreadingHTTPServer streaming {a.events} SSE events ({writes} writes a response),"
          f"\nwrk -t1 -c{CONNS} POST {PATH} ({len(body)}-byte body), median of {a.rounds} x {a.seconds:g} s")
    print("\n".join(table(results, configs, writes)))
    print("\n".join(differences(results, writes)))
    if not a.no_idle:
        fe = _ratios(results, "f", "e")
        print(f"untraced server, run-queue hooks on (f)/(e): req/s x{_med(fe):.2f}"
              f" ({min(fe):.2f}-{max(fe):.2f})")
    print(f"\n{LEGEND}")
    print(f"\nagent accounting per run: counter deltas over the measured wrk run. kernel:\n"
          f"responses counted in BPF; k-wrk: those wrk did not count (0..{CONNS}: wrk stops\n"
          f"with requests in flight); stitched; lost: exchanges lost\n"
          f"(sitsprobe_events_lost_total, every reason but write_ring_full and\n"
          f"payload_table_full); wr read: response write events the agent read\n"
          f"(sitsprobe_write_events_received_total); wr lost: those lost (write_ring_full);\n"
          f"traced: spans exported; tok/req: gen_ai output tokens read from the wire per\n"
          f"stitched request ({a.events} when the usage was read, 0 with genai off); ttft:\n"
          f"requests given a time to first token; CPU s: the agent's; us/st: per stitched\n"
          f"request; us/wr: per write event read (all of its CPU, the requests' work\n"
          f"included; where runs lose different shares of the writes, us/st alone misleads);\n"
          f"lag s: how long after wrk stopped it needed to stitch everything")
    print("\n".join(accounting(results)))
    for c in configs:
        if lines := bpf_lines(results, c):
            print("\n" + "\n".join(lines))
    bad = [r for r in results if r.wrk.errors]
    if bad:
        print("\nwrk errors: " + ", ".join(f"{r.config} r{r.round}: {r.wrk.errors}" for r in bad))
    print(f"\nlogs, traces, agent configs and results.json: {tmp}")
    (tmp / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
