"""The agent's one clock: CLOCK_MONOTONIC ns inside, wall-clock only at export."""
from __future__ import annotations

import time

STEP_NS = 1_000_000  # a wall clock that moved more than this against the monotonic one was stepped


def _measure() -> tuple[int, int]:
    """(wall - monotonic, the read's bracket) from the tightest of three bracketed reads."""
    best = None
    for _ in range(3):
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[1]:
            best = (w - (m0 + m1) // 2, m1 - m0)
    return best


class WallClock:
    """Converts monotonic nanoseconds to Unix-epoch nanoseconds.

    The offset is measured at start (a bracketed read keeps its error under a
    microsecond) and again by `follow()`, which the agent calls every second:
    when the wall clock is stepped (NTP, a VM resynchronised after a pause),
    timestamps exported from then on move with it, as an in-process SDK's
    would. A span's start and end are converted together, so its duration
    stays exact.
    """

    def __init__(self) -> None:
        self.offset_ns = _measure()[0]

    def to_wall_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns

    def follow(self) -> int:
        """Measure again and take the new offset if the wall clock was
        stepped; the step in ns, 0 when there was none."""
        offset, bracket = _measure()
        step = offset - self.offset_ns
        if abs(step) <= STEP_NS + bracket:  # read jitter, not a step
            return 0
        self.offset_ns = offset
        return step
