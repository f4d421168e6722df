"""Which Kubernetes workload a traced process belongs to: its pod (namespace,
name, UID), container, owner (Deployment, StatefulSet, DaemonSet, Job;
a ReplicaSet's Deployment), node and the pod labels asked for.

The process's cgroup gives its container id and pod UID
(sitsprobe.containers); the rest comes from the Kubernetes API, through the
`kubernetes` client, in-cluster or from $KUBECONFIG: one list and watch of
the pods on this node only (a field selector on spec.nodeName), and a get of
each ReplicaSet a pod names. When the API goes away, the names already known
stay, and the log says so once; the watch is tried again, backing off.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Iterable
from typing import NamedTuple

from .containers import Container

log = logging.getLogger("sitsprobe")

OWNER_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet", "CronJob")
MAX_BACKOFF_S = 30.0


class Workload(NamedTuple):
    namespace: str
    pod: str
    pod_uid: str
    node: str
    container: str  # "" when the pod's status does not list the container yet
    owner_kind: str  # one of OWNER_KINDS; "" for a bare pod
    owner_name: str
    labels: tuple[tuple[str, str], ...]  # the pod labels kubernetes.pod_labels names
    app: str = ""  # its app.kubernetes.io/name label

    @property
    def service_name(self) -> str:
        """The OpenTelemetry conventions' choice: the app.kubernetes.io/name
        label, else the owner's name, else the container's."""
        return self.app or self.owner_name or self.container or self.pod

    def attributes(self) -> dict[str, str]:
        """The OpenTelemetry k8s.* resource attributes, and service.name."""
        out = {"k8s.namespace.name": self.namespace, "k8s.pod.name": self.pod, "k8s.pod.uid": self.pod_uid,
               "k8s.node.name": self.node, "service.name": self.service_name}
        if self.container:
            out["k8s.container.name"] = self.container
        if self.owner_kind:
            out[f"k8s.{self.owner_kind.lower()}.name"] = self.owner_name
        out.update({f"k8s.pod.label.{k}": v for k, v in self.labels})
        return {k: v for k, v in out.items() if v}


class PodIndex:
    """The pods of one node as the API describes them (JSON objects), and
    the owners of their ReplicaSets; thread-safe."""

    def __init__(self, pod_labels: Iterable[str] = ()):
        self._labels = tuple(pod_labels)
        self._pods: dict[str, dict] = {}  # uid -> pod
        self._rs_owner: dict[tuple[str, str], tuple[str, str]] = {}  # (ns, replicaset) -> (kind, name)
        self._lock = threading.Lock()

    def replace(self, pods: list[dict]) -> None:
        with self._lock:
            self._pods = {p["metadata"]["uid"]: p for p in pods if p.get("metadata", {}).get("uid")}

    def apply(self, kind: str, pod: dict) -> None:
        uid = pod.get("metadata", {}).get("uid")
        if not uid:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = pod

    def replicasets(self) -> list[tuple[str, str]]:
        """(namespace, name) of the ReplicaSets pods name whose owner is not known yet."""
        with self._lock:
            wanted = {(p["metadata"].get("namespace", ""), ref.get("name", ""))
                      for p in self._pods.values() for ref in _controllers(p) if ref.get("kind") == "ReplicaSet"}
            return sorted(wanted - set(self._rs_owner))

    def set_owner(self, namespace: str, replicaset: str, owner: tuple[str, str]) -> None:
        with self._lock:
            self._rs_owner[(namespace, replicaset)] = owner

    def workload(self, c: Container) -> Workload | None:
        with self._lock:
            pod = self._pods.get(c.pod_uid)
            if pod is None:
                return None
            meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
            namespace = meta.get("namespace", "")
            kind, name = "", ""
            for ref in _controllers(pod):
                kind, name = ref.get("kind", ""), ref.get("name", "")
                if kind == "ReplicaSet":  # a Deployment's, most likely: its owner, once known
                    kind, name = self._rs_owner.get((namespace, name), (kind, name))
            container = next((s.get("name", "") for s in status.get("containerStatuses", [])
                              + status.get("initContainerStatuses", [])
                              if s.get("containerID", "").rpartition("/")[2] == c.id), "")
            labels = meta.get("labels") or {}
            return Workload(namespace, meta.get("name", ""), c.pod_uid, spec.get("nodeName", ""), container,
                            kind if kind in OWNER_KINDS else "", name if kind in OWNER_KINDS else "",
                            tuple((k, labels[k]) for k in self._labels if k in labels),
                            labels.get("app.kubernetes.io/name", ""))


def _controllers(pod: dict) -> list[dict]:
    return [r for r in pod.get("metadata", {}).get("ownerReferences") or [] if r.get("controller")]


def node_name(configured: str = "") -> str:
    """This node's name: the config's, else $K8S_NODE_NAME (the chart sets it
    from the downward API) or $NODE_NAME, else the host name (a kubelet's
    default node name)."""
    return configured or os.environ.get("K8S_NODE_NAME") or os.environ.get("NODE_NAME") or socket.gethostname()


def api_configured() -> str | None:
    """Where the API would come from (in-cluster, $KUBECONFIG, ~/.kube/config); None: nowhere."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "in-cluster service account"
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return f"kubeconfig {path}" if os.path.exists(path.split(os.pathsep)[0]) else None


