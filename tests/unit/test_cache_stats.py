"""CacheStats: counters by prefix, time bucket and client subnet; Prometheus
output; heatmap matrices, PNG and text that show exactly those counters."""
import hashlib
import math
import struct
import zlib

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sitsprobe.cache import (CacheStats, KernelCacheCounts, KeyLookup, PrefixExtractor,
                             heatmap_data, render_png, render_text, subnet_of)
from sitsprobe.cache.heavy import OTHER
from sitsprobe.cache.render import TEXT_WIDTH, figure
from sitsprobe.cache.stats import UNKNOWN_CLIENT, latency_buckets
from sitsprobe.request import Endpoint

S = 1_000_000_000
A, B, C6 = Endpoint("10.1.2.3", 5000), Endpoint("10.1.3.9", 5001), Endpoint("fd00:1:2:3::7", 5002)


def workload(stats: CacheStats, t0: int = 1000 * S):
    """Three 10 s buckets; user (A), session (B), cfg (IPv6); known hits and misses."""
    plan = [  # (bucket, key, peer, hit, times)
        (0, b"user:1", A, True, 30), (0, b"user:2", A, False, 10), (0, b"session:9", B, False, 5),
        (1, b"user:3", A, True, 20), (1, b"cfg:x", C6, True, 7), (1, b"session:9", B, True, 5),
        (2, b"user:1", B, False, 4), (2, b"nodelim", None, False, 3),
    ]
    for bucket, key, peer, hit, times in plan:
        for i in range(times):
            stats.observe(KeyLookup("redis", t0 + bucket * 10 * S + i * 1000, hit, key, peer=peer))
    return plan


def test_subnets():
    assert subnet_of(A) == "10.1.2.0/24" and subnet_of(A, v4_bits=16) == "10.1.0.0/16"
    assert subnet_of(C6) == "fd00:1:2:3::/64" and subnet_of(C6, v6_bits=48) == "fd00:1:2::/48"
    assert subnet_of(Endpoint("::ffff:192.168.7.9", 1)) == "192.168.7.0/24"
    assert subnet_of(Endpoint("unix", 0)) == "unix"
    assert subnet_of(None) == subnet_of(Endpoint("garbage", 1)) == UNKNOWN_CLIENT


def test_counts_by_prefix_subnet_and_bucket():
    s = CacheStats()
    workload(s)
    assert s.prefix_counts("redis") == {"user": (50, 14), "session": (5, 5), "cfg": (7, 0),
                                        "(no prefix)": (0, 3)}
    assert s.subnet_counts("redis") == {
        ("user", "10.1.2.0/24"): (50, 10), ("user", "10.1.3.0/24"): (0, 4),
        ("session", "10.1.3.0/24"): (5, 5), ("cfg", "fd00:1:2:3::/64"): (7, 0),
        ("(no prefix)", "unknown"): (0, 3)}
    tl = s.timeline("redis")
    assert [start for start, _ in tl] == [1000 * S, 1010 * S, 1020 * S]
    assert tl[0][1] == {"user": (30, 10), "session": (0, 5)}
    assert tl[2][1] == {"user": (0, 4), "(no prefix)": (0, 3)}
    assert s.top_prefixes("redis")[0] == "user"


