"""The memory the guards allow (dpfl.data.memory_limit): the least of the machine's free memory, the process's cgroup
(v2 and v1, its own and those above it) and RLIMIT_AS, read from fake /proc and /sys trees; "max", v1's "no limit"
and unreadable files are no limits; a refusal names the limit that applied."""

from __future__ import annotations

import resource

import pytest

from dpfl.cli import main
from dpfl.data import footprint, memory_limit
from dpfl.data.memory_limit import MemoryLimit, available_memory, memory_limits

GB, MB = 2**30, 2**20
V1_NO_LIMIT = "9223372036854771712"  # what cgroup v1 reads back for no limit (PAGE_COUNTER_MAX pages)


def fake_root(tmp_path, files: dict[str, str]):
    """A tree under tmp_path with ``files`` (path under the root: text), MemAvailable 8 GB unless given."""
    files = {"proc/meminfo": f"MemTotal: {16 * GB // 1024} kB\nMemAvailable: {8 * GB // 1024} kB\n", **files}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.fixture(autouse=True)
def no_address_space_limit(monkeypatch):
    """RLIMIT_AS unlimited unless a test sets it (whatever this shell's ulimit -v)."""
    monkeypatch.setattr(memory_limit.resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def test_without_limits_the_machines_free_memory_applies(tmp_path):
    root = fake_root(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n",
                                "sys/fs/cgroup/memory.current": f"{GB}\n"})
    assert memory_limits(root) == [MemoryLimit(8 * GB, "MemAvailable in /proc/meminfo")]
    assert available_memory(root) == MemoryLimit(8 * GB, "MemAvailable in /proc/meminfo")


def test_cgroup_v2_the_least_of_the_process_cgroup_and_those_above_it(tmp_path):
    """The process is in /job/step (no limit of its own: "max"); /job caps it at 2 GB with 1.5 GB in use: 0.5 GB
    left, below the machine's 8 GB; the root cgroup of the mount sets 6 GB, 1 GB in use (5 GB left)."""
    root = fake_root(tmp_path, {
        "proc/self/cgroup": "0::/job/step\n",
        "sys/fs/cgroup/job/step/memory.max": "max\n", "sys/fs/cgroup/job/step/memory.current": f"{GB}\n",
        "sys/fs/cgroup/job/memory.max": f"{2 * GB}\n", "sys/fs/cgroup/job/memory.current": f"{3 * GB // 2}\n",
        "sys/fs/cgroup/memory.max": f"{6 * GB}\n", "sys/fs/cgroup/memory.current": f"{GB}\n"})
    assert memory_limits(root)[1:] == [
        MemoryLimit(GB // 2, f"cgroup v2 memory.max = 2.0 GB, 1.5 GB of it in use ({root}/sys/fs/cgroup/job)"),
        MemoryLimit(5 * GB, f"cgroup v2 memory.max = 6.0 GB, 1.0 GB of it in use ({root}/sys/fs/cgroup)")]
    assert available_memory(root).available == GB // 2


def test_cgroup_v1_a_container_that_sees_only_its_own_cgroup(tmp_path):
    """/proc/self/cgroup names /docker/abc, which the container's mount does not show: its root is the container's
    cgroup, 1 GB with 256 MB in use (768 MB left). v1's "no limit" (a huge number) is never the least."""
    root = fake_root(tmp_path, {
        "proc/self/cgroup": "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{GB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{256 * MB}\n"})
    assert available_memory(root) == MemoryLimit(
        768 * MB, f"cgroup v1 memory.limit_in_bytes = 1.0 GB, 256.0 MB of it in use ({root}/sys/fs/cgroup/memory)")
    (root / "sys/fs/cgroup/memory/memory.limit_in_bytes").write_text(V1_NO_LIMIT + "\n")
    assert available_memory(root) == MemoryLimit(8 * GB, "MemAvailable in /proc/meminfo")


def test_unreadable_cgroup_files_are_no_limits(tmp_path):
    """A memory.max that is a folder (unreadable), one that is no number, a usage file missing, no /proc/self/cgroup
    (the mounts' roots are read): none of them limits; the machine's free memory applies."""
    root = fake_root(tmp_path, {
        "sys/fs/cgroup/memory.current": f"{GB}\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "a lot\n", "sys/fs/cgroup/memory/memory.usage_in_bytes": "1\n",
        "proc/self/status": "VmSize: x kB\n"})
    (root / "sys/fs/cgroup/memory.max").mkdir()
    assert memory_limits(root) == [MemoryLimit(8 * GB, "MemAvailable in /proc/meminfo")]
    (root / "sys/fs/cgroup/memory.max").rmdir()
    (root / "sys/fs/cgroup/memory.max").write_text(f"{GB}\n")
    (root / "sys/fs/cgroup/memory.current").unlink()
    assert memory_limits(root) == [MemoryLimit(8 * GB, "MemAvailable in /proc/meminfo")]


def test_rlimit_as_less_the_mapped_address_space(tmp_path, monkeypatch):
    """ulimit -v of 4 GB (the soft limit counts), 1 GB mapped: 3 GB left, below the machine's 8 GB and above a
    cgroup's 2 GB left."""
    asked = []
    monkeypatch.setattr(memory_limit.resource, "getrlimit",
                        lambda which: asked.append(which) or (4 * GB, resource.RLIM_INFINITY))
    root = fake_root(tmp_path, {"proc/self/status": f"Name: python\nVmPeak: {2 * GB // 1024} kB\n"
                                                    f"VmSize: {GB // 1024} kB\n"})
    limit = MemoryLimit(3 * GB, "RLIMIT_AS (ulimit -v) = 4.0 GB, 1.0 GB of it mapped")
    assert available_memory(root) == limit and asked == [resource.RLIMIT_AS]
    fake_root(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": f"{3 * GB}\n",
                         "sys/fs/cgroup/memory.current": f"{GB}\n"})
    assert memory_limits(root)[-1] == limit and available_memory(root).available == 2 * GB


def test_a_run_refused_by_a_cgroup_limit_names_it(tmp_path, monkeypatch, capsys):
    """`dpfl run` of 2,000 synthetic clients of 500 records (about 404 MB at the build's peak) in a cgroup of 512 MB
    with 256 MB in use: refused before the data is built, naming memory.max."""
    root = fake_root(tmp_path / "root", {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": f"{512 * MB}\n",
                                         "sys/fs/cgroup/memory.current": f"{256 * MB}\n"})
    monkeypatch.setattr(footprint, "available_memory", lambda: available_memory(root))
    (tmp_path / "c.toml").write_text("")
    code = main(["run", str(tmp_path / "c.toml"), "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", "data.num_clients=2000", "--set", "data.samples_per_client=500"])
    err = capsys.readouterr().err
    assert code == 2 and "data.num_clients = 2000 is not allowed" in err and "Traceback" not in err
    assert (f"this process has 256.0 MB available (cgroup v2 memory.max = 512.0 MB, 256.0 MB of it in use "
            f"({root}/sys/fs/cgroup)), 90% of it for the data") in err
    assert not (tmp_path / "run").exists()
