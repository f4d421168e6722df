"""Where `sitsprobe top` gets its numbers: the agent's /metrics page, and
its /alerts.json when it serves one, scraped over HTTP."""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

from ..errors import SitsprobeError
from .model import AlertRow, Snapshot, View, diff, parse, parse_alerts

Fetch = Callable[[str], str]  # URL -> body; raises OSError (urllib's errors are OSErrors)


class ScrapeError(SitsprobeError):
    """The agent could not be reached, or its page could not be read."""


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Source:
    """Scrapes an agent and diffs each scrape against the one before."""

    def __init__(self, url: str, fetch: Fetch = http_get, clock: Callable[[], float] = time.time):
        self.url = (url if "://" in url else "http://" + url).rstrip("/").removesuffix("/metrics")
        self._fetch, self._clock = fetch, clock
        self._prev: Snapshot | None = None

    def view(self) -> View | None:
        """The view since the previous scrape; None after the first one (or a clock step).
        Raises ScrapeError, and keeps the previous scrape to diff against."""
        url = self.url + "/metrics"
        try:
            page = self._fetch(url)
        except urllib.error.HTTPError as e:
            raise ScrapeError(f"cannot read {url}: HTTP {e.code} {e.reason}") from None
        except OSError as e:
            raise ScrapeError(f"cannot reach {url}: {getattr(e, 'reason', None) or e}") from None
        try:
            cur = parse(page, self._clock())
        except ValueError as e:
            raise ScrapeError(f"cannot parse {url}: {e}") from None
        prev, self._prev = self._prev, cur
        if prev is None or cur.at <= prev.at:  # the first scrape, or the clock stepped back
            return None
        return diff(prev, cur, cur.at - prev.at, self._alerts())

    def _alerts(self) -> list[AlertRow] | None:
        """/alerts.json, or None (the view then falls back to the collapse gauge)."""
        try:
            return parse_alerts(self._fetch(self.url + "/alerts.json"))
        except (OSError, ValueError):
            return None
