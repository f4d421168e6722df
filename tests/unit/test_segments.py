"""The five latency segments partition a request's span (the definitions are
sitsprobe/stitch/segments.py's docstring)."""
from __future__ import annotations

import random

import pytest

from sitsprobe.request import Inference, Request, Stage
from sitsprobe.stitch.segments import SEGMENTS, StageSegments, segments

MS = 1_000_000
RULES = StageSegments(scheduling=["queue"], io=["h2d"], cache=["prefix_lookup"])


def req(start=0, end=100 * MS, stages=(), **kw) -> Request:
    inf = Inference(1, "tiny", start, end, stages=tuple(Stage(n, a * MS, b * MS) for n, a, b in stages)) \
        if stages else None
    return Request(pid=1, comm="python3", fd=5, start_ns=start, end_ns=end, first_out_ns=None,
                   bytes_in=100, bytes_out=100, inference=inf, **kw)


def named(t) -> dict[str, float]:
    return {k: v / MS for k, v in zip(SEGMENTS, t)}


def test_wire_only_the_read_and_the_sends_are_network_the_rest_compute():
    r = req(last_in_ns=4 * MS, send_ns=6 * MS)
    assert named(segments(r, RULES)) == {"network": 10, "scheduling": 0, "compute": 90, "io": 0, "cache": 0}


def test_run_queue_wait_comes_out_of_compute_and_no_more_than_it_holds():
    assert named(segments(req(last_in_ns=10 * MS, runq_ns=30 * MS), RULES))["scheduling"] == 30
    capped = named(segments(req(last_in_ns=90 * MS, runq_ns=500 * MS), RULES))
    assert capped["scheduling"] == 10 and capped["compute"] == 0


def test_engine_stages_by_their_segment_with_the_gaps_inside_compute_and_outside_network():
    r = req(stages=[("queue", 10, 20), ("prefix_lookup", 20, 22), ("prefill", 22, 40),
                    ("h2d", 30, 33), ("decode", 45, 80)])
    assert named(segments(r, RULES)) == {
        "network": 10 + 20,  # before the first stage, after the last
        "scheduling": 10,
        "compute": 18 - 3 + 5 + 35,  # prefill less the copy inside it, the gap 40..45, decode
        "io": 3, "cache": 2}


def test_stages_outside_the_span_are_clipped():
    r = req(start=10 * MS, end=50 * MS, stages=[("prefill", 0, 30), ("decode", 30, 70)])
    assert named(segments(r, RULES)) == {"network": 0, "scheduling": 0, "compute": 40, "io": 0, "cache": 0}


@pytest.mark.parametrize("seed", range(30))
def test_they_always_add_up_to_the_duration(seed):
    rng = random.Random(seed)
    end = rng.randrange(1, 10**9)
    stages = []
    for _ in range(rng.randrange(0, 40)):
        a = rng.randrange(-10**8, end + 10**8)
        stages.append((rng.choice(["queue", "prefill", "decode", "h2d", "prefix_lookup", "x"]),
                       a / MS, (a + rng.randrange(0, 10**8)) / MS))
    r = req(end=end, stages=stages, last_in_ns=rng.randrange(0, end), send_ns=rng.randrange(0, end),
            runq_ns=rng.randrange(0, 2 * end))
    t = segments(r, RULES)
    assert min(t) >= 0
    assert sum(t) == pytest.approx(end, abs=len(stages) + 1)  # stage times are rounded to ns


NET_RULES = StageSegments(scheduling=["queue"], io=["h2d"], cache=["prefix_lookup"], network=["write"])
PRIORITY = ("cache", "io", "scheduling", "network", "compute")  # who takes an overlapped instant


@pytest.mark.parametrize("seed", range(40))
def test_each_millisecond_goes_where_the_rule_says(seed):
    """The sweep against the docstring's rule applied to each millisecond of
    a request on its own: the first of cache, io, scheduling, network, compute
    among the stages over it; none: compute inside the engine's first to last
    stage, network outside."""
    rng = random.Random(seed)
    end = rng.randrange(1, 60)
    stages = []
    for _ in range(rng.randrange(1, 12)):
        a = rng.randrange(-5, end + 5)
        stages.append((rng.choice(["queue", "prefill", "decode", "h2d", "prefix_lookup", "write"]), a,
                       a + rng.randrange(0, 20)))
    by_name = {"queue": "scheduling", "h2d": "io", "prefix_lookup": "cache", "write": "network"}
    inside = [(n, max(a, 0), min(b, end)) for n, a, b in stages if b > 0 and a < end]
    want = dict.fromkeys(SEGMENTS, 0)
    for ms in range(end):
        over = {by_name.get(n, "compute") for n, a, b in inside if a <= ms < b}
        if over:
            want[next(seg for seg in PRIORITY if seg in over)] += 1
        elif inside and min(a for _, a, _ in inside) <= ms < max(b for _, _, b in inside):
            want["compute"] += 1
        else:
            want["network"] += 1
    assert named(segments(req(end=end * MS, stages=stages), NET_RULES)) == want


def test_the_processs_device_waits_are_io_with_or_without_markers():
    waits = [(15 * MS, 20 * MS), (18 * MS, 25 * MS), (200 * MS, 300 * MS)]  # overlapping, and past the end
    wire = named(segments(req(last_in_ns=10 * MS), RULES, waits))
    assert wire == {"network": 10, "scheduling": 0, "compute": 80, "io": 10, "cache": 0}
    marked = named(segments(req(stages=[("prefill", 10, 40)]), RULES, [(30 * MS, 35 * MS)]))
    assert marked == {"network": 70, "scheduling": 0, "compute": 25, "io": 5, "cache": 0}


def test_the_agent_gives_every_request_its_segments_with_the_gpu_layers_device_waits():
    import os
    from types import SimpleNamespace

    from sitsprobe import config
    from sitsprobe.agent import Agent

    agent = Agent(config.load(overrides={"select.pids": [os.getpid()]}))
    asked = []
    agent.gpu = SimpleNamespace(device_waits=lambda pid, s, e: asked.append((pid, s, e)) or [(s + 50 * MS, e)])
    r = agent._understood(req(last_in_ns=10 * MS))
    assert asked == [(1, 0, 100 * MS)]
    assert named(r.segments) == {"network": 10, "scheduling": 0, "compute": 40, "io": 50, "cache": 0}


def test_the_serving_threads_other_reads_are_io_taken_from_compute():
    r = req(last_in_ns=10 * MS, read_wait_ns=30 * MS, runq_ns=5 * MS)
    assert named(segments(r, RULES)) == {"network": 10, "scheduling": 5, "compute": 55, "io": 30, "cache": 0}
    capped = named(segments(req(last_in_ns=90 * MS, read_wait_ns=500 * MS), RULES))
    assert capped["io"] == 10 and capped["compute"] == 0


def test_reads_of_a_redis_reply_are_cache_and_the_other_reads_io():
    r = req(last_in_ns=10 * MS, read_wait_ns=50 * MS, cache_wait_ns=20 * MS)
    assert named(segments(r, RULES)) == {"network": 10, "scheduling": 0, "compute": 40, "io": 30, "cache": 20}
