"""Read a sample's picture bytes by its reference (`outcore.ingest.records.parts`): a file on this
machine or in an object store, a byte range of a record file, a picture unpacked into the ingest's
scratch folder, or an LMDB value. One reader serves an ingest; it pickles small (no open file), and
opens what it reads once per process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ImageError, SourceError
from ...imaging import read_image_file
from ...storage.remote import is_object_url, redact
from .locations import per_process, read_file, read_range
from .parts import parse
from .spill import unpacked_name


@dataclass(frozen=True)
class SampleReader:
    """Reads samples by reference. ``values`` turns an LMDB value into picture bytes (the format's, for
    LMDB; None elsewhere); ``unpacked`` is the folder where pictures of files not readable at a place were
    unpacked (`outcore.ingest.records.spill`).

    >>> SampleReader().read("photos/cat/1.jpg")[:2]  # doctest: +SKIP
    b'\\xff\\xd8'
    """

    storage_options: Mapping[str, Any] | None = field(default=None, repr=False)
    values: Callable[[bytes, bytes], bytes] | None = None
    unpacked: str | None = None

    def paths_are_files(self) -> bool:
        """Whether this reader reads a plain local path (no record part, not a URL) as the whole file there, so that
        outcore's C calls may read such paths themselves: outcore's own reader, not a subclass (which may read them
        its own way).

        >>> SampleReader().paths_are_files()
        True
        """
        return type(self) is SampleReader

    def read(self, reference: str) -> bytes:
        """The picture's bytes; a record that cannot be read is an `ImageError` naming it."""
        where = parse(reference)
        try:
            if where.damage is not None:
                raise ImageError(where.name, where.damage)
            if where.span is not None:
                return read_range(where.file, *where.span, self.storage_options)
            if where.index is not None:
                return self._unpacked(where.file, where.index, where.name)
            if where.key is not None:
                return self._lmdb_value(where.file, where.key, where.name)
            if is_object_url(where.file):
                return read_file(where.file, self.storage_options)
            return read_image_file(where.file)
        except OSError as error:
            raise ImageError(redact(where.name), f"cannot read it ({error})") from None
        except SourceError as error:  # an object that is not there (any more)
            if not is_object_url(where.file):
                raise
            raise ImageError(redact(where.name), f"file not found ({error})") from None

    def _unpacked(self, file: str, index: int, name: str) -> bytes:
        if self.unpacked is None:
            raise SourceError(f"{name}: its file was to be unpacked first, and was not (outcore's mistake)")
        base = os.path.join(self.unpacked, unpacked_name(file))
        offsets = per_process(f"offsets {base}", lambda: np.load(base + ".offsets.npy", allow_pickle=False))
        start, stop = int(offsets[index]), int(offsets[index + 1])
        if stop == start:
            raise ImageError(name, "it could not be read when its file was unpacked")
        return read_range(base + ".bin", start, stop - start)

    def _lmdb_value(self, file: str, key: bytes, name: str) -> bytes:
        environment = lmdb_environment(file)
        with environment.begin(buffers=False) as transaction:
            value = transaction.get(key)
        if value is None:
            raise ImageError(name, "the key is no longer in the LMDB environment (it changed during the ingest)")
        return self.values(key, value) if self.values is not None else value


def lmdb_environment(path: str) -> Any:
    """The process's one environment of the LMDB at ``path`` (LMDB allows one per process), opened anew
    for a new file at that path."""
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    stat = os.stat(data)
    return per_process(f"lmdb {path} {stat.st_ino} {stat.st_mtime_ns}", lambda: open_lmdb(path))


def open_lmdb(path: str) -> Any:
    """An LMDB environment opened read-only, without a lock file (it may be on a read-only disk)."""
    try:
        import lmdb
    except ImportError:
        raise SourceError(f"{path} is an LMDB environment; reading it needs lmdb: pip install 'outcore[lmdb]'") \
            from None
    try:
        return lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=os.path.isdir(path),
                         max_readers=1024)
    except lmdb.Error as error:
        raise SourceError(f"{path} cannot be opened as an LMDB environment ({error})") from None
