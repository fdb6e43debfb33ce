"""Open and create the Zarr side of a store: groups at a directory, a ``.zip`` file or an fsspec URL,
and field arrays sharded along the sample axis."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ..errors import NotAStoreError, OptionError
from ..format import Compression, Layout
from .zipstore import RangeZipStore

# Zarr's default compares every chunk with the fill value before writing it, to skip empty chunks:
# that check made writes 3x slower (benchmarked), and samples are never all fill values.
WRITE_CONFIG = {"array.write_empty_chunks": True}


def is_url(location: str | os.PathLike) -> bool:
    return "://" in str(location)


def is_zip(location: str | os.PathLike) -> bool:
    return str(location).endswith(".zip")


def open_group(location: str | os.PathLike, mode: str = "r") -> zarr.Group:
    """Open the Zarr group at a directory, a ``.zip`` file or an fsspec URL."""
    text = str(location)
    if not is_url(text) and not Path(text).exists():
        raise NotAStoreError(f"no store at {text!r}: the path does not exist")
    store: Any = text
    if is_zip(text) and not is_url(text):
        if mode != "r":
            raise OptionError(f"{text!r}: zip stores are read-only; write a directory store and pack it")
        try:
            store = RangeZipStore(text)
        except (zipfile.BadZipFile, OSError) as error:
            raise NotAStoreError(f"{text!r} is not a readable zip file ({error}): it is truncated or damaged; "
                                 "copy it again, or re-create it") from None
    try:
        return zarr.open_group(store, mode=mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError) as error:
        raise NotAStoreError(f"{text!r} is not a Zarr group ({error})") from None


def create_field(
    group: zarr.Group,
    name: str,
    dtype: np.dtype,
    sample_shape: tuple[int, ...],
    num_samples: int,
    layout: Layout,
    compression: Compression,
) -> zarr.Array:
    """Create one field array, sharded along the sample axis only, in little-endian byte order (samples
    given in another order are converted when written)."""
    return group.create_array(
        name,
        shape=(num_samples, *sample_shape),
        dtype=np.dtype(dtype).newbyteorder("<"),
        chunks=(layout.chunk_size, *sample_shape),
        shards=(layout.shard_size, *sample_shape),
        compressors=compression.codecs(),
        fill_value=0,
        dimension_names=("sample", *[f"{name}_dim_{i}" for i in range(1, len(sample_shape) + 1)]),
    )


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

