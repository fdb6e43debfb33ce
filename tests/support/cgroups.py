"""A throttled device and a memory limit for a test's child process: a cgroup v1 ``blkio`` and ``memory``
pair of its own (root only; a test without them skips, saying why)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CGROUP = Path("/sys/fs/cgroup")
JOIN = ("import os, sys; [open(f'{d}/cgroup.procs', 'w').write(str(os.getpid())) for d in sys.argv[1:3]];"
        " os.execv(sys.executable, [sys.executable, '-c', *sys.argv[3:]])")


@dataclass
class Throttled:
    """A cgroup whose reads of ``disk`` are capped: `run` a child in it, `reads` of the disk so far."""

    blkio: Path
    memory: Path
    disk: str

    def run(self, code: str, *args: str) -> str:
        """Run ``python -c code args`` in the cgroup; its standard output."""
        done = subprocess.run([sys.executable, "-c", JOIN, str(self.blkio), str(self.memory), code, *args],
                              capture_output=True, text=True, timeout=300, check=True)
        return done.stdout

    def reads(self) -> tuple[int, int]:
        """Bytes and requests the cgroup's processes read from the disk so far (blkio's counters)."""
        def counter(name: str) -> int:
            for line in (self.blkio / name).read_text().splitlines():
                if line.split()[:2] == [self.disk, "Read"]:
                    return int(line.split()[2])
            return 0

        return counter("blkio.throttle.io_service_bytes"), counter("blkio.throttle.io_serviced")


@contextlib.contextmanager
def throttled(folder: Path, bandwidth: int, requests: int, memory: int) -> Iterator[Throttled]:
    """A cgroup reading the block device under ``folder`` at ``bandwidth`` bytes/s and ``requests``/s at
    most, with ``memory`` bytes (page cache included)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes a blkio and a memory cgroup")
    if not (CGROUP / "blkio" / "cgroup.procs").exists() or not (CGROUP / "memory" / "cgroup.procs").exists():
        pytest.skip("needs cgroup v1's blkio and memory controllers (blkio.throttle.*)")
    device = os.stat(folder).st_dev
    node = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    if not node.exists():
        pytest.skip(f"{folder} is not on a block device that blkio can throttle")
    if (node / "partition").exists():
        node = node.resolve().parent
    disk = (node / "dev").read_text().strip()
    name = f"outcore-test-{os.getpid()}"
    cgroup = Throttled(CGROUP / "blkio" / name, CGROUP / "memory" / name, disk)
    cgroup.blkio.mkdir()
    cgroup.memory.mkdir()
    try:
        (cgroup.blkio / "blkio.throttle.read_bps_device").write_text(f"{disk} {bandwidth}")
        (cgroup.blkio / "blkio.throttle.read_iops_device").write_text(f"{disk} {requests}")
        (cgroup.memory / "memory.limit_in_bytes").write_text(str(memory))
        yield cgroup
    finally:
        cgroup.blkio.rmdir()
        cgroup.memory.rmdir()
