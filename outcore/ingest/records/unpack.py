"""Unpack the pictures of record files that cannot be read at a place (GZIP TFRecords, compressed tars,
Parquet and Arrow files, values a function of the user's makes) into the ingest's scratch folder: one file
of pictures back to back and one of their offsets per record file, written by one task each, in parallel.

The folder is the run's own (`outcore.ingest.build.build_store`'s prepared scratch): kept for
``resume=True``, removed with the run. It needs the pictures' bytes in disk space, which is checked first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import numpy as np

from ...errors import SourceError
from ..permute import free_bytes
from ..scheduler import run_tasks
from .reader import unpacked_name

if TYPE_CHECKING:
    from . import RecordFormat


def unpack(format: RecordFormat, locations: Sequence[str], counts: Sequence[int], nbytes: int, folder: Path, *,
           storage_options: Mapping[str, Any] | None, client: Any, progress: bool) -> None:
    """Write the pictures of each file of ``locations`` (holding ``counts`` records) into ``folder``; the
    files already unpacked (a resumed run) are kept."""
    folder.mkdir(parents=True, exist_ok=True)
    todo = [(location, count) for location, count in zip(locations, counts, strict=True)
            if not (folder / f"{unpacked_name(location)}.offsets.npy").exists()]
    if not todo:
        return
    free = free_bytes(folder)
    if nbytes > free:
        raise SourceError(f"unpacking the pictures of {len(todo)} file(s) needs {nbytes / 2**30:.1f} GiB in "
                          f"{folder.parent}, which has {free / 2**30:.1f} GiB free: free some space, or ingest "
                          "from a location on another disk")
    task = dask.delayed(_unpack_file, pure=False)
    tasks = [task(format, location, count, str(folder), storage_options) for location, count in todo]
    run_tasks(tasks, [count for _, count in todo], client=client, progress=progress, description="unpack",
              unit="records")


def _unpack_file(format: RecordFormat, location: str, count: int, folder: str,
                 storage_options: Mapping[str, Any] | None) -> None:
    base = os.path.join(folder, unpacked_name(location))
    offsets = np.zeros(count + 1, dtype=np.int64)
    written, index = 0, -1
    with open(base + ".bin", "wb") as file:
        for index, picture in enumerate(format.pictures(location, storage_options)):
            if index >= count:
                raise SourceError(f"{location} holds more records than when it was scanned: it changed during "
                                  "the ingest; run it again")
            file.write(picture)
            written += len(picture)
            offsets[index + 1] = written
    if index + 1 != count:
        raise SourceError(f"{location} holds {index + 1} records, {count} when it was scanned: it changed during "
                          "the ingest; run it again")
    np.save(base + ".offsets.partial.npy", offsets)
    os.replace(base + ".offsets.partial.npy", base + ".offsets.npy")  # the marker that the file is unpacked
