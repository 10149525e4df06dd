"""How many CPUs this process may really use: the local Ray's size, and so every local actor's threads.

os.cpu_count() counts the machine's cores. In a container limited by `docker run --cpus 2` or a Kubernetes CPU
limit (a cgroup CPU quota), or a process pinned with taskset (the affinity mask), that many threads would
oversubscribe what the kernel lets the process run at once and be throttled.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def available_cpus(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """The affinity mask's CPUs, capped by the cgroup CPU quota (rounded down, at least 1)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return cpus


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """CPUs' worth of time per period the cgroup allows (quota / period), the tightest along the process's cgroup
    and its parents; None when unlimited or unknown. cgroup v2 (cpu.max) first, then v1 (cpu.cfs_quota_us)."""
    limits = [q for d in _cgroup_dirs(cgroup_root, proc_cgroup) if (q := _quota(d)) is not None]
    return min(limits) if limits else None


def _cgroup_dirs(cgroup_root: Path, proc_cgroup: Path) -> list[Path]:
    """The process's cgroup directories and their parents up to the root, for v2 and for v1's cpu controller."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    dirs = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2; on a hybrid system it is mounted at unified/
            base = cgroup_root / "unified" if (cgroup_root / "unified").is_dir() else cgroup_root
        elif "cpu" in controllers.split(","):
            base = next((cgroup_root / name for name in (controllers, "cpu", "cpu,cpuacct")
                         if (cgroup_root / name).is_dir()), cgroup_root / "cpu")
        else:
            continue
        here = base / path.lstrip("/")
        dirs += [here, *(p for p in here.parents if p.is_relative_to(base))]
    return dirs or [cgroup_root, cgroup_root / "cpu"]


def _quota(directory: Path) -> float | None:
    try:
        v2 = _read(directory / "cpu.max")
        if v2 is not None:
            quota, period = v2.split()
            return None if quota == "max" else int(quota) / int(period)
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        if quota is None or period is None or int(quota) <= 0:
            return None
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
