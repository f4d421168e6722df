"""The report as text (at most TEXT_WIDTH columns), as one JSON document, as a PNG.

Every number shown comes from :mod:`.tables`; nothing here computes.
"""
from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Sequence
from datetime import datetime, timezone

from .bias import Bias
from .load import Loaded, TimeWindow
from .records import SEGMENTS
from .tables import RESIDUAL, Attribution, SliRow, Tables, Validity

TEXT_WIDTH = 100
_KINDS = {"ttft": "ttft: gen_ai.server.time_to_first_token",
          "tpot": "tpot: gen_ai.server.time_per_output_token",
          "duration": "duration: the server span, end - start",
          "stage": "stage:NAME: the child spans named NAME, summed",
          "attribute": "attribute:NAME: that span attribute, in seconds"}
_EPOCH_2001_NS = 1_000_000_000 * 10**9  # earlier "times" are CLOCK_MONOTONIC, not wall-clock


# -- text ------------------------------------------------------------------------------

def text(tables: Tables, loaded: Loaded, width: int = TEXT_WIDTH) -> str:
    out = [f"sitsprobe report: {loaded.source}", *_wrap(_summary(tables, loaded), width), ""]
    out += _attribution(tables.attribution, width) + [""]
    out += _sli(tables.sli, tables.validity, width) + [""]
    out += _bias(tables.bias, width)
    return "\n".join(line.rstrip() for line in out) + "\n"


def _summary(tables: Tables, loaded: Loaded) -> str:
    parts = [f"{tables.requests:,} requests" + (f", {_window(tables.window)}" if tables.window else "")]
    if loaded.lines:
        parts.append(f"read {loaded.lines:,} lines, {loaded.spans:,} spans")
    if loaded.skipped:
        what = ("line" if loaded.lines else "record") + ("s" if loaded.skipped > 1 else "")
        parts.append(f"{loaded.skipped:,} {what} skipped ({'; '.join(loaded.problems)}"
                     + ("; ..." if loaded.skipped > len(loaded.problems) else "") + ")")
    if loaded.bad_spans:
        parts.append(f"{loaded.bad_spans:,} server spans without valid times left out")
    if loaded.evicted:
        parts.append(f"the agent had already dropped {loaded.evicted:,} older requests"
                     + (": the window starts no earlier than the oldest it holds"
                        if loaded.complete_since_ns else ""))
    return "; ".join(parts)


def _attribution(a: Attribution, width: int) -> list[str]:
    out = ["Latency attribution: per segment, the slow tail (the slowest 1 %) next to all requests"]
    if not a.requests:
        none = f"  no data: none of {a.without_segments:,} requests has sitsprobe.latency.* segments"
        return [*out, none]
    left = f" ({a.without_segments:,} without segments left out)" if a.without_segments else ""
    out += _wrap(f"  {a.requests:,} requests with segments{left}; slow tail: the {a.tail_requests:,} "
                 f"slowest, from {_ms(a.tail_min_ms)} ms; P99 of duration {_ms(a.p99_ms)} ms", width)
    headers = ["segment", "tail P99 (ms)", "tail share", "mean (ms)", "variance (ms²)", "share"]
    rows = [[r.segment, _ms(r.tail_p99_ms), _pct(r.tail_share), _ms(r.mean_ms), _num(r.variance_ms2),
             _pct(r.share)] for r in a.rows]
    out += _table(headers, rows, width)
    res = a.residual
    if res is not None:
        tol = res.tolerance
        line = (f"residual (duration - sum of segments): max |r| {_ms(res.max_abs_ms)} ms, mean "
                f"{_ms(res.mean_ms)} ms; {res.over:,} of {a.requests:,} requests off by more than "
                f"max({tol.share * 100:g} % of duration, {tol.min_ms:g} ms)")
        if res.over:
            line += f"; worst: trace {res.worst_trace_id or '(no trace id)'}, {res.worst_ms:+.2f} ms"
        out += _wrap(line, width)
    return out


