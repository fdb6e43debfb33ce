"""Parquet files and Hugging Face datasets (saved with ``save_to_disk``: Arrow stream files; or as
Parquet shards): a column of pictures, ``{bytes, path}`` structs as ``datasets.Image`` writes them or plain
binary, and label columns, with the class names of ``ClassLabel`` columns from the dataset's features.
A picture given by its path only (``bytes`` null: what ``to_parquet`` writes for images made from files)
is read from that path, as ``datasets`` reads it (`picture_at`).

Read by row group (Parquet) or record batch (Arrow), the columns needed only. Neither can be read at a
row's place, so the pictures are unpacked as they are scanned (`outcore.ingest.records.spill`).
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from ...errors import SourceError
from ...storage.remote import is_object_url
from .locations import file_version, open_stream, read_file, read_range
from .parts import PartScan, scanning
from .recognising import RecordFiles

IMAGE_COLUMNS = ("image", "img", "jpg", "png", "picture")
LABEL_COLUMNS = ("label", "labels")
PATH_READERS = 16  # files read at once for rows that give only a path (an object store's latency hidden)


@dataclass(frozen=True)
class Parquet(RecordFiles):
    """Which column holds the pictures (``image_key``; None: the one named ``image``, ``img``, ... or the
    only column of pictures) and the labels (``label_keys``: field name -> column; None: the ``ClassLabel``
    columns, else a ``label`` or ``labels`` column)."""

    name: ClassVar[str] = "parquet"
    suffixes: ClassVar[tuple[str, ...]] = (".parquet", ".arrow")

    image_key: str | None = None
    label_keys: Mapping[str, str] | None = None

    @classmethod
    def is_folder_of(cls, folder: str) -> bool:
        """Never: a Hugging Face dataset's folder holds its files; a ``DatasetDict``'s (of splits) is refused."""
        if os.path.exists(os.path.join(folder, "dataset_dict.json")):
            splits = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
            raise SourceError(f"{folder} is a Hugging Face DatasetDict of splits {splits}: ingest each split's "
                              f"folder into a store of its own (e.g. {os.path.join(folder, splits[0])})"
                              if splits else f"{folder} is an empty Hugging Face DatasetDict")
        return False

    def scan(self, location: str, storage_options: Mapping[str, Any] | None = None,
             unpack_into: str | None = None) -> PartScan:
        """Every row: its picture (unpacked into ``unpack_into``: a row cannot be read at its place) and
        labels; the rows of a row group (or batch) that cannot be read are damaged."""
        pa = _pyarrow()
        with _Table(location, storage_options) as table, \
                scanning(location, file_version(location, storage_options), unpack_into, False) as scan:
            image, labels = self._columns(table.schema, location)
            scan.classes.update({name: table.class_names[column] for name, column in labels.items()
                                 if column in table.class_names})
            row = 0
            for count, batch, damage in table.batches([image, *labels.values()]):
                if batch is None:
                    for _ in range(count):
                        scan.add(f"row {row}", (-1, 0), {}, damage)
                        row += 1
                    continue
                pictures, paths = batch.column(0), None
                if pa.types.is_struct(pictures.type):
                    if pictures.type.get_field_index("path") >= 0:
                        paths = pictures.field("path").to_pylist()
                    pictures = pictures.field("bytes")
                values = {name: batch.column(1 + i).to_pylist() for i, name in enumerate(labels)}
                for i, (picture, damage) in enumerate(_pictures(pictures.to_pylist(), paths, location,
                                                                storage_options)):
                    what = f"row {row}"
                    if picture is None:
                        scan.add(what, (-1, 0), {}, damage)
                    else:
                        scan.add(what, (-1, len(picture)), {name: column[i] for name, column in values.items()},
                                 picture=picture)
                    row += 1
        return scan

    def unpacked(self, location: str, storage_options: Mapping[str, Any] | None = None) -> bool:
        """Always: a row's picture cannot be read at its place (pages are compressed, rows not indexed)."""
        return True

    def _columns(self, schema: Any, location: str) -> tuple[str, dict[str, str]]:
        pa = _pyarrow()
        names = list(schema.names)

        def holds_pictures(column: str) -> bool:
            kind = schema.field(column).type
            return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or (
                pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0)

        if self.image_key is not None:
            if self.image_key not in names or not holds_pictures(self.image_key):
                raise SourceError(f"{location}: column {self.image_key!r} is not a column of pictures (the columns: "
                                  f"{names})")
            image = self.image_key
        else:
            candidates = [c for c in names if holds_pictures(c)]
            named = [c for c in candidates if c.lower() in IMAGE_COLUMNS]
            if len(named) != 1 and len(candidates) != 1:
                raise SourceError(f"{location}: which column holds the pictures? (columns of bytes: {candidates} "
                                  f"of {names}); name it with image_key=")
            image = named[0] if len(named) == 1 else candidates[0]
        if self.label_keys is not None:
            absent = [c for c in self.label_keys.values() if c not in names]
            if absent:
                raise SourceError(f"{location}: label column(s) {absent} are not among its columns {names}")
            return image, dict(self.label_keys)
        classes = _class_names(schema)
        chosen = [c for c in names if c in classes] or [c for c in names if c in LABEL_COLUMNS]
        return image, {("labels" if len(chosen) == 1 and c == "label" else c): c for c in chosen}


