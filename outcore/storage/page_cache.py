"""The memory the page cache can give a process (a store that fits is read from memory after its first
epoch), and evicting a store's pages from it so that the next reads come from the device.

Nothing here needs root: pages are evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)`` (which leaves
pages another process holds mapped or dirty), and memory limits are read from the process's cgroups.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..threads.cgroups import cgroup_folders
from .chunk_reads import unmap_idle

PAGE_CACHE_SHARE = 0.9  # a store is read from memory when it takes at most this share of the page cache's room
_NO_LIMIT = 2**60  # cgroup v1 writes 9223372036854771712 for "none"


@dataclass(frozen=True)
class Memory:
    """What the page cache can hold: ``available`` bytes (the kernel's ``MemAvailable``, or what the
    process's memory cgroup leaves beside its processes' own memory if that is less) and the cgroup's
    ``limit`` (``None`` without one)."""

    available: int
    limit: int | None

    def holds(self, nbytes: float) -> bool:
        """Whether a store of ``nbytes`` is read from memory here (at most `PAGE_CACHE_SHARE` of the room).

        >>> Memory(available=2**30, limit=None).holds(2**31)
        False
        """
        return nbytes <= PAGE_CACHE_SHARE * self.available


def memory() -> Memory:
    """The memory the page cache can give this process now.

    >>> memory().available > 0
    True
    """
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    limits = [(limit, used) for folder, _ in cgroup_folders("memory") if (limit := _read_limit(folder)) is not None
              for used in [_own_memory(folder)]]
    if not limits:
        return Memory(available, None)
    limit, used = min(limits)
    return Memory(min(available, max(0, limit - used)), limit)


def _read_limit(folder: Path) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            text = (folder / name).read_text().strip()
        except OSError:
            continue
        return None if text == "max" or int(text) >= _NO_LIMIT else int(text)
    return None


def _own_memory(folder: Path) -> int:
    """The cgroup's memory that is not page cache (its processes' own), in bytes."""
    try:
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    except OSError:
        return 0
    return int(stat.get("total_rss", stat.get("anon", 0)))


def evict(paths: Sequence[Path]) -> None:
    """Drop ``paths``' pages from the page cache, so that the next reads come from the device (this process's
    mappings of shard files unmapped first: `chunk_reads.unmap_idle`; another process's mapped pages stay)."""
    for path in paths:
        unmap_idle(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
