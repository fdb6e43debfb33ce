"""WebDataset tar shards: a sample is the run of members sharing a key (``dir/key.jpg``, ``dir/key.cls``,
``dir/key.json``: the key is the name up to the first dot of its last part, as webdataset splits it).

An uncompressed shard is read at the pictures' places (its headers and small members are read, the
pictures skipped); a compressed one (``.tar.gz``) only from its start, so its pictures are unpacked once.
"""

from __future__ import annotations

import gzip
import io
import json
import mmap
import os
import re
import zlib
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar

from ...storage.remote import is_object_url
from .locations import file_version, open_stream, read_exactly
from .parts import PartScan, scanning
from .recognising import RecordFiles

PICTURE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTENSION = "cls"
_BLOCK = 512
SMALL = 2**16  # members read while scanning (labels): smaller than this
_NAME = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


@dataclass(frozen=True)
class WebDataset(RecordFiles):
    """Which member holds the picture (``image_key``: an extension; None: the first of
    `PICTURE_EXTENSIONS`) and the labels (``label_keys``: field name -> an extension whose text is the
    label, or ``json.FIELD``, a field of the sample's ``.json`` member; None: ``{"labels": "cls"}`` where
    samples have a ``.cls`` member).

    >>> WebDataset(label_keys={"labels": "json.label"}).image_key is None
    True
    """

    name: ClassVar[str] = "webdataset"
    suffixes: ClassVar[tuple[str, ...]] = (".tar", ".tar.gz", ".tgz")

    image_key: str | None = None
    label_keys: Mapping[str, str] | None = None

    def scan(self, location: str, storage_options: Mapping[str, Any] | None = None,
             unpack_into: str | None = None) -> PartScan:
        """Every sample of the shard: where its picture lies and its labels; a sample without a picture or
        a label is damaged; a truncated shard ends with a damaged entry. A compressed shard's pictures
        are unpacked into ``unpack_into`` on the way."""
        return scan_tar(location, self, storage_options, unpack_into)

    def unpacked(self, location: str, storage_options: Mapping[str, Any] | None = None) -> bool:
        """Whether the shard's pictures must be unpacked (it is compressed: it cannot be read at a place)."""
        return compressed(location)


def compressed(location: str) -> bool:
    return location.endswith((".gz", ".tgz"))


def scan_tar(location: str, keys: WebDataset, storage_options: Mapping[str, Any] | None = None,
             unpack_into: str | None = None) -> PartScan:
    direct = not compressed(location)
    with scanning(location, file_version(location, storage_options), unpack_into, direct) as scan:
        for key, members, damage in _samples(location, storage_options, keep_pictures=not direct):
            if damage and not members:
                scan.add(key, (-1, 0), {}, damage)
                continue
            try:
                name, member = _picture(members, keys)
                labels = _labels(members, keys)
            except KeyError as error:
                scan.add(key, (-1, 0), {}, str(error.args[0]))
                continue
            scan.add(name, (member[0] if direct else -1, member[1]), labels, damage, picture=member[2])
    return scan


def _picture(members: dict[str, tuple[int, int, bytes | None, str]], keys: WebDataset) -> tuple[str, Any]:
    choices = (keys.image_key,) if keys.image_key else PICTURE_EXTENSIONS
    for extension in choices:
        if extension in members:
            return members[extension][3], members[extension]
    raise KeyError(f"no picture ({', '.join(choices)}) among its members ({', '.join(sorted(members))}); "
                   "name the picture's extension with image_key=")


def _labels(members: dict[str, tuple[int, int, bytes | None, str]], keys: WebDataset) -> dict[str, Any]:
    chosen = keys.label_keys if keys.label_keys is not None else (
        {"labels": LABEL_EXTENSION} if LABEL_EXTENSION in members else {})
    labels = {}
    for name, where in chosen.items():
        extension, _, inner = where.partition(".") if where.startswith("json.") else (where, "", "")
        if extension not in members:
            raise KeyError(f"no {extension!r} member for {name!r} (it has {', '.join(sorted(members))}); "
                           "name the label members with label_keys=")
        if members[extension][2] is None:
            raise KeyError(f"its {extension!r} member holds {members[extension][1]} bytes: too many for a label")
        text = members[extension][2].decode("utf-8", "replace").strip()
        if inner:
            try:
                document = json.loads(text)
                labels[name] = document[inner]
            except (ValueError, KeyError, TypeError):
                raise KeyError(f"its {extension!r} member has no field {inner!r}") from None
        else:
            labels[name] = int(text) if re.fullmatch(r"-?\d+", text) else text
    return labels


