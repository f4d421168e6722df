"""Cache look-ups aggregated for metrics and heatmaps, in bounded memory.

Per cache, three Space-Saving tables (sitsprobe.cache.heavy):

- key prefix -> hits, misses (``top_k`` prefixes, the rest in "other"):
  ``sitsprobe_cache_lookups_total{cache,prefix,result}``;
- key prefix x time bucket (``bucket_s`` seconds, the last ``history``
  buckets, ``top_k`` prefixes each): look-ups per second and miss ratio;
- key prefix x client subnet (``pair_capacity`` pairs):
  ``sitsprobe_cache_client_lookups_total{cache,prefix,subnet,result}``.

Totals are exact; which prefix a count belongs to is approximate only for
counts folded into "other" (see heavy.py). With the defaults, memory stays
under MEMORY_BOUND_BYTES per cache whatever the number of distinct keys.

Look-up latency comes from the kernel's log2 histogram, read at scrape time
through ``kernel`` (a callable returning {cache: KernelCacheCounts}), with the
kernel's exact hit/miss/loss counts.
"""
from __future__ import annotations

import ipaddress
import math
import threading
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from ..request import Endpoint
from .heavy import OTHER, HeavyHitters
from .lookup import UNIX_PEER, KernelCacheCounts, KeyLookup
from .prefix import PrefixExtractor

UNKNOWN_CLIENT = "unknown"
MEMORY_BOUND_BYTES = 8 << 20  # per cache, defaults (top_k=100, history=60, pairs=1000)
# histogram bounds exported: 2^s ns for s in this range (slots outside fold in)
_LAT_FIRST, _LAT_LAST = 8, 35  # 256 ns .. ~34 s


def subnet_of(peer: Endpoint | None, v4_bits: int = 24, v6_bits: int = 64) -> str:
    """The client's network: 10.1.2.0/24 for 10.1.2.3 (IPv4-mapped IPv6 as IPv4)."""
    if peer is None:
        return UNKNOWN_CLIENT
    if peer.address == UNIX_PEER:
        return UNIX_PEER
    try:
        ip = ipaddress.ip_address(peer.address)
    except ValueError:
        return UNKNOWN_CLIENT
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = v4_bits if ip.version == 4 else v6_bits
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


class _Cache:
    __slots__ = ("prefixes", "pairs", "buckets", "newest", "current", "current_start", "current_end")

    def __init__(self, top_k: int, pair_capacity: int):
        self.prefixes = HeavyHitters(top_k)
        self.pairs = HeavyHitters(pair_capacity)  # (prefix, subnet)
        self.buckets: OrderedDict[int, HeavyHitters] = OrderedDict()  # bucket index -> table
        self.newest = -1  # index of the newest bucket, whose table is `current`
        self.current: HeavyHitters | None = None
        self.current_start = self.current_end = -1  # its time range, ns

    def bucket(self, idx: int, top_k: int, history: int, bucket_ns: int) -> HeavyHitters | None:
        """The table of bucket idx, opened if need be; None if older than the history."""
        if idx <= self.newest - history:
            return None
        table = self.buckets.get(idx)
        if table is None:
            table = self.buckets[idx] = HeavyHitters(top_k)
            if idx < self.newest:  # a late event opened a past bucket
                self.buckets = OrderedDict(sorted(self.buckets.items()))
            else:
                self.newest, self.current = idx, table
                self.current_start, self.current_end = idx * bucket_ns, (idx + 1) * bucket_ns
            while next(iter(self.buckets)) <= self.newest - history:
                self.buckets.popitem(last=False)
        return table


