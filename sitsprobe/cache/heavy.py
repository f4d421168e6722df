"""Top-K counting in bounded memory: Space-Saving (Metwally et al., 2005).

At most ``capacity`` items are monitored. A new item, when the table is full,
takes the place of one with the smallest count and inherits that count as
its ranking estimate (so a heavy item is never missed: any item seen more
than N/capacity times of N is monitored). Hits and misses are kept exactly
from the moment an item entered the table; what an evicted item had is
folded into OTHER. So:

- the sum over all items plus OTHER is exact, always;
- an item's own counts are exact if it was never evicted, else they are the
  counts since it last entered (a lower bound), and the rest of it sits in
  OTHER: **folded counts are approximate in their attribution, never in
  their total**.

Memory: O(capacity), whatever the number of distinct items (about 300 bytes
per monitored item plus the item itself). Every operation is O(1): items are
kept in buckets by count (the "stream summary"), and the smallest count is
tracked as it moves.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import NamedTuple

OTHER = "other"


class Entry(NamedTuple):
    item: Hashable
    hits: int
    misses: int
    estimate: int  # Space-Saving count: >= the item's true count
    error: int  # estimate - error <= true count (the count it inherited)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses


class HeavyHitters:
    __slots__ = ("capacity", "_items", "_by_count", "_min", "other_hits", "other_misses")

    def __init__(self, capacity: int = 100):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._items: dict = {}  # item -> [count, error, hits, misses]
        self._by_count: dict[int, dict] = {}  # count -> {item: None}, insertion-ordered
        self._min = 0
        self.other_hits = 0
        self.other_misses = 0

    def add(self, item: Hashable, hit: bool) -> None:
        by_count = self._by_count
        e = self._items.get(item)
        if e is not None:
            c = e[0]
            bucket = by_count[c]
            if len(bucket) == 1:
                del by_count[c]
                if c == self._min:
                    self._min = c + 1
            else:
                del bucket[item]
        elif len(self._items) < self.capacity:
            c = 0
            e = self._items[item] = [0, 0, 0, 0]
            self._min = 1
        else:  # evict an item with the smallest count; the newcomer inherits it
            c = self._min
            bucket = by_count[c]
            victim = bucket.popitem()[0]  # any of them will do; the newest is cheapest
            if not bucket:
                del by_count[c]
                self._min = c + 1
            e = self._items.pop(victim)
            if e[2]:
                self.other_hits += e[2]
            if e[3]:
                self.other_misses += e[3]
            e[1], e[2], e[3] = c, 0, 0  # the victim's list, reused
            self._items[item] = e
        c += 1
        e[0] = c
        e[3 - bool(hit)] += 1  # hits at [2], misses at [3]
        bucket = by_count.get(c)
        if bucket is None:
            by_count[c] = {item: None}
        else:
            bucket[item] = None

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._items

    def get(self, item: Hashable) -> Entry | None:
        e = self._items.get(item)
        return None if e is None else Entry(item, e[2], e[3], e[0], e[1])

    def entries(self) -> Iterator[Entry]:
        for item, (count, error, hits, misses) in self._items.items():
            yield Entry(item, hits, misses, count, error)

    def top(self, n: int | None = None) -> list[Entry]:
        """Monitored items, largest estimate first (ties: more look-ups, then item)."""
        ranked = sorted(self.entries(), key=lambda e: (-e.estimate, -e.lookups, str(e.item)))
        return ranked if n is None else ranked[:n]

    @property
    def total_hits(self) -> int:
        return self.other_hits + sum(e[2] for e in self._items.values())

    @property
    def total_misses(self) -> int:
        return self.other_misses + sum(e[3] for e in self._items.values())
