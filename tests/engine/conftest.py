"""Engine test fixtures: the tiny model in-process, and real engine subprocesses."""
from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.otlp_receiver import free_port

from examples.engine.api import Engine, EngineServer
from examples.engine.model import GPT
from examples.engine.prefix_cache import PrefixCache
from examples.engine.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "examples" / "engine" / "serve.py"
LOADGEN = ROOT / "examples" / "loadgen.py"

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model() -> GPT:
    return GPT(seed=0).eval()


@pytest.fixture
def server(model):
    """The engine in-process, on a free port, served from a thread."""
    scheduler = Scheduler(model, max_window_ms=1, prefix_cache=PrefixCache())
    scheduler.start()
    srv = EngineServer(("127.0.0.1", 0), Engine(model, scheduler))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    scheduler.stop()


class EngineProcess:
    """``serve.py`` as a subprocess on a port it picks (--port 0)."""

    def __init__(self, *args: str, timeout: float = 60.0):
        self.log = tempfile.NamedTemporaryFile(prefix="engine-", suffix=".log", delete=False)
        cmd = [sys.executable, str(SERVE), "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=ROOT)
        line = self._first_line(timeout)
        m = re.fullmatch(r"listening on ([\d.]+):(\d+)\n", line)
        if not m:
            self.stop()
            raise AssertionError(f"engine did not start ({' '.join(cmd)}): {line!r}\n{self.stderr()}")
        self.host, self.port = m[1], int(m[2])
        self.url = f"http://{self.host}:{self.port}"

    def _first_line(self, timeout: float) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return f"<nothing on stdout in {timeout}s>"
        return self.proc.stdout.readline()

    def stderr(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as resp:
            return json.load(resp)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def engine():
    e = EngineProcess("--max-window-ms", "5")
    yield e
    e.stop()




@pytest.fixture(scope="module")
def redis_url():
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server): "
                    "the completion-cache test needs a real one")
    import redis

    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError(f"redis-server on port {port} did not come up")
            time.sleep(0.05)
    yield url
    client.close()
    proc.terminate()
    proc.wait(10)