def _pictures(pictures: list[bytes | None], paths: list[str | None] | None, location: str,
              storage_options: Mapping[str, Any] | None) -> list[tuple[bytes | None, str]]:
    """Each row's picture (and why not, where it has none): its bytes, or the file at its path."""
    wanted = [i for i, picture in enumerate(pictures) if picture is None and paths is not None and paths[i]]
    found: dict[int, tuple[bytes | None, str]] = {}
    if wanted:
        with ThreadPoolExecutor(min(PATH_READERS, len(wanted))) as pool:
            found = dict(zip(wanted, pool.map(lambda i: _read_path(paths[i], location, storage_options), wanted),
                             strict=True))
    return [(picture, "") if picture is not None else found.get(i, (None, "its picture is null: no bytes, no path"))
            for i, picture in enumerate(pictures)]


def _read_path(path: str, location: str, storage_options: Mapping[str, Any] | None) -> tuple[bytes | None, str]:
    try:
        return picture_at(path, location, storage_options), ""
    except (OSError, SourceError) as error:
        return None, str(error)


def picture_at(path: str, location: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The file a row names by ``path`` only, as ``datasets`` reads it: a URL or an absolute path as it
    is; a relative one beside the Parquet file ``location`` (in an object store: beside it there), or
    else relative to the working folder. A path found in both places, as two different files, is an
    error (which one the writer meant cannot be told).

    >>> picture_at("cat/1.jpg", "data/train.parquet")  # data/cat/1.jpg, else ./cat/1.jpg  # doctest: +SKIP
    """
    if is_object_url(path) or os.path.isabs(path):
        return _read_named(path, [path], storage_options)
    if is_object_url(location):
        return _read_named(path, [posixpath.join(posixpath.dirname(location), path)], storage_options)
    places = [os.path.join(os.path.dirname(os.path.abspath(location)), path), os.path.abspath(path)]
    existing = list(dict.fromkeys(os.path.realpath(place) for place in places if os.path.isfile(place)))
    if len(existing) > 1:
        raise SourceError(f"its picture's path {path!r} names two files, {places[0]} (beside the Parquet file) and "
                          f"{places[1]} (from the working folder): give absolute paths, or run from elsewhere")
    return _read_named(path, existing or places, storage_options)


def _read_named(path: str, places: Sequence[str], storage_options: Mapping[str, Any] | None) -> bytes:
    try:
        return read_file(places[0], storage_options)
    except (FileNotFoundError, SourceError):
        looked = " or ".join(str(place) for place in dict.fromkeys(places))
        raise SourceError(f"its picture's bytes are null and its path {path!r} is not a file (looked for {looked})") \
            from None


def _class_names(schema: Any) -> dict[str, tuple[str, ...]]:
    """The class names of the ``ClassLabel`` columns, from the features Hugging Face keeps in the schema."""
    metadata = (schema.metadata or {}).get(b"huggingface")
    if not metadata:
        return {}
    try:
        features = json.loads(metadata).get("info", {}).get("features", {})
    except ValueError:
        return {}
    return {name: tuple(feature["names"]) for name, feature in features.items()
            if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and "names" in feature}


class _Table:
    """A Parquet or Arrow stream file, read a row group or a record batch at a time."""

    def __init__(self, location: str, storage_options: Mapping[str, Any] | None) -> None:
        pa = _pyarrow()
        self.location, self.arrow = location, location.endswith(".arrow")
        if self.arrow:  # an Arrow stream, as save_to_disk writes
            self.stream = open_stream(location, storage_options)
            try:
                self.reader = pa.ipc.open_stream(self.stream)
            except (pa.ArrowInvalid, OSError) as error:
                self.stream.close()
                raise SourceError(f"{location} cannot be read as an Arrow stream ({error})") from None
            self.schema = self.reader.schema
        else:
            import pyarrow.parquet as pq

            source = pa.PythonFile(_Seekable(location, storage_options), mode="r") if is_object_url(location) \
                else location
            try:
                self.file = pq.ParquetFile(source, page_checksum_verification=True)  # where pages have them
            except (pa.ArrowInvalid, OSError) as error:
                raise SourceError(f"{location} cannot be read as a Parquet file ({error})") from None
            self.schema = self.file.schema_arrow
        self.class_names = _class_names(self.schema)

    def batches(self, columns: list[str]) -> Iterator[tuple[int, Any, str]]:
        """``(rows, batch of the columns, damage)``: the batch None (and why) where it cannot be read."""
        pa = _pyarrow()
        if self.arrow:
            while True:
                try:
                    batch = self.reader.read_next_batch()
                except StopIteration:
                    return
                except (pa.ArrowInvalid, OSError) as error:
                    yield 1, None, f"the file cannot be read from here on ({error})"
                    return
                yield batch.num_rows, batch.select(columns), ""
            return
        for group in range(self.file.num_row_groups):
            rows = self.file.metadata.row_group(group).num_rows
            try:
                table = self.file.read_row_group(group, columns=columns)
                yield rows, pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], names=columns), ""
            except (pa.ArrowException, OSError) as error:
                yield rows, None, f"row group {group} cannot be read ({error})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        if self.arrow:
            self.stream.close()


class _Seekable(io.RawIOBase):
    """An object read by byte ranges, as a seekable file (what Parquet's reader needs)."""

    def __init__(self, location: str, storage_options: Mapping[str, Any] | None) -> None:
        self.location, self.options = location, storage_options
        self.size, self.position = file_version(location, storage_options)[0], 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = {0: offset, 1: self.position + offset, 2: self.size + offset}[whence]
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        count = max(0, min(len(buffer), self.size - self.position))
        if count:
            buffer[:count] = read_range(self.location, self.position, count, self.options)
            self.position += count
        return count


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise SourceError("reading Parquet and Hugging Face datasets needs pyarrow: pip install 'outcore[parquet]'") \
            from None
    return pyarrow


