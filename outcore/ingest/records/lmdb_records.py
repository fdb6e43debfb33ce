"""LMDB environments: values that are pictures' files (labels from the keys), Caffe ``Datum`` records
(an encoded picture, or raw CHW pixels, and a label), or values a function of the user's turns into a
picture and labels. Which of the first two a value is, is seen from its bytes (`value_kind`). outcore
never unpickles a value: a user whose values are pickles passes their own function, their choice.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ...errors import OptionError, SourceError
from ...storage.remote import is_object_url, redact
from .locations import file_version
from .parts import PartScan, scanning
from .reader import lmdb_environment
from .recognising import RecordFiles, Source
from .wire import LENGTH, VARINT, WireError, fields, signed64

VALUES = ("auto", "bytes", "datum")
CHANNEL_ORDERS = ("bgr", "rgb")
RAW_BGR_NOTE = ("raw Datum pixels were read as BGR, the order Caffe's tools write, and stored as RGB; if yours "
                "were written in RGB order, ingest again with datum_channels='rgb' (pass datum_channels='bgr' "
                "to say they are BGR, and this warning goes)")
DATUM_NOTE = "its values were recognised as Caffe Datums and read as such: their pictures and labels"
PICTURE_STARTS = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*", b"P5\n",
                  b"P6\n", b"P5 ", b"P6 ")
Decoder = Callable[[bytes, bytes], tuple[Any, Mapping[str, Any]]]


@dataclass(frozen=True)
class LMDB(RecordFiles):
    """How to read an LMDB environment's values.

    ``values``: ``"auto"`` (each value as its bytes show: a picture's file or a Caffe Datum, said in a
    warning when Datums), ``"bytes"`` (each value is a picture's file; labels from ``label_pattern``, a
    regular expression whose named groups, searched in the key, are the label fields, or ``label_table``, a
    CSV or DataFrame with a ``key`` column and label columns), ``"datum"`` (Caffe's ``Datum``, as its
    ``convert_imageset`` writes them: ``data`` holds an encoded picture when ``encoded``, else raw pixels,
    channels first, in ``datum_channels`` order (None: BGR as Caffe's tools write them; ``label`` is the
    label) or a function ``(key, value) -> (picture, labels)``, the picture as a file's bytes or an (H, W,
    C) ``uint8`` array, the labels a dict.

    >>> LMDB(label_pattern=r"^(?P<labels>[^/]+)/")
    LMDB(values='auto', label_pattern='^(?P<labels>[^/]+)/', label_table=None, datum_channels=None)
    """

    name: ClassVar[str] = "lmdb"
    suffixes: ClassVar[tuple[str, ...]] = (".mdb", ".lmdb")

    values: str | Decoder = "auto"
    label_pattern: str | None = None
    label_table: Any = None
    datum_channels: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.values) and self.values not in VALUES:
            raise OptionError(f"LMDB values={self.values!r} is not one of {VALUES} or a function (key, value) -> "
                              "(picture, labels)")
        if self.datum_channels is not None and self.datum_channels not in CHANNEL_ORDERS:
            raise OptionError(f"datum_channels={self.datum_channels!r} is not one of {CHANNEL_ORDERS}")
        if self.label_pattern is not None:
            try:
                re.compile(self.label_pattern)
            except re.error as error:
                raise OptionError(f"label_pattern {self.label_pattern!r} is not a regular expression ({error})") \
                    from None

    @classmethod
    def is_folder_of(cls, folder: str) -> bool:
        """Whether ``folder`` is an LMDB environment (it holds ``data.mdb``)."""
        return os.path.exists(os.path.join(folder, "data.mdb"))

    @classmethod
    def files(cls, source: Source, storage_options: Mapping[str, Any] | None = None) -> list[str]:
        """The environments named: each is one source, read from this machine's disk (it is memory-mapped)."""
        items = [source] if isinstance(source, str | os.PathLike) else list(source)
        if any(is_object_url(os.fspath(item)) for item in items):
            raise SourceError(f"{redact(str(source))}: an LMDB environment is read from this machine's disk only "
                              "(it is memory-mapped); copy it here first")
        return [os.fspath(item) for item in items]

    @property
    def direct(self) -> bool:
        return not callable(self.values)

    def picture_of(self) -> Callable[[bytes, bytes], bytes] | None:
        """What turns a value into the picture's bytes when it is read (None: the value is the picture)."""
        if self.values == "bytes":
            return None
        return functools.partial(datum_picture if self.values == "datum" else value_picture,
                                 channels=self.datum_channels or "bgr")

    def scan(self, location: str, storage_options: Mapping[str, Any] | None = None,
             unpack_into: str | None = None) -> PartScan:
        """Every key of the environment, in key order, with its picture's size and labels (the pictures a
        function of the user's makes unpacked into ``unpack_into``)."""
        del storage_options  # LMDB is read on this machine only
        table = _label_table(self.label_table) if self.label_table is not None else None
        pattern = re.compile(self.label_pattern) if self.label_pattern is not None else None
        with scanning(location, _version(location), unpack_into, self.direct,
                      keys=[] if self.direct else None) as scan:
            for key, value in _items(location):
                what = f"key {key!r}"
                kind = value_kind(value) if self.values == "auto" else self.values
                if kind not in ("bytes", "datum") and not callable(kind) and not len(scan):
                    raise SourceError(f"{location}: its values are neither pictures' files nor Caffe Datums (key "
                                      f"{key!r} holds {kind}); outcore never unpickles: read them in Python, with a "
                                      "function of yours, read(key, value) -> (picture, labels), as the format's "
                                      "values: outcore.LMDB(values=read)")
                try:
                    picture, labels = self._picture_and_labels(kind, key, value, pattern, table)
                except (WireError, KeyError, ValueError) as error:
                    scan.add(what, (-1, 0), {}, _reason(error), key)
                    continue
                scan.add(what, (0 if self.direct else -1, len(picture)), labels, "", key, picture=picture)
                if kind == "datum" and self.values == "auto":
                    scan.notes.add(DATUM_NOTE)
                if kind == "datum" and self.datum_channels is None and picture.startswith(b"P6"):
                    scan.notes.add(RAW_BGR_NOTE)
            if RAW_BGR_NOTE in scan.notes:
                scan.notes.discard(DATUM_NOTE)  # one line: that one says they are Datums too
        return scan

    def unpacked(self, location: str, storage_options: Mapping[str, Any] | None = None) -> bool:
        """Whether the values' pictures must be unpacked: those a function of the user's makes."""
        return not self.direct

    def _picture_and_labels(self, kind: Any, key: bytes, value: bytes, pattern: re.Pattern[str] | None,
                            table: dict[str, dict[str, Any]] | None) -> tuple[bytes, dict[str, Any]]:
        if callable(kind):
            picture, labels = kind(key, value)
            return as_picture(picture), dict(labels)
        if kind == "datum":
            datum = parse_datum(value)
            return datum.picture(self.datum_channels or "bgr"), {} if datum.label is None else {"labels": datum.label}
        if kind != "bytes":
            raise ValueError(f"neither a picture's file nor a Caffe Datum: {kind}")
        text = key.decode("utf-8", "replace")
        labels: dict[str, Any] = {}
        if pattern is not None:
            found = pattern.search(text)
            if found is None or not found.groupdict():
                raise KeyError(f"the key does not match label_pattern {pattern.pattern!r}")
            labels.update(found.groupdict())
        if table is not None:
            if text not in table:
                raise KeyError("the key is not in label_table")
            labels.update(table[text])
        return value, labels


