"""Event losses, said in the log: one WARNING when a loss starts, a summary per
interval while it lasts, one line when it stops, and a total at exit.

The kernel counts every event it could not deliver (bpf/sitsprobe.h: the
`counters`, `marker_counters` and `cache_counts` arrays) and /metrics exports
those counts; this is the same counts for a person reading the agent's log.
Pure: the counts come from `read`, the time from the caller, so a test drives
it with a dict and a fake clock.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from .cache.lookup import KernelCacheCounts
from .export.prom import KernelMetrics

# What the user can do, by reason (the `reason` label of sitsprobe_events_lost_total;
# "cache <reason>" for sitsprobe_cache_events_lost_total): what the agent-health
# dashboard's "Events lost/s by reason" panel says, for every reason.
ADVICE = {
    "ring_buffer_full": "raise ring_buffer_mib, or capture fewer bytes per exchange "
                        "(capture.request_bytes, capture.response_bytes)",
    "connection_table_full": "raise stitch.max_connections (their responses are still counted, "
                             "in sitsprobe_http_server_requests_untracked_total, never stitched)",
    "connection_tables_full_uncounted": "raise stitch.max_connections (these connections are "
                                        "neither stitched nor counted)",
    "payload_table_full": "more POST exchanges in progress at once than capture.max_payloads: "
                          "those get no gen_ai.* attributes from the wire",
    "write_ring_full": "the agent was late to drain response write events (they may fill five "
                       "eighths of the ring, then give way to requests and first tokens): raise "
                       "ring_buffer_mib, give the agent more CPU, or lower capture.max_writes; those "
                       "streams' token timings are a floor (sitsprobe.genai.events_approximate)",
    "stream_ring_full": "HTTP/2 and gRPC bytes the agent did not drain in time: give it more CPU, "
                        "or lower capture.stream_bytes; those connections' later streams are partial",
    "write_queue_full": "more response write events waited for their exchanges at once than the "
                        "agent holds (a million): give the agent more CPU; those streams' timings "
                        "are a floor",
    "notice_ring_full": "its size is fixed: processes that started or exited are still found "
                        "by the rescan every select.rescan_interval_s",
    "inflight_table_full": "more socket calls in flight at once than the fixed in-flight table "
                           "holds: trace fewer processes (select.*)",
    "marker_ring_full": "the engine markers' ring has a fixed size: give the agent more CPU "
                        "(those requests lose their engine stages)",
    "marker_batch_ids_dropped": "a batch named more requests than the marker probe sends "
                                "(MARKER_MAX_IDS): those past it get no batch stages",
    "marker_range_begin_not_kept": "an engine stage ended whose start the kernel did not keep: it "
                                   "began before the agent attached (at start, harmless), or more "
                                   "stages were open at once than it keeps (16,384); that stage is "
                                   "not in its trace",
    "cache ring_buffer_full": "the look-up ring has a fixed size: give the agent more CPU "
                              "(sitsprobe_cache_kernel_lookups_total stays exact)",
    "cache inflight_table_full": "more look-ups in flight at once than the fixed in-flight "
                                 "table holds: these are not counted at all",
}


def loss_totals(counters: Mapping[str, int],
                caches: Callable[[], Mapping[str, KernelCacheCounts]] | None = None) -> dict[str, int]:
    """reason -> events lost since start: the kernel's counters (names as in
    KernelMetrics.LOSS, e.g. "lost" -> "ring_buffer_full") and each cache's,
    as "ring_buffer_full (cache NAME)"."""
    out = {reason: counters[key] for key, reason in KernelMetrics.LOSS.items() if key in counters}
    for name, k in sorted((caches() if caches else {}).items()):
        out[f"ring_buffer_full (cache {name})"] = k.lost
        out[f"inflight_table_full (cache {name})"] = k.inflight_lost
    return out


def advice_for(reason: str) -> str:
    if " (cache " in reason:  # "ring_buffer_full (cache redis)"
        return ADVICE.get("cache " + reason.partition(" (cache ")[0], "")
    return ADVICE.get(reason, "")


class _Loss:
    __slots__ = ("base", "moving", "since", "total")

    def __init__(self):
        self.total = 0  # the count last read
        self.moving = False
        self.since = 0.0  # when the interval being summarised began
        self.base = 0  # the count then


class LossLog:
    """Says losses as they start, last and stop.

    ``read()`` gives reason -> events lost since start (totals that only grow);
    the agent calls ``tick(now)`` on its flush tick (``now`` in seconds, any
    monotonic clock) and ``read`` is called at most once per ``check_s``. A
    reason whose count grows is *losing*: one WARNING at once, then at the end
    of each ``interval_s`` one WARNING with the count over the interval if it
    grew, or one INFO that it stopped if it did not. ``finish()`` says the
    totals once at exit, if anything was lost. So a loss costs at most two
    lines per interval per reason, however long it lasts.
    """

    def __init__(self, read: Callable[[], Mapping[str, int]], *, interval_s: float = 60.0,
                 check_s: float = 1.0, log: logging.Logger | None = None,
                 advice: Callable[[str], str] = advice_for):
        self._read, self.interval_s, self.check_s = read, interval_s, check_s
        self._log = log or logging.getLogger("sitsprobe")
        self._advice = advice
        self._losses: dict[str, _Loss] = {}
        self._next = float("-inf")

    def tick(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + self.check_s
        for reason, total in self._read().items():
            self._update(reason, total, now)

    def _update(self, reason: str, total: int, now: float) -> None:
        s = self._losses.get(reason)
        if s is None:
            s = self._losses[reason] = _Loss()
        if total < s.total:  # counters are reset only with their program: start again
            s.total = s.base = total
        if not s.moving:
            if total > s.total:
                advice = self._advice(reason)
                self._log.warning("losing events: %s, %d so far%s; summarised every %.0f s while it lasts",
                                  reason, total, f"; {advice}" if advice else "", self.interval_s)
                s.moving, s.since, s.base = True, now, total
        elif now - s.since >= self.interval_s:
            if total > s.base:
                self._log.warning("still losing events: %s, %d in the last %.0f s, %d in all",
                                  reason, total - s.base, now - s.since, total)
            else:
                self._log.info("no longer losing events: %s, none in the last %.0f s, %d in all",
                               reason, now - s.since, total)
                s.moving = False
            s.since, s.base = now, total
        s.total = total

    def totals(self) -> dict[str, int]:
        """reason -> events lost, for the reasons that lost any (as last read)."""
        return {reason: s.total for reason, s in self._losses.items() if s.total}

    def finish(self) -> None:
        """One last read, then one WARNING with every reason's total, if any
        was lost. Never raises: the agent calls it while closing."""
        try:
            for reason, total in self._read().items():
                s = self._losses.setdefault(reason, _Loss())
                s.total = max(s.total, total)
        except Exception as e:  # noqa: BLE001 - a probe already gone: say what was read before
            self._log.debug("loss counters not read at exit: %s", e)
        if lost := self.totals():
            self._log.warning("events lost while running: %s (%d in all)",
                              ", ".join(f"{r} {n}" for r, n in lost.items()), sum(lost.values()))
