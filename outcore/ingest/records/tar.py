"""WebDataset tar shards: a sample is the run of members sharing a key (``dir/key.jpg``, ``dir/key.cls``,
``dir/key.json``: the key is the name up to the first dot of its last part, as webdataset splits it).

An uncompressed shard is read at the pictures' places (its headers and small members are read, the
pictures skipped); a compressed one (``.tar.gz``) only from its start, so its pictures are unpacked once.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ...storage.remote import is_object_url
from .locations import file_version, open_stream
from .parts import PartScan

PICTURE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTENSION = "cls"
SUFFIXES = (".tar", ".tar.gz", ".tgz")
_BLOCK = 512
_NAME = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


@dataclass(frozen=True)
class WebDataset:
    """Which member holds the picture (``image_key``: an extension; None: the first of
    `PICTURE_EXTENSIONS`) and the labels (``label_keys``: field name -> an extension whose text is the
    label, or ``json.FIELD``, a field of the sample's ``.json`` member; None: ``{"labels": "cls"}`` where
    samples have a ``.cls`` member).

    >>> WebDataset(label_keys={"labels": "json.label"}).image_key is None
    True
    """

    image_key: str | None = None
    label_keys: Mapping[str, str] | None = None

    def scan(self, location: str, storage_options: Mapping[str, Any] | None = None) -> PartScan:
        """Every sample of the shard: where its picture lies and its labels; a sample without a picture or
        a label is damaged; a truncated shard ends with a damaged entry."""
        return scan_tar(location, self, storage_options)

    def pictures(self, location: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[bytes]:
        """Each sample's picture bytes, in order (``b""`` for a damaged one): what unpacking writes."""
        return tar_pictures(location, self, storage_options)


def compressed(location: str) -> bool:
    return location.endswith((".gz", ".tgz"))


def scan_tar(location: str, keys: WebDataset, storage_options: Mapping[str, Any] | None = None) -> PartScan:
    scan = PartScan(location, file_version(location, storage_options))
    direct = not compressed(location)
    for key, members, damage in _samples(location, storage_options, keep_pictures=False):
        if damage and not members:
            scan.add(key, (-1, 0), {}, damage)
            continue
        try:
            name, member = _picture(members, keys)
            labels = _labels(members, keys)
        except KeyError as error:
            scan.add(key, (-1, 0), {}, str(error.args[0]))
            continue
        scan.add(name, (member[0] if direct else -1, member[1]), labels, damage)
    return scan


def tar_pictures(location: str, keys: WebDataset, storage_options: Mapping[str, Any] | None = None) -> Iterator[bytes]:
    for _, members, damage in _samples(location, storage_options, keep_pictures=True):
        try:
            yield b"" if damage else _picture(members, keys)[1][2]
        except KeyError:
            yield b""


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
        text = (members[extension][2] or b"").decode("utf-8", "replace").strip()
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
    bytes (small members, and pictures when kept), member name). tarfile ends quietly at a header it
    cannot read (a truncated or damaged shard): the end-of-archive block is checked to be there."""
    seekable = not is_object_url(location) and not compressed(location)
    with open_stream(location, storage_options) as stream:
        source = stream if seekable else _Recorder(gzip.GzipFile(fileobj=stream) if compressed(location) else stream)
        key, members, last = None, {}, ""
        size = os.fstat(stream.fileno()).st_size if seekable else None
        try:
            with tarfile.open(fileobj=source, mode="r:" if seekable else "r|") as archive:
                for member in archive:
                    if not member.isfile():
                        continue
                    if size is not None and member.offset_data + member.size > size:
                        raise tarfile.ReadError(f"member {member.name!r} needs {member.size} bytes and "
                                                f"{max(0, size - member.offset_data)} are left")
                    found = _NAME.match(member.name)
                    if found is None or found.group(1).rsplit("/", 1)[-1].startswith("__"):
                        continue
                    if key is not None and found.group(1) != key:
                        yield key, members, ""
                        members = {}
                    key, last, extension = found.group(1), member.name, found.group(2).lower()
                    small = member.size < 2**16 or keep_pictures or extension not in PICTURE_EXTENSIONS
                    data = _member_bytes(archive, member) if small else None
                    members[extension] = (member.offset_data, member.size, data, member.name)
                end = os.pread(stream.fileno(), _BLOCK, archive.offset) if seekable else source.block(archive.offset)
            if end != bytes(_BLOCK):
                raise tarfile.ReadError("no end-of-archive block where the last member ends")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
            yield (key or location), {}, (f"the shard ends inside or after member {last!r} ({error}): it is "
                                          "truncated or damaged there, and any samples after it are lost")
            return
        if key is not None:
            yield key, members, ""


class _Recorder(io.RawIOBase):
    """A stream read once, keeping its last bytes: where tarfile stopped can be checked afterwards."""

    def __init__(self, stream: Any, keep: int = 2**16) -> None:
        self.stream, self.keep, self.total, self.tail = stream, keep, 0, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        self.total += len(data)
        self.tail = (self.tail + data)[-self.keep :]
        return len(data)

    def block(self, offset: int) -> bytes:
        """The 512 bytes at ``offset``, when read and kept (else fewer)."""
        self.tail += self.stream.read(_BLOCK)  # tarfile may not have read that far
        start = offset - (self.total - len(self.tail) + 0)
        return self.tail[start : start + _BLOCK] if start >= 0 else b""


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    file = archive.extractfile(member)
    data = file.read() if file is not None else b""
    if len(data) != member.size:
        raise tarfile.ReadError(f"member {member.name!r} holds {len(data)} of its {member.size} bytes")
    return data
