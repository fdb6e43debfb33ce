"""Open, check, create and read the Zarr side of a store (the format itself is in `outcore.schema`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from .errors import CorruptChunkError, NotAStoreError, UnsafeStoreError
from .schema import ATTRS_KEY, Compression, Layout, StoreAttrs
from .zipstore import RangeZipStore

# Zarr's default compares every chunk with the fill value before writing it, to skip empty chunks:
# that check made writes 3x slower (benchmarked), and samples are never all fill values.
WRITE_CONFIG = {"array.write_empty_chunks": True}
_CORRUPTION = re.compile(r"checksum|decompress|blosc|corrupt", re.IGNORECASE)
_UNSAFE_CODECS = re.compile(r"pickle|object|vlen-|json2|msgpack", re.IGNORECASE)


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
            raise ValueError(f"{text!r}: zip stores are read-only; write a directory store and pack it")
        store = RangeZipStore(text)
    try:
        return zarr.open_group(store, mode=mode)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeTypeValidationError) as error:
        raise NotAStoreError(f"{text!r} is not a Zarr group ({error})") from None


def read_attrs(group: zarr.Group, where: str) -> StoreAttrs:
    document = group.attrs.get(ATTRS_KEY)
    if document is None:
        raise NotAStoreError(
            f"{where} is a Zarr group but not an outcore store (no {ATTRS_KEY!r} attribute); read it with "
            "zarr.open_group, or convert it with outcore.from_arrays"
        )
    return StoreAttrs.from_dict(document, where)


def check_safe(group: zarr.Group, fields: Iterable[str], where: str) -> None:
    """Refuse a field whose codecs or data type would unpickle or evaluate stored bytes.

    The raw JSON metadata is read, so such a codec is refused before Zarr even looks it up.
    """
    for name in fields:
        raw = sync(group.store.get(f"{group.path}/{name}/zarr.json".lstrip("/"), default_buffer_prototype()))
        if raw is None:
            raw = sync(group.store.get(f"{group.path}/{name}/.zarray".lstrip("/"), default_buffer_prototype()))
        if raw is None:
            continue  # a missing field is reported by the Dataset with the expected shape
        metadata = json.loads(raw.to_bytes())
        names = " ".join(_codec_names(metadata))
        data_type = str(metadata.get("data_type", metadata.get("dtype", "")))
        if _UNSAFE_CODECS.search(names) or _UNSAFE_CODECS.search(data_type) or data_type in ("|O", "string"):
            raise UnsafeStoreError(
                f"{where}: field {name!r} uses an object or pickle codec or data type ({names} {data_type}); "
                "outcore never decodes such data. Rewrite the field with a fixed-size dtype."
            )


def _codec_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key in ("name", "id"):
            if isinstance(node.get(key), str):
                yield node[key]
        for key, value in node.items():
            if key in ("codecs", "compressor", "filters", "configuration", "index_codecs", "serializer"):
                yield from _codec_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _codec_names(item)


def create_field(
    group: zarr.Group,
    name: str,
    dtype: np.dtype,
    sample_shape: tuple[int, ...],
    num_samples: int,
    layout: Layout,
    compression: Compression,
) -> zarr.Array:
    """Create one field array, sharded along the sample axis only."""
    return group.create_array(
        name,
        shape=(num_samples, *sample_shape),
        dtype=dtype,
        chunks=(layout.chunk_size, *sample_shape),
        shards=(layout.shard_size, *sample_shape),
        compressors=compression.codecs(),
        fill_value=0,
        dimension_names=("sample", *[f"{name}_dim_{i}" for i in range(1, len(sample_shape) + 1)]),
    )


def read_samples(array: zarr.Array, selection: tuple[slice, ...], field_name: str, where: str) -> np.ndarray:
    """``array[selection]``, turning a checksum or decompression failure into a `CorruptChunkError`.

    The error names the field, the chunk and its shard file, and says what to do.
    """
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
