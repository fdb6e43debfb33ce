"""The store format, version 1, as validated value objects: codecs, chunk layout, field and store attributes.

An outcore store is a Zarr v3 group holding one array per field. Every field array has the sample
axis first and the same axis-0 chunking (``chunk_size`` samples per chunk, ``shard_size`` samples per
shard file). Chunks are Blosc-compressed and crc32c-checksummed; the group's ``outcore`` attribute
(JSON only, see `StoreAttrs`) describes the fields. docs/format.md is the full description.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from zarr.codecs import BloscCodec, Crc32cCodec

from .errors import NotAStoreError

FORMAT_VERSION = 1
ATTRS_KEY = "outcore"
ROLES = ("input", "target", "metadata", "other")
TARGET_CHUNK_BYTES = 8 * 2**20
TARGET_SHARD_BYTES = 128 * 2**20
MAX_CHUNK_SIZE = 65536
MIN_SHARDS = 8
TEXT_ENCODING = "utf-8"
IMAGE_ENCODING = "image"
RANGES_SUFFIX = "_ranges"
_SHUFFLES = ("bitshuffle", "shuffle", "noshuffle")
_CNAMES = ("zstd", "lz4", "lz4hc", "blosclz", "zlib")


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
        """Chunks of about 8 MiB (a power of two of samples) and shard files of at most about 128 MiB.

        Each ingest task decodes and writes one whole shard, so the shard size bounds a task's memory,
        and small stores get at least ``MIN_SHARDS`` shards so that every core has work: 10,000 128x128
        RGB images make 10 shard files per field, a million about 500.

        >>> Layout.for_samples(128 * 128 * 3, 10_000)
        Layout(chunk_size=128, shard_size=1024)
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
            chunks = math.ceil(num_samples / chunk_size)
            chunks_per_shard = min(chunks_per_shard, _power_of_two_at_most(max(1, chunks // MIN_SHARDS), chunks))
        return cls(chunk_size, chunk_size * max(1, chunks_per_shard))


def _power_of_two_at_most(value: int, cap: int) -> int:
    return min(cap, 1 << max(0, int(value).bit_length() - 1))


@dataclass(frozen=True)
class ImageDecode:
    """How an encoded image field decodes: to ``shape`` and ``dtype``, fitting other sizes by ``resize``."""

    shape: tuple[int, ...]
    dtype: str = "uint8"
    resize: str | None = "crop"

    @property
    def nbytes(self) -> int:
        """Bytes of one decoded sample."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class FieldInfo:
    """What a field is for: its ``role``; for class labels, the class names in index order; its
    ``encoding`` when its array does not hold the values themselves:

    - ``"utf-8"``: text, stored as zero-padded UTF-8 bytes, ``uint8`` of shape (N, max_bytes);
    - ``"image"``: encoded image files (JPEG, PNG, ...), decoded as ``decode`` says. The field's array
      holds the bytes, one region of fixed capacity per chunk; the array ``<field>_ranges`` (N, 2)
      gives each sample's ``[start, stop)`` in it (see `outcore.encoded`).
    """

    role: str = "other"
    classes: tuple[str, ...] | None = None
    encoding: str | None = None
    decode: ImageDecode | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"field role {self.role!r} is not one of {ROLES}")
        if self.encoding not in (None, TEXT_ENCODING, IMAGE_ENCODING):
            raise ValueError(f"field encoding {self.encoding!r} is not {TEXT_ENCODING!r} or {IMAGE_ENCODING!r}")
        if (self.encoding == IMAGE_ENCODING) != (self.decode is not None):
            raise ValueError("an image-encoded field needs its decode settings, and only it has them")

    @property
    def is_text(self) -> bool:
        return self.encoding == TEXT_ENCODING

    @property
    def is_image(self) -> bool:
        return self.encoding == IMAGE_ENCODING

    def to_dict(self) -> dict[str, Any]:
        document = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v is not None}
        if self.decode is not None:
            document["decode"] = {**asdict(self.decode), "shape": list(self.decode.shape)}
        return document

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> FieldInfo:
        decode = document.get("decode")
        return cls(
            document.get("role", "other"),
            _tuple_or_none(document.get("classes")),
            document.get("encoding"),
            ImageDecode(tuple(int(s) for s in decode["shape"]), str(decode["dtype"]), decode.get("resize"))
            if decode is not None else None,
        )


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
        document["fields"] = {name: info.to_dict() for name, info in self.fields.items()}
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
            fields = {name: FieldInfo.from_dict(info) for name, info in document["fields"].items()}
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
