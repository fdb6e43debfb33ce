"""The device a local store's files lie on, read cold (their pages evicted first, `evict`), as
``outcore bench`` and ingest's ``images=None`` measure it.

A device is summed up by its ``bandwidth`` front to back (bytes/s of large reads) and by how many reads
of a given size it serves each second at random places, measured on the store's own files with the
reader's number of reads in flight: a cloud volume or a disk that caps requests serves few reads of any
size, and the kernel cuts a large read into requests of its own (each counts against such a cap). An
epoch of reads then takes the sum of each size's count over its rate. Nothing here needs root.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import OptionError
from .huge_pages import HugePageReads
from .page_cache import evict

LARGE_READ = 4 * 2**20  # what the bandwidth is measured with
SMALL_READ = 4096  # a small field's chunk: one request
_PAGE = 4096


@dataclass(frozen=True)
class DeviceRates:
    """A device as read cold, ``in_flight`` reads at a time: ``bandwidth`` in bytes/s of `LARGE_READ` reads
    front to back, and ``reads`` per second of reads of each size measured (bytes → reads/s) at random
    places, as the batch iterator reads chunks (the kernel told not to read ahead).

    >>> rates = DeviceRates(bandwidth=200e6, reads={2**20: 190.0, 4096: 3000.0}, in_flight=4)
    >>> rates.seconds({2**20: 1900, 4096: 3000})  # 10 s of large reads, 1 s of small ones
    11.0
    """

    bandwidth: float
    reads: dict[int, float]
    in_flight: int

    def seconds(self, reads: dict[int, float]) -> float:
        """How long the device takes for ``reads[size]`` reads of each measured size (no less than their
        bytes take at its bandwidth)."""
        nbytes = sum(size * count for size, count in reads.items())
        return max(nbytes / self.bandwidth, sum(count / self.reads[size] for size, count in reads.items()))

    def __str__(self) -> str:
        sizes = ", ".join(f"{rate:,.0f} reads/s of {_size(size)}" for size, rate in sorted(self.reads.items()))
        return f"{self.bandwidth / 1e6:,.0f} MB/s front to back; {sizes} ({self.in_flight} in flight)"


def measure_device(paths: Sequence[Path], in_flight: int, sizes: Sequence[int] = (SMALL_READ,),
                   seconds: float = 2.0) -> DeviceRates:
    """Read ``paths`` cold (their pages evicted first) for at most ``seconds`` per figure: front to back in
    large reads for the bandwidth, then at random places in reads of each of ``sizes`` (as many as
    the files' size, 64 at least), ``in_flight`` reads at a time. Pages read are evicted again afterwards.

    >>> measure_device(sorted(Path("train.zarr").rglob("c/*")), in_flight=4, sizes=[4096, 6_300_000])  # doctest: +SKIP
    DeviceRates(bandwidth=199873024.0, reads={4096: 2987.2, 6300000: 31.6}, in_flight=4)
    """
    files = [(Path(path), os.path.getsize(path)) for path in paths]
    total = sum(size for _, size in files)
    largest = max((size for _, size in files), default=0)
    if largest < _PAGE:
        raise OptionError(f"the store's files hold {total:,} bytes, too few to measure a device with")
    large = ((path, offset, LARGE_READ) for path, size in files for offset in range(0, size, LARGE_READ))
    weights = np.array([size for _, size in files], dtype=float) / total
    rng = np.random.default_rng(0)
    paths = [path for path, _ in files]
    try:
        evict(paths)
        read, elapsed = _timed_reads(large, in_flight, seconds)
        bandwidth = read / elapsed
        reads = {}
        for size in sizes:
            probe = min(size, largest)  # a read larger than every file: as long as its share of one
            evict(paths)
            places = ((files[k][0], _random_offset(rng, files[k][1], probe), probe)
                      for k in rng.choice(len(files), min(10**5, max(64, total // probe)), p=weights))
            read, elapsed = _timed_reads(places, in_flight, seconds, random=True)
            reads[size] = read / size / elapsed
    finally:
        evict(paths)
    return DeviceRates(bandwidth, reads, in_flight)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.0f} KiB"


def whole_pages(nbytes: float) -> int:
    """``nbytes`` rounded to whole pages (one at least): what a read of that many bytes asks of the device.

    >>> whole_pages(6_300_000)
    6299648
    """
    return max(1, round(nbytes / _PAGE)) * _PAGE


def _random_offset(rng: np.random.Generator, file_size: int, size: int) -> int:
    return int(rng.integers(0, max(1, (file_size - size) // _PAGE + 1))) * _PAGE


def _timed_reads(reads: Iterator[tuple[Path, int, int]], in_flight: int, seconds: float,
                 random: bool = False) -> tuple[int, float]:
    """Bytes read and seconds taken by ``in_flight`` threads taking reads from ``reads`` until it ends or
    ``seconds`` have passed (``random``: the kernel is told not to read ahead, and whole 2 MiB pages are read
    as the shard reader reads them, `HugePageReads`)."""
    lock = threading.Lock()
    opened: dict[Path, tuple[int, HugePageReads | None]] = {}  # file descriptor, and its huge-page reads

    def next_read() -> tuple[tuple[int, HugePageReads | None], int, int] | None:
        with lock:
            path, offset, size = next(reads, (None, 0, 0))
            if path is None:
                return None
            if path not in opened:
                fd = os.open(path, os.O_RDONLY)
                if random:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                opened[path] = (fd, HugePageReads(fd, os.fstat(fd).st_size) if random else None)
            return opened[path], offset, size

    def worker(deadline: float) -> int:
        done = 0
        while time.perf_counter() < deadline and (read := next_read()) is not None:
            (fd, huge), offset, size = read
            buffer = memoryview(bytearray(size))
            count = 0
            while count < size and (got := (huge.read_into(offset + count, buffer[count:]) if huge
                                            else os.preadv(fd, [buffer[count:]], offset + count))):
                count += got
            done += count
        return done

    began = time.perf_counter()
    try:
        with ThreadPoolExecutor(in_flight) as pool:
            read = sum(pool.map(worker, [began + seconds] * in_flight))
        return read, time.perf_counter() - began
    finally:
        for fd, huge in opened.values():
            if huge is not None:
                huge.close()
            os.close(fd)
