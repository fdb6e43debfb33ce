"""Mappings of shared-memory files, kept by each process for the next batch made in or read from a file.

Mapping a batch's file costs its page tables, whoever maps it: on 2 cores, a 12.6 MB batch (256 x 128
x 128 x 3) took 1.5 ms to map filled at once (``MAP_POPULATE``) and 3.2 ms filled page by page as it is
read, against 0.3 ms to write all of it through a mapping kept: about 6 µs a sample on the worker that
writes it and 12 µs on the consumer that reads it, a tenth of a JPEG decode. The files of a mailbox
are recycled (`outcore.iterate.shared`), so each comes back every few batches: `KeptMappings` keeps a
process's mapping of each file, by folder and inode, and hands it out again when the file comes back.

An inode number names a file only while the file exists (a new file may get a removed one's number):
a mapping is kept for a file of a folder only, and the files of a mailbox's folder are never removed
one by one while it exists. They are renamed in it, moved to the consumer's spare folder (which moves
their mappings along, `KeptMappings.move`), or removed with the whole folder; the mappings of a folder
go with it: `drop` where the process removes it; `prune` for a consumer's folders seen by a worker, run
as the worker takes a free file and, on a Dask worker, every `PRUNE_SECONDS` on its event loop (a
mapping keeps a removed file's memory; an idle worker lets go of it there).

>>> import shutil, tempfile
>>> folder = Path(tempfile.mkdtemp(dir="/dev/shm"))
>>> kept = KeptMappings()
>>> first = kept.map(folder, "a", 4096, create=True)
>>> os.rename(folder / "a", folder / "b")  # the file, recycled under another name
>>> kept.map(folder, "b", 4096) is first
True
>>> kept.drop(folder); shutil.rmtree(folder)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from pathlib import Path

POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux
PRUNE_SECONDS = 2.0  # how soon an idle Dask worker lets go of the mappings of a removed folder's files


def map_file(path: Path, size: int, *, create: bool, populate: bool, start: int = 0) -> mmap.mmap:
    """``size`` bytes of file ``path`` mapped for reading and writing (from byte ``start``, a multiple of
    ``mmap.ALLOCATIONGRANULARITY``); ``create`` makes the file and reserves its room first
    (``posix_fallocate``: no room is an ``OSError`` now, not a crash when written); ``populate`` maps its
    pages at once (one call instead of a fault per page, for a file about to be written or read whole)."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL if create else os.O_RDWR, 0o600)
    try:
        if create:
            os.posix_fallocate(descriptor, 0, size)
        return mmap.mmap(descriptor, size, flags=mmap.MAP_SHARED | (POPULATE if populate else 0), offset=start)
    finally:
        os.close(descriptor)


class KeptMappings:
    """A process's mappings of the files of shared-memory folders, by ``(inode, start, size)`` in each folder."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.folders: dict[Path, dict[tuple[int, int, int], mmap.mmap]] = {}

    def map(self, folder: Path, name: str, size: int, *, create: bool = False, start: int = 0,
            inode: int | None = None) -> mmap.mmap:
        """File ``name`` of ``folder`` mapped as `map_file` maps it (pages filled at once): the mapping kept
        from the last time, if any (``inode``: the file's, when the caller knows it)."""
        path = folder / name
        if not create:
            key = (os.stat(path).st_ino if inode is None else inode, start, size)
            with self.lock:
                mapped = self.folders.get(folder, {}).get(key)
            if mapped is not None:
                return mapped
        mapped = map_file(path, size, create=create, populate=True, start=start)
        key = (os.stat(path).st_ino, start, size) if create else key
        with self.lock:
            self.folders.setdefault(folder, {})[key] = mapped
        return mapped

    def kept(self, folder: Path) -> set[int]:
        """The inodes of ``folder``'s files this process keeps a mapping of."""
        with self.lock:
            return {inode for inode, _, _ in self.folders.get(folder, {})}

    def move(self, source: Path, target: Path, inode: int) -> None:
        """The file of ``inode`` moved from folder ``source`` to ``target``: so do its mappings."""
        with self.lock:
            kept = self.folders.get(source, {})
            for key in [key for key in kept if key[0] == inode]:
                self.folders.setdefault(target, {})[key] = kept.pop(key)
            if not kept:
                self.folders.pop(source, None)

    def drop(self, folder: Path) -> None:
        """Forget ``folder``'s mappings (it is about to go; arrays still using one keep it alive)."""
        with self.lock:
            self.folders.pop(folder, None)

    def prune(self) -> None:
        """Forget the mappings of the folders that are gone (a file leaves a folder only as its consumer
        closes it: then to its spare folder, which the consumer's own `move` follows)."""
        with self.lock:
            for gone in [known for known, kept in self.folders.items() if not kept or not known.is_dir()]:
                del self.folders[gone]

    def reset(self) -> None:
        """Forget everything (in a forked child, where the parent's lock may have been held by another thread)."""
        self.lock, self.folders = threading.Lock(), {}


kept_mappings = KeptMappings()  # this process's
with contextlib.suppress(AttributeError):  # os.register_at_fork: POSIX only
    os.register_at_fork(after_in_child=kept_mappings.reset)
