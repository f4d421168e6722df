"""Integration fixtures: one real agent (the CLI, as a subprocess) per test
module, real servers it picks up after it started, a real OTLP receiver."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection
from pathlib import Path

import pytest
import yaml

from tests.otlp_receiver import GrpcOtlpReceiver, accepts, free_port, port_for_later  # noqa: F401 (for the modules)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
TAG = "sitsprobe-testserver"


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def require_root():
    if os.geteuid() != 0:
        pytest.skip("integration tests load BPF programs: run as root (CI does)")


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


BPF_F_NO_PREALLOC = 1


def made_as_keys_come(table) -> bool:
    """Whether the kernel makes a BPF hash map's entries as keys come
    (BPF_F_NO_PREALLOC, in the map's flags that the kernel reports), not all
    at its creation."""
    with open(f"/proc/self/fdinfo/{table.map_fd}") as f:
        flags = next(int(line.split()[1], 16) for line in f if line.startswith("map_flags:"))
    return bool(flags & BPF_F_NO_PREALLOC)


class TraceFile:
    """Reads the agent's OTLP/JSON trace lines into flat span dicts."""

    def __init__(self, path: Path):
        self.path = path

    def spans(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            if not line.endswith("}"):
                continue  # a line being written
            for rs in json.loads(line)["resourceSpans"]:
                resource = _attrs(rs["resource"].get("attributes", []))
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        s["attrs"] = _attrs(s.get("attributes", []))
                        s["resource"] = resource
                        out.append(s)
        return out

    def for_port(self, port: int, pid: int | Collection[int] | None = None) -> list[dict]:
        """The server spans of a port (a client span's server.port is the port it called);
        of one process's (or of a few, nginx's workers) if given: the kernel may hand an
        earlier test's port to a later server, and the agent of a module outlives its tests."""
        pids = None if pid is None else {pid} if isinstance(pid, int) else set(pid)
        return [s for s in self.spans() if s["attrs"].get("server.port") == port and s.get("kind") != 3
                and (pids is None or s["resource"].get("process.pid") in pids)]

    def for_pid(self, pid: int) -> list[dict]:
        return [s for s in self.spans() if s["resource"].get("process.pid") == pid]

    def wait_for_port(self, port: int, n: int, timeout: float = 15, pid: int | Collection[int] | None = None) -> list[dict]:
        return wait_until(lambda: (s := self.for_port(port, pid)) and len(s) >= n and s,
                          timeout, f"{n} spans for port {port} (have {len(self.for_port(port, pid))})")


def _attrs(kvs: list[dict]) -> dict:
    return {kv["key"]: _value(kv["value"]) for kv in kvs}


def _value(v: dict):
    (kind, x), = v.items()
    if kind == "arrayValue":
        return [_value(item) for item in x.get("values", [])]
    return int(x) if kind == "intValue" else x


class AgentHandle:
    def __init__(self, proc, traces: TraceFile, receiver, metrics_port: int, log: Path):
        self.proc, self.traces, self.receiver, self.log = proc, traces, receiver, log
        self.metrics_url = f"http://127.0.0.1:{metrics_port}"

    def scrape(self) -> str:
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, page: str | None = None, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels`, in
        `page` (one scrape, for numbers that must agree), else a new scrape."""
        total = 0.0
        for line in (page if page is not None else self.scrape()).splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == str(v) for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def tracks(self, pid: int) -> bool:
        return self.metric("sitsprobe_tracked_process_info", pid=pid) == 1

    def alive(self) -> bool:
        return self.proc.poll() is None


def pytest_generate_tests(metafunc):
    """A module that sets TIERS = ("socket", "syscall") runs its tests once
    per socket tier (the setting socket_hooks), each under an id naming it."""
    tiers = getattr(metafunc.module, "TIERS", None)
    if tiers and "tier" in metafunc.fixturenames:
        metafunc.parametrize("tier", tiers, ids=[f"{t}-tier" for t in tiers], indirect=True, scope="module")


@pytest.fixture(scope="module")
def tier(request) -> str:
    """The socket tier the module's agent uses: "auto" unless TIERS says."""
    return getattr(request, "param", "auto")


@pytest.fixture(scope="module")
def agent(request, tmp_path_factory, tier):
    """The agent, configured for the module; a module may set AGENT_TRACES or
    AGENT_SELECT to override those sections (a sampling budget, a selector),
    and TIERS to run on each socket tier."""
    require_root()
    extra = {**getattr(request.module, "AGENT_EXTRA", {}), **({"socket_hooks": tier} if tier != "auto" else {})}
    with running_agent(tmp_path_factory.mktemp("agent"), getattr(request.module, "AGENT_SELECT", {}),
                       getattr(request.module, "AGENT_TRACES", {}), extra) as handle:
        yield handle


@contextlib.contextmanager
def running_agent(d: Path, select: dict, traces: dict, extra: dict, env: dict[str, str] | None = None):
    """The agent (the CLI, as a subprocess) with its config, trace file and log in d,
    once its /healthz says ready; `select`, `traces` and `extra` override the defaults
    (a None in `traces` leaves that key out of the file). With `env`, the agent's
    environment is this one's without any OTEL_* variable, plus `env`."""
    metrics_port = free_port()
    with GrpcOtlpReceiver() as receiver:
        config = {
            "select": {"cmdline": [TAG], "comms": ["nginx"], "rescan_interval_s": 0.2, **select},
            "stitch": {"flush_interval_ms": 50},
            "traces": {k: v for k, v in {"file": str(d / "traces.jsonl"), "otlp_endpoint": receiver.endpoint,
                                         "max_per_second": 0, "cpu_budget": 0,
                                         "export_delay_ms": 50,  # a test waits for its spans: not a second each
                                         **traces}.items() if v is not None},
            "metrics": {"address": "127.0.0.1", "port": metrics_port},
            "ring_buffer_mib": 64,
            "kubernetes": {"metadata": "off"},  # whatever kubeconfig the machine has: not the test's
            **extra,
        }
        (d / "sitsprobe.yaml").write_text(yaml.safe_dump(config))
        log = d / "agent.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "sitsprobe.cli", "run", "-c", str(d / "sitsprobe.yaml")],
            cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
            env=None if env is None else {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                                          **env})
        handle = AgentHandle(proc, TraceFile(d / "traces.jsonl"), receiver, metrics_port, log)

        def healthy():
            if proc.poll() is not None:
                raise AssertionError(f"agent exited {proc.returncode}:\n{log.read_text()}")
            try:
                return urllib.request.urlopen(handle.metrics_url + "/healthz", timeout=1).status == 200
            except OSError:
                return False

        try:
            wait_until(healthy, 90, "the agent's /healthz")
            yield handle
        finally:  # a failed test must not leave its agent tracing the next ones
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            print(log.read_text())


class Owned:
    """A subprocess a test owns (``proc``), killed when its with block ends."""

    proc: subprocess.Popen

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def until(self, check, timeout: float, what: str):
        """wait_until, from __init__: a process that never got ready is
        stopped, since no with block will."""
        try:
            return wait_until(check, timeout, what)
        except BaseException:
            self.stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Nginx(Owned):
    """tests/nginx.py's static site (plus `locations`) served by a real nginx,
    one worker, once the agent tracks it; stopped by SIGTERM, so that the
    master takes its worker with it."""

    name = "nginx"

    def __init__(self, agent: AgentHandle, d: Path, port: int | None = None, locations: str = "",
                 tls: tuple[str, str] | None = None):
        from tests.nginx import static_site

        if not shutil.which("nginx"):
            pytest.skip("no nginx on PATH: .ci/run installs it")
        self.port = port or free_port()
        self.proc = subprocess.Popen(static_site(d, self.port, locations, tls))
        self.pid = self.proc.pid
        self.workers = self.until(self._workers, 10, "the nginx worker")
        self.pids = [self.pid, *self.workers]
        self.until(lambda: all(agent.tracks(p) for p in self.workers), 10, "the agent to track nginx")
        self.until(lambda: accepts(self.port), 10, f"nginx on port {self.port}")

    def _workers(self) -> list[int]:
        if self.proc.poll() is not None:
            raise AssertionError(f"nginx exited {self.proc.returncode} (port {self.port} taken?)")
        return children(self.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class NodeScript(Owned):
    """A script of this folder on Node.js (the nodejs package), serving on a port
    of its own, its first argument; argv[0] carries ``tag``, by which the
    agent selects it (its process is tracked before it listens)."""

    def __init__(self, agent: AgentHandle, script: str, *args: str, tag: str = TAG):
        node = shutil.which("node") or shutil.which("nodejs")
        if node is None:
            pytest.skip("no Node.js: .ci/run installs the nodejs package")
        self.port = free_port()
        argv = " ".join(shlex.quote(a) for a in (node, str(HERE / script), str(self.port), *args))
        self.proc = subprocess.Popen(["bash", "-c", f'exec -a "node-{tag}" {argv}'])
        self.pid = self.proc.pid
        self.until(lambda: agent.tracks(self.pid), 10, f"the agent to track {script}")
        self.until(lambda: accepts(self.port), 10, f"{script} on port {self.port}")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Server(Owned):
    """tests/integration/httpserver.py in a subprocess, tracked by the agent."""

    def __init__(self, agent: AgentHandle | None, mode: str = "sendto", unix: str | None = None,
                 port: int = 0):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "httpserver.py"), "--mode", mode, "--tag", TAG,
             "--port", str(port), *(["--unix", unix] if unix else [])],
            stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid
        if agent is not None:
            wait_until(lambda: agent.tracks(self.pid), 10, f"the agent to track pid {self.pid}")


class RedisServer(Owned):
    def __init__(self, port: int | None = None):
        if not shutil.which("redis-server"):
            pytest.skip("redis-server is needed: .ci/run installs it")
        self.port = port or free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        wait_until(self._up, 10, "redis-server to listen")

    def _up(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False


class Engine:
    """examples/engine/serve.py (the reference engine, on the CPU) in a subprocess.
    Its markers library is built in `workdir`; stderr goes to workdir/engine.log."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None,
                 cpus: set[int] | None = None):
        pytest.importorskip("torch")
        self.log = workdir / "engine.log"
        self.proc = subprocess.Popen(
            [sys.executable, "examples/engine/serve.py", "--host", "127.0.0.1", "--port", "0", *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True,
            env={"SITSPROBE_MARKERS_DIR": str(workdir), "PATH": "/usr/bin:/bin", **(env or {})},
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), self.log.read_text()
        self.port = int(line.rsplit(":", 1)[1])
        self.pid = self.proc.pid
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
