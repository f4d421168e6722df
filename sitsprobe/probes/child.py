"""A child process of this sitsprobe, for a start's work that runs beside the
agent's own on another core: the kernel's capability probe (probe_aside),
half of net.c's compile (apart). The same interpreter, and the same package
whatever sys.path found this one by."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


class ChildFailed(Exception):
    """A child gave no answer: why, in words."""


def start(module: str, *args: str) -> subprocess.Popen:
    """``python -m module args``, its stdout and stderr piped."""
    package_home = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_home, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def answer(child: subprocess.Popen, timeout_s: float | None = None) -> bytes:
    """The child's stdout, once it exited 0. ChildFailed says why not: its exit
    status and the end of its stderr, or no answer in time (it is killed)."""
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(child)
        raise ChildFailed(f"no answer in {timeout_s:g} s") from None
    if child.returncode != 0:
        raise ChildFailed(f"exit status {child.returncode}: {err.decode(errors='replace').strip()[-300:]}")
    return out


def stop(child: subprocess.Popen) -> None:
    """A child whose answer is not wanted: killed, and waited for."""
    if child.poll() is None:
        child.kill()
    child.communicate()
