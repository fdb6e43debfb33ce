"""Record sources: the files other loaders made people write, ingested as they are (no unpacking into
millions of files): TFRecord (`TFRecord`), WebDataset tar shards (`WebDataset`), LMDB environments
(`LMDB`), Parquet files and Hugging Face datasets (`Parquet`), on this machine or in an object store.

`recognise` tells which a source is from what it holds; `outcore.ingest.record_table` scans it into the
table an image ingest writes from (`outcore.ingest.from_records.ingest_records`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ...errors import OptionError, SourceError
from ...imaging import IMAGE_EXTENSIONS
from ...storage.remote import is_object_url, redact
from .lmdb_records import LMDB
from .locations import expand_braces, list_files
from .parquet import Parquet
from .parts import PartScan
from .recognising import RecordFiles, Source
from .tar import WebDataset
from .tfrecord import TFRecord


class RecordFormat(Protocol):
    """What a record format does: say whether a file's pictures must be unpacked (it cannot be read at a
    place), scan a file into its records (unpacking its pictures into a folder on the way where it must),
    and say what turns a stored value into a picture."""

    def unpacked(self, location: str, storage_options: Mapping[str, Any] | None = None) -> bool: ...

    def scan(self, location: str, storage_options: Mapping[str, Any] | None = None,
             unpack_into: str | None = None) -> PartScan: ...

    def picture_of(self) -> Callable[[bytes, bytes], bytes] | None: ...


FORMATS: dict[str, type[RecordFiles]] = {kind.name: kind for kind in (TFRecord, WebDataset, LMDB, Parquet)}
SUFFIXES = tuple(suffix for kind in FORMATS.values() for suffix in kind.suffixes)  # of every format's files


def parse_format(format: Any) -> Any:
    """A format object from a name (``"tfrecord"``, ...) or as given; None stays None (recognised later)."""
    if format is None or isinstance(format, tuple(FORMATS.values())):
        return format
    if isinstance(format, str) and format.lower() in FORMATS:
        return FORMATS[format.lower()]()
    raise OptionError(f"format={format!r} is not one of {sorted(FORMATS)} or a format object "
                      "(outcore.TFRecord(...), outcore.WebDataset(...), outcore.LMDB(...), outcore.Parquet(...))")


def name_of(format: Any) -> str:
    return format.name


def recognise(source: Source, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """Which record format ``source`` holds (a name of `FORMATS`), or None when it holds none (an image
    folder, a CSV). A folder of several formats is an error naming them.

    >>> recognise("imagenet/train-{00000..01023}-of-01024")  # doctest: +SKIP
    'tfrecord'
    """
    items = [source] if isinstance(source, str | os.PathLike) else list(source)
    names = [name for item in items for name in expand_braces(os.fspath(item))]
    kinds = {kind for name in names for kind in [_kind_of(name, storage_options)] if kind}
    if len(kinds) > 1:
        raise SourceError(f"{redact(str(source))} holds {' and '.join(sorted(kinds))} files: ingest each into a "
                          "store of its own, or name the format with format=")
    return kinds.pop() if kinds else None


def _kind_of(name: str, storage_options: Mapping[str, Any] | None) -> str | None:
    if not is_object_url(name):
        if os.path.isdir(name):
            folder_of = [kind.name for kind in FORMATS.values() if kind.is_folder_of(name)]
            if folder_of:
                return folder_of[0]
            files = [prefix + f for folder, _, found in os.walk(name) for prefix in [os.path.join(folder, "")]
                     for f in found if not f.startswith(".")]  # joined by concatenation: a call a file less
        else:
            files = sorted(glob.glob(name)) if glob.has_magic(name) else [name] if os.path.isfile(name) else []
    else:
        files = [name] if _suffix_kind(name) else _listed(name, storage_options)
    kinds = {_suffix_kind(file) for file in files if file.lower().endswith(SUFFIXES)}  # one suffix test a file
    if not kinds and is_object_url(name) and not files:
        files = _listed(name, storage_options, ("",))
    if not kinds and files:  # a file without a known suffix (ImageNet's TFRecord files): its first bytes
        kinds = {kind.name for kind in FORMATS.values() if kind.is_file_of(files[0], storage_options)}
    if len(kinds) > 1:
        raise SourceError(f"{redact(name)} holds {' and '.join(sorted(kinds))} files: ingest each into a store of "
                          "its own, or name the format with format=")
    pictures = [file for file in files if file.lower().endswith(IMAGE_EXTENSIONS)] if kinds else []
    if pictures:
        raise SourceError(f"{redact(name)} holds both image files (e.g. {redact(pictures[0])}) and {kinds.pop()} "
                          "files: name the format with format= to ingest the records, or move the record files out "
                          "of the image folder")
    return kinds.pop() if kinds else None


def _listed(url: str, storage_options: Mapping[str, Any] | None, suffixes: Sequence[str] = ()) -> list[str]:
    suffixes = tuple(suffixes) or SUFFIXES
    try:
        return list_files(url, suffixes, storage_options)
    except SourceError:
        return []


def _suffix_kind(name: str) -> str | None:
    lowered = name.lower()
    return next((kind.name for kind in FORMATS.values() if lowered.endswith(kind.suffixes)), None)


def record_files(format: Any, source: Source, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The files of ``source`` that ``format`` reads (an LMDB environment is one)."""
    return format.files(source, storage_options)


__all__ = ["FORMATS", "LMDB", "Parquet", "RecordFormat", "TFRecord", "WebDataset", "name_of", "parse_format", "recognise",
           "record_files"]
