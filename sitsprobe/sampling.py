"""Tail sampling within a CPU budget: every request is traced while tracing
costs the agent less than ``cpu_budget`` of a core. Past that, a bounded
sample goes out: every error, and the slowest few of the rest."""
from __future__ import annotations

import heapq
import math
import threading
import time

from sitsprobe.request import Request

SECOND_NS = 1_000_000_000
PRIOR_COST_S = 250e-6  # CPU seconds per exported trace, assumed until charged: a few spans at
#                       ~60 µs each with OTLP encoding; at 5 % of a core, 200 traces/s
FLOOR_PER_SECOND = 10  # with a CPU budget, no window gets fewer: a costly moment never stops tracing
DECAY = 0.9  # the cost estimate's weight of a window, per window since: about 10 s of memory,
#              so a sink that sends in lumps (a batch each second, or at 512 spans) averages out
CREDIT_WINDOWS = 5  # unspent CPU kept at most, in windows: absorbs charges that arrive in lumps
DEBT_WINDOWS = 10  # CPU owed at most, in windows: errors go out whatever they cost, and a storm
#                    of them must not starve tracing long after it ends

CPU_READ_EVERY = 8  # CpuMeter reads the thread's CPU clock for one piece of work in this many


class CpuMeter:
    """What a kind of work costs the thread that does it, charged to a
    budget (``charge``, CPU seconds) without reading the clock for every
    piece: time.thread_time is a system call (about 0.5 µs, two a piece of
    work, where a traced request is some 30 µs in all), so it is read for
    one piece in ``every``, the first included, and that one's CPU charged
    ``every``-fold: the same total on average, since which piece is read
    does not depend on what it costs.

        began = meter.start()
        ...the work...
        meter.stop(began)
    """

    def __init__(self, charge, every: int = CPU_READ_EVERY):
        self._charge = charge
        self._every = every
        self._left = 0  # pieces until the next one read

    def start(self) -> float | None:
        if self._left:
            self._left -= 1
            return None
        self._left = self._every - 1
        return time.thread_time()

    def stop(self, began: float | None) -> None:
        if began is not None:
            self._charge((time.thread_time() - began) * self._every)


