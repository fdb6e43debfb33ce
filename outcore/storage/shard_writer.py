"""Write whole shard files of a field straight into a local store: each chunk's Blosc and crc32c with the GIL
released, the file in one write.

Zarr's writer runs every chunk through its codec pipeline on its event loop, in Python holding the GIL (the
small fields of an ingest come in chunks of as few as 32 samples: 7 fields of 100,000 files are 22,000
chunks; docs/benchmarks.md's "Figures behind the code" says what each cost). For the layout outcore writes
(`outcore.storage.shard_reader.direct_codecs`) in a local directory, `write_rows` encodes the chunks of whole
shard files itself, into the same bytes zarr writes (tests compare the files) but for the chunks a fast codec
shrinks too little, stored in raw Blosc frames (`outcore.format.raw_above`), and replaces each file at once;
rows that do not span whole shard files, other layouts and other stores are written by zarr, every chunk
written (`writable`).
"""

from __future__ import annotations

import math
import os
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import zarr
from numcodecs import blosc
from zarr.storage import LocalStore

from ..format import raw_above
from .chunk_reads import encode_at_once
from .groups import shard_path, writable
from .shard_reader import direct_codecs
from .small_rows import SmallColumn

_EMPTY = 2**64 - 1  # index entry of a chunk that was never written (beyond the array's end)
_FRAME_GROWTH = 16 + 4  # the most a Blosc frame adds to a chunk's bytes, and its crc32c
_SHUFFLES = {"noshuffle": blosc.NOSHUFFLE, "shuffle": blosc.SHUFFLE, "bitshuffle": blosc.BITSHUFFLE}
_KEYS = {"name": "default", "configuration": {"separator": "/"}}  # the chunk keys `shard_path` names


def write_rows(target: zarr.Array | SmallColumn, start: int, values: np.ndarray) -> None:
    """``target[start : start + len(values)] = values``, every chunk written (even one of fill values only,
    `writable`); whole shard files of a local store written directly (see the module).

    >>> import tempfile
    >>> array = zarr.create_array(tempfile.mkdtemp(), shape=(10,), chunks=(2,), shards=(4,), dtype="i8")
    >>> write_rows(array, 0, np.arange(10))
    >>> array[:].tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    stop = start + len(values)
    if isinstance(target, SmallColumn):  # rows saved apart: every row saved
        target[start:stop] = values
        return
    codecs = _direct_codecs(target, start, stop, values)
    if codecs is None:
        writable(target)[start:stop] = values
        return
    rows = target.shards[0]
    for begin in range(start, stop, rows):
        _write_shard(target, begin // rows, values[begin - start : begin - start + rows], codecs)


def copy_rows(target: zarr.Array, parts: Sequence[tuple[Any, int, int]]) -> None:
    """Write rows ``[start, stop)`` of each ``(source, start, stop)`` (back to back, in order; a source is
    anything sliced by rows: a zarr array, a `SmallColumn`) into the same rows of ``target``, one whole
    shard file of it at a time (each file written once; the first part starts on a shard's first row), in
    bounded memory."""
    if not parts:
        return
    step, first, last = (target.shards or target.chunks)[0], parts[0][1], parts[-1][2]
    for begin in range(first, last, step):
        end = min(last, begin + step)
        rows = [source[max(begin, start) : min(end, stop)] for source, start, stop in parts
                if start < end and stop > begin]
        write_rows(target, begin, np.concatenate(rows))


def _direct_codecs(array: zarr.Array, start: int, stop: int, values: np.ndarray) -> list[dict[str, Any]] | None:
    """``array``'s chunk codecs where `write_rows` writes ``values`` into rows ``[start, stop)`` itself: whole
    shard files (the last may end at the array's end), of its dtype and row shape, into a writable local
    directory whose codecs it knows (`_direct_format`); else ``None``."""
    store = array.store
    if not (isinstance(store, LocalStore) and not store.read_only) or (codecs := _direct_format(array)) is None:
        return None
    rows = array.shards[0]
    if start % rows or (stop % rows and stop != array.shape[0]) or stop > array.shape[0]:
        return None
    if not (isinstance(values, np.ndarray) and values.dtype.newbyteorder("=") == array.dtype.newbyteorder("=")
            and values.shape[1:] == array.shape[1:]):
        return None
    return codecs


_FORMATS: dict[int, tuple[Any, list[dict[str, Any]] | None]] = {}  # id(metadata): (the metadata, `_direct_format`)
_FORMATS_HELD = 256  # metadata objects kept at most (each small): then forgotten all at once


def _direct_format(array: zarr.Array) -> list[dict[str, Any]] | None:
    """``array``'s chunk codecs where `write_rows` can write its shard files itself: sharded, outcore's chunk keys,
    codecs it knows (`direct_codecs`), Blosc's typesize the dtype's; else ``None``. Found once for each metadata
    object (zarr's ``to_dict`` takes about a millisecond holding the GIL; an array opened once, `StoreArrays`, is
    written by every task of an ingest)."""
    metadata = array.metadata
    known = _FORMATS.get(id(metadata))
    if known is not None and known[0] is metadata:  # the very object: its id cannot have been reused
        return known[1]
    codecs = direct_codecs(array) if array.shards and metadata.to_dict().get("chunk_key_encoding") == _KEYS \
        else None
    typesizes = [codec["configuration"].get("typesize") for codec in codecs or () if codec["name"] == "blosc"]
    if any(size != array.dtype.itemsize for size in typesizes):
        codecs = None
    if len(_FORMATS) >= _FORMATS_HELD:
        _FORMATS.clear()
    _FORMATS[id(metadata)] = (metadata, codecs)
    return codecs


class StoreArrays:
    """The arrays of the group at ``directory``, each opened once in a process and kept: every task writing a
    store's shards writes the same arrays, whose metadata does not change while they do (opening one reads and
    parses its metadata holding the GIL). Pickled without them: each process opens its own.

    >>> arrays = StoreArrays("train.zarr")  # doctest: +SKIP
    >>> arrays["images"].shape  # doctest: +SKIP
    (100000, 224, 224, 3)
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._group: zarr.Group | None = None
        self._opened: dict[str, zarr.Array] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> zarr.Array:
        with self._lock:
            if name not in self._opened:
                self._group = self._group or zarr.open_group(self.directory, mode="r+")
                self._opened[name] = self._group[name]
            return self._opened[name]

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])


