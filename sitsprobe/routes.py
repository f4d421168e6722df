"""Low-cardinality route labels for metrics and span names.

A path becomes the first configured template it matches
(``/v1/models/{model}/infer``), else the path with id-like segments replaced
by ``{id}``. At most ``max_routes`` distinct labels are ever handed out.
"""
from __future__ import annotations

import string
from collections.abc import Iterable

CACHE_SIZE = 10_000  # paths remembered; the cache is cleared when full
OTHER = "other"  # the label past max_routes
UNKNOWN = "unknown"  # the label for no path at all

_HEX = string.hexdigits
_ID_CHARS = string.ascii_letters + string.digits + "-_"
_DIGITS = frozenset(string.digits)
_LETTERS = frozenset(string.ascii_letters)


def _is_uuid(s: str) -> bool:
    return (
        len(s) == 36
        and s.count("-") == 4
        and s[8] == s[13] == s[18] == s[23] == "-"
        and not s.replace("-", "").strip(_HEX)
    )


def _is_id(s: str) -> bool:
    """All digits, a UUID, 16+ hex digits, or 12+ of ``[A-Za-z0-9_-]`` mixing letters and digits."""
    if s.isascii() and s.isdigit():
        return True
    if len(s) < 12:
        return False
    # s.strip(chars) is empty exactly when every character of s is in chars
    return (
        (len(s) >= 16 and not s.strip(_HEX))
        or _is_uuid(s)
        or (not s.strip(_ID_CHARS) and not _DIGITS.isdisjoint(s) and not _LETTERS.isdisjoint(s))
    )


def _is_placeholder(segment: str) -> bool:
    return len(segment) > 2 and segment[0] == "{" and segment[-1] == "}"


class RouteMapper:
    """Maps request paths to route labels.

    Templates match segment-wise: ``{name}`` matches one non-empty segment,
    anything else must be equal; the first matching template wins and is
    always returned (templates do not count against ``max_routes``). Other
    labels past ``max_routes`` distinct ones become ``"other"``, each such
    call counted in ``overflowed``.
    """

    def __init__(
        self, templates: Iterable[str] = (), collapse_ids: bool = True, max_routes: int = 500
    ) -> None:
        # segment count -> [(template, segments with None for a {placeholder})]
        templates = list(templates)
        self._templates: dict[int, list[tuple[str, list[str | None]]]] = {}
        for template in templates:
            pattern = [None if _is_placeholder(s) else s for s in template.split("/")]
            self._templates.setdefault(len(pattern), []).append((template, pattern))
        self._fixed = frozenset(templates)
        self._collapse = collapse_ids
        self._max = max_routes
        self._seen: set[str] = set()
        self._cache: dict[str, str] = {}
        self.overflowed = 0

    def route(self, path: str | None) -> str:
        if path is None:
            return UNKNOWN
        label = self._cache.get(path)
        if label is None:
            label = self._label(path)
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[path] = label
        if label in self._seen or label in self._fixed:
            return label
        if len(self._seen) >= self._max:
            self.overflowed += 1
            return OTHER
        self._seen.add(label)
        return label

    def _label(self, path: str) -> str:
        if not path:
            return "/"
        segments = path.split("/")
        for template, pattern in self._templates.get(len(segments), ()):
            if all(s != "" if p is None else p == s for p, s in zip(pattern, segments)):
                return template
        if self._collapse:
            return "/".join("{id}" if _is_id(s) else s for s in segments)
        return path