def test_history_is_bounded_and_late_events_fit():
    s = CacheStats(bucket_s=1.0, history=5)
    for sec in range(20):
        s.add("c", b"a:1", True, sec * S)
    assert [t // S for t, _ in s.timeline("c")] == [15, 16, 17, 18, 19]
    s.add("c", b"a:1", False, 3 * S)  # older than the history: counters only
    s.add("c", b"a:1", False, 17 * S + 5)  # late, but inside
    assert s.timeline("c")[2][1] == {"a": (1, 1)}
    assert s.prefix_counts("c") == {"a": (20, 2)}
    s.add("c", b"a:1", True, 100 * S)  # a jump ahead drops what fell out of the window
    assert [t // S for t, _ in s.timeline("c")] == [100]


def test_folding_into_other_keeps_every_total():
    s = CacheStats(top_k=3, pair_capacity=4)
    for i in range(200):
        s.add("c", b"p%d:x" % (i % 10), i % 2 == 0, i * S // 100, Endpoint(f"10.0.{i % 7}.1", 1))
    counts = s.prefix_counts("c")
    assert len(counts) == 4 and OTHER in counts
    assert sum(h for h, _ in counts.values()) == 100 and sum(m for _, m in counts.values()) == 100
    pairs = s.subnet_counts("c")
    assert len(pairs) == 5 and (OTHER, OTHER) in pairs
    assert sum(h + m for h, m in pairs.values()) == 200
    cells = s.timeline("c")[0][1]
    assert sum(h + m for h, m in cells.values()) == 200


def test_raw_keys_do_not_leave():
    s = CacheStats()
    s.add("redis", b"user:secret-token-123", True, S, A)
    text = generate_latest(_registry(s)).decode() + render_text(s)
    assert "secret-token-123" not in text and 'prefix="user"' in text
    hashed = CacheStats(PrefixExtractor(hash_keys=True))
    hashed.add("redis", b"user:1", True, S)
    (label,) = hashed.prefix_counts("redis")
    assert label == hashlib.blake2b(b"user", digest_size=8).hexdigest()


def _registry(s):
    r = CollectorRegistry()
    r.register(s)
    return r


def test_prometheus_output():
    lat = [0] * 65
    lat[11], lat[12], lat[20] = 5, 3, 1  # [1024, 2048) ns x5, [2048, 4096) x3, ~0.5-1 ms x1
    kernel = KernelCacheCounts(hits=62, misses=22, filtered=9, lost=2, inflight_lost=0,
                               duration_ns=1_234_567, latency=tuple(lat))
    s = CacheStats(kernel=lambda: {"redis": kernel})
    workload(s)
    r = _registry(s)
    get = r.get_sample_value
    assert get("sitsprobe_cache_lookups_total", {"cache": "redis", "prefix": "user", "result": "hit"}) == 50
    assert get("sitsprobe_cache_lookups_total", {"cache": "redis", "prefix": "user", "result": "miss"}) == 14
    assert get("sitsprobe_cache_client_lookups_total",
               {"cache": "redis", "prefix": "session", "subnet": "10.1.3.0/24", "result": "miss"}) == 5
    h = {"cache": "redis"}
    assert get("sitsprobe_cache_lookup_duration_seconds_count", h) == 9
    assert get("sitsprobe_cache_lookup_duration_seconds_sum", h) == pytest.approx(0.001234567)
    assert get("sitsprobe_cache_lookup_duration_seconds_bucket", {**h, "le": "1.024e-06"}) == 0
    assert get("sitsprobe_cache_lookup_duration_seconds_bucket", {**h, "le": "2.048e-06"}) == 5
    assert get("sitsprobe_cache_lookup_duration_seconds_bucket", {**h, "le": "4.096e-06"}) == 8
    assert get("sitsprobe_cache_lookup_duration_seconds_bucket", {**h, "le": "0.001048576"}) == 9
    assert get("sitsprobe_cache_lookup_duration_seconds_bucket", {**h, "le": "+Inf"}) == 9
    assert get("sitsprobe_cache_kernel_lookups_total", {**h, "result": "miss"}) == 22
    assert get("sitsprobe_cache_kernel_lookups_total", {**h, "result": "filtered"}) == 9
    assert get("sitsprobe_cache_events_lost_total", {**h, "reason": "ring_buffer_full"}) == 2


def test_latency_buckets_are_cumulative_and_folded():
    lat = [0] * 65
    lat[1], lat[8], lat[40] = 2, 1, 4  # below the first bound, on it, past the last
    b = dict(latency_buckets(lat))
    assert b["2.56e-07"] == 3 and b["+Inf"] == 7
    assert list(b.values())[-2] == 3  # ~34 s: the 4 slow ones only in +Inf
    assert dict(latency_buckets([]))["+Inf"] == 0


def test_heatmap_matrices_equal_the_counters():
    s = CacheStats()
    workload(s)
    d = heatmap_data(s, "redis")
    assert d.prefixes[0] == "user" and set(d.prefixes) == {"user", "session", "cfg", "(no prefix)"}
    assert len(d.bucket_starts_ns) == 60 and d.bucket_starts_ns[-1] == 1020 * S
    tl = dict(s.timeline("redis"))
    for i, p in enumerate(d.prefixes):
        for j, start in enumerate(d.bucket_starts_ns):
            h, m = tl.get(start, {}).get(p, (0, 0))
            assert (d.lookups[i][j], d.misses[i][j]) == (h + m, m)
            assert d.rate[i][j] == (h + m) / 10
            assert (math.isnan(d.miss_ratio[i][j]) if h + m == 0 else d.miss_ratio[i][j] == m / (h + m))
    pairs = s.subnet_counts("redis")
    for i, p in enumerate(d.prefixes):
        for j, sub in enumerate(d.subnets):
            h, m = pairs.get((p, sub), (0, 0))
            assert (d.client_lookups[i][j], d.client_misses[i][j]) == (h + m, m)
    # a 20 s window ending at the last bucket: two columns
    w = heatmap_data(s, "redis", 20, end_ns=1025 * S)
    assert w.bucket_starts_ns == [1010 * S, 1020 * S]
    assert sum(map(sum, w.lookups)) == 20 + 7 + 5 + 4 + 3


def _png_size(path):
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", raw[8:16])
    assert kind == b"IHDR" and length == 13
    assert zlib.crc32(raw[12:29]) == struct.unpack(">I", raw[29:33])[0]
    assert raw[-8:-4] == b"IEND"
    return struct.unpack(">II", raw[16:24])


def test_png_shows_exactly_the_counters(tmp_path):
    np = pytest.importorskip("numpy")
    s = CacheStats()
    workload(s)
    out = tmp_path / "heat.png"
    drawn = render_png(s, str(out), window=600)
    w, h = _png_size(out)
    assert w >= 800 and h >= 200
    (d,) = drawn
    assert sum(map(sum, d.lookups)) == sum(a + b for a, b in s.prefix_counts("redis").values())
    assert sum(map(sum, d.misses)) == sum(b for _, b in s.prefix_counts("redis").values())
    fig = figure(drawn)
    rate_ax, ratio_ax, client_ax = fig.axes[:3]  # then their three colour bars
    assert np.array_equal(rate_ax.images[0].get_array(), np.array(d.rate))
    ratio = ratio_ax.images[0].get_array()
    assert np.array_equal(ratio.filled(-1), np.nan_to_num(np.array(d.miss_ratio), nan=-1))
    assert np.array_equal(client_ax.images[0].get_array(), np.array(d.client_misses))
    assert [t.get_text() for t in rate_ax.get_yticklabels()] == d.prefixes
    assert [t.get_text() for t in client_ax.get_xticklabels()] == d.subnets
    assert rate_ax.get_xlabel().startswith("time") and rate_ax.get_ylabel() == "key prefix"
    assert "last 10 min" in rate_ax.get_title()
    assert len(fig.axes) == 6  # three heatmaps, three colour bars
    assert [a.get_ylabel() for a in fig.axes[3:]] == ["look-ups/s", "miss ratio", "misses"]


def test_png_with_nothing_seen(tmp_path):
    out = tmp_path / "empty.png"
    render_png(CacheStats(), str(out))
    _png_size(out)


def test_text_fits_the_terminal():
    s = CacheStats()
    workload(s)
    for i in range(30):
        s.add("redis", b"a-very-long-prefix-name-that-goes-on-and-on-%d:k" % i, False, 1025 * S,
              Endpoint(f"2001:db8:{i}::1", 1))
    text = render_text(s)
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH
    lines = text.splitlines()
    assert lines[0].startswith("redis: 114 look-ups")
    user = next(line for line in lines if line.startswith("user "))
    assert "64" in user and "21.9%" in user
    assert render_text(CacheStats()) == "no cache look-ups seen yet\n"
