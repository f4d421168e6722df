"""Requests to report on: from a traces file or a running agent, then a time window.

A traces file is what ``--traces-file`` (or the Collector's file exporter)
writes: one OTLP/JSON ExportTraceServiceRequest per line. Each SERVER span
becomes a :class:`RequestRecord`; its child spans (engine stages, cache
look-ups), in whatever line they are, become its stages. A line that is not
such a request (garbage, a line cut short by a full disk or a kill) is
counted and skipped, never fatal; so is a span without times.
"""
from __future__ import annotations

import io
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TextIO

from ..errors import SitsprobeError
from .records import SPAN_KIND_SERVER, Children, RequestRecord

MAX_PROBLEMS = 5  # skipped lines described; the rest only counted
AGENT_PAGE = "/report/requests.json"


@dataclass
class Loaded:
    """What a source gave: the records and what was left out, and why."""

    source: str
    records: list[RequestRecord] = field(default_factory=list)
    lines: int = 0  # non-blank lines read (agent: 0)
    skipped: int = 0  # lines (agent: records) that were not what they should be
    spans: int = 0  # spans in the lines read
    bad_spans: int = 0  # server spans left out: no valid start and end times
    problems: list[str] = field(default_factory=list)  # the first MAX_PROBLEMS, "line 7: not JSON (...)"
    evicted: int = 0  # agent: records its bounded store had already dropped
    complete_since_ns: int | None = None  # agent, when it dropped some: it holds every request from here

    def skip(self, where: str, why: str) -> None:
        self.skipped += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{where}: {why}")


def read_traces(path: str, keep: Iterable[str] = ()) -> Loaded:
    """The requests in a traces file ("-": standard input)."""
    if path == "-":
        return parse_lines(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"),
                           "<stdin>", keep)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_lines(f, path, keep)
    except OSError as e:
        raise SitsprobeError(f"{path}: cannot read the traces file ({e.strerror or e}); "
                             "it is what `sitsprobe run --traces-file` writes") from None


def parse_lines(lines: Iterable[str] | TextIO, source: str, keep: Iterable[str] = ()) -> Loaded:
    """OTLP/JSON lines as records, in the order their server spans appear."""
    keep = tuple(keep)
    out = Loaded(source)
    index: dict[tuple[str, str], int] = {}  # (traceId, spanId) of a server span -> its record
    children: dict[tuple[str, str], Children] = {}  # (traceId, parentSpanId) -> the children so far
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        out.lines += 1
        line = line.rstrip("\r\n")
        try:
            doc = json.loads(line)
            spans = list(_spans(doc))
        except (ValueError, TypeError, AttributeError, RecursionError) as e:
            out.skip(f"line {lineno}", _why(e))
            continue
        for span in spans:
            out.spans += 1
            trace_id, span_id = span.get("traceId"), span.get("spanId")
            if span.get("kind") == SPAN_KIND_SERVER:
                try:
                    rec = RequestRecord.from_span(span, (), keep)
                except ValueError:
                    out.bad_spans += 1
                    continue
                if isinstance(trace_id, str) and isinstance(span_id, str):
                    index[(trace_id, span_id)] = len(out.records)
                out.records.append(rec)
            elif isinstance(trace_id, str) and isinstance(parent := span.get("parentSpanId"), str):
                children.setdefault((trace_id, parent), Children()).add(span, keep)
    for key, acc in children.items():
        i = index.get(key)
        if i is not None and acc:
            out.records[i] = acc.apply(out.records[i])
    return out


def _spans(doc: Any) -> Iterable[dict]:
    """The spans of one ExportTraceServiceRequest; TypeError if it is not one."""
    if not isinstance(doc, dict):
        raise TypeError(f"a JSON {type(doc).__name__}, not an ExportTraceServiceRequest object")
    for rs in _list(doc, "resourceSpans"):
        for ss in _list(rs, "scopeSpans"):
            for span in _list(ss, "spans"):
                if isinstance(span, dict):
                    yield span


def _list(obj: Any, key: str) -> list:
    v = obj.get(key, []) if isinstance(obj, dict) else None
    if not isinstance(v, list):
        raise TypeError(f"{key} is not a list")
    return v


