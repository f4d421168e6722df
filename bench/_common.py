"""Helpers the benchmarks share: free ports, waiting, CPU accounting, wrk
driving and parsing, the agent's /metrics, BPF program statistics, the agent
as a subprocess (`Agent`), the static nginx site, and the machine's
description. bench_http.py, bench_genai.py, bench_protocols.py, bench_idle.py
and bench_cost.py import them (the first re-exports them for the others)."""
from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tests.nginx import static_site  # noqa: E402  (the load test serves the same site)

SITSPROBE = Path(sys.executable).parent / "sitsprobe"


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


def run_wrk(url: str, conns: int, seconds: float, headers: list[str] = (), script: Path | None = None) -> Wrk:
    """wrk -t1 against url, its latency, errors and own CPU; ``script`` a Lua
    script (wrk -s: a POST and its body)."""
    p = subprocess.Popen(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency",
                          *(x for h in headers for x in ("-H", h)),
                          *(["-s", str(script)] if script else []), url],
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
    """`sitsprobe run` as a subprocess, from start to "tracing N process(es)" to SIGTERM.

    command: what runs the CLI (default this venv's `sitsprobe`; another checkout's
    agent is e.g. [python, "-m", "sitsprobe.cli"] with PYTHONPATH in ``env``, run
    in ``cwd``: `-m` puts the working directory first on sys.path);
    args: more `run` options (``--config FILE``). ``healthz_s``: from launching
    it to its metrics port answering /healthz 200 (None if it has no /healthz),
    read every ``poll_s``; ``startup_s``: until it tracks ``expect_pids``."""

    def __init__(self, select: list[str], expect_pids: list[int], tmp: Path, tag: str,
                 bpf_stats: bool = False, *, command: list[str] | None = None,
                 env: dict[str, str] | None = None, args: list[str] = (), poll_s: float = 0.2,
                 cwd: Path | None = None) -> None:
        loaded_before = set(bpf_programs()) if bpf_stats else set()
        self.port = free_port()
        self.log_path = tmp / f"agent-{tag}.log"
        self.traces = tmp / f"agent-{tag}-traces.jsonl"
        self.healthz_s: float | None = None
        self._no_healthz = False
        self.t0 = time.monotonic()
        with open(self.log_path, "w") as log:
            self.p = subprocess.Popen(
                [*(command or [str(SITSPROBE)]), "run", *select, *args, "--metrics-port", str(self.port),
                 "--traces-file", str(self.traces)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            self.ps = psutil.Process(self.p.pid)
            wait_until(self._attached, 90, "the agent to attach", step=poll_s)
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
        self._poll_healthz()
        return (bool(re.search(r"tracing [1-9]\d* process", self.log_path.read_text()))
                and (self.healthz_s is not None or self._no_healthz))

    def _poll_healthz(self) -> None:
        if self.healthz_s is not None or self._no_healthz:
            return
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                if r.status == 200:
                    self.healthz_s = time.monotonic() - self.t0
        except urllib.error.HTTPError as e:
            self._no_healthz = e.code == 404  # an agent without /healthz; 503: not ready yet
        except OSError:
            pass  # not listening yet

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


# -- servers --------------------------------------------------------------------

def start_nginx(tmp: Path, port: int) -> tuple[subprocess.Popen, psutil.Process]:
    p = subprocess.Popen(static_site(tmp / "nginx", port),
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers_static(port), 15, f"nginx on :{port}")
        worker = wait_until(lambda: psutil.Process(p.pid).children(), 10, "the nginx worker")[0]
    except BaseException:
        stop(p)  # a site that never answered (or Ctrl-C) leaves no nginx behind
        raise
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

def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None



def code(python: str = sys.executable, env: dict[str, str] | None = None, cwd: str | Path = "/") -> str:
    """Where the agent's code comes from (PYTHONPATH may point the agent at a
    copy of the tree; this process imports the checkout's), and that tree's
    git commit: a run can be traced to what it measured."""
    where = subprocess.run([python, "-c", "import sitsprobe; print(sitsprobe.__file__)"],
                           capture_output=True, text=True, check=True, cwd=cwd, env=env).stdout.strip()
    tree = Path(where).resolve().parent.parent
    git = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)
    return f"sitsprobe from {tree}" + (f", git {git.stdout.strip()}" if git.returncode == 0 else "")


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

