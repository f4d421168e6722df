"""How many CPUs this process can keep busy at once: those it may run on,
bounded by its cgroup's CPU quota (a container's CPU limit). Work split
across threads or processes (net.c's two compiles, its programs' verifying)
pays for itself only where there is a CPU for each part; under a one-CPU
limit the parts take turns and the split's own cost is all that is left."""
from __future__ import annotations

import math
import os
from collections.abc import Callable

from . import files


def usable(cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self") -> int:
    """The CPUs this process may run on (its affinity), at most its cgroup's
    quota rounded up (cgroup v2's cpu.max or v1's cpu.cfs_quota_us, of its
    cgroup and those above it). Never less than 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _quota(cgroup_root, proc_self)
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def _quota(root: str, proc_self: str) -> float | None:
    """The smallest quota / period over this process's cgroup and those
    above it, in CPUs (cgroup v2's cpu.max, else v1's cfs files); None where
    none is set or none can be read."""
    cgroups = files.text(os.path.join(proc_self, "cgroup")).splitlines()
    limits = []
    for directory in _dirs(root, cgroups, lambda controllers: controllers == ""):
        parts = files.text(os.path.join(directory, "cpu.max")).split()
        if len(parts) == 2:
            limits.append(_ratio(parts[0], parts[1]))
    for directory in _dirs(os.path.join(root, "cpu"), cgroups, lambda c: "cpu" in c.split(",")):
        limits.append(_ratio(files.text(os.path.join(directory, "cpu.cfs_quota_us")),
                             files.text(os.path.join(directory, "cpu.cfs_period_us"))))
    limits = [q for q in limits if q]
    return min(limits) if limits else None


def _dirs(mount: str, cgroups: list[str], is_it: Callable[[str], bool]) -> list[str]:
    """This process's directory in the hierarchy mounted at ``mount`` (the
    /proc/self/cgroup line whose controllers ``is_it``) and those above it.
    In a container the mount may be its own cgroup while the line names the
    host's path: the walk up reaches the mount's own files either way."""
    path = next((line.split(":", 2)[2].strip() for line in cgroups
                 if line.count(":") >= 2 and is_it(line.split(":", 2)[1])), None)
    if path is None:
        return []
    parts = [p for p in path.split("/") if p]
    return [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None
