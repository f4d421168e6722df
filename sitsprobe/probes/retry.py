"""Loads the kernel refused for the moment, and when to try them again:
at once a few times (``soon``: a compile or a program load), then, where a
layer can go on without it (TLS, an engine's markers), a while later (``Retry``).

A signal that arrives while the verifier checks a program makes the load
return EAGAIN (libbpf tries five times; a profiler attaching to the agent
sends one every few milliseconds); memory or a resource short for a moment
give ENOMEM or EBUSY. bcc says such a failure with the errno's words at the
end of its message ("Failed to load BPF program b'ssl_leave': Resource
temporarily unavailable"). Those are worth another try; any other failure
(the verifier's verdict, a missing file system) stands.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("sitsprobe")

T = TypeVar("T")
SOON_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # soon's waits between tries: 1.55 s in all
FIRST_S, MOST_S = 30.0, 600.0  # Retry's first wait, and its longest: each is twice the last
_FOR_NOW = tuple(os.strerror(code) for code in (errno.EAGAIN, errno.EINTR, errno.ENOMEM, errno.EBUSY))


def refused_for_now(e: BaseException) -> bool:
    """Whether bcc's (or our) failure ``e`` is the kernel's refusal for the moment."""
    return str(e).endswith(_FOR_NOW)


def soon(attempt: Callable[[], T], what: str) -> T:
    """``attempt()``, tried again after each of SOON_S while the kernel refuses
    it for the moment; past the last, that refusal raised (and said)."""
    for wait in SOON_S:
        try:
            return attempt()
        except Exception as e:  # noqa: BLE001 (bcc raises Exception)
            if not refused_for_now(e):
                raise
            log.info("the kernel refused %s for the moment (%s); trying again in %.2f s", what, e, wait)
            time.sleep(wait)
    try:
        return attempt()
    except Exception as e:  # noqa: BLE001 (bcc raises Exception)
        if refused_for_now(e):
            log.warning("the kernel refused %s %d times over %.2f s (%s): it does while a signal is "
                        "pending for the thread that loads, as a profiler attaching to the agent sends",
                        what, len(SOON_S) + 1, sum(SOON_S), e)
        raise


class Retry:
    """When to try again: ``refused()`` at each refusal (the wait it set:
    FIRST_S, then twice the last, at most MOST_S), ``due()`` from then on."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next_wait = FIRST_S
        self.at = 0.0  # when the last refusal's wait ends (clock)

    def refused(self) -> float:
        wait, self._next_wait = self._next_wait, min(2 * self._next_wait, MOST_S)
        self.at = self._clock() + wait
        return wait

    def due(self) -> bool:
        return self._clock() >= self.at
