"""sitsprobe.sampling: a per-second budget of traces, errors always, the slowest
of the rest; the budget from what tracing costs (traces.cpu_budget), or a
fixed one (traces.max_per_second)."""
from __future__ import annotations

import math
import random
import threading

import pytest

from sitsprobe.request import Request
from sitsprobe import sampling
from sitsprobe.sampling import (CREDIT_WINDOWS, DEBT_WINDOWS, FLOOR_PER_SECOND, PRIOR_COST_S, CpuMeter,
                                TraceSampler)

S = 1_000_000_000
T0 = 100 * S  # the start of a window


def req(duration_ns: int = 1_000, status: int = 200, complete: bool = True) -> Request:
    return Request(
        pid=1, comm="srv", fd=3, start_ns=0, end_ns=duration_ns, first_out_ns=None,
        bytes_in=10, bytes_out=10, method="GET", path="/", status=status, complete=complete,
    )


def offer_all(sampler: TraceSampler, reqs, now_ns: int) -> list[Request]:
    return [r for q in reqs for r in sampler.offer(q, now_ns)]


# --- a fixed budget: max_per_second, and no cpu_budget (the sampler before there was one)

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


def test_charges_change_nothing_without_a_cpu_budget():
    s = TraceSampler(max_per_second=10, keep_slowest=0, cpu_budget=0)
    for k in range(5):
        out = offer_all(s, [req() for _ in range(100)], T0 + k * S)
        for _ in out:
            s.charge(1.0)  # a second a trace: far past any CPU budget
        assert len(out) == 10 and s.budget_per_second == 10
    assert s.cost_per_trace == PRIOR_COST_S and s.debt == 0
    assert s.cpu_seconds == 50.0  # still counted, for the metric
    assert TraceSampler(max_per_second=0, keep_slowest=5, cpu_budget=0).budget_per_second == math.inf


# --- the budget from a CPU budget ----------------------------------------------

BUDGET = 0.05  # of a core: 50 ms of CPU a 1-second window


def window(s: TraceSampler, k: int, n: int, cost_s: float, make=req) -> list[Request]:
    """Offer ``n`` requests in window ``k``, and charge ``cost_s`` for each
    one exported, as the agent does once it has sent it."""
    out = offer_all(s, [make() for _ in range(n)], T0 + k * S)
    for _ in out:
        s.charge(cost_s)
    return out


def test_below_the_budget_every_request_is_exported():
    s = TraceSampler(keep_slowest=20, cpu_budget=BUDGET)
    for k in range(10):
        assert len(window(s, k, 100, 100e-6)) == 100  # 10 ms a second: a fifth of the budget
    assert (s.seen, s.exported, s.dropped, s.held) == (1000, 1000, 0, 0)
    assert s.cpu_seconds == pytest.approx(0.1) and s.debt == 0


def test_until_charged_the_cost_is_a_prior():
    s = TraceSampler(cpu_budget=BUDGET)
    assert s.cost_per_trace == PRIOR_COST_S == 250e-6
    assert s.budget_per_second == 200  # 50 ms / 250 µs
    assert len(offer_all(s, [req() for _ in range(1000)], T0)) == 200
    s.flush(T0 + S)  # nothing was charged: the prior stands
    assert s.cost_per_trace == PRIOR_COST_S and s.budget_per_second == 200


def test_the_next_budget_is_the_cpu_budget_over_the_measured_cost():
    s = TraceSampler(cpu_budget=BUDGET)
    window(s, 0, 50, 500e-6)  # 50 traces, 25 ms
    out = window(s, 1, 1000, 500e-6)
    assert s.cost_per_trace == pytest.approx(500e-6)
    assert len(out) == s.budget_per_second == 100  # 50 ms / 500 µs