def _sli(rows: Sequence[SliRow], v: Validity, width: int) -> list[str]:
    out = ["SLIs: per window, the share of requests within it and the P99 of what it measures"]
    headers = ["window", "measure", "window (ms)", "requests", "within", "P99 (ms)", "P99 ok"]
    table = []
    for r in rows:
        if not r.requests:
            table.append([r.name, r.measure, f"{r.window_ms:g}", "0", "no data", "-", "-"])
        else:
            table.append([r.name, r.measure, f"{r.window_ms:g}", f"{r.requests:,}", _pct(r.share_within),
                          _ms(r.p99_ms), "yes" if r.p99_met else "NO"])
    if rows:
        out += _table(headers, table, width, flexible=1)
        kinds = dict.fromkeys(r.measure.partition(":")[0] for r in rows)
        out += _wrap("  (" + "; ".join(_KINDS[k] for k in kinds) + ")", width)
    else:
        out.append("  no windows configured (report.windows)")
    if not v.counted:
        out.append(f"EIPR and semantic uptime: no data (no GenAI requests among {v.not_genai:,})")
        return out
    eipr = (f"EIPR {v.eipr:,.2f} valid responses/s over {v.window_s:,.1f} s"
            if v.eipr is not None else "EIPR: no data (no time window)")
    met = "met" if v.met else "NOT MET"
    out += _wrap(f"{eipr}; semantic uptime {_pct(v.uptime, 2)} ({v.valid:,} of {v.counted:,} GenAI "
                 f"requests valid), target {_pct(v.target, 2)}: {met}", width)
    notes = []
    if v.invalid:
        notes.append("invalid: " + ", ".join(f"{k} {n:,}" for k, n in v.invalid.items()))
    if v.not_genai:
        notes.append(f"{v.not_genai:,} requests without gen_ai.* attributes not counted")
    if notes:
        out += _wrap("  " + "; ".join(notes), width)
    return out


def _bias(b: Bias, width: int) -> list[str]:
    pct = f"{b.ratio * 100:g} %"
    out = [f"Sampling bias: the P99 of duration from every request, against {pct} head sampling"]
    if not b.requests:
        return [*out, "  no data"]
    kept = f"{b.kept:,} kept of {b.with_trace_id:,} with trace ids"
    if b.head_p99_ms is None:
        head = f"too few to estimate: {kept}, needs {b.min_kept:,}"
    else:
        error = f" ({b.head_error * 100:+.1f} %)" if b.head_error is not None else ""
        head = f"{_ms(b.head_p99_ms)} ms{error}, {kept}"
    if b.draw_median_ms is None:
        spread = (f"too few to estimate: {b.requests * b.ratio:,.0f} expected per sample, "
                  f"needs {b.min_kept:,}")
    else:
        spread = (f"median {_ms(b.draw_median_ms)} ms, 5-95 % {_ms(b.draw_p5_ms)} to "
                  f"{_ms(b.draw_p95_ms)} ms (seed {b.seed})")
    rows = [("exact, every request", f"{_ms(b.exact_p99_ms)} ms ({b.requests:,} requests)"),
            (f"head-sampled at {pct} by trace id", head),
            (f"{b.draws} random {pct} samples", spread)]
    key = max(len(k) for k, _ in rows)
    for k, value in rows:
        out += textwrap.wrap(value, width, initial_indent=f"  {k:<{key}}  ",
                             subsequent_indent=" " * (key + 4), break_on_hyphens=False)
    return out


def _window(w: TimeWindow) -> str:
    if w.start_ns < _EPOCH_2001_NS:
        return f"{w.seconds:,.1f} s (agent clock)"
    start, end = _utc(w.start_ns), _utc(w.end_ns)
    shown_end = end[11:] if end[:10] == start[:10] else end
    return f"{start} to {shown_end} UTC ({w.seconds:,.1f} s" + (", as asked)" if w.explicit else ")")


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if abs(v) >= 1000 else f"{v:.2f}"


