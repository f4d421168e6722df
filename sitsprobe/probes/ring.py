"""Ring buffer drains, and the one wait for all of them.

libbpf's consume loops until the ring is empty: a producer as fast as the
agent (a benchmark hammering a traced cache) would keep it there forever and
the agent would never get back to its loop, not even to stop. A callback that
returns -1 ends the drain after the current record; the rest waits for the
next tick (and a full ring is counted in the kernel, never silent).

The agent drains its rings on its own tick. The kernel wakes it sooner only
when a ring could fill before then (bpf/ring_wake.h): once per
:func:`wake_bytes` that one CPU writes. A wakeup per event would cost the
traced process microseconds per call, and an agent woken every few
milliseconds runs its Python cold each time: on the reference engine at
100 req/s, waking at the tick instead of every 50 ms took its CPU from
8.0-9.2 % of a core to 7.0-7.4 (bench/README.md).
"""
from __future__ import annotations

import os
import select
from collections.abc import Iterable


def wake_bytes(ring_bytes: int, cpus: int | None = None) -> int:
    """The bytes one CPU writes to a ring of ``ring_bytes`` between two
    wakeups of its reader (RING_WAKE_BYTES and the like): a power of two, such
    that with every CPU just short of its next wakeup at most a quarter of
    the ring is in use."""
    share = ring_bytes // (4 * (cpus or os.cpu_count() or 1))
    return 1 << max(3, share.bit_length() - 1)  # at least a record's 8-byte header


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


class RingReader:
    """A probe's side of its rings: the agent waits on :meth:`ring_fds` (a
    :class:`RingWait`) and drains them with :meth:`consume`; :meth:`poll`
    does both, for tools and tests. A probe sets ``_bpf`` (its bcc BPF),
    ``_budget`` (a :class:`DrainBudget` its callbacks take from) and
    ``RINGS``, the names of the ring maps it opened."""

    RINGS: tuple[str, ...] = ()

    def ring_fds(self) -> list[int]:
        return [self._bpf[name].map_fd for name in self.RINGS]

    def poll(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms for a ring's wakeup (bpf/ring_wake.h), then drain."""
        self._budget.refill()
        self._bpf.ring_buffer_poll(timeout_ms)
        self.consume()

    def consume(self) -> None:
        """Hand on what the rings hold now (a bounded batch), without waiting."""
        self._budget.refill()
        self._bpf.ring_buffer_consume()

    def drained(self) -> bool:
        """Whether the last drain emptied every ring (its budget did not end it)."""
        return self._budget.left > 0


class RingWait:
    """One wait for several rings (their map fds): it ends at the timeout, or
    when the kernel wakes a reader of one of them. Edge-triggered: events
    submitted without a wakeup never end it, even when they are what is in
    a ring (level-triggered, as libbpf's own poll is, a ring with anything in
    it ends every wait at once after the first)."""

    def __init__(self, fds: Iterable[int] = ()):
        self._epoll = select.epoll()
        self._fds: set[int] = set()
        self.add(fds)

    def add(self, fds: Iterable[int]) -> None:
        for fd in fds:
            if fd not in self._fds:
                self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)
                self._fds.add(fd)

    def wait(self, timeout_s: float) -> bool:
        """Whether a ring's wakeup ended the wait (else the timeout did)."""
        return bool(self._epoll.poll(max(0.0, timeout_s)))

    def close(self) -> None:
        self._epoll.close()
