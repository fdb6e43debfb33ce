"""TFRecord files of ``tf.train.Example`` records, read without TensorFlow: the framing (a length, the
masked CRC-32C of the length, the data, its masked CRC-32C) and the Example message are simple.

An uncompressed file is read at the pictures' places; a GZIP or ZLIB file only from its start, so its
pictures are unpacked once into the ingest's scratch folder (`outcore.ingest.records.unpack`).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

import crc32c
import numpy as np

from ...errors import OptionError, SourceError
from ...storage.remote import redact
from .locations import file_version, list_files, open_stream, pieces_stream, read_exactly, read_range
from .parts import PartScan, scanning
from .recognising import RecordFiles, Source
from .wire import (
    FIXED32,
    LENGTH,
    VARINT,
    WireError,
    as_float,
    fields,
    packed_floats,
    packed_varints,
    signed64,
)

COMPRESSIONS = ("", "GZIP", "ZLIB")
IMAGE_KEY = "image/encoded"  # the feature names of ImageNet's TFRecords (and TensorFlow's models)
LABEL_KEY = "image/class/label"
CLASS_KEY = "image/class/text"
_MASK_DELTA = 0xA282EAD8
_GZIP_MAGIC = b"\x1f\x8b"
CLASS_TEXT = "\x00class text"  # the first label's class name, kept apart from the label fields
INSTANCES = "\x00instances "  # a record's per-instance lists (boxes, their labels), kept apart from the labels
INSTANCE_TEXT = "\x00instance texts"  # each instance's class name
PICTURE_SIZE = "\x00picture size"  # the picture's annotated (height, width)
DETECTION_MASKS = "image/object/mask"
MASKS_NOTE = (f"the records hold instance masks ({DETECTION_MASKS}), which outcore does not read from TFRecords: "
              "the store gets the boxes and labels without them (COCO JSON or mask PNGs with mask_columns= bring masks)")
DETECTION_BOXES = ("image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax", "image/object/bbox/ymax")


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's checksum of ``data``: CRC-32C, rotated right by 15 bits, plus a constant.

    >>> hex(masked_crc(b""))
    '0xa282ead8'
    """
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@dataclass(frozen=True)
class TFRecord(RecordFiles):
    """Which features hold the picture (``image_key``), the labels (``label_keys``: field name -> feature;
    None: ``{"labels": "image/class/label"}`` where the records have it) and the name of the first label's
    class (``class_key``, a text feature, when the records have it); the files' ``compression`` (None:
    GZIP when a file starts as GZIP does, else none; or ``""``, ``"GZIP"``, ``"ZLIB"``).

    Boxes: ``box_keys`` name the four float lists of their edges (x min, y min, x max, y max, as fractions of the
    picture's width and height, whose features ``size_keys`` name), ``instance_keys`` more lists of one value per
    box (field name -> feature), ``instance_class_key`` each box's class name; they are stored as ragged fields
    (``boxes`` in pixels). `TFRecord.object_detection` names those of TensorFlow's object detection records.

    >>> TFRecord(label_keys={"labels": "label"}).image_key
    'image/encoded'
    """

    name: ClassVar[str] = "tfrecord"
    suffixes: ClassVar[tuple[str, ...]] = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz")

    image_key: str = IMAGE_KEY
    label_keys: Mapping[str, str] | None = None
    class_key: str | None = CLASS_KEY
    compression: str | None = None
    box_keys: tuple[str, str, str, str] | None = None
    instance_keys: Mapping[str, str] | None = None
    instance_class_key: str | None = None
    size_keys: tuple[str, str] = ("image/height", "image/width")

    @classmethod
    def object_detection(cls, compression: str | None = None) -> TFRecord:
        """The records of TensorFlow's object detection API: the picture, its ``image/height`` and
        ``image/width``, and per box ``image/object/bbox/{xmin,ymin,xmax,ymax}`` (fractions),
        ``image/object/class/label`` (stored as ``labels``) and ``image/object/class/text`` (the class names).

        >>> TFRecord.object_detection().instance_keys
        {'labels': 'image/object/class/label'}
        """
        return cls(label_keys={}, class_key=None, compression=compression, box_keys=DETECTION_BOXES,
                   instance_keys={"labels": "image/object/class/label"},
                   instance_class_key="image/object/class/text")

    @classmethod
    def is_file_of(cls, location: str, storage_options: Mapping[str, Any] | None = None) -> bool:
        """Whether the file starts as an uncompressed TFRecord file does: a length and its checksum."""
        try:
            header = read_range(location, 0, 12, storage_options)
        except (OSError, SourceError):
            return False
        return masked_crc(header[:8]) == int.from_bytes(header[8:], "little")

    @classmethod
    def files(cls, source: Source, storage_options: Mapping[str, Any] | None = None) -> list[str]:
        """The files with a TFRecord suffix, else those that start as one does (ImageNet's
        ``train-00000-of-01024`` have no suffix)."""
        try:
            return list_files(source, cls.suffixes, storage_options)
        except SourceError:
            pass
        candidates = list_files(source, ("",), storage_options)
        with ThreadPoolExecutor(16) as pool:  # a request each, from an object store
            found = [location for location, ok in zip(candidates, pool.map(
                lambda location: cls.is_file_of(location, storage_options), candidates), strict=True) if ok]
        if not found:
            raise SourceError(f"no TFRecord files found at {redact(str(source))}")
        return found

    def __post_init__(self) -> None:
        if self.compression is not None and self.compression.upper() not in COMPRESSIONS:
            raise OptionError(f"compression={self.compression!r} is not one of {COMPRESSIONS}")

    def scan(self, location: str, storage_options: Mapping[str, Any] | None = None,
             unpack_into: str | None = None) -> PartScan:
        """Every record of the file: where its picture lies and its labels; a damaged record is recorded
        as such (a bad checksum, a record that is not an Example, a missing feature); a damaged length
        ends the file's records, as no record after it can be found. A compressed file's pictures are
        unpacked into ``unpack_into`` on the way."""
        compression = self._compression(location, storage_options)
        with scanning(location, file_version(location, storage_options), unpack_into, not compression) as scan, \
                _records(location, compression, storage_options) as records:
            for index, (offset, data, damage) in enumerate(records):
                what = f"record {index}"
                if data is None:
                    scan.add(what, (-1, 0), {}, damage)
                    continue
                try:
                    features = example_features(data, self._wanted)
                    (start, length), labels = self._picture_and_labels(features, data)
                except (WireError, KeyError) as error:
                    scan.add(what, (-1, 0), {}, damage or _reason(error))
                    continue
                if self.box_keys and DETECTION_MASKS in features:
                    scan.notes.add(MASKS_NOTE)
                scan.add(what, (offset + start if not compression else -1, length), labels, damage,
                         picture=data[start : start + length] if compression else None)
        return scan

    def unpacked(self, location: str, storage_options: Mapping[str, Any] | None = None) -> bool:
        """Whether the file's pictures must be unpacked (it is compressed: it cannot be read at a place)."""
        return bool(self._compression(location, storage_options))

    @property
    def _wanted(self) -> frozenset[str]:
        labels = self.label_keys.values() if self.label_keys is not None else (LABEL_KEY,)
        boxes = (*self.box_keys, *self.size_keys, *(self.instance_keys or {}).values(),
                 *((self.instance_class_key,) if self.instance_class_key else ())) if self.box_keys else ()
        return frozenset((self.image_key, *labels, *((self.class_key,) if self.class_key else ()), *boxes))

    def _compression(self, location: str, storage_options: Mapping[str, Any] | None) -> str:
        if self.compression is not None:
            return self.compression.upper()
        try:
            return "GZIP" if read_range(location, 0, 2, storage_options) == _GZIP_MAGIC else ""
        except OSError:  # shorter than 2 bytes: not GZIP (and its scan says what it is)
            return ""

    def _picture_and_labels(self, features: dict[str, tuple[str, list[Any]]],
                            data: bytes) -> tuple[tuple[int, int], dict[str, Any]]:
        kind, values = features.get(self.image_key, ("", []))
        if kind != "bytes" or len(values) != 1:
            raise KeyError(f"feature {self.image_key!r} is not one picture's bytes (it has: {sorted(features)}); "
                           "name the picture's feature with image_key=")
        chosen = self.label_keys if self.label_keys is not None else (
            {"labels": LABEL_KEY} if LABEL_KEY in features else {})
        labels = {}
        for name, feature in chosen.items():
            kind, found = features.get(feature, ("", []))
            if len(found) != 1:
                raise KeyError(f"feature {feature!r} (for {name!r}) is not one value in this record (it has: "
                               f"{sorted(features)}); name the label features with label_keys=")
            labels[name] = _text(data, found[0]) if kind == "bytes" else found[0]
        if self.class_key and chosen and self.class_key in features:
            kind, found = features[self.class_key]
            if kind == "bytes" and len(found) == 1:
                labels[CLASS_TEXT] = _text(data, found[0])
        if self.box_keys:
            labels.update(self._instances(features, data))
        return values[0], labels

    def _instances(self, features: dict[str, tuple[str, list[Any]]], data: bytes) -> dict[str, Any]:
        """A record's boxes in pixels (rows, 4), its other per-box lists, their class names and its picture's
        size; a `KeyError` saying which feature is missing or of another length."""
        size = []
        for feature in self.size_keys:
            kind, found = features.get(feature, ("", []))
            if kind != "int64" or len(found) != 1:
                raise KeyError(f"feature {feature!r} is not the picture's size in this record (it has: "
                               f"{sorted(features)}); name its height and width features with size_keys=")
            size.append(int(found[0]))
        absent = [feature for feature in self.box_keys if features.get(feature, ("", []))[0] != "float"]
        if absent:  # a record without boxes holds the lists, empty: one without them is not such a record
            raise KeyError(f"the box features {absent} are not float lists in this record (it has: {sorted(features)}); "
                           "name the boxes' features with box_keys=")
        edges = [features[feature][1] for feature in self.box_keys]
        if len({len(edge) for edge in edges}) != 1:
            raise KeyError(f"the box features {list(self.box_keys)} hold {[len(e) for e in edges]} values: one per box")
        height, width = size
        boxes = np.array(edges, np.float64).reshape(4, -1).T * (width, height, width, height)
        found = {INSTANCES + "boxes": boxes.astype(np.float32), PICTURE_SIZE: tuple(size)}
        for name, feature in (self.instance_keys or {}).items():
            kind, values = features.get(feature, ("", []))
            if len(values) != len(boxes) or kind not in ("int64", "float"):
                raise KeyError(f"feature {feature!r} (for {name!r}) holds {len(values)} numbers, not one per box "
                               f"({len(boxes)})")
            found[INSTANCES + name] = np.array(values, np.int64 if kind == "int64" else np.float32)
        if self.instance_class_key and self.instance_class_key in features:
            kind, texts = features[self.instance_class_key]
            if kind == "bytes" and len(texts) == len(boxes):
                found[INSTANCE_TEXT] = [_text(data, text) for text in texts]
        return found


