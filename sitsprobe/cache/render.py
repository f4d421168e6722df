"""Cache-miss heatmaps: key prefix x time and key prefix x client subnet.

``heatmap_data`` turns CacheStats into plain matrices (the numbers a picture
shows, testable without one); ``render_png`` draws them with matplotlib's Agg
backend (imported only here, only when called); ``render_text`` prints them
for a terminal, at most TEXT_WIDTH columns wide.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..clock import WallClock
from .heavy import OTHER
from .stats import CacheStats

TEXT_WIDTH = 100
MAX_ROWS = 20  # prefixes drawn; the rest in OTHER
MAX_SUBNETS = 12  # subnets drawn; the rest in OTHER
_SHADES = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class HeatmapData:
    cache: str
    window_s: float
    bucket_s: float
    prefixes: list[str]  # rows, busiest first, OTHER last if present
    bucket_starts_ns: list[int]  # time columns, CLOCK_MONOTONIC, oldest first
    lookups: list[list[int]]  # [prefix][bucket]
    misses: list[list[int]]
    subnets: list[str]  # client columns, busiest first, OTHER last if present
    client_lookups: list[list[int]]  # [prefix][subnet], since the agent started
    client_misses: list[list[int]]

    @property
    def rate(self) -> list[list[float]]:
        """Look-ups per second in each bucket."""
        return [[n / self.bucket_s for n in row] for row in self.lookups]

    @property
    def miss_ratio(self) -> list[list[float]]:
        """Misses / look-ups in each bucket; NaN where there were none."""
        return [[m / n if n else math.nan for n, m in zip(nr, mr)]
                for nr, mr in zip(self.lookups, self.misses)]


def _rows(ranked: list[str], used: set[str], limit: int) -> list[str]:
    rows = [p for p in ranked if p != OTHER][:limit]
    if used - set(rows):
        rows.append(OTHER)
    return rows


def heatmap_data(stats: CacheStats, cache: str, window_s: float | None = None,
                 end_ns: int | None = None) -> HeatmapData:
    """The matrices for one cache over the window ending at end_ns (default:
    the latest look-up seen), one column per bucket, empty buckets included."""
    bucket_ns = stats.bucket_ns
    if window_s is None:
        window_s = stats.history * stats.bucket_s
    n_cols = max(1, min(stats.history, math.ceil(window_s * 1e9 / bucket_ns)))
    end_idx = (end_ns if end_ns is not None else stats.last_ts_ns or time.monotonic_ns()) // bucket_ns
    first_idx = end_idx - n_cols + 1
    timeline = [(start // bucket_ns, cells) for start, cells in stats.timeline(cache)
                if first_idx <= start // bucket_ns <= end_idx]
    pairs = stats.subnet_counts(cache)
    used = {p for _, cells in timeline for p in cells} | {p for p, _ in pairs}
    prefixes = _rows(stats.top_prefixes(cache), used, MAX_ROWS)
    row_of = {p: i for i, p in enumerate(prefixes)}
    other_row = row_of.get(OTHER, 0)

    lookups = [[0] * n_cols for _ in prefixes]
    misses = [[0] * n_cols for _ in prefixes]
    for idx, cells in timeline:
        col = idx - first_idx
        for p, (h, m) in cells.items():
            r = row_of.get(p, other_row)
            lookups[r][col] += h + m
            misses[r][col] += m

    by_subnet: dict[str, int] = {}
    for (_, s), (h, m) in pairs.items():
        by_subnet[s] = by_subnet.get(s, 0) + h + m
    ranked = sorted(by_subnet, key=lambda s: (-by_subnet[s], s))
    subnets = _rows(ranked, set(by_subnet), MAX_SUBNETS)
    col_of = {s: i for i, s in enumerate(subnets)}
    other_col = col_of.get(OTHER, 0)
    c_lookups = [[0] * len(subnets) for _ in prefixes]
    c_misses = [[0] * len(subnets) for _ in prefixes]
    for (p, s), (h, m) in pairs.items():
        r, c = row_of.get(p, other_row), col_of.get(s, other_col)
        c_lookups[r][c] += h + m
        c_misses[r][c] += m
    return HeatmapData(cache, window_s, stats.bucket_s, prefixes,
                       [(first_idx + i) * bucket_ns for i in range(n_cols)],
                       lookups, misses, subnets, c_lookups, c_misses)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    return f"{s / 3600:.1f} h"


def figure(data: list[HeatmapData], clock: WallClock | None = None):
    """A matplotlib Figure: per cache, look-ups/s and miss ratio by prefix x
    time, and misses by prefix x client subnet; each with its colour bar."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    clock = clock or WallClock()
    n = max(1, len(data))
    tallest = max([len(d.prefixes) for d in data] + [4])
    fig = Figure(figsize=(18, n * (2.4 + 0.3 * tallest)), layout="constrained")
    FigureCanvasAgg(fig)  # Agg: no display, no global backend switch
    axes = fig.subplots(n, 3, squeeze=False, width_ratios=[5, 5, 3])
    for d, row in zip(data, axes):
        rows = d.prefixes or ["(none)"]
        stamps = [time.strftime("%H:%M:%S", time.localtime(clock.to_wall_ns(t) / 1e9))
                  for t in d.bucket_starts_ns]
        step = max(1, len(stamps) // 8)
        end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
            clock.to_wall_ns(d.bucket_starts_ns[-1] + int(d.bucket_s * 1e9)) / 1e9))
        panels = (
            (np.array(d.rate, dtype=float), "look-ups/s", "viridis", None,
             f"{d.cache}: look-ups per second, last {_duration(d.window_s)} to {end}"),
            (np.ma.masked_invalid(np.array(d.miss_ratio, dtype=float)), "miss ratio", "magma_r", (0, 1),
             f"{d.cache}: miss ratio per {_duration(d.bucket_s)} bucket (blank: no look-ups)"),
        )
        for ax, (matrix, label, cmap, lim, title) in zip(row[:2], panels):
            img = ax.imshow(matrix.reshape(len(d.prefixes), -1) if d.prefixes
                            else np.zeros((1, len(stamps))), aspect="auto", cmap=cmap,
                            interpolation="nearest",
                            vmin=lim[0] if lim else None, vmax=lim[1] if lim else None)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel(f"time (bucket start, {_duration(d.bucket_s)} buckets)")
            ax.set_ylabel("key prefix")
            ax.set_yticks(range(len(rows)), rows, fontsize=7)
            ax.set_xticks(range(0, len(stamps), step), stamps[::step], rotation=45, fontsize=7)
            fig.colorbar(img, ax=ax, label=label)
        ax = row[2]
        img = ax.imshow(np.array(d.client_misses, dtype=float) if d.subnets else np.zeros((1, 1)),
                        aspect="auto", cmap="Reds", interpolation="nearest")
        ax.set_title(f"{d.cache}: misses by client subnet (since start)", fontsize=9)
        ax.set_xlabel("client subnet")
        ax.set_ylabel("key prefix")
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_xticks(range(len(d.subnets or ["(none)"])), d.subnets or ["(none)"], rotation=45,
                      ha="right", fontsize=7)
        fig.colorbar(img, ax=ax, label="misses")
    return fig


