"""The agent's recent requests, for ``sitsprobe report --agent URL``.

The agent is to add one :class:`RequestRecord` per request it stitches (every
one, before trace sampling: the report's exact P99 must see them all) and
serve :meth:`Recent.to_json` as ``/report/requests.json``. Bounded: the
oldest are dropped first, and counted, so a client knows the store no longer
covers a long window. Measured here: a record with five segments and five
stages holds about 1 KiB (its dicts mostly), so 100 000 of them about 100 MiB,
and the page for 100 000 is about 60 MB of JSON, built in about 1.4 s of one
core: ask for a window (``window_s``) where that matters.
"""
from __future__ import annotations

import json
import threading
from collections import deque

from .records import RequestRecord


class Recent:
    """The newest ``max_records`` records, safe to add to and read from any thread.

    Invariant: ``added == len(records()) + evicted``.
    """

    def __init__(self, max_records: int = 100_000) -> None:
        if max_records < 1:
            raise ValueError(f"max_records: expected an integer >= 1, got {max_records}")
        self._records: deque[RequestRecord] = deque(maxlen=max_records)
        self._lock = threading.Lock()
        self.added = 0
        self.evicted = 0

    def add(self, record: RequestRecord) -> None:
        with self._lock:
            if len(self._records) == self._records.maxlen:
                self.evicted += 1
            self._records.append(record)
            self.added += 1

    def records(self, window_s: float | None = None) -> list[RequestRecord]:
        """Every record held, oldest added first; with ``window_s``, those that
        ended in the last window_s seconds up to the newest end held."""
        return self._held(window_s)[0]

    def to_json(self, window_s: float | None = None) -> bytes:
        """``{"requests": [record dicts], "evicted": N, "max_records": M,
        "complete_since_ns": T}``: the records of :meth:`records`, how many
        the store dropped, and from when it holds every request (the end of
        the oldest it holds; null while it has dropped none)."""
        held, evicted, since = self._held(window_s)
        body = {"requests": [r.to_dict() for r in held], "evicted": evicted,
                "max_records": self._records.maxlen, "complete_since_ns": since}
        return json.dumps(body, separators=(",", ":")).encode()

    def _held(self, window_s: float | None) -> tuple[list[RequestRecord], int, int | None]:
        with self._lock:
            held, evicted = list(self._records), self.evicted
        since = held[0].end_ns if evicted and held else None
        if window_s is not None and held:
            cutoff = max(r.end_ns for r in held) - round(window_s * 1e9)
            held = [r for r in held if r.end_ns >= cutoff]
        return held, evicted, since
