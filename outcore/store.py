"""Store format version 1: a Zarr v3 group holding one array per field.

Every field array has the sample axis first and the same axis-0 chunking (``chunk_size`` samples per
chunk, ``shard_size`` samples per shard file). Chunks are Blosc-compressed and crc32c-checksummed; the
group's ``outcore`` attribute (JSON only, see `StoreAttrs`) describes the fields. Stores are plain Zarr:
``zarr.open_group`` and ``dask.array.from_zarr`` read them without outcore.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import uuid
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from .errors import CorruptChunkError, NotAStoreError, StoreExistsError, UnsafeStoreError
from .zipstore import RangeZipStore

FORMAT_VERSION = 1
ATTRS_KEY = "outcore"
ROLES = ("input", "target", "metadata", "other")
TARGET_CHUNK_BYTES = 8 * 2**20
TARGET_SHARD_BYTES = 128 * 2**20
MAX_CHUNK_SIZE = 65536
TEXT_ENCODING = "utf-8"
# Zarr's default compares every chunk with the fill value before writing it, to skip empty chunks:
# that check made writes 3x slower (benchmarked), and samples are never all fill values.
WRITE_CONFIG = {"array.write_empty_chunks": True}
_SHUFFLES = ("bitshuffle", "shuffle", "noshuffle")
_CNAMES = ("zstd", "lz4", "lz4hc", "blosclz", "zlib")
_UNSAFE_CODECS = re.compile(r"pickle|object|vlen-|json2|msgpack", re.IGNORECASE)


@dataclass(frozen=True)
class Compression:
    """Blosc settings of every chunk: ``Compression.parse("zstd:3:bitshuffle")``.

    The default, lz4 at level 5 with byte shuffling, was chosen by ``python benchmarks/codecs.py``:
    on photographs it decodes 2-3x faster than lz4 or zstd with bit shuffling, which store them only
    15-25 % smaller (lossless codecs gain little on photos). Decoding is what a training loop waits
    on; where the disk is the bottleneck, choose ``zstd:3:bitshuffle`` (docs/format.md has the table).

    >>> str(Compression.parse("zstd"))
    'zstd:5:shuffle'
    """

    cname: str = "lz4"
    clevel: int = 5
    shuffle: str = "shuffle"

    def __post_init__(self) -> None:
        if self.cname not in _CNAMES + ("none",):
            raise ValueError(f"compressor {self.cname!r} is not one of {_CNAMES + ('none',)}")
        if not 0 <= self.clevel <= 9:
            raise ValueError(f"compression level {self.clevel} is not between 0 and 9")
        if self.shuffle not in _SHUFFLES:
            raise ValueError(f"shuffle {self.shuffle!r} is not one of {_SHUFFLES}")

    @classmethod
    def parse(cls, value: str | Compression | None) -> Compression:
        """Read ``"CNAME[:LEVEL[:SHUFFLE]]"`` (or ``"none"``); ``None`` gives the default."""
        if value is None:
            return cls()
        if isinstance(value, Compression):
            return value
        parts = str(value).split(":")
        if len(parts) > 3:
            raise ValueError(f"compressor {value!r} is not of the form CNAME[:LEVEL[:SHUFFLE]]")
        try:
            level = int(parts[1]) if len(parts) > 1 else cls.clevel
        except ValueError:
            raise ValueError(f"compression level {parts[1]!r} in {value!r} is not an integer") from None
        return cls(parts[0], level, parts[2] if len(parts) > 2 else cls.shuffle)

    def codecs(self) -> list[Any]:
        """The bytes-to-bytes codecs of each chunk: Blosc (unless ``none``), then a crc32c checksum."""
        if self.cname == "none":
            return [Crc32cCodec()]
        return [BloscCodec(cname=self.cname, clevel=self.clevel, shuffle=self.shuffle), Crc32cCodec()]

    def __str__(self) -> str:
        return "none" if self.cname == "none" else f"{self.cname}:{self.clevel}:{self.shuffle}"


@dataclass(frozen=True)
class Layout:
    """How samples are grouped on disk: ``chunk_size`` per chunk, ``shard_size`` (a multiple) per file."""

    chunk_size: int
    shard_size: int

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.shard_size < self.chunk_size or self.shard_size % self.chunk_size:
            raise ValueError(
                f"chunk_size={self.chunk_size} must be >= 1 and divide shard_size={self.shard_size}"
            )

    @classmethod
    def for_samples(
        cls, sample_nbytes: int, num_samples: int | None, chunk_size: int | None = None
    ) -> Layout:
        """Chunks of about 8 MiB (a power of two of samples) and shard files of about 128 MiB.

        Each ingest task writes one whole shard, so the shard size bounds its memory; 128 MiB keeps
        several shards in flight on small stores (docs/format.md) and a million 128x128 RGB images in
        about 500 files per field.

        >>> Layout.for_samples(128 * 128 * 3, 10_000)
        Layout(chunk_size=128, shard_size=2048)
        """
        sample_nbytes = max(1, sample_nbytes)
        if chunk_size is None:
            largest = MAX_CHUNK_SIZE if not num_samples else min(MAX_CHUNK_SIZE, 1 << (num_samples - 1).bit_length())
            chunk_size = _power_of_two_at_most(TARGET_CHUNK_BYTES // sample_nbytes, largest)
        chunk_size = int(chunk_size)
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be a positive number of samples")
        chunks_per_shard = _power_of_two_at_most(TARGET_SHARD_BYTES // (chunk_size * sample_nbytes), 1024)
        if num_samples:
            chunks_per_shard = min(chunks_per_shard, math.ceil(num_samples / chunk_size))
        return cls(chunk_size, chunk_size * max(1, chunks_per_shard))


def _power_of_two_at_most(value: int, cap: int) -> int:
    return min(cap, 1 << max(0, int(value).bit_length() - 1))


@dataclass(frozen=True)
class FieldInfo:
    """What a field is for: its ``role``; for class labels, the class names in index order; for text,
    its ``encoding`` (text is stored as zero-padded UTF-8 bytes, ``uint8`` of shape (N, max_bytes))."""

    role: str = "other"
    classes: tuple[str, ...] | None = None
    encoding: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"field role {self.role!r} is not one of {ROLES}")
        if self.encoding not in (None, TEXT_ENCODING):
            raise ValueError(f"field encoding {self.encoding!r} is not {TEXT_ENCODING!r}")


def encode_text(values: np.ndarray) -> np.ndarray:
    """Strings as zero-padded UTF-8 bytes: ``uint8`` of shape (N, longest encoding).

    Zarr's string data types are not yet in the v3 specification (zarr warns when writing them);
    fixed-width bytes are, so every Zarr reader can read outcore's text fields.

    >>> decode_text(encode_text(np.array(["a.jpg", "é.png"]))).tolist()
    ['a.jpg', 'é.png']
    """
    encoded = np.char.encode(np.asarray(values).astype(str), TEXT_ENCODING)
    width = max(1, encoded.dtype.itemsize)
    return np.frombuffer(encoded.astype(f"S{width}").tobytes(), dtype=np.uint8).reshape(len(encoded), width)


def decode_text(raw: np.ndarray) -> np.ndarray:
    """The inverse of `encode_text`, for any leading shape."""
    raw = np.ascontiguousarray(raw)
    return np.char.decode(raw.view(f"S{raw.shape[-1]}")[..., 0], TEXT_ENCODING)


@dataclass(frozen=True)
class StoreAttrs:
    """The JSON document stored under the group attribute ``outcore``."""

    num_samples: int
    chunk_size: int
    fields: dict[str, FieldInfo]
    shuffled_on_write: bool = False
    seed: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, Any] | None = None
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["fields"] = {
            name: {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(info).items() if v is not None}
            for name, info in self.fields.items()
        }
        return {k: v for k, v in document.items() if v is not None}

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], where: str) -> StoreAttrs:
        try:
            version = int(document["format_version"])
            if version > FORMAT_VERSION:
                raise NotAStoreError(
                    f"{where} uses outcore store format {version}; this outcore reads up to "
                    f"{FORMAT_VERSION}. Upgrade outcore to open it."
                )
            fields = {
                name: FieldInfo(info.get("role", "other"), _tuple_or_none(info.get("classes")), info.get("encoding"))
                for name, info in document["fields"].items()
            }
            return cls(
                num_samples=int(document["num_samples"]),
                chunk_size=int(document["chunk_size"]),
                fields=fields,
                shuffled_on_write=bool(document.get("shuffled_on_write", False)),
                seed=document.get("seed"),
                provenance=dict(document.get("provenance", {})),
                skipped=document.get("skipped"),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            if isinstance(error, NotAStoreError):
                raise
            raise NotAStoreError(f"{where} has malformed outcore attributes ({error!r})") from None


def _tuple_or_none(values: Any) -> tuple[str, ...] | None:
    return None if values is None else tuple(str(v) for v in values)


# -- locations ------------------------------------------------------------------------------------------


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
        start = selection[0].start or 0
        chunk_size, shard_size = array.chunks[0], (array.shards or array.chunks)[0]
        chunk = start // chunk_size
        key = "/".join(["c", str(start // shard_size)] + ["0"] * (array.ndim - 1))
        raise CorruptChunkError(
            f"{where}: field {field_name!r}, chunk {chunk} (samples {chunk * chunk_size}.."
            f"{min(array.shape[0], (chunk + 1) * chunk_size) - 1}, in file {field_name}/{key}) is corrupt: "
            f"{error}. Restore that file from a copy or re-create the store from its source."
        ) from error


# -- writing ----------------------------------------------------------------------------------------------


@contextmanager
def staged_store(location: str | os.PathLike, overwrite: bool) -> Iterator[Path]:
    """Yield a fresh directory to build a store in; move it to ``location`` only when the block succeeds.

    A failed or interrupted ingest leaves no store at ``location`` (nor touches an existing one); a
    ``.zip`` location gets the finished directory packed into one file (entries stored, not recompressed).
    """
    if is_url(location):
        raise ValueError(f"cannot write to {location!r}: outcore writes stores to local paths only")
    target = Path(location).absolute()
    if target.exists() and not overwrite:
        raise StoreExistsError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        yield staging
        if is_zip(target):
            packed = staging.with_suffix(".zip")
            pack_zip(staging, packed)
            shutil.rmtree(staging)
            staging = packed
        _replace(staging, target)
    finally:
        remove_path(staging)


def pack_zip(directory: Path, zip_path: Path) -> None:
    """Pack a store directory into a zip file that ``zarr.storage.ZipStore`` reads."""
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())


def _replace(new: Path, target: Path) -> None:
    previous = target.parent / f".{target.name}.previous-{uuid.uuid4().hex[:8]}"
    if target.exists():
        os.replace(target, previous)
    os.replace(new, target)
    remove_path(previous)


def remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
