"""The options of an image ingest: the keywords users pass (`IngestKeywords`, the same for `ingest_images`,
`ingest_dataframe`, `ingest_records` and `ingest_splits`) and the one checked value made of them
(`IngestOptions`), which the ingest, an append and the store's recorded recipe all read.

>>> options = IngestOptions.of({"shape": "128,128,3", "images": "encoded"})
>>> options.shape, options.dtype.name, options.images
((128, 128, 3), 'uint8', 'encoded')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Required, TypedDict

from ..errors import OptionError
from ..format import Compression
from ..imaging import (
    DEFAULT_QUALITY,
    MAX_PIXELS,
    ResizePolicy,
    check_max_side,
    parse_image_dtype,
    parse_image_shape,
    parse_resize,
)

IMAGE_STORAGE = ("pixels", "encoded", "both")
ON_ERROR = ("raise", "skip")


class IngestKeywords(TypedDict, total=False):
    """The keywords of every image ingest (`outcore.ingest_images`, `outcore.ingest_dataframe`,
    `outcore.ingest_records`, `outcore.ingest_splits`).

    - ``shape`` (required): each picture's ``(height, width, channels)`` (or ``"128,128,3"``); ``None`` or
      ``(None, None, C)`` keeps each one's own size (encoded pictures).
    - ``resize``: how a picture of another shape is fitted: ``"crop"`` (default), ``"pad"``, ``"stretch"``,
      or ``None`` (a picture of another shape is a bad file).
    - ``dtype``: the pixels' type (default ``"uint8"``).
    - ``images``: ``"pixels"``, ``"encoded"``, ``"both"``, or ``None`` (default: chosen for this machine,
      `outcore.ingest.choice`).
    - ``max_side``, ``quality``: encoded pictures whose longer side is larger are resized to ``max_side``
      and re-encoded once, as JPEGs of ``quality`` (default 90).
    - ``chunk_size``: samples per chunk (default: about 8 MiB of decoded pixels a chunk).
    - ``compression``: the pixels' codec (default Blosc lz4; ``"zstd:5:bitshuffle"``, ...).
    - ``shuffle_on_write``, ``seed``: samples stored in a random order drawn from ``seed`` (default on, 0).
    - ``client``: the ``distributed.Client`` that decodes and writes (default: the active one, else threads).
    - ``on_error``: ``"raise"`` (default: a bad file is an error naming it) or ``"skip"`` (left out, reported).
    - ``max_pixels``: a picture of more pixels is a bad file (a decompression bomb); ``None``: no limit.
    - ``overwrite``, ``resume``: replace a store there; continue a killed run of the same ingest.
    - ``progress``: progress bars and what was chosen, on stderr (default on).
    - ``storage_options``: how to reach an object store (the source's and the store's).
    """

    shape: Required[Sequence[int | None] | str | None]
    resize: ResizePolicy
    dtype: Any
    images: str | None
    max_side: int | None
    quality: int
    chunk_size: int | None
    compression: str | Compression | None
    shuffle_on_write: bool
    seed: int
    client: Any
    on_error: str
    max_pixels: int | None
    overwrite: bool
    resume: bool
    progress: bool
    storage_options: Mapping[str, Any] | None


@dataclass(frozen=True)
class IngestOptions:
    """`IngestKeywords`, checked: ``shape`` parsed (``(None, None, C)`` for pictures at their own size),
    ``resize`` and ``dtype`` parsed, every value in range; an `OptionError` names the keyword otherwise."""

    shape: tuple[int | None, ...]
    resize: ResizePolicy = "crop"
    dtype: Any = "uint8"  # an np.dtype once checked
    images: str | None = None
    max_side: int | None = None
    quality: int = DEFAULT_QUALITY
    chunk_size: int | None = None
    compression: str | Compression | None = None
    shuffle_on_write: bool = True
    seed: int = 0
    client: Any = None
    on_error: str = "raise"
    max_pixels: int | None = MAX_PIXELS
    overwrite: bool = False
    resume: bool = False
    progress: bool = True
    storage_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        set_field = object.__setattr__  # frozen: the parsed values replace the given ones once, here
        set_field(self, "shape", parse_image_shape(self.shape))
        set_field(self, "resize", parse_resize(self.resize))
        set_field(self, "dtype", parse_image_dtype(self.dtype))
        if self.images is not None and self.images not in IMAGE_STORAGE:
            raise OptionError(f"images={self.images!r} is not one of {IMAGE_STORAGE}, or None to choose for this "
                              "machine")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"on_error={self.on_error!r} is not 'raise' or 'skip'")
        check_max_side(self.max_side, self.quality, self.dtype)
        if self.surveyed and self.images not in (None, "encoded"):
            raise OptionError("shape=None and max_side= store the pictures as files: pass images='encoded'")

    @classmethod
    def of(cls, keywords: Mapping[str, Any]) -> IngestOptions:
        """Options from `IngestKeywords`; an unknown keyword, or no ``shape``, is a ``TypeError`` saying so.

        >>> IngestOptions.of({"shape": (64, 64, 3), "shufle": False})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: unknown ingest option(s) ['shufle']; the options are ['chunk_size', 'client', ...]
        """
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(keywords) - set(known))
        if unknown:
            raise TypeError(f"unknown ingest option(s) {unknown}; the options are {sorted(known)}")
        if "shape" not in keywords:
            raise TypeError("ingest needs shape= (e.g. shape=(128, 128, 3), or None to keep each picture's size)")
        return cls(**keywords)

    def replace(self, **changes: Any) -> IngestOptions:
        """These options with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    @property
    def surveyed(self) -> bool:
        """Whether what is stored is known only once every picture is decoded: pictures kept at their own
        size (``shape=None``), or capped at ``max_side``."""
        return self.shape[0] is None or self.max_side is not None

    def recipe(self, images: str) -> dict[str, Any]:
        """What makes a sample, as the store's provenance records it (an append must match it), with the
        ``images`` stored."""
        return {"shape": list(self.shape), "resize": self.resize, "dtype": self.dtype.name, "images": images,
                "max_side": self.max_side, "quality": self.quality, "max_pixels": self.max_pixels}
