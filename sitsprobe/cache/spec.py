"""What a cache probe watches: a look-up function, where its key is, and how
its result tells a hit from a miss.

A spec comes from one item of the ``caches:`` configuration list::

    caches:
      - preset: redis                       # Redis lookupKey; any key below overrides
      - name: kv                            # a label value: [A-Za-z0-9_.:-], 1..64
        binary: /opt/engine/libkv.so        # a path, a program on $PATH, or a library name ("c")
        symbol: kv_get
        key: {arg: 1, read: ptr_len, length_arg: 2}   # read: cstr | ptr_len | redis_robj
        hit: {from: return, op: "!=", value: 0}        # from: return | arg0..arg5; deref: 0/1/2/4/8
        only_if: {arg: 3, mask: 12, equals: 0}         # count a call only if (arg & mask) == equals
        pid: -1                                        # -1: every process running the binary
      - name: engine
        process: {comms: [python3], cmdline: ['serve']}  # the executables of these processes
        symbol: prefix_cache_get
        key: {arg: 0, read: cstr}

Every problem is one ``ConfigError(source, key, expected, got)`` whose key is
the dotted path below ``key`` (``caches[1].key.arg``).
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..abi import CACHE_HIT_OPS, CACHE_KEY_KINDS, CACHE_SLOTS
from ..errors import ConfigError
from ..procs import Selector

MAX_ARG = 5  # x86-64 / arm64 register arguments a uprobe reads: arg0..arg5
KEY_READS = tuple(CACHE_KEY_KINDS)
HIT_OPS = tuple(CACHE_HIT_OPS)
DEREF_SIZES = (0, 1, 2, 4, 8)
MAX_CACHES = CACHE_SLOTS
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# Redis 7.0 src/server.h: lookupKey's flags. lookupKey (src/db.c) bumps
# stat_keyspace_hits/misses only when !(flags & (LOOKUP_NOSTATS | LOOKUP_WRITE)).
REDIS_LOOKUP_NOSTATS = 1 << 2
REDIS_LOOKUP_WRITE = 1 << 3


@dataclass(frozen=True, slots=True)
class KeyArg:
    arg: int  # which argument holds the key (0-based)
    read: str  # one of KEY_READS
    length_arg: int | None = None  # ptr_len: the argument holding the length


@dataclass(frozen=True, slots=True)
class HitRule:
    """Hit when (value op value_to_compare); value is the return value or an
    argument at entry, read through a pointer of ``deref`` bytes at return."""

    source: str = "return"  # "return" or "arg0".."arg5"
    op: str = "!="
    value: int = 0
    deref: int = 0

    @property
    def arg(self) -> int | None:
        return None if self.source == "return" else int(self.source[3:])


@dataclass(frozen=True, slots=True)
class ArgFilter:
    """Count a call only if (argument & mask) == equals; others are 'filtered'."""

    arg: int
    mask: int
    equals: int = 0


@dataclass(frozen=True, slots=True)
class CacheProbeSpec:
    name: str
    symbol: str
    key: KeyArg
    hit: HitRule = HitRule()
    binary: str | None = None  # path, program name on $PATH, or library name
    process: Selector | None = None  # or: the executables these processes run
    pid: int = -1  # -1: every process; else only this one
    only_if: ArgFilter | None = None

    @classmethod
    def from_dict(cls, d: Any, source: str, key: str = "caches[0]") -> "CacheProbeSpec":
        return _parse(d, source, key)


def _redis() -> dict:
    return {
        "name": "redis",
        "binary": "redis-server",
        "symbol": "lookupKey",  # robj *lookupKey(redisDb *db, robj *key, int flags)
        "key": {"arg": 1, "read": "redis_robj"},
        "hit": {"from": "return", "op": "!=", "value": 0},
        "only_if": {"arg": 2, "mask": REDIS_LOOKUP_NOSTATS | REDIS_LOOKUP_WRITE, "equals": 0},
    }


PRESETS = {"redis": _redis}


def redis_spec(binary: str = "redis-server", name: str = "redis") -> CacheProbeSpec:
    """The Redis preset: counts what INFO stats counts as keyspace_hits/misses."""
    return CacheProbeSpec.from_dict({"preset": "redis", "binary": binary, "name": name},
                                    "<preset>", "redis")


def specs_from_list(items: Any, source: str, key: str = "caches") -> tuple[CacheProbeSpec, ...]:
    """The whole ``caches:`` list: each item checked, names unique, at most MAX_CACHES."""
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ConfigError(source, key, "a list of cache probes", items)
    if len(items) > MAX_CACHES:
        raise ConfigError(source, key, f"at most {MAX_CACHES} cache probes", _Shown(f"{len(items)}"))
    specs, seen = [], set()
    for i, item in enumerate(items):
        spec = _parse(item, source, f"{key}[{i}]")
        if spec.name in seen:
            raise ConfigError(source, f"{key}[{i}].name", "a name no other cache probe has", spec.name)
        seen.add(spec.name)
        specs.append(spec)
    return tuple(specs)


# -- validation --------------------------------------------------------------


class _Shown(str):  # shown as is after "got"
    def __repr__(self) -> str:
        return str(self)


_TOP = ("preset", "name", "binary", "process", "pid", "symbol", "key", "hit", "only_if")
_KEY = ("arg", "read", "length_arg")
_HIT = ("from", "op", "value", "deref")
_FILTER = ("arg", "mask", "equals")
_PROCESS = ("pids", "comms", "cmdline")


def _mapping(v: Any, source: str, where: str, allowed: tuple[str, ...]) -> Mapping:
    if not isinstance(v, Mapping):
        raise ConfigError(source, where, "a mapping with keys " + ", ".join(allowed), v)
    for k in v:
        if k not in allowed:
            near = difflib.get_close_matches(str(k), allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(source, f"{where}.{k}", "one of: " + ", ".join(allowed) + hint,
                              _Shown("an unknown key"))
    return v


def _int(v: Any, source: str, where: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(source, where, f"an integer {lo}..{hi}", v)
    return v


def _arg(v: Any, source: str, where: str) -> int:
    return _int(v, source, where, 0, MAX_ARG)


def _str(v: Any, source: str, where: str, expected: str = "a non-empty string") -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(source, where, expected, v)
    return v


def _key(v: Any, source: str, where: str) -> KeyArg:
    d = _mapping(v, source, where, _KEY)
    if "arg" not in d or "read" not in d:
        raise ConfigError(source, where, "both arg (0..5) and read (" + ", ".join(KEY_READS) + ")",
                          dict(d))
    read = d["read"]
    if read not in KEY_READS:
        raise ConfigError(source, f"{where}.read", "one of: " + ", ".join(KEY_READS), read)
    arg = _arg(d["arg"], source, f"{where}.arg")
    length_arg = d.get("length_arg")
    if read == "ptr_len":
        if length_arg is None:
            raise ConfigError(source, f"{where}.length_arg",
                              "the argument (0..5) holding the key's length, for read: ptr_len")
        length_arg = _arg(length_arg, source, f"{where}.length_arg")
    elif length_arg is not None:
        raise ConfigError(source, f"{where}.length_arg", "no length_arg unless read is ptr_len",
                          length_arg)
    return KeyArg(arg, read, length_arg)


def _hit(v: Any, source: str, where: str) -> HitRule:
    d = _mapping(v, source, where, _HIT)
    src = d.get("from", "return")
    if src != "return" and not (isinstance(src, str) and re.fullmatch(rf"arg[0-{MAX_ARG}]", src)):
        raise ConfigError(source, f"{where}.from", f"return or arg0..arg{MAX_ARG}", src)
    op = d.get("op", "!=")
    if op not in HIT_OPS:
        raise ConfigError(source, f"{where}.op", "one of: " + " ".join(HIT_OPS), op)
    value = _int(d.get("value", 0), source, f"{where}.value", -(1 << 63), (1 << 63) - 1)
    deref = d.get("deref", 0)
    if deref not in DEREF_SIZES or isinstance(deref, bool):
        raise ConfigError(source, f"{where}.deref", "0, 1, 2, 4 or 8 (bytes read where the value points)",
                          deref)
    return HitRule(src, op, value, deref)


def _filter(v: Any, source: str, where: str) -> ArgFilter | None:
    if v is None:
        return None
    d = _mapping(v, source, where, _FILTER)
    if "arg" not in d or "mask" not in d:
        raise ConfigError(source, where, "arg (0..5) and mask (an integer), optionally equals", dict(d))
    arg = _arg(d["arg"], source, f"{where}.arg")
    mask = _int(d["mask"], source, f"{where}.mask", 0, (1 << 64) - 1)
    equals = _int(d.get("equals", 0), source, f"{where}.equals", 0, (1 << 64) - 1)
    if equals & ~mask:
        raise ConfigError(source, f"{where}.equals", f"bits inside mask {mask:#x}", equals)
    return ArgFilter(arg, mask, equals)


def _process(v: Any, source: str, where: str) -> Selector:
    d = _mapping(v, source, where, _PROCESS)
    out: dict[str, tuple] = {}
    for name in _PROCESS:
        items = d.get(name) or []
        if not isinstance(items, list):
            raise ConfigError(source, f"{where}.{name}", "a list", items)
        for i, x in enumerate(items):
            w = f"{where}.{name}[{i}]"
            if name == "pids":
                _int(x, source, w, 1, 1 << 22)
            elif name == "comms":
                if not isinstance(x, str) or not 1 <= len(x) <= 15:
                    raise ConfigError(source, w, "a string of 1..15 characters", x)
            else:
                _str(x, source, w, "a regular expression (string)")
                try:
                    re.compile(x)
                except re.error as e:
                    raise ConfigError(source, w, f"a valid regular expression ({e})", x) from None
        out[name] = tuple(items)
    sel = Selector(pids=out["pids"], comms=out["comms"], cmdline=out["cmdline"])
    if sel.empty():
        raise ConfigError(source, where, "at least one of pids, comms, cmdline", dict(d))
    return sel


def _parse(d: Any, source: str, where: str) -> CacheProbeSpec:
    d = dict(_mapping(d, source, where, _TOP))
    preset = d.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(source, f"{where}.preset", "one of: " + ", ".join(PRESETS), preset)
        base = PRESETS[preset]()
        if "process" in d or "binary" in d:  # the user names the target: it replaces the preset's
            base.pop("binary")
        d = {**base, **d}
    for required in ("name", "symbol", "key"):
        if required not in d:
            raise ConfigError(source, f"{where}.{required}",
                              "a value (or a preset: " + ", ".join(PRESETS) + ")")
    name = d["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(source, f"{where}.name", "1..64 of A-Z a-z 0-9 _ . : -", name)
    symbol = _str(d["symbol"], source, f"{where}.symbol", "a symbol name (string)")
    binary = d.get("binary")
    process = d.get("process")
    if (binary is None) == (process is None):
        raise ConfigError(source, f"{where}.binary",
                          "exactly one of binary (a path or library) and process (a selector)",
                          _Shown("both" if binary is not None else "neither"))
    if binary is not None:
        binary = _str(binary, source, f"{where}.binary", "a path, program or library name")
    else:
        process = _process(process, source, f"{where}.process")
    pid = d.get("pid", -1)
    if isinstance(pid, bool) or not isinstance(pid, int) or not (pid == -1 or pid >= 1):
        raise ConfigError(source, f"{where}.pid", "-1 (every process) or a process id >= 1", pid)
    key = _key(d["key"], source, f"{where}.key")
    hit = _hit(d.get("hit", {}), source, f"{where}.hit")
    only_if = _filter(d.get("only_if"), source, f"{where}.only_if")
    return CacheProbeSpec(name=name, symbol=symbol, key=key, hit=hit, binary=binary,
                          process=process, pid=pid, only_if=only_if)
