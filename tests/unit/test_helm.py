"""The DaemonSet chart in deploy/helm/sitsprobe, rendered by the real helm.

No cluster is needed: `helm lint` and `helm template` work offline,
kubernetes-validate checks every manifest against the Kubernetes API schemas,
and the agent's own config loader and argument parser read what the chart
renders, so the chart cannot drift from the agent unnoticed. helm comes from
scripts/helm.sh (run by scripts/setup.sh) into .venv/bin; without it these
tests fail, they do not skip.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml

from sitsprobe import cli, config, kheaders

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/sitsprobe"
DASHBOARDS = ROOT / "collectors/grafana/dashboards"
DEFAULTS = ROOT / "sitsprobe/defaults.yaml"
KUBE_VERSIONS = ("1.30", "1.35")  # appArmorProfile's first release; helm 4.1's client version
CAPABILITIES = {"BPF", "PERFMON", "SYS_ADMIN", "SYS_RESOURCE", "SYS_PTRACE"}

# What an SRE might set for GPU nodes: every kind of value the chart takes.
REALISTIC = {
    "image": {"repository": "registry.example.com/obs/sitsprobe", "tag": "0.1.0-rc1",
              "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "config": {
        "select": {"cmdline": [], "comms": ["tritonserver"], "ports": [8000, 8080]},
        "capture": {"request_bytes": 512, "redact_headers": ["authorization", "x-tenant-token"],
                    "keep_query_params": ["stream"]},
        "ring_buffer_mib": 128,
        "stitch": {"max_connections": 1048576, "flush_interval_ms": 100},
        "routes": {"templates": ["/v1/models/{model}"], "max_routes": 2000},
        "traces": {"cpu_budget": 0.1, "max_per_second": 500, "otlp_protocol": "grpc", "metrics_interval_s": 15},
        "metrics": {"port": 9300},
        "engine": {"join_wait_ms": 1000},
        "cache": {"probes": ["redis"], "prefix_segments": 2, "bucket_s": 30},
        "gpu": {"interval_ms": 100, "collapse_sustain_s": 10, "collapse_drop_ratio": 0.4},
        "kernel_headers": "/usr/src/linux-headers-6.1.0-50-cloud-amd64",
        "log_level": "debug",
    },
    "otlp": {"endpoint": "http://otel-collector.monitoring:4317", "protocol": "grpc",
             "headersSecret": {"name": "otlp-auth", "key": "headers"},
             "resourceAttributes": {"k8s.cluster.name": "prod-eu1"}},
    "security": {"privileged": False},
    "runtimeClassName": "nvidia",
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "priorityClassName": "system-node-critical",
    "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "grafanaDashboards": {"enabled": True, "namespace": "monitoring", "datasourceUid": "prom-main"},
    "podAnnotations": {"team": "inference"},
    "extraArgs": ["--cache-probe", "redis", "--log-level", "info"],
    "extraEnv": [{"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_always_on"}],
    "extraVolumes": [{"name": "boot", "hostPath": {"path": "/boot", "type": "Directory"}}],
    "extraVolumeMounts": [{"name": "boot", "mountPath": "/boot", "readOnly": True}],
}


@functools.cache
def helm() -> str:
    for candidate in (Path(sys.executable).parent / "helm", ROOT / ".venv/bin/helm"):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("helm")
    if found is None:
        pytest.fail("helm not found in .venv/bin or on PATH: run scripts/helm.sh "
                    "(scripts/setup.sh does) to put it in .venv/bin", pytrace=False)
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=60)


_VALUES_DIR = tempfile.TemporaryDirectory(prefix="sitsprobe-helm-")  # removed at exit


@functools.cache
def _values_file(text: str) -> str:
    path = Path(_VALUES_DIR.name) / (hashlib.sha256(text.encode()).hexdigest()[:16] + ".json")
    path.write_text(text)
    return str(path)


def values_args(values: dict | None) -> tuple[str, ...]:
    return ("-f", _values_file(json.dumps(values))) if values else ()


@functools.cache
def _template(args: tuple[str, ...]) -> tuple[dict, ...]:
    r = run_helm("template", "sitsprobe", str(CHART), "--namespace", "observability", *args)
    assert r.returncode == 0, f"helm template {shlex.join(args)} failed:\n{r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def render(values: dict | None = None) -> list[dict]:
    return list(_template(values_args(values)))


def refused(values: dict) -> str:
    """helm template's error message for values it must refuse."""
    r = run_helm("template", "sitsprobe", str(CHART), *values_args(values))
    assert r.returncode != 0, f"helm template accepted {values}"
    return r.stderr


