"""Pods named from the Kubernetes API: the index over the API's JSON, and the
watch through the real `kubernetes` client against an API server on loopback
(tests/kube_api.py): list, watch, the ReplicaSet's Deployment, the API going
away (names kept, said once) and coming back."""
from __future__ import annotations

import copy
import json
import logging
import time

import pytest

from sitsprobe.containers import Container
from sitsprobe.workloads import PodIndex, Workload, Workloads
from tests.kube_api import FIXTURES, FakeKubeApi

VLLM = Container("4b825dc642cb6eb9a060e54bf8d69288fbee4904c0a7e3c5b1a8f0f1d2c3b4a5", "containerd",
                 "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9")
SIDECAR = VLLM._replace(id="e69de29bb2d1d6434b8b29ae775ad8c2e48c5391e69de29bb2d1d6434b8b29ae")
REDIS = Container("0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d", "cri-o",
                  "7c6b5a49-3827-4165-9f8e-7d6c5b4a3928")


def wait_for(check, seconds: float = 10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (got := check()):
            return got
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_the_index_names_pod_container_and_owner():
    index = PodIndex(pod_labels=["team", "absent"])
    index.replace(json.loads((FIXTURES / "pods.json").read_text())["items"])
    w = index.workload(VLLM)
    assert (w.namespace, w.pod, w.container, w.node) == ("inference", "vllm-7d9f8c6b5-x2k4q", "vllm", "gpu-node-3")
    assert (w.owner_kind, w.owner_name) == ("ReplicaSet", "vllm-7d9f8c6b5")  # its Deployment not known yet
    assert index.replicasets() == [("inference", "vllm-7d9f8c6b5")]
    index.set_owner("inference", "vllm-7d9f8c6b5", ("Deployment", "vllm"))
    w = index.workload(VLLM)
    assert (w.owner_kind, w.owner_name, w.labels) == ("Deployment", "vllm", (("team", "serving"),))
    assert w.service_name == "vllm-llama"  # app.kubernetes.io/name, asked for or not
    assert index.workload(SIDECAR).container == "metrics-sidecar"
    assert index.workload(REDIS)[:7] == ("cache", "redis-0", REDIS.pod_uid, "gpu-node-3", "redis", "StatefulSet", "redis")
    assert index.workload(VLLM._replace(id="0" * 64)).container == ""  # a container the status does not list yet
    assert index.workload(VLLM._replace(pod_uid="00000000-0000-4000-8000-000000000000")) is None


def test_the_opentelemetry_names():
    w = Workload("inference", "vllm-7d9f8c6b5-x2k4q", "uid-1", "gpu-node-3", "vllm", "Deployment", "vllm",
                 (("app.kubernetes.io/name", "vllm-llama"),), "vllm-llama")
    assert w.attributes() == {
        "k8s.namespace.name": "inference", "k8s.pod.name": "vllm-7d9f8c6b5-x2k4q", "k8s.pod.uid": "uid-1",
        "k8s.node.name": "gpu-node-3", "k8s.container.name": "vllm", "k8s.deployment.name": "vllm",
        "service.name": "vllm-llama", "k8s.pod.label.app.kubernetes.io/name": "vllm-llama"}
    # service.name: the app.kubernetes.io/name label, else the owner, else the container
    assert w._replace(app="").service_name == "vllm"
    assert w._replace(app="", owner_kind="", owner_name="").service_name == "vllm"
    assert w._replace(app="", owner_kind="", owner_name="", container="").service_name == w.pod


@pytest.fixture
def api(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with FakeKubeApi() as api:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
        yield api


def test_the_watch_names_this_nodes_pods_and_follows_changes(api):
    w = Workloads("gpu-node-3", watch_timeout_s=1)
    w.start()
    try:
        got = wait_for(lambda: (x := w.of(VLLM)) and x.owner_kind == "Deployment" and x)
        assert (got.pod, got.container, got.owner_name) == ("vllm-7d9f8c6b5-x2k4q", "vllm", "vllm")
        assert any("fieldSelector=spec.nodeName%3Dgpu-node-3" in r for r in api.requests), api.requests
        pod = copy.deepcopy(api.pods["items"][1])
        pod["metadata"].update(name="redis-1", uid="7c6b5a49-3827-4165-9f8e-000000000001")
        api.push("ADDED", pod)
        redis1 = REDIS._replace(pod_uid="7c6b5a49-3827-4165-9f8e-000000000001")
        assert wait_for(lambda: w.of(redis1)).pod == "redis-1"
        api.push("DELETED", pod)
        wait_for(lambda: w.of(redis1) is None)
    finally:
        w.stop()


def test_the_api_going_away_keeps_the_names_and_is_said_once(api, caplog):
    w = Workloads("gpu-node-3", watch_timeout_s=1)
    w.start()
    try:
        wait_for(lambda: w.of(VLLM))
        with caplog.at_level(logging.INFO, logger="sitsprobe"):
            api.close()
            time.sleep(4)  # several retries
            assert w.of(VLLM).pod == "vllm-7d9f8c6b5-x2k4q"
        said = [r.getMessage() for r in caplog.get_records("call") if "unreachable" in r.getMessage()]
        assert len(said) == 1 and "keeping the pod names known so far" in said[0], said
    finally:
        w.stop()


def test_another_nodes_pods_are_not_asked_for(api):
    w = Workloads("cpu-node-1", watch_timeout_s=1)
    w.start()
    try:
        time.sleep(0.5)
        assert w.of(VLLM) is None
    finally:
        w.stop()


# -- the labels request series carry (kubernetes.metric_labels, max_pods) ----------


def pod_workload(pod: str, owner: str = "vllm") -> Workload:
    return Workload("inference", pod, "uid-" + pod, "node-a", "server", "Deployment", owner, ())


def test_series_carry_the_chosen_pod_labels_and_past_max_pods_a_new_pod_is_other():
    from sitsprobe import config
    from sitsprobe.agent import Agent

    cfg = config.load(overrides={"select.pids": [1], "kubernetes.metadata": "on", "kubernetes.max_pods": 2,
                                 "kubernetes.metric_labels": ["owner", "pod"]})
    agent = Agent(cfg)
    pods = {11: pod_workload("vllm-a"), 12: pod_workload("vllm-b"), 13: pod_workload("vllm-c"),
            14: pod_workload("vllm-a")}
    agent.workload_of = pods.get
    assert agent.metrics.labels == ("process", "owner", "pod")
    assert [agent._who(pid, "python") for pid in (11, 12, 13, 14, 15)] == [
        ("python", "Deployment/vllm", "vllm-a"), ("python", "Deployment/vllm", "vllm-b"),
        ("python", "Deployment/vllm", "_other"),  # a third pod: past max_pods
        ("python", "Deployment/vllm", "vllm-a"),  # a pod already named keeps its name
        ("python", "", "")]  # not known (yet)


def test_without_pod_metadata_or_labels_a_series_is_its_process_alone():
    from sitsprobe import config
    from sitsprobe.agent import Agent

    for overrides in ({"kubernetes.metadata": "off"}, {"kubernetes.metadata": "on", "kubernetes.metric_labels": []}):
        agent = Agent(config.load(overrides={"select.pids": [1], **overrides}))
        agent.workload_of = {11: pod_workload("vllm-a")}.get
        assert agent.metrics.labels == ("process",) and agent._who(11, "python") == ("python",)
