"""What sitsprobe costs an HTTP server, measured side by side in one run.

    sudo .venv/bin/python bench/bench_http.py [--seconds 5] [--rounds 2]

Two servers, each driven by wrk, each in several configurations run in turn
(a b b' c, a b b' c, ...) so that the machine's noise is shared between them:

  python  examples/hello_server.py's handler (stdlib ThreadingHTTPServer,
          keep-alive, TCP_NODELAY), wrk -t1 -c4 on /v1/items/1
    (a)   no agent
    (b)   the sitsprobe agent (CLI, --port, default sampling, traces to a file)
    (b')  the agent with its BPF loaded, tracing an idle process (--pid of a
          sleep): what the probes cost a process they do not follow
    (c)   no agent; the handler instrumented in-process with opentelemetry-sdk
          (bench/otel_hello_server.py: a SERVER span per request,
          BatchSpanProcessor, one JSON span per line to a file)
  nginx   one worker, a 380-byte static file, access_log off, wrk -t1 -c16
    (a) (b) (b') as above

The agent is started before each (b)/(b') measurement and stopped after it
(SIGTERM: it detaches every probe and exits), so (a) and (c) run with none of
its BPF attached. CPU is read from /proc (psutil) for the server and the
agent around each wrk run, and from wait4() for wrk itself. For (b) the
agent's metrics endpoint gives its in-kernel response count, what it stitched
and what it lost, to compare with wrk's tally. Needs root, wrk and nginx.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# the shared helpers live in bench/_common.py; importing them here keeps
# `from bench.bench_http import Agent, run_wrk, ...` (bench_genai, bench_protocols, bench_idle) working
from bench._common import (  # noqa: E402,F401
    SITSPROBE,
    Agent,
    BpfStats,
    Wrk,
    _answers_static,
    _dur,
    _first,
    bpf_programs,
    cpu_s,
    free_port,
    machine,
    run_wrk,
    scrape,
    start_nginx,
    stop,
    sys_s,
    total,
    wait_until,
)

BENCH = Path(__file__).resolve().parent

LABELS = {
    "a": "(a) no agent",
    "b": "(b) sitsprobe agent",
    "b'": "(b') agent, idle pid",
    "c": "(c) in-process OTel",
}
LEGEND = """\
req/s, p50, p99: wrk's. vs(a): req/s over the same round's (a), mean and range
over rounds. CPU us per request (= ms per 1000 requests): user+sys time of the
server (nginx: its worker), the agent (from wrk's start until it has stitched
everything) and wrk, divided by wrk's request count; "all" is their sum. With
every process CPU-bound on a small machine, req/s ~ cores / "all".
kernel-side (sys): the system part of srv and wrk; BPF programs run there, in
the context of the process making the syscall, traced or not."""


# -- helpers --------------------------------------------------------------------

def filler_headers(n: int) -> list[str]:
    """n 40-byte headers, then a traceparent: a request head the size real
    clients send (the openai client's is ~600 bytes), past capture.request_bytes,
    so the kernel searches it for the trace context."""
    tp = "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    return [f"x-filler-{i:02d}: {'f' * 26}" for i in range(n)] + ([tp] if n else [])


# -- one measurement ------------------------------------------------------------

@dataclass
class Result:
    group: str
    config: str
    round: int
    wrk: Wrk
    server_cpu_s: float
    server_sys_s: float
    agent_cpu_s: float | None = None
    agent_startup_s: float | None = None
    counts: dict[str, float] = field(default_factory=dict)
    warmup_requests: int = 0
    catch_up_s: float | None = None
    bpf: dict[str, list[int]] = field(default_factory=dict)  # --bpf-stats: name -> [ns, runs]


def measure(group: str, config: str, rnd: int, url: str, conns: int, seconds: float, warmup: float,
            server: psutil.Process, agent: Agent | None = None, headers: list[str] = ()) -> Result:
    warm = run_wrk(url, conns, warmup, headers).requests if warmup > 0 else 0
    if agent:
        agent.settled()  # let the agent work off the warm-up's backlog outside the measured window
    before = agent.counts() if agent else None
    s0, k0 = cpu_s(server), sys_s(server)
    a0 = cpu_s(agent.ps) if agent else None
    stats = BpfStats(agent.prog_ids if agent else set())
    if stats.prog_ids:
        with stats:
            w = run_wrk(url, conns, seconds, headers)
    else:
        w = run_wrk(url, conns, seconds, headers)
    s1, k1 = cpu_s(server), sys_s(server)
    r = Result(group, config, rnd, w, s1 - s0, k1 - k0, warmup_requests=warm, bpf=stats.delta)
    if agent:
        # the agent's CPU includes catching up on its backlog after wrk stops
        r.counts, r.catch_up_s = agent.settled(before, w.requests if config == "b" else 0)
        r.agent_cpu_s = cpu_s(agent.ps) - a0
        r.agent_startup_s = agent.startup_s
    line = (f"  {group:6} round {rnd}  {LABELS[config]:22} {w.rps:8.0f} req/s  p50 {w.p50_ms:6.2f} ms"
            f"  p99 {w.p99_ms:6.2f} ms")
    if agent:
        line += f"  (agent up in {agent.startup_s:.1f} s)"
    print(line, flush=True)
    return r


# -- servers --------------------------------------------------------------------

def start_python(tmp: Path, port: int, extra: list[str], tag: str) -> subprocess.Popen:
    log = open(tmp / f"{tag}.log", "w")  # wrk's resets at the end of each run print tracebacks
    p = subprocess.Popen([sys.executable, str(BENCH / "otel_hello_server.py"), str(port), *extra],
                         stdout=log, stderr=subprocess.STDOUT)
    wait_until(lambda: _answers(port), 15, f"the {tag} server on :{port}")
    return p


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/items/1", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


# -- report ---------------------------------------------------------------------

def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _us(cpu, reqs):
    return None if cpu is None else cpu / reqs * 1e6


def _f(v, fmt):
    return format("-", f">{fmt.split('.')[0]}") if v is None else format(v, fmt)


def table(results: list[Result], group: str, configs: list[str]) -> list[str]:
    """Means over the rounds; "vs (a)" is the mean of each round's ratio to that round's (a)."""
    base = {r.round: r.wrk.rps for r in results if r.group == group and r.config == "a"}
    out = [f"{'':20} {'':6} {'':5} {'':9} {'':>5} {'':>6} | {'CPU us per request':>23}",
           f"{'config':20} {'req/s':>6} {'vs(a)':>5} {'range':>9} {'p50ms':>5} {'p99ms':>6} |"
           f" {'srv':>5} {'agent':>5} {'wrk':>4} {'all':>5}"]
    for c in configs:
        rs = [r for r in results if r.group == group and r.config == c]
        ratios = [r.wrk.rps / base[r.round] for r in rs]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 and c != "a" else ""
        srv = _mean(_us(r.server_cpu_s, r.wrk.requests) for r in rs)
        agent = _mean(_us(r.agent_cpu_s, r.wrk.requests) for r in rs)
        wrk = _mean(_us(r.wrk.cpu_s, r.wrk.requests) for r in rs)
        out.append(
            f"{LABELS[c]:20} {_mean(r.wrk.rps for r in rs):6.0f} {_mean(ratios):5.2f} {spread:>9}"
            f" {_mean(r.wrk.p50_ms for r in rs):5.2f} {_mean(r.wrk.p99_ms for r in rs):6.2f} |"
            f" {srv:5.1f} {_f(agent, '5.1f')} {wrk:4.1f} {srv + (agent or 0) + wrk:5.1f}")
    kern = []
    for c in configs:
        rs = [r for r in results if r.group == group and r.config == c]
        kern.append(f"{c} {_mean(_us(r.server_sys_s, r.wrk.requests) for r in rs):.1f}"
                    f"/{_mean(_us(r.wrk.sys_s, r.wrk.requests) for r in rs):.1f}")
    out.append("kernel-side (sys) us/req srv/wrk: " + ", ".join(kern))
    return out


def bpf_table(results: list[Result], group: str, config: str, top: int = 12) -> list[str]:
    """--bpf-stats: where the in-kernel time of one configuration went, per request."""
    rs = [r for r in results if r.group == group and r.config == config and r.bpf]
    if not rs:
        return []
    reqs = sum(r.wrk.requests for r in rs)
    names: dict[str, list[int]] = {}
    for r in rs:
        for name, (ns, cnt) in r.bpf.items():
            acc = names.setdefault(name, [0, 0])
            acc[0] += ns
            acc[1] += cnt
    rows = sorted(names.items(), key=lambda kv: -kv[1][0])
    total_ns = sum(ns for ns, _ in names.values())
    out = [f"{group} {LABELS[config]}: BPF run time {total_ns / reqs:.0f} ns per request, "
           f"server and client together",
           f"  {'program':40} {'runs/req':>8} {'ns/run':>7} {'ns/req':>7}"]
    for name, (ns, cnt) in rows[:top]:
        if cnt:
            out.append(f"  {name[:40]:40} {cnt / reqs:8.2f} {ns / cnt:7.0f} {ns / reqs:7.0f}")
    return out


def accounting(results: list[Result]) -> list[str]:
    out = [f"{'run':14} {'wrk reqs':>8} {'kernel':>7} {'k-wrk':>5} {'stitched':>8} {'lost':>4}"
           f" {'traced':>6} {'CPU s':>5} {'ms/1k':>5} {'lag s':>5}"]
    for r in results:
        if r.agent_cpu_s is None:
            continue
        k = r.counts
        diff = f"{k['kernel'] - r.wrk.requests:5.0f}" if r.config == "b" else f"{'-':>5}"
        out.append(f"{r.group + ' ' + r.config + ' r' + str(r.round):14} {r.wrk.requests:8d}"
                   f" {k['kernel']:7.0f} {diff} {k['stitched']:8.0f}"
                   f" {k['lost']:4.0f} {k['traced']:6.0f} {r.agent_cpu_s:5.2f}"
                   f" {r.agent_cpu_s / r.wrk.requests * 1e6:5.0f} {_f(r.catch_up_s, '5.1f')}")
    return out


# -- main -----------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5, help="wrk duration of each measurement (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="times each configuration is measured (default 2)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="wrk seconds before each measurement, 0 = none (default 1)")
    ap.add_argument("--only", choices=("python", "nginx"), help="one server only")
    ap.add_argument("--no-idle", action="store_true",
                    help="skip the (b') runs (two agent starts a round fewer)")
    ap.add_argument("--nagle", action="store_true",
                    help="serve the Python handler with Nagle on, as examples/hello_server.py does "
                         "(then every response stalls ~40 ms on a delayed ACK: see bench/README.md)")
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time each of the agent's BPF programs (kernel.bpf_stats_enabled) "
                         "during (b) and (b'); adds a little in-kernel cost of its own")
    ap.add_argument("--headers", type=int, default=0, metavar="N",
                    help="send N 40-byte headers and a traceparent with every request (a head "
                         "past capture.request_bytes: what the trace-context search costs)")
    a = ap.parse_args()
    headers = filler_headers(a.headers)
    if os.geteuid() != 0:
        print("bench_http: run as root (the agent loads BPF; nginx runs as root)", file=sys.stderr)
        return 2
    for tool in ("wrk", "nginx") + (("bpftool",) if a.bpf_stats else ()):
        if not shutil.which(tool):
            print(f"bench_http: {tool} is not installed (scripts/setup.sh installs it)", file=sys.stderr)
            return 2

    argv = " ".join(shlex.quote(x) for x in sys.argv[1:])
    print(f"reproduce: cd {ROOT} && .venv/bin/python bench/bench_http.py {argv}".rstrip())
    for line in machine():
        print(line)
    print(f"each measurement: {a.warmup:g} s wrk warm-up, then {a.seconds:g} s measured; "
          f"{a.rounds} round(s), configurations interleaved\n", flush=True)

    configs_py = ["a", "b"] + ([] if a.no_idle else ["b'"]) + ["c"]
    configs_ng = ["a", "b"] + ([] if a.no_idle else ["b'"])
    results: list[Result] = []
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="sitsprobe-bench-"))
    idle = subprocess.Popen(["sleep", "86400"])  # (b'): a process the agent tracks that never talks
    procs.append(idle)
    spans = tmp / "otel-spans.jsonl"
    otel_sent = 0
    try:
        if a.only in (None, "python"):
            nagle = ["--nagle"] if a.nagle else []
            plain_port, otel_port = free_port(), free_port()
            plain = start_python(tmp, plain_port, ["--plain", *nagle], "python-plain")
            procs.append(plain)
            otel = start_python(tmp, otel_port, ["--spans-file", str(spans), *nagle], "python-otel")
            procs.append(otel)
            otel_sent += 1  # the readiness probe
            servers = {"a": (plain_port, plain), "b": (plain_port, plain), "b'": (plain_port, plain),
                       "c": (otel_port, otel)}
            for rnd in range(1, a.rounds + 1):
                for c in configs_py:
                    port, proc = servers[c]
                    url = f"http://127.0.0.1:{port}/v1/items/1"
                    agent = None
                    if c == "b":
                        agent = Agent(["--port", str(port)], [proc.pid], tmp, f"python-b-r{rnd}",
                                      a.bpf_stats)
                    elif c == "b'":
                        agent = Agent(["--pid", str(idle.pid)], [idle.pid], tmp, f"python-idle-r{rnd}",
                                      a.bpf_stats)
                    try:
                        r = measure("python", c, rnd, url, 4, a.seconds, a.warmup,
                                    psutil.Process(proc.pid), agent, headers)
                    finally:
                        if agent:
                            agent.stop()
                    results.append(r)
                    if c == "c":
                        otel_sent += r.wrk.requests + r.warmup_requests
            stop(otel)  # SIGTERM: the batch processor flushes every span to the file
            stop(plain)

        if a.only in (None, "nginx"):
            port = free_port()
            ngx, worker = start_nginx(tmp, port)
            procs.append(ngx)
            url = f"http://127.0.0.1:{port}/index.html"
            for rnd in range(1, a.rounds + 1):
                for c in configs_ng:
                    agent = None
                    if c == "b":
                        agent = Agent(["--port", str(port)], [worker.pid], tmp, f"nginx-b-r{rnd}",
                                      a.bpf_stats)
                    elif c == "b'":
                        agent = Agent(["--pid", str(idle.pid)], [idle.pid], tmp, f"nginx-idle-r{rnd}",
                                      a.bpf_stats)
                    try:
                        results.append(measure("nginx", c, rnd, url, 16, a.seconds, a.warmup, worker, agent,
                                               headers))
                    finally:
                        if agent:
                            agent.stop()
            stop(ngx)
    finally:
        for p in reversed(procs):
            stop(p)

    print()
    print(f"load avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.only in (None, "python"):
        print(f"\npython stdlib server, wrk -t1 -c4 /v1/items/1 ({'Nagle on' if a.nagle else 'TCP_NODELAY'}),"
              f" mean of {a.rounds} x {a.seconds:g} s")
        print("\n".join(table(results, "python", configs_py)))
    if a.only in (None, "nginx"):
        print(f"\nnginx static 380 B, 1 worker, wrk -t1 -c16 /index.html,"
              f" mean of {a.rounds} x {a.seconds:g} s")
        print("\n".join(table(results, "nginx", configs_ng)))
    print(f"\n{LEGEND}")
    print("\nagent accounting per (b)/(b') run: counter deltas over the measured wrk run.\n"
          "kernel: responses counted in BPF; k-wrk: those wrk did not count (0..connections:\n"
          "wrk stops with requests in flight); stitched/lost: what userspace got; traced:\n"
          "spans exported (default sampling); CPU s, ms/1k: the agent's user+sys CPU from\n"
          "wrk's start until it has stitched everything; lag s: how long after wrk stopped\n"
          "that took (its backlog)")
    print("\n".join(accounting(results)))
    for group in ("python", "nginx"):
        for config in ("b", "b'"):
            if lines := bpf_table(results, group, config):
                print("\n" + "\n".join(lines))
    if a.only in (None, "python"):
        written = sum(1 for _ in open(spans)) if spans.exists() else 0
        print(f"\n(c) OTel spans written: {written}, requests wrk counted: {otel_sent} (incl. warm-ups\n"
              f"and readiness probe; up to 4 more in flight per wrk run; a BatchSpanProcessor\n"
              f"whose queue is full drops spans)")
    bad = [r for r in results if r.wrk.errors]
    if bad:
        print("\nwrk errors: " + ", ".join(f"{r.group} {r.config} r{r.round}: {r.wrk.errors}" for r in bad))
    print(f"\nlogs, traces and results.json: {tmp}")
    (tmp / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
