"""What `sitsprobe run` traces: select.*, or with none of it, what the cache
probes name (`run --cache-probe redis` alone traces redis-server)."""
from __future__ import annotations

import shutil

from sitsprobe import config as cfg
from sitsprobe.agent import selector_of

LOOKUP = {"symbol": "lookup", "key": {"arg": 1, "read": "cstr"}}


def selector(probes, **select):
    overrides = {"cache.probes": probes, **{f"select.{k}": v for k, v in select.items()}}
    return selector_of(cfg.load(None, overrides))


def test_the_cache_probes_name_what_to_trace():
    s = selector(["redis", {"name": "kv", "binary": "/opt/kv/bin/kv-server-with-a-long-name", **LOOKUP},
                  {"name": "eng", "process": {"cmdline": ["serve\\.py"]}, **LOOKUP},
                  {"name": "one", "binary": "/usr/bin/python3", "pid": 4242, **LOOKUP}])
    redis = ("redis-server",) if shutil.which("redis-server") else ()  # a program on $PATH, or nothing
    assert s.comms == (*redis, "kv-server-with-")  # as /proc/PID/comm has it: 15 characters
    assert s.cmdline == ("serve\\.py",) and s.pids == (4242,)


def test_a_library_probe_names_no_process_and_select_wins():
    assert selector([{"name": "lib", "binary": "libkv.so.1", **LOOKUP}]).empty()
    s = selector(["redis"], ports=[8000])
    assert s.ports == (8000,) and s.comms == ()
