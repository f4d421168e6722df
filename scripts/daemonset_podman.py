"""Runs the Helm chart's DaemonSet pod on this host with podman, as the
kubelet would: the chart rendered by helm, its init containers to
completion, then the agent container detached, each with the pod's host PID
namespace, the containers' security context, command, args, env, resource
limits and volume mounts (hostPath as is; emptyDir and the ConfigMap as
folders under --workdir). Nothing of the pod is written here twice: what the
chart changes, this runs.

    daemonset_podman.py --image localhost/sitsprobe:0.1.0 --values v.yaml \\
        --name sitsprobe-agent --port 19102 --workdir /tmp/pod

Prints the agent container's name. Used by scripts/image.sh.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "sitsprobe"
NAMESPACE = "default"


def render(values: Path) -> list[dict]:
    helm = shutil.which("helm", path=f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}")
    if helm is None:
        sys.exit("daemonset_podman: helm not found (scripts/helm.sh puts it into .venv/bin)")
    out = subprocess.run([helm, "template", "sitsprobe", str(CHART), "--namespace", NAMESPACE, "-f", str(values)],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"daemonset_podman: helm template failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def volume_sources(pod: dict, docs: list[dict], workdir: Path) -> dict[str, str]:
    """volume name -> the host path podman mounts for it."""
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    out = {}
    for v in pod.get("volumes", []):
        if "hostPath" in v:
            out[v["name"]] = v["hostPath"]["path"]
        elif "emptyDir" in v or "configMap" in v:
            folder = workdir / v["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for file, text in config_maps.get(v.get("configMap", {}).get("name"), {}).items():
                (folder / file).write_text(text)
            out[v["name"]] = str(folder)
        else:
            sys.exit(f"daemonset_podman: volume {v['name']}: only hostPath, emptyDir and configMap are run here")
    return out


def env_of(container: dict, pod_name: str) -> list[str]:
    """-e flags: values with $(VAR) expanded as the kubelet does, the downward API's fields filled in."""
    fields = {"spec.nodeName": socket.gethostname(), "metadata.name": pod_name, "metadata.namespace": NAMESPACE}
    seen: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            value = re.sub(r"\$\((\w+)\)", lambda m: seen.get(m.group(1), m.group(0)), e["value"])
        else:
            path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if path not in fields:
                sys.exit(f"daemonset_podman: env {e['name']}: {e.get('valueFrom')} is not run here")
            value = fields[path]
        seen[e["name"]] = value
    return [f"--env={k}={v}" for k, v in seen.items()]


def podman_args(pod: dict, container: dict, volumes: dict[str, str], pod_name: str, port: int) -> list[str]:
    args = ["--pid=host"] if pod.get("hostPID") else []
    if pod.get("hostNetwork"):
        args.append("--network=host")
    else:
        args += [f"--publish=127.0.0.1:{port}:{p['containerPort']}" for p in container.get("ports", [])
                 if p.get("name") == "metrics"]
    sc = container.get("securityContext", {})
    if sc.get("privileged"):
        args.append("--privileged")
    args += [f"--cap-add={c}" for c in sc.get("capabilities", {}).get("add", [])]
    args += [f"--cap-drop={c}" for c in sc.get("capabilities", {}).get("drop", [])]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        args.append(f"--memory={limits['memory'].replace('Gi', 'g').replace('Mi', 'm')}")
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        args.append(f"--cpus={int(cpu[:-1]) / 1000 if cpu.endswith('m') else cpu}")
    for m in container.get("volumeMounts", []):
        args.append(f"--volume={volumes[m['name']]}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}")
    args += env_of(container, pod_name)
    command = container.get("command", [])
    if command:
        args.append(f"--entrypoint={command[0]}")
    return args + [container["image"], *command[1:], *container.get("args", [])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", required=True, help="the image to run, repository:tag")
    ap.add_argument("--values", type=Path, required=True, help="a values file for the chart")
    ap.add_argument("--name", required=True, help="the agent container's name (the pod's name too)")
    ap.add_argument("--port", type=int, required=True, help="host port for the metrics port (127.0.0.1)")
    ap.add_argument("--workdir", type=Path, required=True, help="where emptyDir and ConfigMap volumes live")
    a = ap.parse_args()

    repository, _, tag = a.image.rpartition(":")
    values = a.workdir / "values.yaml"
    a.workdir.mkdir(parents=True, exist_ok=True)
    values.write_text(yaml.safe_dump(yaml.safe_load(a.values.read_text())
                                     | {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}}))
    docs = render(values)
    pod = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    volumes = volume_sources(pod, docs, a.workdir)
    for c in pod.get("initContainers", []):
        run = subprocess.run(["podman", "run", "--rm", "--pull=never",
                              *podman_args(pod, c, volumes, a.name, a.port)])
        if run.returncode:
            sys.exit(f"daemonset_podman: init container {c['name']} exited {run.returncode}")
    agent = next(c for c in pod["containers"] if c["name"] == "sitsprobe")
    run = subprocess.run(["podman", "run", "--detach", "--pull=never", f"--name={a.name}",
                          *podman_args(pod, agent, volumes, a.name, a.port)], stdout=subprocess.DEVNULL)
    if run.returncode:
        sys.exit(f"daemonset_podman: podman run of {agent['name']} exited {run.returncode}")
    print(a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
