"""Zip stores in object stores (``s3://bucket/train.zarr.zip``), read by byte ranges, never downloaded
whole: the zip's central directory once per process (a few small requests at its end), each member's
local header when the member is first read (a request of its own, through the node's cache), then every
range of a member as the same range of the zip object.

The members must be stored without compression, as outcore packs them (`outcore.storage.pack_zip`,
or ``zip -0``): a compressed member cannot be read by ranges, and is an `OptionError` naming it.
"""

from __future__ import annotations

import io
import struct
import threading
import zipfile
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import NotAStoreError, OptionError

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # the fixed 30 bytes before a member's name
_LOCAL_SIGNATURE = b"PK\x03\x04"
READ_BYTES = 64 * 1024  # the directory is read in pieces of this size (the zip's end: one request)


class ObjectFiles(Protocol):
    """What `RemoteZip` needs of `outcore.storage.remote.RemoteFiles`: an object's version (with its
    ``size``) and ranges of it."""

    def version(self, key: str) -> Any: ...

    def read_object(self, key: str, offset: int, nbytes: int, version: Any) -> memoryview: ...


@dataclass(frozen=True)
class Member:
    """One member of the zip, as its central directory says."""

    header_offset: int
    size: int
    stored: bool  # uncompressed and not encrypted: readable by ranges


class RemoteZip:
    """The members of the zip object ``name`` of a `RemoteFiles`' store (its central directory, read when
    first needed) and where each one's bytes lie (`locate`)."""

    def __init__(self, files: ObjectFiles, name: str, where: str) -> None:
        self.files, self.name, self.where = files, name, where
        self._members: dict[str, Member] | None = None
        self._lock = threading.Lock()

    def members(self) -> dict[str, Member]:
        """Every member by name (the central directory, read once); `NotAStoreError` when the object is not
        a readable zip file."""
        with self._lock:
            if self._members is None:
                self._members = self._read_directory()
            return self._members

    def known(self) -> dict[str, Member] | None:
        """The members if the directory was read already (None otherwise: nothing is asked)."""
        with self._lock:
            return self._members

    def remember(self, members: dict[str, Member] | None) -> None:
        with self._lock:
            self._members = self._members or members

    def locate(self, key: str, zip_version: Any) -> tuple[int, int]:
        """``(offset of the member's bytes in the zip object, their size)``: a `FileNotFoundError` when there
        is no such member, an `OptionError` when it is compressed."""
        member = self.members().get(key)
        if member is None:
            raise FileNotFoundError(key)
        if not member.stored:
            raise OptionError(
                f"member {key!r} of {self.where} is compressed: a zip in an object store is read by byte ranges, "
                "which needs members stored as they are; pack the store with outcore (ingest to a .zip "
                "location) or `zip -0 -r`, and upload that"
            )
        head = self.files.read_object(self.name, member.header_offset, _LOCAL_HEADER.size, zip_version)
        fields = _LOCAL_HEADER.unpack(bytes(head)) if len(head) == _LOCAL_HEADER.size else None
        if fields is None or fields[0] != _LOCAL_SIGNATURE:
            raise NotAStoreError(f"{self.where}: the local header of member {key!r} is damaged; upload the zip again")
        name_bytes, extra_bytes = fields[-2], fields[-1]
        return member.header_offset + _LOCAL_HEADER.size + name_bytes + extra_bytes, member.size

    def _read_directory(self) -> dict[str, Member]:
        version = self.files.version(self.name)
        try:
            with zipfile.ZipFile(io.BufferedReader(_ObjectFile(self.files, self.name, version), READ_BYTES)) as archive:
                infos = archive.infolist()
        except zipfile.BadZipFile as error:
            raise NotAStoreError(f"{self.where} is not a readable zip file ({error}): it is truncated or damaged; "
                                 "upload it again") from None
        return {info.filename: Member(info.header_offset, info.file_size,
                                      info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1)
                for info in infos if not info.is_dir()}


class _ObjectFile(io.RawIOBase):
    """A read-only, seekable file over one object, each read a ranged GET (for `zipfile` to read the
    central directory through)."""

    def __init__(self, files: ObjectFiles, name: str, version: Any) -> None:
        self.files, self.name, self.version = files, name, version
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.version.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        stop = min(self.version.size, self.position + len(buffer))
        if stop <= self.position:
            return 0
        data = self.files.read_object(self.name, self.position, stop - self.position, self.version)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)
