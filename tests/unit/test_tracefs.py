"""tracefs helpers on fixture trees: mount decisions, paths, leftovers."""
from __future__ import annotations

import os

from sitsprobe import tracefs

MOUNTINFO = """\
22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
30 22 0:12 / /sys/kernel/tracing rw,relatime - tracefs tracefs rw
31 22 0:7 / /sys/kernel/debug rw,relatime - debugfs debugfs rw
40 1 0:40 / /mnt/with\\040space rw - ext4 /dev/sda1 rw
"""


def proc(root, mountinfo: str):
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(mountinfo)


def test_mounts_parses_mountinfo(tmp_path):
    proc(tmp_path, MOUNTINFO)
    found = tracefs.mounts(str(tmp_path))
    assert found["/sys/kernel/tracing"] == "tracefs"
    assert found["/mnt/with space"] == "ext4"


def test_ensure_mounted_mounts_only_what_is_missing(tmp_path):
    proc(tmp_path, MOUNTINFO)
    calls = []
    done = tracefs.ensure_mounted(str(tmp_path), mount=lambda fs, at: calls.append((fs, at)))
    assert calls == [("bpf", str(tmp_path / "sys/fs/bpf"))]
    assert done == ["bpf on /sys/fs/bpf"]


def test_ensure_mounted_on_a_bare_node(tmp_path):
    proc(tmp_path, "22 1 0:21 / /sys rw - sysfs sysfs rw\n")
    calls = []
    tracefs.ensure_mounted(str(tmp_path), mount=lambda fs, at: calls.append(fs))
    assert calls == ["tracefs", "debugfs", "bpf"]


def test_tracefs_with_events_but_no_mountinfo_entry_is_left_alone(tmp_path):
    proc(tmp_path, "")
    (tmp_path / "sys/kernel/tracing/events").mkdir(parents=True)
    calls = []
    tracefs.ensure_mounted(str(tmp_path), mount=lambda fs, at: calls.append(fs))
    assert "tracefs" not in calls


def test_tracefs_path_falls_back_to_debugfs(tmp_path):
    assert tracefs.tracefs_path(str(tmp_path)) == str(tmp_path / "sys/kernel/tracing")
    (tmp_path / "sys/kernel/debug/tracing/events/tcp/tcp_sendmsg_locked").mkdir(parents=True)
    assert tracefs.tracefs_path(str(tmp_path)) == str(tmp_path / "sys/kernel/debug/tracing")
    assert tracefs.tracepoint_exists("tcp:tcp_sendmsg_locked", str(tmp_path))
    assert not tracefs.tracepoint_exists("tcp:tcp_probe", str(tmp_path))


def test_leftovers_finds_only_our_bcc_events(tmp_path):
    tracing = tmp_path / "sys/kernel/tracing"
    (tracing / "events").mkdir(parents=True)
    (tracing / "uprobe_events").write_text(
        "p:uprobes/p__usr_lib_libc_so_6_0x9a0_bcc_4242 /usr/lib/libc.so.6:0x9a0\n"
        "p:uprobes/p__usr_lib_libc_so_6_0x9a0_bcc_777 /usr/lib/libc.so.6:0x9a0\n"
        "p:uprobes/someone_elses /bin/true:0x10\n")
    found = tracefs.leftovers(4242, root=str(tmp_path))
    assert found == ["p:uprobes/p__usr_lib_libc_so_6_0x9a0_bcc_4242 /usr/lib/libc.so.6:0x9a0"]
    assert tracefs.leftovers(1, root=str(tmp_path)) == []


def test_bpf_fds(tmp_path):
    fd = tmp_path / "proc/99/fd"
    fd.mkdir(parents=True)
    os.symlink("anon_inode:bpf-prog", fd / "3")
    os.symlink("anon_inode:[perf_event]", fd / "4")
    os.symlink("/dev/null", fd / "5")
    assert sorted(tracefs.bpf_fds(99, root=str(tmp_path))) == [
        "anon_inode:[perf_event]", "anon_inode:bpf-prog"]