class TraceSampler:
    """Decides which requests to export, one 1-second window at a time.

    Each window has a budget of traces. While it lasts, each offered request
    is exported at once. Past it, errors are still exported at once; of the
    rest, the ``keep_slowest`` slowest are held and released when the window
    ends, and the others are dropped.
    ``seen == exported + dropped + held``.

    Where the budget comes from:

    - ``cpu_budget > 0`` (a share of one core; 0.05 is 5 %). The agent tells
      the sampler what tracing costs, ``charge(cpu_seconds)``, and the sampler
      keeps ``cost_per_trace``: CPU charged per trace exported, over recent
      windows (each weighing ``DECAY`` times the one after it), starting from
      ``PRIOR_COST_S`` until the first charge arrives. A window's budget is
      ``floor((cpu_budget - debt) / cost_per_trace)`` traces, at least
      ``FLOOR_PER_SECOND`` and at most ``max_per_second`` when that is > 0.
    - ``cpu_budget == 0``: ``max_per_second`` traces, the budget before there
      was a CPU budget. Both 0: no budget, everything is exported.

    Debt. Each window allows ``cpu_budget`` CPU seconds; what a window is
    charged beyond that is owed (``debt``) and comes off the next windows'
    allowances until repaid. What a window leaves unspent is credit, kept up
    to ``CREDIT_WINDOWS`` windows' allowance, for charges that come late and
    in lumps; credit never raises a budget. Debt past ``DEBT_WINDOWS``
    windows' allowance (errors, held requests and the floor cost what they
    cost) is written off. So, over the windows settled so far:
    ``charged <= cpu_budget * seconds + debt + written_off``.
    """

    def __init__(self, max_per_second: int = 0, keep_slowest: int = 0, cpu_budget: float = 0.0) -> None:
        self.max_per_second = max(0, max_per_second)
        self.keep_slowest = max(0, keep_slowest)
        self.cpu_budget = max(0.0, cpu_budget)
        self.seen = 0
        self.exported = 0
        self.dropped = 0
        self.cpu_seconds = 0.0  # charged in all
        self.cost_per_trace = PRIOR_COST_S  # CPU seconds per exported trace, as estimated
        self.written_off = 0.0  # CPU seconds of debt forgiven past the cap
        self._window = -1  # now_ns // SECOND_NS of the current window
        self._slowest: list[tuple[int, int, Request]] = []  # min-heap: (duration, seq, req)
        self._lock = threading.Lock()  # charge() comes from any thread
        self._spent = 0.0  # charged since the current window began
        self._balance = 0.0  # CPU seconds: > 0 credit, < 0 debt
        self._cpu_weighted = 0.0  # the cost estimate's decayed sums: charges,
        self._traces_weighted = 0.0  # and the traces they paid for
        self._exported_mark = 0  # self.exported when the current window began
        self._budget: int | None = self._next_budget()  # this window's; None: no budget
        self._left = 0  # of it

    @property
    def budget_per_second(self) -> float:
        """Traces the current window may export at once (math.inf: no budget)."""
        return math.inf if self._budget is None else float(self._budget)

    @property
    def debt(self) -> float:
        """CPU seconds owed by past windows, coming off the next ones."""
        return max(0.0, -self._balance)

    @property
    def held(self) -> int:
        """Requests held now, to be released when the window ends."""
        return len(self._slowest)

    def charge(self, cpu_seconds: float) -> None:
        """Add CPU the agent spent on tracing: turning requests into spans
        and sending them, and stitching the requests the kernel sent only to
        be offered here. Call it from any thread. A negative or non-finite
        value is ignored."""
        if not cpu_seconds > 0 or not math.isfinite(cpu_seconds):
            return
        with self._lock:
            self._spent += cpu_seconds
            self.cpu_seconds += cpu_seconds

    def offer(self, req: Request, now_ns: int) -> list[Request]:
        """The requests to export now: ``req`` or none, plus any a past window held."""
        out = self.flush(now_ns)
        self.seen += 1
        if self._left > 0:
            self._left -= 1
        elif self._budget is not None and not req.is_error:
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
            self._begin(window)
        held = [req for _, _, req in self._slowest]
        self._slowest.clear()
        self.exported += len(held)
        return held

    def _begin(self, window: int) -> None:
        """Settle the windows since the last one began, then set this one's budget."""
        if self._window >= 0 and self.cpu_budget > 0:  # before the first window: charges go to it
            elapsed = window - self._window
            with self._lock:
                spent, self._spent = self._spent, 0.0
            traces = self.exported - self._exported_mark
            self._learn(spent, traces, elapsed)
            self._settle(spent, elapsed)
        self._exported_mark = self.exported
        self._window = window
        self._budget = self._next_budget()
        self._left = self._budget or 0

    def _learn(self, spent: float, traces: int, elapsed: int) -> None:
        decay = DECAY ** elapsed
        self._cpu_weighted = self._cpu_weighted * decay + spent
        self._traces_weighted = self._traces_weighted * decay + traces
        if self._cpu_weighted > 0 and self._traces_weighted > 0:  # else the last estimate (or the prior) stands
            self.cost_per_trace = self._cpu_weighted / self._traces_weighted

    def _settle(self, spent: float, elapsed: int) -> None:
        balance = min(self._balance + self.cpu_budget * elapsed - spent, self.cpu_budget * CREDIT_WINDOWS)
        lowest = -self.cpu_budget * DEBT_WINDOWS
        if balance < lowest:
            self.written_off += lowest - balance
            balance = lowest
        self._balance = balance

    def _next_budget(self) -> int | None:
        cap = self.max_per_second or None
        if self.cpu_budget <= 0 or self.cost_per_trace <= 0:  # no CPU budget, or tracing costs nothing
            return cap
        allowance = max(0.0, self.cpu_budget - self.debt)
        fits = min(allowance / self.cost_per_trace, 1e12) * (1 + 1e-9)  # no 199 from 199.99999999999997
        n = max(FLOOR_PER_SECOND, math.floor(fits))
        return n if cap is None else min(n, cap)
