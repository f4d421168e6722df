"""A container's pod from its runtime's state on the host (sitsprobe.runtime_state),
over fixture trees laid out as containerd's and CRI-O's are."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sitsprobe.containers import Container
from sitsprobe.runtime_state import MAX_CONFIG, host_root, runtime_workload
from sitsprobe.workloads import Workload

CID = "4b825dc642cb6eb9a060e54bf8d69288fbee4904c0a7e3c5b1a8f0f1d2c3b4a5"
UID = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"
CONTAINERD = f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/config.json"
CRIO = f"run/containers/storage/overlay-containers/{CID}/userdata/config.json"
ANNOTATIONS = {
    CONTAINERD: {"io.kubernetes.cri.sandbox-namespace": "inference", "io.kubernetes.cri.sandbox-name": "vllm-0",
                 "io.kubernetes.cri.sandbox-uid": UID, "io.kubernetes.cri.container-name": "vllm",
                 "io.kubernetes.cri.container-type": "container"},
    CRIO: {"io.kubernetes.pod.namespace": "inference", "io.kubernetes.pod.name": "vllm-0",
           "io.kubernetes.pod.uid": UID, "io.kubernetes.container.name": "vllm"},
}
WANT = Workload("inference", "vllm-0", UID, "node-a", "vllm", "", "", ())


def lay(root, path: str, body) -> None:
    f = root / path
    f.parent.mkdir(parents=True)
    f.write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())


@pytest.mark.parametrize("path", [CONTAINERD, CRIO])
@pytest.mark.parametrize("runtime", ["containerd", "cri-o", ""])  # "": a cgroupfs path names no runtime
def test_each_runtimes_annotations_name_the_pod(tmp_path, path, runtime):
    lay(tmp_path, path, {"ociVersion": "1.0.2", "annotations": ANNOTATIONS[path]})
    got = runtime_workload(Container(CID, runtime, UID), "node-a", tmp_path)
    named = runtime in ("", {CONTAINERD: "containerd", CRIO: "cri-o"}[path])
    assert got == (WANT if named else None)


@pytest.mark.parametrize("body", [
    b"", b"{", b"[]", b"null", b'"text"', {"annotations": None}, {"annotations": []},
    {"annotations": {"io.kubernetes.cri.sandbox-name": 7}},  # not a string
    {"annotations": {"io.kubernetes.cri.container-name": "vllm"}},  # no pod: not named
    {"annotations": {}}, b"\xff\xfe\x00garbage", b"{" * 100000, b"[" * 100000,
    b'{"annotations": {"io.kubernetes.cri.sandbox-name": "' + b"x" * MAX_CONFIG + b'"}}',  # past the cap
])
def test_a_malformed_or_foreign_config_names_nothing_and_never_raises(tmp_path, body):
    lay(tmp_path, CONTAINERD, body)
    assert runtime_workload(Container(CID, "containerd", UID), "node-a", tmp_path) is None


def test_no_state_at_all_names_nothing(tmp_path):
    assert runtime_workload(Container(CID, "", ""), "node-a", tmp_path) is None
    assert runtime_workload(Container(CID, "docker", ""), "node-a", tmp_path) is None


def test_the_hosts_root_is_proc_1_root_where_readable_else_slash(monkeypatch):
    import sitsprobe.runtime_state as rs
    monkeypatch.setattr(rs.os, "listdir", lambda path: ["etc", "run"])  # in a hostPID pod
    assert host_root() == Path("/proc/1/root")

    def denied(path):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(rs.os, "listdir", denied)  # a sandbox whose init hides its root
    assert host_root() == Path("/")
