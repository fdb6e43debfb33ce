"""`Store`: an outcore store opened for reading, its attributes and arrays checked against each other."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Self

import numpy as np
import zarr
from zarr.core.sync import sync
from zarr.storage import LocalStore

from ..errors import NotAStoreError, OutcoreError, StoreChangedError
from ..format import (
    FieldInfo,
    StoreAttrs,
    ranges_name,
    shapes_name,
)
from .cache import ChunkCache
from .groups import is_url, open_group, samples_per_shard, shard_path
from .pins import Pins
from .remote import RemoteStore, redact
from .safety import check_safe, read_attrs
from .shard_reader import ShardReader
from .zipstore import RangeZipStore

# Bounds on what a reader allocates for one chunk and one shard index. outcore writes chunks of about 8 MiB
# and at most 1,024 chunks per shard: a store past these bounds was not written by it.
MAX_CHUNK_BYTES = 2**30
MAX_CHUNKS_PER_SHARD = 2**20


def open_store(location: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None,
               cache: ChunkCache | None = None) -> Store:
    """Open the store at ``location`` (a directory, a ``.zip`` file or a URL) for reading."""
    return Store.open(location, storage_options=storage_options, cache=cache)


class Store:
    """The fields of an opened store: their attributes, their zarr arrays, and chunk readers.

    ``location`` is where it was opened from (a path or URL), and what processes that read it
    themselves (Dask workers, DataLoader workers) open it by.
    """

    @classmethod
    def open(cls, location: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None,
             cache: ChunkCache | None = None, generation: str | None = None, pins: Pins | None = None) -> Self:
        """Open the store at ``location`` for reading: a directory, a ``.zip`` file, an object store URL
        (``s3://``, ``gs://``, ``az://``, ``https://``; configured by ``storage_options`` or the standard
        environment, read through ``cache``) or another fsspec URL.

        Only metadata is read. The attributes must be outcore's, every array they promise must be there
        with the sample count and chunking they say, and no array may use a pickle or object codec.
        A local store's shard files are pinned (`outcore.storage.pins`): reading one that was replaced
        since is `StoreChangedError`. A worker opening the store its parent opened passes the parent's
        ``pins`` (a local store) or ``generation`` (an object store's, `outcore.storage.upload`): the
        store must still be the one the parent opened, else `StoreChangedError`.
        """
        where = redact(str(location)) if is_url(location) else os.fspath(location)
        try:
            group = open_group(location, mode="r", storage_options=storage_options, cache=cache)
            found = group.store.generation if isinstance(group.store, RemoteStore) else None
            if generation is not None and found != generation:
                raise StoreChangedError(f"{where} was replaced after it was opened (by another ingest): open the "
                                        "dataset again to read the new store")
            attrs = read_attrs(group, where)
            if pins is not None and attrs.generation != pins.generation:
                raise StoreChangedError(f"{where} was replaced after it was opened (the store there now is another "
                                        "one): open the dataset again to read the store that is there now")
            store = cls(group, attrs, where, pins)
            store.opener = partial(cls.open, str(location), storage_options=storage_options, cache=cache,
                                   generation=found, pins=store.pins)
            return store
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            if isinstance(error, OutcoreError):
                raise
            raise NotAStoreError(  # zarr could not parse a zarr.json, say, or a zip's directory
                f"{where}: its metadata cannot be read ({type(error).__name__}: {error}); the store is damaged: "
                "restore it from a copy or re-create it from its source"
            ) from None

    def __init__(self, group: zarr.Group, attrs: StoreAttrs, location: str, pins: Pins | None = None) -> None:
        self.attrs = attrs
        self.location = location
        self.group = group
        self.opener: Callable[[], Store] = partial(type(self).open, location)  # opens it again, as it was
        self._zarr_arrays: dict[str, zarr.Array] = {}  # opened once: from an object store, each open is a request
        self._shard_indexes: dict[str, dict[int, Any]] = {}  # by array: what its readers read (`shard_indexes`)
        check_safe(group, self.array_names(), location)
        for name in attrs.fields:
            self._check_field(name)
        self.pins = pins if pins is not None else self._pin()

    def _pin(self) -> Pins | None:
        """The stamps of a local directory store's shard files (`outcore.storage.pins`); of a zip store, its
        generation only (its file is read through the descriptor opened with it); ``None`` elsewhere (an
        object store pins versions itself)."""
        if isinstance(self.group.store, RangeZipStore):  # its reads come from the file opened
            return Pins(Path(self.group.store.path), self.attrs.generation, {})
        if not isinstance(self.group.store, LocalStore):
            return None
        shards = {}
        for name in self.array_names():
            array = self.group[name]
            count = -(-self._needed(name) // (array.shards or array.chunks)[0])
            index_bytes = 16 * (array.shards[0] // array.chunks[0]) + 4 if array.shards else 0
            for shard in range(count):
                shards[shard_path(array, shard)] = index_bytes if shard == count - 1 else 0
        return Pins.take(Path(self.group.store.root), self.attrs.generation, shards)

    def _needed(self, name: str) -> int:
        """Entries of array ``name`` that the store's samples use: one per sample, or for an encoded image
        field's bytes (a ragged field's rows), a whole region per chunk."""
        in_regions = name in self.attrs.fields and self.attrs.fields[name].in_regions
        return self.num_chunks * self.group[name].chunks[0] if in_regions else len(self)

    @property
    def fields(self) -> tuple[str, ...]:
        """Field names, in the order they were written."""
        return tuple(self.attrs.fields)

    @property
    def chunk_size(self) -> int:
        """Samples per chunk, the unit of storage, reading and shuffling."""
        return self.attrs.chunk_size

    @property
    def num_chunks(self) -> int:
        return math.ceil(len(self) / self.chunk_size)

    @property
    def chunks_per_shard(self) -> int:
        """Chunks of the pictures (the largest field) in one shard file: the fewest any field keeps in one
        (small fields keep more, `outcore.format.Layout.shard_size_for`; 1 when the arrays are not sharded)."""
        return min(samples_per_shard(self.array(name), self.chunk_size) for name in self.fields) // self.chunk_size

    @property
    def roles(self) -> dict[str, str]:
        return {name: info.role for name, info in self.attrs.fields.items()}

    @property
    def classes(self) -> list[str]:
        """Class names of the first target field that has them (``[]`` if none); see `classes_of`."""
        for info in self.attrs.fields.values():
            if info.role == "target" and info.classes is not None:
                return list(info.classes)
        return []

    def classes_of(self, field: str) -> list[str]:
        """Class names of ``field`` in index order (``[]`` if it holds no class indices)."""
        classes = self.info(field).classes
        return list(classes) if classes is not None else []

    def info(self, field: str) -> FieldInfo:
        """What ``field`` is: role, classes, encoding; a `KeyError` naming the fields when there is none."""
        if field not in self.attrs.fields:
            raise KeyError(f"no field {field!r} in {self.location}; fields: {list(self.attrs.fields)}")
        return self.attrs.fields[field]

    def array_names(self) -> list[str]:
        """Every array the fields are stored in (an encoded image field has two, or three when its sizes vary; a
        ragged field two)."""
        return [array for name, info in self.attrs.fields.items() for array in (name, *info.companions(name))]

    def array(self, field: str) -> zarr.Array:
        """The underlying ``zarr.Array`` of ``field`` (may hold more samples than ``len(store)``); for an
        encoded image field, its bytes, its byte ranges under ``<field>_ranges`` and, when its sizes vary,
        its samples' shapes under ``<field>_shapes``."""
        if field not in self._zarr_arrays:
            if field not in self.array_names():
                self.info(field)  # the KeyError naming the fields
            self._zarr_arrays[field] = self.group[field]
        return self._zarr_arrays[field]

    def unpublished(self) -> int:
        """Samples the arrays hold beyond the store's count: a Writer's appends not yet published (it is
        writing, or stopped before publishing them). Readers never see them."""
        lengths = [self.group[name].shape[0] for name, info in self.attrs.fields.items() if not info.in_regions]
        return max(lengths, default=len(self)) - len(self)

    def missing_shards(self) -> list[str]:
        """The shard files the attributes promise that are not in the store (keys, as ``labels/c/3``)."""
        missing = []
        for name in self.array_names():
            array = self.group[name]
            for shard in range(-(-self._needed(name) // (array.shards or array.chunks)[0])):
                key = shard_path(array, shard)
                if not sync(self.group.store.exists(key)):
                    missing.append(key)
        return missing

    def shard_reader(self, field: str) -> ShardReader:
        """A direct reader of ``field``'s stored chunks (bytes, for an encoded image field)."""
        return ShardReader(self.array(field), field, self.location, len(self), pins=self.pins,
                           indexes=self.shard_indexes(field))

    def shard_indexes(self, array: str) -> dict[int, Any]:
        """The shard indexes of array ``array`` that this store's readers read, by shard, shared by them: an iterator
        made each epoch reads no index again (each is used only for the version of its file it was read from)."""
        return self._shard_indexes.setdefault(array, {})

    def __len__(self) -> int:
        return self.attrs.num_samples

    def __contains__(self, field: object) -> bool:
        return field in self.attrs.fields

    def _check_field(self, name: str) -> None:
        """The field's arrays agree with the attributes, and every size a reader allocates is bounded."""
        info = self.attrs.fields[name]
        needed = [name, *info.companions(name)]
        missing = next((array for array in needed if array not in self.group), None)
        if missing is not None:
            raise _malformed(self.location, f"field {name!r} is listed in the attributes but array {missing!r} is "
                                            "not in the store")
        if info.is_image:
            data = self._array_of(name, dtype_kinds="u", ndim=1, length=self.num_chunks * self.group[name].chunks[0],
                                  chunk_samples=None)
            _require(self.location, data.dtype == np.uint8, f"encoded field {name!r} stores {data.dtype}, not bytes")
            ranges = self._array_of(ranges_name(name), dtype_kinds="i", ndim=2, length=len(self),
                                    chunk_samples=self.chunk_size)
            _require(self.location, ranges.shape[1] == 2, f"{ranges_name(name)!r} is not (samples, 2)")
            if info.decode.variable:
                shapes = self._array_of(shapes_name(name), dtype_kinds="i", ndim=2, length=len(self),
                                        chunk_samples=self.chunk_size)
                _require(self.location, shapes.shape[1] == 3, f"{shapes_name(name)!r} is not (samples, 3)")
            return
        if info.is_ragged or info.is_raster:
            rows = self._array_of(name, dtype_kinds="biuf", ndim=1 + len(info.sample_shape or ()),
                                  length=self.num_chunks * self.group[name].chunks[0], chunk_samples=None)
            _require(self.location, rows.dtype.name == info.dtype and tuple(rows.shape[1:]) == info.sample_shape,
                     f"{info.encoding} field {name!r} holds rows of {rows.dtype} {rows.shape[1:]}, but was written "
                     f"with {info.dtype} {info.sample_shape}")
            ranges = self._array_of(ranges_name(name), dtype_kinds="i", ndim=2, length=len(self),
                                    chunk_samples=self.chunk_size)
            _require(self.location, ranges.shape[1] == 2, f"{ranges_name(name)!r} is not (samples, 2)")
            if info.is_raster:
                shapes = self._array_of(shapes_name(name), dtype_kinds="i", ndim=2, length=len(self),
                                        chunk_samples=self.chunk_size)
                _require(self.location, shapes.shape[1] == 3, f"{shapes_name(name)!r} is not (samples, 3)")
            return
        array = self._array_of(name, dtype_kinds="biuf", ndim=None, length=len(self), chunk_samples=self.chunk_size)
        _require(self.location, info.dtype is None or array.dtype.name == info.dtype,
                 f"field {name!r} holds {array.dtype} but was written as {info.dtype}")
        _require(self.location, info.sample_shape is None or tuple(array.shape[1:]) == info.sample_shape,
                 f"field {name!r} holds samples of shape {array.shape[1:]} but was written with {info.sample_shape}")
        if info.is_text:
            _require(self.location, array.dtype == np.uint8 and array.ndim == 2,
                     f"text field {name!r} is {array.dtype} of {array.ndim} dimensions, not UTF-8 bytes (N, width)")
        if info.classes is not None:
            _require(self.location, array.dtype.kind in "iu",
                     f"field {name!r} has class names but holds {array.dtype}, not class indices")

    def _array_of(self, name: str, *, dtype_kinds: str, ndim: int | None, length: int,
                  chunk_samples: int | None) -> zarr.Array:
        """Array ``name``, checked: its data type; chunks of ``chunk_samples`` along the first axis only
        (an encoded field's bytes: regions of any size), at most `MAX_CHUNK_BYTES` each; at least
        ``length`` entries, and a shard file for the last (a store cannot claim more than it holds)."""
        array = self.group[name]
        where = f"array {name!r} ({array.dtype}, shape {array.shape}, chunks {array.chunks})"
        _require(self.location, array.dtype.kind in dtype_kinds, f"{where} has a data type outcore never writes")
        _require(self.location, ndim is None or array.ndim == ndim, f"{where} has {array.ndim} dimensions")
        shards = array.shards or array.chunks
        _require(self.location, array.chunks[1:] == array.shape[1:] and shards[1:] == array.shape[1:],
                 f"{where} is not chunked along its first axis only")
        _require(self.location, chunk_samples is None or array.chunks[0] == chunk_samples,
                 f"{where}: chunks of {array.chunks[0]} samples, the attributes say {chunk_samples}")
        chunk_bytes = math.prod(array.chunks) * array.dtype.itemsize
        _require(self.location, chunk_bytes <= MAX_CHUNK_BYTES and shards[0] % array.chunks[0] == 0
                 and shards[0] // array.chunks[0] <= MAX_CHUNKS_PER_SHARD,
                 f"{where}: chunks of {chunk_bytes:,} bytes in shards of {shards[0] // array.chunks[0]:,}")
        _require(self.location, array.shape[0] >= length, f"{where} holds fewer than the {length:,} it must")
        if array.shape[0] != length and not self.attrs.growing:  # only a Writer or an append leaves more
            raise NotAStoreError(
                f"{self.location}: its attributes say num_samples {self.attrs.num_samples:,} (chunks of "
                f"{self.chunk_size}), but {where} holds {array.shape[0]:,} entries where that count needs "
                f"{length:,}, and no Writer or append is growing the store: the count was edited or the store "
                "is damaged; restore it from a copy or re-create it from its source")
        if length:
            last = shard_path(array, (length - 1) // shards[0])
            _require(self.location, sync(self.group.store.exists(last)),
                     f"{where}: the shard file {last} holding its last sample is missing; the store claims more "
                     "samples than it holds")
        return array


def _require(where: str, condition: bool, detail: str) -> None:
    if not condition:
        raise _malformed(where, detail)


def _malformed(where: str, detail: str) -> NotAStoreError:
    return NotAStoreError(f"{where}: {detail}; the store is damaged or was not written by outcore")
