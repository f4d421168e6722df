"""The agent's wall clock follows a stepped system clock, and only a step."""
import time

from sitsprobe import clock
from sitsprobe.clock import WallClock


def test_a_step_of_the_wall_clock_moves_later_timestamps_with_it(monkeypatch):
    c = WallClock()
    before = c.to_wall_ns(10**12)
    real = time.time_ns
    monkeypatch.setattr(clock.time, "time_ns", lambda: real() + 250_000_000)  # NTP steps 250 ms ahead
    step = c.follow()
    assert abs(step - 250_000_000) < 1_000_000
    assert c.to_wall_ns(10**12) - before == step
    assert c.follow() == 0  # stepped once, followed once


def test_read_jitter_is_not_a_step(monkeypatch):
    c = WallClock()
    offset = c.offset_ns
    real = time.time_ns
    monkeypatch.setattr(clock.time, "time_ns", lambda: real() + 200_000)  # 0.2 ms: under STEP_NS
    assert c.follow() == 0
    assert c.offset_ns == offset
