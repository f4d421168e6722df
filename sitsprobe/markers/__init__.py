"""The engine-facing marker API (a stub until the native library lands).

An inference engine calls these to name its requests, stages and cache
look-ups. They cost next to nothing when no agent listens. Importing this
module imports neither bcc nor torch.

    from sitsprobe import markers
    with markers.request(req_id, sock_fd, model="tiny-gpt"):
        with markers.range("prefill", request_id=req_id):
            ...
        with markers.range("decode", batch_id=b, request_ids=ids):
            ...
        markers.cache_get("prefix", key, hit, request_id=req_id)
        markers.usage(req_id, input_tokens=12, output_tokens=30, kv_bytes=1 << 20)
"""
from __future__ import annotations

from contextlib import contextmanager

__all__ = ["request", "range", "cache_get", "usage"]


@contextmanager
def request(request_id: int, sock_fd: int, model: str = ""):
    yield


@contextmanager
def range(name: str, request_id: int = 0, batch_id: int = 0, request_ids=()):  # noqa: A001
    yield


def cache_get(cache: str, key: str | bytes, hit: bool, request_id: int = 0) -> None:
    pass


def usage(request_id: int, input_tokens: int = 0, output_tokens: int = 0, kv_bytes: int = 0) -> None:
    pass
