"""The CPUs this process may use: its CPU affinity, capped by its cgroups' CPU quota.

``os.cpu_count()`` counts the host's cores: a job given 8 CPUs of a 96-core machine (Slurm, a Kubernetes
limit, ``taskset``) would start 96 threads where 8 can run.

>>> available_cpus() >= 1
True
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from . import cgroups

QUOTA_SECONDS = 5.0  # the cgroup CPU quota is read again after this long (not at every batch: files to read)

_quota_read: tuple[float, tuple[Path, Path], float | None] | None = None  # (when, which files, quota)


def available_cpus() -> int:
    """The CPUs this process may run on: its CPU affinity, capped by its cgroups' CPU quota (v2
    ``cpu.max`` or v1 ``cpu.cfs_quota_us``, the process's cgroup and its ancestors), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def _cgroup_quota() -> float | None:
    """CPUs allowed by the CPU quotas of this process's cgroup and its ancestors (the smallest), or None
    when none sets one (or none can be read); read again once `QUOTA_SECONDS` have passed (a quota
    rarely changes, and the thread count is asked for at every batch: files read that often cost a Dask
    worker a share of its time)."""
    global _quota_read
    now, files = time.monotonic(), (cgroups.CGROUP_ROOT, cgroups.OWN_CGROUP)
    if _quota_read is None or _quota_read[1] != files or now - _quota_read[0] >= QUOTA_SECONDS:
        _quota_read = (now, files, _read_cgroup_quota())
    return _quota_read[2]


def _read_cgroup_quota() -> float | None:
    quotas = []
    for path in _cgroup_cpu_files():
        try:
            quota = _cpu_max(path) if path.name == "cpu.max" else _cfs_quota(path)
        except (OSError, ValueError, IndexError):
            continue
        if quota:
            quotas.append(quota)
    return min(quotas) if quotas else None


def _cgroup_cpu_files() -> list[Path]:
    """The quota files of this process's cgroup and its ancestors: v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``."""
    return [folder / ("cpu.max" if version == 2 else "cpu.cfs_quota_us")
            for folder, version in cgroups.cgroup_folders("cpu")]


def _cpu_max(path: Path) -> float | None:
    quota, period = path.read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _cfs_quota(path: Path) -> float | None:
    quota = int(path.read_text())
    period = int((path.parent / "cpu.cfs_period_us").read_text())
    return None if quota <= 0 else quota / period
