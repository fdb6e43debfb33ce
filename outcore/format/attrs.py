"""The store's attributes, version 1: the JSON document under the group attribute ``outcore``.

An outcore store is a Zarr v3 group holding one array per field. Every field array has the sample
axis first and the same axis-0 chunking (see `outcore.format.layout`). The attributes say what the
fields are for; docs/format.md is the full description. Pure values: no I/O here.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..errors import NotAStoreError
from .encoded import companion_names, ranges_name
from .text import TEXT_ENCODING

FORMAT_VERSION = 1
ATTRS_KEY = "outcore"
MAX_SAMPLES = 2**48  # far beyond any data set, and small enough that counts and offsets stay exact
ROLES = ("input", "target", "sample_weight", "metadata", "other")
TARGET_NAMES = ("labels", "label", "targets", "target", "y")
WEIGHT_NAMES = ("sample_weight", "sample_weights", "weight", "weights")
IMAGE_ENCODING = "image"
RAGGED_ENCODING = "ragged"
RASTER_ENCODING = "raster"
ENCODINGS = (None, TEXT_ENCODING, IMAGE_ENCODING, RAGGED_ENCODING, RASTER_ENCODING)
FIELD_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                "float32", "float64")


@dataclass(frozen=True)
class ImageDecode:
    """How an encoded image field decodes: to ``shape`` and ``dtype``, fitting other sizes by ``resize``.

    A ``shape`` of ``(None, None, C)`` keeps every picture at its own size (each sample's shape is stored
    beside the bytes, `outcore.format.encoded`); ``resize`` is then unused.
    """

    shape: tuple[int | None, ...]
    dtype: str = "uint8"
    resize: str | None = "crop"

    @property
    def variable(self) -> bool:
        """Whether samples keep their own sizes (``shape=None`` at ingest)."""
        return self.shape[0] is None

    @property
    def channels(self) -> int:
        return self.shape[2] if len(self.shape) == 3 else 1

    @property
    def nbytes(self) -> int | None:
        """Bytes of one decoded sample; None when sizes vary."""
        return None if self.variable else math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class FieldInfo:
    """What a field is for: its ``role``; for class labels, the class names in index order; its
    ``encoding`` when its array does not hold the values themselves:

    - ``"utf-8"``: text, stored as zero-padded UTF-8 bytes, ``uint8`` of shape (N, max_bytes);
    - ``"image"``: encoded image files (JPEG, PNG, ...), decoded as ``decode`` says. The field's array
      holds the bytes, one region of fixed capacity per chunk; the array ``<field>_ranges`` (N, 2)
      gives each sample's ``[start, stop)`` in it (see `outcore.format.encoded`);
    - ``"ragged"``: a variable number of rows per sample (boxes, keypoints, their labels), ``dtype`` rows of
      ``sample_shape``, one region of fixed capacity per chunk; ``<field>_ranges`` (N, 2) gives each sample's
      rows ``[start, stop)`` (see `outcore.format.ragged`);
    - ``"raster"``: an array of its picture's own height and width per sample (the label maps and paired pictures
      of pictures kept at their own size), laid out as a ragged field whose rows are its pixels (``dtype`` of
      ``sample_shape``: ``()``, or ``(channels,)``), and ``<field>_shapes`` (N, 3) int32 each sample's height,
      width and channels: sample ``i`` is ``F[slice(*F_ranges[i])].reshape(height, width, *sample_shape)``.

    ``dtype`` and ``sample_shape`` record what the field's array holds (stores written before they
    were recorded lack them), so that an array whose metadata was changed is refused on open. A field of
    keypoints (rows of (points, 2 or 3)) names its ``points`` in order: COCO's ``left_eye``, ``right_eye``, ...
    """

    role: str = "other"
    classes: tuple[str, ...] | None = None
    encoding: str | None = None
    decode: ImageDecode | None = None
    dtype: str | None = None
    sample_shape: tuple[int, ...] | None = None
    points: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"field role {self.role!r} is not one of {ROLES}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"field encoding {self.encoding!r} is not one of {ENCODINGS[1:]}")
        if (self.encoding == IMAGE_ENCODING) != (self.decode is not None):
            raise ValueError("an image-encoded field needs its decode settings, and only it has them")
        if self.encoding in (RAGGED_ENCODING, RASTER_ENCODING) and (self.dtype is None or self.sample_shape is None):
            raise ValueError(f"a {self.encoding} field needs the dtype and shape of its rows")
        if self.points is not None and (self.sample_shape is None or len(self.sample_shape) != 2
                                        or self.sample_shape[0] != len(self.points)):
            raise ValueError(f"{len(self.points)} point names for rows of shape {self.sample_shape}: keypoints are "
                             "rows of (points, 2 or 3)")
        if self.encoding == RASTER_ENCODING and len(self.sample_shape) > 1:
            raise ValueError(f"a raster field's pixels are of shape () or (channels,), not {self.sample_shape}")

    @property
    def is_text(self) -> bool:
        return self.encoding == TEXT_ENCODING

    @property
    def is_image(self) -> bool:
        return self.encoding == IMAGE_ENCODING

    @property
    def is_ragged(self) -> bool:
        return self.encoding == RAGGED_ENCODING

    @property
    def is_raster(self) -> bool:
        return self.encoding == RASTER_ENCODING

    @property
    def in_regions(self) -> bool:
        """Whether the field's array holds one region per chunk, its samples' ranges beside it (encoded
        pictures, ragged rows, rasters), rather than one entry per sample."""
        return self.is_image or self.is_ragged or self.is_raster

    def companions(self, name: str) -> list[str]:
        """The arrays beside the field ``name``'s own: an encoded, ragged or raster field's ranges (and shapes).

        >>> FieldInfo("target", encoding="ragged", dtype="float32", sample_shape=(4,)).companions("boxes")
        ['boxes_ranges']
        >>> FieldInfo("target", encoding="raster", dtype="uint8", sample_shape=()).companions("masks")
        ['masks_ranges', 'masks_shapes']
        """
        if self.is_image or self.is_raster:
            return companion_names(name, self.is_raster or self.decode.variable)
        return [ranges_name(name)] if self.is_ragged else []

    def to_dict(self) -> dict[str, Any]:
        document = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if v is not None}
        if self.decode is not None:
            document["decode"] = {**asdict(self.decode), "shape": list(self.decode.shape)}
        return document

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> FieldInfo:
        """Read and check one field's document; a ``ValueError`` names what is wrong."""
        _expect(isinstance(document, Mapping), f"a field's description is {type(document).__name__}, not an object")
        classes = document.get("classes")
        if classes is not None:
            _expect(isinstance(classes, list) and all(isinstance(c, str) for c in classes),
                    f"classes {classes!r} are not a list of names")
        points = document.get("points")
        if points is not None:
            _expect(isinstance(points, list) and all(isinstance(p, str) for p in points),
                    f"points {points!r} are not a list of names")
        decode, shape = document.get("decode"), document.get("sample_shape")
        _expect(shape is None or (isinstance(shape, list) and all(_is_int(s) and 0 <= s <= 2**31 for s in shape)),
                f"sample_shape {shape!r} is not a list of sizes")
        return cls(_choice(document.get("role", "other"), ROLES, "role"),
                   None if classes is None else tuple(classes),
                   _choice(document.get("encoding"), ENCODINGS, "encoding"),
                   None if decode is None else _image_decode(decode),
                   _choice(document.get("dtype"), (None, *FIELD_DTYPES), "dtype"),
                   None if shape is None else tuple(shape), None if points is None else tuple(points))


