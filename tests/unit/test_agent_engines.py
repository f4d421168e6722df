"""Agent._find_engines: which traced processes get their requests held for
engine markers. The probe is replaced at its boundary (attach); the rest is
the agent's own code."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from sitsprobe import config
from sitsprobe.agent import Agent
from sitsprobe.errors import ProbeAttachError
from sitsprobe.probes import markers, retry

LIB = "/opt/engine/libsitsprobe_markers.so"


class Probe:
    def __init__(self, fail: bool, refusals: int = 0):
        self.fail, self.refusals, self.calls = fail, refusals, []

    def attach(self, path: str) -> bool:
        self.calls.append(path)
        if self.fail:
            raise ProbeAttachError("markers", f"{path}:sitsprobe_range_begin", "EINVAL")
        if len(self.calls) <= self.refusals:  # as _marker_probe says a compile the kernel refused
            raise ProbeAttachError("markers", "bpf/markers.c", "Failed to load BPF program b'range_end': "
                                   + os.strerror(errno.EAGAIN))
        return len(self.calls) == self.refusals + 1


@pytest.fixture
def agent(monkeypatch):
    a = Agent(config.load(overrides={"select.pids": [os.getpid()]}))
    a.tracked = {101: "engine", 202: "nginx"}
    scans = []

    def find(pids):
        scans.extend(pids)
        return {LIB} if pids == [101] else set()

    monkeypatch.setattr(markers, "find_marker_libraries", find)
    a.scans = scans
    return a


def test_an_engine_is_probed_once_and_its_requests_wait_for_markers(agent):
    agent.markers = Probe(fail=False)
    agent._find_engines()
    agent._find_engines()
    assert agent.engine.instrumented == {101}
    assert agent.markers.calls == [LIB]
    assert agent.scans == [101, 202, 202]  # the engine's maps are not read again


def test_a_library_that_cannot_be_probed_is_said_once_and_does_not_hold_requests(agent, caplog):
    agent.markers = Probe(fail=True)
    with caplog.at_level(logging.WARNING):
        agent._find_engines()  # raised out of the agent's loop before: the agent stopped
        agent._find_engines()
    assert agent.engine.instrumented == set()  # its requests are emitted without waiting
    assert agent.markers.calls == [LIB]
    (record,) = [r for r in caplog.records if "markers" in r.getMessage()]
    assert "engine[101] is traced without its engine stages" in record.getMessage()
    assert "EINVAL" in record.getMessage()


def test_a_probe_the_kernel_refused_for_the_moment_is_tried_again_when_its_wait_is_over(agent, caplog,
                                                                                          monkeypatch):
    """EAGAIN (a signal while the verifier ran) must not cost an engine its
    stages for its whole life: the next rescan after the wait probes it again."""
    monkeypatch.setattr(retry, "FIRST_S", 0.0)  # the wait over at the next rescan
    agent.markers = Probe(fail=False, refusals=1)
    with caplog.at_level(logging.WARNING):
        agent._find_engines()
        assert agent.engine.instrumented == set()
        agent._find_engines()
    assert agent.engine.instrumented == {101} and agent.markers.calls == [LIB, LIB]
    (record,) = [r for r in caplog.records if "markers" in r.getMessage()]
    assert record.getMessage().endswith("engine[101] is traced without its engine stages until it is "
                                        "tried again, in 0 s")
    assert 101 not in agent._unprobed


def test_a_refused_probe_waits_before_it_is_tried_again(agent):
    agent.markers = Probe(fail=False, refusals=1)
    agent._find_engines()
    agent._find_engines()  # within the first wait (30 s)
    assert agent.markers.calls == [LIB] and agent.engine.instrumented == set()
