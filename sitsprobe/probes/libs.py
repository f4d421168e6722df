"""Shared libraries a process has mapped, found in /proc/PID/maps, for the
uprobes put on them (the CUDA runtime and driver, OpenSSL's libssl)."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MappedLibrary:
    """A library file some process has mapped."""

    kind: str  # which of the kinds asked for
    path: str  # as the process sees it (its mount namespace)
    dev: str  # st_dev as /proc/PID/maps prints it: one file, however reached
    inode: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.dev, self.inode)


def mapped_libraries(pid: int, kinds: dict[str, re.Pattern], needle: str,
                     proc: str = "/proc") -> list[MappedLibrary]:
    """The libraries pid maps whose file name matches one of ``kinds``
    (kind -> pattern); only lines containing ``needle`` are parsed (a big
    process has thousands of mappings: a thread-per-connection server, a
    stack each). Empty if it is gone."""
    try:
        with open(f"{proc}/{pid}/maps") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    found: dict[tuple[str, int], MappedLibrary] = {}
    for line in _lines_with(text, needle):
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith(" (deleted)"):
            continue
        path, inode = parts[5], int(parts[4])
        name = path.rsplit("/", 1)[-1]
        for kind, pattern in kinds.items():
            if pattern.match(name) and (parts[3], inode) not in found:
                found[(parts[3], inode)] = MappedLibrary(kind, path, parts[3], inode)
    return list(found.values())


def _lines_with(text: str, needle: str) -> list[str]:
    """The lines of ``text`` that contain ``needle``, found by str.find
    rather than by a Python loop over every line of a maps file that may
    hold a line per thread's stack."""
    out = []
    at = text.find(needle)
    while at != -1:
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        if end == -1:
            end = len(text)
        out.append(text[start:end])
        at = text.find(needle, end)
    return out