def one(docs: list[dict], kind: str) -> dict:
    """The one document of this kind (a ConfigMap: the agent's config, not a dashboard)."""
    found = [d for d in docs if d["kind"] == kind and "grafana_dashboard" not in d["metadata"].get("labels", {})]
    assert len(found) == 1, f"expected one {kind}, got {[d['kind'] for d in docs]}"
    return found[0]


def agent(docs: list[dict]) -> dict:
    containers = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "sitsprobe")


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def effective_config(docs: list[dict], tmp_path: Path) -> config.Config:
    """What the agent loads from the rendered ConfigMap, through its own loader."""
    path = tmp_path / "config.yaml"
    path.write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    return config.load(path)


CASES = {"defaults": None, "realistic": REALISTIC}


# -- helm itself -----------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_lint_strict(case):
    r = run_helm("lint", "--strict", str(CHART), *values_args(CASES[case]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


def test_chart_app_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    image = agent(render())["image"]
    assert image == f"sitsprobe:{project['version']}", "image.tag must default to appVersion"


# -- the manifests are valid Kubernetes objects ------------------------------------

def _kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install -e '.[test]'", pytrace=False)
    return kubernetes_validate


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_manifests_pass_kubernetes_schemas(case, kube):
    kubernetes_validate = _kubernetes_validate()
    docs = render(CASES[case])
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Service", "ServiceAccount"]
    dashboards = ["ConfigMap"] * len(list(DASHBOARDS.glob("*.json")))
    assert kinds == sorted(expected + (["ServiceMonitor", "PrometheusRule", *dashboards]
                                       if case == "realistic" else []))
    for doc in docs:
        if doc["kind"] in ("ServiceMonitor", "PrometheusRule"):
            continue  # CRDs: no schema in kubernetes-validate; see test_service_monitor, test_prometheus_rule
        try:
            kubernetes_validate.validate(doc, kube, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(map(str, e.path))
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} ({case}) against Kubernetes "
                        f"{kube}: {where}: {e.message}", pytrace=False)


def test_service_monitor():
    docs = render(REALISTIC)
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["observability"]}
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert endpoint["interval"].endswith("s")
        # the dashboards in collectors/ expect job="sitsprobe" and instance=<node name>
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"} \
            in endpoint["relabelings"]
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "sitsprobe"
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"], "off by default"
    assert "serviceMonitor.enabled needs service.enabled" in refused(
        {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}})


def test_prometheus_rule_is_the_collectors_rules():
    rule = one(render(REALISTIC), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load((ROOT / "collectors/rules/sitsprobe.yml").read_text())
    assert "{{ $labels.instance }}" in json.dumps(rule["spec"]), "the rules' own templates arrive as they are"
    assert not [d for d in render() if d["kind"] == "PrometheusRule"], "off by default"


def test_dashboards_are_configmaps_for_the_grafana_sidecar():
    maps = [d for d in render(REALISTIC) if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]]
    files = sorted(p.name for p in DASHBOARDS.glob("*.json"))
    assert sorted(name for m in maps for name in m["data"]) == files
    for m in maps:
        assert m["metadata"]["namespace"] == "monitoring"
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "sitsprobe"}
        (name, text), = m["data"].items()
        dashboard = json.loads(text)
        assert dashboard == json.loads(json.dumps(dashboard))
        uids = set(re.findall(r'"uid": "([^"]*)"', text)) & set(re.findall(
            r'"datasource": \{\s*"type": "prometheus",\s*"uid": "([^"]*)"', text))
        assert uids == {"prom-main"}, (name, uids)  # the Grafana's own Prometheus datasource
    assert not [d for d in render() if "grafana_dashboard" in d["metadata"].get("labels", {})], "off by default"


