"""sitsprobe.sampling: a per-second budget, errors always, the slowest of the rest."""
from __future__ import annotations

from sitsprobe.request import Request
from sitsprobe.sampling import TraceSampler

S = 1_000_000_000
T0 = 100 * S  # the start of a window


def req(duration_ns: int = 1_000, status: int = 200, complete: bool = True) -> Request:
    return Request(
        pid=1, comm="srv", fd=3, start_ns=0, end_ns=duration_ns, first_out_ns=None,
        bytes_in=10, bytes_out=10, method="GET", path="/", status=status, complete=complete,
    )


def offer_all(sampler: TraceSampler, reqs, now_ns: int) -> list[Request]:
    return [r for q in reqs for r in sampler.offer(q, now_ns)]


def test_budget_then_drop_under_a_burst():
    s = TraceSampler(max_per_second=10, keep_slowest=0)
    out = offer_all(s, [req() for _ in range(1000)], T0)
    assert len(out) == 10
    assert (s.seen, s.exported, s.dropped) == (1000, 10, 990)
    assert s.flush() == []


def test_budget_renews_each_second():
    s = TraceSampler(max_per_second=5, keep_slowest=0)
    first = offer_all(s, [req() for _ in range(8)], T0)
    second = offer_all(s, [req() for _ in range(8)], T0 + S + S // 2)
    assert (len(first), len(second)) == (5, 5)
    assert (s.seen, s.exported, s.dropped) == (16, 10, 6)


def test_errors_are_always_exported_at_once():
    s = TraceSampler(max_per_second=2, keep_slowest=1)
    offer_all(s, [req(), req()], T0)  # the budget, spent
    errors = [req(status=500), req(status=503), req(complete=False)]
    for e in errors:
        assert s.offer(e, T0 + 1) == [e]
    assert s.exported == 5


def test_slowest_are_held_until_the_window_ends():
    s = TraceSampler(max_per_second=3, keep_slowest=2)
    durations = [50, 10, 900, 20, 700, 30, 800, 40]
    out = offer_all(s, [req(d) for d in durations], T0)
    assert [r.duration_ns for r in out] == [50, 10, 900]  # the budget
    assert s.flush(T0 + S - 1) == []  # same window: still held
    held = s.flush(T0 + S)
    assert sorted(r.duration_ns for r in held) == [700, 800]
    assert (s.seen, s.exported, s.dropped) == (8, 5, 3)


def test_held_requests_come_out_with_the_next_offer():
    s = TraceSampler(max_per_second=1, keep_slowest=1)
    offer_all(s, [req(1), req(5), req(3)], T0)
    nxt = req(2)
    assert s.offer(nxt, T0 + S) == [req(5), nxt]


def test_seen_is_exported_plus_dropped_after_flush():
    s = TraceSampler(max_per_second=100, keep_slowest=7)
    for i in range(5000):
        s.offer(req(i * 7919 % 1000, status=500 if i % 97 == 0 else 200), T0 + i * (S // 1000))
    assert s.seen > s.exported + s.dropped  # some still held
    s.flush()
    assert s.seen == s.exported + s.dropped == 5000
    assert s.exported <= 5 * (100 + 7) + 5000 // 97 + 1


def test_unlimited():
    s = TraceSampler(max_per_second=0, keep_slowest=5)
    reqs = [req(i) for i in range(10_000)]
    assert offer_all(s, reqs, T0) == reqs
    assert (s.seen, s.exported, s.dropped) == (10_000, 10_000, 0)
