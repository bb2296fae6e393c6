"""What this process may use of the machine: memory and CPU cores, container limits included.

Memory is the smallest of the host's `MemAvailable` (/proc/meminfo) and, at every level of this
process's cgroup from its own up to the root, the limit minus what the group already uses
(cgroup v2 `memory.max` - `memory.current`, v1 `memory.limit_in_bytes` - `memory.usage_in_bytes`,
each less its inactive file cache, which the kernel reclaims before it OOM-kills: the "working
set" Docker and the kubelet report). Cores are the smallest of the CPU affinity mask (`taskset`,
cpusets) and every level's CFS quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`,
rounded up: what Docker's `--cpus` and Kubernetes' CPU limits write).

Every path is injectable (`MachineFiles`), so tests fake /proc and /sys/fs/cgroup with plain files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value; treat anything
# this large (over 1 PiB) as no limit at all.
_UNLIMITED = 1 << 50


def _affinity_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class MachineFiles:
    """Where the machine's facts are read from; tests point these at a temporary directory."""

    proc: Path = Path("/proc")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    affinity: Callable[[], int] = field(default=_affinity_count)


@dataclass(frozen=True)
class Memory:
    """Bytes this process may still allocate, and which limit said so."""

    available: int
    source: str  # "host MemAvailable", "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes"


@dataclass(frozen=True)
class Cores:
    """CPU cores this process may keep busy, and which limit said so."""

    count: int
    source: str  # "CPU affinity", "cgroup v2 cpu.max", "cgroup v1 cpu.cfs_quota_us"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:  # "max" and the like
        return None


def _stat_value(path: Path, *keys: str) -> int:
    """The first of `keys` found in a `memory.stat` file; 0 when none is."""
    values: dict[str, str] = {}
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        values[name] = value
    for key in keys:
        if key in values and values[key].strip().isdigit():
            return int(values[key])
    return 0


def host_mem_available(files: MachineFiles) -> int | None:
    """MemAvailable from /proc/meminfo in bytes (the kernel's own estimate, page cache included)."""
    for line in (_read(files.proc / "meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) * (1024 if parts[-1] == "kB" else 1)
    return None


def _cgroup_paths(files: MachineFiles) -> dict[str, str]:
    """This process's cgroup path per controller ("" keys the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in (_read(files.proc / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(","):
            paths[controller] = parts[2]
    return paths


def _levels(mount: Path, path: str) -> Iterator[Path]:
    """The cgroup's directory and each parent up to the mount. Inside a container with its own
    cgroup namespace the path reads "/" (or names a directory the mount does not show): then the
    mount itself is the container's group."""
    leaf = mount / path.lstrip("/")
    start = leaf if leaf.is_dir() else mount
    level = start
    while True:
        yield level
        if level == mount or mount not in level.parents:
            return
        level = level.parent


def _v2_mount(files: MachineFiles) -> Path | None:
    for candidate in (files.cgroup_root, files.cgroup_root / "unified"):
        if (candidate / "cgroup.controllers").is_file():
            return candidate
    return None


def cgroup_memory(files: MachineFiles) -> Memory | None:
    """The tightest cgroup memory headroom along this process's cgroup path, if any is limited."""
    paths = _cgroup_paths(files)
    best: Memory | None = None
    v2 = _v2_mount(files)
    if v2 is not None and "" in paths:
        for level in _levels(v2, paths[""]):
            limit = _read_int(level / "memory.max")
            used = _read_int(level / "memory.current")
            if limit is None or limit >= _UNLIMITED or used is None:
                continue
            used -= _stat_value(level / "memory.stat", "inactive_file")
            best = _tighter(best, Memory(max(0, limit - max(0, used)), "cgroup v2 memory.max"))
    v1 = files.cgroup_root / "memory"
    if "memory" in paths and v1.is_dir():
        for level in _levels(v1, paths["memory"]):
            limit = _read_int(level / "memory.limit_in_bytes")
            used = _read_int(level / "memory.usage_in_bytes")
            if limit is None or limit >= _UNLIMITED or used is None:
                continue
            used -= _stat_value(level / "memory.stat", "total_inactive_file", "inactive_file")
            best = _tighter(best, Memory(max(0, limit - max(0, used)), "cgroup v1 memory.limit_in_bytes"))
    return best


def _tighter(a: Memory | None, b: Memory) -> Memory:
    return b if a is None or b.available < a.available else a


def read_memory(files: MachineFiles | None = None) -> Memory:
    """Bytes this process may use: the host's MemAvailable or a tighter cgroup limit."""
    files = files or MachineFiles()
    host = host_mem_available(files)
    cgroup = cgroup_memory(files)
    found = [m for m in (Memory(host, "host MemAvailable") if host is not None else None, cgroup) if m]
    if not found:  # not Linux: all of physical memory is the best guess left
        try:
            found = [Memory(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory")]
        except (ValueError, OSError, AttributeError):
            raise ValueError("cannot tell how much memory is available (no /proc/meminfo)") from None
    return min(found, key=lambda m: m.available)


def _quota_cores(quota: int, period: int) -> int | None:
    """A CFS quota as whole cores, rounded up: 1.5 CPUs still keep two threads partly busy."""
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def cgroup_cpu_quota(files: MachineFiles) -> Cores | None:
    """The tightest CFS quota along this process's cgroup path, in whole cores."""
    paths = _cgroup_paths(files)
    best: Cores | None = None
    v2 = _v2_mount(files)
    if v2 is not None and "" in paths:
        for level in _levels(v2, paths[""]):
            fields = (_read(level / "cpu.max") or "").split()
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
                cores = _quota_cores(int(fields[0]), int(fields[1]))  # "max 100000": no quota
                if cores is not None and (best is None or cores < best.count):
                    best = Cores(cores, "cgroup v2 cpu.max")
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        v1 = files.cgroup_root / name
        if "cpu" not in paths or not v1.is_dir():
            continue
        for level in _levels(v1, paths["cpu"]):
            quota = _read_int(level / "cpu.cfs_quota_us")
            period = _read_int(level / "cpu.cfs_period_us")
            cores = _quota_cores(quota, period) if quota is not None and period is not None else None
            if cores is not None and (best is None or cores < best.count):
                best = Cores(cores, "cgroup v1 cpu.cfs_quota_us")
        break
    return best


def read_cores(files: MachineFiles | None = None) -> Cores:
    """Cores this process may keep busy: its affinity mask or a tighter CFS quota."""
    files = files or MachineFiles()
    affinity = Cores(max(1, files.affinity()), "CPU affinity")
    quota = cgroup_cpu_quota(files)
    return quota if quota is not None and quota.count < affinity.count else affinity


__all__ = ["Cores", "MachineFiles", "Memory", "read_cores", "read_memory"]
