"""The engine-facing marker API.

An inference engine calls these to name its requests, stages and cache
look-ups. Each call goes through libsitsprobe_markers.so (built from
markers.c on first import), whose functions are USDT probes: a nop until the
agent attaches, so they cost next to nothing when no agent listens. On CUDA a
range is also an NVTX range of the same name. Importing this module imports
neither bcc nor torch.

    from sitsprobe import markers
    with markers.request(req_id, sock_fd, model="tiny-gpt"):
        with markers.range("prefill", request_id=req_id):
            ...
        with markers.range("decode", batch_id=b, request_ids=ids):
            ...
        markers.cache_get("prefix", key, hit, request_id=req_id)
        markers.usage(req_id, input_tokens=12, output_tokens=30, kv_bytes=1 << 20)

Without a C compiler or sys/sdt.h the calls are Python no-ops (one warning
says what is missing); NVTX ranges still work. ``SITSPROBE_MARKERS=off`` in
the environment when this module is first imported turns every call into a
no-op and loads no library: the agent then sees the engine as it sees any
server, from the wire alone (how the reference engine's ``--no-markers``
compares the two).
"""
from __future__ import annotations

import ctypes as _ct
import os as _os
import sys as _sys
import warnings as _warnings

from . import _native

__all__ = ["request", "range", "cache_get", "usage"]


def _noop(*_args) -> None:
    pass


ENV_SWITCH = "SITSPROBE_MARKERS"  # "off": no markers at all
_off = _os.environ.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "false", "no")
_lib, _path, _why = (None, None, f"{ENV_SWITCH}=off") if _off else _native.load()
if _off:
    _request_begin = _request_end = _range_begin = _range_end = _noop
    _batch = _cache_get = _usage = _noop
elif _lib is None:
    _warnings.warn(f"sitsprobe.markers disabled: {_why}", RuntimeWarning, stacklevel=2)
    _request_begin = _request_end = _range_begin = _range_end = _noop
    _batch = _cache_get = _usage = _noop
else:
    _request_begin, _request_end = _lib.sitsprobe_request_begin, _lib.sitsprobe_request_end
    _range_begin, _range_end = _lib.sitsprobe_range_begin, _lib.sitsprobe_range_end
    _batch, _cache_get = _lib.sitsprobe_batch, _lib.sitsprobe_cache_get
    _usage = _lib.sitsprobe_usage


def library_path() -> str | None:
    """The loaded libsitsprobe_markers .so (what the agent attaches to), or None."""
    return str(_path) if _path is not None else None


# The library is called without argtypes (see _native.FUNCTIONS): an int that
# fits in a C int goes as it is, anything wider as a c_uint64. Inline checks
# `x.__class__ is int and _LO <= x < _HI` keep the common case to a compare.
_LO, _HI = -(1 << 31), 1 << 31


def _wide(x) -> _ct.c_uint64:
    """An id or count too wide for a C int (or not an int), as 64 bits."""
    return _ct.c_uint64(x.__index__() & 0xFFFF_FFFF_FFFF_FFFF)


def _u64(x):
    return x if x.__class__ is int and _LO <= x < _HI else _wide(x)


_names: dict[str, bytes] = {}  # stage, cache and model names, encoded once


def _encode(name: str) -> bytes:
    raw = name.encode()
    if len(_names) < 4096:  # names repeat; anything else must not grow this forever
        _names[name] = raw
    return raw


_modules = _sys.modules
_nvtx = False if _off else None  # torch.cuda.nvtx once torch is imported and has CUDA; False without


def _find_nvtx():
    """Decide once torch is imported; never import it here."""
    global _nvtx
    try:
        torch = _modules["torch"]
        _nvtx = torch.cuda.nvtx if torch.cuda.is_available() else False
    except (KeyError, AttributeError):  # not imported, or still being imported
        return None
    return _nvtx


class request:  # noqa: N801 (a context manager named like a function)
    """``with request(request_id, sock_fd, model=...)``: the engine serves this
    request, which arrived on socket ``sock_fd``."""

    __slots__ = ("_id", "_fd", "_model")

    def __init__(self, request_id: int, sock_fd: int, model: str = ""):
        self._id = _u64(request_id)
        self._fd = sock_fd if sock_fd.__class__ is int and _LO <= sock_fd < _HI else -1
        self._model = _names.get(model) or _encode(model)

    def __enter__(self):
        _request_begin(self._id, self._fd, self._model)
        return self

    def __exit__(self, *_exc) -> bool:
        _request_end(self._id)
        return False


class range:  # noqa: A001, N801 (the public name shadows the builtin in this module)
    """``with range(name, request_id=..., batch_id=..., request_ids=...)``: a
    named stage of one request, or of a batch serving ``request_ids``."""

    __slots__ = ("_id", "_batch_id", "_text", "_name", "_ids", "_nv")

    def __init__(self, name: str, request_id: int = 0, batch_id: int = 0, request_ids=()):
        self._id = request_id if request_id.__class__ is int and _LO <= request_id < _HI \
            else _wide(request_id)
        self._batch_id = batch_id if batch_id.__class__ is int and _LO <= batch_id < _HI \
            else _wide(batch_id)
        self._ids, self._text = request_ids, name
        self._name = _names.get(name) or _encode(name)

    def __enter__(self):
        if self._ids.__class__ is not tuple or self._ids:  # any iterable of ints: a list, an array
            ids = [int(i) & 0xFFFF_FFFF_FFFF_FFFF for i in self._ids]
            if ids:
                _batch(self._batch_id, (_ct.c_uint64 * len(ids))(*ids), len(ids))
        _range_begin(self._id, self._batch_id, self._name)
        nv = self._nv = _nvtx if _nvtx is not None else (
            _find_nvtx() if "torch" in _modules else None)
        if nv:
            nv.range_push(self._text)
        return self

    def __exit__(self, *_exc) -> bool:
        if self._nv:
            self._nv.range_pop()
        _range_end(self._id, self._batch_id, self._name)
        return False


def cache_get(cache: str, key: str | bytes, hit: bool, request_id: int = 0) -> None:
    """One look-up in the cache named ``cache``: its key and whether it hit."""
    raw = key if key.__class__ is bytes else (key.encode() if isinstance(key, str) else bytes(key))
    _cache_get(request_id if request_id.__class__ is int and _LO <= request_id < _HI
               else _wide(request_id),
               _names.get(cache) or _encode(cache), raw, len(raw), 1 if hit else 0)


def usage(request_id: int, input_tokens: int = 0, output_tokens: int = 0, kv_bytes: int = 0) -> None:
    """What the request consumed: tokens in and out, KV-cache bytes held."""
    _usage(_u64(request_id), _u64(input_tokens), _u64(output_tokens), _u64(kv_bytes))