def test_service_is_headless_on_the_metrics_port():
    for values, port in ((None, 9102), (REALISTIC, 9300)):
        docs = render(values)
        service = one(docs, "Service")
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= \
            one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
        assert service["spec"]["ports"] == [
            {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]


# -- the agent reads what the chart renders ------------------------------------------

def test_rendered_config_loads_with_the_agents_loader(tmp_path):
    conf = effective_config(render(), tmp_path)
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert conf.select.cmdline == tuple(chart_values["config"]["select"]["cmdline"])
    assert conf.metrics.port == 9102
    assert conf.traces.otlp_endpoint is None  # OTLP comes from the environment


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_values_config_arrives_in_the_effective_config(tmp_path):
    conf = effective_config(render(REALISTIC), tmp_path)
    for dotted, value in _leaves(REALISTIC["config"]):
        got = conf
        for part in dotted.split("."):
            got = getattr(got, part)
        if dotted == "cache.probes":
            assert [p.name for p in got] == value
        else:
            assert got == (tuple(value) if isinstance(value, list) else value), dotted
    assert conf.stitch.max_connections == 1048576  # no float or 1.048576e+06 on the way


@pytest.mark.parametrize("values, key", [
    ({"config": {"stitch": {"idle_flush": 5}}}, "idle_flush"),
    ({"config": {"ring_buffer_mb": 64}}, "ring_buffer_mb"),
    ({"config": {"gpu": {"collapse_sustain": 3}}}, "collapse_sustain"),
    ({"confg": {}}, "confg"),
])
def test_misspelt_key_is_refused_by_name(values, key):
    message = refused(values)
    assert "additional properties" in message and f"'{key}'" in message, message


@pytest.mark.parametrize("values, where", [
    ({"config": {"capture": {"request_bytes": 99999}}}, "/config/capture/request_bytes"),
    ({"config": {"ring_buffer_mib": 48}}, "/config/ring_buffer_mib"),
    ({"config": {"log_level": "verbose"}}, "/config/log_level"),
    ({"config": {"metrics": {"port": 0}}}, "/config/metrics/port"),
    ({"config": {"traces": {"cpu_budget": 5}}}, "/config/traces/cpu_budget"),  # a share of one core: 0..1
    ({"otlp": {"endpoint": "otel-collector:4317"}}, "/otlp/endpoint"),
    ({"security": {"privileged": "yes"}}, "/security/privileged"),
])
def test_bad_value_is_refused_by_path(values, where):
    assert f"at '{where}'" in refused(values)


def test_nothing_to_trace_is_refused():
    message = refused({"config": {"select": {"cmdline": []}}})
    assert "config.select: nothing to trace" in message
    # ... unless the selector comes on the command line
    render({"config": {"select": {"cmdline": []}}, "extraArgs": ["--port", "8000"]})


def test_two_otlp_endpoints_are_refused():
    message = refused({"otlp": {"endpoint": "http://a:4317"},
                       "config": {"traces": {"otlp_endpoint": "http://b:4317"}}})
    assert "otlp.endpoint and config.traces.otlp_endpoint" in message


def _defaults_tree(data: dict) -> dict:
    return {k: _defaults_tree(v) if isinstance(v, dict) else None for k, v in data.items()}


def _schema_tree(schema: dict, where: str = "config") -> dict:
    assert schema.get("additionalProperties") is False, f"{where}: additionalProperties must be false"
    return {k: _schema_tree(v, f"{where}.{k}") if v.get("type") == "object" else None
            for k, v in schema["properties"].items()}


def _leaves_or_sections(tree: dict, prefix: str = ""):
    for key, sub in tree.items():
        yield prefix + key
        if sub is not None:
            yield from _leaves_or_sections(sub, f"{prefix}{key}.")


def test_schema_config_is_exactly_the_defaults_key_tree():
    schema = json.loads((CHART / "values.schema.json").read_text())
    config_schema = schema["properties"]["config"]
    defaults = yaml.safe_load(DEFAULTS.read_text())
    in_schema, in_defaults = _schema_tree(config_schema), _defaults_tree(defaults)
    missing = sorted(set(_leaves_or_sections(in_defaults)) - set(_leaves_or_sections(in_schema)))
    extra = sorted(set(_leaves_or_sections(in_schema)) - set(_leaves_or_sections(in_defaults)))
    assert not missing, f"keys of sitsprobe/defaults.yaml missing from values.schema.json: {missing}"
    assert not extra, f"keys in values.schema.json that sitsprobe/defaults.yaml lacks: {extra}"
    # and the agent's own defaults are valid chart values
    import jsonschema
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(config_schema)
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(defaults)]
    assert not errors, errors


