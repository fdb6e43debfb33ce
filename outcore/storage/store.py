"""`Store`: an outcore store opened for reading, its attributes and arrays checked against each other."""

from __future__ import annotations

import math
import os
from typing import Self

import zarr
from zarr.core.sync import sync

from ..errors import NotAStoreError
from ..format import RANGES_SUFFIX, FieldInfo, StoreAttrs, ranges_name
from .groups import is_url, open_group, shard_path
from .safety import check_safe, read_attrs
from .shard_reader import ShardReader


def open_store(location: str | os.PathLike) -> Store:
    """Open the store at ``location`` (a directory, a ``.zip`` file or an fsspec URL) for reading."""
    return Store.open(location)


class Store:
    """The fields of an opened store: their attributes, their zarr arrays, and chunk readers.

    ``location`` is where it was opened from (a path or URL), and what processes that read it
    themselves (Dask workers, DataLoader workers) open it by.
    """

    @classmethod
    def open(cls, location: str | os.PathLike) -> Self:
        """Open the store at ``location`` (a directory, a ``.zip`` file or an fsspec URL) for reading.

        Only metadata is read. The attributes must be outcore's, every array they promise must be there
        with the sample count and chunking they say, and no array may use a pickle or object codec.
        """
        where = str(location) if is_url(location) else os.fspath(location)
        group = open_group(location, mode="r")
        return cls(group, read_attrs(group, where), where)

    def __init__(self, group: zarr.Group, attrs: StoreAttrs, location: str) -> None:
        self.attrs = attrs
        self.location = location
        self.group = group
        check_safe(group, self.array_names(), location)
        for name in attrs.fields:
            self._check_field(name)

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
        """Every array the fields are stored in (an encoded image field has two)."""
        names = []
        for name, info in self.attrs.fields.items():
            names += [name, ranges_name(name)] if info.is_image else [name]
        return names

    def array(self, field: str) -> zarr.Array:
        """The underlying ``zarr.Array`` of ``field`` (may hold more samples than ``len(store)``); for an
        encoded image field, its bytes, and its byte ranges under ``<field>_ranges``."""
        owner = field.removesuffix(RANGES_SUFFIX)
        if field != owner and owner in self.attrs.fields and self.attrs.fields[owner].is_image:
            return self.group[field]
        self.info(field)
        return self.group[field]

    def unpublished(self) -> int:
        """Samples the arrays hold beyond the store's count: a Writer's appends not yet published (it is
        writing, or stopped before publishing them). Readers never see them."""
        lengths = [self.group[name].shape[0] for name, info in self.attrs.fields.items() if not info.is_image]
        return max(lengths, default=len(self)) - len(self)

    def missing_shards(self) -> list[str]:
        """The shard files the attributes promise that are not in the store (keys, as ``labels/c/3``)."""
        missing = []
        for name in self.array_names():
            array = self.group[name]
            encoded_bytes = name in self.attrs.fields and self.attrs.fields[name].is_image  # a region per chunk
            needed = self.num_chunks * array.chunks[0] if encoded_bytes else len(self)
            for shard in range(-(-needed // (array.shards or array.chunks)[0])):
                key = shard_path(array, shard)
                if not sync(self.group.store.exists(key)):
                    missing.append(key)
        return missing

    def shard_reader(self, field: str) -> ShardReader:
        """A direct reader of ``field``'s stored chunks (bytes, for an encoded image field)."""
        return ShardReader(self.array(field), field, self.location, len(self))

    def __len__(self) -> int:
        return self.attrs.num_samples

    def __contains__(self, field: object) -> bool:
        return field in self.attrs.fields

    def _check_field(self, name: str) -> None:
        if name not in self.group:
            raise _malformed(self.location, f"field {name!r} is listed in the attributes but has no array")
        if self.attrs.fields[name].is_image:
            if ranges_name(name) not in self.group:
                raise _malformed(self.location, f"encoded field {name!r} has no {ranges_name(name)!r} array")
            data = self.group[name]
            if data.shape[0] < self.num_chunks * data.chunks[0]:
                raise _malformed(self.location, f"encoded field {name!r} holds too few bytes for {len(self)} samples")
            name = ranges_name(name)
        array = self.group[name]
        if array.shape[0] < len(self) or array.chunks[0] != self.chunk_size:
            raise _malformed(
                self.location,
                f"field {name!r} has shape {array.shape} and chunks {array.chunks}; expected "
                f"{len(self)} samples in chunks of {self.chunk_size}",
            )


def _malformed(where: str, detail: str) -> NotAStoreError:
    return NotAStoreError(f"{where}: {detail}; the store is damaged or was not written by outcore")