def _text(data: bytes, span: tuple[int, int]) -> str:
    return bytes(data[span[0] : span[0] + span[1]]).decode("utf-8", "replace")


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return str(error.args[0])
    return f"not a tf.train.Example ({error})"


def example_features(data: bytes | memoryview,
                     wanted: frozenset[str] | None = None) -> dict[str, tuple[str, list[Any]]]:
    """A ``tf.train.Example``'s features: name -> ``("bytes", [(offset, length), ...])``,
    ``("int64", [...])`` or ``("float", [...])``; with ``wanted``, the others are named only (``("", [])``)."""
    found: dict[str, tuple[str, list[Any]]] = {}
    for number, kind, value in fields(data):
        if number != 1 or kind != LENGTH:
            continue
        start, length = value
        for entry_number, entry_kind, entry in fields(data, start, start + length):
            if entry_number != 1 or entry_kind != LENGTH:
                continue
            name, feature = "", None
            for part_number, part_kind, part in fields(data, entry[0], entry[0] + entry[1]):
                if part_number == 1 and part_kind == LENGTH:
                    name = bytes(data[part[0] : part[0] + part[1]]).decode("utf-8")
                elif part_number == 2 and part_kind == LENGTH:
                    feature = part
            found[name] = _feature(data, feature) if feature is not None and (wanted is None or name in wanted) \
                else ("", [])
    return found


