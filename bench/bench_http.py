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
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.nginx import static_site  # noqa: E402  (the load test serves the same site)

BENCH = Path(__file__).resolve().parent
SITSPROBE = Path(sys.executable).parent / "sitsprobe"

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

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout: float, what: str, step: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def sys_s(proc: psutil.Process) -> float:
    return proc.cpu_times().system


def _dur(value: str, unit: str) -> float:
    """A wrk latency as milliseconds."""
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


@dataclass
class Wrk:
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int      # socket errors + non-2xx/3xx
    cpu_s: float     # wrk's own user+sys time
    sys_s: float     # of which in the kernel


def filler_headers(n: int) -> list[str]:
    """n 40-byte headers, then a traceparent: a request head the size real
    clients send (the openai client's is ~600 bytes), past capture.request_bytes,
    so the kernel searches it for the trace context."""
    tp = "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    return [f"x-filler-{i:02d}: {'f' * 26}" for i in range(n)] + ([tp] if n else [])


def run_wrk(url: str, conns: int, seconds: int, headers: list[str] = ()) -> Wrk:
    p = subprocess.Popen(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency",
                          *(x for h in headers for x in ("-H", h)), url],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    p.stdout.close()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"wrk failed ({p.returncode}):\n{out}")
    try:
        found = re.findall(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
        lat = {pct: _dur(value, unit) for pct, value, unit in found}
        errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
        errors += int(m[1]) if (m := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)) else 0
        return Wrk(requests=int(re.search(r"(\d+) requests in", out)[1]),
                   rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]),
                   p50_ms=lat["50"], p99_ms=lat["99"], errors=errors,
                   cpu_s=ru.ru_utime + ru.ru_stime, sys_s=ru.ru_stime)
    except (TypeError, KeyError) as e:
        raise RuntimeError(f"cannot parse wrk's output ({e}):\n{out}") from e


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, list] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
            out.setdefault(m[1], []).append((labels, float(m[3])))
    return out


def total(metrics: dict, name: str, **want: str) -> float:
    return sum(v for labels, v in metrics.get(name, [])
               if all(labels.get(k) == w for k, w in want.items()))


# -- the agent ------------------------------------------------------------------