def _write_shard(array: zarr.Array, shard: int, rows: np.ndarray, codecs: list[dict[str, Any]]) -> None:
    """Shard file ``shard`` of ``array``, holding ``rows`` (its first rows on): each chunk encoded (the last one
    padded with the fill value, as zarr stores an array's last chunk), then the index and its checksum. Blosc
    chunks are compressed and checksummed by one call outside the GIL where the C extension can
    (`encode_at_once`), else one by one."""
    chunk_rows = array.chunks[0]
    dtype = array.dtype.newbyteorder("<")
    index = np.full((array.shards[0] // chunk_rows, 2), _EMPTY, dtype="<u8")
    settings = _blosc_settings(codecs)
    chunk_bytes = chunk_rows * math.prod(array.shape[1:]) * dtype.itemsize
    most = None if settings is None else raw_above(settings[0], chunk_bytes, _holds_files(array))  # a frame's bytes:
    # more, and the chunk is stored raw
    parts = None if settings is None or encode_at_once is None or not len(rows) else \
        _encoded_at_once(rows, chunk_rows, dtype, array.fill_value, settings, most, index)
    if parts is None:
        parts, offset = [], 0
        for k, begin in enumerate(range(0, len(rows), chunk_rows)):
            data = _compressed(_padded(rows[begin : begin + chunk_rows], chunk_rows, dtype, array.fill_value), settings,
                               most)
            parts += [data, crc32c.crc32c(data).to_bytes(4, "little")]
            index[k] = offset, len(data) + 4
            offset += len(data) + 4
    raw_index = index.tobytes()
    parts += [raw_index, crc32c.crc32c(raw_index).to_bytes(4, "little")]
    path = Path(array.store.root, shard_path(array, shard))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")  # replaced in one step, as zarr does
    try:
        with open(partial, "wb") as file:
            file.writelines(parts)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _padded(rows: np.ndarray, count: int, dtype: np.dtype, fill: Any) -> np.ndarray:
    """``rows`` as a C-contiguous array of ``dtype`` of ``count`` rows at least: rows of ``fill`` after them (as zarr
    stores an array's last chunk), or ``rows`` as they are where they need nothing."""
    rows = np.ascontiguousarray(rows, dtype=dtype)
    if len(rows) >= count:
        return rows
    return np.concatenate([rows, np.full((count - len(rows), *rows.shape[1:]), fill, dtype=dtype)])


def _blosc_settings(codecs: list[dict[str, Any]]) -> tuple[str, int, int, int] | None:
    """``(cname, clevel, shuffle, blocksize)`` of the Blosc codec of ``codecs`` (its typesize the dtype's), as
    numcodecs' ``blosc.compress`` takes them; None without one."""
    for codec in codecs:
        if codec["name"] == "blosc":
            config = codec["configuration"]
            return config["cname"], config["clevel"], _SHUFFLES[config["shuffle"]], config.get("blocksize", 0)
    return None


def _holds_files(array: zarr.Array) -> bool:
    """Whether ``array`` holds the bytes of an encoded field's files (its first dimension ``<field>_bytes``:
    `outcore.storage.encoded.create_encoded_field`), whose chunks keep every byte Blosc saves (`raw_above`)."""
    names = array.metadata.dimension_names
    return bool(names) and str(names[0]).endswith("_bytes")


def _encoded_at_once(rows: np.ndarray, chunk_rows: int, dtype: np.dtype, fill: Any,
                     settings: tuple[str, int, int, int], most: int, index: np.ndarray) -> list[Any] | None:
    """The chunks of ``rows`` (the last padded with ``fill``) compressed by Blosc with ``settings`` (`_blosc_settings`;
    a frame of more than ``most`` bytes made again raw) and checksummed, back to back, by one call of the C extension
    (`encode_at_once`), their entries written into ``index``; None where Blosc failed (the caller encodes them one by
    one, which raises its error)."""
    count = -(-len(rows) // chunk_rows)
    chunks = _padded(rows, count * chunk_rows, dtype, fill)
    size = chunks[:chunk_rows].nbytes
    out = np.empty(count * (size + _FRAME_GROWTH), np.uint8)
    cname, clevel, shuffle, blocksize = settings
    written = encode_at_once(chunks, count, dtype.itemsize, clevel, shuffle, cname, blocksize, most, out,
                             index[:count])
    return None if written is None else [memoryview(out)[:written]]


def _compressed(chunk: np.ndarray, settings: tuple[str, int, int, int] | None, most: int | None) -> Any:
    """``chunk``'s bytes through Blosc with ``settings`` (`_blosc_settings`; a frame of more than ``most`` bytes made
    again raw), or as they are without."""
    if settings is None:
        return memoryview(chunk).cast("B")
    cname, clevel, shuffle, blocksize = settings
    frame = blosc.compress(chunk, cname.encode(), clevel, shuffle, blocksize)
    if most is not None and len(frame) > most:
        return blosc.compress(chunk, cname.encode(), 0, shuffle, blocksize)
    return frame
