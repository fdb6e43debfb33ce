"""`from_arrays`: numpy, dask, zarr or h5py arrays that share their first axis, as the fields of a store."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..dataset import Dataset, open_dataset
from ..errors import SourceError
from ..format import (
    RAGGED_ENCODING,
    TEXT_ENCODING,
    Compression,
    FieldInfo,
    Layout,
    Ragged,
    encode_text,
    guess_roles,
)
from ..storage import check_target
from .build import BuildOptions, FieldSource, build_store
from .permute import as_dask, write_order

SOURCE_INDEX_FIELD = "source_index"


def from_arrays(
    arrays: Mapping[str, Any],
    location: str | os.PathLike,
    *,
    roles: Mapping[str, str] | None = None,
    classes: Mapping[str, Sequence[str]] | None = None,
    chunk_size: int | None = None,
    compression: str | Compression | None = None,
    shuffle_on_write: bool = True,
    seed: int = 0,
    client: Any = None,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> Dataset:
    """Write arrays that share their first axis (numpy, dask, zarr or h5py) as the fields of a new store.

    ``roles`` defaults to ``"target"`` for fields named labels/label/targets/target/y,
    ``"sample_weight"`` for fields named weight/weights/sample_weight(s), ``"input"`` for the first
    other field, and ``"other"`` for the rest (`outcore.format.guess_roles`). ``classes`` names the classes of label fields.
    Strings (numpy ``U``/``S``) are stored as UTF-8 text fields. When shuffled on write, a
    ``source_index`` field records each sample's position in the input; an on-disk or dask input is
    shuffled through a scratch folder beside the store, in bounded memory (`outcore.ingest.permute`). A NumPy
    array is never copied: a memory-mapped one (``np.load(path, mmap_mode="r")``) larger than the memory is read a
    block at a time as the shards are written.
    A `Ragged` (rows of many samples and their offsets: boxes, keypoints, their labels) is stored as a ragged
    field (`outcore.format.ragged`).
    ``client`` (default: the active ``distributed.Client``, else local threads) runs the writing. An
    object store URL is written as `outcore.ingest_images` says, with ``storage_options``.

    >>> ds = outcore.from_arrays({"images": x, "labels": y}, "train.zarr")  # doctest: +SKIP
    """
    check_target(location)  # before any work: a URL outcore cannot write to is refused, never made a local folder
    if not arrays:
        raise SourceError("from_arrays needs at least one field")
    arrays = {name: a if isinstance(a, Ragged) or (hasattr(a, "shape") and hasattr(a, "dtype")) else np.asarray(a)
              for name, a in arrays.items()}
    ragged = {name: a for name, a in arrays.items() if isinstance(a, Ragged)}
    text_fields = {name for name, a in arrays.items() if name not in ragged and np.dtype(a.dtype).kind in "US"}
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
    sample_nbytes = sum(a.values.nbytes // num_samples if name in ragged else
                        math.prod(np.shape(a)[1:]) * np.dtype(a.dtype).itemsize for name, a in arrays.items())
    layout = Layout.for_samples(sample_nbytes, num_samples, chunk_size)
    infos = _field_infos(list(arrays), roles or {}, classes or {}, text_fields, ragged)
    order = write_order(num_samples, shuffle_on_write, seed)
    fields = {name: FieldSource(array if shuffle_on_write or name in ragged else as_dask(array, layout.shard_size),
                                infos[name]) for name, array in arrays.items()}
    if shuffle_on_write and SOURCE_INDEX_FIELD not in fields:
        fields[SOURCE_INDEX_FIELD] = FieldSource(np.arange(num_samples), FieldInfo("metadata"))
    options = BuildOptions(layout, Compression.parse(compression), client, progress, overwrite, storage_options)
    source = "arrays " + ", ".join(f"{name}: {type(a).__module__}.{type(a).__name__}" for name, a in arrays.items())
    build_store(location, fields, options, shuffled_on_write=shuffle_on_write,
                seed=seed if shuffle_on_write else None, source=source, order=order if shuffle_on_write else None)
    return open_dataset(location, storage_options=storage_options)


def _length(name: str, array: Any) -> int:
    if isinstance(array, Ragged):
        if np.dtype(array.values.dtype).kind not in "biuf":
            raise SourceError(f"ragged field {name!r} holds {array.values.dtype} rows; rows are numbers")
        return len(array)
    shape = array.shape
    if len(shape) == 0:
        raise SourceError(f"field {name!r} is a scalar; fields need a sample axis first")
    if np.dtype(array.dtype).kind == "O":
        raise SourceError(f"field {name!r} has dtype object; use fixed-size numbers or strings")
    return int(shape[0])


def _field_infos(
    names: list[str], roles: Mapping[str, str], classes: Mapping[str, Sequence[str]], text_fields: set[str],
    ragged: Mapping[str, Ragged],
) -> dict[str, FieldInfo]:
    unknown = (set(roles) | set(classes)) - set(names)
    if unknown:
        raise SourceError(f"roles/classes name field(s) {sorted(unknown)} that are not among {names}")
    guessed = guess_roles(names, roles)
    return {
        name: FieldInfo(
            guessed[name],
            tuple(classes[name]) if name in classes else None,
            TEXT_ENCODING if name in text_fields else RAGGED_ENCODING if name in ragged else None,
            dtype=ragged[name].values.dtype.name if name in ragged else None,
            sample_shape=ragged[name].row_shape if name in ragged else None,
        )
        for name in names
    }