def _samples(location: str, storage_options: Mapping[str, Any] | None,
             keep_pictures: bool) -> Iterator[tuple[str, dict[str, tuple[int, int, bytes | None, str]], str]]:
    """``(key, members, damage)`` of each sample: members by extension, as (offset of the data, size, the
    bytes (small members, and pictures when kept), member name); a shard that ends early or has a
    damaged header ends with a damaged entry naming where."""
    seekable = not is_object_url(location) and not compressed(location)

    def wanted(name: str, size: int) -> bool:  # labels and other small members; pictures when kept
        return keep_pictures or (size < SMALL and name.rpartition(".")[2].lower() not in PICTURE_EXTENSIONS)

    key, members, last = None, {}, ""
    with open_stream(location, storage_options) as stream, ExitStack() as opened:
        source = opened.enter_context(gzip.GzipFile(fileobj=stream)) if compressed(location) else \
            opened.enter_context(_mapped(stream)) if seekable else stream
        try:
            for name, offset, size, data in tar_members(source, seekable, wanted):
                found = _NAME.match(name)
                if found is None or found.group(1).rsplit("/", 1)[-1].startswith("__"):
                    continue
                if key is not None and found.group(1) != key:
                    yield key, members, ""
                    members = {}
                key, last = found.group(1), name
                members[found.group(2).lower()] = (offset, size, data, name)
        except (TarDamage, OSError, EOFError, zlib.error) as error:
            yield (key or location), {}, (f"the shard ends inside or after member {last!r} ({error}): it is "
                                          "truncated or damaged there, and any samples after it are lost")
            return
    if key is not None:
        yield key, members, ""


def _mapped(stream: BinaryIO) -> Any:
    """A local file memory-mapped: its headers read and its pictures skipped without a copy or a call into
    the buffered reader each (an empty file cannot be mapped: it is read as it is)."""
    if os.fstat(stream.fileno()).st_size == 0:
        return nullcontext(stream)
    return mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)


class TarDamage(ValueError):
    """A tar file's bytes are not a whole tar archive."""


def tar_members(stream: BinaryIO, seekable: bool,
                wanted: Any) -> Iterator[tuple[str, int, int, bytes | None]]:
    """``(name, offset of the data, size, data)`` of each regular file of a tar stream (ustar, PAX and GNU
    long names), ``data`` read where ``wanted(name, size)``, else skipped (a seek where ``seekable``);
    header checksums checked and the end-of-archive block required (`TarDamage` otherwise).

    Written for speed: Python's tarfile takes ~150 us a member, several times a small picture's decode.
    """
    offset, pending = 0, {}
    while True:
        header = read_exactly(stream, _BLOCK)
        if len(header) < _BLOCK:
            raise TarDamage(f"no end-of-archive block: the file ends at byte {offset + len(header)}")
        if header == _ZEROS:
            return
        if _checksum(header) != _octal(header[148:156]):
            raise TarDamage(f"the header at byte {offset} is damaged (its checksum is wrong)")
        name = header[:100].split(b"\0", 1)[0]
        if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
            name = header[345:500].split(b"\0", 1)[0] + b"/" + name
        size, kind = _octal(header[124:136]), header[156:157]
        offset += _BLOCK
        if kind in (b"x", b"g", b"L"):
            data = read_exactly(stream, size)
            if len(data) < size:
                raise TarDamage(f"the file ends inside the extended header at byte {offset}")
            _skip(stream, seekable, (-size) % _BLOCK)
            offset += size + (-size) % _BLOCK
            if kind == b"x" and (b" path=" in data or b" size=" in data):  # most hold only times
                pending.update(_pax(data))
            elif kind == b"L":
                pending["path"] = data.split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        path = pending.pop("path", None) or name.decode("utf-8", "replace")
        size = int(pending.pop("size", size))
        pending.clear()
        regular = kind in (b"0", b"\0", b"7")
        data = None
        if regular and wanted(path, size):
            data = read_exactly(stream, size)
            if len(data) < size:
                raise TarDamage(f"the file ends inside member {path!r} ({len(data)} of its {size} bytes)")
            _skip(stream, seekable, (-size) % _BLOCK)
        else:
            _skip(stream, seekable, size + (-size) % _BLOCK)
        if regular:
            yield path, offset, size, data
        offset += size + (-size) % _BLOCK


_ZEROS = bytes(_BLOCK)


def _checksum(header: bytes) -> int:
    return sum(header[:148]) + 8 * 32 + sum(header[156:])


def _octal(field: bytes) -> int:
    if field[:1] == b"\x80":  # base-256, for sizes past 8 GiB
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.rstrip(b"\0 ") or b"0", 8)
    except ValueError:
        raise TarDamage(f"a header holds {field!r} where a number should be") from None


def _pax(data: bytes) -> dict[str, str]:
    records, position = {}, 0
    while position < len(data):
        length_text = data[position:].partition(b" ")[0]
        if not length_text.isdigit():
            break
        record = data[position : position + int(length_text)]
        field, _, value = record[len(length_text) + 1 :].rstrip(b"\n").partition(b"=")
        records[field.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        position += int(length_text)
    return records


def _skip(stream: BinaryIO, seekable: bool, count: int) -> None:
    if not count:
        return
    if seekable:
        stream.seek(count, io.SEEK_CUR)
        return
    while count:
        piece = stream.read(min(count, 2**20))
        if not piece:
            raise TarDamage("the file ends inside a member")
        count -= len(piece)
