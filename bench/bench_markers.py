"""What a marker call costs the engine, with no agent and with the agent attached.

Reproduce (root for the attached half; the venv has bcc):

    sudo .venv/bin/python bench/bench_markers.py              # 100k calls, best of 5
    sudo .venv/bin/python bench/bench_markers.py --calls 300000 --repeat 7

An "engine" subprocess times each call in a loop: ns per call (enter+exit for a
range), the best of --repeat runs. Runs rotate through three phases, so drift
on a shared machine hits all alike: "no agent"; "agent": MarkerProbe (loaded
here) attached to the engine's library, draining its ring only between runs,
which shows what the probes themselves cost the engine; "live": attached and
draining during the run as the agent does (poll(50) in a loop), which adds the
agent's own CPU on the same cores (on 2 vCPUs, a lot). Before each run the
agent catches up (its ring holds a whole run): every event is submitted, none
lost. A pure-Python no-op of the same shape is the floor (run in every phase,
it shows the noise). The paced row times ranges 20 us apart, as an engine with
work between its markers makes them. Last, one counting BPF program is
attached as a uprobe on the exported function, and through bcc's USDT
support, alternating, to show which hook costs less per hit.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PACED_EVERY, PACED_GAP_NS = 10, 20_000  # the paced run: a tenth of the calls, 20 us apart


class _Noop:
    __slots__ = ("a", "b")

    def __init__(self, name, request_id=0):
        self.a, self.b = name, request_id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _noop(cache, key, hit, request_id=0):
    pass


def worker(calls: int, repeat: int, phases: list[str]) -> dict:
    """The engine side: ns per call of each thing in each phase, best of
    `repeat` runs; phases rotate run by run, so drift hits all alike."""
    from sitsprobe import markers

    def noop_range():
        for i in range(calls):
            with _Noop("decode", request_id=i):
                pass

    def noop_cache():
        for i in range(calls):
            _noop("prefix", "tenant-7/prompt-1234", True, request_id=i)

    def marker_range():
        for i in range(calls):
            with markers.range("decode", request_id=i):
                pass

    def marker_cache():
        for i in range(calls):
            markers.cache_get("prefix", "tenant-7/prompt-1234", True, request_id=i)

    def marker_range_paced():
        """Ranges 20 us apart (the engine busy in between): only the calls timed."""
        spent, clock = 0, time.perf_counter_ns
        for i in range(calls // PACED_EVERY):
            t0 = clock()
            with markers.range("decode", request_id=i):
                pass
            t1 = clock()
            spent += t1 - t0
            while clock() < t1 + PACED_GAP_NS:
                pass
        return spent * PACED_EVERY  # so that timed() divides by calls

    def timed(fn) -> dict[str, float]:
        best = dict.fromkeys(phases, float("inf"))
        for _ in range(repeat):
            for phase in phases:
                print(phase, flush=True)  # the agent drains, then sets the phase up
                sys.stdin.readline()
                t0 = time.perf_counter_ns()
                spent = fn() or time.perf_counter_ns() - t0
                best[phase] = min(best[phase], spent / calls)
        return best

    return {"python no-op, range shape": timed(noop_range),
            "python no-op, cache_get shape": timed(noop_cache),
            "markers.range enter+exit": timed(marker_range),
            "markers.cache_get": timed(marker_cache),
            "markers.range, 20 us apart": timed(marker_range_paced)}


def run_engine(calls: int, repeat: int, phases: dict) -> dict:
    """Run the engine; before each timed run call phases[name]() it asks for."""
    p = subprocess.Popen([sys.executable, __file__, "--worker", str(calls), str(repeat),
                          ",".join(phases)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in p.stdout:
        if line.strip() not in phases:
            result = json.loads(line)
            break
        phases[line.strip()]()
        p.stdin.write("go\n")
        p.stdin.flush()
    if p.wait():
        raise SystemExit(f"engine subprocess failed ({p.returncode})")
    return result


def ring_pages(events: int) -> int:
    """A ring that holds `events`: a whole run, so that none is lost."""
    from sitsprobe.probes.markers import EVENT_BYTES

    pages = 1
    while pages * 4096 < events * EVENT_BYTES:
        pages *= 2
    return pages


PHASES = ("no agent", "agent", "agent live")


def with_and_without(calls: int, repeat: int, library: str) -> tuple[dict, dict, int]:
    """The engine's costs with no agent, with MarkerProbe attached (draining
    between runs: the probes' cost alone), and with it attached and draining
    during runs, as a live agent does (poll(50) in a loop, on the same cores)."""
    from sitsprobe.probes.markers import MarkerProbe

    seen = [0]
    probe = MarkerProbe(None, lambda e: seen.__setitem__(0, seen[0] + 1),
                        ring_pages=ring_pages(2 * calls))
    stop, live = threading.Event(), threading.Event()

    def agent_loop():  # the only thread that polls
        while not stop.is_set():
            if live.is_set():
                probe.poll(50)
            else:
                time.sleep(0.01)

    def phase(attach: bool, poll_during_run: bool):
        def setup():
            live.set()
            before = -1
            while before != seen[0]:  # caught up with the last run: none lost
                before = seen[0]
                time.sleep(0.15)
            probe.attach(library) if attach else probe.detach(library)
            if not poll_during_run:
                live.clear()
                time.sleep(0.1)  # out of its last poll
        return setup

    loop = threading.Thread(target=agent_loop)
    loop.start()
    try:
        result = run_engine(calls, repeat, dict(zip(PHASES, (
            phase(False, False), phase(True, False), phase(True, True)))))
        phase(False, False)()
        return result, probe.counters(), seen[0]
    finally:
        stop.set()
        loop.join()
        probe.close()


COUNT_ONLY = r"""
BPF_ARRAY(hits, u64, 1);
int on_hit(struct pt_regs *ctx) { int z = 0; u64 *v = hits.lookup(&z); if (v) (*v)++; return 0; }
"""


def hook_costs(calls: int, repeat: int, library: str) -> dict[str, float]:
    """markers.cache_get with one counting program as a uprobe on the function,
    and as bcc's USDT attach of the probe inside it, alternating."""
    from bcc import BPF, USDT

    lib, sym = library.encode(), b"sitsprobe_cache_get"
    up = BPF(text=COUNT_ONLY)
    u = USDT(path=library)
    u.enable_probe(probe="cache_get", fn_name="on_hit")
    usdt = BPF(text=COUNT_ONLY, usdt_contexts=[u])  # attached from here on

    def detach_usdt():
        for ev in list(usdt.uprobe_fds):
            usdt.detach_uprobe_event(ev)

    def uprobe():
        detach_usdt()
        up.attach_uprobe(name=lib, sym=sym, fn_name=b"on_hit", pid=-1)

    def usdt_on():
        up.detach_uprobe(name=lib, sym=sym, pid=-1)
        u.attach_uprobes(usdt, True)

    try:
        detach_usdt()
        up.attach_uprobe(name=lib, sym=sym, fn_name=b"on_hit", pid=-1)
        return run_engine(calls, repeat, {"uprobe": uprobe, "usdt": usdt_on})["markers.cache_get"]
    finally:
        up.cleanup()
        usdt.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        calls, repeat, phases = args.worker
        print(json.dumps(worker(int(calls), int(repeat), phases.split(","))), flush=True)
        return

    from sitsprobe import markers

    library = markers.library_path()
    if library is None:
        raise SystemExit("the marker library did not build: markers are Python no-ops here")
    result, counters, seen = with_and_without(args.calls, args.repeat, library)
    print(f"{args.calls} calls, best of {args.repeat} alternating runs; ns per call")
    print(f"{'':30}{'no agent':>9}{'agent':>9}{'ratio':>7}{'live':>9}{'ratio':>7}")
    for name, ns in result.items():
        bare, agent, live = (ns[p] for p in PHASES)
        print(f"{name:30}{bare:>9.0f}{agent:>9.0f}{agent / bare:>6.1f}x"
              f"{live:>9.0f}{live / bare:>6.1f}x")
    print(f"agent saw {seen} events; in-kernel counters: {counters}")
    hooks = hook_costs(args.calls, args.repeat, library)
    print(f"markers.cache_get under one counting program: uprobe {hooks['uprobe']:.0f} ns, "
          f"USDT {hooks['usdt']:.0f} ns")


if __name__ == "__main__":
    main()
