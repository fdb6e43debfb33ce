"""Mappings of shared-memory files, kept by each process for the next batch made in or read from a file.

Mapping a batch's file costs its page tables, whoever maps it, several times what writing the whole
batch through a mapping already made costs, on the worker that writes it and on the consumer that
reads it (docs/benchmarks.md, "Figures behind the code"). The files of a mailbox
are recycled (`outcore.iterate.shared`), so each comes back every few batches, and in the next runs of
its consumer: `KeptMappings` keeps a process's mapping of each file, with a descriptor of it, and hands
it out again when the file comes back, under whatever name and in whatever folder.

A file is known by its device and inode number. While a process maps a file, the mapping holds it and
no other file gets its number: filesystems give a number again only once its file is freed, and tmpfs
counts numbers up, but without ``inode64`` it counts in 32 bits and wraps after 4 billion files (made
by any program). So a kept mapping found for the device and inode of the file at a path is handed out
only when its descriptor says it is that very file (`_same_file`: still named, changed at the same
time, of the same size); otherwise the file is mapped anew. A mapping is let go of once its file is
removed (no name left: ``st_nlink`` of the descriptor kept is 0), by `prune`: run as a worker takes a
free file, on a Dask worker every `PRUNE_SECONDS` on its event loop (a mapping keeps a removed file's
memory; an idle worker lets go of it there), and as a consumer closes a mailbox.

>>> import shutil, tempfile
>>> folder = Path(tempfile.mkdtemp(dir="/dev/shm"))
>>> kept = KeptMappings()
>>> first = kept.map(folder / "a", 4096, create=True)
>>> (folder / "next").mkdir(); os.rename(folder / "a", folder / "next" / "b")  # recycled elsewhere, renamed
>>> kept.map(folder / "next" / "b", 4096) is first
True
>>> shutil.rmtree(folder); kept.prune(); len(kept.kept)
0
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from pathlib import Path

POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux
PRUNE_SECONDS = 2.0  # how soon an idle Dask worker lets go of the mappings of removed files

Key = tuple[int, int, int, int]  # a file's device and inode, and the part of it mapped: (start, size)


def open_file(path: str | Path, size: int, *, create: bool) -> int:
    """A descriptor of file ``path``, open for reading and writing; ``create`` makes the file and reserves
    ``size`` bytes of room first (``posix_fallocate``: no room is an ``OSError`` now, not a crash when
    written, and the file is removed again)."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDWR, 0o600)
    if create:
        try:
            os.posix_fallocate(descriptor, 0, size)
        except OSError:
            os.close(descriptor)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
    return descriptor


def map_descriptor(descriptor: int, size: int, *, start: int) -> mmap.mmap:
    """``size`` bytes of the open file ``descriptor`` mapped for reading and writing, from byte ``start`` (a
    multiple of ``mmap.ALLOCATIONGRANULARITY``), its pages mapped at once (one call instead of a fault per
    page: a batch's file is written or read whole). Every new mapping of outcore's is made here."""
    return mmap.mmap(descriptor, size, flags=mmap.MAP_SHARED | POPULATE, offset=start)


def _same_file(descriptor: int, status: os.stat_result) -> bool:
    """Whether ``descriptor`` is open on the file ``status`` describes, not on another of its device and inode
    number (removed, or under a number tmpfs gave again): still named, changed at the same time (a rename
    changes it), of the same size. A file changed between the two looks (written by another process) is
    mapped anew: a cost, never a wrong mapping."""
    kept = os.fstat(descriptor)
    return kept.st_nlink > 0 and (kept.st_dev, kept.st_ino, kept.st_ctime_ns, kept.st_size) == (
        status.st_dev, status.st_ino, status.st_ctime_ns, status.st_size)


class KeptMappings:
    """A process's mappings of shared-memory files (pages filled at once), each with a descriptor of its file,
    by ``(device, inode, start, size)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: dict[Key, tuple[mmap.mmap, int]] = {}
        self.pruned = 0.0  # when `prune` last looked (``time.monotonic``)

    def map(self, path: str | Path, size: int, *, create: bool = False, start: int = 0,
            status: os.stat_result | None = None) -> mmap.mmap:
        """``size`` bytes of file ``path`` from byte ``start``, mapped with their pages filled (`map_descriptor`):
        the mapping kept from the last time the file was mapped here, if any (``status``: the file's, when
        the caller has it); ``create`` makes the file (`open_file`)."""
        if not create:
            status = os.stat(path) if status is None else status
            with self.lock:  # a descriptor is closed only under the lock
                found = self.kept.get((status.st_dev, status.st_ino, start, size))
                if found is not None and _same_file(found[1], status):
                    return found[0]
        descriptor = open_file(path, size, create=create)
        try:
            mapped = map_descriptor(descriptor, size, start=start)
            opened = os.fstat(descriptor)
        except BaseException:
            os.close(descriptor)
            raise
        with self.lock:
            replaced = self.kept.get(key := (opened.st_dev, opened.st_ino, start, size))
            self.kept[key] = (mapped, descriptor)
            if replaced is not None:  # another file of that number before, or mapped by two threads at once
                os.close(replaced[1])
        return mapped

    def inodes(self) -> set[int]:
        """The inodes of the files this process keeps a mapping of."""
        with self.lock:
            return {inode for _, inode, _, _ in self.kept}

    def prune(self, every: float = 0.0) -> None:
        """Let go of the mappings of the files removed since (arrays still using one keep it alive); with
        ``every``, only if the last look was that many seconds ago (a look is a system call a mapping)."""
        now = time.monotonic()
        if every and now - self.pruned < every:
            return
        self.pruned = now
        with self.lock:  # held throughout: a descriptor is closed only once out of `kept`, under the lock
            for key in [key for key, (_, descriptor) in self.kept.items() if os.fstat(descriptor).st_nlink == 0]:
                os.close(self.kept.pop(key)[1])

    def reset(self) -> None:
        """Forget everything (in a forked child, where the parent's lock may have been held by another thread),
        closing the child's copies of the descriptors."""
        for _, descriptor in self.kept.values():
            with contextlib.suppress(OSError):
                os.close(descriptor)
        self.lock, self.kept = threading.Lock(), {}


kept_mappings = KeptMappings()  # this process's
with contextlib.suppress(AttributeError):  # os.register_at_fork: POSIX only
    os.register_at_fork(after_in_child=kept_mappings.reset)
