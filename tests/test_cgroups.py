"""This process's cgroups (`outcore.threads.cgroups`), as the CPU count and the page cache's room read them:
v2's one hierarchy, v1's per controller, and limits set on ancestors."""

from __future__ import annotations

import pytest

from outcore.storage import page_cache
from outcore.threads import cgroups
from outcore.threads import cpus as threads

GiB = 2**30


def _fake_cgroups(monkeypatch, root, lines: str, files: dict[str, str]) -> None:
    """``/proc/self/cgroup`` saying ``lines``, and a cgroup file system at ``root`` holding ``files``."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "self-cgroup").write_text(lines)
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroups, "OWN_CGROUP", root / "self-cgroup")


@pytest.mark.parametrize(("lines", "files", "cpus"), [
    ("0::/kubepods/pod1/c1\n", {"kubepods/cpu.max": "max 100000", "kubepods/pod1/cpu.max": "300000 100000",
                                 "kubepods/pod1/c1/cpu.max": "max 100000"}, 3),  # v2: a parent's quota counts
    ("0::/job\n", {"job/cpu.max": "150000 100000"}, 2),  # 1.5 CPUs: rounded up
    ("0::/job\n", {"job/cpu.max": "max 100000"}, 64),  # no quota: the affinity
    ("4:cpu,cpuacct:/slurm/job\n", {"cpu,cpuacct/slurm/job/cpu.cfs_quota_us": "400000",
                                     "cpu,cpuacct/slurm/job/cpu.cfs_period_us": "100000",
                                     "cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
     4),  # v1
])
def test_available_cpus_follow_the_cgroup_quota(tmp_path, monkeypatch, lines, files, cpus):
    """os.cpu_count() counts the host's cores: a container limited to 3 CPUs of a 64-core host gets 3."""
    _fake_cgroups(monkeypatch, tmp_path, lines, files)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert threads.available_cpus() == cpus


def test_the_cgroup_quota_is_read_again_only_after_a_while(tmp_path, monkeypatch):
    """The thread count is asked for at every batch: the quota's files are not read every time."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.max").write_text("300000 100000")
    (tmp_path / "self-cgroup").write_text("0::/job\n")
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "OWN_CGROUP", tmp_path / "self-cgroup")
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert threads.available_cpus() == 3
    (tmp_path / "job" / "cpu.max").write_text("200000 100000")
    assert threads.available_cpus() == 3  # read a moment ago
    monkeypatch.setattr(threads, "QUOTA_SECONDS", 0.0)
    assert threads.available_cpus() == 2


@pytest.mark.parametrize(("lines", "files", "limit"), [
    ("0::/job/step\n", {"job/memory.max": str(4 * GiB), "job/step/memory.max": "max"}, 4 * GiB),  # v2: a parent's
    ("0::/job\n", {"job/memory.max": "max"}, None),
    ("9:memory:/slurm/job\n4:cpu,cpuacct:/slurm/job\n", {
        "memory/slurm/job/memory.limit_in_bytes": str(2 * GiB),
        "memory/memory.limit_in_bytes": "9223372036854771712"}, 2 * GiB),  # v1; the root writes "none" as 2**63
    ("9:memory:/job\n0::/job\n", {"memory/job/memory.limit_in_bytes": str(3 * GiB),
                                     "job/memory.max": str(GiB)}, GiB),  # hybrid: the smaller of the two
    ("4:cpu,cpuacct:/job\n", {"cpu,cpuacct/job/cpu.cfs_quota_us": "100000"}, None),  # no memory controller
])
def test_the_page_cache_s_room_follows_the_memory_limits(tmp_path, monkeypatch, lines, files, limit):
    """A job limited to 4 GiB on a 64 GiB host has 4 GiB for the page cache, less its processes' own memory."""
    _fake_cgroups(monkeypatch, tmp_path, lines, files)
    room = page_cache.memory()
    assert room.limit == limit
    if limit is not None:
        assert room.available <= limit


def test_a_process_without_a_readable_cgroup_file_has_no_cgroups(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroups, "OWN_CGROUP", tmp_path / "missing")
    assert cgroups.cgroup_folders("cpu") == [] and page_cache.memory().limit is None
