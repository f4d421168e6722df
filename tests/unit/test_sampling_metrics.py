"""What the trace sampler's numbers look like on /metrics (export.prom.KernelMetrics):
the outcomes, and what a trace count means (budget, cost, CPU spent)."""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sitsprobe.export.prom import KernelMetrics
from sitsprobe.sampling import TraceSampler
from tests.unit.test_sampling import BUDGET, window


def sampler_numbers(s: TraceSampler) -> dict[str, float]:
    """The dict the agent's lambda passes to KernelMetrics."""
    return {"seen": s.seen, "sampled": s.exported, "sampled_out": s.dropped,
            "budget_per_second": s.budget_per_second, "cost_per_trace_seconds": s.cost_per_trace,
            "cpu_seconds": s.cpu_seconds}


def scrape(numbers) -> dict[str, tuple[str, str, dict]]:
    """family name -> (type, help, {labels or (): value})."""
    registry = CollectorRegistry()
    registry.register(KernelMetrics(lambda: {"exchanges": 0, "writes_read": 0}, dict, dict, numbers, dict))
    out = {}
    for f in text_string_to_metric_families(generate_latest(registry).decode()):
        out[f.name] = (f.type, f.documentation,
                       {tuple(sorted(x.labels.items())) or (): x.value for x in f.samples})
    return out


def test_the_budget_the_cost_and_the_cpu_spent():
    s = TraceSampler(keep_slowest=20, cpu_budget=BUDGET)
    window(s, 0, 1000, 500e-6)  # 200 at once (the prior's budget) and 20 held: 100 ms, 50 too many
    window(s, 1, 10, 500e-6)  # the 20 held come out; 10 more at once
    m = scrape(lambda: sampler_numbers(s))
    kind, doc, v = m["sitsprobe_trace_budget_per_second"]
    assert (kind, v) == ("gauge", {(): 10.0})  # 50 ms over 500 µs is 100, less 50 ms owed: the floor
    assert "traces.cpu_budget" in doc and "traces.max_per_second" in doc
    kind, doc, v = m["sitsprobe_trace_cost_seconds"]
    assert kind == "gauge" and math.isclose(v[()], 500e-6)
    kind, doc, v = m["sitsprobe_trace_cpu_seconds"]  # exposed as _total
    assert kind == "counter" and math.isclose(v[()], 230 * 500e-6) and "share of one core" in doc
    kind, _, v = m["sitsprobe_traces"]
    assert v == {(("outcome", "seen"),): 1010, (("outcome", "sampled"),): 230, (("outcome", "sampled_out"),): 780}


def test_no_budget_is_infinite():
    m = scrape(lambda: sampler_numbers(TraceSampler(max_per_second=0, keep_slowest=20, cpu_budget=0)))
    assert m["sitsprobe_trace_budget_per_second"][2] == {(): math.inf}


def test_only_the_outcomes_without_the_numbers():
    m = scrape(lambda: {"seen": 3, "sampled": 2, "sampled_out": 1})
    assert "sitsprobe_traces" in m
    assert not {"sitsprobe_trace_budget_per_second", "sitsprobe_trace_cost_seconds",
                "sitsprobe_trace_cpu_seconds"} & set(m)
