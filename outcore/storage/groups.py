"""Open and create the Zarr side of a store: groups at a directory, a ``.zip`` file or an fsspec URL,
and field arrays sharded along the sample axis."""

from __future__ import annotations

import math
import os
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ..errors import NotAStoreError, OptionError
from ..format import Compression, FieldInfo, Layout, class_flags
from ..format import dimension_names as format_dimension_names
from .cache import ChunkCache
from .remote import RemoteStore, is_object_url, redact
from .zipstore import RangeZipStore


def writable(array: zarr.Array) -> zarr.Array:
    """``array`` writing every chunk, even one of fill values only. Zarr's default compares every chunk with
    the fill value and skips empty ones: that check costs more than the write, and a shard of
    zeros (labels of one class, black pictures) would be left unwritten, which outcore's readers take for
    a lost file. Set on the array, not in zarr's global config, which threads writing at once would
    restore under each other's feet (a shard of zeros went missing so).

    >>> writable(zarr.zeros((4,), chunks=(2,))).config.write_empty_chunks
    True
    """
    return array.with_config({"write_empty_chunks": True})


def is_url(location: str | os.PathLike) -> bool:
    return "://" in str(location)


def is_zip(location: str | os.PathLike) -> bool:
    return str(location).endswith(".zip")


def open_group(location: str | os.PathLike, mode: str = "r", *, storage_options: Mapping[str, Any] | None = None,
               cache: ChunkCache | None = None) -> zarr.Group:
    """Open the Zarr group at a directory, a ``.zip`` file, an object store URL (``s3://``, ``gs://``,
    ``az://``, ``https://``, of a folder or a ``.zip``: a `RemoteStore`, reading through ``cache``) or
    another fsspec URL."""
    text = str(location)
    if not is_url(text) and not Path(text).exists():
        raise NotAStoreError(f"no store at {text!r}: the path does not exist")
    store: Any = text
    if is_url(text) and is_object_url(text):  # a folder, or a zip read by ranges (`outcore.storage.remote_zip`)
        store = RemoteStore(text, storage_options, cache=cache, read_only=mode == "r")
    elif is_url(text) and storage_options:
        store = zarr.storage.FsspecStore.from_url(text, storage_options=dict(storage_options),
                                                  read_only=mode == "r")
    elif is_zip(text) and not is_url(text):
        if mode != "r":
            raise OptionError(f"{text!r}: zip stores are read-only; write a directory store and pack it")
        try:
            store = RangeZipStore(text)
        except (zipfile.BadZipFile, OSError) as error:
            raise NotAStoreError(f"{text!r} is not a readable zip file ({error}): it is truncated or damaged; "
                                 "copy it again, or re-create it") from None
    try:  # the arrays' own metadata, never a consolidated copy that a growing store has outdated
        # outcore writes Zarr v3: saying so spares an object store three requests for v2's files
        version = {"zarr_format": 3} if isinstance(store, RemoteStore) else {}
        return zarr.open_group(store, mode=mode, use_consolidated=False, **version)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError) as error:
        where = redact(text) if is_url(text) else text
        raise NotAStoreError(f"{where!r} is not a Zarr group ({error})") from None


def create_field(
    group: zarr.Group,
    name: str,
    dtype: np.dtype,
    sample_shape: tuple[int, ...],
    num_samples: int,
    layout: Layout,
    compression: Compression,
    dimension_names: Sequence[str] | None = None,
    small: bool = False,
) -> zarr.Array:
    """Create one field array, sharded along the sample axis only, in little-endian byte order (samples
    given in another order are converted when written); ``dimension_names`` default to
    `outcore.format.dimension_names` of this field alone. A ``small`` field (one beside the pictures:
    labels, paths, byte ranges) gets shard files of its own size (`Layout.shard_size_for`)."""
    sample_nbytes = math.prod(sample_shape) * np.dtype(dtype).itemsize
    return group.create_array(
        name,
        shape=(num_samples, *sample_shape),
        dtype=np.dtype(dtype).newbyteorder("<"),
        chunks=(layout.chunk_size, *sample_shape),
        shards=(layout.shard_size_for(sample_nbytes) if small else layout.shard_size, *sample_shape),
        compressors=compression.codecs(),
        fill_value=0,
        dimension_names=dimension_names or format_dimension_names({name: (dtype, sample_shape)})[name],
    )


def describe_classes(group: zarr.Group, fields: Mapping[str, FieldInfo]) -> None:
    """Give each class-label array its `outcore.format.class_flags`, so plain zarr and xarray readers see
    what the numbers mean."""
    for name, info in fields.items():
        if info.classes:
            group[name].attrs.update(class_flags(info.classes))


def consolidate(location: str | os.PathLike) -> None:
    """Copy every array's metadata into the group's ``zarr.json`` (zarr's consolidated metadata), so
    ``xarray.open_zarr`` opens the store in one read and without a warning. outcore itself reads each
    array's own metadata. The copy is marked ``must_understand: false``, so Zarr readers that do not
    know it (it is zarr-python's, not yet the specification's, which zarr warns of) ignore it.

    zarr warns from its own event-loop thread, so a filter set for the call alone (``catch_warnings``) is
    gone again when the call is interrupted (Ctrl-C) before that thread warns: the filter for that one
    message stays set instead."""
    warnings.filterwarnings("ignore", "Consolidated metadata is currently not part", UserWarning)
    zarr.consolidate_metadata(str(location))


def samples_per_shard(array: zarr.Array, chunk_size: int) -> int:
    """The samples of a field array one shard file holds (an encoded field's bytes: its regions' samples).

    >>> samples_per_shard(zarr.create_array({}, shape=(100,), chunks=(4,), shards=(16,), dtype="i8"), 4)
    16
    """
    return (array.shards or array.chunks)[0] // array.chunks[0] * chunk_size


def small_fields(sample_nbytes: Mapping[str, float]) -> set[str]:
    """The fields smaller a sample than the largest (labels, paths beside the pictures), by their bytes a sample:
    those `create_field` makes ``small``.

    >>> sorted(small_fields({"images": 49_152, "labels": 8, "path": 256}))
    ['labels', 'path']
    """
    largest = max(sample_nbytes.values(), default=0)
    return {name for name, nbytes in sample_nbytes.items() if nbytes < largest}


def small_rows_path(directory: Path) -> Path:
    """Where the tasks writing the store being built at ``directory`` save its small fields' rows
    (`outcore.storage.small_rows`)."""
    return directory.with_name(f"{directory.name}.small")


def shard_path(array: zarr.Array, shard: int) -> str:
    """The key of shard file ``shard`` of a field array, relative to the store (``images/c/3/0/0/0``)."""
    return "/".join([array.path, "c", str(shard)] + ["0"] * (array.ndim - 1))


def make_durable(paths: list[Path]) -> None:
    """fsync files and the folders that name them, so that they survive a crash of the machine."""
    for path in paths:
        for target in (path, path.parent):
            descriptor = os.open(target, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)

