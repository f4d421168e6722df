"""Optional Redis cache of whole greedy completions.

A request with temperature 0 is deterministic, so its completion is stored under a key
derived from the model identity, the prompt tokens and max_tokens, and a repeat is
served from Redis (a real GET over a socket, through redis-py). Redis being down makes
every look-up a miss, never a failed request.
"""
from __future__ import annotations

import hashlib
import json
import sys
import threading
from urllib.parse import urlsplit, urlunsplit

from sitsprobe import markers


class CompletionCache:
    PREFIX = "sitsprobe:completion:"

    def __init__(self, url: str, model_id: str, ttl_s: int = 3600):
        import redis  # only when asked for

        self.url, self.model_id, self.ttl_s = _redact(url), model_id, ttl_s
        self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self._lock = threading.Lock()
        self.hits = self.misses = self.errors = self.stores = 0

    def key(self, prompt: list[int], max_tokens: int) -> str:
        h = hashlib.sha256(f"{self.model_id}|{max_tokens}|".encode())
        h.update(b"".join(t.to_bytes(2, "little") for t in prompt))
        return h.hexdigest()[:32]

    def get(self, key: str, request_id: int) -> dict | None:
        """{"tokens": [...], "finish_reason": ...} on a hit, else None."""
        try:
            raw = self._redis.get(self.PREFIX + key)
            value = json.loads(raw) if raw is not None else None
            if value is not None and not _valid(value):
                raise ValueError(f"malformed value under {self.PREFIX + key}")
        except Exception as e:  # noqa: BLE001 - a cache must not fail the request
            self._count("errors")
            print(f"engine: redis GET failed ({self.url}): {e}", file=sys.stderr)
            value = None
        markers.cache_get("completion", key[:16], value is not None, request_id=request_id)
        self._count("hits" if value is not None else "misses")
        return value

    def put(self, key: str, tokens: list[int], finish_reason: str) -> None:
        value = json.dumps({"tokens": tokens, "finish_reason": finish_reason})
        try:
            self._redis.set(self.PREFIX + key, value, ex=self.ttl_s)
            self._count("stores")
        except Exception as e:  # noqa: BLE001
            self._count("errors")
            print(f"engine: redis SET failed ({self.url}): {e}", file=sys.stderr)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def stats(self) -> dict:
        with self._lock:
            return {"url": self.url, "hits": self.hits, "misses": self.misses,
                    "stores": self.stores, "errors": self.errors}


def _valid(value) -> bool:
    return isinstance(value, dict) and value.get("finish_reason") in ("stop", "length") \
        and isinstance(value.get("tokens"), list) and all(isinstance(t, int) and 0 <= t < 256 for t in value["tokens"])


def _redact(url: str) -> str:
    """The URL without its password, for stats and log lines."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