def _version(location: str) -> tuple[int, int]:
    data = os.path.join(location, "data.mdb") if os.path.isdir(location) else location
    return file_version(data)


def _items(location: str) -> Iterator[tuple[bytes, bytes]]:
    with lmdb_environment(location).begin(buffers=False) as transaction:
        yield from transaction.cursor()


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return str(error.args[0])
    return f"not a Caffe Datum ({error})" if isinstance(error, WireError) else str(error)


def _label_table(table: Any) -> dict[str, dict[str, Any]]:
    import pandas as pd

    frame = table if isinstance(table, pd.DataFrame) else pd.read_csv(table, dtype={"key": str})
    if "key" not in frame.columns:
        raise SourceError(f"label_table has no 'key' column (it has {list(frame.columns)})")
    columns = [c for c in frame.columns if c != "key"]
    return {str(row["key"]): {c: row[c].item() if hasattr(row[c], "item") else row[c] for c in columns}
            for _, row in frame.iterrows()}


class Datum(NamedTuple):
    """What a Caffe ``Datum`` holds (caffe.proto's fields 1-7)."""

    channels: int
    height: int
    width: int
    data: bytes
    label: int | None
    encoded: bool

    def picture(self, channels: str = "bgr") -> bytes:
        """The picture as a file's bytes: its own encoded file, or its raw pixels as a PPM/PGM file (exact
        pixels, no compression), turned to RGB when stored as BGR."""
        if self.encoded:
            return self.data
        depth, height, width = self.channels, self.height, self.width
        if depth * height * width != len(self.data) or depth not in (1, 3):
            raise ValueError(f"its {len(self.data)} bytes of pixels are not {depth} x {height} x {width} "
                             "(1 or 3 channels)")
        pixels = np.frombuffer(self.data, np.uint8).reshape(depth, height, width).transpose(1, 2, 0)
        return as_picture(pixels[..., ::-1] if channels == "bgr" and depth == 3 else pixels)


