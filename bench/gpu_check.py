"""GPU check: what the sitsprobe agent measures on a real GPU, next to nvidia-smi.

    sudo .venv/bin/python bench/gpu_check.py [--normal-s 60] [--collapse-s 45] [--rate 20]
                                             [--burn-ms 200] [--json gpu_check.json]

The agent itself (sitsprobe.agent.Agent: NVML sampler, CUDA uprobes, engine
markers, collapse detector, trace export) runs in this process, selecting
the reference engine by command line, through two phases (under 5 minutes):
  normal    examples/engine/serve.py --device cuda under open-loop load
            (examples/loadgen.py): the detector must stay quiet;
  collapse  a fresh engine with SITSPROBE_ENGINE_CPU_BURN_MS set (CPU-bound
            preprocessing before prefill) under the same load: the GPU idles
            while requests queue; the detector must raise, naming cpu_bound.
Every 5 s a line shows the agent's numbers beside `nvidia-smi --query-gpu=
utilization.gpu,memory.used --format=csv`. At the end: the alerts with their
evidence, what the traces say about GPU use per request, and one frame of
`sitsprobe top`. Exit 0 when every check passed, 1 when one failed, 2 when
there is no GPU here (with the reason). --dry-run checks the plumbing on a
machine without a GPU (the engine on CPU, NVML replaced by a recorded GPU);
its verdict means nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sitsprobe import config  # noqa: E402
from sitsprobe.agent import Agent  # noqa: E402
from sitsprobe.gpu.nvml import available  # noqa: E402
from sitsprobe.top import Source, once  # noqa: E402

BURN_ENV = "SITSPROBE_ENGINE_CPU_BURN_MS"
GPU_CHECK_SEED = "1117"  # the engines' --model-seed: how the agent tells them from others
ENGINE_CMDLINE = rf"examples/engine/serve\.py .*--model-seed {GPU_CHECK_SEED}\b"
# The reference model is tiny: its kernels keep few SMs busy, so GPM SM activity
# (and even utilization.gpu) stays at a few percent under load. The check judges
# busy against the GPU's own working level only, not the default absolute bars
# (a 10 % working level, a 5 % floor), which are for real models.
CHECK_OVERRIDES = {"gpu.collapse_min_working_percent": 0.2, "gpu.collapse_floor_percent": 0.0,
                   "gpu.collapse_min_history_s": 20.0}


def say(msg: str = "") -> None:
    print(msg, flush=True)


def nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        out = subprocess.run([exe, "--query-gpu=utilization.gpu,memory.used", "--format=csv"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    rows = out.strip().splitlines()
    return rows[1] if len(rows) > 1 else out.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    def __init__(self, burn_ms: int, log: Path, device: str):
        env = {k: v for k, v in os.environ.items() if k != BURN_ENV}
        if burn_ms:
            env[BURN_ENV] = str(burn_ms)
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/engine/serve.py"), "--device", device,
             "--port", "0", "--max-batch-size", "16", "--model-seed", GPU_CHECK_SEED],
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env, cwd=ROOT)
        self.pid = self.proc.pid
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(180)
        line = box[0] if box else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the engine did not start ({line.strip() or 'no output'}):\n"
                               + log.read_text()[-2000:])
        self.port = int(line.rsplit(":", 1)[1])
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def launches(agent: Agent, pid: int) -> int | None:
    cuda = agent.gpu.cuda
    if cuda is None:
        return None
    return sum(c.calls for c in cuda.counts() if c.pid == pid and "Launch" in c.function)


def line(agent: Agent, engine: Engine, t_s: float) -> dict:
    gpu = (agent.gpu.sampler.process_gpus().get(engine.pid) or (0,))[0]
    s = agent.gpu.sampler.latest().get(gpu)
    state = agent.gpu.detector.status().get(gpu, {})
    row = {"t_s": round(t_s, 1), "gpu": gpu, "signal": s.signal if s else None,
           "busy_percent": s.busy_percent if s else None,
           "util_gpu_percent": s.util_gpu_percent if s else None,
           "memory_used_mib": (round(s.memory_used_bytes / 2**20)
                               if s and s.memory_used_bytes is not None else None),
           "nvidia_smi": nvidia_smi(), "demand": state.get("demand"),
           "working_level_percent": state.get("working_level_percent"), "alert": state.get("alert"),
           "engine_launches": launches(agent, engine.pid)}
    say(f"t={row['t_s']:5.1f}s gpu {gpu} {row['signal']} busy={row['busy_percent']}% "
        f"util={row['util_gpu_percent']}% mem={row['memory_used_mib']}MiB | nvidia-smi: {row['nvidia_smi']}"
        f" | demand={row['demand']} level={row['working_level_percent']} launches={row['engine_launches']}"
        f" alert={row['alert']}")
    return row


def phase(name: str, seconds: float, burn_ms: int, args, agent: Agent, tmp: Path) -> dict:
    say(f"\n== {name}: engine{f' with {BURN_ENV}={burn_ms}' if burn_ms else ''}, "
        f"{args.rate} req/s for {seconds:.0f} s")
    engine = Engine(burn_ms, tmp / f"engine-{name}.log", "cpu" if args.dry_run else "cuda")
    if args.dry_run:  # the recorded GPU says the engine runs on it
        args.recorded.gpus[0].compute_pids.append(engine.pid)
    deadline = time.monotonic() + 30
    while engine.pid not in agent.engine.instrumented and time.monotonic() < deadline:
        time.sleep(0.2)
    say(f"engine pid {engine.pid} on :{engine.port}, traced: {engine.pid in agent.tracked}, "
        f"markers attached: {engine.pid in agent.engine.instrumented}")
    out = tmp / f"loadgen-{name}.json"
    load = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/loadgen.py"), "--url", f"http://127.0.0.1:{engine.port}",
         "--rate", str(args.rate), "--requests", str(int(args.rate * seconds)), "--max-tokens", "32",
         "--timeout", "30", "--json", str(out)], stdout=subprocess.DEVNULL, cwd=ROOT)
    start, first_alert, rows = time.monotonic(), len(agent.gpu.alerts), []
    while load.poll() is None and time.monotonic() - start < seconds + 40:
        time.sleep(5)
        rows.append(line(agent, engine, time.monotonic() - start))
        if len(rows) == 2:  # mid-phase, under load
            say("sitsprobe top --once:\n" + once(Source(f"http://127.0.0.1:{agent.config.metrics.port}"), 1.0))
    if load.poll() is None:
        load.kill()
    load.wait()
    result = {"phase": name, "burn_ms": burn_ms, "engine_pid": engine.pid, "lines": rows,
              "engine_launches": launches(agent, engine.pid),
              "alerts": [{"state": a.state, "gpu": a.gpu, "pid": a.pid, "cause": a.cause,
                          "window_s": round((a.window_end_ns - a.window_start_ns) / 1e9, 1),
                          "evidence": a.evidence} for a in agent.gpu.alerts[first_alert:]],
              "loadgen": {k: v for k, v in (json.loads(out.read_text()) if out.exists() else {}).items()
                          if k in ("requests_sent", "by_status", "throughput_rps", "latency_s")}}
    for a in result["alerts"]:
        say(f"ALERT {a['state']} gpu {a['gpu']} pid {a['pid']}: {a['cause']}  evidence {json.dumps(a['evidence'])}")
    say(f"loadgen: {json.dumps(result['loadgen'])}")
    engine.stop()
    return result


def traced_gpu_use(path: Path) -> dict:
    """What the exported traces say about GPU use: compute stages naming a GPU, their mean
    busy share, and requests carrying a share of launches."""
    stages, busy, with_launches = 0, [], 0
    for text in path.read_text().splitlines() if path.exists() else ():
        for rs in json.loads(text)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {kv["key"]: next(iter(kv["value"].values())) for kv in span.get("attributes", [])}
                    if "sitsprobe.gpu.index" in attrs:
                        stages += 1
                        if "sitsprobe.gpu.busy_percent" in attrs:
                            busy.append(float(attrs["sitsprobe.gpu.busy_percent"]))
                    with_launches += "sitsprobe.cuda.launches" in attrs
    return {"stages_on_gpu": stages, "stage_busy_mean_percent": round(sum(busy) / len(busy), 2) if busy else None,
            "requests_with_launches": with_launches}


def checks(normal: dict, collapse: dict, traced: dict, dry_run: bool) -> list[tuple[bool, str]]:
    busy = [r["busy_percent"] for r in normal["lines"] if r["busy_percent"] is not None]
    out = [(bool(busy), "NVML samples with a busy reading, through the agent"),
           (not [a for a in normal["alerts"] if a["state"] == "raised"], "no collapse alert under normal load"),
           (any(a["state"] == "raised" and a["cause"] == "cpu_bound" and a["pid"] == collapse["engine_pid"]
                for a in collapse["alerts"]), "a collapse alert naming cpu_bound and the engine"),
           (traced["stages_on_gpu"] > 0, "prefill/decode spans name their GPU and its busy share")]
    if not dry_run:
        out += [((normal["engine_launches"] or 0) > 0, "kernel launches counted by the CUDA uprobes"),
                (traced["requests_with_launches"] > 0, "requests carry their share of launches")]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--normal-s", type=float, default=60)
    ap.add_argument("--collapse-s", type=float, default=45)
    ap.add_argument("--rate", type=float, default=20, help="requests per second, both phases")
    ap.add_argument("--burn-ms", type=int, default=200, help=f"{BURN_ENV} in the collapse phase")
    ap.add_argument("--interval-ms", type=int, default=200, help="NVML sampling interval")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--dry-run", action="store_true",
                    help="plumbing only, no GPU: the engine on CPU, NVML replaced by a recorded GPU")
    args = ap.parse_args()

    backend = None
    if args.dry_run:
        from sitsprobe.gpu.recorded import RecordedBackend, RecordedGpu
        backend = RecordedBackend([RecordedGpu(name="recorded (dry run)", rates=(50.0, 10.0))])
    args.recorded = backend
    ok, reason = available(backend)
    if not ok:
        say(f"gpu_check: no GPU to check here: {reason}.\n"
            "Run it on a machine with an NVIDIA GPU and its driver; nothing was checked.")
        return 2
    say(f"gpu_check: NVML sees {reason}")
    say(f"nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv: {nvidia_smi()}")
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as d:
        tmp = Path(d)
        traces = tmp / "traces.jsonl"
        agent = Agent(config.load(overrides={
            "select.cmdline": [ENGINE_CMDLINE], "traces.file": str(traces),
            "metrics.port": free_port(), "metrics.address": "127.0.0.1",
            "gpu.interval_ms": args.interval_ms, **CHECK_OVERRIDES}), gpu_backend=backend)
        stop = threading.Event()
        agent.start()
        if agent.gpu is None or agent.gpu.sampler is None:
            say(f"gpu_check: the agent runs without GPU sampling: {agent.gpu.status if agent.gpu else 'gpu off'}")
            agent.close()
            return 1
        say(f"agent: {agent.gpu.status}; busy signal {agent.gpu.sampler.signals()}; "
            f"CUDA probes {'on' if agent.gpu.cuda is not None else 'off'}")
        runner = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        runner.start()
        try:
            normal = phase("normal", args.normal_s, 0, args, agent, tmp)
            collapse = phase("collapse", args.collapse_s, args.burn_ms, args, agent, tmp)
        except RuntimeError as e:
            say(f"gpu_check: {e}")
            return 1
        finally:
            stop.set()
            runner.join(10)
            errors = agent.gpu.sampler.errors() if agent.gpu.sampler else {}
            agent.close()
        traced = traced_gpu_use(traces)
    results = {"normal": normal, "collapse": collapse, "traced": traced,
               "nvml_errors": {f"{g}/{e}": n for (g, e), n in errors.items()}}
    say("\n== summary")
    for r in (normal, collapse):
        busy = [x["busy_percent"] for x in r["lines"] if x["busy_percent"] is not None]
        say(f"{r['phase']:>8}: busy mean {round(sum(busy) / len(busy), 2) if busy else None}%, "
            f"launches {r['engine_launches']}, alerts {[(a['state'], a['cause']) for a in r['alerts']]}")
    say(f"traces: {json.dumps(traced)}")
    say(f"nvml errors: {results['nvml_errors'] or 'none'}")
    verdict = checks(normal, collapse, traced, args.dry_run)
    for passed, what in verdict:
        say(f"  {'ok  ' if passed else 'FAIL'} {what}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(p for p, _ in verdict) else 1


if __name__ == "__main__":
    sys.exit(main())
