"""The report's tables: latency attribution, SLIs and validity, as pure
functions over a list of :class:`RequestRecord` (quantiles: :mod:`.quantiles`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import Report as Settings
from ..config import Tolerance, Valid, Window
from ..request import CLIENT_CLOSED
from .bias import Bias, sampling_bias
from .load import TimeWindow
from .quantiles import mean, quantile, tail_size, variance
from .records import SEGMENTS, RequestRecord

RESIDUAL = "residual"  # the row for what no segment explains: duration − Σ segments
TAIL_Q = 0.99


# -- latency attribution ------------------------------------------------------------

@dataclass(frozen=True)
class SegmentRow:
    """One segment (or the residual) of the attribution table."""

    segment: str
    tail_p99_ms: float | None  # its P99 over the slow tail
    tail_share: float | None  # Σ segment / Σ duration over the slow tail
    mean_ms: float  # over all attributed requests
    variance_ms2: float  # population variance, ms²
    share: float | None  # Σ segment / Σ duration over all attributed requests


@dataclass(frozen=True)
class Residual:
    """How far the segments are from adding up to the duration."""

    max_abs_ms: float  # the largest |duration − Σ segments|
    mean_ms: float  # the mean of duration − Σ segments (signed)
    over: int  # requests off by more than the tolerance
    worst_trace_id: str | None  # the request off the most
    worst_ms: float  # ... and by how much (signed)
    tolerance: Tolerance


@dataclass(frozen=True)
class Attribution:
    requests: int  # records with at least one segment attribute: the ones attributed
    without_segments: int  # records with none (a non-HTTP exchange, an older agent): left out
    p99_ms: float | None  # P99 of duration over the attributed requests
    tail_requests: int
    tail_min_ms: float | None  # the fastest request of the slow tail
    rows: tuple[SegmentRow, ...]  # SEGMENTS in order, then RESIDUAL
    residual: Residual | None


def attribution(records: Sequence[RequestRecord], tolerance: Tolerance) -> Attribution:
    """The latency attribution tables (the methodology's 延迟热力归因表).

    Over the attributed requests (those with at least one ``sitsprobe.latency.*_s``
    attribute; a segment a request lacks counts as 0):

    - the slow tail is the slowest 1 % (``tail_size``: n − ⌈0.99·n⌉, at least
      one), each at or above the P99 of duration. Per segment: its P99 (ms) over
      the tail, and its share: Σ segment / Σ duration over the tail;
    - over all of them, per segment: mean (ms), population variance (ms²) and
      share, Σ segment / Σ duration.

    The residual row is duration − Σ segments, so the shares of a column add up
    to 1. A request is off when |residual| > max(share·duration, min_ms).
    """
    attributed = [r for r in records if r.segments]
    n = len(attributed)
    if not n:
        return Attribution(0, len(records), None, 0, None, (), None)
    by_duration = sorted(attributed, key=lambda r: r.duration_s)
    tail = by_duration[n - tail_size(n, TAIL_Q):]
    total_all = math.fsum(r.duration_s for r in attributed)
    total_tail = math.fsum(r.duration_s for r in tail)
    rows = []
    for name in (*SEGMENTS, RESIDUAL):
        def value(r: RequestRecord, name: str = name) -> float:
            return r.residual_s if name == RESIDUAL else r.segment(name)
        in_tail = sorted(value(r) for r in tail)
        all_ms = [value(r) * 1e3 for r in attributed]
        rows.append(SegmentRow(
            segment=name,
            tail_p99_ms=quantile(in_tail, TAIL_Q) * 1e3,  # type: ignore[operator]
            tail_share=math.fsum(in_tail) / total_tail if total_tail else None,
            mean_ms=mean(all_ms), variance_ms2=variance(all_ms),  # type: ignore[arg-type]
            share=math.fsum(all_ms) / 1e3 / total_all if total_all else None))
    return Attribution(n, len(records) - n,
                       quantile([r.duration_s * 1e3 for r in by_duration], TAIL_Q),
                       len(tail), tail[0].duration_s * 1e3, tuple(rows),
                       residual(attributed, tolerance))


def residual(records: Sequence[RequestRecord], tolerance: Tolerance) -> Residual | None:
    """The segment-sum check over ``records`` (see :func:`attribution`)."""
    if not records:
        return None
    worst = max(records, key=lambda r: abs(r.residual_s))
    over = sum(1 for r in records if abs(r.residual_s) * 1e3 > off_limit_ms(r, tolerance))
    return Residual(abs(worst.residual_s) * 1e3, math.fsum(r.residual_s for r in records) / len(records) * 1e3,
                    over, worst.trace_id, worst.residual_s * 1e3, tolerance)


def off_limit_ms(rec: RequestRecord, tolerance: Tolerance) -> float:
    """How far (ms) a request's segments may sum from its duration."""
    return max(tolerance.share * rec.duration_s * 1e3, tolerance.min_ms)


# -- SLI windows ------------------------------------------------------------------------

@dataclass(frozen=True)
class SliRow:
    name: str
    measure: str
    how: str  # what the measure reads, in words
    window_ms: float
    requests: int  # records that have the measure (0: no data)
    within: int  # of those, at or under the window
    share_within: float | None  # within / requests; None: no data
    p99_ms: float | None  # P99 of the measure; None: no data
    p99_met: bool | None  # P99 ≤ window (the methodology's goal); None: no data


def how(measure: str) -> str:
    """A measure in words, for the table."""
    kind, _, name = measure.partition(":")
    return {"ttft": "gen_ai.server.time_to_first_token",
            "tpot": "gen_ai.server.time_per_output_token",
            "duration": "server span, end - start",
            "stage": f"child spans {name!r}, summed",
            "attribute": f"span attribute {name} (s)"}[kind]


def sli(records: Sequence[RequestRecord], windows: Sequence[Window]) -> tuple[SliRow, ...]:
    """Per window: of the requests that have its measure (see
    ``RequestRecord.measure``), the share at or under the window and the
    measure's P99. A window whose measure no request has is "no data" (None),
    never 100 %."""
    rows = []
    for w in windows:
        values = sorted(v * 1e3 for r in records if (v := r.measure(w.measure)) is not None)
        within = sum(1 for v in values if v <= w.window_ms)
        p99 = quantile(values, TAIL_Q)
        rows.append(SliRow(w.name, w.measure, how(w.measure), w.window_ms, len(values), within,
                           within / len(values) if values else None, p99,
                           None if p99 is None else p99 <= w.window_ms))
    return tuple(rows)


# -- valid responses: EIPR and semantic uptime -------------------------------------------

REASONS = ("status", "no_status", "error", "client_closed", "finish_reason", "no_finish_reason",
           "empty_answer", "json_invalid")


def invalid_reasons(rec: RequestRecord, valid: Valid) -> list[str]:
    """Why a GenAI response is not valid; none: it is valid. It is invalid when:

    - status: its HTTP status is in none of ``valid.status_classes`` ("2xx":
      200..299; "404": that code); no_status: it has none (no response seen);
    - error: it carries ``error.type`` (a 5xx, a response cut short, an error body);
      client_closed: its client hung up before the answer ended (a stop button, a
      client's timeout: ``error.type=client_closed``), told apart from the server's errors;
    - finish_reason: a finish reason it gave is not in ``valid.finish_reasons``
      (every choice's must be); no_finish_reason: it gave none and
      ``require_finish_reason`` is true (false: not knowing is no fault);
    - empty_answer: ``sitsprobe.genai.answer_empty`` is true and ``require_answer``
      (absent, could not tell: no fault);
    - json_invalid: ``sitsprobe.genai.json_valid`` is false and ``require_json_valid``
      (absent: JSON was not asked for, or the answer was not seen whole).
    """
    out = []
    if rec.status is None:
        out.append("no_status")
    elif not any(_status_in(rec.status, c) for c in valid.status_classes):
        out.append("status")
    if rec.error_type:
        out.append("client_closed" if rec.error_type == CLIENT_CLOSED else "error")
    if rec.finish_reasons:
        if any(f not in valid.finish_reasons for f in rec.finish_reasons):
            out.append("finish_reason")
    elif valid.require_finish_reason:
        out.append("no_finish_reason")
    if valid.require_answer and rec.answer_empty is True:
        out.append("empty_answer")
    if valid.require_json_valid and rec.json_valid is False:
        out.append("json_invalid")
    return out


def _status_in(status: int, cls: str) -> bool:
    return status // 100 == int(cls[0]) if cls.endswith("xx") else status == int(cls)


@dataclass(frozen=True)
class Validity:
    counted: int  # GenAI requests (spans with gen_ai.* attributes): the only ones counted
    not_genai: int  # the other records, left out
    valid: int
    window_s: float | None  # the window EIPR is over
    eipr: float | None  # valid responses per second; None: no window or no GenAI request
    uptime: float | None  # valid / counted; None: none counted
    target: float
    met: bool | None  # uptime ≥ target
    invalid: dict[str, int]  # reason -> requests (a request may have several reasons)


def validity(records: Sequence[RequestRecord], valid: Valid, target: float,
             window: TimeWindow | None) -> Validity:
    """EIPR (effective intent processing rate): valid GenAI responses per second
    of the window (the explicit one, else from the oldest start to the newest
    end of the records). Semantic uptime: valid / all GenAI responses, against
    ``target``. What is valid: :func:`invalid_reasons`."""
    genai = [r for r in records if r.genai]
    invalid = dict.fromkeys(REASONS, 0)
    n_valid = 0
    for r in genai:
        reasons = invalid_reasons(r, valid)
        n_valid += not reasons
        for why in reasons:
            invalid[why] += 1
    seconds = window.seconds if window is not None else None
    uptime = n_valid / len(genai) if genai else None
    return Validity(len(genai), len(records) - len(genai), n_valid, seconds,
                    n_valid / seconds if genai and seconds else None, uptime, target,
                    None if uptime is None else uptime >= target,
                    {k: v for k, v in invalid.items() if v})


# -- all of it ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Tables:
    requests: int
    window: TimeWindow | None
    attribution: Attribution
    sli: tuple[SliRow, ...]
    validity: Validity
    bias: Bias


def build(records: Sequence[RequestRecord], settings: Settings, window: TimeWindow | None = None,
          sample_ratio: float = 0.01, seed: int = 0) -> Tables:
    """Every table of the report over ``records`` (already in their window)."""
    return Tables(len(records), window, attribution(records, settings.tolerance),
                  sli(records, settings.windows),
                  validity(records, settings.valid, settings.uptime_target, window),
                  sampling_bias(records, sample_ratio, seed=seed))


def kept_attributes(windows: Sequence[Window]) -> tuple[str, ...]:
    """The span attributes the windows measure: what records must keep."""
    return tuple(w.measure.partition(":")[2] for w in windows if w.measure.startswith("attribute:"))
