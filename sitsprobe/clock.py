"""The agent's one clock: CLOCK_MONOTONIC ns inside, wall-clock only at export."""
from __future__ import annotations

import time


class WallClock:
    """Converts monotonic nanoseconds to Unix-epoch nanoseconds.

    The offset is measured once at start (a bracketed read keeps its error
    under a microsecond) so that every exported timestamp shifts by the same
    amount and durations are preserved exactly.
    """

    def __init__(self) -> None:
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        self.offset_ns = w - (m0 + m1) // 2

    def to_wall_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns
