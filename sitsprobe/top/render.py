"""A View as lines of Rich markup, 80 columns wide: the same lines make the
Textual app's screen and the plain `--once` frame. Every label the agent
reports (process, model, cache, prefix, cause) is escaped."""
from __future__ import annotations

import time

from rich.markup import escape
from rich.text import Text

from .model import AlertRow, View, sort_http

WAITING = "waiting for a second scrape: rates need two"
GPU_OFF = "GPU sampling off (no NVIDIA driver here, or gpu.enabled: false; the agent's log says which)"
HELP = [
    "[b]keys[/b]  q quit   p pause/resume   s sort the HTTP rows   ? this help (any key returns)",
    "",
    "Every number is over the interval between two scrapes of the agent's /metrics",
    "(quantiles from histogram buckets, as histogram_quantile reads them).",
    "[b]HTTP by process[/b]: responses/s, the 5xx share, p50/p99 duration, first byte in",
    "  to last byte out, as the kernel saw them.",
    "[b]GenAI by model[/b]: requests/s, output tokens/s, time to first token and per output",
    "  token, and the latency segment that holds most of the slow tail's time.",
    "[b]Caches[/b]: look-ups/s, the miss share, the key prefix with the most misses.",
    "[b]GPU[/b]: busy share (and the signal it comes from), memory, power, the busiest",
    "  process; ALERT lines are utilization collapses the agent raised.",
    "STALE in the header: the agent stopped answering; the view is its last good scrape.",
]


def header(url: str, view: View | None, *, paused: bool = False, error: str | None = None) -> list[str]:
    first = f"[b]sitsprobe top[/b]  {escape(url)}"
    if view is not None:
        first += f"  {time.strftime('%H:%M:%S', time.gmtime(view.at))} UTC  over {view.seconds:.1f}s"
        if error:  # the agent stopped answering: what is shown is from before
            first += "  [b reverse]STALE[/b reverse]"
    if paused:
        first += "  [reverse]" + escape("[PAUSED]") + "[/reverse]"
    lines = [first]
    if view is not None:
        lost = f"lost {view.lost_total:.0f}"
        if view.lost_total:
            reasons = ", ".join(f"{escape(r)} {n:.0f}" for r, n in sorted(view.lost_by_reason.items()))
            lost = f"[b red]{lost} ({reasons})[/b red]"
        lines.append(f"processes {view.processes}  events {view.events_rate:.1f}/s  {lost}")
        spans = f"spans delivered {view.spans_rate:.1f}/s  dropped {sum(view.spans_dropped.values()):.0f}"
        if view.spans_dropped:
            reasons = ", ".join(f"{escape(r)} {n:.0f}" for r, n in sorted(view.spans_dropped.items()))
            spans = f"[b red]{spans} ({reasons})[/b red]"
        lines.append(spans)
    if error:
        lines.append(f"[b red]{escape(error)}[/b red]")
    return lines


def body(view: View | None, sort: str) -> list[str]:
    if view is None:
        return [WAITING]
    lines: list[str] = []
    for section in (_http(view, sort), _engine(view), _caches(view), _gpus(view)):
        if section:
            lines += [""] * bool(lines) + section
    return lines


def text(lines: list[str]) -> Text:
    return Text.from_markup("\n".join(lines))


def plain(lines: list[str]) -> str:
    return text(lines).plain


def _http(view: View, sort: str) -> list[str]:
    lines = [f"[b]{'HTTP by process':<28} {'req/s':>8} {'5xx':>7} {'p50':>9} {'p99':>9}[/b]"
             f"  sort: {sort}"]
    for r in sort_http(view.http, sort):
        pid = "" if not r.pids else f"[{r.pids[0]}]" if len(r.pids) == 1 else f" ({len(r.pids)} pids)"
        if r.pods:  # the agent knows their pods: those, not pids
            pid = f" {r.pods[0]}" if len(r.pods) == 1 else f" ({len(r.pods)} pods)"
        errors = _pct(r.error_ratio)
        if r.error_ratio:
            errors = f"[red]{errors:>7}[/red]"
        lines.append(f"{_cell(r.process + pid, 28)} {r.rate:>8.1f} {errors:>7} "
                     f"{_dur(r.p50):>9} {_dur(r.p99):>9}")
    return lines if view.http else [*lines, "no HTTP responses yet"]


def _engine(view: View) -> list[str]:
    """A line per engine process (with its prefix cache, when it has one), its
    models under it: the columns fit 80 with an 18-character model name."""
    head = (f"[b]{'GenAI by model':<20} {'req/s':>6} {'tok/s':>6} {'ttft p50/p99':>13}"
            f"  {'tpot p50/p99':>13}  slow tail[/b]")
    lines = [head]
    prefix = {r.process: r for r in view.prefix_caches}
    for proc in sorted({r.process for r in view.engine} | set(prefix)):
        line = escape(proc)
        if (c := prefix.get(proc)) is not None:
            hits = "no look-ups" if c.hits is None else f"{_pct(c.hits)} hits"
            line += f"  prefix cache {hits}, {_pct(c.hits_total)} since start"
        lines.append(line)
        for r in (r for r in view.engine if r.process == proc):
            slow = "-" if r.slow_segment is None else f"{escape(r.slow_segment[:10])} {r.slow_share:.0%}"
            lines.append(f"  {_cell(r.model or '(unnamed)', 18)} {_rate(r.rate):>6} "
                         f"{_rate(r.output_tokens_rate):>6} {_short(r.ttft_p50):>6} {_short(r.ttft_p99):>6}"
                         f"  {_short(r.tpot_p50):>6} {_short(r.tpot_p99):>6}  {slow}")
    if view.batch_mean is not None:
        lines.append(f"batches: {view.batch_mean:.2f} requests per step, {view.batch_rate:.1f} steps/s")
    return lines if len(lines) > 1 else [*lines, "no GenAI requests seen yet"]


def _caches(view: View) -> list[str]:
    if not view.caches:
        return []
    lines = [f"[b]{'Caches':<26} {'look-ups/s':>10} {'miss':>7}  most misses by key prefix[/b]"]
    for r in view.caches:
        top = "-" if r.top_miss_prefix is None else f"{_cell(r.top_miss_prefix, 20)} {r.top_miss_rate:.1f}/s"
        lines.append(f"{_cell(r.cache, 26)} {r.rate:>10.1f} {_pct(r.miss_ratio):>7}  {top}")
    return lines


def _gpus(view: View) -> list[str]:
    if not view.gpus and not view.alerts:
        return [GPU_OFF] if view.gpu_sampling is False else []
    lines = [f"[b]{'GPU':<3} {'busy':>5}  {'signal':<17} {'memory':>15} {'power':>7}  busiest process[/b]"]
    for g in view.gpus:
        busy = _pct(g.busy, 0)
        if g.collapsed:
            busy = f"[b red]{busy:>5}[/b red]"
        memory = "-" if g.memory_used is None or not g.memory_total else \
            f"{g.memory_used / 2**30:.1f}/{g.memory_total / 2**30:.1f} GiB"
        power = "-" if g.power is None else f"{g.power:.0f} W"
        top = "-" if g.top_process is None else \
            f"{_cell(f'{g.top_process[0]}[{g.top_process[1]}]', 16)} {g.top_process[2]:>4.0%}"
        lines.append(f"{_cell(g.gpu, 3)} {busy:>5}  {_cell(g.signal, 17)} {memory:>15} {power:>7}  {top}")
    return lines + [_alert(a, view.at) for a in view.alerts]


def _alert(a: AlertRow, now: float) -> str:
    parts = [f"ALERT GPU {escape(a.gpu)} {escape(a.cause)}"]
    if a.pid:
        parts.append(escape(f"{a.process}[{a.pid}]"))
    if a.busy_percent is not None and a.working_percent is not None:
        parts.append(f"busy {a.busy_percent:.0f}% vs working {a.working_percent:.0f}%")
    if a.demand is not None:
        parts.append(f"demand {a.demand:g}")
    if a.since_unix is not None:
        parts.append(f"for {max(0.0, now - a.since_unix):.0f}s")
    return "[b red]" + "  ".join(parts) + "[/b red]"


def _cell(s: str, width: int) -> str:
    """A label cut and padded to `width`, then escaped (padding first keeps columns)."""
    return escape(f"{s:<{width}.{width}}")


def _pct(ratio: float | None, digits: int = 1) -> str:
    return "-" if ratio is None else f"{ratio * 100:.{digits}f}%"


def _rate(per_second: float | None) -> str:
    """At most 6 characters below a million per second."""
    if per_second is None:
        return "-"
    return f"{per_second:.1f}" if per_second < 1000 else f"{per_second:.0f}"


def _short(seconds: float | None) -> str:
    """A duration in at most 6 characters (3 or 4 significant digits), for narrow columns."""
    if seconds is None or seconds < 1e-3:
        return _dur(seconds)  # "999µs"
    ms = seconds * 1e3
    if ms < 99.95:
        return f"{ms:.1f}ms"
    if ms < 999.5:
        return f"{ms:.0f}ms"
    if seconds < 9.995:
        return f"{seconds:.2f}s"
    return f"{seconds:.1f}s" if seconds < 99.95 else f"{seconds:.0f}s"


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    return f"{seconds * 1e3:.1f}ms" if seconds < 1 else f"{seconds:.2f}s"
