"""A traced server placed in a cgroup named the way the kubelet names a pod's
container (kubepods/pod<UID>/<container id>), an API server on loopback that
lists that pod (tests/kube_api.py): its spans carry the pod's namespace,
name, container and Deployment, its process info the same labels; the API
going away keeps them, said once. With no API configured, the cgroup's pod
UID and container id, said once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sitsprobe.runtime_state import host_root
from tests.kube_api import FakeKubeApi

from .conftest import HERE, TAG, require_root, running_agent, wait_until
from .test_net import Client

POD_UID = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"  # tests/fixtures/k8s/pods.json: vllm-7d9f8c6b5-x2k4q
CONTAINER_ID = "4b825dc642cb6eb9a060e54bf8d69288fbee4904c0a7e3c5b1a8f0f1d2c3b4a5"  # ... its "vllm" container
CGROUPS = Path("/sys/fs/cgroup")


class PodServer:
    """tests/integration/httpserver.py, started inside the container's cgroup
    (before the agent can see it: the agent reads a process's cgroup once)."""

    def __init__(self):
        hierarchy = next((p for p in (CGROUPS / "pids", CGROUPS / "unified", CGROUPS)
                          if (p / "cgroup.procs").exists()), None)
        if hierarchy is None:
            pytest.skip("no writable cgroup hierarchy to place the server in")
        self.dir = hierarchy / "kubepods" / f"pod{POD_UID}" / CONTAINER_ID
        self.dir.mkdir(parents=True, exist_ok=True)
        # the tag (what the agent selects by) only in the exec'd command line: the agent
        # must not pick up the shell before it has moved itself into the cgroup
        self.proc = subprocess.Popen(
            ["sh", "-c", f'echo $$ > {self.dir}/cgroup.procs && exec "$0" "$@" --tag "$SERVER_TAG"',
             sys.executable, str(HERE / "httpserver.py"), "--port", "0"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "SERVER_TAG": TAG})
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()
        for d in (self.dir, self.dir.parent, self.dir.parent.parent):
            try:
                d.rmdir()
            except OSError:
                pass


def requests(port: int, n: int) -> None:
    c = Client(port)
    for i in range(n):
        c.request("GET", f"/pod/{i}")
    c.close()


def test_spans_and_process_info_name_the_pod_from_the_api(tmp_path):
    require_root()
    with FakeKubeApi() as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        k8s = {"kubernetes": {"metadata": "on", "node_name": "gpu-node-3", "pod_labels": ["team"]}}
        with running_agent(tmp_path, {}, {}, k8s, env={"KUBECONFIG": str(kubeconfig)}) as agent, \
                PodServer() as server:
            wait_until(lambda: agent.tracks(server.pid), 10, "the agent to track the pod's server")
            requests(server.port, 5)
            spans = agent.traces.wait_for_port(server.port, 5)
            resource = spans[0]["resource"]
            assert {k: v for k, v in resource.items() if k.startswith(("k8s.", "container.", "service."))} == {
                "k8s.namespace.name": "inference", "k8s.pod.name": "vllm-7d9f8c6b5-x2k4q",
                "k8s.pod.uid": POD_UID, "k8s.node.name": "gpu-node-3", "k8s.container.name": "vllm",
                "k8s.deployment.name": "vllm", "k8s.pod.label.team": "serving",
                "service.name": "vllm-llama", "service.instance.id": resource["service.instance.id"],
                "container.id": CONTAINER_ID}
            assert agent.metric("sitsprobe_tracked_process_info", pid=server.pid, namespace="inference",
                                pod="vllm-7d9f8c6b5-x2k4q", container="vllm", owner_kind="Deployment",
                                owner="vllm") == 1
            # the series are the pod's: another pod of a "python" process would be another series
            assert agent.metric("http_server_request_duration_seconds_count", process="python",
                                namespace="inference", pod="vllm-7d9f8c6b5-x2k4q", container="vllm") == 5
            api.close()  # the API goes away: what is known stays
            time.sleep(3)
            requests(server.port, 3)
            spans = agent.traces.wait_for_port(server.port, 8)
            assert {s["resource"].get("k8s.pod.name") for s in spans} == {"vllm-7d9f8c6b5-x2k4q"}
            assert agent.metric("sitsprobe_tracked_process_info", pid=server.pid, pod="vllm-7d9f8c6b5-x2k4q") == 1
        log = agent.log.read_text()
    assert "pods of node gpu-node-3 named from the Kubernetes API (kubeconfig" in log
    assert log.count("Kubernetes API unreachable") == 1, log


# containerd's CRI plugin's state for the container (sitsprobe.runtime_state), where the
# agent reads it: the host's /run, through /proc/1/root where that is readable
CONTAINERD_STATE = host_root() / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / CONTAINER_ID


@pytest.fixture
def containerd_state():
    """The container's OCI config as containerd writes it, with the kubelet's names."""
    created = [p for p in (CONTAINERD_STATE, *CONTAINERD_STATE.parents) if not p.exists()]
    CONTAINERD_STATE.mkdir(parents=True, exist_ok=True)
    (CONTAINERD_STATE / "config.json").write_text(json.dumps({"ociVersion": "1.1.0", "annotations": {
        "io.kubernetes.cri.sandbox-namespace": "inference", "io.kubernetes.cri.sandbox-name": "vllm-7d9f8c6b5-x2k4q",
        "io.kubernetes.cri.sandbox-uid": POD_UID, "io.kubernetes.cri.container-name": "vllm"}}))
    yield
    (CONTAINERD_STATE / "config.json").unlink()
    for p in created:  # only what the test made
        p.rmdir()


def test_without_an_api_the_cgroup_names_the_pod(tmp_path):
    require_root()
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}  # no kubeconfig anywhere
    auto = {"kubernetes": {"metadata": "auto"}}  # the default, which the other tests turn off
    with running_agent(tmp_path, {}, {}, auto, env=env) as agent, PodServer() as server:
        wait_until(lambda: agent.tracks(server.pid), 10, "the agent to track the pod's server")
        requests(server.port, 2)
        resource = agent.traces.wait_for_port(server.port, 2)[0]["resource"]
        assert resource["k8s.pod.uid"] == POD_UID and resource["container.id"] == CONTAINER_ID
        assert "k8s.pod.name" not in resource and resource["service.name"] == "python"
    log = agent.log.read_text()
    assert log.count("no Kubernetes API here") == 1, log


def test_without_an_api_the_runtimes_state_names_the_pod(tmp_path, containerd_state):
    require_root()
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}
    on = {"kubernetes": {"metadata": "on", "node_name": "gpu-node-3"}}
    with running_agent(tmp_path, {}, {}, on, env=env) as agent, PodServer() as server:
        wait_until(lambda: agent.tracks(server.pid), 10, "the agent to track the pod's server")
        requests(server.port, 3)
        resource = agent.traces.wait_for_port(server.port, 3)[0]["resource"]
        named = {k: v for k, v in resource.items() if k.startswith(("k8s.", "container.", "service."))}
        assert named.pop("service.instance.id")  # one per run
        assert named == {
            "k8s.namespace.name": "inference", "k8s.pod.name": "vllm-7d9f8c6b5-x2k4q", "k8s.pod.uid": POD_UID,
            "k8s.node.name": "gpu-node-3", "k8s.container.name": "vllm", "container.id": CONTAINER_ID,
            "service.name": "vllm"}  # no owner in the annotations: the container's name
        assert agent.metric("http_server_request_duration_seconds_count", process="python",
                            namespace="inference", pod="vllm-7d9f8c6b5-x2k4q", container="vllm") == 3
