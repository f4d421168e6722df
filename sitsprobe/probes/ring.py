"""Bounded ring buffer drains.

libbpf's consume loops until the ring is empty: a producer as fast as the
agent (a benchmark hammering a traced cache) would keep it there forever and
the agent would never get back to its loop, not even to stop. A callback that
returns -1 ends the drain after the current record; the rest waits for the
next tick (and a full ring is counted in the kernel, never silent).
"""
from __future__ import annotations


class DrainBudget:
    def __init__(self, per_drain: int = 20_000):
        self.per_drain = per_drain
        self.left = per_drain

    def refill(self) -> None:
        self.left = self.per_drain

    def take(self) -> int:
        """What a ring callback returns: 0 to go on, -1 to end this drain."""
        self.left -= 1
        return 0 if self.left > 0 else -1