def render_png(stats: CacheStats, path, window: float | None = None,
               end_ns: int | None = None, clock: WallClock | None = None) -> list[HeatmapData]:
    """Write the heatmaps of every cache to path (a file name or a binary file
    object) as PNG; returns what was drawn.
    window: seconds of history shown (default: all that is kept)."""
    data = [heatmap_data(stats, c, window, end_ns) for c in stats.caches()]
    if not data:  # nothing seen yet: still a valid, labelled picture
        data = [heatmap_data(stats, "(no look-ups yet)", window, end_ns)]
    fig = figure(data, clock)
    fig.savefig(path, format="png", dpi=100)
    return data


def _spark(ratios: list[float]) -> str:
    out = []
    for r in ratios:
        out.append("·" if math.isnan(r) else _SHADES[min(len(_SHADES) - 1, int(r * len(_SHADES)))])
    return "".join(out)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_text(stats: CacheStats, window: float | None = None, end_ns: int | None = None,
                width: int = TEXT_WIDTH) -> str:
    """Per cache: prefixes with look-ups, miss %, and a miss-ratio sparkline
    over time; then client subnets. Every line fits in ``width`` columns."""
    lines: list[str] = []
    spark_w = width - 42
    for cache in stats.caches():
        d = heatmap_data(stats, cache, window, end_ns)
        counts = stats.prefix_counts(cache)
        hits = sum(h for h, _ in counts.values())
        misses = sum(m for _, m in counts.values())
        total = hits + misses
        lines.append(_fit(
            f"{cache}: {total:,} look-ups, {100 * misses / total if total else 0:.1f}% misses; "
            f"last {_duration(d.window_s)}, {_duration(d.bucket_s)} buckets", width))
        lines.append(f"{'key prefix':<20} {'look-ups':>10} {'miss%':>6}  "
                     + _fit("miss ratio per bucket, old→new (▁ 0% … █ 100%, · none)", spark_w))
        shown = {p: counts.get(p, (0, 0)) for p in d.prefixes if p != OTHER}
        if OTHER in d.prefixes:  # folded, and prefixes past MAX_ROWS
            shown[OTHER] = (hits - sum(h for h, _ in shown.values()),
                            misses - sum(m for _, m in shown.values()))
        for i, prefix in enumerate(d.prefixes):
            h, m = shown[prefix]
            ratios = d.miss_ratio[i][-spark_w:]
            lines.append(f"{_fit(prefix, 20):<20} {h + m:>10,} "
                         f"{100 * m / (h + m) if h + m else 0:>5.1f}%  {_spark(ratios)}")
        lines.append(f"{'client subnet':<20} {'look-ups':>10} {'miss%':>6}  "
                     + _fit("most missed prefixes", spark_w))
        for j, subnet in enumerate(d.subnets):
            n = sum(row[j] for row in d.client_lookups)
            m = sum(row[j] for row in d.client_misses)
            worst = sorted(((d.client_misses[i][j], p) for i, p in enumerate(d.prefixes)
                            if d.client_misses[i][j]), reverse=True)[:4]
            detail = ", ".join(f"{p} {k:,}" for k, p in worst) or "-"
            lines.append(f"{_fit(subnet, 20):<20} {n:>10,} {100 * m / n if n else 0:>5.1f}%  "
                         + _fit(detail, spark_w))
        lines.append("")
    if not lines:
        return "no cache look-ups seen yet\n"
    return "\n".join(lines)