def _image_decode(document: Any) -> ImageDecode:
    _expect(isinstance(document, Mapping), "an image field's decode settings are not an object")
    shape = document.get("shape")
    _expect(isinstance(shape, list) and len(shape) in (2, 3) and (len(shape) == 2 or shape[2] in (1, 3, 4))
            and (all(_is_int(s) and 0 < s <= 2**16 for s in shape)
                 or (shape[:2] == [None, None] and all(_is_int(s) for s in shape[2:]))),
            f"decode shape {shape!r} is not (H, W) or (H, W, C), with null sizes when they vary")
    return ImageDecode(tuple(shape), _choice(document.get("dtype"), ("uint8", "uint16"), "decode dtype"),
                       _choice(document.get("resize"), ("fit", "crop", "pad", None), "resize"))


@dataclass(frozen=True)
class StoreAttrs:
    """The JSON document stored under the group attribute ``outcore``.

    ``generation`` names the store: made anew for each store created (an ingest, an overwrite, a Writer),
    kept by appends, which keep its samples in place; a reader holding a store checks it
    (`outcore.storage.pins`). Stores written before outcore recorded it have none.

    ``num_samples`` is what readers read; the arrays hold exactly as many, unless ``growing``: a `Writer`
    or an append is growing the store in place (or stopped before publishing what it wrote), and the
    arrays may hold samples beyond the count, which readers ignore.
    """

    num_samples: int
    chunk_size: int
    fields: dict[str, FieldInfo]
    shuffled_on_write: bool = False
    seed: int | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, Any] | None = None
    format_version: int = FORMAT_VERSION
    generation: str | None = field(default_factory=lambda: uuid.uuid4().hex)
    growing: bool = False

    def to_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["fields"] = {name: info.to_dict() for name, info in self.fields.items()}
        return {k: v for k, v in document.items() if v is not None and not (k == "growing" and not v)}

    @classmethod
    def from_dict(cls, document: Mapping[str, Any], where: str) -> StoreAttrs:
        """Read and check the document: every key of the right type and range, or `NotAStoreError`
        naming what is wrong (a store of a newer format asks for a newer outcore)."""
        try:
            _expect(isinstance(document, Mapping), f"they are {type(document).__name__}, not an object")
            version = document.get("format_version")
            _expect(_is_int(version), f"format_version {version!r} is not an integer")
            if version > FORMAT_VERSION:
                raise NotAStoreError(
                    f"{where} uses outcore store format {version}; this outcore reads up to "
                    f"{FORMAT_VERSION}. Upgrade outcore to open it."
                )
            _expect(version >= 1, f"format_version {version} is not one outcore ever wrote")
            fields = document.get("fields")
            _expect(isinstance(fields, Mapping) and len(fields) > 0 and all(isinstance(n, str) for n in fields),
                    f"fields {fields!r} are not a non-empty object of field names")
            seed, skipped = document.get("seed"), document.get("skipped")
            _expect(seed is None or _is_int(seed), f"seed {seed!r} is not an integer")
            _expect(skipped is None or isinstance(skipped, Mapping), "skipped is not an object")
            shuffled = document.get("shuffled_on_write", False)
            _expect(isinstance(shuffled, bool), f"shuffled_on_write {shuffled!r} is not true or false")
            provenance = document.get("provenance", {})
            _expect(isinstance(provenance, Mapping), "provenance is not an object")
            generation = document.get("generation")
            _expect(generation is None or isinstance(generation, str), f"generation {generation!r} is not a string")
            growing = document.get("growing", False)
            _expect(isinstance(growing, bool), f"growing {growing!r} is not true or false")
            return cls(
                num_samples=_bounded(document.get("num_samples"), "num_samples", 0, MAX_SAMPLES),
                chunk_size=_bounded(document.get("chunk_size"), "chunk_size", 1, 2**31 - 1),
                fields={name: FieldInfo.from_dict(info) for name, info in fields.items()},
                shuffled_on_write=shuffled,
                seed=seed,
                provenance=dict(provenance),
                skipped=None if skipped is None else dict(skipped),
                format_version=version,
                generation=generation,
                growing=growing,
            )
        except ValueError as error:
            if isinstance(error, NotAStoreError):
                raise
            raise NotAStoreError(f"{where} has malformed outcore attributes: {error}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def class_flags(classes: Sequence[str]) -> dict[str, Any]:
    """A class-label array's CF attributes: ``flag_values`` and ``flag_meanings`` (the class names, spaces
    as underscores), which plain zarr and xarray readers show.

    >>> class_flags(["cat", "big dog"])
    {'flag_values': [0, 1], 'flag_meanings': 'cat big_dog'}
    """
    return {"flag_values": list(range(len(classes))), "flag_meanings": " ".join(c.replace(" ", "_") for c in classes)}


def guess_roles(names: Sequence[str], given: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each field's role: ``given`` ones as they are; fields named like labels (`TARGET_NAMES`) are
    targets, fields named like weights (`WEIGHT_NAMES`) sample weights, the first other field the input,
    the rest "other". Every ingest path (arrays, Writer, images) uses this one rule.

    >>> guess_roles(["images", "labels", "weight", "path"], {"path": "metadata"})
    {'images': 'input', 'labels': 'target', 'weight': 'sample_weight', 'path': 'metadata'}
    """
    roles = dict(given or {})
    for name in names:
        if name in roles:
            continue
        if name in TARGET_NAMES:
            roles[name] = "target"
        elif name in WEIGHT_NAMES:
            roles[name] = "sample_weight"
        else:
            roles[name] = "other" if "input" in roles.values() else "input"
    return {name: roles[name] for name in names}


def _bounded(value: Any, name: str, low: int, high: int) -> int:
    _expect(_is_int(value) and low <= value <= high, f"{name} {value!r} is not an integer in {low}..{high}")
    return value


def _choice(value: Any, allowed: tuple[Any, ...], name: str) -> Any:
    _expect(value in allowed and (value is None or isinstance(value, str)), f"{name} {value!r} is not one of {allowed}")
    return value


def _expect(condition: bool, reason: str) -> None:
    if not condition:
        raise ValueError(reason)
