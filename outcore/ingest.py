"""Ingest: image folders, tables of image paths, and in-memory or on-disk arrays into an outcore store."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd

from .build import BuildOptions, FieldSource, build_store
from .dataset import Dataset, open_dataset
from .errors import SourceError
from .imaging import ResizePolicy, parse_image_dtype, parse_image_shape, parse_resize
from .loaders import image_array
from .schema import (
    IMAGE_ENCODING,
    RANGES_SUFFIX,
    TEXT_ENCODING,
    Compression,
    FieldInfo,
    ImageDecode,
    Layout,
    encode_text,
)
from .sources import SourceTable, scan_image_folder, table_from_dataframe

IMAGE_FIELD = "images"
ENCODED_FIELD = "images_encoded"
IMAGE_STORAGE = ("pixels", "encoded", "both")
PATH_FIELD = "path"
SOURCE_INDEX_FIELD = "source_index"
TARGET_NAMES = ("labels", "label", "targets", "target", "y")


def ingest_images(
    source: str | os.PathLike,
    store: str | os.PathLike,
    *,
    shape: Sequence[int] | str,
    resize: ResizePolicy = "crop",
    dtype: Any = "uint8",
    images: str = "pixels",
    chunk_size: int | None = None,
    compressor: str | Compression | None = None,
    shuffle_on_write: bool = True,
    seed: int = 0,
    client: Any = None,
    on_error: str = "raise",
    overwrite: bool = False,
    progress: bool = True,
) -> Dataset:
    """Ingest a folder of images, labelled by sub-folder (``source/<class>/<image>``), into ``store``.

    The store gets fields ``images`` (N, H, W, C), ``labels`` (class indices; names in ``ds.classes``),
    ``path`` (each sample's file, relative to ``source``) and ``source_index`` (its position in the
    sorted file list). With ``shuffle_on_write`` (the default) samples are stored in a random order
    drawn from ``seed``. A ``.zip`` store name writes a single file.

    ``images`` chooses how the pictures are stored: ``"pixels"`` (decoded, ready to read),
    ``"encoded"`` (the files' own bytes, several times smaller, decoded to ``shape`` while reading) or
    ``"both"`` (pixels in ``images``, the files in ``images_encoded``). Every file is decoded at ingest
    either way, so bad files are found now, not in the middle of training.

    >>> ds = outcore.ingest_images("photos/train", "train.zarr", shape=(128, 128, 3))  # doctest: +SKIP
    >>> ds.classes  # doctest: +SKIP
    ['cat', 'dog']
    """
    table = scan_image_folder(source)
    return _ingest_table(table, store, **_image_options(locals()))


def ingest_dataframe(
    frame: pd.DataFrame | str | os.PathLike,
    store: str | os.PathLike,
    *,
    path_column: str = "path",
    label_columns: Sequence[str] = (),
    root: str | os.PathLike | None = None,
    shape: Sequence[int] | str,
    resize: ResizePolicy = "crop",
    dtype: Any = "uint8",
    images: str = "pixels",
    chunk_size: int | None = None,
    compressor: str | Compression | None = None,
    shuffle_on_write: bool = True,
    seed: int = 0,
    client: Any = None,
    on_error: str = "raise",
    overwrite: bool = False,
    progress: bool = True,
) -> Dataset:
    """Ingest the images listed in a DataFrame or CSV file, with one label field per ``label_columns``.

    Relative paths are taken from ``root`` (default: the CSV's folder, or the current folder for a
    DataFrame). String labels are stored as class indices with their names; numbers as they are.
    Paths that do not exist are an error, or skipped and reported with ``on_error="skip"``. The other
    keywords are those of `ingest_images`.

    >>> ds = outcore.ingest_dataframe("labels.csv", "train.zarr", path_column="path",
    ...                               label_columns=["label"], shape=(64, 64, 3))  # doctest: +SKIP
    """
    table = table_from_dataframe(frame, path_column, label_columns, root)
    if table.missing and on_error == "raise":
        shown = ", ".join(repr(p) for p in table.missing[:3])
        raise SourceError(
            f"{len(table.missing)} of {len(table)} files listed in {table.description} do not exist "
            f"(e.g. {shown}); correct the paths or root=, or pass on_error='skip' to skip them"
        )
    return _ingest_table(table, store, **_image_options(locals()))


def _image_options(arguments: dict[str, Any]) -> dict[str, Any]:
    names = ("shape", "resize", "dtype", "images", "chunk_size", "compressor", "shuffle_on_write", "seed", "client",
             "on_error", "overwrite", "progress")
    return {name: arguments[name] for name in names}


def _ingest_table(
    table: SourceTable,
    store: str | os.PathLike,
    *,
    shape: Sequence[int] | str,
    resize: ResizePolicy,
    dtype: Any,
    images: str,
    chunk_size: int | None,
    compressor: str | Compression | None,
    shuffle_on_write: bool,
    seed: int,
    client: Any,
    on_error: str,
    overwrite: bool,
    progress: bool,
) -> Dataset:
    shape, resize, dtype = parse_image_shape(shape), parse_resize(resize), parse_image_dtype(dtype)
    if images not in IMAGE_STORAGE:
        raise ValueError(f"images={images!r} is not one of {IMAGE_STORAGE}")
    reserved = {IMAGE_FIELD, ENCODED_FIELD, PATH_FIELD, SOURCE_INDEX_FIELD}
    clash = {name for name in table.labels if name in reserved or name.removesuffix(RANGES_SUFFIX) in reserved}
    if clash:
        raise SourceError(f"label column(s) {sorted(clash)} clash with outcore's own field names; rename them")
    # chunks hold about 8 MiB of decoded pixels even when files are stored: the shuffle buffer holds them decoded
    layout = Layout.for_samples(math.prod(shape) * dtype.itemsize, len(table), chunk_size)
    order = _sample_order(len(table), shuffle_on_write, seed)
    paths = [table.paths[i] for i in order]
    # One task decodes a whole shard's images and the write task that needs them runs where they are:
    # decoded pixels (7x the JPEG bytes) never travel between workers.
    pixels, files, errors = image_array(
        paths, shape, resize=resize, dtype=dtype, block_size=layout.shard_size, on_error=on_error,
        keep={"pixels": ("pixels",), "encoded": ("files",), "both": ("pixels", "files")}[images],
    )
    fields = {}
    if pixels is not None:
        fields[IMAGE_FIELD] = FieldSource(pixels, FieldInfo("input"))
    if files is not None:
        decode = ImageDecode(shape, dtype.name, resize)
        fields[ENCODED_FIELD if pixels is not None else IMAGE_FIELD] = FieldSource(
            files, FieldInfo("other" if pixels is not None else "input", encoding=IMAGE_ENCODING, decode=decode),
            nbytes=np.array([_file_size(path) for path in paths], dtype=np.int64),
        )
    for name, values in table.labels.items():
        fields[name] = FieldSource(_lazy(values[order], layout), FieldInfo("target", table.classes.get(name)))
    fields[PATH_FIELD] = FieldSource(
        _lazy(encode_text(np.array(table.names)[order]), layout), FieldInfo("metadata", encoding=TEXT_ENCODING)
    )
    fields[SOURCE_INDEX_FIELD] = FieldSource(_lazy(order, layout), FieldInfo("metadata"))
    options = BuildOptions(layout, Compression.parse(compressor), client, progress, overwrite)
    build_store(store, fields, options, shuffled_on_write=shuffle_on_write, seed=seed if shuffle_on_write else None,
                source=table.description, errors=errors)
    return open_dataset(store)


def from_arrays(
    arrays: Mapping[str, Any],
    store: str | os.PathLike,
    *,
    roles: Mapping[str, str] | None = None,
    classes: Mapping[str, Sequence[str]] | None = None,
    chunk_size: int | None = None,
    compressor: str | Compression | None = None,
    shuffle_on_write: bool = True,
    seed: int = 0,
    client: Any = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Dataset:
    """Write arrays that share their first axis (numpy, dask, zarr or h5py) as the fields of a new store.

    ``roles`` defaults to ``"target"`` for fields named labels/label/targets/target/y, ``"input"`` for
    the first other field, and ``"other"`` for the rest. ``classes`` names the classes of label fields.
    Strings (numpy ``U``/``S``) are stored as UTF-8 text fields. When shuffled on write, a
    ``source_index`` field records each sample's position in the input.

    >>> ds = outcore.from_arrays({"images": x, "labels": y}, "train.zarr")  # doctest: +SKIP
    """
    if not arrays:
        raise SourceError("from_arrays needs at least one field")
    arrays = {name: a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a) for name, a in arrays.items()}
    text_fields = {name for name, a in arrays.items() if np.dtype(a.dtype).kind in "US"}
    for name in text_fields:
        if not isinstance(arrays[name], np.ndarray):
            raise SourceError(f"field {name!r} holds strings in a {type(arrays[name]).__name__}; pass a numpy array")
        arrays[name] = encode_text(arrays[name])
    lengths = {name: _length(name, a) for name, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise SourceError(f"fields must have the same number of samples (axis 0); got {lengths}")
    num_samples = next(iter(lengths.values()))
    if num_samples == 0:
        raise SourceError("the arrays have no samples")
    sample_nbytes = sum(math.prod(np.shape(a)[1:]) * np.dtype(a.dtype).itemsize for a in arrays.values())
    layout = Layout.for_samples(sample_nbytes, num_samples, chunk_size)
    order = _sample_order(num_samples, shuffle_on_write, seed)
    infos = _field_infos(list(arrays), roles or {}, classes or {}, text_fields)
    fields = {
        name: FieldSource(_as_dask(array, layout.shard_size)[order if shuffle_on_write else slice(None)],
                          infos[name])
        for name, array in arrays.items()
    }
    if shuffle_on_write and SOURCE_INDEX_FIELD not in fields:
        fields[SOURCE_INDEX_FIELD] = FieldSource(_lazy(order, layout), FieldInfo("metadata"))
    options = BuildOptions(layout, Compression.parse(compressor), client, progress, overwrite)
    source = "arrays " + ", ".join(f"{name}: {type(a).__module__}.{type(a).__name__}" for name, a in arrays.items())
    build_store(store, fields, options, shuffled_on_write=shuffle_on_write,
                seed=seed if shuffle_on_write else None, source=source)
    return open_dataset(store)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # reported by the loader, which skips the file or stops the ingest
        return 0


def _sample_order(num_samples: int, shuffle: bool, seed: int) -> np.ndarray:
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng(seed).permutation(num_samples).astype(np.int64)


def _lazy(values: np.ndarray, layout: Layout) -> da.Array:
    return da.from_array(values, chunks=(layout.shard_size,) + values.shape[1:])


def _length(name: str, array: Any) -> int:
    shape = array.shape
    if len(shape) == 0:
        raise SourceError(f"field {name!r} is a scalar; fields need a sample axis first")
    if np.dtype(array.dtype).kind == "O":
        raise SourceError(f"field {name!r} has dtype object; use fixed-size numbers or strings")
    return int(shape[0])


def _field_infos(
    names: list[str], roles: Mapping[str, str], classes: Mapping[str, Sequence[str]], text_fields: set[str]
) -> dict[str, FieldInfo]:
    unknown = (set(roles) | set(classes)) - set(names)
    if unknown:
        raise SourceError(f"roles/classes name field(s) {sorted(unknown)} that are not among {names}")
    guessed: dict[str, str] = {}
    for name in names:
        if name in TARGET_NAMES:
            guessed[name] = "target"
        elif "input" not in guessed.values():
            guessed[name] = "input"
        else:
            guessed[name] = "other"
    return {
        name: FieldInfo(
            roles.get(name, guessed[name]),
            tuple(classes[name]) if name in classes else None,
            TEXT_ENCODING if name in text_fields else None,
        )
        for name in names
    }


def _as_dask(array: Any, shard: int) -> da.Array:
    """A lazy view of ``array`` in blocks of whole shards; h5py datasets are read under a lock."""
    if isinstance(array, da.Array):
        return array
    module = type(array).__module__
    if module.startswith("zarr"):
        return da.from_zarr(array)
    return da.from_array(array, chunks=(shard,) + tuple(array.shape[1:]), lock=module.startswith("h5py"))
