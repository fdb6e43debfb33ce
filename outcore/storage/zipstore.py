"""A read-only zip store that reads byte ranges of stored (uncompressed) members directly.

``zarr.storage.ZipStore`` serves a byte range by opening the member and seeking, which on Python 3.11
reads everything before the range: reading one inner chunk of a sharded array costs a whole shard file. outcore packs zip members uncompressed, so each member's
bytes lie contiguously in the file and any range is one ``os.pread``, with no lock between threads.
"""

from __future__ import annotations

import os
import struct
import threading
import weakref
import zipfile
from typing import Any, BinaryIO

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import ZipStore

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # the fixed 30 bytes before a member's name


class RangeZipStore(ZipStore):
    """``ZipStore(path, mode="r")`` with direct range reads of stored members; others read as usual.

    The file is opened once, when the store is: a zip file replaced at its path meanwhile (by a copy, a
    move, a new ingest) is not read, the ranges come from the file opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, mode="r")
        self._fd: int | None = None
        self._open_file()
        with os.fdopen(os.dup(self._fd), "rb") as raw:
            self._members = stored_members(raw)
            with zipfile.ZipFile(raw) as archive:  # members compressed by another tool are read by zarr
                self.stored_only = len(self._members) == sum(not info.is_dir() for info in archive.infolist())
        self._fd_lock = threading.Lock()

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        member = self._members.get(key)
        if member is None:
            return await super().get(key, prototype, byte_range)
        start, stop = byte_span(byte_range, member[1])
        buffer = bytearray(stop - start)
        self.read_range_into(key, start, memoryview(buffer))
        return prototype.buffer.from_bytes(buffer)

    def member_size(self, key: str) -> int:
        """The size of stored member ``key`` (a ``KeyError`` when there is none)."""
        return self._members[key][1]

    def read_range_into(self, key: str, offset: int, buffer: memoryview) -> int:
        """Fill ``buffer`` from stored member ``key`` at ``offset`` (from its end when negative)."""
        start, size = self._members[key]
        with self._fd_lock:
            if self._fd is None:  # unpickled
                self._open_file()
        return os.preadv(self._fd, [buffer], start + (offset if offset >= 0 else size + offset))

    def _open_file(self) -> None:
        """Open the zip file, to be closed with the store (or when the store is let go of)."""
        self._fd = os.open(self.path, os.O_RDONLY)
        self._closer = weakref.finalize(self, os.close, self._fd)

    def close(self) -> None:
        if self._fd is not None:
            self._closer()
            self._fd = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_fd"] = None
        del state["_fd_lock"]
        state.pop("_closer", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._fd_lock = threading.Lock()


def stored_members(raw: BinaryIO) -> dict[str, tuple[int, int]]:
    """Map each uncompressed member of the zip file open as ``raw`` to (offset of its bytes in the file, size)."""
    members = {}
    with zipfile.ZipFile(raw) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                continue
            raw.seek(info.header_offset)
            header = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
            name_length, extra_length = header[-2], header[-1]
            members[info.filename] = (info.header_offset + _LOCAL_HEADER.size + name_length + extra_length,
                                      info.file_size)
    return members


def byte_span(byte_range: ByteRequest | None, size: int) -> tuple[int, int]:
    """zarr's byte request of an object of ``size`` bytes as ``(start, stop)``."""
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        return byte_range.start, min(size, byte_range.end)
    if isinstance(byte_range, OffsetByteRequest):
        return byte_range.offset, size
    if isinstance(byte_range, SuffixByteRequest):
        return max(0, size - byte_range.suffix), size
    raise TypeError(f"unexpected byte range {byte_range!r}")