def _feature(data: bytes | memoryview, span: tuple[int, int]) -> tuple[str, list[Any]]:
    for number, kind, value in fields(data, span[0], span[0] + span[1]):
        if kind != LENGTH:
            raise WireError("a feature is not a list")
        values: list[Any] = []
        for item_number, item_kind, item in fields(data, value[0], value[0] + value[1]):
            if item_number != 1:
                continue
            if number == 1 and item_kind == LENGTH:
                values.append(item)
            elif number == 2:
                values += packed_floats(data, *item) if item_kind == LENGTH else [as_float(item)] \
                    if item_kind == FIXED32 else []
            elif number == 3:
                values += packed_varints(data, *item) if item_kind == LENGTH else [signed64(item)] \
                    if item_kind == VARINT else []
        return {1: "bytes", 2: "float", 3: "int64"}.get(number, ""), values
    return "", []


class _records:
    """``(offset of the data in the file, data, damage)`` of each record, in order (``data`` None when the
    record cannot be read at all); a context manager closing the file."""

    def __init__(self, location: str, compression: str, storage_options: Mapping[str, Any] | None) -> None:
        self.stream: BinaryIO = open_stream(location, storage_options)
        self.compression = compression

    def __enter__(self) -> Iterator[tuple[int, bytes | None, str]]:
        return read_records(_decompressed(self.stream, self.compression))

    def __exit__(self, *_: object) -> None:
        self.stream.close()


