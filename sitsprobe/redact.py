"""Query strings without their secrets: names are exported, values are not.

OpenTelemetry's HTTP conventions replace the values of a few known keys in
`url.query` with `REDACTED`. sitsprobe cannot know which names a server treats
as secret (`api_key`, `token`, a signature), so it redacts every value, and
keeps only those whose names `capture.keep_query_params` allows.
"""
from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = ["REDACTED", "redact_query", "redact_target"]

REDACTED = "REDACTED"
_SEPARATORS = re.compile(r"([&;])")  # the group keeps each separator in the split


def redact_query(query: str, keep: frozenset[str] = frozenset()) -> str:
    """`query` (what follows the `?`, no fragment) with every value replaced by
    REDACTED, except the values of parameters named in `keep`.

    Pairs are split on `&` and also on `;`, which some servers read as `&`: a
    kept value must not smuggle a parameter of its own. Names, separators and
    order stay as sent. A name is compared with `keep` decoded, as a server
    reads it (`api%5Fkey` is `api_key`, `+` is a space), and case-sensitively,
    as servers and OpenTelemetry match names. An empty value (`a=`) stays
    empty: there is nothing to hide. A name without `=` stays as is. The work
    is linear in the length of `query`, and no str makes it raise.
    """
    parts = _SEPARATORS.split(query)
    for i in range(0, len(parts), 2):  # odd indices hold the separators
        name, eq, value = parts[i].partition("=")
        if value and not (keep and unquote_plus(name) in keep):
            parts[i] = name + eq + REDACTED
    return "".join(parts)


def redact_target(target: str | None, keep: frozenset[str] = frozenset()) -> str | None:
    """A request target (`/path?query`) with its query redacted by
    `redact_query` and any `#fragment` dropped; None stays None."""
    if target is None:
        return None
    path, mark, query = target.partition("#")[0].partition("?")
    return path + mark + redact_query(query, keep)
