"""Requests counted in the kernel (stitch.kernel_bins): once the agent knows a
method and path's route, the kernel bins their requests itself and sends only
those chosen for a trace. The metrics must still be the client's tally, to
the request and the byte, whichever way each request went: binned in the
kernel, sent for a trace, or taken by the agent's idle flush."""
from __future__ import annotations

import time
from collections import Counter

from .conftest import Server, wait_until
from .test_net import Client

TIERS = ("socket", "syscall")
AGENT_TRACES = {"max_per_second": 5, "cpu_budget": 0}  # a small budget: most requests are not traced
AGENT_EXTRA = {"routes": {"collapse_ids": False}}  # /status/503 is its own route: an error route binned


def totals(agent) -> dict:
    page = agent.scrape()
    by_status = Counter()
    for status in (200, 404, 503):
        by_status[status] = agent.metric("http_server_request_duration_seconds_count", page,
                                         process="python", http_response_status_code=status)
    return {"status": by_status,
            "segments": {s: agent.metric("sitsprobe_request_segment_seconds_count", page, process="python",
                                         segment=s) for s in ("network", "scheduling", "compute", "io", "cache")},
            "bytes_in": agent.metric("sitsprobe_request_bytes_total", page, process="python"),
            "bytes_out": agent.metric("sitsprobe_response_bytes_total", page, process="python"),
            "in_kernel": agent.metric("sitsprobe_requests_counted_in_kernel_total", page),
            "seen": agent.metric("sitsprobe_traces_total", page, outcome="seen")}


def test_what_the_kernel_counts_adds_up_to_the_clients_tally(agent):
    with Server(agent) as server:
        c = Client(server.port)
        for path in ("/fixed", "/status/503", "/status/404"):  # the agent learns their routes
            c.request("GET", path)
        agent.traces.wait_for_port(server.port, 3, pid=server.pid)
        for i in range(400):
            c.request("GET", "/status/503" if i % 20 == 0 else "/status/404" if i % 15 == 0 else "/fixed")
        for _ in range(3):  # idle between requests: the agent's flush claims each before the kernel ends it
            time.sleep(0.3)
            c.request("GET", "/fixed")
        c.close()
        tally = c.tally
        want = Counter(e["status"] for e in tally)
        # seen: once the last requests are past the joiner's wait for a parent
        got = wait_until(lambda: (t := totals(agent))["status"] == want and t["seen"] >= len(tally) and t,
                         20, f"the HTTP metrics to reach the tally {dict(want)}")
        assert got["segments"] == dict.fromkeys(got["segments"], len(tally))
        assert got["bytes_in"] == sum(e["bytes_in"] for e in tally)
        assert got["bytes_out"] == sum(e["bytes_out"] for e in tally)
        assert got["seen"] == len(tally)
        assert got["in_kernel"] >= 300, got  # all but the first of each, the idle ones and some sent early
        def errors():  # spans reach the file after the metrics reach the scrape: waited for
            return [s for s in agent.traces.for_port(server.port, server.pid) if s["attrs"]["http.response.status_code"] == 503]
        wait_until(lambda: len(errors()) >= want[503], 10, f"the {want[503]} errors' spans")
        assert len(errors()) == want[503], "every error crosses and is traced, once"
        spans = agent.traces.for_port(server.port, server.pid)
        assert len(spans) < len(tally) / 2, "the kernel sent only what the trace budget could take"
    # the process exited: its kernel series are folded into its name's, nothing lost
    wait_until(lambda: not agent.tracks(server.pid), 10, "the server's exit to be seen")
    assert totals(agent)["status"] == want
    assert agent.metric("sitsprobe_traces_total", outcome="sampled_out") >= 300  # the kernel kept them