def test_the_estimate_follows_a_changing_cost():
    s = TraceSampler(cpu_budget=BUDGET)
    window(s, 0, 100, 100e-6)
    window(s, 1, 100, 400e-6)
    s.flush(T0 + 2 * S)  # window 1 settled
    assert 100e-6 < s.cost_per_trace < 400e-6  # not yet: recent windows weigh most
    for k in range(2, 60):
        window(s, k, 100, 400e-6)
    assert s.cost_per_trace == pytest.approx(400e-6, rel=1e-3)
    assert s.budget_per_second == 125


def test_errors_still_go_out_and_the_slowest_are_held_past_the_budget():
    s = TraceSampler(keep_slowest=2, cpu_budget=BUDGET)
    window(s, 0, 12, BUDGET / 12)  # 12 traces spend the window's 50 ms exactly
    budget = offer_all(s, [req(5) for _ in range(14)], T0 + S)
    assert len(budget) == s.budget_per_second == 12
    for e in [req(status=500), req(status=503), req(complete=False)]:
        assert s.offer(e, T0 + S + 1) == [e]
    assert offer_all(s, [req(d) for d in (50, 900, 10, 700, 20, 800)], T0 + S + 2) == []
    assert s.held == 2
    assert s.flush(T0 + 2 * S - 1) == []  # same window: still held
    assert sorted(r.duration_ns for r in s.flush(T0 + 2 * S)) == [800, 900]
    assert (s.seen, s.exported, s.dropped, s.held) == (12 + 14 + 3 + 6, 12 + 12 + 3 + 2, 2 + 4, 0)


def test_an_overspent_window_shrinks_the_next_ones_until_repaid():
    fair = TraceSampler(cpu_budget=BUDGET)
    window(fair, 0, 50, 1e-3)  # 1 ms a trace: 50 of them spend the window's 50 ms
    assert len(window(fair, 1, 100, 1e-3)) == 50
    s = TraceSampler(cpu_budget=BUDGET)
    window(s, 0, 100, 1e-3)  # 100 ms: 50 ms too many
    assert len(window(s, 1, 100, 1e-3)) == 10  # 50 ms owed, none left: the floor
    assert s.debt == pytest.approx(0.05)
    assert len(window(s, 2, 100, 1e-3)) == 40  # 10 ms owed still
    assert len(window(s, 3, 100, 1e-3)) == 50  # repaid
    assert s.debt == pytest.approx(0, abs=1e-12)


def test_a_costly_moment_never_stops_tracing_and_its_debt_is_bounded():
    s = TraceSampler(cpu_budget=BUDGET)
    window(s, 0, 10, 1.0)  # a second of CPU a trace
    assert len(window(s, 1, 100, 1.0)) == FLOOR_PER_SECOND == 10
    assert s.debt == pytest.approx(DEBT_WINDOWS * BUDGET)  # 0.5 s owed at most,
    assert s.written_off == pytest.approx(10 - BUDGET - DEBT_WINDOWS * BUDGET)  # the rest forgiven


def test_charges_that_come_in_lumps_do_not_shrink_the_budget():
    """The exporter sends every few seconds: what it costs arrives late, in
    one charge; the credit of the windows before absorbs it."""
    s = TraceSampler(cpu_budget=BUDGET)
    owed = 0.0
    for k in range(60):
        out = offer_all(s, [req() for _ in range(30)], T0 + k * S)
        assert len(out) == 30, k  # 30 ms a second at 1 ms a trace: within the 50 ms
        owed += len(out) * 1e-3
        if k % CREDIT_WINDOWS == CREDIT_WINDOWS - 1:
            s.charge(owed)  # 150 ms at once
            owed = 0.0
        assert s.debt == 0, k


def test_max_per_second_caps_the_budget():
    s = TraceSampler(max_per_second=50, cpu_budget=BUDGET)
    assert s.budget_per_second == 50  # the prior would allow 200
    window(s, 0, 1000, 1e-6)
    assert len(window(s, 1, 1000, 1e-6)) == 50  # 1 µs a trace would allow 50,000
    low = TraceSampler(max_per_second=5, cpu_budget=BUDGET)
    window(low, 0, 10, 1.0)
    assert len(window(low, 1, 100, 1.0)) == 5  # a cap under the floor: the cap


