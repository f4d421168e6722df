"""Plain records of cache look-ups, shared by the probe and the aggregation.

Timestamps are CLOCK_MONOTONIC nanoseconds (see sitsprobe.clock). A raw key
lives only inside the agent: sinks see it through a PrefixExtractor.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..request import Endpoint

UNIX_PEER = "unix"  # Endpoint.address of a client on a Unix socket


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """One call of a cache look-up function, seen by a uprobe (or derived
    from a protocol exchange, where duration, tgid and fd are 0 / -1)."""

    cache: str
    ts_ns: int  # entry
    hit: bool
    key: bytes  # the first bytes of the key (at most the probe's key_bytes)
    truncated: bool = False  # the key goes on past `key`
    duration_ns: int = 0
    tgid: int = 0
    tid: int = 0
    fd: int = -1  # the client socket the thread last read; -1 unknown
    peer: Endpoint | None = None  # that client's address; None unknown


@dataclass(frozen=True, slots=True)
class KernelCacheCounts:
    """What the kernel counted for one cache: exact even when events are lost."""

    hits: int = 0
    misses: int = 0
    filtered: int = 0  # calls the spec's filter left out (Redis: write look-ups)
    lost: int = 0  # events the ring buffer had no room for
    inflight_lost: int = 0  # calls not timed: in-flight table full
    duration_ns: int = 0  # sum of look-up durations
    latency: tuple[int, ...] = ()  # latency[s]: look-ups in [2^(s-1), 2^s) ns (s=0: none)
