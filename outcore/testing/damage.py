"""Damage a store on purpose, the way disks and people do: for tests of what readers report."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import crc32c
import numpy as np

from ..storage import open_group, shard_path, stored_members

_INDEX_ENTRY = 16  # (offset, nbytes) as two little-endian uint64 per chunk
_CHECKSUM = 4


def chunk_location(location: str | os.PathLike, field: str, chunk: int) -> tuple[Path, int, int]:
    """Where chunk ``chunk`` of array ``field`` lies on disk: ``(file, offset, nbytes)``; for a zip
    store, the zip file and the offset within it."""
    location = str(location).removeprefix("file://")
    array = open_group(location, mode="r")[field]
    chunks_per_shard = array.shards[0] // array.chunks[0]
    shard, inner = divmod(chunk, chunks_per_shard)
    key = shard_path(array, shard)
    if location.endswith(".zip"):
        with open(location, "rb") as raw:
            path, (base, size) = Path(location), stored_members(raw)[key]
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
    and zip stores; the byte is clamped to the chunk); return the file changed. The file keeps its
    modification time, as it does when the disk flips a bit: a reader that opened the store before
    finds a corrupt chunk, not another version of the file.

    >>> corrupt_chunk("train.zarr", "images", 3)  # doctest: +SKIP
    PosixPath('train.zarr/images/c/0/0/0/0')
    """
    path, offset, nbytes = chunk_location(location, field, chunk)
    status = path.stat()
    with open(path, "r+b") as file:
        file.seek(offset + min(at, nbytes - 1))
        value = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([value[0] ^ 0xFF]))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    return path


def shard_key(location: str | os.PathLike, field: str, shard: int) -> str:
    """The key of shard file ``shard`` of array ``field`` (``images/c/3/0/0/0``)."""
    return shard_path(open_group(str(location).removeprefix("file://"), mode="r")[field], shard)


def delete_shard(location: str | os.PathLike, field: str, shard: int) -> str:
    """Remove shard file ``shard`` of array ``field`` (from a zip store too); return its key."""
    key = shard_key(location, field, shard)
    _rewrite(location, key, None)
    return key


def truncate_shard(location: str | os.PathLike, field: str, shard: int, size: int) -> str:
    """Cut shard file ``shard`` of array ``field`` to its first ``size`` bytes; return its key."""
    key = shard_key(location, field, shard)
    _rewrite(location, key, lambda data: data[:size])
    return key


def _rewrite(location: str | os.PathLike, key: str, change: Callable[[bytes], bytes] | None) -> None:
    """Replace member or file ``key`` by ``change(its bytes)``, or remove it when ``change`` is None."""
    location = str(location).removeprefix("file://")
    if not location.endswith(".zip"):
        path = Path(location) / key
        if change is None:
            path.unlink()
        else:
            path.write_bytes(change(path.read_bytes()))
        return
    rewritten = Path(location + ".rewrite")
    with zipfile.ZipFile(location) as source, zipfile.ZipFile(rewritten, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == key:
                if change is None:
                    continue
                data = change(data)
            target.writestr(info.filename, data)
    os.replace(rewritten, location)


def rewrite_shard_index(location: str | os.PathLike, field: str, shard: int,
                        change: Callable[[np.ndarray], None]) -> None:
    """Let ``change`` edit shard ``shard``'s index of array ``field`` in place — an (n, 2) array of
    (offset, nbytes) per chunk — and write it back with a valid checksum, as a forger would."""
    array = open_group(str(location).removeprefix("file://"), mode="r")[field]
    chunks_per_shard = array.shards[0] // array.chunks[0]

    def forged(data: bytes) -> bytes:
        cut = len(data) - (chunks_per_shard * _INDEX_ENTRY + _CHECKSUM)
        index = np.frombuffer(data[cut:-_CHECKSUM], dtype="<u8").reshape(-1, 2).copy()
        change(index)
        raw = index.astype("<u8").tobytes()
        return data[:cut] + raw + crc32c.crc32c(raw).to_bytes(_CHECKSUM, "little")

    _rewrite(location, shard_key(location, field, shard), forged)


def replace_chunk(location: str | os.PathLike, field: str, chunk: int, payload: bytes) -> None:
    """Store ``payload`` (the codecs' output, before the crc32c) as chunk ``chunk`` of array ``field``, with a
    valid checksum and shard index, as a buggy writer or a forger would: the store passes every checksum."""
    array = open_group(str(location).removeprefix("file://"), mode="r")[field]
    chunks_per_shard = array.shards[0] // array.chunks[0]
    shard, inner = divmod(chunk, chunks_per_shard)

    def forged(data: bytes) -> bytes:
        cut = len(data) - (chunks_per_shard * _INDEX_ENTRY + _CHECKSUM)
        index = np.frombuffer(data[cut:-_CHECKSUM], dtype="<u8").reshape(-1, 2).copy()
        stored = payload + crc32c.crc32c(payload).to_bytes(_CHECKSUM, "little")
        index[inner] = (cut, len(stored))
        raw = index.astype("<u8").tobytes()
        return data[:cut] + stored + raw + crc32c.crc32c(raw).to_bytes(_CHECKSUM, "little")

    _rewrite(location, shard_key(location, field, shard), forged)
