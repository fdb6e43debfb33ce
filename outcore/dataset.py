"""`Dataset`: a lazy, named view of an outcore store, and `open_dataset`."""

from __future__ import annotations

import html
import math
import os
import warnings
from typing import Any

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from .chunks import FieldChunks
from .encoded import EncodedChunks, ranges_name
from .errors import NotAStoreError
from .loader import BatchIterator
from .schema import RANGES_SUFFIX, StoreAttrs, decode_text
from .store import check_safe, is_url, open_group, read_attrs, read_samples


def open_dataset(location: str | os.PathLike) -> Dataset:
    """Open an outcore store (a directory, a ``.zip`` file or an fsspec URL) lazily.

    Nothing but metadata is read; stores that use pickle or object codecs are refused.

    >>> ds = outcore.open_dataset("train.zarr")  # doctest: +SKIP
    >>> ds["images"]  # doctest: +SKIP
    dask.array<images, shape=(10000, 128, 128, 3), dtype=uint8, chunksize=(128, 128, 128, 3), ...>
    """
    where = str(location) if is_url(location) else os.fspath(location)
    group = open_group(location, mode="r")
    attrs = read_attrs(group, where)
    check_safe(group, list(attrs.fields), where)
    return Dataset(group, attrs, where)


class Dataset:
    """The fields of a store as dask arrays sharing the sample axis and its chunking.

    >>> len(ds), ds.fields, ds.chunk_size, ds.classes  # doctest: +SKIP
    (10000, ('images', 'labels', 'path', 'source_index'), 128, ['cat', 'dog'])
    """

    def __init__(self, group: zarr.Group, attrs: StoreAttrs, location: str) -> None:
        self._group = group
        self.attrs = attrs
        self.location = location
        self._arrays: dict[str, da.Array] = {}
        for name in attrs.fields:
            self._check_field(name)

    def _check_field(self, name: str) -> None:
        if name not in self._group:
            raise _malformed(self.location, f"field {name!r} is listed in the attributes but has no array")
        if self.attrs.fields[name].is_image:
            if ranges_name(name) not in self._group:
                raise _malformed(self.location, f"encoded field {name!r} has no {ranges_name(name)!r} array")
            data = self._group[name]
            if data.shape[0] < self.num_chunks * data.chunks[0]:
                raise _malformed(self.location, f"encoded field {name!r} holds too few bytes for {len(self)} samples")
            name = ranges_name(name)
        array = self._group[name]
        if array.shape[0] < len(self) or array.chunks[0] != self.chunk_size:
            raise _malformed(
                self.location,
                f"field {name!r} has shape {array.shape} and chunks {array.chunks}; expected "
                f"{len(self)} samples in chunks of {self.chunk_size}",
            )
        if array.shape[0] > len(self):
            warnings.warn(
                f"{self.location}: field {name!r} holds {array.shape[0]} samples but the store records "
                f"{len(self)}; a write was interrupted and its last samples are ignored",
                stacklevel=3,
            )

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
        classes = self.attrs.fields[self._known(field)].classes
        return list(classes) if classes is not None else []

    def array(self, field: str) -> zarr.Array:
        """The underlying ``zarr.Array`` of ``field`` (may hold more samples than ``len(ds)``); for an
        encoded image field, its bytes, and its byte ranges under ``<field>_ranges`` (see `outcore.encoded`)."""
        owner = field.removesuffix(RANGES_SUFFIX)
        if field != owner and owner in self.attrs.fields and self.attrs.fields[owner].is_image:
            return self._group[field]
        return self._group[self._known(field)]

    def chunk_reader(self, field: str) -> FieldChunks | EncodedChunks:
        """A reader of ``field`` chunk by chunk, as the batch iterator uses: ``reader.read(k)`` is chunk ``k``
        (decoded, for an encoded image field)."""
        info = self.attrs.fields[self._known(field)]
        if info.is_image:
            return EncodedChunks(self._group, field, self.location, len(self), info.decode)
        return FieldChunks(self.array(field), field, self.location, len(self))

    def __len__(self) -> int:
        return self.attrs.num_samples

    def __contains__(self, field: object) -> bool:
        return field in self.attrs.fields

    def __getitem__(self, field: str) -> da.Array:
        """``field`` as a dask array chunked like the store; a corrupt chunk raises `CorruptChunkError`.

        Text fields (``path``) come back as numpy strings, and encoded image fields as decoded pixels,
        decoded chunk by chunk.
        """
        if field not in self._arrays and self.attrs.fields[self._known(field)].is_image:
            reader = self.chunk_reader(field)
            self._arrays[field] = da.from_array(
                _ChunkView(self.location, field, reader, (len(self), *reader.decode.shape)),
                chunks=(self.chunk_size, *reader.decode.shape),
                name=f"{field}-{tokenize(self.location, field, self.attrs.to_dict())}",
                lock=False, fancy=False, asarray=False, meta=np.empty((0,) * (1 + len(reader.decode.shape)), reader.dtype),
            )
        if field not in self._arrays:
            array = self.array(field)
            reader = _FieldReader(array, field, self.location, len(self))
            lazy = da.from_array(
                reader,
                chunks=(self.chunk_size, *array.shape[1:]),
                name=f"{field}-{tokenize(self.location, field, self.attrs.to_dict())}",
                lock=False,
                fancy=False,
                asarray=False,
                meta=np.empty((0,) * array.ndim, dtype=array.dtype),
            )
            if self.attrs.fields[field].is_text:
                lazy = lazy.map_blocks(decode_text, drop_axis=1, dtype=f"<U{array.shape[1]}")
            self._arrays[field] = lazy
        return self._arrays[field]

    def batches(self, batch_size: int, **options: Any) -> BatchIterator:
        """Iterate in batches, chunk-aware and shuffled: see `BatchIterator` for the options.

        >>> for batch in ds.batches(batch_size=256, shuffle=True, seed=0):  # doctest: +SKIP
        ...     batch["images"].shape
        (256, 128, 128, 3)
        """
        return BatchIterator(self, batch_size, **options)

    def keras(self, batch_size: int, **options: Any) -> Any:
        """A ``keras.utils.PyDataset`` for ``model.fit``/``evaluate``/``predict``: see
        `outcore.adapters.keras.KerasBatches` (``x=``, ``y=``, ``sample_weight=`` name fields).

        >>> model.fit(ds.keras(256, x="images", y="labels"), epochs=5)  # doctest: +SKIP
        """
        from .adapters.keras import KerasBatches

        return KerasBatches(self, batch_size, **options)

    def tf(self, batch_size: int, **options: Any) -> Any:
        """A ``tf.data.Dataset`` of ``(x, y)`` batches: see `outcore.adapters.tf.dataset`.

        >>> ds.tf(256, x="images", y="labels").map(augment).prefetch(2)  # doctest: +SKIP
        """
        from .adapters.tf import dataset

        return dataset(self, batch_size, **options)

    def torch(self, batch_size: int, **options: Any) -> Any:
        """A ``torch.utils.data.DataLoader`` of batches (dicts of tensors), sharded over its workers
        and DDP ranks: see `outcore.adapters.torch.loader`.

        >>> for batch in ds.torch(batch_size=256, num_workers=2):  # doctest: +SKIP
        ...     ...
        """
        from .adapters.torch import loader

        return loader(self, batch_size, **options)

    def _known(self, field: str) -> str:
        if field not in self.attrs.fields:
            raise KeyError(f"no field {field!r} in {self.location}; fields: {list(self.attrs.fields)}")
        return field

    def _field_rows(self) -> list[tuple[str, str, str, str, str]]:
        rows = []
        for name, info in self.attrs.fields.items():
            classes = ", ".join(info.classes[:8]) + (", …" if len(info.classes) > 8 else "") if info.classes else ""
            lazy = self[name]
            dtype = f"{lazy.dtype} (encoded)" if info.is_image else str(lazy.dtype)
            rows.append((name, dtype, str(lazy.shape), info.role, classes))
        return rows

    def _summary(self) -> str:
        parts = [f"{len(self):,} samples in {self.num_chunks:,} chunks of {self.chunk_size:,}"]
        if self.attrs.shuffled_on_write:
            parts.append(f"shuffled on write (seed {self.attrs.seed})")
        if self.attrs.skipped:
            parts.append(f"{self.attrs.skipped['count']:,} source files skipped")
        return "; ".join(parts)

    def __repr__(self) -> str:
        rows = self._field_rows()
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [f"<outcore.Dataset {self.location!r}: {self._summary()}>"]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            lines.append("  " + "  ".join(cells) + (f"  classes: {row[4]}" if row[4] else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("field", "dtype", "shape", "role", "classes"))
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in self._field_rows()
        )
        return (
            f"<div><strong>outcore.Dataset</strong> <code>{html.escape(self.location)}</code><br>"
            f"{html.escape(self._summary())}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )


class _FieldReader:
    """What dask reads a field through: ``array[key]``, with a corrupt chunk reported by name."""

    def __init__(self, array: zarr.Array, field: str, where: str, num_samples: int) -> None:
        self.array, self.field, self.where = array, field, where
        self.shape = (num_samples, *array.shape[1:])
        self.dtype = array.dtype
        self.ndim = array.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        return read_samples(self.array, key, self.field, self.where)


class _ChunkView:
    """What dask reads an encoded field through: whole decoded chunks, then ``key``. It pickles as the
    store's location, so dask can compute the field on a cluster's workers (each opens the store)."""

    def __init__(self, location: str, field: str, reader: EncodedChunks, shape: tuple[int, ...]) -> None:
        self.location, self.field, self.shape = location, field, shape
        self.dtype, self.ndim, self.chunk_size = reader.dtype, len(shape), reader.chunk_size
        self._reader: EncodedChunks | None = reader

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._reader is None:
            self._reader = open_dataset(self.location).chunk_reader(self.field)
        key = key if isinstance(key, tuple) else (key,)
        start, stop, _ = key[0].indices(self.shape[0])
        first = start // self.chunk_size
        parts = [self._reader.read(chunk) for chunk in range(first, max(first, -(-stop // self.chunk_size)))]
        values = np.concatenate(parts) if parts else np.empty((0, *self.shape[1:]), self.dtype)
        offset = first * self.chunk_size
        return values[(slice(start - offset, stop - offset, key[0].step), *key[1:])]


def _malformed(where: str, detail: str) -> NotAStoreError:
    return NotAStoreError(f"{where}: {detail}; the store is damaged or was not written by outcore")
