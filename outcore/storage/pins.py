"""What a reader pins of a local store when it opens it, so that it reads that store or fails saying so.

A directory store can be replaced under a reader in many ways: an ingest with ``overwrite=True`` swaps
in a new directory, ``mv`` or a copy puts another store's files at the same paths, ``rsync`` replaces
them one by one, ``cp`` rewrites them in place. A reader that opened the store holds its metadata
(counts, classes, chunk layout); reading another store's bytes under it is silently wrong.

So `Pins.take` records, when the store is opened, each shard file's *stamp* (inode, modification time
and size) and the store's *generation* (the id its attributes carry, made when the store was created
and kept by appends). Every shard file the direct reader opens must carry its pinned stamp (`check`),
also when read by a worker process that opened the store after it was replaced: the opener passes the
parent's pins on. A file that is gone or of another stamp is `StoreChangedError`, with one exception: a
store that grows (a Writer's flush, an append) replaces the shard file holding its last samples, the
same generation and the same bytes for the chunks that were there (`check_growth`), which old readers
go on reading. A ``.zip`` store is one file, pinned by its stamp (`outcore.storage.zipstore`).

>>> pins = Pins.take(Path("train.zarr"), "9f0c...", {"labels/c/0": 0, "labels/c/1": 16 * 8 + 4})  # doctest: +SKIP
>>> pins.check("labels/c/0", os.fstat(fd))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from ..errors import StoreChangedError
from ..format import ATTRS_KEY
from .failures import retried

_EMPTY = 2**64 - 1  # a shard index's entry of a chunk never written
Stamp = tuple[int, int, int]  # inode, modification time (ns), size: what tells one version of a file from another


def stamp_of(status: os.stat_result) -> Stamp:
    return status.st_ino, status.st_mtime_ns, status.st_size


@dataclass
class Pins:
    """The stamps of a local store's shard files and its generation, as they were when it was opened.

    ``growing`` holds the files that may be replaced by a growing store of the same generation (each
    array's last shard), with the shard index each had, so that a new version is checked to keep the
    chunks that were there; ``grown``, the versions found to; ``uncached``, whether the page cache could not hold
    the files when the store's first reader was made (`outcore.storage.shard_reader`: then read in huge pages).
    """

    root: Path
    generation: str | None
    files: dict[str, Stamp]
    growing: dict[str, np.ndarray | None] = field(default_factory=dict)
    layouts: dict[str, str] = field(default_factory=dict)  # a growing file's array's chunking, as JSON
    grown: set[Stamp] = field(default_factory=set)  # new versions of growing files, checked
    uncached: bool | None = None  # whether the page cache could not hold its files: found by its first shard reader

    @classmethod
    def take(cls, root: Path, generation: str | None, shards: Mapping[str, int]) -> Pins:
        """Pin the shard files ``shards`` (relative to ``root``) of the store at ``root``; a growing
        store's last shards map to the size of their index (the others to 0), which is read now. A file
        that is not there is left unpinned: the reader finds it missing, which is corruption, not a change."""
        files, growing, layouts = {}, {}, {}
        for key, index_bytes in shards.items():
            pinned = retried(partial(_pin, root / key, index_bytes), str(root), f"shard file {key}")
            if pinned is None:
                continue
            stamp, entries = pinned
            files[key] = stamp
            if index_bytes:
                growing[key], layouts[key] = entries, _layout(root, key)
        return cls(root, generation, files, growing, layouts)

    def check(self, key: str, status: os.stat_result) -> None:
        """`StoreChangedError` unless the open file ``key`` (its ``status``) is the version pinned, or may
        be a growing store's new version of its last shard (its index is checked on reading:
        `check_growth`)."""
        pinned, stamp = self.files.get(key), stamp_of(status)
        if pinned is None or stamp == pinned or stamp in self.grown:
            return
        if key not in self.growing:
            raise self.changed(key, "another file stands at its path")
        reason = self.replaced()
        if reason is None and _layout(self.root, key) != self.layouts.get(key):
            reason = "its field was written again in other chunks"  # an append that grew the chunks' room
        if reason is not None:
            raise self.changed(key, reason)

    def check_growth(self, key: str, stamp: Stamp, entries: np.ndarray) -> None:
        """A new version ``stamp`` of a growing file, whose shard index is ``entries``, must keep every
        whole chunk the pinned version had, at the same offsets and sizes (its last, which may have been
        partial, grows too): else it is another store's file."""
        if key not in self.growing or self.files.get(key) in (None, stamp) or stamp in self.grown:
            return
        old = self.growing[key]
        if old is not None:
            kept = np.flatnonzero(old[:, 0] != _EMPTY)[:-1]
            if len(entries) != len(old) or not np.array_equal(entries[kept], old[kept]):
                raise self.changed(key, "its chunks are not the ones it held")
        self.grown.add(stamp)

    def missing(self, key: str) -> StoreChangedError | None:
        """The error for a pinned file that is gone because the store there now is another one, or none is;
        ``None`` when the store opened is still there (a file missing from it is corruption)."""
        reason = self.replaced() if key in self.files else None
        return None if reason is None else self.changed(key, reason)

    def replaced(self) -> str | None:
        """Why the store at the root is not the one opened (gone, or of another generation), or ``None``."""
        try:
            document = json.loads((self.root / "zarr.json").read_bytes())
        except FileNotFoundError:
            return "the store is gone"
        except (OSError, ValueError) as error:
            return f"its metadata cannot be read now ({error})"
        attributes = document.get("attributes") if isinstance(document, dict) else None
        outcore = attributes.get(ATTRS_KEY) if isinstance(attributes, dict) else None
        found = outcore.get("generation") if isinstance(outcore, dict) else None
        if found != self.generation:
            return "the store there now is another one"
        return None

    def changed(self, key: str, reason: str) -> StoreChangedError:
        return StoreChangedError(
            f"{self.root}: shard file {key} is not the one it was when the store was opened ({reason}): the store "
            "was replaced while it was read (an overwrite, a copy, a move). Open the dataset again to read the "
            "store that is there now"
        )


def _layout(root: Path, key: str) -> str:
    """The chunking of the array that shard file ``key`` belongs to (its ``zarr.json``'s chunk grid and
    codecs), as JSON; ``""`` when it cannot be read."""
    try:
        document = json.loads((root / key.partition("/c/")[0] / "zarr.json").read_bytes())
        return json.dumps([document.get("chunk_grid"), document.get("codecs")], sort_keys=True)
    except (OSError, ValueError, AttributeError):
        return ""


def _entries(raw: bytes, index_bytes: int) -> np.ndarray | None:
    """A shard index's ``(offset, nbytes)`` entries, or ``None`` when the bytes are not a whole index."""
    if len(raw) != index_bytes:
        return None
    return np.frombuffer(raw[:-4], dtype="<u8").reshape(-1, 2).copy()


def _pin(path: Path, index_bytes: int) -> tuple[Stamp, np.ndarray | None] | None:
    """The file's stamp, and with ``index_bytes``, the shard index at its end (read through one opening);
    None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        status = os.fstat(fd)
        if not index_bytes:
            return stamp_of(status), None
        return stamp_of(status), _entries(os.pread(fd, index_bytes, max(0, status.st_size - index_bytes)), index_bytes)
    finally:
        os.close(fd)
