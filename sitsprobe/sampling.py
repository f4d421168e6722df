"""Bounded tail sampling: at most ``max_per_second`` traces a second, but never
an error, and the slowest few of what the limit would turn away."""
from __future__ import annotations

import heapq

from sitsprobe.request import Request

SECOND_NS = 1_000_000_000


class TraceSampler:
    """Decides which requests to export, one 1-second window at a time.

    While the window has budget, each offered request is exported at once.
    Past it, errors are still exported at once; of the rest, the
    ``keep_slowest`` slowest are held and released when the window ends, and
    the others are dropped. ``max_per_second <= 0`` exports everything.
    ``seen == exported + dropped + (requests held)``.
    """

    def __init__(self, max_per_second: int, keep_slowest: int) -> None:
        self.max_per_second = max_per_second
        self.keep_slowest = max(0, keep_slowest)
        self.seen = 0
        self.exported = 0
        self.dropped = 0
        self._window = -1  # now_ns // SECOND_NS of the current window
        self._budget = 0
        self._slowest: list[tuple[int, int, Request]] = []  # min-heap: (duration, seq, req)

    def offer(self, req: Request, now_ns: int) -> list[Request]:
        """The requests to export now: ``req`` or none, plus any a past window held."""
        out = self.flush(now_ns)
        self.seen += 1
        if self._budget > 0:
            self._budget -= 1
        elif self.max_per_second > 0 and not req.is_error:
            self._hold(req)
            return out
        self.exported += 1
        out.append(req)
        return out

    def _hold(self, req: Request) -> None:
        entry = (req.duration_ns, self.seen, req)  # seq breaks ties: never compares requests
        if len(self._slowest) < self.keep_slowest:
            heapq.heappush(self._slowest, entry)
            return
        self.dropped += 1  # req, or the quicker one it displaces
        if self._slowest and entry[0] > self._slowest[0][0]:
            heapq.heapreplace(self._slowest, entry)

    def flush(self, now_ns: int | None = None) -> list[Request]:
        """Release what a window that ended by ``now_ns`` holds (call it on a
        timer so held requests never wait for the next one); with no
        ``now_ns``, release everything held now (at shutdown)."""
        if now_ns is not None:
            window = now_ns // SECOND_NS
            if window <= self._window:
                return []
            self._window = window
            self._budget = self.max_per_second
        held = [req for _, _, req in self._slowest]
        self._slowest.clear()
        self.exported += len(held)
        return held
