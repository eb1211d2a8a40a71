"""What this machine lets the process use: CPUs (affinity and cgroup quota) and /dev/shm. Read by the launcher
(how many workers, the shm warning), the rank's data layer (tokenization processes) and doctor."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process may use: its affinity mask (what taskset, Slurm and cgroup cpusets leave it), capped by
    the cgroup's CPU quota (a Kubernetes ``limits.cpu``, ``docker run --cpus``), which the mask does not show:
    a pod limited to 4 CPUs on a 64-core node sees 64 in the mask and is throttled to 4."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(count, math.ceil(quota))) if quota else count


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of time the cgroup may use (quota / period), or None when unlimited or unknown. Reads cgroup v2's
    ``cpu.max`` ("max 100000" or "400000 100000"), else v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    base = Path(root)
    try:
        quota, period = (base / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((base / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((base / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def shm_size(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize
