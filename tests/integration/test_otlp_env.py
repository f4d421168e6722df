"""OTLP configured by the environment alone, as the Helm chart does it: no
otlp_endpoint in the agent's config file, only OTEL_EXPORTER_OTLP_ENDPOINT and
OTEL_EXPORTER_OTLP_PROTOCOL. Every signal must then go by that protocol:

- traces (spans for a tracked server's requests) and the agent's metrics, from
  the real agent (the CLI, in a subprocess);
- GPU alert log records, from the real agent in this process, whose NVML
  boundary is a recorded GPU idling at 2 % while a request waits on it (a
  collapse under the absolute floor), so the alert is raised end to end.

Each against a gRPC receiver, against Rotel (a real collector, not ours) taking
OTLP/HTTP, and against tests/otlp_receiver.py's HTTP receiver, which also
checks the /v1/<signal> paths and the protobuf content type.
"""
from __future__ import annotations

import os
import socket
import threading
import urllib.request

import pytest
import yaml

from sitsprobe import config
from sitsprobe.agent import Agent
from sitsprobe.gpu.recorded import RecordedBackend, RecordedGpu
from tests.otlp_receiver import GrpcOtlpReceiver, HttpOtlpReceiver, RotelOtlpReceiver, attributes

from .conftest import Server, require_root, running_agent, wait_until

RECEIVERS = {
    "grpc": ("grpc", lambda d: GrpcOtlpReceiver()),
    "http-rotel": ("http/protobuf", lambda d: RotelOtlpReceiver(d / "rotel.log")),
    "http-ours": ("http/protobuf", lambda d: HttpOtlpReceiver()),
}


@pytest.fixture(params=list(RECEIVERS))
def collector(request, tmp_path):
    """(protocol, receiver) and the environment that points the agent at it."""
    require_root()
    if request.param == "http-rotel":
        pytest.importorskip("rotel", reason="rotel (a test extra) is not installed")
    protocol, make = RECEIVERS[request.param]
    with make(tmp_path) as rx:
        yield protocol, rx, {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": protocol}


def resources(requests, field: str) -> list[dict]:
    return [attributes(r.resource.attributes) for req in requests for r in getattr(req, field)]


def test_traces_and_metrics_go_where_the_environment_says(collector, tmp_path):
    protocol, rx, env = collector
    traces = {"otlp_endpoint": None, "metrics_interval_s": 0.5}
    with running_agent(tmp_path, {}, traces, {}, env=env) as agent:
        assert "otlp_endpoint" not in yaml.safe_load((tmp_path / "sitsprobe.yaml").read_text())["traces"]
        with Server(agent) as server:
            for i in range(5):
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/env/{i}", timeout=5) as r:
                    r.read()

            def server_spans():
                spans = [s for _, s in rx.spans() if attributes(s.attributes).get("server.port") == server.port]
                return len(spans) >= 5 and spans

            spans = wait_until(server_spans, 20, f"5 spans for port {server.port} at the {protocol} receiver")
            assert {attributes(s.attributes)["url.path"] for s in spans} >= {f"/env/{i}" for i in range(5)}

            def agent_metrics():
                return {n for n in rx.metrics.names() if n.startswith("sitsprobe_")}

            names = wait_until(agent_metrics, 20, f"the agent's metrics at the {protocol} receiver")
            assert "sitsprobe_tracked_processes" in names, names
            assert {r.get("service.name") for r in resources(rx.metrics.requests, "resource_metrics")} == \
                {"sitsprobe"}
        log = agent.log.read_text()
        assert agent.receiver.spans() == [] and agent.receiver.metrics.requests == []  # the config's: unused
    path = {"grpc": "", "http/protobuf": "/v1/metrics"}[protocol]
    assert f"OTLP metrics over {protocol} to {rx.endpoint}{path} (endpoint from OTEL_EXPORTER_OTLP_ENDPOINT" in log


def test_alert_log_records_go_where_the_environment_says(collector, tmp_path, monkeypatch):
    pytest.importorskip("bcc", reason="bcc (python3-bpfcc) is not importable")
    protocol, rx, env = collector
    for var in [v for v in os.environ if v.startswith("OTEL_")]:
        monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with Server(None) as server:
        gpu = RecordedGpu(rates=(2.0, 1.0), compute_pids=[server.pid], processes=[(server.pid, 0, 2.0, 1.0)])
        agent = Agent(config.load(overrides={
            "select.pids": [server.pid], "metrics.port": 0, "traces.file": str(tmp_path / "traces.jsonl"),
            "gpu.interval_ms": 100, "gpu.cuda_probes": False,
            "gpu.collapse_sustain_s": 0.5, "gpu.collapse_clear_s": 0.5}),
            gpu_backend=RecordedBackend([gpu]))
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        hang = None
        try:
            agent.start()
            thread.start()
            wait_until(lambda: server.pid in agent.tracked, 10, "the agent to track the server")
            hang = socket.create_connection(("127.0.0.1", server.port))  # a request the GPU never serves
            hang.sendall(b"GET /hang HTTP/1.1\r\nHost: gpu\r\n\r\n")

            def raised():
                return [(res, r) for res, r in rx.logs.records()
                        if attributes(r.attributes).get("sitsprobe.alert.state") == "raised"]

            resource, record = wait_until(raised, 20, f"the alert log record at the {protocol} receiver")[0]
        finally:
            if hang is not None:
                hang.close()
            stop.set()
            thread.join(10)
            agent.close()
    assert resource["service.name"] == "sitsprobe"
    got = attributes(record.attributes)
    assert (got["gpu"], got["process.pid"]) == (0, server.pid)
    assert record.body.string_value.startswith("GPU 0 utilization collapse raised")
