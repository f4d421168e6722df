"""A loss is said in the agent's log: a 1 MiB ring, an agent held still
(SIGSTOP) while a real load tool drives nginx, so the ring must fill; the log
says so once, and its total at exit equals the exported counter."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import Nginx, require_root, running_agent, wait_until


def test_a_full_ring_buffer_is_said_in_the_log(tmp_path: Path):
    require_root()
    if not shutil.which("ab"):
        pytest.skip("ab (apache2-utils) is needed: .ci/run installs it")
    (tmp_path / "agent").mkdir()
    with (running_agent(tmp_path / "agent", {}, {"max_per_second": 50, "cpu_budget": 0}, {"ring_buffer_mib": 1}) as agent,
          Nginx(agent, tmp_path / "nginx") as n):
        os.kill(agent.proc.pid, signal.SIGSTOP)  # nothing drains the ring now
        try:
            subprocess.run(["ab", "-k", "-q", "-n", "20000", "-c", "8",
                            f"http://127.0.0.1:{n.port}/index.html"],
                           capture_output=True, timeout=120, check=True)
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        said = wait_until(
            lambda: re.search(r"WARNING losing events: ring_buffer_full, (\d+) so far; "
                              r"raise ring_buffer_mib", agent.log.read_text()), 10,
            "the loss to be said in the log")
        lost = agent.metric("sitsprobe_events_lost_total", reason="ring_buffer_full")
        assert 0 < int(said.group(1)) <= lost
    log = agent.log.read_text()
    assert log.count("losing events: ring_buffer_full") == 1
    final = re.search(r"WARNING events lost while running: ring_buffer_full (\d+)", log)
    assert final and int(final.group(1)) == lost, log