@pytest.mark.parametrize("case", CASES)
def test_command_is_what_sitsprobe_run_accepts(case):
    docs = render(CASES[case])
    container = agent(docs)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["command"] == ["sitsprobe"] and "sitsprobe" in scripts
    try:
        args = cli._parser().parse_args(container["args"])
    except SystemExit:
        pytest.fail(f"`sitsprobe {shlex.join(container['args'])}` is refused by sitsprobe's parser",
                    pytrace=False)
    assert args.command == "run"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert os.path.dirname(args.config) == mount["mountPath"]
    assert os.path.basename(args.config) in one(docs, "ConfigMap")["data"]
    if case == "realistic":
        assert (args.cache_probe, args.log_level) == (["redis"], "info")


def test_notes_commands_are_what_sitsprobe_accepts():
    r = run_helm("install", "sitsprobe", str(CHART), "--dry-run=client", "--namespace", "obs")
    assert r.returncode == 0, r.stderr
    notes = r.stdout.partition("NOTES:")[2]
    commands = [line.split(" -- ", 1)[1] for line in notes.splitlines() if " -- sitsprobe " in line]
    assert {c.split()[1] for c in commands} >= {"doctor", "config", "top"}
    for command in commands:
        argv = shlex.split(command)
        try:
            cli._parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"NOTES.txt: `{command}` is refused by sitsprobe's parser", pytrace=False)
    assert "port-forward" in notes and "logs daemonset/sitsprobe" in notes


# -- the DaemonSet ---------------------------------------------------------------------

HOST_MOUNTS = {  # mount path in the agent: (host path, read-only)
    "/sys/kernel/tracing": ("/sys/kernel/tracing", False),
    "/sys/kernel/debug": ("/sys/kernel/debug", False),
    "/sys/fs/bpf": ("/sys/fs/bpf", True),
    "/host/lib/modules": ("/lib/modules", True),
    "/usr/src": ("/usr/src", True),
    "/run/sitsprobe": ("/run/sitsprobe", False),  # a start's capabilities and compiled programs, for the next
}


def _mounts(pod: dict, container: dict) -> dict[str, tuple[dict, bool]]:
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: (volumes[m["name"]], m.get("readOnly", False))
            for m in container["volumeMounts"]}