class Workloads:
    """The watch of this node's pods, in a thread of its own."""

    def __init__(self, node: str, pod_labels: Iterable[str] = (), watch_timeout_s: int = 300):
        self.node = node
        self.index = PodIndex(pod_labels)
        self._timeout = watch_timeout_s
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._said_down = False

    def start(self, wait_s: float = 5.0) -> None:
        """Connect (in-cluster config first, then $KUBECONFIG) and list this
        node's pods, waiting up to wait_s for the first list; then watch."""
        from kubernetes import client, config

        conf = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=conf)
        except config.ConfigException:
            # $KUBECONFIG read now: the client reads it once, when first imported
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=conf)
        conf.retries = False  # this loop retries, backing off; urllib3's own would only log
        api = client.ApiClient(conf)
        self._core, self._apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self._thread = threading.Thread(target=self._run, name="k8s-pods", daemon=True)
        self._thread.start()
        self._synced.wait(wait_s)

    def stop(self) -> None:
        self._stop.set()

    def of(self, c: Container | None) -> Workload | None:
        return None if c is None or not c.pod_uid else self.index.workload(c)

    def _run(self) -> None:
        backoff = 1.0
        selector = f"spec.nodeName={self.node}"
        while not self._stop.is_set():
            try:
                listed = self._json(self._core.list_pod_for_all_namespaces(
                    field_selector=selector, _preload_content=False, _request_timeout=10))
                self.index.replace(listed.get("items") or [])
                self._owners()
                self._synced.set()
                if self._said_down:
                    log.info("Kubernetes API reachable again: pod names are current")
                    self._said_down = False
                backoff = 1.0
                self._watch(selector, listed.get("metadata", {}).get("resourceVersion", ""))
            except Exception as e:  # the API away, a proxy's error page, a token refused
                self._synced.set()
                if not self._said_down:
                    log.warning("Kubernetes API unreachable (%s): keeping the pod names known so far; "
                                "retrying", _short(e))
                    self._said_down = True
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _watch(self, selector: str, version: str) -> None:
        resp = self._core.list_pod_for_all_namespaces(
            field_selector=selector, watch=True, resource_version=version, timeout_seconds=self._timeout,
            _preload_content=False, _request_timeout=self._timeout + 10)
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    return
                event = json.loads(line)
                if event.get("type") == "ERROR":  # e.g. 410 Gone: list again
                    return
                self.index.apply(event.get("type", ""), event.get("object") or {})
                self._owners()
        finally:
            resp.release_conn()

    def _owners(self) -> None:
        for namespace, name in self.index.replicasets():
            rs = self._json(self._apps.read_namespaced_replica_set(name, namespace, _preload_content=False,
                                                                   _request_timeout=10))
            owner = next(((r.get("kind", ""), r.get("name", "")) for r in rs.get("metadata", {})
                          .get("ownerReferences") or [] if r.get("controller")), ("ReplicaSet", name))
            self.index.set_owner(namespace, name, owner)

    @staticmethod
    def _json(resp) -> dict:
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()


def _lines(resp) -> Iterable[bytes]:
    """A watch response's JSON lines, as they arrive."""
    pending = b""
    for chunk in resp.stream(4096, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())


def _short(e: Exception) -> str:
    """The part of a client error a person reads: the HTTP status, or the
    innermost reason a connection failed."""
    reason = getattr(e, "reason", None)
    if isinstance(reason, Exception):  # urllib3 wraps the connection's own error
        e = reason
    if getattr(e, "status", None):
        return f"HTTP {e.status} {getattr(e, 'reason', '') or ''}".strip()
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if text.startswith("<") and ">: " in text:  # "<urllib3...HTTPConnection object at 0x..>: Failed ..."
        text = text.split(">: ", 1)[1]
    return text[:200]