def _num(v: float) -> str:
    return f"{v:,.2f}" if abs(v) < 1e9 else f"{v:.3e}"


def _pct(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v * 100:.{digits}f} %"


def _wrap(line: str, width: int) -> list[str]:
    indent = "  " if line.startswith("  ") else ""
    return textwrap.wrap(line, width, initial_indent="", subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [""]


def _table(headers: list[str], rows: list[list[str]], width: int, flexible: int = 0) -> list[str]:
    """Aligned columns (the first left, the rest right, except ``flexible`` which is
    left-aligned and cut with … where the whole would pass ``width``)."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over > 0:
        widths[flexible] = max(8, widths[flexible] - over)

    def cell(i: int, v: str) -> str:
        v = v if len(v) <= widths[i] else v[: widths[i] - 1] + "…"
        return v.ljust(widths[i]) if i in (0, flexible) else v.rjust(widths[i])
    return ["  ".join(cell(i, str(v)) for i, v in enumerate(row)) for row in (headers, *rows)]


# -- JSON ---------------------------------------------------------------------------------

def as_json(tables: Tables, loaded: Loaded) -> dict:
    """The same tables as one JSON document (fields as in :mod:`.tables`, times in ns)."""
    doc = {"source": loaded.source,
           "input": {"lines": loaded.lines, "spans": loaded.spans, "skipped": loaded.skipped,
                     "problems": loaded.problems, "bad_spans": loaded.bad_spans,
                     "evicted": loaded.evicted},
           **dataclasses.asdict(tables)}
    if tables.window is not None:
        doc["window"]["seconds"] = tables.window.seconds
    return doc


def json_text(tables: Tables, loaded: Loaded) -> str:
    return json.dumps(as_json(tables, loaded), indent=2, allow_nan=False, ensure_ascii=False) + "\n"


# -- PNG ------------------------------------------------------------------------------------

def figure(a: Attribution, title: str = ""):
    """A matplotlib Figure: stacked segment shares of the slow tail and of all
    requests, and each segment's P99 (ms) over the slow tail."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # Agg: no display, no global backend switch
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    names = [*SEGMENTS, RESIDUAL]
    rows = {r.segment: r for r in a.rows}
    colours = dict(zip(names, ("#4c72b0", "#dd8452", "#c44e52", "#8172b3", "#55a868", "#bbbbbb")))
    bars = ["slow tail", "all requests"]
    base = [0.0, 0.0]
    for name in names:
        r = rows.get(name)
        shares = [max(0.0, (r.tail_share or 0.0) if r else 0.0), max(0.0, (r.share or 0.0) if r else 0.0)]
        drawn = left.barh(bars, [s * 100 for s in shares], left=base, color=colours[name], label=name)
        left.bar_label(drawn, labels=[f"{s * 100:.0f} %" if s >= 0.05 else "" for s in shares],
                       label_type="center", fontsize=8, color="white")
        base = [b + s * 100 for b, s in zip(base, shares)]
    left.set_xlabel("share of duration (%)")
    left.set_xlim(0, max([100.0, *base]))
    left.invert_yaxis()
    left.legend(ncols=len(names), loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    left.set_title((title + "\n" if title else "") + f"latency attribution: slow tail = the "
                   f"{a.tail_requests:,} slowest of {a.requests:,} requests", fontsize=9, pad=24)
    p99 = [(rows[n].tail_p99_ms or 0.0) if n in rows else 0.0 for n in names]
    right.bar(names, p99, color=[colours[n] for n in names])
    right.set_ylabel("P99 over the slow tail (ms)")
    right.set_title("P99 per segment, slow tail", fontsize=9)
    right.tick_params(axis="x", labelsize=8)
    for i, v in enumerate(p99):
        right.annotate(_ms(v), (i, v), ha="center", va="bottom", fontsize=7)
    return fig


def png(tables: Tables, path, title: str = "") -> None:
    """Write the attribution picture to ``path`` (a file name or binary file) as PNG."""
    figure(tables.attribution, title).savefig(path, format="png", dpi=100)