def test_daemonset_host_access():
    ds = one(render(), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod.get("hostNetwork", False) is False
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    mounts = _mounts(pod, agent([ds]))
    for path, (host, read_only) in HOST_MOUNTS.items():
        volume, ro = mounts[path]
        assert volume.get("hostPath", {}).get("path") == host, path
        assert ro is read_only, f"{path}: readOnly should be {read_only}"
    modules, ro = mounts["/lib/modules"]
    assert "emptyDir" in modules and not ro, "/lib/modules: a writable pod-local overlay"
    assert "/sys/fs/cgroup" not in mounts  # containers.py reads /proc/PID/cgroup (hostPID)
    docs = render({"kernelHeaders": {"mountHost": False}})
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert not {"/lib/modules", "/host/lib/modules", "/usr/src"} & set(_mounts(pod, agent(docs)))
    assert "initContainers" not in pod


def test_security_modes():
    privileged = agent(render())["securityContext"]
    assert privileged == {"privileged": True}
    caps = agent(render(REALISTIC))["securityContext"]
    assert caps["privileged"] is False
    assert set(caps["capabilities"]["add"]) == CAPABILITIES
    assert caps["seccompProfile"] == {"type": "Unconfined"}
    assert caps["appArmorProfile"] == {"type": "Unconfined"}


def test_probes_on_the_metrics_port():
    for values, port in ((None, 9102), (REALISTIC, 9300)):
        container = agent(render(values))
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container["ports"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[kind]["httpGet"] == {"path": "/healthz", "port": "metrics"}, kind
        startup = container["startupProbe"]
        # bcc compiles before the port opens: allow minutes, not seconds
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_environment_from_the_downward_api():
    env = env_of(agent(render()))
    fields = {name: e["valueFrom"]["fieldRef"]["fieldPath"]
              for name, e in env.items() if "fieldRef" in e.get("valueFrom", {})}
    assert fields == {"K8S_NODE_NAME": "spec.nodeName", "K8S_POD_NAME": "metadata.name",
                      "K8S_POD_NAMESPACE": "metadata.namespace"}
    names = list(env)
    attributes = env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    pairs = dict(p.split("=", 1) for p in attributes.split(","))
    assert pairs["k8s.node.name"] == "$(K8S_NODE_NAME)"
    assert pairs["sitsprobe.agent.pod.name"] == "$(K8S_POD_NAME)"
    assert "k8s.pod.name" not in pairs  # would name the agent's pod on the traced pods' spans
    # $(VAR) expands only for variables defined earlier in the list
    assert names.index("OTEL_RESOURCE_ATTRIBUTES") > max(names.index(n) for n in fields)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # no endpoint, no service name: each traced process keeps its own service.name
    assert not {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"} & set(env)


def test_otlp_values_become_the_standard_variables():
    env = env_of(agent(render(REALISTIC)))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.monitoring:4317"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "grpc"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == \
        {"name": "otlp-auth", "key": "headers"}
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"].endswith(",k8s.cluster.name=prod-eu1")
    assert env["OTEL_TRACES_SAMPLER"]["value"] == "parentbased_always_on"
    named = env_of(agent(render({"otlp": {"serviceName": "inference"}})))
    assert named["OTEL_SERVICE_NAME"]["value"] == "inference"


def test_gpu_node_scheduling():
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert not {"runtimeClassName", "nodeSelector"} & set(pod)
    assert pod["priorityClassName"] == "system-node-critical"  # an agent evicted first sees nothing
    assert "priorityClassName" not in one(render({"priorityClassName": ""}), "DaemonSet")["spec"]["template"]["spec"]
    everywhere = one(render({"tolerateAllTaints": True}), "DaemonSet")["spec"]["template"]["spec"]
    assert everywhere["tolerations"] == [{"operator": "Exists"}]
    pod = one(render(REALISTIC), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["affinity"] == REALISTIC["affinity"]
    requests = agent(render())["resources"]["requests"]
    assert {"cpu", "memory"} <= set(requests)


def test_metadata_rbac_is_read_only_and_off_with_it(tmp_path):
    docs = render()
    account = one(docs, "ServiceAccount")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert account["automountServiceAccountToken"] is True and pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    role, binding = one(docs, "ClusterRole"), one(docs, "ClusterRoleBinding")
    assert {(tuple(r["apiGroups"]), tuple(r["resources"])) for r in role["rules"]} == {
        (("",), ("pods",)), (("apps",), ("replicasets",))}
    assert all(r["verbs"] == ["get", "list", "watch"] for r in role["rules"])  # read-only
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]
    assert effective_config(docs, tmp_path).kubernetes.metadata == "auto"
    # off: no token, no role, and the agent is told not to look
    off = render({"kubernetesMetadata": False})
    assert one(off, "ServiceAccount")["automountServiceAccountToken"] is False
    assert one(off, "DaemonSet")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert not [d for d in off if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert effective_config(off, tmp_path).kubernetes.metadata == "off"
    # and only the metadata watch calls the API
    api = re.compile(r"^\s*(import|from)\s+kubernetes\b|KUBERNETES_SERVICE|serviceaccount", re.M)
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "sitsprobe").rglob("*.py") if api.search(p.read_text())]
    assert users == ["sitsprobe/workloads.py"], users


def test_config_change_rolls_the_pods():
    def checksum(values):
        return one(render(values), "DaemonSet")["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"]
    assert checksum(None) != checksum({"config": {"capture": {"request_bytes": 128}}})
    assert checksum(None) == checksum({"podAnnotations": {"a": "b"}})


def test_scrape_annotations():
    for values, port in ((None, "9102"), (REALISTIC, "9300")):
        annotations = one(render(values), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == port
        assert annotations["prometheus.io/path"] == "/metrics"
    off = one(render({"prometheus": {"scrapeAnnotations": False}}), "DaemonSet")
    assert "prometheus.io/scrape" not in off["spec"]["template"]["metadata"]["annotations"]


# -- kernel headers: the pod-local /lib/modules and sitsprobe.kheaders ----------------

def _init_script(docs: list[dict]) -> list[str]:
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"][-2:] == ["/host/lib/modules", "/lib/modules"]
    mounts = _mounts(pod, init)
    assert "emptyDir" in mounts["/lib/modules"][0] and not mounts["/lib/modules"][1]
    assert mounts["/host/lib/modules"][1] and mounts["/usr/src"][1]
    return init["command"][:-2]


def test_modules_overlay_lets_the_agent_link_headers_without_touching_the_host(tmp_path):
    """The init container's own script, run on fixture trees, then the agent's resolver.

    The pod's /lib/modules is an emptyDir the init container fills with links to
    the host's entries; the host's tree is mounted read-only and must stay as it is.
    """
    pod_root = tmp_path / "pod"  # what the agent sees as /
    host_modules = tmp_path / "host/lib/modules"  # the read-only host mount
    overlay = pod_root / "lib/modules"  # the emptyDir
    overlay.mkdir(parents=True)
    usr_src = pod_root / "usr/src"
    # host kernel A has headers (build links into /usr/src); B lost them (a dangling link)
    a, b = "6.1.0-50-cloud-amd64", "6.1.0-51-cloud-amd64"
    common, build = usr_src / "linux-headers-6.1.0-50-common", usr_src / f"linux-headers-{a}"
    (common / "include/linux").mkdir(parents=True)
    (build / "include/generated").mkdir(parents=True)
    (build / "include/generated/utsrelease.h").write_text(f'#define UTS_RELEASE "{a}"\n')
    (build / "Makefile").write_text("include /usr/src/linux-headers-6.1.0-50-common/Makefile\n")
    (host_modules / a / "kernel").mkdir(parents=True)
    (host_modules / a / "build").symlink_to(build)
    (host_modules / a / "source").symlink_to(common)
    (host_modules / b / "kernel").mkdir(parents=True)
    (host_modules / b / "build").symlink_to(usr_src / f"linux-headers-{b}")  # removed
    before = sorted(str(p) for p in host_modules.rglob("*"))

    r = subprocess.run([*_init_script(render()), str(host_modules), str(overlay)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert "2 release(s)" in r.stdout

    host = kheaders.resolve(a, root=str(pod_root))
    assert host.kind == kheaders.HOST and not host.mismatch
    assert kheaders.install(host, root=str(pod_root)) is None
    nearest = kheaders.resolve(b, root=str(pod_root))
    assert nearest.kind == kheaders.NEAREST and nearest.mismatch
    note = kheaders.install(nearest, root=str(pod_root))  # writes into the overlay only
    assert note and note.startswith("linked ")
    assert os.path.realpath(overlay / b / "build") == str(build)
    assert (overlay / b / "kernel").is_dir()  # the host's modules stay reachable
    assert sorted(str(p) for p in host_modules.rglob("*")) == before
    assert kheaders.resolve(b, root=str(pod_root)).kind == kheaders.HOST  # what bcc will find


@pytest.mark.parametrize("values, grace", [(None, 30), ({"config": {"stop_timeout_s": 20}}, 30),
                                           ({"config": {"stop_timeout_s": 60.5}}, 71),
                                           ({"terminationGracePeriodSeconds": 5}, 15)])
def test_the_grace_period_is_above_the_agents_stop_bound(values, grace, tmp_path):
    """Kubernetes kills a pod that outlives terminationGracePeriodSeconds: the
    agent's bounded stop (stop_timeout_s) and its own exit must fit inside,
    whatever the values say."""
    docs = render(values)
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
    assert grace >= effective_config(docs, tmp_path).stop_timeout_s + 10
