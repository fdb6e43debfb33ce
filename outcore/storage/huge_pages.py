"""Reads of a local file's large ranges that ask the device for 2 MiB at a time.

A ``pread`` the kernel is told not to read ahead for fills the page cache with 4 KiB pages, and a device
request carries as many of them as the block layer joins (512 KiB on a virtio disk): a 5.5 MiB chunk of
pixels is 10 requests, and a device that caps requests (a disk: 150 a second) caps the epoch with them.
A file mapping marked ``MADV_HUGEPAGE`` (and ``MADV_RANDOM``: nothing read around) is filled a 2 MiB page at
a time, aligned in the file, each page one request where the file system keeps large pages (ext4 since
Linux 6.16, XFS since 5.18). So `HugePageReads` reads the whole 2 MiB pages inside a range by filling
them through a mapping (``MADV_POPULATE_READ``) and copying them out through ``/proc/self/mem`` (a file
truncated meanwhile is an I/O error there, where a copy from the mapping would be a ``SIGBUS``), and the
rest of the range, less than 2 MiB at either end, with ``pread``. Same bytes from the device, fewer
requests: on a device that caps requests, more bytes a second (``benchmarks/out_of_core.py`` measures the
epochs; docs/benchmarks.md, "Figures behind the code"). Where the kernel offers none of it (not Linux, Linux before 5.14, no transparent huge pages,
``/proc/self/mem`` closed), every read is a ``pread``: `available` says which.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import Self

import numpy as np

HUGE_PAGE = 2 << 20
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14; Python names it from 3.13 on


class _Memory:
    """This process's ``/proc/self/mem``, open (again in a forked child: the parent's file reads the parent)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.refused = not hasattr(mmap, "MADV_HUGEPAGE")

    def fd(self) -> int | None:
        """The open file, or None where the kernel lacks what huge-page reads take (then never again)."""
        if self._fd is None and not self.refused:
            with self._lock:
                if self._fd is None:
                    try:
                        _check_kernel()
                        self._fd = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
                    except OSError:
                        self.refused = True
        return self._fd

    def forget(self) -> None:
        """In a forked child: the parent's file is closed, to be opened anew as this process's."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._lock = None, threading.Lock()


def _check_kernel() -> None:
    """Raise OSError where the kernel has no transparent huge pages or no ``MADV_POPULATE_READ`` (before 5.14)."""
    with mmap.mmap(-1, HUGE_PAGE) as probe:
        probe.madvise(mmap.MADV_HUGEPAGE)
        probe.madvise(_POPULATE_READ)


_MEMORY = _Memory()
os.register_at_fork(after_in_child=_MEMORY.forget)


def available() -> bool:
    """Whether large reads of local files fill 2 MiB pages here (else they are plain ``pread``).

    >>> isinstance(available(), bool)
    True
    """
    return _MEMORY.fd() is not None


class HugePageReads:
    """Positional reads of one open local file (``fd``, ``size`` bytes long), whole 2 MiB pages at a time.

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as file:
    ...     _ = file.write(bytes(range(256)) * 32_000)
    ...     file.flush()
    ...     with HugePageReads(file.fileno(), 8_192_000) as reads:
    ...         buffer = bytearray(6_000_000)
    ...         done = 0
    ...         while done < len(buffer):
    ...             done += reads.read_into(1_000 + done, memoryview(buffer)[done:])
    >>> buffer == (bytes(range(256)) * 32_000)[1_000:6_001_000]
    True
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self._map: mmap.mmap | None = None
        self._address = 0
        self._tried = False

    def _mapped(self) -> mmap.mmap | None:
        """The file's mapping, made at its first large read (None where it cannot be)."""
        if not self._tried:
            self._tried = True
            try:
                self._map = mmap.mmap(self.fd, self.size, prot=mmap.PROT_READ)
                self._map.madvise(mmap.MADV_HUGEPAGE)
                self._map.madvise(mmap.MADV_RANDOM)
            except (OSError, ValueError):  # no transparent huge pages, or a file that cannot be mapped
                self.close()
            else:
                self._address = np.frombuffer(self._map, np.uint8).ctypes.data  # fixed while mapped
        return self._map

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Unmap the file (the file descriptor is the caller's)."""
        if self._map is not None:
            self._map.close()
            self._map = None

    def read_into(self, offset: int, buffer: memoryview) -> int:
        """Read from ``offset`` into the start of ``buffer``; return how many bytes were read: all of them, or
        fewer (call again for the rest), or 0 at the file's end. One call reads the part before the first
        whole 2 MiB page, or the whole pages, or what is left after them."""
        first = -(-offset // HUGE_PAGE) * HUGE_PAGE
        end = min(offset + len(buffer), self.size) // HUGE_PAGE * HUGE_PAGE
        memory = _MEMORY.fd() if end - first >= HUGE_PAGE else None
        mapped = self._mapped() if memory is not None else None
        if mapped is None:
            return os.preadv(self.fd, [buffer], offset)
        if offset < first:
            return os.preadv(self.fd, [buffer[: first - offset]], offset)
        pages = buffer[: end - offset]
        try:
            mapped.madvise(_POPULATE_READ, offset, len(pages))
            return os.preadv(memory, [pages], self._address + offset)
        except OSError:  # the kernel cannot (Linux before 5.14), or the file shrank: pread says what there is
            return os.preadv(self.fd, [pages], offset)
