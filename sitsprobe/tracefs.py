"""The kernel file systems BPF needs, and proof that we left nothing in them.

bcc attaches tracepoints through tracefs (``events/<cat>/<name>/id``) and
falls back to writing ``uprobe_events``/``kprobe_events`` where the kernel has
no uprobe/kprobe PMU. A fresh node or pod may not have tracefs mounted.
"""
from __future__ import annotations

import ctypes
import os
from typing import Callable

TRACING, DEBUG, BPFFS = "/sys/kernel/tracing", "/sys/kernel/debug", "/sys/fs/bpf"
# (fstype, mount point), in mount order: the old tracefs path lives in debugfs
FILESYSTEMS = [("tracefs", TRACING), ("debugfs", DEBUG), ("bpf", BPFFS)]


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def mounts(root: str = "/") -> dict[str, str]:
    """Mount point -> file system type, from ``/proc/self/mountinfo``."""
    found = {}
    try:
        with open(_under(root, "/proc/self/mountinfo")) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                point = left.split()[4].replace("\\040", " ")
                found[point] = right.split()[0]
    except (OSError, IndexError):
        pass
    return found


def _mount(fstype: str, target: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(fstype.encode(), target.encode(), fstype.encode(), 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount -t {fstype} {fstype} {target}: {os.strerror(err)}")


def ensure_mounted(root: str = "/",
                   mount: Callable[[str, str], None] = _mount) -> list[str]:
    """Mount tracefs, debugfs and bpffs where missing; say what was mounted.

    Raises OSError naming the mount when it fails (not root, or a pod without
    CAP_SYS_ADMIN: mount them on the host or run the pod privileged).
    """
    present = mounts(root)
    done = []
    for fstype, point in FILESYSTEMS:
        if present.get(point) == fstype:
            continue
        if fstype == "tracefs" and os.path.isdir(_under(root, f"{point}/events")):
            continue  # tracefs without a mountinfo entry (automounted, or a fixture)
        mount(fstype, _under(root, point))
        done.append(f"{fstype} on {point}")
    return done


def tracefs_path(root: str = "/") -> str:
    """Where tracefs is: /sys/kernel/tracing, else the old debugfs path."""
    for path in (TRACING, f"{DEBUG}/tracing"):
        if os.path.isdir(_under(root, f"{path}/events")):
            return _under(root, path)
    return _under(root, TRACING)


def tracepoint_exists(name: str, root: str = "/") -> bool:
    """``"tcp:tcp_sendmsg_locked"`` -> whether tracefs lists it."""
    category, _, event = name.partition(":")
    return os.path.isdir(os.path.join(tracefs_path(root), "events", category, event))


def leftovers(pid: int | None = None, root: str = "/") -> list[str]:
    """Dynamic probe events bcc made for ``pid`` that are still registered.

    bcc 0.26 names the events it writes to ``{k,u}probe_events`` as
    ``<p|r>_<target>_bcc_<pid>``; with a uprobe/kprobe PMU it writes none.
    """
    tag = f"_bcc_{pid if pid is not None else os.getpid()}"
    found = []
    for name in ("uprobe_events", "kprobe_events"):
        try:
            with open(os.path.join(tracefs_path(root), name)) as f:
                found += [ln.strip() for ln in f if tag in ln.split(" ", 1)[0]]
        except OSError:
            pass
    return found


def bpf_fds(pid: int | str = "self", root: str = "/") -> list[str]:
    """Open BPF objects of a process: ``anon_inode:bpf-prog`` and the like."""
    fd_dir = _under(root, f"/proc/{pid}/fd")
    found = []
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("anon_inode:bpf") or target == "anon_inode:[perf_event]":
            found.append(target)
    return found
