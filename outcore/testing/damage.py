"""Damage a store on purpose, the way disks and people do: for tests of what readers report."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..storage import open_group, stored_members

_INDEX_ENTRY = 16  # (offset, nbytes) as two little-endian uint64 per chunk
_CHECKSUM = 4


def chunk_location(location: str | os.PathLike, field: str, chunk: int) -> tuple[Path, int, int]:
    """Where chunk ``chunk`` of array ``field`` lies on disk: ``(file, offset, nbytes)``; for a zip
    store, the zip file and the offset within it."""
    location = str(location).removeprefix("file://")
    array = open_group(location, mode="r")[field]
    chunks_per_shard = array.shards[0] // array.chunks[0]
    shard, inner = divmod(chunk, chunks_per_shard)
    key = "/".join([field, "c", str(shard)] + ["0"] * (array.ndim - 1))
    if location.endswith(".zip"):
        path, (base, size) = Path(location), stored_members(location)[key]
    else:
        path, base, size = Path(location) / key, 0, (Path(location) / key).stat().st_size
    index_bytes = chunks_per_shard * _INDEX_ENTRY
    with open(path, "rb") as file:
        file.seek(base + size - index_bytes - _CHECKSUM)
        index = np.frombuffer(file.read(index_bytes), dtype="<u8").reshape(-1, 2)
    offset, nbytes = index[inner]
    return path, base + int(offset), int(nbytes)


def corrupt_chunk(location: str | os.PathLike, field: str, chunk: int, *, at: int = 10) -> Path:
    """Flip the bits of one byte, ``at`` bytes into chunk ``chunk`` of array ``field``, on disk (directory
    and zip stores; the byte is clamped to the chunk); return the file changed.

    >>> corrupt_chunk("train.zarr", "images", 3)  # doctest: +SKIP
    PosixPath('train.zarr/images/c/0/0/0/0')
    """
    path, offset, nbytes = chunk_location(location, field, chunk)
    with open(path, "r+b") as file:
        file.seek(offset + min(at, nbytes - 1))
        value = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([value[0] ^ 0xFF]))
    return path
