"""Key prefixes, not keys: what the agent exports in place of a raw key.

``user:1234:profile`` with delimiter ":" and segments=1 is ``user``. A key
with no delimiter is all key and no prefix, so it becomes NO_PREFIX rather
than leaking; with ``regex``, the first group (or the whole match) is the
prefix and a key that does not match is NO_MATCH. Raw keys leave only with
``export_raw_keys=True``. ``hash_keys=True`` replaces each label with the hex
of its 8-byte BLAKE2b digest (stable across agents and restarts).
"""
from __future__ import annotations

import hashlib
import re

NO_PREFIX = "(no prefix)"
NO_MATCH = "(no match)"
MAX_LABEL = 64  # characters kept of a prefix


class PrefixExtractor:
    def __init__(self, delimiter: str = ":", segments: int = 1, regex: str | None = None,
                 hash_keys: bool = False, export_raw_keys: bool = False):
        if not delimiter:
            raise ValueError("delimiter must be a non-empty string")
        if segments < 1:
            raise ValueError("segments must be >= 1")
        self.delimiter, self.segments = delimiter, segments
        self.regex = re.compile(regex) if regex else None
        self.hash_keys, self.export_raw_keys = hash_keys, export_raw_keys
        # the common case, cut from the bytes before decoding (ASCII never sits
        # inside a UTF-8 sequence, so the cut is the same)
        self._fast = (segments == 1 and self.regex is None and not export_raw_keys
                      and delimiter.isascii())
        self._delim_bytes = delimiter.encode() if self._fast else b""

    def __call__(self, key: bytes | str, truncated: bool = False) -> str:
        """The label of a key. ``truncated``: only the key's head was captured."""
        if self._fast and isinstance(key, bytes):
            cut = key.find(self._delim_bytes)
            if cut < 0:
                return NO_PREFIX
            label = key[:cut].decode("utf-8", "backslashreplace")
            if self.hash_keys:
                return hashlib.blake2b(label.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
            return label[:MAX_LABEL]
        text = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key
        if self.export_raw_keys:
            label = text + ("..." if truncated else "")
        elif self.regex is not None:
            m = self.regex.search(text)
            if m is None:
                return NO_MATCH
            label = m.group(1) if self.regex.groups else m.group(0)
            if label is None:
                return NO_MATCH
        elif self.segments == 1:
            label, sep, _ = text.partition(self.delimiter)
            if not sep:  # no delimiter: the key is all key
                return NO_PREFIX
        else:
            parts = text.split(self.delimiter, self.segments)
            if len(parts) == 1:  # no delimiter: the key is all key
                return NO_PREFIX
            label = self.delimiter.join(parts[: min(self.segments, len(parts) - 1)])
        if self.hash_keys:
            return hashlib.blake2b(label.encode("utf-8", "surrogateescape"), digest_size=8).hexdigest()
        return label[:MAX_LABEL]
