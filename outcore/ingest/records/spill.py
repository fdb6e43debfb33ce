"""Pictures of record files that cannot be read at a place (GZIP TFRecords, compressed tars, Parquet and
Arrow files, LMDB values a function of the user's reads) are written out while the file is scanned, in the
same pass: one file of pictures back to back and one of their offsets per record file, in a folder the
ingest owns (`unpacking`: beside the store, removed when the ingest ends). The reader reads them there
(`outcore.ingest.records.reader.SampleReader`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ...errors import SourceError
from ...storage.staging import try_lock
from ..permute import free_bytes

PREFIX = ".outcore-unpacked-"  # the folders of unpacked pictures, beside the store


def unpacked_name(location: str) -> str:
    """The name of a file's unpacked pictures (``<name>.bin`` and ``<name>.offsets.npy``)."""
    return hashlib.sha256(location.encode()).hexdigest()[:24]


class Spill:
    """The pictures of one record file, written in its order as it is scanned (`add`), then their offsets
    (`close`: the file is unpacked only once its offsets are there)."""

    def __init__(self, folder: str, location: str) -> None:
        self.base = os.path.join(folder, unpacked_name(location))
        self.file = open(self.base + ".bin", "wb")  # noqa: SIM115 - closed by close()
        self.offsets = [0]

    def add(self, picture: bytes) -> None:
        """The next record's picture (``b""`` for a record that cannot be read)."""
        self.file.write(picture)
        self.offsets.append(self.offsets[-1] + len(picture))

    def close(self) -> None:
        self.file.close()
        np.save(self.base + ".offsets.partial.npy", np.array(self.offsets, dtype=np.int64))
        os.replace(self.base + ".offsets.partial.npy", self.base + ".offsets.npy")

    def discard(self) -> None:
        self.file.close()
        Path(self.base + ".bin").unlink(missing_ok=True)


@contextmanager
def unpacking(near: Path, nbytes: int, locations: Sequence[str]) -> Iterator[str]:
    """A folder in ``near`` for the unpacked pictures of ``locations`` (``nbytes`` of record files, about
    what their pictures take), removed when the block ends; one a killed ingest left (its lock free) is
    removed by the next."""
    near.mkdir(parents=True, exist_ok=True)
    for left in near.glob(f"{PREFIX}*"):
        lock = try_lock(left) if left.is_dir() else None
        if lock is not None:
            shutil.rmtree(left, ignore_errors=True)
            lock.close()
    free = free_bytes(near)
    if nbytes > free:
        raise SourceError(f"unpacking the pictures of {len(locations)} record file(s) needs about "
                          f"{nbytes / 2**30:.1f} GiB in {near}, which has {free / 2**30:.1f} GiB free: free some "
                          "space, or write the store on another disk")
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=near)
    lock = try_lock(Path(folder))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if lock is not None:
            lock.close()
