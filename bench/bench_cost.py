"""What the sitsprobe agent costs, one table, measured side by side in one run.

    .venv/bin/python bench/bench_cost.py [--rounds 3] [--seconds 5] [--only nginx,paced,...]
        [--baseline PATH] [--json out.json]

Columns: no agent, the agent (this checkout's `sitsprobe run`, or --agent-cmd),
and with --baseline PATH another checkout's agent (`python -m sitsprobe.cli`
with PYTHONPATH=PATH: a git worktree of an older commit), so that one run
prints before and after. Rows, by --only group:

  nginx    nginx (1 worker, a 380-byte file) under wrk -t1 -c16: (1) with the
           agent running but tracing another process (an idle `sleep`), req/s
           over no agent's and nginx's system CPU per request; (2) with the
           agent tracing the nginx worker (--pid), saturated
  paced    the agent tracing nginx under a paced client (bench/paced_client.py)
           at 500 and 2,000 req/s: agent CPU per exported span, its share of a
           core at 2,000 req/s, the share of requests that became traces
           (sitsprobe_traces_total{outcome="sampled"}), its RSS afterwards
  engine   the reference engine (examples/engine/serve.py, CPU) under
           examples/loadgen.py at 100 req/s open loop, streaming: latency and
           TTFT p50/p99 with the agent tracing it (--pid) and without, the
           agent's share of a core and spans exported per request
  syscall  bench/syscall_loop.c: 1-byte write+read over a pipe, send+recv over
           a socketpair, iterations per second, with the agent loaded
           (tracing the idle `sleep`) and without
  startup  seconds from launching `sitsprobe run` to /healthz answering 200,
           twice a round: net.c compiled (an empty compiled_dir), then its
           programs loaded as that start kept them

Every configuration runs once per round and rounds interleave them (the
columns' order rotates each round), so they share the machine's noise; each
cell is the median over rounds and the min-max spread. Ratios are taken per
round, against that round's no-agent figure. The agent is the CLI with its
default config, started before a session of measurements and stopped
(SIGTERM) after it: session A (tracing the idle sleep and, if measured, the
engine) runs rows nginx (1), engine and syscall; session B (tracing the nginx
worker) runs the paced rows and then nginx (2). Needs root, wrk, nginx, a C
compiler (syscall) and torch (engine). Everything it starts is stopped on
exit, Ctrl-C or an error.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._common import (  # noqa: E402
    SITSPROBE,
    Agent,
    code,
    cpu_s,
    free_port,
    machine,
    run_wrk,
    scrape,
    start_nginx,
    stop,
    sys_s,
    total,
)
from bench.bench_protocols import foreign_probes  # noqa: E402

BENCH = ROOT / "bench"
GROUPS = ("nginx", "paced", "engine", "syscall", "startup")
NGINX_CONNS = 16
PACED_RATES = (500, 2000)
PACED_CONNS = 8
ENGINE_RATE = 100
ENGINE_MAX_TOKENS = 16


# -- columns: who runs the agent ----------------------------------------------------

@dataclass
class Column:
    key: str  # "none", "agent", "base"
    label: str
    command: list[str] = field(default_factory=list)  # what runs the CLI, before "run"
    env: dict[str, str] | None = None
    args: list[str] = field(default_factory=list)  # more `run` options
    where: str = ""  # where its sitsprobe comes from
    cwd: Path = ROOT  # the agent runs there (`python -m` imports from it first)

    @property
    def agent(self) -> bool:
        return self.key != "none"

    def shown(self) -> str:
        pp = f"PYTHONPATH={shlex.quote(self.env['PYTHONPATH'])} " if self.env and "PYTHONPATH" in self.env else ""
        return pp + " ".join(shlex.quote(x) for x in [*self.command, "run", *self.args])


def columns(a: argparse.Namespace) -> list[Column]:
    cols = [Column("none", "no agent")]
    cmd = shlex.split(a.agent_cmd) if a.agent_cmd else [str(SITSPROBE)]
    env = {**os.environ, "PYTHONPATH": a.agent_pythonpath} if a.agent_pythonpath else None
    cwd = Path(a.agent_pythonpath).resolve() if a.agent_pythonpath else ROOT
    cols.append(Column("agent", "agent", cmd, env, ["-c", str(Path(a.agent_config).resolve())]
                       if a.agent_config else [], _where(cmd, env, cwd), cwd))
    if a.baseline:
        base = Path(a.baseline).resolve()
        if not (base / "sitsprobe" / "__init__.py").exists():
            raise SystemExit(f"bench_cost: --baseline {base}: no sitsprobe/ package there")
        py = base / ".venv" / "bin" / "python"
        cmd = shlex.split(a.baseline_cmd) if a.baseline_cmd else [str(py if py.exists() else sys.executable),
                                                                    "-m", "sitsprobe.cli"]
        env = {**os.environ, "PYTHONPATH": str(base)}
        col = Column("base", "agent (baseline)", cmd, env,
                     ["-c", str(Path(a.baseline_config).resolve())] if a.baseline_config else [],
                     _where(cmd, env, base), base)
        if not a.baseline_cmd and not col.where.startswith(f"sitsprobe from {base}"):
            raise SystemExit(f"bench_cost: --baseline {base}: {cmd[0]} imports {col.where}, not the baseline")
        cols.append(col)
    return cols


def _where(cmd: list[str], env: dict | None, cwd: Path) -> str:
    """Where a column's agent imports sitsprobe from, when its command is a Python."""
    python = cmd[0]
    if not (len(cmd) >= 3 and cmd[1] == "-m") and cmd != [str(SITSPROBE)]:
        return "(a custom command)"
    if cmd == [str(SITSPROBE)]:
        python = sys.executable
    try:
        return code(python, env, cwd)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"(cannot tell: {e})"


