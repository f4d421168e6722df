"""A real static server (nginx) saturated by a real load tool (ab): the agent's
request counter must equal the tool's tally, and every request the kernel
reported must be in the histogram or in the lost-events count, most of them
counted there by the kernel itself."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


from .conftest import Nginx, wait_until

AGENT_TRACES = {"max_per_second": 200, "cpu_budget": 0}  # traces are sampled under load; metrics are not


@pytest.fixture
def nginx(agent, tmp_path: Path):
    if not shutil.which("ab"):
        pytest.skip("ab (apache2-utils) is needed: .ci/run installs it")
    with Nginx(agent, tmp_path / "nginx") as n:
        yield n.port, n.workers[0]


def test_request_counter_equals_the_load_tools_tally_under_saturation(agent, nginx):
    port, worker = nginx
    out = subprocess.run(["ab", "-k", "-q", "-n", "150000", "-c", "16",
                          f"http://127.0.0.1:{port}/index.html"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    complete = int(re.search(r"Complete requests:\s+(\d+)", out).group(1))
    failed = int(re.search(r"Failed requests:\s+(\d+)", out).group(1))
    rate = float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1))
    assert complete == 150000 and failed == 0 and "Non-2xx" not in out
    print(f"ab: {complete} requests at {rate:.0f}/s with the agent attached")

    counted = wait_until(
        lambda: (n := agent.metric("sitsprobe_http_server_requests_total", pid=worker)) >= complete and n,
        30, "the kernel counter to reach the tally")
    assert counted == complete

    def stitched():
        return agent.metric("http_server_request_duration_seconds_count",
                            process="nginx", http_route="/index.html")

    lost = agent.metric("sitsprobe_events_lost_total", reason="ring_buffer_full")
    wait_until(lambda: stitched() + lost >= complete, 60, "the agent to stitch every reported request")
    in_kernel = agent.metric("sitsprobe_requests_counted_in_kernel_total")
    print(f"stitched {stitched():.0f}, lost in the ring {lost:.0f}, counted in the kernel {in_kernel:.0f}")
    assert stitched() + lost == complete
    # one path: all but the first few thousand (before its route is known, and the traced) stay there
    assert in_kernel >= 0.9 * complete
