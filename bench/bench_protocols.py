"""What the TLS uprobes and the HTTP/2 decoding cost per request, side by
side with cleartext HTTP/1.1, measured in one run on one nginx.

    sudo .venv/bin/python bench/bench_protocols.py [--seconds 4] [--rounds 2]

One nginx (tests/nginx.py's static site: one worker, a 380-byte index.html,
access_log off, sendfile on) listens on four ports, one per protocol:

  HTTP/1.1      cleartext, keep-alive        wrk -t1 -c8
  HTTP/1.1+TLS  `listen ... ssl`             wrk -t1 -c8 https://
  h2c           `listen ... http2`           h2load -t1 -c8 -m4 (prior knowledge)
  h2+TLS        `listen ... ssl http2`       h2load -t1 -c8 -m4 https:// (ALPN h2)

with a self-signed certificate made by `openssl req` for the run. Every
protocol has 8 connections; HTTP/2's carry 4 streams each (--streams: at 1,
nginx 1.22 writes an h2c response's HEADERS frame alone and its DATA through
sendfile behind it, and Nagle holds the DATA for the client's delayed ACK,
~40 ms a request). For each protocol two configurations run
in turn, round after round (a b a b ...), so each round's pair shares the
machine's noise:

  (a)  no agent
  (b)  the sitsprobe agent (the CLI, as bench_http.py's Agent runs it) tracing
       nginx's worker by --pid, default config (capture.tls on, default
       sampling), traces to a file

The agent is started before each (b) and stopped (SIGTERM) after it, so (a)
runs with none of its BPF attached. CPU comes from /proc (psutil) for nginx's
worker and the agent, and from wait4() for the load generator. The agent's
/metrics gives what it made of nginx's requests: HTTP server requests (the
duration histogram's count), stitched requests by protocol, exchanges it
could not frame (tls, http2: the plaintext was not read or not decoded), and
events lost; the bench compares them with the load generator's tally. Helpers
come from bench/bench_http.py. Needs root, wrk, nginx, openssl and, for the
HTTP/2 rows, h2load (Debian: apt-get install nghttp2-client).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.bench_genai import _med, code
from bench.bench_http import (
    Agent,
    BpfStats,
    Result,
    Wrk,
    _answers_static,
    _f,
    _first,
    _us,
    bpf_table,
    cpu_s,
    free_port,
    machine,
    run_wrk,
    scrape,
    stop,
    sys_s,
    total,
    wait_until,
)
from tests.nginx import static_site

CONNS = 8
PROCESS = "nginx"  # the worker's comm: the process label of its metrics
HTTP_COUNT = "http_server_request_duration_seconds_count"


@dataclass(frozen=True)
class Protocol:
    name: str
    scheme: str
    listen: str  # nginx `listen` parameters
    h2: bool  # driven by h2load, else wrk

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


PROTOCOLS = (
    Protocol("HTTP/1.1", "http", "", False),
    Protocol("HTTP/1.1+TLS", "https", " ssl", False),
    Protocol("h2c", "http", " http2", True),
    Protocol("h2+TLS", "https", " ssl http2", True),
)
LABELS = {"a": "(a) no agent", "b": "(b) agent"}
LEGEND = f"""\
req/s: the load generator's, median over rounds; range: min-max. b/a: each
round's (b) over that round's (a), median. CPU us per request (= ms per 1000
requests): user+sys time over the measured run divided by the requests the
load generator completed, for nginx's worker, the agent (from the load's
start until its counts stop moving, so its backlog is included) and the load
generator (wrk or h2load: the TLS uprobes sit on the libssl file, so they
trap in the client's SSL_read/SSL_write too and are filtered there).
agent saw: HTTP server requests the agent reported for nginx ({HTTP_COUNT}),
over the requests the load generator completed; up to {CONNS} more are normal
(the load stops with requests in flight)."""


# -- the site and its load ----------------------------------------------------------

def certificate(d: Path) -> tuple[str, str]:
    """A self-signed certificate and key for 127.0.0.1, made for this run."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def start_nginx(tmp: Path, ports: dict[str, int]) -> tuple[subprocess.Popen, psutil.Process]:
    """One nginx serving the static site on every protocol's port: the first
    protocol's is the site's own `listen`, the others are more `listen`
    lines in the same server block (nginx 1.22's per-listen ssl/http2)."""
    cert, key = certificate(tmp)
    first, *more = PROTOCOLS
    extra = "".join(f"        listen 127.0.0.1:{ports[p.name]}{p.listen};\n" for p in more)
    extra += f"        ssl_certificate {cert};\n        ssl_certificate_key {key};\n"
    p = subprocess.Popen(static_site(tmp / "nginx", ports[first.name], locations=extra),
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers_static(ports[first.name]) or p.poll() is not None, 15, "nginx")
        if p.poll() is not None:
            log = (tmp / "nginx" / "error.log").read_text()[-2000:]
            raise RuntimeError(f"nginx exited ({p.returncode}):\n{log}")
        worker = wait_until(lambda: psutil.Process(p.pid).children(), 10, "the nginx worker")[0]
    except BaseException:
        stop(p)
        raise
    return p, worker


def run_h2load(url: str, conns: int, streams: int, seconds: float) -> Wrk:
    """h2load for `seconds` (-D), as a Wrk (h2load gives no percentiles:
    p50/p99 are None). errors: failed, errored and timed-out requests and
    responses other than 2xx/3xx."""
    cmd = ["h2load", "-t1", f"-c{conns}", f"-m{streams}", "-D", str(seconds), url]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)  # its rusage: the load generator's own CPU
        p.returncode = code = os.waitstatus_to_exitcode(status)
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", out)
    rps = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    codes = re.search(r"status codes: \d+ 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if code != 0 or not (m and rps and codes) or not int(m[1]):
        raise RuntimeError(f"h2load failed ({code}): {shlex.join(cmd)}\n{out}")
    return Wrk(requests=int(m[1]), rps=float(rps[1]), p50_ms=None, p99_ms=None,
               errors=sum(int(x) for x in m.groups()[1:]) + int(codes[1]) + int(codes[2]),
               cpu_s=ru.ru_utime + ru.ru_stime, sys_s=ru.ru_stime)


def generator(proto: Protocol, streams: int) -> str:
    return f"h2load -t1 -c{CONNS} -m{streams}" if proto.h2 else f"wrk -t1 -c{CONNS}"


# -- other people's probes -----------------------------------------------------------

def foreign_probes(own: int | None) -> tuple[int, int]:
    """BPF attachments (`bpftool perf show`) held by processes other than
    ``own`` (this run's agent): (how many, of them uprobes on a libssl). Every
    syscall hook of another agent fires in nginx and the load generator too,
    and a uprobe on libssl.so traps in every process that maps it: an (a) run
    with any of these is not "no agent"."""
    if not shutil.which("bpftool"):
        return 0, 0
    p = subprocess.run(["bpftool", "-j", "perf", "show"], capture_output=True, text=True, check=False)
    try:
        rows = [r for r in json.loads(p.stdout or "[]") if r.get("pid") != own]
    except json.JSONDecodeError:
        return 0, 0
    return len(rows), sum(1 for r in rows if "libssl" in r.get("filename", ""))


# -- the agent ---------------------------------------------------------------------

class ProtocolAgent(Agent):
    """bench_http's Agent, asked what nginx's requests became: HTTP requests,
    stitched requests and unframed exchanges by protocol, HTTP/2 connections."""

    def tally(self) -> dict[str, float]:
        m = scrape(self.port)
        out = {"http": total(m, HTTP_COUNT, process=PROCESS),
               "kernel": total(m, "sitsprobe_http_server_requests_total"),
               "lost": total(m, "sitsprobe_events_lost_total"),
               "h2 conns": total(m, "sitsprobe_http2_connections_total", process=PROCESS),
               "h2 partial": total(m, "sitsprobe_http2_partial_total", process=PROCESS),
               "h2 frame errors": total(m, "sitsprobe_http2_frame_errors_total", process=PROCESS)}
        for name, prefix in (("sitsprobe_requests_stitched_total", "stitched "),
                             ("sitsprobe_unframed_exchanges_total", "unframed ")):
            for labels, v in m.get(name, []):
                if labels.get("process") == PROCESS:
                    key = prefix + labels.get("protocol", "?")
                    out[key] = out.get(key, 0.0) + v
        for labels, v in m.get("sitsprobe_events_lost_total", []):
            key = "lost " + labels.get("reason", "?")
            out[key] = out.get(key, 0.0) + v
        return out

    def tls_hooked(self, pid: int, timeout: float = 5.0) -> bool:
        """Whether the agent reads pid's TLS through its libssl (sitsprobe_tls_processes)."""
        try:
            wait_until(lambda: total(scrape(self.port), "sitsprobe_tls_processes", pid=str(pid)), timeout,
                       "the agent to hook nginx's libssl")
            return True
        except RuntimeError:
            return False

    def settle(self, before: dict[str, float], sent: int, quiet_s: float = 2.0) -> tuple[dict, float]:
        """The tally's deltas since ``before`` once the agent has reported at
        least ``sent`` HTTP requests and nothing moved for a moment, or nothing
        moved for ``quiet_s`` (it will not get there); and when its counts
        last moved, from now (its backlog once the load stopped)."""
        t0 = time.monotonic()
        last, moved = None, t0
        while time.monotonic() - t0 < 30:
            now = self.tally()
            delta = {k: v - before.get(k, 0.0) for k, v in now.items()}
            if delta != last:
                last, moved = delta, time.monotonic()
            still = time.monotonic() - moved
            if (delta["http"] >= sent and still >= 0.4) or still >= quiet_s:
                break
            time.sleep(0.2)
        return last, moved - t0


# -- one measurement ---------------------------------------------------------------

def load(proto: Protocol, url: str, seconds: float, streams: int) -> Wrk:
    return run_h2load(url, CONNS, streams, seconds) if proto.h2 else run_wrk(url, CONNS, seconds)


def measure(proto: Protocol, config: str, rnd: int, url: str, a: argparse.Namespace,
            worker: psutil.Process, agent: ProtocolAgent | None) -> Result:
    warm = load(proto, url, a.warmup, a.streams).requests if a.warmup > 0 else 0
    if agent:
        agent.settle(agent.tally(), warm)  # the warm-up's backlog, outside the measured window
        before, a0 = agent.tally(), cpu_s(agent.ps)
    own = agent.p.pid if agent else None
    seen = foreign_probes(own)
    stats = BpfStats(agent.prog_ids if agent else set())
    n0, k0 = cpu_s(worker), sys_s(worker)
    with stats if stats.prog_ids else contextlib.nullcontext():
        w = load(proto, url, a.seconds, a.streams)
    r = Result(proto.name, config, rnd, w, cpu_s(worker) - n0, sys_s(worker) - k0, warmup_requests=warm,
               bpf=stats.delta)
    probes, ssl = (max(x, y) for x, y in zip(seen, foreign_probes(own)))  # before and after the load
    if probes:
        r.counts.update({"foreign probes": probes, "foreign ssl uprobes": ssl})
    line = f"  {proto.name:12} round {rnd}  {LABELS[config]:12} {w.rps:8.0f} req/s"
    if agent:
        counts, r.catch_up_s = agent.settle(before, w.requests)
        r.counts.update(counts)
        r.agent_cpu_s = cpu_s(agent.ps) - a0
        r.agent_startup_s = agent.startup_s
        line += (f"  agent saw {r.counts['http']:.0f} of {w.requests}"
                 f"  (up in {agent.startup_s:.1f} s)")
    if probes:
        line += f"  [others' BPF attached: {probes}, {ssl} on libssl]"
    print(line, flush=True)
    return r


def _failed(proto: Protocol, rnd: int) -> Result:
    """A (b) row that did not measure: the table says so."""
    return Result(proto.name, "b", rnd, Wrk(0, 0.0, None, None, 0, 0.0, 0.0), 0.0, 0.0, counts={"failed": 1})


def run_b(proto: Protocol, rnd: int, url: str, a: argparse.Namespace, worker: psutil.Process,
          tmp: Path) -> Result:
    """(b): the agent started on nginx's worker, measured, stopped. If it does
    not start, the row says so and the run goes on."""
    tag = f"{proto.name.replace('/', '').replace('+', '-')}-r{rnd}"
    try:
        agent = ProtocolAgent(["--pid", str(worker.pid)], [worker.pid], tmp, tag, a.bpf_stats)
    except RuntimeError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        why = lines[0] + (f" ... {lines[-1].strip()}" if len(lines) > 1 else "")
        print(f"  {proto.name:12} round {rnd}  {LABELS['b']:12} the agent did not start: {why}"
              f" (log: {tmp / f'agent-{tag}.log'})", flush=True)
        return _failed(proto, rnd)
    try:
        hooked = agent.tls_hooked(worker.pid) if proto.tls else None
        r = measure(proto, "b", rnd, url, a, worker, agent)
        if hooked is not None:
            r.counts["tls hooked"] = float(hooked)
        return r
    except RuntimeError as e:  # the load failed with the agent attached
        print(f"  {proto.name:12} round {rnd}  {LABELS['b']:12} FAILED: {e}", flush=True)
        return _failed(proto, rnd)
    finally:
        agent.stop()


# -- report ------------------------------------------------------------------------

def _rows(results: list[Result], proto: Protocol, config: str) -> list[Result]:
    return [r for r in results if r.group == proto.name and r.config == config and not r.counts.get("failed")]


def table(results: list[Result], protocols: list[Protocol]) -> list[str]:
    out = [f"{'':12} {'':13} {'':18} {'':4} | {'CPU us per request':^17} | {'agent saw':>15}",
           (f"{'protocol':12} {'config':13} {'req/s     range':>18} {'b/a':>4} |"
            f" {'nginx':>5} {'agent':>5} {'load':>5} | {'of sent':>15}")]
    for proto in protocols:
        base = {r.round: r.wrk.rps for r in _rows(results, proto, "a")}
        for config, label in LABELS.items():
            rs = _rows(results, proto, config)
            name = proto.name if config == "a" else ""
            if any(r.counts.get("foreign probes") for r in rs):
                label += "*"
            if not rs:
                out.append(f"{name:12} {label:13} no measurement (see above)")
                continue
            rps = [r.wrk.rps for r in rs]
            spread = f"{min(rps):.0f}-{max(rps):.0f}" if len(rs) > 1 else ""
            ratio = _med(r.wrk.rps / base[r.round] for r in rs if base.get(r.round)) if config == "b" else None
            saw = ""
            if config == "b":
                got, sent = sum(r.counts.get("http", 0) for r in rs), sum(r.wrk.requests for r in rs)
                saw = f"{got:.0f}/{sent}"
            out.append(
                f"{name:12} {label:13} {_med(rps):6.0f} {spread:>11} {_f(ratio, '4.2f')} |"
                f" {_med(_us(r.server_cpu_s, r.wrk.requests) for r in rs):5.1f}"
                f" {_f(_med(_us(r.agent_cpu_s, r.wrk.requests) for r in rs), '5.1f')}"
                f" {_med(_us(r.wrk.cpu_s, r.wrk.requests) for r in rs):5.1f} | {saw:>15}")
    marked = [f"{r.group} {r.config}{r.round} {r.counts['foreign probes']:.0f}/{r.counts['foreign ssl uprobes']:.0f}"
              for r in results if r.counts.get("foreign probes")]
    if marked:
        out.append("* other processes' BPF was attached (bpftool perf show; run: attachments/on libssl):")
        line = " "
        for item in marked:
            if len(line) + len(item) > 98:
                out.append(line.rstrip(","))
                line = " "
            line += f" {item},"
        out.append(line.rstrip(","))
    return out


def _added(runs: list[Result], base: dict[int, Result], cpu) -> float | None:
    """Median over rounds of (b) - (a) in CPU us per request."""
    return _med(_us(cpu(r), r.wrk.requests) - _us(cpu(base[r.round]), base[r.round].wrk.requests)
                for r in runs)


def costs(results: list[Result], protocols: list[Protocol]) -> list[str]:
    """What tracing adds per request, protocol by protocol: (b) - (a) of the
    same round for nginx and the load generator (the probes run in their
    context), then the agent's own CPU; medians over the rounds in which no
    other process had BPF attached, or over all of them, marked *, if none."""
    out = [f"{'what tracing adds, us per request':34} {'nginx':>6} {'load':>6} {'agent':>6} {'all':>6}"]
    for proto in protocols:
        base = {r.round: r for r in _rows(results, proto, "a")}
        rs = [r for r in _rows(results, proto, "b") if r.round in base]
        clean = [r for r in rs if not (r.counts.get("foreign probes")
                                       or base[r.round].counts.get("foreign probes"))]
        if not rs:
            continue
        used = clean or rs
        nginx = _added(used, base, lambda r: r.server_cpu_s)
        gen = _added(used, base, lambda r: r.wrk.cpu_s)
        agent = _med(_us(r.agent_cpu_s, r.wrk.requests) for r in used)
        name = f"{proto.name}{'' if clean else '*'} ({len(used)} of {len(rs)} rounds)"
        out.append(f"{name:34} {nginx:+6.1f} {gen:+6.1f} {agent:6.1f} {nginx + gen + agent:6.1f}")
    return out


def accounting(results: list[Result]) -> list[str]:
    """Every (b) run: what the agent made of nginx's requests."""
    out = [(f"{'run':17} {'sent':>6} {'http':>6} {'kernel':>6} {'lost':>5} {'h2 conn':>7}"
            f" {'part':>4} {'CPU s':>5} {'lag s':>5}  stitched, unframed by protocol; lost by reason")]
    for r in results:
        if r.config != "b":
            continue
        k = r.counts
        name = f"{r.group} r{r.round}"
        if k.get("failed"):
            out.append(f"{name:17} not measured: the agent did not start, or the load failed")
            continue
        by = ", ".join(f"{key} {v:.0f}" for key, v in sorted(k.items())
                       if key.startswith(("stitched ", "unframed ", "lost ")) and v)
        out.append(f"{name:17} {r.wrk.requests:6d} {k['http']:6.0f} {k['kernel']:6.0f} {k['lost']:5.0f}"
                   f" {k['h2 conns']:7.0f} {k['h2 partial']:4.0f} {r.agent_cpu_s:5.2f}"
                   f" {_f(r.catch_up_s, '5.1f')}  {by or '-'}")
    return out


def verdicts(results: list[Result], protocols: list[Protocol], streams: int) -> list[str]:
    """One line per protocol: whether the agent got every request, and if not, what it saw instead."""
    out = []
    for proto in protocols:
        in_flight = CONNS * (streams if proto.h2 else 1)  # per run, when the load stops
        tried = [r for r in results if r.group == proto.name and r.config == "b"]
        if not tried:
            continue
        rs = _rows(results, proto, "b")
        if len(rs) < len(tried):
            out.append(f"{proto.name}: the agent did not start, or the load failed, in"
                       f" {len(tried) - len(rs)} of {len(tried)} runs (see above)")
        if not rs:
            continue
        got, sent = sum(r.counts["http"] for r in rs), sum(r.wrk.requests for r in rs)
        lost = sum(r.counts["lost"] for r in rs)
        tls = sum(r.counts.get("unframed tls", 0) for r in rs)
        h2 = sum(r.counts.get("unframed http2", 0) for r in rs)
        partial = sum(r.counts["h2 partial"] for r in rs)
        errors = sum(r.counts["h2 frame errors"] for r in rs)
        ok = sent <= got <= sent + in_flight * len(rs) and not (tls or h2 or lost)
        line = f"{proto.name}: agent reported {got:.0f} HTTP requests of {sent} sent"
        line += " - OK" if ok else " - NOT ALL"
        notes = []
        if proto.tls and any(r.counts.get("tls hooked") == 0 for r in rs):
            notes.append("it never hooked nginx's libssl (sitsprobe_tls_processes stayed empty)")
        if tls:
            notes.append(f"{tls:.0f} opaque tls exchanges: TLS not decrypted")
        if h2:
            notes.append(f"{h2:.0f} unframed http2 exchanges: HTTP/2 not decoded")
        if partial or errors:
            notes.append(f"{partial:.0f} HTTP/2 connections partial, {errors:.0f} frame errors")
        if lost:
            notes.append(f"{lost:.0f} events lost")
        if got > sent + in_flight * len(rs):
            notes.append("more than the requests sent plus those in flight")
        out.append(line + ("; " + "; ".join(notes) if notes else ""))
    return out


# -- main --------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=4, help="load duration of each measurement (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="times each configuration is measured (default 2)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="load seconds before each measurement, 0 = none (default 1)")
    ap.add_argument("--streams", type=int, default=4,
                    help="h2load -m: concurrent streams per HTTP/2 connection (default 4; at 1, "
                         "h2c stalls ~40 ms a request on Nagle: see bench/README.md)")
    ap.add_argument("--bpf-stats", action="store_true",
                    help="also time each of the agent's BPF programs (kernel.bpf_stats_enabled) "
                         "during (b): runs and ns per request, nginx and the load generator together")
    ap.add_argument("--only", action="append", choices=[p.name for p in PROTOCOLS], metavar="PROTOCOL",
                    help="measure this protocol only (repeatable): " + ", ".join(p.name for p in PROTOCOLS))
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_protocols: run as root (the agent loads BPF; nginx runs as root)", file=sys.stderr)
        return 2
    for tool in ("wrk", "nginx", "openssl") + (("bpftool",) if a.bpf_stats else ()):
        if not shutil.which(tool):
            print(f"bench_protocols: {tool} is not installed (scripts/setup.sh installs wrk and nginx)",
                  file=sys.stderr)
            return 2
    protocols = [p for p in PROTOCOLS if not a.only or p.name in a.only]
    skipped = []
    if not shutil.which("h2load"):
        skipped = [p.name for p in protocols if p.h2]
        protocols = [p for p in protocols if not p.h2]

    env = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get("PYTHONPATH") else ""
    print(f"reproduce: cd {ROOT} && {env}.venv/bin/python bench/bench_protocols.py"
          f" {shlex.join(sys.argv[1:])}".rstrip())
    for line in machine():
        print(line)
    print(f"code: {code()}")
    if shutil.which("h2load"):
        print(f"tools: {_first(['h2load', '--version'])}, {_first(['openssl', 'version'])}")
    for name in skipped:
        print(f"{name}: SKIPPED, h2load is not installed (Debian: apt-get install -y nghttp2-client)")
    print(f"each measurement: {a.warmup:g} s warm-up, then {a.seconds:g} s measured; "
          f"{a.rounds} round(s), (a) and (b) interleaved per protocol\n", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="sitsprobe-bench-protocols-"))
    ports = {p.name: free_port() for p in PROTOCOLS}
    results: list[Result] = []
    ngx, worker = start_nginx(tmp, ports)
    try:
        for proto in protocols:
            url = f"{proto.scheme}://127.0.0.1:{ports[proto.name]}/index.html"
            for rnd in range(1, a.rounds + 1):
                try:
                    results.append(measure(proto, "a", rnd, url, a, worker, None))
                except RuntimeError as e:  # without the agent: the load itself does not work
                    print(f"  {proto.name:12} round {rnd}  {LABELS['a']:12} FAILED, protocol skipped: {e}")
                    break
                results.append(run_b(proto, rnd, url, a, worker, tmp))
    finally:
        stop(ngx)

    print(f"\nload avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nnginx static 380 B, 1 worker, /index.html, {CONNS} connections; median of {a.rounds} x"
          f" {a.seconds:g} s\nload: " + "; ".join(f"{p.name} {generator(p, a.streams)}" for p in protocols))
    print("\n".join(table(results, protocols)))
    print("\n" + "\n".join(costs(results, protocols)))
    print(f"\n{LEGEND}")
    print("\nagent accounting per (b) run, counter deltas over the measured run: sent (the load\n"
          "generator's completed requests), http (HTTP server requests the agent reported for\n"
          "nginx), kernel (HTTP/1 responses counted in BPF), lost (events), h2 conn / part\n"
          "(HTTP/2 connections framed / not decoded whole), the agent's CPU s, lag s (how long\n"
          "after the load stopped its counts kept moving), then what it stitched and what it\n"
          "could not frame, by protocol")
    print("\n".join(accounting(results)))
    for proto in protocols:
        if lines := bpf_table(results, proto.name, "b"):
            print("\n" + "\n".join(lines))
    print("\n" + "\n".join(verdicts(results, protocols, a.streams)))
    bad = [r for r in results if r.wrk.errors]
    if bad:
        print("\nload errors: " + ", ".join(f"{r.group} {r.config} r{r.round}: {r.wrk.errors}" for r in bad))
    print(f"\nlogs, traces and results.json: {tmp}")
    (tmp / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
