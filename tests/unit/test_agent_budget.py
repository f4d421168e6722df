"""What the agent charges to the trace budget: an exchange the kernel counted
and sent only for a trace (CF_BINNED) costs tracing its stitching as well as
its export; any other exchange is the metrics' and costs tracing only its
export. The stitcher and the exporter are the agent's own, made slow by a
known amount of CPU (their real work is too quick to tell apart from noise);
the rest of the path is the agent's code. The agent reads its CPU clock for
one exchange in CPU_READ_EVERY and charges it that many times over."""
from __future__ import annotations

import os
import time

import pytest

from sitsprobe import config
from sitsprobe.agent import Agent
from sitsprobe.events import CF_BINNED, CF_TCP, CF_TUPLE
from sitsprobe.sampling import CPU_READ_EVERY
from tests.unit.test_stitch import exchange

STITCH_S, EXPORT_S = 0.006, 0.004


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class SlowExporter:
    def __init__(self):
        self.traces = 0

    def export_trace(self, t, enrich) -> None:
        burn(EXPORT_S)
        self.traces += 1


@pytest.fixture
def agent():
    a = Agent(config.load(overrides={"select.pids": [os.getpid()], "traces.cpu_budget": 0.05,
                                     "stitch.join_wait_ms": 0}))
    a.exporter = SlowExporter()
    on_exchange = a.stitcher.on_exchange

    def slow(ex):
        burn(STITCH_S)
        return on_exchange(ex)
    a.stitcher.on_exchange = slow
    return a


def charged(agent: Agent, flags: int) -> float:
    """The CPU charged, per exchange, over as many exchanges as the agent's
    meter takes to read the clock for one (sampling.CpuMeter)."""
    before = agent.sampler.cpu_seconds
    for _ in range(CPU_READ_EVERY):
        agent._on_exchange(exchange(flags=flags, start_ns=time.monotonic_ns()))
        agent._send(agent.joiner.expire(time.monotonic_ns(), everything=True), time.monotonic_ns())
    assert agent.exporter.traces == CPU_READ_EVERY  # exported at once: under budget
    return (agent.sampler.cpu_seconds - before) / CPU_READ_EVERY


def test_an_exchange_sent_for_a_trace_charges_its_stitching_and_its_export_once(agent):
    spent = charged(agent, CF_TUPLE | CF_TCP | CF_BINNED)
    assert STITCH_S + EXPORT_S <= spent < STITCH_S + EXPORT_S + 0.003, spent  # the export not twice


def test_an_exchange_the_metrics_need_charges_only_its_export(agent):
    spent = charged(agent, CF_TUPLE | CF_TCP)
    assert EXPORT_S <= spent < EXPORT_S + 0.003, spent
