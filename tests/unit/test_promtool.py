"""collectors/ through Prometheus's own parser (promtool, Debian's prometheus
package): the alerting rules, and every PromQL expression of the dashboards
and data sources, made into recording rules with Grafana's variables filled in."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from .test_collectors import COLLECTORS, prometheus_queries

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus) is needed: "
                                                        "scripts/setup.sh installs it")


def check_rules(path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)


def filled(expr: str) -> str:
    """Grafana's variables as Prometheus would see them once Grafana has filled them in."""
    expr = re.sub(r"label_values\((.*),\s*\w+\)\s*$", r"\1", expr.strip(), flags=re.S)
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)
    return re.sub(r"\$\{?(\w+)(:\w+)?\}?", "sitsprobe", expr)


def test_the_alerting_rules_pass_promtool():
    for path in sorted((COLLECTORS / "rules").glob("*.yml")):
        r = check_rules(path)
        assert r.returncode == 0, r.stdout + r.stderr


def test_every_dashboard_expression_parses(tmp_path):
    queries = [(where, filled(expr)) for where, expr, _ in prometheus_queries()]
    assert len(queries) > 20
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"check_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]}]}
    path = tmp_path / "dashboards.yml"
    path.write_text(yaml.safe_dump(rules))
    r = check_rules(path)
    assert r.returncode == 0, "\n".join(
        f"{where}: {expr}" for i, (where, expr) in enumerate(queries) if f"check_{i}" in r.stderr) + r.stderr


def test_a_bad_expression_fails(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "r", "expr": filled('sum by (process) (rate(x{job="$job"}[$__rate_interval])')}]}]}))
    assert check_rules(path).returncode != 0
