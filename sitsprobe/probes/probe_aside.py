"""The kernel probed in a child process while a start compiles net.c.

The capability probe (probes.capability: a compile, attaching, firing and
detaching, half a second) decides net.c's flags, and net.c's compile (2.4 s)
is most of a start. So a start compiles for a guess while ``ProbeAside``
probes in a child; the guess is what the last probe of this boot found
(kept in ``GUESSES``), else every hook working. Only the probe decides the
plan: a wrong guess costs a second compile, never a wrong hook.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys

from . import child
from .capability import KINDS, Capability, btf_capability, probe_all

log = logging.getLogger("sitsprobe")
GUESSES = "/run/sitsprobe/capabilities.json"  # tmpfs: gone at the next boot, or with the container
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _kinds(groups: tuple[str, ...]) -> list[str]:
    return [k for g in groups for k in KINDS[g]]


def _boot() -> str:
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def guess(groups: tuple[str, ...], path: str | None = None) -> dict[str, Capability]:
    """What probe_all(only=groups) said last on this boot, kind by kind; a
    kind not probed yet, as working."""
    saved = _saved(path or GUESSES)
    return {"btf": btf_capability()} | {k: saved.get(k) or Capability(k, True, "assumed, not yet probed")
                                        for k in _kinds(groups)}


def _saved(path: str) -> dict[str, Capability]:
    """This boot's kept capabilities, by kind (none if unreadable or of another boot)."""
    try:
        with open(path) as f:
            saved = json.load(f)
        if saved["boot"] == _boot() != "":
            return {k: Capability(**v) for k, v in saved["caps"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return {}


def remember(caps: dict[str, Capability], path: str | None = None) -> None:
    """Keep what a probe found as the next start's guess (beside what earlier
    probes of this boot found of other groups); where it cannot be written,
    the next start guesses every hook working."""
    path = path or GUESSES
    kept = _saved(path) | caps
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.{os.getpid()}", "w") as f:
            json.dump({"boot": _boot(), "caps": {k: dataclasses.asdict(c) for k, c in kept.items()}}, f)
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError as e:
        log.debug("capabilities not kept for the next start's guess: %s", e)


class ProbeAside:
    """probe_all(only=groups) in a child process. result() waits for it and
    keeps it as the next guess; if the child fails, the kernel is probed in
    this process instead, and the log says why."""

    def __init__(self, groups: tuple[str, ...] = ("main",), guesses: str | None = None) -> None:
        self.groups, self.guesses = groups, guesses
        self._child = child.start(__name__, *groups)

    def result(self, timeout_s: float = 60) -> dict[str, Capability]:
        try:
            out = child.answer(self._child, timeout_s)
            caps = {k: Capability(**v) for k, v in json.loads(out.splitlines()[-1]).items()}
            remember(caps, self.guesses)
            return caps
        except child.ChildFailed as e:
            why = str(e)
        except (ValueError, TypeError, IndexError) as e:
            why = f"unreadable answer ({e})"
        log.warning("the kernel's capability probe failed in its child process (%s); probing here", why)
        return probe_all(only=self.groups)


def _report() -> None:
    """A ProbeAside's child: probe_all(only=argv) as JSON, the last line on stdout."""
    caps = probe_all(only=tuple(sys.argv[1:]))
    print(json.dumps({k: dataclasses.asdict(c) for k, c in caps.items()}))


if __name__ == "__main__":
    _report()
