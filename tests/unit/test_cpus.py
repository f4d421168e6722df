"""cpus.usable: the CPUs this process may run on, at most its cgroup's CPU
quota (a container's limit), read as the kernel lays the files out."""
from __future__ import annotations

import os

from sitsprobe import cpus

AFFINITY = len(os.sched_getaffinity(0))


def tree(tmp_path, files: dict[str, str], cgroup: str):
    """A cgroup file system under tmp_path/cg, and a /proc/self/cgroup naming ``cgroup``."""
    for path, text in files.items():
        f = tmp_path / "cg" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "cgroup").write_text(cgroup)
    return str(tmp_path / "cg"), str(tmp_path / "self")


def test_a_v2_limit_of_one_cpu_is_one(tmp_path):
    root, me = tree(tmp_path, {"kubepods/pod1/agent/cpu.max": "100000 100000\n"}, "0::/kubepods/pod1/agent\n")
    assert cpus.usable(root, me) == 1


def test_a_fraction_of_a_cpu_above_one_rounds_up(tmp_path):
    root, me = tree(tmp_path, {"agent/cpu.max": "150000 100000\n"}, "0::/agent\n")
    assert cpus.usable(root, me) == min(AFFINITY, 2)


def test_no_limit_is_the_affinity(tmp_path):
    root, me = tree(tmp_path, {"agent/cpu.max": "max 100000\n"}, "0::/agent\n")
    assert cpus.usable(root, me) == AFFINITY
    assert cpus.usable(str(tmp_path / "nothing"), str(tmp_path / "nobody")) == AFFINITY  # nothing readable


def test_a_limit_set_above_the_process_s_cgroup_counts(tmp_path):
    root, me = tree(tmp_path, {"kubepods/cpu.max": "50000 100000\n", "kubepods/pod1/cpu.max": "max 100000\n",
                               "kubepods/pod1/agent/cpu.max": "400000 100000\n"}, "0::/kubepods/pod1/agent\n")
    assert cpus.usable(root, me) == 1


def test_a_container_s_own_cgroup_mounted_as_the_root(tmp_path):
    """/proc/self/cgroup may name the host's path while the container sees
    its own cgroup at the mount: the walk up finds the mount's own file."""
    root, me = tree(tmp_path, {"cpu.max": "100000 100000\n"}, "0::/kubepods/burstable/pod1/abc\n")
    assert cpus.usable(root, me) == 1


def test_cgroup_v1_quota(tmp_path):
    root, me = tree(tmp_path, {"cpu/docker/abc/cpu.cfs_quota_us": "100000\n",
                               "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
                               "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
                    "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpus.usable(root, me) == 1
    root, me = tree(tmp_path / "unlimited", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
                    "3:cpu,cpuacct:/\n")
    assert cpus.usable(root, me) == AFFINITY
