"""sitsprobe.losses: a loss is said when it starts, summarised while it lasts,
said when it stops, and totalled at exit; never a line per event."""
from __future__ import annotations

import logging

import pytest

from sitsprobe.cache.lookup import KernelCacheCounts
from sitsprobe.export.prom import KernelMetrics
from sitsprobe.losses import ADVICE, LossLog, advice_for, loss_totals


class Counters(dict):
    """The kernel's totals as a test sets them; counts the reads."""

    reads = 0

    def __call__(self):
        self.reads += 1
        return dict(self)


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.DEBUG, logger="sitsprobe")

    def take():
        out = [(r.levelname, r.getMessage()) for r in caplog.records]
        caplog.clear()
        return out
    return take


def test_nothing_lost_nothing_said(lines):
    c = Counters(ring_buffer_full=0)
    log = LossLog(c, interval_s=60)
    for t in range(0, 300, 1):
        log.tick(float(t))
    log.finish()
    assert lines() == []


def test_start_summary_stop_and_total(lines):
    c = Counters(ring_buffer_full=0, connection_table_full=0)
    log = LossLog(c, interval_s=60)
    log.tick(0.0)
    c["ring_buffer_full"] = 1200
    log.tick(1.0)
    assert lines() == [("WARNING", ("losing events: ring_buffer_full, 1200 so far; "
                                    f"{ADVICE['ring_buffer_full']}; summarised every 60 s while it lasts"))]
    for t in range(2, 61):  # it keeps growing: nothing more until the interval ends
        c["ring_buffer_full"] += 100
        log.tick(float(t))
    assert lines() == []
    c["ring_buffer_full"] += 100
    log.tick(61.0)
    assert lines() == [("WARNING", "still losing events: ring_buffer_full, 6000 in the last 60 s, 7200 in all")]
    for t in range(62, 121):  # it stopped
        log.tick(float(t))
    assert lines() == []
    log.tick(121.0)
    assert lines() == [("INFO", "no longer losing events: ring_buffer_full, none in the last 60 s, 7200 in all")]
    log.tick(500.0)
    assert lines() == []
    log.finish()
    assert lines() == [("WARNING", "events lost while running: ring_buffer_full 7200 (7200 in all)")]


def test_a_loss_that_starts_again_is_said_again(lines):
    c = Counters(ring_buffer_full=0)
    log = LossLog(c, interval_s=10)
    log.tick(0.0)
    c["ring_buffer_full"] = 5
    log.tick(1.0)
    log.tick(11.0)
    assert [level for level, _ in lines()] == ["WARNING", "INFO"]
    c["ring_buffer_full"] = 8
    log.tick(12.0)
    assert lines()[0][1].startswith("losing events: ring_buffer_full, 8 so far;")


def test_losses_already_counted_at_the_first_read_are_said(lines):
    log = LossLog(Counters(notice_ring_full=3), interval_s=60)
    log.tick(0.0)
    assert lines()[0][1].startswith("losing events: notice_ring_full, 3 so far; its size is fixed")


def test_each_reason_on_its_own(lines):
    c = Counters(ring_buffer_full=0, connection_table_full=0)
    log = LossLog(c, interval_s=60)
    c["connection_table_full"] = 7
    log.tick(0.0)
    c["ring_buffer_full"] = 2
    log.tick(30.0)
    c["ring_buffer_full"] = 4
    log.tick(60.0)  # the connection table's interval ends; the ring's does not
    log.tick(90.0)
    assert [m.split(",")[0] for _, m in lines()] == [
        "losing events: connection_table_full", "losing events: ring_buffer_full",
        "no longer losing events: connection_table_full", "still losing events: ring_buffer_full"]
    log.finish()
    assert lines() == [("WARNING", ("events lost while running: ring_buffer_full 4, "
                                    "connection_table_full 7 (11 in all)"))]  # in the order read


def test_read_at_most_once_per_check_interval():
    c = Counters(ring_buffer_full=0)
    log = LossLog(c, check_s=1.0)
    for i in range(40):  # a flush tick every 250 ms for 10 s
        log.tick(i * 0.25)
    assert c.reads == 10


def test_finish_reads_last_and_never_raises(lines):
    c = Counters(ring_buffer_full=0)
    log = LossLog(c)
    log.tick(0.0)
    c["ring_buffer_full"] = 9  # lost after the last tick
    log.finish()
    assert lines() == [("WARNING", "events lost while running: ring_buffer_full 9 (9 in all)")]

    def gone():
        raise KeyError("counters")
    log = LossLog(gone)
    log.finish()
    assert lines() == [("DEBUG", "loss counters not read at exit: 'counters'")]


def test_totals_from_the_kernel_counters_and_caches():
    counters = {"exchanges": 100, "lost": 5, "conn_overflow": 1, "uncounted": 0, "notices_lost": 0,
                "inflight_lost": 0, "marker_events": 40, "marker_lost": 2,
                "marker_batch_ids_dropped": 0, "marker_keys_cut": 3}
    caches = {"redis": KernelCacheCounts(hits=10, lost=4, inflight_lost=1)}
    assert loss_totals(counters, lambda: caches) == {
        "ring_buffer_full": 5, "connection_table_full": 1, "connection_tables_full_uncounted": 0,
        "notice_ring_full": 0, "inflight_table_full": 0, "marker_ring_full": 2,
        "marker_batch_ids_dropped": 0,
        "ring_buffer_full (cache redis)": 4, "inflight_table_full (cache redis)": 1}
    assert "marker_lost" not in loss_totals({"lost": 0, "exchanges": 0})
    assert loss_totals({"lost": 0}, None) == {"ring_buffer_full": 0}


def test_every_reason_has_advice():
    reasons = list(KernelMetrics.LOSS.values()) + ["ring_buffer_full (cache redis)",
                                                   "inflight_table_full (cache a b)"]
    for reason in reasons:
        assert advice_for(reason), reason
    assert advice_for("ring_buffer_full").startswith("raise ring_buffer_mib")
    assert advice_for("connection_table_full").startswith("raise stitch.max_connections")
    assert advice_for("ring_buffer_full (cache redis)") == ADVICE["cache ring_buffer_full"]
    assert advice_for("something new") == ""