def bpf_programs() -> dict[int, tuple[str, int, int]]:
    """Every BPF program loaded now: id -> (name, run_time_ns, run_cnt)."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return {p["id"]: (p.get("name", "?"), p.get("run_time_ns", 0), p.get("run_cnt", 0))
            for p in json.loads(out.stdout)}


class BpfStats:
    """Run time and run count of each of the agent's BPF programs over the
    measured run (`kernel.bpf_stats_enabled`). The kernel then reads the clock
    twice per program run, which costs something itself: off unless --bpf-stats.
    What it does not see: the tracepoint machinery around each program."""

    SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")

    def __init__(self, prog_ids: set[int]) -> None:
        self.prog_ids = prog_ids
        self.delta: dict[str, list[int]] = {}  # program name -> [run_time_ns, run_cnt]

    def __enter__(self) -> "BpfStats":
        self._was = self.SYSCTL.read_text().strip()
        self.SYSCTL.write_text("1")
        self._before = bpf_programs()
        return self

    def __exit__(self, *exc) -> None:
        after = bpf_programs()
        self.SYSCTL.write_text(self._was)
        for pid in self.prog_ids & after.keys() & self._before.keys():
            name, ns, cnt = after[pid]
            d = self.delta.setdefault(name, [0, 0])
            d[0] += ns - self._before[pid][1]
            d[1] += cnt - self._before[pid][2]


class Agent:
    """`sitsprobe run` as a subprocess, from start to "tracing N process(es)" to SIGTERM."""

    def __init__(self, select: list[str], expect_pids: list[int], tmp: Path, tag: str,
                 bpf_stats: bool = False) -> None:
        loaded_before = set(bpf_programs()) if bpf_stats else set()
        self.port = free_port()
        self.log_path = tmp / f"agent-{tag}.log"
        self.traces = tmp / f"agent-{tag}-traces.jsonl"
        self.t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.p = subprocess.Popen(
                [str(SITSPROBE), "run", *select, "--metrics-port", str(self.port),
                 "--traces-file", str(self.traces)],
                stdout=log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.p.pid)
        try:
            wait_until(self._attached, 90, "the agent to attach", step=0.2)
            wait_until(lambda: set(expect_pids) <= self.tracked(), 10, f"the agent to track {expect_pids}")
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self.t0
        # the programs it loaded (bpftool here cannot say which process holds which)
        self.prog_ids = set(bpf_programs()) - loaded_before if bpf_stats else set()

    def _attached(self) -> bool:
        if self.p.poll() is not None:
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"the agent exited ({self.p.returncode}):\n{tail}")
        return bool(re.search(r"tracing [1-9]\d* process", self.log_path.read_text()))

    def tracked(self) -> set[int]:
        try:
            return {int(lb["pid"]) for lb, _ in scrape(self.port).get("sitsprobe_tracked_process_info", [])}
        except OSError:
            return set()

    def counts(self) -> dict[str, float]:
        m = scrape(self.port)
        return {"kernel": total(m, "sitsprobe_http_server_requests_total"),
                "stitched": total(m, "sitsprobe_requests_stitched_total"),
                "lost": total(m, "sitsprobe_events_lost_total"),
                "traced": total(m, "sitsprobe_traces_total", outcome="sampled")}

    def settled(self, before: dict[str, float] | None = None, at_least: int = 0) -> tuple[dict, float]:
        """Counter deltas since ``before`` once the kernel count has stopped moving and the
        agent has stitched (or counted as lost) all of it, and how long the agent took
        to get there (its backlog when the load stopped)."""
        base = before or dict.fromkeys(("kernel", "stitched", "lost", "traced"), 0.0)
        t0, last, caught_up = time.monotonic(), None, None

        def done():
            nonlocal last, caught_up
            now = {k: v - base[k] for k, v in self.counts().items()}
            level = now["stitched"] + now["lost"] >= now["kernel"] >= at_least
            if level and caught_up is None:
                caught_up = time.monotonic() - t0
            ok = level and last is not None and now["kernel"] == last["kernel"]
            last = now
            return ok
        try:
            wait_until(done, 30, "the agent to stitch what the kernel counted", step=0.2)
        except RuntimeError:
            pass  # report what it has: the table shows the shortfall
        return last, caught_up

    def stop(self) -> None:
        """SIGTERM: the agent flushes, detaches every probe and exits 0; the next
        configuration then runs with none of its BPF attached."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        if self.p.returncode != 0:
            print(f"  warning: the agent exited {self.p.returncode} (log: {self.log_path})", flush=True)


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


def start_nginx(tmp: Path, port: int) -> tuple[subprocess.Popen, psutil.Process]:
    p = subprocess.Popen(static_site(tmp / "nginx", port),
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_until(lambda: _answers_static(port), 15, f"nginx on :{port}")
    worker = wait_until(lambda: psutil.Process(p.pid).children(), 10, "the nginx worker")[0]
    return p, worker


def _answers_static(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


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


def _first(cmd: list[str]) -> str:
    """The first line a tool prints about itself (wrk -v on stdout, nginx -v on stderr)."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    return ((p.stdout or "") + (p.stderr or "")).strip().splitlines()[0]


def machine() -> list[str]:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "?")
    try:
        from importlib.metadata import version
        sp = version("sitsprobe")
    except Exception:  # noqa: BLE001
        sp = "?"
    return [
        f"machine: nproc {len(os.sched_getaffinity(0))} ({model}), kernel {platform.release()}, "
        f"load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"         python {platform.python_version()}, sitsprobe {sp}, "
        f"wrk {_first(['wrk', '-v']).split()[1]}, {_first(['nginx', '-v']).split(': ')[-1]}",
    ]


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
