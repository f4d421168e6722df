"""GPU check: what sitsprobe's GPU layer measures on a real GPU, next to nvidia-smi.

    sudo python bench/gpu_check.py [--normal-s 60] [--collapse-s 45] [--rate 20]
                                   [--burn-ms 200] [--json gpu_check.json]

Two phases, under 5 minutes in all:
  normal    the reference engine (examples/engine/serve.py --device cuda) under
            open-loop load (examples/loadgen.py): NVML samples (busy and the signal
            it came from), CUDA calls counted by the uprobes, the engine's threads'
            on-CPU share; the collapse detector must stay quiet.
  collapse  the same engine and load with SITSPROBE_ENGINE_CPU_BURN_MS set (a
            CPU-bound preprocessing stage before prefill): the GPU idles while
            requests queue; the detector must raise, naming cpu_bound.
Every 5 s a line shows the agent's numbers beside `nvidia-smi --query-gpu=
utilization.gpu,memory.used --format=csv`. Exit 0 when every check passed, 1
when one failed, 2 when there is no GPU here to check (with the reason).
The CUDA uprobes need root, bcc and kernel headers; without them the check
says why and goes on with NVML alone.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sitsprobe import procs  # noqa: E402
from sitsprobe.gpu.collapse import CollapseConfig, CollapseDetector  # noqa: E402
from sitsprobe.gpu.cuda import ShareTracker  # noqa: E402
from sitsprobe.gpu.host import HostSampler  # noqa: E402
from sitsprobe.gpu.nvml import GpuSample, NvmlSampler, available  # noqa: E402

BURN_ENV = "SITSPROBE_ENGINE_CPU_BURN_MS"
# The reference model is tiny: its kernels keep few SMs busy, so GPM SM activity
# (and even utilization.gpu) stays at a few percent under load. The check judges
# each signal against its own working level (the relative test only), not the
# default absolute bars (min_working_percent 10, floor 5), which are for real models.
CHECK_CONFIG = CollapseConfig(min_working_percent=0.2, floor_percent=0.0, min_history_s=20.0)


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


def open_cuda_probe():
    """(CudaProbe, None) or (None, why not)."""
    if os.geteuid() != 0:
        return None, "not root: CUDA uprobes need root"
    try:
        from sitsprobe import kheaders, tracefs
        from sitsprobe.probes.cuda import CudaProbe

        tracefs.ensure_mounted()
        kheaders.install(kheaders.resolve())
        return CudaProbe(), None
    except ImportError as e:
        return None, f"bcc is not importable ({e})"
    except Exception as e:  # headers, compile or load: say it and go on with NVML
        return None, f"{type(e).__name__}: {e}"


class Engine:
    def __init__(self, burn_ms: int, log: Path, device: str = "cuda"):
        env = dict(os.environ)
        if burn_ms:
            env[BURN_ENV] = str(burn_ms)
        else:
            env.pop(BURN_ENV, None)
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples/engine/serve.py"), "--device", device,
             "--port", "0", "--max-batch-size", "16"],
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env, cwd=ROOT)
        self.pid = self.proc.pid
        self.port = 0
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

    def in_flight(self) -> int:
        """Requests in flight, read as the client connections open on its port."""
        return sum(1 for _, local, _ in procs.established(self.pid) if local.port == self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Watch:
    """Everything the agent's GPU layer holds, fed from the sampler's thread and this one."""

    def __init__(self, sampler: NvmlSampler) -> None:
        self.sampler = sampler
        self.lock = threading.Lock()
        self.busy = CollapseDetector(CHECK_CONFIG)  # on the sampler's busy signal
        self.rates = CollapseDetector(CHECK_CONFIG)  # on nvmlDeviceGetUtilizationRates
        self.samples: list[GpuSample] = []
        self.alerts: list[tuple[str, object]] = []

    def on_sample(self, s: GpuSample) -> None:
        with self.lock:
            self.samples.append(s)
            self.alerts += [("busy", a) for a in self.busy.observe_sample(s)]
            if s.util_gpu_percent is not None:
                self.alerts += [("utilization.gpu", a) for a in self.rates.observe_gpu(
                    s.gpu, s.ts_ns, s.util_gpu_percent, s.throttle_reasons)]

    def demand(self, pid: int, ts: int, n: int, host, shares) -> None:
        gpus = self.sampler.process_gpus().get(pid) or (0,)  # (0,): not seen on a GPU yet
        with self.lock:
            for d in (self.busy, self.rates):
                for gpu in gpus:
                    d.observe_demand(gpu, pid, ts, n)
                if host is not None:
                    d.observe_host(pid, ts, host.on_cpu_max, host.runq_wait_max)
                if shares is not None:
                    d.observe_cuda(pid, ts, shares.copy, shares.sync)


def run_phase(name: str, seconds: float, burn_ms: int, args, watch: Watch, cuda, tmp: Path) -> dict:
    say(f"\n== {name}: engine{f' with {BURN_ENV}={burn_ms}' if burn_ms else ''}, "
        f"{args.rate} req/s for {seconds:.0f} s")
    engine = Engine(burn_ms, tmp / f"engine-{name}.log", "cpu" if args.dry_run else "cuda")
    say(f"engine pid {engine.pid} on :{engine.port}")
    hosts, shares = HostSampler(), ShareTracker()
    if cuda is not None:
        for a in cuda.attach_pids([engine.pid]):
            say(f"cuda probes on {a.library.path}: {', '.join(a.functions)}")
    out = tmp / f"loadgen-{name}.json"
    load = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/loadgen.py"), "--url", f"http://127.0.0.1:{engine.port}",
         "--rate", str(args.rate), "--requests", str(int(args.rate * seconds)), "--max-tokens", "32",
         "--timeout", "30", "--json", str(out)], stdout=subprocess.DEVNULL, cwd=ROOT)
    start_ns, start_samples = time.monotonic_ns(), len(watch.samples)
    host, last_line, gpu = None, 0.0, 0
    rows = []
    while load.poll() is None and time.monotonic_ns() - start_ns < (seconds + 40) * 1e9:
        time.sleep(0.5)
        now = time.monotonic_ns()
        if cuda is not None:
            cuda.attach_pids([engine.pid])  # libraries the engine loaded since
        host = hosts.sample(engine.pid) or host
        share = next((s for s in shares.update(cuda.counts(), now) if s.pid == engine.pid), None) \
            if cuda is not None else None
        watch.demand(engine.pid, now, engine.in_flight(), host, share)
        gpu = (watch.sampler.process_gpus().get(engine.pid) or (gpu,))[0]
        if time.monotonic() - last_line >= 5:
            last_line = time.monotonic()
            rows.append(_line(watch, gpu, engine, host, share, cuda, now - start_ns))
    if load.poll() is None:
        load.kill()
    load.wait()
    summary = json.loads(out.read_text()) if out.exists() else {}
    launches = _launches(cuda, engine.pid)
    engine.stop()
    if cuda is not None:
        cuda.forget(engine.pid)
    with watch.lock:
        mine = [s for s in watch.samples[start_samples:] if s.gpu == gpu]
        alerts = [(d, a) for d, a in watch.alerts if a.window_end_ns >= start_ns]
    busy = [s.busy_percent for s in mine if s.busy_percent is not None]
    result = {
        "phase": name, "burn_ms": burn_ms, "samples": len(mine),
        "signals": sorted({s.signal for s in mine}),
        "busy_mean_percent": round(sum(busy) / len(busy), 3) if busy else None,
        "util_gpu_mean_percent": _mean([s.util_gpu_percent for s in mine]),
        "cuda_launches": None if cuda is None else launches,
        "alerts": [{"detector": d, "state": a.state, "cause": a.cause, "pid": a.pid,
                    "window_s": round((a.window_end_ns - a.window_start_ns) / 1e9, 1),
                    "evidence": a.evidence} for d, a in alerts],
        "loadgen": {k: summary.get(k) for k in ("requests_sent", "by_status", "throughput_rps", "latency_s")},
        "lines": rows,
    }
    for d, a in alerts:
        say(f"ALERT [{d}] {a.state} gpu {a.gpu} pid {a.pid}: {a.cause}  evidence {json.dumps(a.evidence)}")
    say(f"loadgen: {json.dumps(result['loadgen'])}")
    return result


def _launches(cuda, pid: int) -> int:
    if cuda is None:
        return 0
    return sum(c.calls for c in cuda.counts() if c.pid == pid and "Launch" in c.function)


def _mean(values) -> float | None:
    v = [x for x in values if x is not None]
    return round(sum(v) / len(v), 3) if v else None


def _line(watch: Watch, gpu: int, engine: Engine, host, share, cuda, elapsed_ns: int) -> dict:
    with watch.lock:
        mine = [x for x in watch.samples[-200:] if x.gpu == gpu]
        s = mine[-1] if mine else None
        recent = [x for x in mine[-25:] if x.busy_percent is not None]
        state = watch.busy.status().get(gpu, {})
    smi = nvidia_smi()
    row = {
        "t_s": round(elapsed_ns / 1e9, 1),
        "gpu": gpu,
        "signal": s.signal if s else None,
        "busy_percent_5s": _mean([x.busy_percent for x in recent]),
        "util_gpu_percent": s.util_gpu_percent if s else None,
        "memory_used_mib": (round(s.memory_used_bytes / 2**20)
                            if s and s.memory_used_bytes is not None else None),
        "nvidia_smi": smi,
        "in_flight": engine.in_flight(),
        "on_cpu_max": round(host.on_cpu_max, 2) if host else None,
        "runq_wait_max": round(host.runq_wait_max, 2) if host else None,
        "launches_per_s": round(share.launches * 1e9 / share.interval_ns) if share else None,
        "sync_share": round(share.sync, 3) if share else None,
        "engine_sm_percent": next((p.sm_percent for p in (s.processes if s else ())
                                   if p.pid == engine.pid), None),
        "working_level_percent": state.get("working_level_percent"),
        "alert": state.get("alert"),
    }
    if cuda is not None:
        row["launches_total"] = _launches(cuda, engine.pid)
    say(f"t={row['t_s']:5.1f}s {row['signal']} busy={row['busy_percent_5s']}% "
        f"util={row['util_gpu_percent']}% mem={row['memory_used_mib']}MiB | nvidia-smi: {smi} | "
        f"in_flight={row['in_flight']} on_cpu={row['on_cpu_max']} "
        f"launches/s={row['launches_per_s']} sync={row['sync_share']} "
        f"level={row['working_level_percent']} alert={row['alert']}")
    return row


def checks(normal: dict, collapse: dict, cuda_note: str | None) -> list[tuple[bool, str]]:
    out = [
        (normal["samples"] > 0 and normal["busy_mean_percent"] is not None,
         f"NVML samples with a busy reading (signal {', '.join(normal['signals'])})"),
        (not normal["alerts"], "no collapse alert under normal load"),
        (any(a["state"] == "raised" and a["cause"] == "cpu_bound" for a in collapse["alerts"]),
         "a collapse alert naming cpu_bound under the CPU-bound stage"),
    ]
    if cuda_note is None:
        out.append(((normal["cuda_launches"] or 0) > 0, "kernel launches counted by the CUDA uprobes"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--normal-s", type=float, default=60)
    ap.add_argument("--collapse-s", type=float, default=45)
    ap.add_argument("--rate", type=float, default=20, help="requests per second, both phases")
    ap.add_argument("--burn-ms", type=int, default=200, help=f"{BURN_ENV} in the collapse phase")
    ap.add_argument("--interval", type=float, default=0.2, help="NVML sampling interval, s")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--dry-run", action="store_true",
                    help="plumbing only, no GPU: the engine on CPU, NVML replaced by a recorded GPU "
                         "(its verdict means nothing)")
    args = ap.parse_args()

    backend = None
    if args.dry_run:
        from sitsprobe.gpu.recorded import RecordedBackend, RecordedGpu
        backend = RecordedBackend([RecordedGpu(name="recorded (dry run)", rates=(50.0, 10.0))])
    ok, reason = available(backend)
    if not ok:
        say(f"gpu_check: no GPU to check here: {reason}.\n"
            "Run it on a machine with an NVIDIA GPU and its driver; nothing was checked.")
        return 2
    say(f"gpu_check: NVML sees {reason}")
    say(f"nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv: {nvidia_smi()}")
    sampler = NvmlSampler(backend, interval_s=args.interval)
    watch = Watch(sampler)
    gpus = sampler.start(watch.on_sample)
    say("busy signal per GPU: " + ", ".join(f"{g.index} {g.name}: {sig}"
                                              for g, sig in zip(gpus, sampler.signals().values())))
    cuda, cuda_note = open_cuda_probe()
    say("cuda uprobes: " + ("loaded" if cuda is not None else f"off ({cuda_note})"))
    results = {"gpus": [asdict(g) for g in gpus]}
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_check-") as d:
            tmp = Path(d)
            normal = run_phase("normal", args.normal_s, 0, args, watch, cuda, tmp)
            collapse = run_phase("collapse", args.collapse_s, args.burn_ms, args, watch, cuda, tmp)
    except RuntimeError as e:
        say(f"gpu_check: {e}")
        return 1
    finally:
        sampler.close()
        if cuda is not None:
            cuda.close()
    results.update(normal=normal, collapse=collapse, nvml_errors={
        f"{g}/{e}": n for (g, e), n in sampler.errors().items()}, cuda=cuda_note or "loaded")
    say("\n== summary")
    for r in (normal, collapse):
        say(f"{r['phase']:>8}: busy {r['busy_mean_percent']}% ({'/'.join(r['signals'])}), "
            f"utilization.gpu {r['util_gpu_mean_percent']}%, launches {r['cuda_launches']}, "
            f"alerts {[(a['detector'], a['state'], a['cause']) for a in r['alerts']]}")
    say(f"nvml errors: {results['nvml_errors'] or 'none'}")
    verdict = checks(normal, collapse, cuda_note)
    for passed, what in verdict:
        say(f"  {'ok  ' if passed else 'FAIL'} {what}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(p for p, _ in verdict) else 1


if __name__ == "__main__":
    sys.exit(main())