def _why(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        if e.pos >= len(e.doc.rstrip()) and e.doc.lstrip().startswith(("{", "[")):
            return f"cut short (its JSON ends after {len(e.doc):,} characters)"
        return f"not JSON ({e.msg} at character {e.pos + 1:,})"
    if isinstance(e, RecursionError):
        return "JSON nested too deep"
    return f"not an OTLP/JSON ExportTraceServiceRequest ({e})"


# -- a running agent ------------------------------------------------------------

def fetch_agent(url: str, window_s: float | None = None, timeout: float = 30) -> Loaded:
    """The recent requests a running agent holds (``URL/report/requests.json``,
    ``{"requests": [record, ...], "evicted": N}``, see :mod:`.recent`), those
    of the last ``window_s`` seconds where given. Its records keep the
    attributes the agent's own configuration names for its windows."""
    import urllib.error
    import urllib.request
    page = url.rstrip("/") + AGENT_PAGE + (f"?window_s={window_s:g}" if window_s else "")
    try:
        with urllib.request.urlopen(page, timeout=timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        hint = "; is the agent older than this command?" if e.code == 404 else ""
        raise SitsprobeError(f"{page}: HTTP {e.code}{hint}") from None
    except OSError as e:
        raise SitsprobeError(f"cannot reach the agent at {url}: {e}; start it with "
                             "`sitsprobe run` (metrics.port must not be 0)") from None
    return parse_agent(body, url)


def parse_agent(body: bytes, source: str) -> Loaded:
    out = Loaded(source)
    try:
        doc = json.loads(body)
        items = doc["requests"]
        if not isinstance(items, list):
            raise TypeError("requests is not a list")
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise SitsprobeError(f"{source}{AGENT_PAGE}: not a report page ({_why(e)})") from None
    evicted, since = doc.get("evicted", 0), doc.get("complete_since_ns")
    out.evicted = evicted if isinstance(evicted, int) and not isinstance(evicted, bool) else 0
    if out.evicted and isinstance(since, int) and not isinstance(since, bool):
        out.complete_since_ns = since
    for i, d in enumerate(items):
        try:
            out.records.append(RequestRecord.from_dict(d))
        except (TypeError, ValueError) as e:
            out.skip(f"record {i}", str(e))
    return out


# -- the time window --------------------------------------------------------------

@dataclass(frozen=True)
class TimeWindow:
    """The span of time a report covers, in the records' clock (ns)."""

    start_ns: int
    end_ns: int
    explicit: bool  # given (--since/--until/--last), not just where the records lie

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


def select(records: Sequence[RequestRecord], since_ns: int | None = None, until_ns: int | None = None,
           last_s: float | None = None) -> tuple[list[RequestRecord], TimeWindow | None]:
    """The records that ended within the window, and the window.

    ``last_s``: the last that many seconds up to the newest record's end
    (not the clock's now: a file read later reports the same). Else
    [since_ns, until_ns], either side open. With neither, every record, and
    the window is from the oldest start to the newest end (not explicit).
    None as the window: no records to place one.
    """
    if last_s is not None:
        if not records:
            return [], None
        until_ns = max(r.end_ns for r in records)
        since_ns = until_ns - round(last_s * 1e9)
    lo = -math.inf if since_ns is None else since_ns
    hi = math.inf if until_ns is None else until_ns
    kept = [r for r in records if lo <= r.end_ns <= hi]
    if since_ns is not None and until_ns is not None:
        return kept, TimeWindow(since_ns, until_ns, True)
    if not kept:
        return kept, None
    start = since_ns if since_ns is not None else min(r.start_ns for r in kept)
    end = until_ns if until_ns is not None else max(r.end_ns for r in kept)
    return kept, TimeWindow(start, end, since_ns is not None or until_ns is not None)


def covered(window: TimeWindow | None, loaded: Loaded) -> TimeWindow | None:
    """``window`` cut to where the source holds every request: an agent that
    dropped older records cannot speak for the time before its oldest, and a
    rate over that time would read too low."""
    since = loaded.complete_since_ns
    if window is None or since is None or window.start_ns >= since:
        return window
    return TimeWindow(min(since, window.end_ns), window.end_ns, window.explicit)


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h|d)?")
_UNIT_S = {None: 1, "ms": 1e-3, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds from "90s", "5m", "1.5h", "2d", "250ms" or a plain number of seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not m or (seconds := float(m.group(1)) * _UNIT_S[m.group(2)]) <= 0 or not math.isfinite(seconds):
        raise SitsprobeError(f"--last: expected a positive duration such as 90s, 5m, 1.5h or 2d, "
                             f"got {text!r}")
    return seconds


def parse_time(text: str, option: str) -> int:
    """Unix-epoch ns from ISO 8601 ("2026-05-09T07:35:00Z"; no offset: UTC)
    or a number of Unix seconds."""
    t = text.strip()
    try:
        seconds = float(t)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return round(seconds * 1e9)
    try:
        when = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except ValueError:
        raise SitsprobeError(f"{option}: expected an ISO 8601 time (2026-05-09T07:35:00Z; "
                             f"no offset means UTC) or Unix seconds, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delta = when - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
