"""CacheProbeSpec: the Redis preset, custom specs, and every error naming its key."""
import pytest

from sitsprobe.cache.spec import (MAX_CACHES, REDIS_LOOKUP_NOSTATS, REDIS_LOOKUP_WRITE,
                                  ArgFilter, CacheProbeSpec, HitRule, KeyArg, redis_spec,
                                  specs_from_list)
from sitsprobe.errors import ConfigError

SRC = "/etc/sitsprobe.yaml"


def test_redis_preset_counts_what_info_stats_counts():
    s = CacheProbeSpec.from_dict({"preset": "redis"}, SRC)
    assert (s.name, s.binary, s.symbol) == ("redis", "redis-server", "lookupKey")
    assert s.key == KeyArg(1, "redis_robj")  # lookupKey(redisDb *db, robj *key, int flags)
    assert s.hit == HitRule("return", "!=", 0)  # robj * != NULL
    # Redis 7.0 server.h: LOOKUP_NOSTATS (1<<2), LOOKUP_WRITE (1<<3)
    assert (REDIS_LOOKUP_NOSTATS, REDIS_LOOKUP_WRITE) == (4, 8)
    assert s.only_if == ArgFilter(2, 12, 0)
    assert s.pid == -1 and s.process is None
    assert redis_spec() == s


def test_preset_fields_are_overridable():
    s = CacheProbeSpec.from_dict({"preset": "redis", "name": "sessions",
                                  "binary": "/opt/redis/bin/redis-server", "pid": 42}, SRC)
    assert (s.name, s.binary, s.pid, s.symbol) == ("sessions", "/opt/redis/bin/redis-server", 42,
                                                    "lookupKey")
    p = CacheProbeSpec.from_dict({"preset": "redis", "process": {"comms": ["redis-server"]}}, SRC)
    assert p.binary is None and p.process.comms == ("redis-server",)


def test_custom_spec():
    s = CacheProbeSpec.from_dict({
        "name": "kv", "binary": "/opt/libkv.so", "symbol": "kv_get",
        "key": {"arg": 1, "read": "ptr_len", "length_arg": 2},
        "hit": {"from": "arg3", "op": ">=", "value": 1, "deref": 4},
        "only_if": {"arg": 4, "mask": 0xF0, "equals": 0x10},
    }, SRC)
    assert s.key == KeyArg(1, "ptr_len", 2)
    assert s.hit == HitRule("arg3", ">=", 1, 4) and s.hit.arg == 3
    assert s.only_if == ArgFilter(4, 0xF0, 0x10)
    c = CacheProbeSpec.from_dict({"name": "e", "process": {"cmdline": ["serve"]}, "symbol": "get",
                                  "key": {"arg": 0, "read": "cstr"}}, SRC)
    assert c.hit == HitRule() and c.only_if is None and c.process.cmdline == ("serve",)


def test_spec_is_frozen():
    with pytest.raises(AttributeError):
        redis_spec().name = "x"


BASE = {"name": "kv", "binary": "/b", "symbol": "get", "key": {"arg": 0, "read": "cstr"}}


@pytest.mark.parametrize("change, key, expected", [
    ({"symbol": ""}, "caches[3].symbol", "a symbol name"),
    ({"symbol": None}, "caches[3].symbol", "a symbol name"),
    ({"name": "has space"}, "caches[3].name", "1..64 of"),
    ({"key": {"arg": 6, "read": "cstr"}}, "caches[3].key.arg", "an integer 0..5"),
    ({"key": {"arg": True, "read": "cstr"}}, "caches[3].key.arg", "an integer 0..5"),
    ({"key": {"arg": 0, "read": "json"}}, "caches[3].key.read", "one of: cstr, ptr_len, redis_robj"),
    ({"key": {"arg": 0}}, "caches[3].key", "both arg"),
    ({"key": {"arg": 0, "read": "ptr_len"}}, "caches[3].key.length_arg", "holding the key's length"),
    ({"key": {"arg": 0, "read": "cstr", "length_arg": 1}}, "caches[3].key.length_arg",
     "no length_arg unless"),
    ({"key": {"arg": 0, "read": "cstr", "lenght": 1}}, "caches[3].key.lenght", "one of: arg"),
    ({"key": "arg0"}, "caches[3].key", "a mapping"),
    ({"hit": {"from": "arg9"}}, "caches[3].hit.from", "return or arg0..arg5"),
    ({"hit": {"op": "=~"}}, "caches[3].hit.op", "one of: !="),
    ({"hit": {"value": "0"}}, "caches[3].hit.value", "an integer"),
    ({"hit": {"deref": 3}}, "caches[3].hit.deref", "0, 1, 2, 4 or 8"),
    ({"only_if": {"arg": 2}}, "caches[3].only_if", "arg (0..5) and mask"),
    ({"only_if": {"arg": 2, "mask": -1}}, "caches[3].only_if.mask", "an integer 0.."),
    ({"only_if": {"arg": 2, "mask": 4, "equals": 8}}, "caches[3].only_if.equals", "bits inside mask"),
    ({"pid": 0}, "caches[3].pid", "-1 (every process)"),
    ({"process": {"comms": ["x"]}}, "caches[3].binary", "exactly one of binary"),
    ({"binary": None}, "caches[3].binary", "exactly one of binary"),
    ({"binary": None, "process": {}}, "caches[3].process", "at least one of"),
    ({"binary": None, "process": {"comms": ["a" * 16]}}, "caches[3].process.comms[0]", "1..15"),
    ({"binary": None, "process": {"cmdline": ["("]}}, "caches[3].process.cmdline[0]",
     "a valid regular expression"),
    ({"preset": "memcached"}, "caches[3].preset", "one of: redis"),
    ({"symbl": "x"}, "caches[3].symbl", "did you mean 'symbol'"),
])
def test_errors_name_source_key_and_expectation(change, key, expected):
    d = {**BASE, **change}
    with pytest.raises(ConfigError) as e:
        CacheProbeSpec.from_dict(d, SRC, key="caches[3]")
    assert e.value.source == SRC and e.value.key == key
    assert expected in e.value.expected
    assert str(e.value).startswith(f"{SRC}: {key}: expected ")


def test_missing_required_and_not_a_mapping():
    with pytest.raises(ConfigError) as e:
        CacheProbeSpec.from_dict({"name": "x", "binary": "/b", "key": {"arg": 0, "read": "cstr"}}, SRC)
    assert e.value.key == "caches[0].symbol"
    with pytest.raises(ConfigError) as e:
        CacheProbeSpec.from_dict(["redis"], SRC)
    assert e.value.key == "caches[0]" and e.value.got == ["redis"]


def test_list_checks_names_and_count():
    specs = specs_from_list([{"preset": "redis"}, {**BASE}], SRC)
    assert [s.name for s in specs] == ["redis", "kv"]
    assert specs_from_list(None, SRC) == ()
    with pytest.raises(ConfigError) as e:
        specs_from_list([{"preset": "redis"}, {"preset": "redis"}], SRC)
    assert e.value.key == "caches[1].name" and "no other cache probe" in e.value.expected
    with pytest.raises(ConfigError) as e:
        specs_from_list([{**BASE, "name": f"c{i}"} for i in range(MAX_CACHES + 1)], SRC)
    assert e.value.key == "caches" and f"at most {MAX_CACHES}" in e.value.expected
    with pytest.raises(ConfigError) as e:
        specs_from_list({"preset": "redis"}, SRC)
    assert e.value.key == "caches"
