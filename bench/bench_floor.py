"""Where the cost to a process the agent does not trace comes from: the
kernel's syscall-tracing slow path, or the agent's own programs.

    .venv/bin/python bench/bench_floor.py [--rounds 5] [--seconds 3]

bench/syscall_loop.c (a pipe: write+read; an AF_UNIX socketpair: send+recv; one
byte, one thread) runs under four configurations, each once a round, their
order rotating from round to round:

  none        nothing attached
  syscall tp  one syscall tracepoint enabled through tracefs, no BPF at all:
              syscalls:sys_enter_close, which neither loop calls
  sock tp     one socket tracepoint enabled through tracefs, no BPF:
              sock:sock_send_length (the socketpair loop makes it fire; its
              cost there is ftrace's recording, not a BPF program's)
  agent       `sitsprobe run` (default config) tracing an idle `sleep`

Enabling any syscall tracepoint makes the kernel take its syscall-tracing
slow path on every system call of every task (SYSCALL_WORK_SYSCALL_TRACEPOINT
is set on all of them), whichever syscall the tracepoint is for; tracepoints
elsewhere (sock:*, tcp:*, sched:*) cost nothing until they fire. So "syscall
tp" against "none" is the part of the agent's untraced cost that no
program of ours can shorten, and "agent" against "syscall tp" is what its
programs add. Cells: iterations/s and the ratio to that round's "none",
median (min-max) over the rounds. Needs root, a C compiler and tracefs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, Agent, machine  # noqa: E402

from sitsprobe import tracefs  # noqa: E402

CONFIGS = ("none", "syscall tp", "sock tp", "agent")
EVENTS = {"syscall tp": "syscalls/sys_enter_close", "sock tp": "sock/sock_send_length"}
LOOPS = ("pipe", "socketpair")


class Event:
    """A tracefs event enabled for the life of the block (no BPF attached)."""

    def __init__(self, name: str) -> None:
        self.path = Path(tracefs.tracefs_path()) / "events" / name / "enable"

    def __enter__(self) -> "Event":
        self.path.write_text("1")
        return self

    def __exit__(self, *_exc) -> None:
        self.path.write_text("0")


def loop(binary: Path, kind: str, seconds: float) -> float:
    out = subprocess.run([str(binary), kind, str(seconds)], capture_output=True, text=True,
                         check=True, timeout=seconds + 30).stdout.split()
    return float(out[2])


def measure(config: str, binary: Path, seconds: float, tmp: Path, rnd: int) -> dict[str, float]:
    if config == "none":
        return {k: loop(binary, k, seconds) for k in LOOPS}
    if config in EVENTS:
        with Event(EVENTS[config]):
            return {k: loop(binary, k, seconds) for k in LOOPS}
    idle = subprocess.Popen(["sleep", "3600"])
    agent = None
    try:
        agent = Agent(["--pid", str(idle.pid)], [idle.pid], tmp, f"floor-r{rnd}")
        return {k: loop(binary, k, seconds) for k in LOOPS}
    finally:
        if agent is not None:
            agent.stop()
        idle.send_signal(signal.SIGKILL)
        idle.wait()


def cell(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_floor: needs root (tracefs, BPF)", file=sys.stderr)
        return 2
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("bench_floor: needs a C compiler (cc, or $CC)", file=sys.stderr)
        return 2
    tracefs.ensure_mounted()
    print(f"# {' '.join(['bench/bench_floor.py', *sys.argv[1:]])}")
    for line in machine():
        print(f"# {line}")
    runs: dict[tuple[str, str], list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sitsprobe-floor-") as d:
        tmp = Path(d)
        binary = tmp / "syscall_loop"
        subprocess.run([cc, "-O2", "-o", str(binary), str(ROOT / "bench/syscall_loop.c")], check=True)
        for rnd in range(1, a.rounds + 1):
            shift = (rnd - 1) % len(CONFIGS)
            got = {c: measure(c, binary, a.seconds, tmp, rnd) for c in CONFIGS[shift:] + CONFIGS[:shift]}
            for c, per in got.items():
                for k, v in per.items():
                    runs.setdefault((c, k), []).append(v)
                    ratios.setdefault((c, k), []).append(v / got["none"][k])
            print(f"round {rnd}: " + ", ".join(f"{c} {got[c]['pipe'] / 1e6:.2f}M/{got[c]['socketpair'] / 1e6:.2f}M"
                                               for c in CONFIGS), flush=True)
            time.sleep(0.5)
    rows = [["configuration", *(f"{k} iter/s" for k in LOOPS), *(f"{k} ratio" for k in LOOPS)]]
    for c in CONFIGS:
        rows.append([c, *(cell([v / 1e6 for v in runs[c, k]], ".2f") + "M" for k in LOOPS),
                     *(cell(ratios[c, k], ".2f") for k in LOOPS)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for n, r in enumerate(rows):
        print("| " + " | ".join(x.ljust(widths[i]) if i == 0 else x.rjust(widths[i])
                                for i, x in enumerate(r)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":"
                                 for i, w in enumerate(widths)) + "|")
    return 0


if __name__ == "__main__":
    sys.exit(main())
