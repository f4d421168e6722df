"""Loads the kernel refused for the moment, and when to try them again.

A signal that arrives while the verifier checks a program makes the load
return EAGAIN (libbpf tries five times; a profiler attaching to the agent
sends one every few milliseconds); memory or a resource short for a moment
give ENOMEM or EBUSY. bcc says such a failure with the errno's words at the
end of its message ("Failed to load BPF program b'ssl_leave': Resource
temporarily unavailable"). Those are worth another try a while later; any
other failure (the verifier's verdict, a missing file system) stands.
"""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

FIRST_S, MOST_S = 30.0, 600.0  # the first wait, and the longest: each is twice the last
_FOR_NOW = tuple(os.strerror(code) for code in (errno.EAGAIN, errno.EINTR, errno.ENOMEM, errno.EBUSY))


def refused_for_now(e: BaseException) -> bool:
    """Whether bcc's (or our) failure ``e`` is the kernel's refusal for the moment."""
    return str(e).endswith(_FOR_NOW)


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
