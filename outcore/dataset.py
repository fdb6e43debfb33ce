"""`Dataset`: the one object users hold — a lazy, named view of an outcore store — and `open_dataset`."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Unpack

import numpy as np
import zarr

from .adapters.keywords import TorchKeywords
from .adapters.selection import FieldSelection
from .format import StoreAttrs, class_flags, decode_text, dimension_names
from .iterate import BatchIterator, BatchKeywords, BatchOptions, ChunkReader, chunk_reader, sample_spec
from .storage import ChunkCache, Store, is_object_url, is_url
from .storage.pins import Pins
from .storage.report import field_reports, human_size, stored_shapes, total, variable_shape
from .storage.splits import split_location

if TYPE_CHECKING:
    import dask.array as da
    import tensorflow as tf
    import xarray as xr

    from .adapters.keras import KerasBatches
    from .adapters.torch import OutcoreLoader


def open_dataset(
    location: str | os.PathLike,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike | Literal[False] | None = None,
    cache_size: int | str | None = None,
    split: str | None = None,
) -> Dataset:
    """Open an outcore store lazily: a directory, a ``.zip`` file, or a URL; or split ``split`` of a folder
    of splits (made by `outcore.ingest_splits`).

    Nothing but metadata is read; stores that use pickle or object codecs are refused.

    An object store (``s3://``, ``gs://``, ``az://``, ``https://``) is configured by ``storage_options``
    (obstore's settings: ``endpoint``, ``region``, ``access_key_id``, ``client_options={...}``) or the
    standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). Its chunks are kept in the
    node's cache at ``cache_dir`` (default ``$OUTCORE_CACHE_DIR``; ``False``: none) of at most
    ``cache_size`` bytes (``"50GiB"``; default ``$OUTCORE_CACHE_SIZE``, else 20 GiB), which every process
    of the machine shares.

    >>> ds = outcore.open_dataset("train.zarr")  # doctest: +SKIP
    >>> ds["images"]  # doctest: +SKIP
    dask.array<images, shape=(10000, 128, 128, 3), dtype=uint8, chunksize=(128, 128, 128, 3), ...>
    >>> ds = outcore.open_dataset("s3://bucket/train.zarr", cache_dir="/scratch/cache")  # doctest: +SKIP
    >>> val = outcore.open_dataset("photos-splits", split="val")  # doctest: +SKIP
    """
    location = split_location(location, split)
    cache = None
    if cache_dir is not False and is_url(location) and is_object_url(str(location)):
        cache = ChunkCache.from_environment(cache_dir, cache_size)
    return Dataset.open(location, storage_options=storage_options, cache=cache)


class Dataset(Store):
    """The fields of a store as dask arrays sharing the sample axis and its chunking, and the ways to
    train on them: `batches`, `keras`, `tf`, `torch`.

    >>> len(ds), ds.fields, ds.chunk_size, ds.classes  # doctest: +SKIP
    (10000, ('images', 'labels', 'path', 'source_index'), 128, ['cat', 'dog'])
    """

    def __init__(self, group: zarr.Group, attrs: StoreAttrs, location: str, pins: Pins | None = None) -> None:
        super().__init__(group, attrs, location, pins)
        self._arrays: dict[str, da.Array] = {}

    def chunk_reader(self, field: str) -> ChunkReader:
        """A reader of ``field`` chunk by chunk, as the batch iterator uses: ``reader.read(k)`` is chunk ``k``
        (decoded, for an encoded image field; UTF-8 bytes for a text field)."""
        return chunk_reader(self, field)

    def __getitem__(self, field: str) -> da.Array:
        """``field`` as a dask array chunked like the store; a corrupt chunk raises `CorruptChunkError`.

        Text fields (``path``) come back as numpy strings, and encoded image fields as decoded pixels,
        decoded chunk by chunk.
        """
        if field not in self._arrays:
            self._arrays[field] = self._lazy(field)
        return self._arrays[field]

    def _lazy(self, field: str) -> da.Array:
        info = self.info(field)
        reader = chunk_reader(self, field)
        sample = reader.empty()[:0]  # what one chunk holds: pixels for encoded images, UTF-8 bytes for text
        view = _ChunkView(self.opener, field, self.chunk_size, (len(self), *sample.shape[1:]), sample.dtype, reader)
        import dask.array as da  # here: reading batches needs no dask
        from dask.base import tokenize

        name = f"{field}-{tokenize(self.location, field, self.attrs.to_dict())}"
        lazy = da.from_array(view, chunks=(self.chunk_size, *view.shape[1:]), name=name, lock=False, fancy=False,
                             asarray=False, meta=sample)
        if info.is_text:
            lazy = lazy.map_blocks(decode_text, drop_axis=1, dtype=sample_spec(self, field)[1])
        return lazy

    def batches(self, batch_size: int, **options: Unpack[BatchKeywords]) -> BatchIterator:
        """Iterate in batches, chunk-aware and shuffled, read ahead by background threads.

        Options (all keywords; see `outcore.iterate.BatchKeywords`): ``fields`` (default all),
        ``shuffle=True``, ``seed=0``, ``buffer_chunks=8``, ``prefetch=2``, ``transform=None``,
        ``rank=0``, ``world_size=1`` (any number), ``streams`` (default 8, or the least multiple of 8 and
        ``world_size``), ``drop_last=False``, ``client=None``, ``indices=None`` (a subset: docs/iterate.md).
        The batches of every global step are the same on any number of ranks dividing ``streams`` for the
        same global batch size (``batch_size x world_size``): pass ``batch_size=G // world_size``.

        >>> for batch in ds.batches(batch_size=256, shuffle=True, seed=0):  # doctest: +SKIP
        ...     batch["images"].shape
        (256, 128, 128, 3)
        """
        return BatchIterator(self, BatchOptions.of(batch_size, options))

    def keras(self, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
              sample_weight: str | None = "auto", **options: Unpack[BatchKeywords]) -> KerasBatches:
        """A ``keras.utils.PyDataset`` for ``model.fit``/``evaluate``/``predict``: ``x``, ``y`` and
        ``sample_weight`` name fields (by default the store's sample-weight field, with ``y``); the
        other options are those of `batches`. ``(x, y)`` batches are shuffled unless ``shuffle=False``;
        ``x`` alone (for ``predict``) comes in store order unless ``shuffle=True``. Each epoch reads the
        store once, in outcore's seeded order, whatever order Keras asks in (see
        `outcore.adapters.keras.KerasBatches`).

        >>> model.fit(ds.keras(256, x="images", y="labels"), epochs=5)  # doctest: +SKIP
        >>> predictions = model.predict(ds.keras(256, x="images"))  # row i: sample i  # doctest: +SKIP
        """
        from .adapters.keras import KerasBatches

        return KerasBatches(self, batch_size, x=x, y=y, sample_weight=sample_weight, **options)

    def tf(self, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
           **options: Unpack[BatchKeywords]) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of ``x`` or ``(x, y)`` batches; the options are those of `batches` (see
        `outcore.adapters.tf.dataset`).

        >>> ds.tf(256, x="images", y="labels").map(augment).prefetch(2)  # doctest: +SKIP
        """
        from .adapters.tf import dataset

        return dataset(self, batch_size, x=x, y=y, **options)

    def torch(self, batch_size: int, *, channels_first: bool = False,
              **options: Unpack[TorchKeywords]) -> OutcoreLoader:
        """A ``torch.utils.data.DataLoader`` of batches (dicts of tensors), sharded over its workers
        and DDP ranks, resumable mid-epoch. As with a DataLoader, ``shuffle`` is off unless asked for
        (batches in store order: predictions line up). The options are those of `batches`, and the DataLoader's own
        (``num_workers=0``, ``pin_memory``, ``multiprocessing_context``, ...), passed to it as they are;
        see `outcore.adapters.torch.loader`.

        >>> for batch in ds.torch(batch_size=256, shuffle=True, num_workers=2):  # doctest: +SKIP
        ...     ...
        """
        from .adapters.torch import loader

        return loader(self, batch_size, channels_first=channels_first, **options)

    def _field_rows(self) -> list[tuple[str, str, str, str, str]]:
        rows = []
        for name, info in self.attrs.fields.items():
            classes = ", ".join(info.classes[:8]) + (", …" if len(info.classes) > 8 else "") if info.classes else ""
            lazy = self[name]
            dtype = f"{lazy.dtype} (encoded)" if info.is_image else str(lazy.dtype)
            shape = str(lazy.shape)
            if info.is_image and info.decode.variable:  # an object per picture: say what each holds
                dtype = f"{info.decode.dtype} (encoded, own sizes)"
                shape = "(" + ", ".join(map(str, (len(self), *variable_shape(stored_shapes(self, name))))) + ")"
            if info.is_raster:  # an array per sample, of its picture's own size
                dtype = f"{info.dtype} (own sizes)"
                shape = "(" + ", ".join(map(str, (len(self), *variable_shape(stored_shapes(self, name))[:2],
                                                  *info.sample_shape))) + ")"
            if info.is_ragged:  # rows per sample: (samples, rows, *row)
                dtype, shape = f"{info.dtype} (ragged)", "(" + ", ".join(map(str, (len(self), "rows", *info.sample_shape))) + ")"
            rows.append((name, dtype, shape, info.role, classes))
        return rows

    def summary(self) -> str:
        """The first line of the Dataset's repr alone: where it is, its samples and chunks, whether it was shuffled on
        write, how many files were skipped (the repr's rows read each field's sizes where pictures keep their own).

        >>> outcore.open_dataset("train.zarr").summary()  # doctest: +SKIP
        "<outcore.Dataset 'train.zarr': 1,000 samples in 8 chunks of 128>"
        """
        return f"<outcore.Dataset {self.location!r}: {self._counts()}>"

    def _counts(self) -> str:
        parts = [f"{len(self):,} samples in {self.num_chunks:,} chunks of {self.chunk_size:,}"]
        if self.attrs.shuffled_on_write:
            parts.append(f"shuffled on write (seed {self.attrs.seed})")
        if self.attrs.skipped:
            parts.append(f"{self.attrs.skipped['count']:,} source files skipped")
        return "; ".join(parts)

    def __repr__(self) -> str:
        rows = self._field_rows()
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [self.summary()]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            lines.append("  " + "  ".join(cells) + (f"  classes: {row[4]}" if row[4] else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """Jupyter's view: what ``outcore info`` shows — every field's dtype, shape, chunking, codecs,
        sizes decoded and on disk, ratio, role and classes — then notes and provenance."""
        reports = field_reports(self)
        header = ("field", "dtype", "shape", "chunk", "shard", "codecs", "decoded", "on disk", "ratio", "role",
                  "classes")
        rows = [(r.name, r.dtype, " × ".join(map(str, r.shape)), f"{r.chunk:,}", f"{r.shard:,}", r.codecs,
                 human_size(r.decoded), human_size(r.stored), r.ratio, r.role, _classes_cell(r.classes))
                for r in reports]
        summed = total(reports)
        rows.append(("total", "", "", "", "", "", human_size(summed.decoded), human_size(summed.stored), summed.ratio,
                     "", ""))
        notes = []
        if self.unpublished():
            notes.append(f"{self.unpublished():,} sample(s) written beyond the published count: readers ignore them")
        if self.attrs.skipped:
            notes.append(f"{self.attrs.skipped['count']:,} source file(s) skipped at ingest: "
                         f"{self.attrs.skipped.get('report')}")
        return "".join([
            f"<div><strong>outcore.Dataset</strong> <code>{html.escape(self.location)}</code>: ",
            html.escape(self._counts()),
            "<table><thead><tr>", *(f"<th>{h}</th>" for h in header), "</tr></thead><tbody>",
            *("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows),
            "</tbody></table>",
            *(f"<p>{html.escape(note)}</p>" for note in notes),
            "<details><summary>provenance</summary><pre>",
            html.escape(json.dumps(self.attrs.provenance, indent=2)), "</pre></details></div>",
        ])

    def to_xarray(self) -> xr.Dataset:
        """The fields as a lazy ``xarray.Dataset`` with named dimensions (``sample``, ``height``,
        ``width``, ``channel``, ...): text as strings, encoded images decoded, and each class-label
        field's class names in its ``flag_meanings`` attribute (the CF convention).

        >>> ds.to_xarray()["labels"].attrs["flag_meanings"]  # doctest: +SKIP
        'cat dog'
        """
        import xarray as xr  # an optional dependency (the xarray extra)

        lazy = {name: self[name] for name in self.fields}
        dims = dimension_names({name: (array.dtype, array.shape[1:]) for name, array in lazy.items()})
        variables = {}
        for name, array in lazy.items():
            classes = self.classes_of(name)
            attrs = {"role": self.roles[name], **(class_flags(classes) if classes else {})}
            variables[name] = xr.Variable(dims[name], array, attrs=attrs)
        return xr.Dataset(variables, attrs={"source": self.location})


def _classes_cell(classes: tuple[str, ...]) -> str:
    shown = ", ".join(classes[:8]) + (", …" if len(classes) > 8 else "")
    return f"{len(classes)}: {shown}" if classes else ""


class _ChunkView:
    """What dask reads a field through: whole chunks from the field's chunk reader (so a missing or
    corrupt chunk is an error naming it, and encoded images come decoded), then ``key``. It pickles as
    the store's opener (location and settings), so dask can compute the field on a cluster's workers
    (each opens the store)."""

    def __init__(self, opener: Callable[[], Store], field: str, chunk_size: int, shape: tuple[int, ...],
                 dtype: np.dtype, reader: ChunkReader) -> None:
        self.opener, self.field, self.chunk_size = opener, field, chunk_size
        self.shape, self.dtype, self.ndim = shape, dtype, len(shape)
        self._reader: ChunkReader | None = reader

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reader": None}

    def __getitem__(self, key: Any) -> np.ndarray:
        if self._reader is None:
            self._reader = chunk_reader(self.opener(), self.field)
        key = key if isinstance(key, tuple) else (key,)
        start, stop, _ = key[0].indices(self.shape[0])
        first = start // self.chunk_size
        parts = [self._reader.read(chunk) for chunk in range(first, max(first, -(-stop // self.chunk_size)))]
        values = np.concatenate(parts) if parts else np.empty((0, *self.shape[1:]), self.dtype)
        offset = first * self.chunk_size
        return values[(slice(start - offset, stop - offset, key[0].step), *key[1:])]