def test_charges_from_any_thread_all_count():
    s = TraceSampler(cpu_budget=BUDGET)
    threads = [threading.Thread(target=lambda: [s.charge(1e-6) for _ in range(10_000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.charge(-1.0)
    s.charge(float("nan"))  # ignored
    assert s.cpu_seconds == pytest.approx(0.04)


@pytest.mark.parametrize("seed", range(12))
def test_every_request_is_accounted_for_and_the_long_run_stays_in_budget(seed):
    rng = random.Random(seed)
    cap = (0, 30, 300)[seed % 3]
    s = TraceSampler(max_per_second=cap, keep_slowest=rng.choice([0, 3, 20]), cpu_budget=BUDGET)
    cost = (20e-6, 300e-6, 2e-3, 20e-3)[seed % 4]  # a trace; at 20 ms the floor alone overspends
    now, first, current = T0, T0 // S, T0 // S
    owed = 0.0
    for i in range(20_000):
        if i % 500 == 0:
            rate = rng.choice([10, 300, 3_000, 30_000])  # requests a second, for a while
        now += int(rng.expovariate(rate) * S)
        if now // S > current:  # this call begins a window, settling the ones before
            current, settled = now // S, s.cpu_seconds
        else:
            settled = None
        if rng.random() < 0.1:
            out = s.flush(now)
        else:
            out = s.offer(req(rng.randrange(1, 10_000), status=500 if rng.random() < 0.03 else 200), now)
        owed += len(out) * cost * rng.uniform(0.5, 1.5)
        if rng.random() < 0.3:  # charged now, or later in a lump
            s.charge(owed)
            owed = 0.0
        assert s.seen == s.exported + s.dropped + s.held
        floor = min(FLOOR_PER_SECOND, cap) if cap else FLOOR_PER_SECOND
        assert floor <= s.budget_per_second <= (cap or math.inf)
        if settled is not None:
            assert settled <= BUDGET * (current - first) + s.debt + s.written_off + 1e-9
    s.flush()
    assert s.held == 0 and s.seen == s.exported + s.dropped


# --- CpuMeter: the thread's CPU clock read for one piece of work in `every`

class FakeThreadClock:
    """time.thread_time that each piece of work advances by its cost; counts its reads."""

    def __init__(self):
        self.now, self.reads = 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_a_meter_reads_the_first_piece_of_work_and_one_in_every_after(monkeypatch):
    clock = FakeThreadClock()
    monkeypatch.setattr(sampling.time, "thread_time", clock)
    charged: list[float] = []
    meter = CpuMeter(charged.append, every=4)
    costs = [0.001 * (1 + i % 3) for i in range(12)]  # 1, 2, 3, 1, 2, ... ms
    for cost in costs:
        began = meter.start()
        clock.now += cost
        meter.stop(began)
    assert clock.reads == 2 * 3  # pieces 0, 4 and 8: two reads each
    assert charged == pytest.approx([4 * costs[0], 4 * costs[4], 4 * costs[8]])


def test_a_meter_charges_what_the_work_cost_on_average(monkeypatch):
    clock = FakeThreadClock()
    monkeypatch.setattr(sampling.time, "thread_time", clock)
    charged: list[float] = []
    meter = CpuMeter(charged.append)
    rng = random.Random(7)
    costs = [rng.expovariate(1 / 50e-6) for _ in range(40_000)]  # traces of 50 µs on average
    for cost in costs:
        began = meter.start()
        clock.now += cost
        meter.stop(began)
    assert clock.reads == 2 * len(costs) // sampling.CPU_READ_EVERY
    assert sum(charged) == pytest.approx(sum(costs), rel=0.03)
