"""A container's pod from its runtime's state on the host, for when no
Kubernetes API answers: the CRI runtimes write each container's OCI config
with the kubelet's names in its annotations.

  containerd  run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/config.json
              io.kubernetes.cri.sandbox-namespace, -name, -uid, io.kubernetes.cri.container-name
  CRI-O       run/containers/storage/overlay-containers/<id>/userdata/config.json
              io.kubernetes.pod.namespace, .name, .uid, io.kubernetes.container.name

The agent runs in the host's PID namespace, so the host's files are under
/proc/1/root from inside its pod: no extra mount. Where that is not readable
(a sandbox whose init hides its root) and on a plain host, they are under /.
What the annotations do not say (the owner, the pod's labels) stays unknown.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .containers import Container
from .workloads import Workload

MAX_CONFIG = 1 << 20  # an OCI config is a few kB; never read a huge file whole
_STATE = {  # runtime -> (its config.json, the annotations: namespace, pod, pod UID, container)
    "containerd": ("run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
                   ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
                    "io.kubernetes.cri.sandbox-uid", "io.kubernetes.cri.container-name")),
    "cri-o": ("run/containers/storage/overlay-containers/{id}/userdata/config.json",
              ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.pod.uid",
               "io.kubernetes.container.name")),
}


def host_root() -> Path:
    """Where the host's files are: /proc/1/root where it can be read, else /."""
    try:
        os.listdir("/proc/1/root")
    except OSError:
        return Path("/")
    return Path("/proc/1/root")


def runtime_workload(c: Container, node: str, root: Path) -> Workload | None:
    """The pod `c` runs in, as its runtime's state names it; None where no
    state is readable (another runtime, not a pod, a malformed file)."""
    runtimes = (c.runtime,) if c.runtime in _STATE else tuple(_STATE)  # cgroupfs paths do not say
    for runtime in runtimes:
        path, keys = _STATE[runtime]
        try:
            with open(root / path.format(id=c.id), "rb") as f:
                annotations = json.loads(f.read(MAX_CONFIG)).get("annotations")
        except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: "[[[[..."
            continue
        if not isinstance(annotations, dict):
            continue
        namespace, pod, uid, container = (a if isinstance(a := annotations.get(k), str) else "" for k in keys)
        if pod:
            return Workload(namespace, pod, uid or c.pod_uid, node, container, "", "", ())
    return None