# -- processes ----------------------------------------------------------------------

def run_child(cmd: list[str], timeout: float) -> tuple[str, float]:
    """Run cmd to its end; its stdout and its user+sys CPU seconds (wait4).
    Killed if this process is interrupted or it overruns."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    box: dict[str, str] = {}
    reader = threading.Thread(target=lambda: box.update(out=p.stdout.read(), err=p.stderr.read()), daemon=True)
    reader.start()
    try:
        reader.join(timeout)
        if reader.is_alive():
            raise RuntimeError(f"{cmd[0]} ran over {timeout:.0f} s")
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    except BaseException:
        p.kill()
        p.wait()
        raise
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({p.returncode}): {box.get('err', '')[-2000:]}")
    return box.get("out", ""), ru.ru_utime + ru.ru_stime


class Engine:
    """examples/engine/serve.py on the CPU, its markers library built in tmp."""

    def __init__(self, tmp: Path) -> None:
        self.log = tmp / "engine.log"
        env = {**os.environ, "SITSPROBE_MARKERS_DIR": str(tmp / "markers")}
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "examples/engine/serve.py"), "--host",
                                          "127.0.0.1", "--port", "0", "--model-seed", "1313"],
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT)
        try:
            box: list[str] = []
            reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
            reader.start()
            reader.join(120)
            line = box[0] if box else ""
            if not line.startswith("listening on "):
                raise RuntimeError(f"the engine did not start ({line.strip() or 'no output'}):\n"
                                   + self.log.read_text()[-2000:])
        except BaseException:
            stop(self.proc)
            raise
        self.port = int(line.rsplit(":", 1)[1])
        self.pid = self.proc.pid
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain


# -- the agent -----------------------------------------------------------------------

class CostAgent(Agent):
    """_common's Agent, with the counters this bench reads beside the ones
    `settled` waits on."""

    def extra(self) -> dict[str, float]:
        m = scrape(self.port)
        return {"seen": total(m, "sitsprobe_traces_total", outcome="seen"),
                "sampled": total(m, "sitsprobe_traces_total", outcome="sampled"),
                "spans": total(m, "sitsprobe_spans_delivered_total", sink="file"),
                "pending": total(m, "sitsprobe_spans_pending", sink="file"),
                "has_spans": float("sitsprobe_spans_delivered_total" in m),
                "kernel": total(m, "sitsprobe_http_server_requests_total"),
                "stitched": total(m, "sitsprobe_requests_stitched_total"),
                "lost": total(m, "sitsprobe_events_lost_total")}

    def flushed(self, timeout: float = 15.0) -> dict[str, float]:
        """extra() once spans to the file are no longer pending and have stopped moving."""
        end, last = time.monotonic() + timeout, None
        while True:
            now = self.extra()
            if last is not None and now["pending"] == 0 and now["spans"] == last["spans"] \
                    and now["sampled"] == last["sampled"]:
                return now
            if time.monotonic() > end:
                return now
            last = now
            time.sleep(0.3)

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20


# -- the run ---------------------------------------------------------------------------

class Bench:
    def __init__(self, a: argparse.Namespace, cols: list[Column], tmp: Path) -> None:
        self.a, self.cols, self.tmp = a, cols, tmp
        self.only = set(a.only)
        self.values: list[dict] = []  # {"metric", "column", "round", "value"}
        self.runs: list[dict] = []  # everything measured, per measurement
        self.notes: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.idle = self.nginx = self.worker = self.engine = None
        self.loop_bin: Path | None = None
        self.t0 = time.monotonic()

    # -- bookkeeping
    def put(self, metric: str, col: Column, rnd: int, value: float | None) -> None:
        if value is not None:
            self.values.append({"metric": metric, "column": col.key, "round": rnd, "value": value})

    def run_record(self, what: str, col: Column, rnd: int, **data) -> dict:
        rec = {"what": what, "column": col.key, "round": rnd, "t_s": round(time.monotonic() - self.t0, 1), **data}
        self.runs.append(rec)
        return rec

    @staticmethod
    def say(col: Column, rnd: int, what: str, text: str) -> None:
        print(f"  round {rnd}  {col.label:16} {what:18} {text}", flush=True)

    def foreign(self, agent: Agent | None) -> int:
        return foreign_probes(agent.p.pid if agent else None)[0]

    # -- set-up
    def start(self) -> None:
        self.idle = subprocess.Popen(["sleep", "86400"])  # what session A's agent traces
        self.procs.append(self.idle)
        if self.only & {"nginx", "paced"}:
            port = free_port()
            self.nginx, self.worker = start_nginx(self.tmp, port)
            self.procs.append(self.nginx)
            self.nginx_url = f"http://127.0.0.1:{port}/index.html"
        if "syscall" in self.only:
            cc = shutil.which(os.environ.get("CC", "cc"))
            if cc is None:
                self.notes.append("syscall rows skipped: no C compiler (cc, or $CC) to build bench/syscall_loop.c")
            else:
                self.loop_bin = self.tmp / "syscall_loop"
                subprocess.run([cc, "-O2", "-o", str(self.loop_bin), str(BENCH / "syscall_loop.c")], check=True)
        if "engine" in self.only:
            if importlib.util.find_spec("torch") is None:
                self.notes.append("engine rows skipped: torch is not installed in this venv")
            else:
                self.engine = Engine(self.tmp)
                self.procs.append(self.engine.proc)
                self.loadgen(self.a.warmup + 2)  # its first requests are slow: outside every round

    def close(self) -> None:
        for p in reversed(self.procs):
            stop(p)

    def alive(self) -> None:
        """Every server still up: a run without one measures nothing (and an agent
        told to trace a dead pid would wait for it)."""
        for name, p in (("nginx", self.nginx), ("the engine", self.engine and self.engine.proc)):
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}); see {self.tmp}")
        if self.worker is not None and not self.worker.is_running():
            raise RuntimeError(f"the nginx worker {self.worker.pid} exited")

    # -- one agent session
    def args(self, col: Column, compiled_dir: Path) -> list[str]:
        """``col``'s `run` options, with compiled_dir (where its programs are
        kept for the next start) set to ``compiled_dir``: its own config file
        (-c) with that key added. A tree that has no such key compiles at
        every start, and a config that sets it keeps it: their options as
        they are."""
        if "\ncompiled_dir:" not in (col.cwd / "sitsprobe" / "defaults.yaml").read_text():
            return col.args
        conf = (yaml.safe_load(Path(col.args[1]).read_text()) if col.args[:1] == ["-c"] else None) or {}
        if "compiled_dir" in conf:
            return col.args
        path = compiled_dir.with_suffix(".yaml")
        path.write_text(yaml.safe_dump({**conf, "compiled_dir": str(compiled_dir)}))
        return ["-c", str(path)]

    def agent(self, col: Column, rnd: int, session: str, pids: list[int],
              compiled_dir: Path | None = None) -> CostAgent | None:
        """``col``'s agent tracing ``pids``, once it tracks them; its programs
        kept in ``compiled_dir`` (default: the column's own folder, so that a
        session's start, but the run's first, loads them kept)."""
        tag = f"{col.key}-{session}-r{rnd}"
        select = [x for pid in pids for x in ("--pid", str(pid))]
        try:
            agent = CostAgent(select, pids, self.tmp, tag, command=col.command, env=col.env,
                              args=self.args(col, compiled_dir or self.tmp / f"compiled-{col.key}"),
                              poll_s=0.05, cwd=col.cwd)
        except RuntimeError as e:
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            self.say(col, rnd, f"agent {session}", f"did not start: {lines[0] if lines else e}"
                     f" (log: {self.tmp / f'agent-{tag}.log'})")
            self.notes.append(f"{col.label} round {rnd} session {session}: the agent did not start")
            return None
        self.run_record("start", col, rnd, session=session, healthz_s=agent.healthz_s,
                        tracking_s=agent.startup_s, rss_mb=agent.rss_mb())
        self.say(col, rnd, f"agent {session}", f"/healthz after {_g(agent.healthz_s, '.2f')} s,"
                 f" tracking after {agent.startup_s:.2f} s")
        return agent

    def startup_run(self, col: Column, rnd: int) -> None:
        """Two starts of ``col``'s agent: on an empty compiled_dir (net.c
        compiled), then on what that start kept there (its programs loaded
        onto maps made anew)."""
        folder = self.tmp / f"compiled-{col.key}-r{rnd}"
        for session, metric in (("compiles", "healthz_s"), ("kept", "healthz_kept_s")):
            agent = self.agent(col, rnd, session, [self.idle.pid], folder)
            if agent is None:
                return
            kept = "net.c: its programs kept from an earlier start" in agent.log_path.read_text()
            self.put(metric, col, rnd, agent.healthz_s if kept == (session == "kept") else None)
            agent.stop()
            if session == "compiles" and not kept and not folder.exists():
                return  # a tree that keeps nothing: every start compiles

    def session_a(self, col: Column, rnd: int) -> None:
        """No agent, or the agent tracing the idle sleep (and the engine):
        nginx untraced, the syscall loops, the engine."""
        self.alive()
        agent = None
        if col.agent:
            pids = [self.idle.pid] + ([self.engine.pid] if self.engine else [])
            agent = self.agent(col, rnd, "A", pids)
            if agent is None:
                return
        try:
            if "nginx" in self.only:
                self.nginx_run(col, rnd, agent, "ng")
            if self.loop_bin:
                self.syscall_run(col, rnd, agent)
            if self.engine:
                self.engine_run(col, rnd, agent)
            if agent:
                self.run_record("idle agent", col, rnd, rss_mb=agent.rss_mb(), cpu_s=cpu_s(agent.ps))
        finally:
            if agent:
                agent.stop()

    def session_b(self, col: Column, rnd: int) -> None:
        """The agent tracing the nginx worker: the paced rates, then saturated."""
        self.alive()
        agent = self.agent(col, rnd, "B", [self.worker.pid])
        if agent is None:
            return
        try:
            if "paced" in self.only:
                for rate in PACED_RATES:
                    self.paced_run(col, rnd, agent, rate)
                self.put("rss_mb", col, rnd, agent.rss_mb())
            if "nginx" in self.only:
                self.nginx_run(col, rnd, agent, "ngt")
        finally:
            agent.stop()

    # -- measurements
    def nginx_run(self, col: Column, rnd: int, agent: CostAgent | None, metric: str) -> None:
        a, url = self.a, self.nginx_url
        if a.warmup:
            run_wrk(url, NGINX_CONNS, a.warmup)
        traced = metric == "ngt"
        if agent and traced:
            agent.settled()  # the warm-up's backlog, outside the measured window
        before = agent.counts() if agent and traced else None
        foreign = self.foreign(agent)
        n0, k0 = cpu_s(self.worker), sys_s(self.worker)
        a0 = cpu_s(agent.ps) if agent else None
        w = run_wrk(url, NGINX_CONNS, a.seconds)
        n1, k1 = cpu_s(self.worker), sys_s(self.worker)
        foreign = max(foreign, self.foreign(agent))
        rec = self.run_record("nginx traced" if traced else "nginx untraced", col, rnd, wrk=w.__dict__,
                              nginx_cpu_s=n1 - n0, nginx_sys_s=k1 - k0, foreign_bpf=foreign)
        if agent:
            if traced:
                rec["counts"], rec["catch_up_s"] = agent.settled(before, w.requests)
            rec["agent_cpu_s"] = cpu_s(agent.ps) - a0
        self.put(f"{metric}_rps", col, rnd, w.rps)
        self.put(f"{metric}_ksys", col, rnd, (k1 - k0) / w.requests * 1e6)
        self.say(col, rnd, "nginx " + ("traced" if traced else "untraced"),
                 f"{w.rps:8.0f} req/s, nginx sys {(k1 - k0) / w.requests * 1e6:5.1f} µs/req"
                 + (f", agent saw {rec['counts']['kernel']:.0f} of {w.requests}" if traced and agent else "")
                 + self._foreign(foreign))

    def paced(self, rate: int, seconds: float) -> tuple[dict, float]:
        out, cpu = run_child([sys.executable, str(BENCH / "paced_client.py"), "--url", self.nginx_url,
                              "--rate", str(rate), "--seconds", str(seconds), "--conns", str(PACED_CONNS)],
                             timeout=seconds * 3 + 30)
        return json.loads(out), cpu

    def paced_run(self, col: Column, rnd: int, agent: CostAgent, rate: int) -> None:
        a = self.a
        if a.warmup:
            self.paced(rate, a.warmup)
        agent.settled()
        agent.flushed()
        before, base, a0 = agent.extra(), agent.counts(), cpu_s(agent.ps)
        foreign = self.foreign(agent)
        t0 = time.monotonic()
        load, load_cpu = self.paced(rate, a.seconds)
        wall, a_run = time.monotonic() - t0, cpu_s(agent.ps) - a0
        _, catch_up = agent.settled(base, load["ok"])
        after = agent.flushed()
        a_all = cpu_s(agent.ps) - a0
        foreign = max(foreign, self.foreign(agent))
        d = {k: after[k] - before[k] for k in ("seen", "sampled", "spans", "kernel", "stitched", "lost")}
        spans = d["spans"] if after["has_spans"] else d["sampled"]  # an agent without span accounting
        ok = load["ok"]
        self.run_record(f"paced {rate}", col, rnd, load=load, load_cpu_s=load_cpu, wall_s=wall,
                        agent_cpu_run_s=a_run, agent_cpu_s=a_all, deltas=d, catch_up_s=catch_up,
                        foreign_bpf=foreign)
        self.put(f"p{rate}_us_span", col, rnd, a_all / spans * 1e6 if spans else None)
        self.put(f"p{rate}_us_req", col, rnd, a_all / ok * 1e6 if ok else None)
        self.put(f"p{rate}_share", col, rnd, d["sampled"] / ok * 100 if ok else None)
        self.put(f"p{rate}_seen", col, rnd, d["seen"] / ok * 100 if ok else None)
        self.put(f"p{rate}_core", col, rnd, a_run / wall * 100)
        self.say(col, rnd, f"paced {rate}/s",
                 f"{load['achieved_rps']:7.0f} req/s, {ok} ok ({load['errors']} errors), traced"
                 f" {d['sampled']:.0f}, {spans:.0f} spans, agent {a_run / wall * 100:.0f} % of a core,"
                 f" {_g(a_all / spans * 1e6 if spans else None, '.0f')} µs/span" + self._foreign(foreign))

    def syscall_run(self, col: Column, rnd: int, agent: CostAgent | None) -> None:
        for kind, metric in (("pipe", "sys_pipe"), ("socketpair", "sys_sock")):
            foreign = self.foreign(agent)
            out, cpu = run_child([str(self.loop_bin), kind, str(self.a.seconds)], timeout=self.a.seconds + 30)
            n, secs, per_s = out.split()
            foreign = max(foreign, self.foreign(agent))
            self.run_record(f"syscall {kind}", col, rnd, iterations=int(n), seconds=float(secs),
                            per_s=float(per_s), cpu_s=cpu, foreign_bpf=foreign)
            self.put(metric, col, rnd, float(per_s))
            self.say(col, rnd, f"loop {kind}", f"{float(per_s) / 1e3:8.0f} k iterations/s" + self._foreign(foreign))

    def loadgen(self, seconds: float) -> dict:
        out = self.tmp / "loadgen.json"
        run_child([sys.executable, str(ROOT / "examples/loadgen.py"), "--url", self.engine.url,
                   "--rate", str(ENGINE_RATE), "--requests", str(max(1, int(ENGINE_RATE * seconds))),
                   "--stream", "--max-tokens", str(ENGINE_MAX_TOKENS), "--timeout", "30",
                   "--json", str(out)], timeout=seconds * 3 + 60)
        summary = json.loads(out.read_text())
        summary.pop("records", None)
        return summary

    def engine_run(self, col: Column, rnd: int, agent: CostAgent | None) -> None:
        a = self.a
        if a.warmup:
            self.loadgen(a.warmup)
        if agent:
            agent.settled()
            agent.flushed()
            before, base, a0 = agent.extra(), agent.counts(), cpu_s(agent.ps)
        foreign = self.foreign(agent)
        t0 = time.monotonic()
        s = self.loadgen(a.seconds)
        wall = time.monotonic() - t0
        foreign = max(foreign, self.foreign(agent))
        ok = s["by_status"].get("200", 0)
        rec = self.run_record("engine", col, rnd, loadgen=s, wall_s=wall, foreign_bpf=foreign)
        for key, part, pct in (("eng_lat50", "latency_s", "p50"), ("eng_lat99", "latency_s", "p99"),
                               ("eng_ttft50", "ttft_s", "p50"), ("eng_ttft99", "ttft_s", "p99")):
            v = s[part][pct]
            self.put(key, col, rnd, v * 1e3 if v is not None else None)
        line = (f"{ok}/{s['requests_sent']} ok, latency p50 {_g(self._ms(s, 'latency_s', 'p50'), '.1f')}"
                f" p99 {_g(self._ms(s, 'latency_s', 'p99'), '.1f')} ms, TTFT p50 "
                f"{_g(self._ms(s, 'ttft_s', 'p50'), '.1f')} p99 {_g(self._ms(s, 'ttft_s', 'p99'), '.1f')} ms")
        if agent:
            a_run = cpu_s(agent.ps) - a0
            _, catch_up = agent.settled(base, ok)
            after = agent.flushed()
            d = {k: after[k] - before[k] for k in ("seen", "sampled", "spans", "kernel", "stitched", "lost")}
            rec.update(agent_cpu_run_s=a_run, agent_cpu_s=cpu_s(agent.ps) - a0, deltas=d, catch_up_s=catch_up)
            self.put("eng_core", col, rnd, a_run / wall * 100)
            self.put("eng_spans", col, rnd, d["spans"] / ok if ok and after["has_spans"] else None)
            line += f", agent {a_run / wall * 100:.0f} % of a core, {d['spans'] / max(ok, 1):.1f} spans/req"
        self.say(col, rnd, "engine 100/s", line + self._foreign(foreign))

    @staticmethod
    def _ms(s: dict, part: str, pct: str) -> float | None:
        v = s[part][pct]
        return None if v is None else v * 1e3

    @staticmethod
    def _foreign(n: int) -> str:
        return f"  [others' BPF attached: {n}]" if n else ""

    # -- rounds
    def rounds(self) -> None:
        agents = [c for c in self.cols if c.agent]
        for rnd in range(1, self.a.rounds + 1):
            shift = (rnd - 1) % len(self.cols)
            order = self.cols[shift:] + self.cols[:shift]  # who goes first rotates
            if "startup" in self.only:
                for col in [c for c in order if c.agent]:
                    self.startup_run(col, rnd)
            if self.only & {"nginx", "engine", "syscall"}:
                for col in order:
                    self.session_a(col, rnd)
            if self.only & {"nginx", "paced"}:
                for col in [c for c in order if c.agent] or agents:
                    self.session_b(col, rnd)


# -- the table -------------------------------------------------------------------------

# (group, label, metric, kind, format, base metric of the no-agent column)
#   kind "value": the metric per column; "ratio": per round, over the no-agent
#   column's base metric (default the same metric) of that round
ROWS = [
    ("nginx", "nginx not traced, agent on: req/s", "ng_rps", "value", "n", None),
    ("nginx", "  ratio to no agent", "ng_rps", "ratio", "r", None),
    ("nginx", "  nginx kernel µs/request", "ng_ksys", "value", "f1", None),
    ("nginx", "nginx traced, saturated: req/s", "ngt_rps", "value", "n", "ng_rps"),
    ("nginx", "  ratio to no agent", "ngt_rps", "ratio", "r", "ng_rps"),
    ("nginx", "  nginx kernel µs/request", "ngt_ksys", "value", "f1", "ng_ksys"),
    ("paced", "agent CPU µs/span, 500 req/s", "p500_us_span", "value", "f0", None),
    ("paced", "  per request answered", "p500_us_req", "value", "f0", None),
    ("paced", "agent CPU µs/span, 2,000 req/s", "p2000_us_span", "value", "f0", None),
    ("paced", "  per request answered", "p2000_us_req", "value", "f0", None),
    ("paced", "agent % of a core, 2,000 req/s", "p2000_core", "value", "f1", None),
    ("paced", "requests traced, 2,000 req/s %", "p2000_share", "value", "f1", None),
    ("paced", "  seen by the agent %", "p2000_seen", "value", "f1", None),
    ("paced", "agent RSS after the load, MB", "rss_mb", "value", "f0", None),
    ("startup", "start to /healthz, net.c compiled, s", "healthz_s", "value", "f2", None),
    ("startup", "  its programs kept, s", "healthz_kept_s", "value", "f2", None),
    ("engine", "engine 100/s: latency p50 ms", "eng_lat50", "value", "f1", None),
    ("engine", "  ratio to no agent", "eng_lat50", "ratio", "r", None),
    ("engine", "  latency p99 ms", "eng_lat99", "value", "f1", None),
    ("engine", "  ratio to no agent", "eng_lat99", "ratio", "r", None),
    ("engine", "  TTFT p50 ms", "eng_ttft50", "value", "f1", None),
    ("engine", "  ratio to no agent", "eng_ttft50", "ratio", "r", None),
    ("engine", "  TTFT p99 ms", "eng_ttft99", "value", "f1", None),
    ("engine", "  ratio to no agent", "eng_ttft99", "ratio", "r", None),
    ("engine", "  agent % of a core", "eng_core", "value", "f1", None),
    ("engine", "  spans per request", "eng_spans", "value", "f1", None),
    ("syscall", "pipe write+read: iterations/s", "sys_pipe", "value", "n", None),
    ("syscall", "  ratio to no agent", "sys_pipe", "ratio", "r", None),
    ("syscall", "socketpair send+recv: iter/s", "sys_sock", "value", "n", None),
    ("syscall", "  ratio to no agent", "sys_sock", "ratio", "r", None),
]


def _num(v: float, fmt: str) -> str:
    if fmt == "r":
        return f"{v:.2f}"
    if fmt == "n":  # 3 significant figures, k/M: 985, 1.46M, 31.2k, 18.0k
        div, suffix = next((d, x) for d, x in ((1e6, "M"), (1e3, "k"), (1, "")) if abs(v) >= d * 0.9995 or d == 1)
        text = f"{v / div:#.3g}".rstrip(".")  # '#': keep trailing zeros (18.0k)
        if "e" in text:  # 999.6 rounds to 1.00e+03: one suffix up
            return _num(v * 1.0005, fmt) if suffix != "M" else f"{v / div:.0f}M"
        return text + suffix
    return f"{v:.{fmt[1]}f}"


def cell(vals: list[float], fmt: str) -> str:
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return _num(med, fmt)
    return f"{_num(med, fmt)} ({_num(min(vals), fmt)}-{_num(max(vals), fmt)})"


def table(values: list[dict], cols: list[Column], only: set[str]) -> list[str]:
    def series(metric: str, col: str) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for v in values:
            if v["metric"] == metric and v["column"] == col:
                out.setdefault(v["round"], []).append(v["value"])
        return out

    rows = [["what", *(c.label for c in cols)]]
    for group, label, metric, kind, fmt, base in ROWS:
        if group not in only:
            continue
        cells = []
        for c in cols:
            if kind == "value":
                src = base if (c.key == "none" and base) else metric
                vals = [x for xs in series(src, c.key).values() for x in xs]
                cells.append(cell(vals, fmt))
            elif c.key == "none":
                cells.append("1" if series(base or metric, "none") else "-")
            else:
                ref = series(base or metric, "none")
                mine = series(metric, c.key)
                ratios = [m / ref[r][0] for r, ms in mine.items() for m in ms if r in ref and ref[r][0]]
                cells.append(cell(ratios, fmt))
        if any(x != "-" for x in cells):
            rows.append([label, *cells])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        out.append("| " + " | ".join(x.ljust(widths[0]) if i == 0 else x.rjust(widths[i])
                                     for i, x in enumerate(r)) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2)
                                      for i, w in enumerate(widths)) + "|")
    return out


LEGEND = """\
Cells: median over rounds (min-max). Ratios: each round's figure over that
round's no-agent one (req/s and iterations/s: below 1 is slower; latency: above
1 is slower). nginx: wrk -t1 -c16 on a 380-byte file, 1 worker; "not traced":
the agent runs, tracing an idle `sleep`; kernel µs/request: nginx's system CPU
over wrk's requests (the BPF programs run there). paced: bench/paced_client.py,
8 keep-alive connections; µs/span: the agent's CPU from the load's start until
it has stitched and written everything, over the spans it wrote to its traces
file (sitsprobe_spans_delivered_total{sink="file"}); % of a core: its CPU over
the load's wall time; requests traced: traces exported (sitsprobe_traces_total
{outcome="sampled"}) over requests answered; seen: offered to the sampler. RSS:
VmRSS after both paced loads. /healthz: from launching `sitsprobe run` to a
200, two starts a round: on an empty compiled_dir, then on the programs that
start kept there (a tree without that setting compiles at every start).
engine: examples/loadgen.py --rate 100 --stream --max-tokens 16 (Poisson
arrivals, a new connection each), the agent tracing the engine by --pid.
syscall: bench/syscall_loop.c, 1 byte a call, the agent tracing an idle
`sleep`. Default agent config unless -c was given."""


# -- main ---------------------------------------------------------------------------------

def _g(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def parse_only(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in GROUPS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown group(s) {', '.join(bad) or '(none)'}; choose from {', '.join(GROUPS)}")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each running every configuration (default 3)")
    ap.add_argument("--seconds", type=int, default=5, help="length of each measured load (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="seconds of the same load before each, 0 = none (default 1)")
    ap.add_argument("--only", type=parse_only, default=list(GROUPS), metavar="G[,G...]",
                    help=f"row groups to measure, comma-separated: {', '.join(GROUPS)} (default all)")
    ap.add_argument("--baseline", metavar="PATH", help="another sitsprobe checkout (e.g. a git worktree of an "
                    "older commit): its agent is measured as a third column, with PYTHONPATH=PATH and "
                    "PATH/.venv/bin/python if it exists, else this Python: `python -m sitsprobe.cli run ...`")
    ap.add_argument("--baseline-cmd", metavar="CMD", help="run the baseline agent with CMD (shell words, "
                    "before `run`) instead; PYTHONPATH=PATH is still set")
    ap.add_argument("--agent-cmd", metavar="CMD", help=f"run the agent column with CMD (before `run`; "
                    f"default {SITSPROBE})")
    ap.add_argument("--agent-pythonpath", metavar="PATH", help="PYTHONPATH for the agent column's command")
    ap.add_argument("--agent-config", metavar="FILE", help="`run -c FILE` for the agent column")
    ap.add_argument("--baseline-config", metavar="FILE", help="`run -c FILE` for the baseline column")
    ap.add_argument("--json", metavar="PATH", help="also write the raw numbers here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_cost: run as root (the agent loads BPF; nginx runs as root)", file=sys.stderr)
        return 2
    a.only = list(dict.fromkeys(a.only))
    need = ("wrk", "nginx") if set(a.only) & {"nginx", "paced"} else ()
    for tool in need:
        if not shutil.which(tool):
            print(f"bench_cost: {tool} is not installed (scripts/setup.sh installs it)", file=sys.stderr)
            return 2
    if a.rounds < 1 or a.seconds < 1 or a.warmup < 0:
        ap.error("--rounds and --seconds must be >= 1, --warmup >= 0")

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where started with SIGINT ignored
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    cols = columns(a)
    argv = " ".join(shlex.quote(x) for x in sys.argv[1:])
    env = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get("PYTHONPATH") else ""
    header = [f"reproduce: cd {ROOT} && {env}.venv/bin/python bench/bench_cost.py {argv}".rstrip(), *machine()]
    for c in cols[1:]:
        header.append(f"{c.label}: {c.shown()}  [{c.where}]")
    header.append(f"{a.rounds} round(s) of {a.seconds} s loads ({a.warmup} s warm-up each), "
                  f"rows: {','.join(a.only)}")
    print("\n".join(header) + "\n", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="sitsprobe-bench-cost-"))
    bench = Bench(a, cols, tmp)
    t0 = time.monotonic()
    try:
        bench.start()
        bench.rounds()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping what the bench started", file=sys.stderr, flush=True)
        return 130
    finally:
        bench.close()
    took = time.monotonic() - t0

    print(f"\nload avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; took {took:.0f} s\n")
    print("\n".join(header) + "\n")
    print("\n".join(table(bench.values, cols, set(a.only))))
    print(f"\n{LEGEND}")
    foreign = [r for r in bench.runs if r.get("foreign_bpf")]
    if foreign:
        print("\n" + textwrap.fill(
            f"{len(foreign)} of {len(bench.runs)} measurements ran while other processes had BPF attached "
            "(another agent's syscall hooks fire in every process, so their cells are noise): "
            + ", ".join(sorted({f"{r['what']} r{r['round']} {r['column']}" for r in foreign})), 100))
    for note in bench.notes:
        print(textwrap.fill(f"note: {note}", 100, subsequent_indent="  "))
    print(f"\nlogs and traces: {tmp}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "command": header[0], "machine": header[1:3], "took_s": round(took, 1),
            "options": {k: v for k, v in vars(a).items()},
            "columns": [{"key": c.key, "label": c.label, "command": c.shown() if c.agent else None,
                         "code": c.where} for c in cols],
            "values": bench.values, "runs": bench.runs}, indent=1, default=str) + "\n")
        print(f"raw numbers: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
