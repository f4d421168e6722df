"""Agent._find_engines: which traced processes get their requests held for
engine markers. The probe is replaced at its boundary (attach); the rest is
the agent's own code."""
from __future__ import annotations

import logging
import os

import pytest

from sitsprobe import config
from sitsprobe.agent import Agent
from sitsprobe.errors import ProbeAttachError
from sitsprobe.probes import markers

LIB = "/opt/engine/libsitsprobe_markers.so"


class Probe:
    def __init__(self, fail: bool):
        self.fail, self.calls = fail, []

    def attach(self, path: str) -> bool:
        self.calls.append(path)
        if self.fail:
            raise ProbeAttachError("markers", f"{path}:sitsprobe_range_begin", "EINVAL")
        return len(self.calls) == 1


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
