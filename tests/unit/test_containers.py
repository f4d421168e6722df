"""Container and pod from /proc/PID/cgroup, for the layouts real nodes have."""
from __future__ import annotations

import pytest

from sitsprobe.containers import Container, container_of, parse_cgroup

CID = "4f1c7e2a9b3d" + "0123456789abcdef" * 3 + "0a1b"  # 64 hex
UID = "1f2e3d4c-5b6a-4789-8abc-def012345678"


@pytest.mark.parametrize("text, want", [
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}"
     f".slice/cri-containerd-{CID}.scope\n", Container(CID, "containerd", UID)),
    (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
     Container(CID, "cri-o", UID)),
    (f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n4:memory:/kubepods/besteffort/pod{UID}/{CID}\n",
     Container(CID, "", UID)),
    (f"0::/system.slice/docker-{CID}.scope\n", Container(CID, "docker", "")),
    (f"11:devices:/docker/{CID}\n", Container(CID, "", "")),
    (f"0::/user.slice/user-1000.slice/user@1000.service/libpod-{CID}.scope/container\n",
     Container(CID, "podman", "")),
])
def test_layouts_of_real_nodes(text, want):
    assert parse_cgroup(text) == want


@pytest.mark.parametrize("text", [
    "0::/\n",
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "4:memory:/process_api/eda6f7b42844e157e252cdb37a63f4f3\n",  # 32 hex: not a container id
    "", "garbage without colons", f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice\n",
])
def test_no_container(text):
    assert parse_cgroup(text) is None


def test_read_from_a_proc_tree(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    assert container_of(77, str(tmp_path)) == Container(CID, "docker", "")
    assert container_of(78, str(tmp_path)) is None  # gone

