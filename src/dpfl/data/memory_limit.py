"""How much memory this process can still take, and which limit says so: the memory guards
(``footprint.check_data_memory``, ``dpfl.experiments.memory.check_run_memory``) refuse a run that would not fit,
naming the limit that applied.

The machine's free memory (/proc/meminfo's MemAvailable) is not the only limit. In a container, a batch job or a
systemd unit the process's cgroup caps its memory, often far below the machine's (the kernel's OOM killer ends the
process at the cap, with no message of dpfl's); a shell's ``ulimit -v`` caps its address space (RLIMIT_AS:
an allocation beyond it fails). ``memory_limits`` reads each that applies, as the memory left under it:

* MemAvailable (os.sysconf's available pages where /proc/meminfo lacks it);
* cgroup v2: memory.max - memory.current ("max": no limit) of the process's cgroup, read from the line "0::PATH"
  of /proc/self/cgroup, and of every cgroup above it (a parent's limit caps its children), under /sys/fs/cgroup;
* cgroup v1: memory.limit_in_bytes - memory.usage_in_bytes of the memory controller's cgroup ("N:memory:PATH") and
  those above it, under /sys/fs/cgroup/memory (v1 writes no limit as a huge number, which is never the least);
* RLIMIT_AS (its soft limit; RLIM_INFINITY: none) less the address space already mapped (VmSize in
  /proc/self/status).

A cgroup folder that the process's path names but the mount does not show (a container that sees only its own
cgroup, at the mount's root) is skipped: the folders above it, the mount's root among them, are read. A file that
is missing, unreadable or not a number is no limit dpfl can read and is skipped. ``available_memory`` is the least
of them. Every path is under ``root`` (default "/"), so the tests read fake trees.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MemoryLimit:
    """The bytes this process can still take under one limit, and that limit, as a refusal names it
    ("cgroup v2 memory.max = 2.0 GB, 1.5 GB of it in use (/sys/fs/cgroup)")."""

    available: int
    source: str


def available_memory(root: Path = Path("/")) -> MemoryLimit:
    """The least of ``memory_limits(root)``: what this process can still take."""
    return min(memory_limits(root), key=lambda limit: limit.available)


def memory_limits(root: Path = Path("/")) -> list[MemoryLimit]:
    """Every memory limit that applies to this process (module docstring), the machine's free memory first."""
    root = Path(root)
    own = _own_cgroups(root / "proc/self/cgroup")
    limits = [_machine(root)]
    limits += _cgroup_limits(root / "sys/fs/cgroup", own.get("v2", "/"), "memory.max", "memory.current", "v2")
    limits += _cgroup_limits(root / "sys/fs/cgroup/memory", own.get("v1", "/"), "memory.limit_in_bytes",
                             "memory.usage_in_bytes", "v1")
    address_space = _address_space(root / "proc/self/status")
    return limits + ([] if address_space is None else [address_space])


def _machine(root: Path) -> MemoryLimit:
    """/proc/meminfo's MemAvailable, or the free physical pages where it lacks one."""
    try:
        with open(root / "proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return MemoryLimit(int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo")
    except (OSError, ValueError, IndexError):
        pass
    return MemoryLimit(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the free physical pages")


def _own_cgroups(path: Path) -> dict[str, str]:
    """{"v2": the process's cgroup v2 path, "v1": its v1 memory controller's path}, as far as /proc/self/cgroup
    names them."""
    own = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return own
    for line in lines:
        number, controllers, cgroup = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            own["v2"] = cgroup
        elif "memory" in controllers.split(","):
            own["v1"] = cgroup
    return own


def _cgroup_limits(mount: Path, cgroup: str, limit_file: str, usage_file: str, version: str) -> list[MemoryLimit]:
    """The limit of the cgroup ``cgroup`` and of each above it under ``mount``, that set one."""
    folder = mount / cgroup.strip("/")
    folders = [folder, *folder.parents[: len(folder.parents) - len(mount.parents)]]  # up to the mount itself
    limits = []
    for folder in folders:
        try:
            limit_text = (folder / limit_file).read_text().strip()
            if limit_text == "max":
                continue
            limit, used = int(limit_text), int((folder / usage_file).read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        limits.append(MemoryLimit(max(limit - used, 0), f"cgroup {version} {limit_file} = {size(limit)}, "
                                                        f"{size(used)} of it in use ({folder})"))
    return limits


def _address_space(status: Path) -> MemoryLimit | None:
    """RLIMIT_AS's soft limit less the address space mapped (VmSize; taken as 0 where unreadable); None: no limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        pass
    return MemoryLimit(max(soft - mapped, 0), f"RLIMIT_AS (ulimit -v) = {size(soft)}, {size(mapped)} of it mapped")


def size(num_bytes: float) -> str:
    """Bytes as MB or GB (2^20, 2^30), e.g. "24.9 GB"."""
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.1f} GB"
    return f"{num_bytes / 2**20:.1f} MB"


__all__ = ["MemoryLimit", "available_memory", "memory_limits", "size"]
