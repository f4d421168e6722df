"""The receiving side failing: a collector that accepts and never answers
(gRPC and HTTP), none at all, one killed and restarted under load. The agent
stops within stop_timeout_s whatever the collector does, and every span it
was handed is either delivered (the receiver's own count) or dropped with
its reason: offered = delivered + dropped, exactly."""
from __future__ import annotations

import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.otlp_receiver import GrpcOtlpReceiver

from .conftest import Server, free_port, require_root, running_agent, wait_until
from .test_net import Client

STOP_S = 2.0  # the agent's stop_timeout_s in these tests
SLACK_S = 2.5  # Python's own exit, and a loaded 2-core machine


class Blackhole:
    """Accepts connections and never reads from them, nor answers."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for s in self.held:
            s.close()


def accounting(agent, sink: str = "otlp") -> dict[str, float]:
    """The span accounting of one sink, from one scrape: its numbers agree."""
    page = agent.scrape()
    return {"offered": agent.metric("sitsprobe_spans_offered_total", page, sink=sink),
            "delivered": agent.metric("sitsprobe_spans_delivered_total", page, sink=sink),
            "dropped": agent.metric("sitsprobe_spans_dropped_total", page, sink=sink),
            "pending": agent.metric("sitsprobe_spans_pending", page, sink=sink)}


def stop_and_time(agent) -> tuple[float, int, str]:
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    rc = agent.proc.wait(60)
    return time.monotonic() - t0, rc, agent.log.read_text()


def left_in_tracefs(pid: int) -> list[str]:
    """Probe events bcc made for the agent (it names them after its pid) still registered."""
    out = []
    for name in ("uprobe_events", "kprobe_events"):
        p = Path("/sys/kernel/tracing") / name
        if p.exists():
            out += [line for line in p.read_text().splitlines() if f"bcc_{pid}" in line]
    return out


def requests(port: int, n: int) -> None:
    c = Client(port)
    for i in range(n):
        c.request("GET", f"/faults/{i}")
    c.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_blackhole_collector_cannot_hold_up_the_stop(tmp_path, protocol):
    require_root()
    hole = Blackhole()
    try:
        with running_agent(tmp_path, {}, {"otlp_endpoint": f"http://127.0.0.1:{hole.port}",
                                          "otlp_protocol": protocol, "file": None},
                           {"stop_timeout_s": STOP_S}) as agent:
            with Server(agent) as server:
                requests(server.port, 10)
                wait_until(lambda: accounting(agent)["offered"] >= 10, 10, "10 spans offered to the sink")
            took, rc, log = stop_and_time(agent)
    finally:
        hole.close()
    assert rc == 0, log
    assert took < STOP_S + SLACK_S, f"the stop took {took:.1f}s, bound {STOP_S}s:\n{log}"
    line = re.search(r"traces: .*spans: otlp: (\d+) delivered(.*)", log)
    assert line, log
    dropped = sum(int(n) for n in re.findall(r"(\d+) (?:queue full|export failed|export error|shutdown)",
                                             line[2]))
    assert int(line[1]) == 0 and dropped >= 10, line[0]  # nothing reached it, all counted
    assert not left_in_tracefs(agent.proc.pid)


def test_no_collector_at_all_is_failures_not_deliveries(tmp_path):
    require_root()
    port = free_port()  # nothing listens
    with running_agent(tmp_path, {}, {"otlp_endpoint": f"http://127.0.0.1:{port}", "file": None},
                       {"stop_timeout_s": STOP_S},
                       env={"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "500"}) as agent:
        with Server(agent) as server:
            requests(server.port, 12)
            wait_until(lambda: (a := accounting(agent))["offered"] >= 12 and a["pending"] == 0 and a, 20,
                       "the exporter to give up on the 12 spans")
        a = accounting(agent)
        assert a["delivered"] == 0 and a["dropped"] == a["offered"] >= 12, a
        assert agent.metric("sitsprobe_spans_dropped_total", sink="otlp", reason="export_failed") > 0
        took, rc, log = stop_and_time(agent)
    assert rc == 0 and took < STOP_S + SLACK_S, (took, log)


def test_a_collector_killed_and_restarted_under_load_adds_up(tmp_path):
    """A steady client; the receiver dies for 4 s (longer than the exporter's
    timeout) and comes back on the same port. What the two receivers got is
    what the agent says it delivered, and the rest is counted as dropped."""
    require_root()
    port = free_port()
    first = GrpcOtlpReceiver(port=port)
    received = [first]
    with running_agent(tmp_path, {}, {"otlp_endpoint": first.endpoint, "file": None,
                                      "metrics_interval_s": 0.5},
                       {"stop_timeout_s": STOP_S},
                       env={"OTEL_EXPORTER_OTLP_TIMEOUT": "1000",  # every signal gives up in 1 s
                            "OTEL_BSP_SCHEDULE_DELAY": "200"}) as agent:
        with Server(agent) as server:
            done = threading.Event()
            answered = []

            def load():
                c = Client(server.port)
                while not done.is_set():
                    c.request("GET", f"/steady/{len(answered)}")
                    answered.append(1)
                    time.sleep(0.02)
                c.close()

            t = threading.Thread(target=load)
            t.start()
            time.sleep(2)
            first.close()
            time.sleep(4)
            received.append(GrpcOtlpReceiver(port=port))
            time.sleep(3)
            done.set()
            t.join()
            # the client's tally says when the last request's span is in: one
            # stitched after a look that saw nothing pending would be missed
            a = wait_until(lambda: (a := accounting(agent))["pending"] == 0
                           and a["offered"] == len(answered) and a, 20,
                           f"all {len(answered)} requests' spans delivered or dropped")
        got = sum(len(r.spans()) for r in received)
        assert a["delivered"] == got, (a, got)
        assert a["offered"] == a["delivered"] + a["dropped"], a
        assert a["dropped"] > 0, f"an outage of 4 s must show as failures: {a}"
        assert agent.metric("sitsprobe_spans_dropped_total", sink="otlp", reason="export_failed") == a["dropped"]
        _, rc, log = stop_and_time(agent)  # the agent's own metrics, to the last export
    received[-1].close()
    assert rc == 0
    line = re.search(r"metrics \(points\): (\d+) delivered([^;\n]*)", log)
    assert line, log
    points = sum(r.metrics.point_count() for r in received)
    assert int(line[1]) == points, (line[0], points)
    assert re.search(r"\d+ export failed", line[2]), f"the outage must show for metrics too: {line[0]}"
