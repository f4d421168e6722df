"""The cache probe's pure parts: -D settings, targets, comms, peers (no BPF)."""
import socket

import pytest

from sitsprobe.probes import cache as probe
from sitsprobe.request import Endpoint


def test_cflags():
    flags = probe.cflags(key_bytes=128, ring_buffer_mib=8, max_peers=1024, cpus=2)
    assert "-DCACHE_KEY_CAP=128" in flags and "-DCACHE_RING_PAGES=2048" in flags
    assert "-DCACHE_MAX_PEERS=1024" in flags
    assert "-DCACHE_WAKE_BYTES=1048576" in flags  # a quarter of 8 MiB between 2 CPUs
    assert flags[0].startswith("-I") and flags[0].endswith("_bpf")
    for bad in ({"key_bytes": 100}, {"ring_buffer_mib": 3}):
        with pytest.raises(ValueError):
            probe.cflags(**bad)


def test_resolve_binary_and_comms(tmp_path):
    assert probe.resolve_binary("/opt/x/redis-server") == "/opt/x/redis-server"
    assert probe.resolve_binary("redis-server", which=lambda n: "/usr/bin/" + n) == "/usr/bin/redis-server"
    assert probe.resolve_binary("c", which=lambda n: None) == "c"  # a library name: bcc resolves it
    real = tmp_path / "redis-check-rdb"
    real.write_text("")
    link = tmp_path / "redis-server"
    link.symlink_to(real.name)
    assert probe.comms_for(str(link)) == {"redis-server", "redis-check-rdb"}
    long = tmp_path / "a-very-long-program-name"
    long.write_text("")
    assert probe.comms_for(str(long)) == {"a-very-long-pro"}
    assert probe.comms_for("c") == set()  # a library name


def test_peer_addresses():
    v4 = socket.inet_pton(socket.AF_INET, "127.0.1.3") + b"\0" * 12
    assert probe._endpoint(probe.AF_INET, v4, 40000) == Endpoint("127.0.1.3", 40000)
    mapped = b"\0" * 10 + b"\xff\xff" + socket.inet_pton(socket.AF_INET, "10.0.0.9")
    assert probe._endpoint(probe.AF_INET6, mapped, 1) == Endpoint("10.0.0.9", 1)
    v6 = socket.inet_pton(socket.AF_INET6, "fd00::7")
    assert probe._endpoint(probe.AF_INET6, v6, 2) == Endpoint("fd00::7", 2)
    assert probe._endpoint(probe.AF_UNIX, b"\0" * 16, 0) == Endpoint("unix", 0)
    assert probe._endpoint(0, b"\0" * 16, 0) is None
