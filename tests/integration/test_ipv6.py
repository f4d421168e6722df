"""IPv6: a server on ``::`` (both families: an IPv4 client arrives as
``::ffff:127.0.0.1``) and one on ``[::1]`` beside ``127.0.0.1``, on each
socket tier. uvicorn and nginx serve, httpx and curl ask; every request is
one span naming the addresses each side used, and the kernel's counts (a
route repeated is counted there) add up to the clients' tally, family by
family.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter

import httpx
import pytest

from .conftest import HERE, TAG, Nginx, port_for_later, wait_until

pytestmark = pytest.mark.integration
TIERS = ("socket", "syscall")
RUN_TAG = f"{TAG}-ipv6-{os.getpid()}"
NGINX_PORT = port_for_later()  # bound minutes after this module is imported
AGENT_SELECT = {"cmdline": [re.escape(RUN_TAG)], "comms": [], "ports": [NGINX_PORT]}
ROUNDS = 12


def tally_of(spans: list[dict]) -> Counter:
    return Counter((s["attrs"].get("client.address"), s["attrs"].get("server.address"),
                    s["attrs"]["http.response.status_code"]) for s in spans)


def served(agent, pids: list[int], want: Counter) -> None:
    """The spans of these processes, and the request counter's growth, are the tally."""
    spans = wait_until(lambda: (s := [x for p in pids for x in agent.traces.for_pid(p)])
                       and len(s) >= sum(want.values()) and s, 15, f"{sum(want.values())} spans")
    assert tally_of(spans) == want


def statuses(want: Counter) -> Counter:
    out: Counter = Counter()
    for (_, _, code), n in want.items():
        out[code] += n
    return out


def counted(agent, name: str) -> Counter:
    page = agent.scrape()
    return Counter({code: agent.metric("http_server_request_duration_seconds_count", page, process=name,
                                       http_response_status_code=str(code)) for code in (200, 404)})


def test_a_dual_stack_server_s_clients_of_both_families(agent):
    proc = subprocess.Popen([sys.executable, str(HERE / "peers.py"), "uvicorn", "--tag", RUN_TAG,
                             "--host", "::", "--name", "v6-uvicorn"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        wait_until(lambda: agent.tracks(proc.pid), 15, "the agent to track uvicorn")
        want: Counter = Counter()
        for host, address in (("[::1]", "::1"), ("127.0.0.1", "127.0.0.1")):
            with httpx.Client(base_url=f"http://{host}:{port}") as c:
                for i in range(ROUNDS):
                    code = c.get(f"/status/{404 if i % 3 == 0 else 200}").status_code
                    want[address, address, code] += 1
        served(agent, [proc.pid], want)
        codes = statuses(want)
        wait_until(lambda: counted(agent, "v6-uvicorn") == codes, 10, f"the counts to say {codes}")
    finally:
        proc.kill()
        proc.wait()


def test_nginx_on_both_loopbacks_asked_by_curl(agent, tmp_path):
    with Nginx(agent, tmp_path / "nginx", port=NGINX_PORT, locations=f"        listen [::1]:{NGINX_PORT};") as nginx:
        before = counted(agent, "nginx")
        want: Counter = Counter()
        for host, address in (("[::1]", "::1"), ("127.0.0.1", "127.0.0.1")):
            urls = [("-o", "/dev/null", f"http://{host}:{NGINX_PORT}{'/missing' if i % 4 == 0 else '/'}")
                    for i in range(ROUNDS)]
            out = subprocess.run(["curl", "-sg", "-w", "%{http_code}\\n", *(a for url in urls for a in url)],
                                 capture_output=True, text=True, check=True, timeout=30).stdout.split()
            for code in out:  # one connection, kept alive: curl's own count of each status
                want[address, address, int(code)] += 1
        served(agent, nginx.pids, want)
        codes = before + statuses(want)
        wait_until(lambda: counted(agent, "nginx") == codes, 10, f"the counts to say {codes}")