def parse_datum(value: bytes) -> Datum:
    """A Datum's fields; one with no picture data (``float_data`` only, or nothing) is a `ValueError`."""
    numbers, data, label, floats = {1: 0, 2: 0, 3: 0, 7: 0}, b"", None, False
    for number, kind, found in fields(value):
        if number in numbers and kind == VARINT:
            numbers[number] = found
        elif number == 4 and kind == LENGTH:
            data = value[found[0] : found[0] + found[1]]
        elif number == 5 and kind == VARINT:
            label = signed64(found)
        elif number == 6:
            floats = True
    if not data:
        raise ValueError("its float_data cannot be stored as a picture" if floats else "it holds no picture data")
    return Datum(numbers[1], numbers[2], numbers[3], data, label, bool(numbers[7]))


def datum_picture(key: bytes, value: bytes, channels: str = "bgr") -> bytes:
    """A stored Datum's picture as a file's bytes (`Datum.picture`): what the reader reads."""
    return parse_datum(value).picture(channels)


def value_picture(key: bytes, value: bytes, channels: str = "bgr") -> bytes:
    """A value's picture as a file's bytes, whether it is a picture's file or a Datum (`value_kind`)."""
    return value if is_picture_file(value) else datum_picture(key, value, channels)


def is_picture_file(value: bytes) -> bool:
    """Whether ``value`` starts as a JPEG, PNG, GIF, TIFF, BMP, WebP, PGM or PPM file does."""
    return (value.startswith(PICTURE_STARTS) or (value[:4] == b"RIFF" and value[8:12] == b"WEBP")
            or (value[:2] == b"BM" and value[6:10] == bytes(4)))


def value_kind(value: bytes) -> str:
    """``"bytes"`` for a picture's file, ``"datum"`` for a Caffe Datum holding a picture, else what the
    value looks like, in words (a pickle, text, ...), for an error to name.

    >>> value_kind(b"\\xff\\xd8\\xff\\xe0...")
    'bytes'
    >>> value_kind(b"\\x80\\x04\\x95...")
    'a Python pickle (protocol 4)'
    """
    if is_picture_file(value):
        return "bytes"
    try:
        datum = parse_datum(value)
    except (WireError, ValueError) as error:
        return _looks_like(value, error)
    if datum.encoded or datum.channels * datum.height * datum.width == len(datum.data):
        return "datum"
    return f"a Datum whose {len(datum.data)} bytes of data are neither an encoded picture nor its pixels"


def _looks_like(value: bytes, error: Exception) -> str:
    if len(value) > 1 and value[0] == 0x80 and 2 <= value[1] <= 5:
        return f"a Python pickle (protocol {value[1]})"
    starts = {b"\x93NUMPY": "a NumPy .npy array", b"\x1f\x8b": "gzip-compressed bytes",
              b"\x28\xb5\x2f\xfd": "zstd-compressed bytes", b"PK\x03\x04": "a zip file"}
    named = next((name for start, name in starts.items() if value.startswith(start)), None)
    if named:
        return named
    try:
        text = value[:40].decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and text.isprintable():
        return f"text ({text!r}{'...' if len(value) > 40 else ''})"
    if isinstance(error, ValueError) and not isinstance(error, WireError):
        return f"a protocol buffer message that is not a Datum with a picture ({error})"
    return f"{len(value)} bytes starting {value[:8].hex(' ')}"


def as_picture(picture: Any) -> bytes:
    """A picture as a file's bytes: bytes as they are; an (H, W) or (H, W, 1 or 3) ``uint8`` array as a
    PGM/PPM file (what the pixels are, exactly)."""
    if isinstance(picture, bytes | bytearray | memoryview):
        return bytes(picture)
    pixels = np.asarray(picture)
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3)):
        raise ValueError(f"a picture of shape {pixels.shape} and dtype {pixels.dtype} is not (H, W, 1 or 3) uint8 "
                         "pixels or a file's bytes")
    depth = 1 if pixels.ndim == 2 else pixels.shape[2]
    header = f"{'P5' if depth == 1 else 'P6'}\n{pixels.shape[1]} {pixels.shape[0]}\n255\n".encode()
    return header + np.ascontiguousarray(pixels).tobytes()
