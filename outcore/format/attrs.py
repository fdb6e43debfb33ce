"""The store's attributes, version 1: the JSON document under the group attribute ``outcore``.

An outcore store is a Zarr v3 group holding one array per field. Every field array has the sample
axis first and the same axis-0 chunking (see `outcore.format.layout`). The attributes say what the
fields are for; docs/format.md is the full description. Pure values: no I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import NotAStoreError
from .text import TEXT_ENCODING

FORMAT_VERSION = 1
ATTRS_KEY = "outcore"
ROLES = ("input", "target", "metadata", "other")
IMAGE_ENCODING = "image"


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
      gives each sample's ``[start, stop)`` in it (see `outcore.format.encoded`).
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
