"""Which container (and Kubernetes pod) a process runs in, from /proc/PID/cgroup.

Container runtimes name a container's cgroup after its 64-hex id, and the
kubelet puts the pod's UID in a parent cgroup:

  cgroup v2, systemd driver
    0::/kubepods.slice/kubepods-burstable.slice/
       kubepods-burstable-pod1f2e..._..._....slice/cri-containerd-<id>.scope
  cgroup v1, cgroupfs driver
    4:memory:/kubepods/burstable/pod1f2e...-...-.../<id>
  plain Docker / CRI-O / Podman
    0::/system.slice/docker-<id>.scope   /docker/<id>   crio-<id>.scope   libpod-<id>.scope

A process outside any container (or on a layout not listed) has none.
Every read takes the /proc root as a parameter, so tests use fixture trees.
"""
from __future__ import annotations

import re
from typing import NamedTuple

_ID = re.compile(r"(?:(docker|cri-containerd|containerd|crio|libpod)-)?([0-9a-f]{64})(?:\.scope)?")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_RUNTIME = {"docker": "docker", "cri-containerd": "containerd", "containerd": "containerd",
            "crio": "cri-o", "libpod": "podman"}


class Container(NamedTuple):
    id: str  # the runtime's 64-hex container id
    runtime: str  # docker, containerd, cri-o, podman; "" when the path does not say
    pod_uid: str  # the Kubernetes pod's UID; "" outside Kubernetes


def parse_cgroup(text: str) -> Container | None:
    """The container a /proc/PID/cgroup file names, innermost first; None if none."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        for i in range(len(parts) - 1, -1, -1):
            m = _ID.fullmatch(parts[i])
            if m is None:
                continue
            pod = next((p.group(1) for part in parts[:i] if (p := _POD.search(part))), "")
            return Container(m.group(2), _RUNTIME.get(m.group(1) or "", ""), pod.replace("_", "-"))
    return None


def container_of(pid: int, proc: str = "/proc") -> Container | None:
    """The container pid runs in; None outside one, or if the process is gone."""
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            return parse_cgroup(f.read())
    except OSError:
        return None
