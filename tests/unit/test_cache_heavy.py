"""Space-Saving top-K: exact totals, the heavy items kept, memory bounded."""
import random
import tracemalloc
from collections import Counter

import pytest

from sitsprobe.cache.heavy import HeavyHitters
from sitsprobe.cache.stats import MEMORY_BOUND_BYTES, CacheStats
from sitsprobe.request import Endpoint


def test_exact_below_capacity():
    h = HeavyHitters(10)
    truth = Counter()
    for i in range(500):
        item, hit = f"p{i % 7}", i % 3 == 0
        h.add(item, hit)
        truth[(item, hit)] += 1
    assert len(h) == 7 and h.other_hits == h.other_misses == 0
    for e in h.entries():
        assert (e.hits, e.misses) == (truth[(e.item, True)], truth[(e.item, False)])
        assert e.error == 0 and e.estimate == e.lookups


def test_folding_keeps_totals_exact_and_bounds_each_item():
    rng = random.Random(7)
    h = HeavyHitters(20)
    truth = Counter()
    hits = misses = 0
    for _ in range(20000):
        item = f"p{int(rng.paretovariate(1.1))}"
        hit = rng.random() < 0.7
        h.add(item, hit)
        truth[item] += 1
        hits += hit
        misses += not hit
    assert len(h) == 20
    assert (h.total_hits, h.total_misses) == (hits, misses)
    assert sum(e.estimate for e in h.entries()) == 20000  # Space-Saving: counts sum to N
    for e in h.entries():
        assert e.lookups <= truth[e.item] <= e.estimate  # own counts since entry <= true <= estimate
        assert e.estimate - e.error <= truth[e.item]
    # every item seen more than N/capacity times is monitored, and ranks first
    heavy = {item for item, n in truth.items() if n > 20000 / 20}
    assert heavy and heavy <= {e.item for e in h.entries()}
    assert {e.item for e in h.top(len(heavy))} == heavy


def test_min_tracking_matches_a_brute_force_space_saving():
    rng = random.Random(3)
    h = HeavyHitters(8)
    for _ in range(5000):
        h.add(rng.randrange(40), rng.random() < 0.5)
        counts = [e.estimate for e in h.entries()]
        assert h._min == min(counts)
        assert sorted(counts) == sorted(c for c, b in h._by_count.items() for _ in b)


def test_capacity_one_and_bad_capacity():
    h = HeavyHitters(1)
    for item in "aab":
        h.add(item, True)
    assert [e.item for e in h.top()] == ["b"] and h.get("b").estimate == 3
    assert h.other_hits == 2 and h.total_hits == 3
    with pytest.raises(ValueError):
        HeavyHitters(0)


def test_one_million_distinct_keys_stay_within_the_memory_bound():
    """The stated bound (MEMORY_BOUND_BYTES, 8 MiB per cache) holds for the whole
    aggregation with 1,000,000 distinct keys, each with its own prefix (the worst
    case), spread over 512 client subnets and every time bucket of the history."""
    n = 1_000_000
    stats = CacheStats(bucket_s=1.0)  # 60 one-second buckets: the history fills and rolls
    peers = [Endpoint(f"10.{i % 256}.{i // 256}.1", 40000) for i in range(512)] * (n // 512 + 1)
    # the workload exists before tracing starts: only the aggregation is measured
    keys = [b"p%d:k" % i for i in range(n)]
    hits = [i % 3 == 0 for i in range(n)]
    stamps = list(range(0, n * 100_000, 100_000))  # 10,000 look-ups a second
    add = stats.add
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for key, hit, ts, peer in zip(keys, hits, stamps, peers):
            add("redis", key, hit, ts, peer)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND_BYTES, f"peak {peak / 2**20:.1f} MiB"
    counts = stats.prefix_counts("redis")
    assert len(counts) == 101  # top 100 + other
    assert sum(h + m for h, m in counts.values()) == 1_000_000  # totals stay exact
    assert sum(h for h, _ in counts.values()) == 333_334
    assert len(stats.timeline("redis")) == 60