def _decompressed(stream: BinaryIO, compression: str) -> BinaryIO:
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]
    if compression == "ZLIB":
        return pieces_stream(_inflated(stream), buffer_size=2**20)
    return stream


def _inflated(stream: BinaryIO) -> Iterator[bytes]:
    """The pieces of a ZLIB stream, inflated."""
    inflate = zlib.decompressobj()
    while piece := stream.read(2**20):
        yield inflate.decompress(piece)
    yield inflate.flush()


def read_records(stream: BinaryIO) -> Iterator[tuple[int, bytes | None, str]]:
    """The records of a TFRecord stream (see `_records`), checksums checked."""
    offset, index = 0, 0
    while True:
        header = read_exactly(stream, 12)
        if not header:
            return
        if len(header) < 12:
            yield offset, None, f"the file ends inside record {index}'s header (a truncated file)"
            return
        length, length_crc = struct.unpack("<QI", header)
        if masked_crc(header[:8]) != length_crc:
            yield offset, None, ("its length's checksum is wrong: the file is damaged from here on, and the "
                                 "records after it cannot be found")
            return
        data = read_exactly(stream, length + 4)
        if len(data) < length + 4:
            yield offset, None, f"the file ends {length + 4 - len(data)} bytes before this record does (truncated)"
            return
        damage = "" if masked_crc(memoryview(data)[:length]) == struct.unpack("<I", data[length:])[0] else \
            "its checksum is wrong (damaged bytes)"
        yield offset + 12, data[:length], damage
        offset += 12 + length + 4
        index += 1