class CacheStats:
    """A Prometheus Collector over plain tables; ``observe`` is a few dict operations."""

    def __init__(self, prefixes: PrefixExtractor | None = None, *, top_k: int = 100,
                 bucket_s: float = 10.0, history: int = 60, pair_capacity: int = 1000,
                 subnet_v4: int = 24, subnet_v6: int = 64,
                 kernel: Callable[[], dict[str, KernelCacheCounts]] | None = None):
        if bucket_s <= 0 or history < 1:
            raise ValueError("bucket_s must be > 0 and history >= 1")
        self.extract = prefixes or PrefixExtractor()
        self.top_k, self.history, self.pair_capacity = top_k, history, pair_capacity
        self.bucket_ns = int(bucket_s * 1e9)
        self.subnet_v4, self.subnet_v6 = subnet_v4, subnet_v6
        self.kernel = kernel
        self._lock = threading.Lock()
        self._subnets: dict[str | None, str] = {}  # address -> subnet (ipaddress is slow)
        self._caches: dict[str, _Cache] = {}
        self.last_ts_ns = 0

    @property
    def bucket_s(self) -> float:
        return self.bucket_ns / 1e9

    # -- input ----------------------------------------------------------------

    def observe(self, e: KeyLookup) -> None:
        """A look-up from the probe."""
        self.add(e.cache, e.key, e.hit, e.ts_ns, e.peer, e.truncated)

    def add(self, cache: str, key: bytes | str, hit: bool, ts_ns: int,
            peer: Endpoint | None = None, truncated: bool = False) -> None:
        """A look-up from anywhere (the probe, RESP bytes, an engine's marker)."""
        prefix = self.extract(key, truncated)
        address = None if peer is None else peer.address
        subnet = self._subnets.get(address)
        if subnet is None:
            if len(self._subnets) >= 4096:
                self._subnets.clear()
            subnet = self._subnets[address] = subnet_of(peer, self.subnet_v4, self.subnet_v6)
        with self._lock:
            c = self._caches.get(cache)
            if c is None:
                c = self._caches[cache] = _Cache(self.top_k, self.pair_capacity)
            c.prefixes.add(prefix, hit)
            c.pairs.add((prefix, subnet), hit)
            if c.current_start <= ts_ns < c.current_end:  # the common case, no arithmetic
                table = c.current
            else:
                table = c.bucket(ts_ns // self.bucket_ns, self.top_k, self.history, self.bucket_ns)
            if table is not None:
                table.add(prefix, hit)
            if ts_ns > self.last_ts_ns:
                self.last_ts_ns = ts_ns

    # -- reading ----------------------------------------------------------------

    def caches(self) -> list[str]:
        with self._lock:
            return sorted(self._caches)

    def prefix_counts(self, cache: str) -> dict[str, tuple[int, int]]:
        """prefix -> (hits, misses), with OTHER for what was folded."""
        with self._lock:
            c = self._caches.get(cache)
            if c is None:
                return {}
            out = {str(e.item): (e.hits, e.misses) for e in c.prefixes.entries()}
            if c.prefixes.other_hits or c.prefixes.other_misses:
                out[OTHER] = (c.prefixes.other_hits, c.prefixes.other_misses)
            return out

    def top_prefixes(self, cache: str, n: int | None = None) -> list[str]:
        with self._lock:
            c = self._caches.get(cache)
            return [] if c is None else [str(e.item) for e in c.prefixes.top(n)]

    def subnet_counts(self, cache: str) -> dict[tuple[str, str], tuple[int, int]]:
        """(prefix, subnet) -> (hits, misses), with (OTHER, OTHER) for what was folded."""
        with self._lock:
            c = self._caches.get(cache)
            if c is None:
                return {}
            out = {e.item: (e.hits, e.misses) for e in c.pairs.entries()}
            if c.pairs.other_hits or c.pairs.other_misses:
                out[(OTHER, OTHER)] = (c.pairs.other_hits, c.pairs.other_misses)
            return out

    def timeline(self, cache: str) -> list[tuple[int, dict[str, tuple[int, int]]]]:
        """[(bucket start ns, {prefix: (hits, misses)})], oldest first; OTHER as above."""
        with self._lock:
            c = self._caches.get(cache)
            if c is None:
                return []
            out = []
            for idx, table in c.buckets.items():
                cells = {str(e.item): (e.hits, e.misses) for e in table.entries()}
                if table.other_hits or table.other_misses:
                    cells[OTHER] = (table.other_hits, table.other_misses)
                out.append((idx * self.bucket_ns, cells))
            return out

    # -- Prometheus -------------------------------------------------------------

    def collect(self):
        lookups = CounterMetricFamily(
            "sitsprobe_cache_lookups",
            "Cache look-ups by key prefix and result (top prefixes; the rest under prefix=\"other\")",
            labels=("cache", "prefix", "result"))
        clients = CounterMetricFamily(
            "sitsprobe_cache_client_lookups",
            "Cache look-ups by key prefix, client subnet and result (bounded; the rest under \"other\")",
            labels=("cache", "prefix", "subnet", "result"))
        for cache in self.caches():
            for prefix, (hits, misses) in sorted(self.prefix_counts(cache).items()):
                lookups.add_metric([cache, prefix, "hit"], hits)
                lookups.add_metric([cache, prefix, "miss"], misses)
            for (prefix, subnet), (hits, misses) in sorted(self.subnet_counts(cache).items()):
                clients.add_metric([cache, prefix, subnet, "hit"], hits)
                clients.add_metric([cache, prefix, subnet, "miss"], misses)
        yield lookups
        yield clients
        if self.kernel is None:
            return
        counts = self.kernel()
        duration = HistogramMetricFamily(
            "sitsprobe_cache_lookup_duration_seconds",
            "Cache look-up latency, entry to return, measured in the kernel (log2 buckets)",
            labels=("cache",))
        exact = CounterMetricFamily(
            "sitsprobe_cache_kernel_lookups",
            "Cache look-ups counted in the kernel (exact even when events are lost)",
            labels=("cache", "result"))
        lost = CounterMetricFamily(
            "sitsprobe_cache_events_lost", "Cache look-up events the kernel could not deliver",
            labels=("cache", "reason"))
        for cache, k in sorted(counts.items()):
            duration.add_metric([cache], latency_buckets(k.latency), k.duration_ns / 1e9)
            exact.add_metric([cache, "hit"], k.hits)
            exact.add_metric([cache, "miss"], k.misses)
            exact.add_metric([cache, "filtered"], k.filtered)
            lost.add_metric([cache, "ring_buffer_full"], k.lost)
            lost.add_metric([cache, "inflight_table_full"], k.inflight_lost)
        yield from (duration, exact, lost)


def latency_buckets(slots: tuple[int, ...] | list[int]) -> list[tuple[str, int]]:
    """Cumulative Prometheus buckets from bpf_log2l slots (slot s: [2^(s-1), 2^s) ns).

    Bound 2^s ns counts every slot <= s: exact but for a look-up of exactly
    2^s ns, which lands one bucket up."""
    acc, out = 0, []
    for s, n in enumerate(slots):
        acc += n if s <= _LAT_LAST else 0
        if _LAT_FIRST <= s <= _LAT_LAST:
            out.append((repr(math.ldexp(1, s) / 1e9), acc))
    if not out:
        out = [(repr(math.ldexp(1, s) / 1e9), 0) for s in range(_LAT_FIRST, _LAT_LAST + 1)]
    out.append(("+Inf", sum(slots)))
    return out
