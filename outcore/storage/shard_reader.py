"""Read one chunk of a field straight from its shard file: one ranged read, crc32c, Blosc, done.

Zarr's reader runs every read through one event-loop thread, reads the shard index again for each
chunk and copies the bytes several times; on two cores it could not read faster with two threads than
with one (benchmarks/iterate.py). For the layout outcore writes — a local directory or zip, sharded
along the samples, codecs ``bytes → [blosc] → crc32c``, index ``bytes → crc32c`` at the end — this
module reads the shard index once per shard and decodes each chunk with calls that release the GIL,
directly into its output array, so reader threads really run in parallel. Any other layout falls back
to Zarr itself (`ShardReader.direct` says which path is taken). Tests compare both paths.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import zarr
from numcodecs import blosc
from zarr.storage import LocalStore

from ..errors import CorruptChunkError
from .zipstore import RangeZipStore

_EMPTY = 2**64 - 1  # index entry of a chunk that was never written
_CHECKSUM_BYTES = 4
_CORRUPTION = re.compile(r"checksum|decompress|blosc|corrupt", re.IGNORECASE)


class ShardReader:
    """``read(chunk)`` returns samples ``[chunk * chunk_size, ...)`` of one field as a numpy array.

    ``samples`` — ``(num_samples, chunk_size)`` — names samples in errors when the array's own axis 0
    is not the sample axis (the bytes of an encoded field: chunk ``k`` holds sample chunk ``k``).
    """

    def __init__(
        self, array: zarr.Array, field: str, where: str, num_samples: int, *, samples: tuple[int, int] | None = None
    ) -> None:
        self.array, self.field, self.where, self.num_samples = array, field, where, num_samples
        self.chunk_size = array.chunks[0]
        self._samples = samples or (num_samples, self.chunk_size)
        self._layout = _direct_layout(array)
        self._indexes: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._scratch = threading.local()  # one reusable read buffer per thread: no allocation per chunk

    @property
    def direct(self) -> bool:
        return self._layout is not None

    def empty(self) -> np.ndarray:
        """A buffer that `read` can fill: a whole chunk of this field."""
        return np.empty((self.chunk_size, *self.array.shape[1:]), dtype=self.array.dtype)

    def read(self, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        """The chunk's samples; decoded into ``out`` (from `empty`) when given."""
        start = chunk * self.chunk_size
        stop = min(self.num_samples, start + self.chunk_size)
        if self._layout is None:
            values = read_samples(self.array, (slice(start, stop),), self.field, self.where)
            if out is None:
                return values
            out[: len(values)] = values
            return out[: len(values)]
        return self._read_direct(chunk, self.empty() if out is None else out)[: stop - start]

    def _read_direct(self, chunk: int, out: np.ndarray) -> np.ndarray:
        shard, inner = divmod(chunk, self._layout.chunks_per_shard)
        offset, nbytes = self._index(shard)[inner]
        if offset == _EMPTY:
            out[...] = self.array.metadata.fill_value
            return out
        scratch = getattr(self._scratch, "buffer", None)
        if scratch is None or len(scratch) < nbytes:
            scratch = self._scratch.buffer = bytearray(int(nbytes))
        payload = memoryview(scratch)[: int(nbytes)]
        self._layout.read_into(shard, int(offset), payload)
        data = payload[:-_CHECKSUM_BYTES]
        if crc32c.crc32c(data).to_bytes(4, "little") != payload[-_CHECKSUM_BYTES:]:
            raise self._corrupt(chunk, "stored and computed crc32c checksums differ")
        try:
            if self._layout.blosc:
                blosc.decompress(data, out)
            else:
                out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        except (RuntimeError, ValueError) as error:
            raise self._corrupt(chunk, f"cannot decompress ({error})") from None
        return out

    def _index(self, shard: int) -> np.ndarray:
        index = self._indexes.get(shard)
        if index is None:
            raw = bytearray(self._layout.index_bytes)
            self._layout.read_into(shard, -len(raw), memoryview(raw))
            if crc32c.crc32c(raw[:-_CHECKSUM_BYTES]).to_bytes(4, "little") != raw[-_CHECKSUM_BYTES:]:
                raise self._corrupt(shard * self._layout.chunks_per_shard, "the shard index fails its checksum")
            index = np.frombuffer(raw[:-_CHECKSUM_BYTES], dtype="<u8").reshape(-1, 2)
            with self._lock:
                self._indexes[shard] = index
        return index

    def _corrupt(self, chunk: int, reason: str) -> CorruptChunkError:
        num_samples, chunk_size = self._samples
        first = chunk * chunk_size
        last = min(num_samples, first + chunk_size) - 1
        key = self._layout.key(chunk // self._layout.chunks_per_shard)
        return CorruptChunkError(
            f"{self.where}: field {self.field!r}, chunk {chunk} (samples {first}..{last}, in file {key}) is "
            f"corrupt: {reason}. Restore that file from a copy or re-create the store from its source."
        )


class _DirectLayout:
    """Where a field's shard files are and how their chunks are encoded (outcore's layout only)."""

    def __init__(self, array: zarr.Array, files: Any, blosc_codec: bool) -> None:
        self.files, self.blosc = files, blosc_codec
        self.prefix, self.ndim = array.path, array.ndim
        self.chunks_per_shard = array.shards[0] // array.chunks[0]
        self.index_bytes = 16 * self.chunks_per_shard + _CHECKSUM_BYTES

    def key(self, shard: int) -> str:
        return "/".join([self.prefix, "c", str(shard)] + ["0"] * (self.ndim - 1))

    def read_into(self, shard: int, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from the shard file at ``offset`` (from its end when negative)."""
        if self.files.read_into(self.key(shard), offset, buffer) != len(buffer):
            raise OSError(f"shard file {self.key(shard)} is shorter than its index says")


class _LocalFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def read_into(self, key: str, offset: int, buffer: memoryview) -> int:
        with open(self.root / key, "rb", buffering=0) as file:
            file.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
            return file.readinto(buffer)


class _ZipFiles:
    def __init__(self, store: RangeZipStore) -> None:
        self.store = store

    def read_into(self, key: str, offset: int, buffer: memoryview) -> int:
        return self.store.read_range_into(key, offset, buffer)


def _direct_layout(array: zarr.Array) -> _DirectLayout | None:
    metadata = array.metadata.to_dict()
    codecs = metadata.get("codecs") or [{}]
    if metadata.get("zarr_format") != 3 or len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
        return None
    config = codecs[0]["configuration"]
    inner = [codec["name"] for codec in config["codecs"]]
    index = [codec["name"] for codec in config["index_codecs"]]
    little = all(c.get("configuration", {}).get("endian", "little") == "little"
                 for c in (*config["codecs"], *config["index_codecs"]) if c["name"] == "bytes")
    plain = tuple(config["chunk_shape"][1:]) == tuple(array.shape[1:]) == tuple(array.shards[1:])
    if not (little and plain and index == ["bytes", "crc32c"] and config.get("index_location") == "end"
            and inner in (["bytes", "blosc", "crc32c"], ["bytes", "crc32c"])
            and np.dtype(array.dtype).byteorder in ("=", "|", "<")):
        return None
    store = array.store
    if isinstance(store, LocalStore):
        files: Any = _LocalFiles(Path(store.root))
    elif isinstance(store, RangeZipStore):
        files = _ZipFiles(store)
    else:
        return None
    return _DirectLayout(array, files, "blosc" in inner)


def read_samples(array: zarr.Array, selection: tuple[slice, ...], field_name: str, where: str) -> np.ndarray:
    """``array[selection]`` through zarr, turning a checksum or decompression failure into a
    `CorruptChunkError` that names the field, the chunk and its shard file, and says what to do."""
    try:
        return array[selection]
    except (ValueError, RuntimeError) as error:
        if not _CORRUPTION.search(str(error)):
            raise
        start = selection[0].start or 0
        chunk_size, shard_size = array.chunks[0], (array.shards or array.chunks)[0]
        chunk = start // chunk_size
        key = "/".join(["c", str(start // shard_size)] + ["0"] * (array.ndim - 1))
        raise CorruptChunkError(
            f"{where}: field {field_name!r}, chunk {chunk} (samples {chunk * chunk_size}.."
            f"{min(array.shape[0], (chunk + 1) * chunk_size) - 1}, in file {field_name}/{key}) is corrupt: "
            f"{error}. Restore that file from a copy or re-create the store from its source."
        ) from error
