"""Read one chunk of a field straight from its shard file: one ranged read, crc32c, Blosc, done.

Zarr's reader runs every read through one event-loop thread, reads the shard index again for each
chunk and copies the bytes several times; on two cores it could not read faster with two threads than
with one (benchmarks/iterate.py). For the layout outcore writes — sharded along the samples, codecs
``bytes → [blosc] → crc32c``, index ``bytes → crc32c`` at the end — this module reads the shard index
once per shard and decodes each chunk with calls that release the GIL, directly into its output array,
so reader threads really run in parallel: from a local directory or zip with plain file reads (a local
file's chunk, once its shard's index is known, in one C call that releases the GIL once: `chunk_reads`), from
any other store (fsspec URLs) through the store's ranged reads. Any other layout falls back to Zarr
itself (`ShardReader.direct` says which path is taken). Tests compare both paths.

It also knows what must exist. Every chunk a reader is asked for lies within the samples the store
promises, so a missing shard file, a chunk its shard index says was never written, an index entry
outside its file or overlapping another, and a file shorter than its index says are corruption,
reported with the field, chunk and file — never read as fill values. A Writer growing the store
replaces its last shard file (in one rename) at every flush: a shard's index and the chunks read with
it come from one open file, so a reader sees one version or the next, and an index that no longer fits
its file is read anew, never taken for corruption.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import struct
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Self

import crc32c
import numpy as np
import zarr
from numcodecs import blosc
from zarr.abc.store import RangeByteRequest
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

from ..errors import CorruptChunkError, OutcoreError
from ..threads import submit_io
from . import blocks
from .chunk_reads import read_at_once, read_many_at_once
from .failures import retried
from .groups import shard_path
from .huge_pages import HugePageReads
from .page_cache import memory
from .pins import Pins, stamp_of
from .remote import RemoteStore, coalesce
from .zipstore import RangeZipStore

_EMPTY = 2**64 - 1  # index entry of a chunk that was never written
_CHECKSUM_BYTES = 4
_BLOSC_OVERHEAD = 16  # the most Blosc adds to incompressible data
_BLOSC_HEADER = struct.Struct("<III")  # nbytes, blocksize, cbytes: bytes 4..15 of a Blosc frame
# what zarr raises for a damaged chunk: a checksum, a codec, or a chunk that decodes to another size
_CORRUPTION = re.compile(r"checksum|decompress|blosc|corrupt|cannot reshape", re.IGNORECASE)
# Each thread's read buffer, shared by every reader it runs (an iterator made each epoch opens new readers): grown
# to a power of two at least the largest chunk it read (a few sizes in all, however the chunks' sizes creep up),
# never zeroed (its pages are faulted in by the C call that first writes them, outside the GIL).
_SCRATCH = threading.local()


class _Unreadable(Exception):
    """A shard file cannot be read as its index says; the reader names the chunk and file."""


class _Failed(Exception):
    """The system failed a read of a shard file (``error``); the reader tries again or names it."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Ask(NamedTuple):
    """A chunk's read by one C call (`chunk_reads`): its shard file's ``path`` (encoded), its bytes ``offset`` and ``nbytes`` there,
    whether they are a Blosc frame, and the ``stamp`` of the file's version they are of (the call returns the file's: a
    match vouches for the read)."""

    path: bytes
    offset: int
    nbytes: int
    blosc: bool
    stamp: Hashable


class _ShardIndex(NamedTuple):
    """A shard file's index, ``(offset, nbytes)`` per chunk, the `_ShardFile.stamp` of the file it was read from, and
    each chunk's read by one C call from that file (``asks``; None for a chunk never written), made once."""

    entries: np.ndarray
    stamp: Hashable
    asks: list[_Ask | None]


@dataclass
class _IndexRead:
    """A shard index being read by one thread, for the others that need it meanwhile (`ShardReader._read_index`)."""

    done: threading.Event = field(default_factory=threading.Event)
    stamp: Hashable | None = None  # the version of the file it was read from (`_ShardFile.stamp`)
    index: _ShardIndex | None = None
    error: BaseException | None = None


class ShardReader:
    """``read(chunk)`` returns samples ``[chunk * chunk_size, ...)`` of one field as a numpy array.

    ``samples`` — ``(num_samples, chunk_size)`` — names samples in errors when the array's own axis 0
    is not the sample axis (the bytes of an encoded field: chunk ``k`` holds sample chunk ``k``). ``indexes`` holds
    the shard indexes read, by shard: given, those of the store's other readers of the array (`Store.shard_indexes`:
    an iterator made each epoch reads none again); each is used only for the version of its file it was read from.
    """

    def __init__(
        self, array: zarr.Array, field: str, where: str, num_samples: int, *, samples: tuple[int, int] | None = None,
        pins: Pins | None = None, indexes: dict[int, Any] | None = None,
    ) -> None:
        self.array, self.field, self.where, self.num_samples = array, field, where, num_samples
        self.chunk_size = array.chunks[0]
        self._chunk_shape, self._dtype = (self.chunk_size, *array.shape[1:]), array.dtype  # zarr's properties: slow
        self._samples = samples or (num_samples, self.chunk_size)
        self._layout = _direct_layout(array, pins)
        self._indexes: dict[int, _ShardIndex] = {} if indexes is None else indexes
        last = max(0, num_samples - 1) // self.chunk_size  # the last chunk, which may hold fewer samples
        self._last = (last, num_samples - last * self.chunk_size)
        self._reading: dict[int, _IndexRead] = {}  # the shards whose index a thread is reading
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        return self._layout is not None

    def empty(self) -> np.ndarray:
        """A buffer that `read` can fill: a whole chunk of this field (`blocks`: memory used again)."""
        return blocks.empty(self._chunk_shape, self._dtype)

    @property
    def chunk_nbytes(self) -> int:
        """A whole chunk's bytes, as `empty` holds them."""
        return self.chunk_size * math.prod(self._chunk_shape[1:]) * self._dtype.itemsize

    def local_reads(self, chunks: np.ndarray) -> tuple[list[tuple[bytes, Hashable]], np.ndarray] | None:
        """How one C call reads each of ``chunks`` (`_Ask`'s, as arrays): the shard files ``(path, stamp)`` (encoded,
        and the version whose index was read, now where it was not), and for each chunk its file's number among them,
        its offset and bytes there and whether they are a Blosc frame (int64, one row a chunk). None unless every
        chunk is of a local shard file whose index can be read and gives it (what is wrong is then named by `read`)."""
        layout = self._layout
        if layout is None or layout.read_at_once is None:
            return None
        shards, inner = np.divmod(np.asarray(chunks, np.int64), layout.chunks_per_shard)
        numbers, number = np.unique(shards, return_inverse=True)  # each chunk's file's number among them
        files, indexes = [], []
        for shard in numbers.tolist():
            try:
                known = self._index(shard)
            except (_Unreadable, _Failed, OutcoreError, OSError):
                return None
            if len(known.entries) != layout.chunks_per_shard:  # not an index of this layout's: `read` says so
                return None
            indexes.append(known.entries)
            files.append((os.fsencode(layout.path(shard)), known.stamp))
        entries = np.concatenate(indexes)[number * layout.chunks_per_shard + inner] if indexes else \
            np.empty((0, 2), np.uint64)
        if (entries[:, 0] == _EMPTY).any():  # a chunk never written
            return None
        reads = np.empty((len(shards), 4), np.int64)
        reads[:, 0], reads[:, 1:3], reads[:, 3] = number, entries, layout.blosc
        return files, reads

    @property
    def remote(self) -> bool:
        """Whether the chunks come from an object store (where `prefetch` pays)."""
        return self._layout is not None and hasattr(self._layout.files, "ask")

    def prefetch(self, chunks: Sequence[int]) -> None:
        """Have the chunks' stored bytes fetched on I/O threads (`outcore.threads.submit_io`), so that the
        `read` calls that follow find them; nothing for local files. Chunks stored back to back in a shard
        file are asked in one request (`coalesce`). Chunks of shards whose index is known are asked for
        before this returns (a `read` then waits for that request instead of making its own); the others
        once an I/O thread has read their index. A failure here is left to the `read`."""
        if not self.remote:
            return
        known: dict[int, list[int]] = {}
        unknown: dict[int, list[int]] = {}
        for chunk in chunks:
            shard, inner = divmod(chunk, self._layout.chunks_per_shard)
            (known if shard in self._indexes else unknown).setdefault(shard, []).append(inner)
        self._ask(known)
        if unknown:
            submit_io(self._ask, unknown)

    def expect(self, chunk: int, when: float) -> None:
        """Tell the node's cache when the chunk (read already) will be read next; nothing for local files."""
        if not self.remote:
            return
        shard, inner = divmod(chunk, self._layout.chunks_per_shard)
        known = self._indexes.get(shard)
        if known is not None and known.entries[inner][0] != _EMPTY:
            offset, nbytes = known.entries[inner]
            self._layout.files.expect(self._layout.key(shard), int(offset), int(nbytes), when)

    def _ask(self, chunks: dict[int, list[int]]) -> None:
        """Ask for chunks (inner positions by shard), reading the shards' indexes first where needed."""
        for shard, inner in chunks.items():
            try:
                index = self._index(shard).entries
            except (_Unreadable, _Failed, OutcoreError, OSError):
                return  # the reads meet the failure themselves
            spans = [(int(offset), int(nbytes)) for offset, nbytes in index[inner] if offset != _EMPTY]
            for run in coalesce(spans):
                fetch = self._layout.files.ask(self._layout.key(shard), run)
                if fetch is not None:
                    submit_io(fetch)

    def read(self, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        """The chunk's samples; decoded into ``out`` (from `empty`) when given."""
        start = chunk * self.chunk_size
        stop = min(self.num_samples, start + self.chunk_size)
        if self._layout is None:
            values = read_samples(self.array, (slice(start, stop),), self.field, self.where)
            if out is None:
                return values
            out[: len(values)] = values
            return out[: len(values)]
        out = self.empty() if out is None else out
        if self._layout.read_at_once is not None and self._read_at_once(chunk, out):
            return self._samples_of(chunk, out)
        try:
            return self._samples_of(chunk, self._read_retried(chunk, out))
        except _Unreadable as error:
            pins = getattr(self._layout.files, "pins", None)
            replaced = pins.replaced() if pins else None  # a file rewritten in place as it was read
            if replaced:
                raise pins.changed(self._layout.key(chunk // self._layout.chunks_per_shard), replaced) from None
            raise self._corrupt(chunk, str(error)) from None

    def _read_retried(self, chunk: int, out: np.ndarray) -> np.ndarray:
        """`_read_direct`, from the file's opening again while the system's failures may pass
        (`outcore.storage.failures.retried`); one that does not is a `StorageError` naming the chunk and file."""
        def attempt() -> np.ndarray:
            try:
                return self._read_direct(chunk, out)
            except _Failed as failed:
                raise failed.error from None

        return retried(attempt, self.where, lambda: self._what(chunk))

    @staticmethod
    def read_vouched(reads: Sequence[tuple[ShardReader, int, np.ndarray]]) -> list[np.ndarray | None]:
        """Each ``(reader, chunk, out)``'s chunk read into ``out`` (its samples, as `read` returns them) where one C
        call that releases the GIL once for them all can vouch for it: the chunks of local shard files whose index is
        known (`chunk_reads.read_many_at_once`: a chunk's fields, the chunks of a read task); None for the others, and
        for any the call did not vouch for, which the caller reads by `read`. Each chunk's read is its shard index's
        (`_ShardIndex.asks`), found here without a Python call."""
        got: list[np.ndarray | None] = [None] * len(reads)
        if read_many_at_once is None:
            return got
        requests, asked, most = [], [], 0
        for k, (reader, chunk, out) in enumerate(reads):
            layout = reader._layout
            if layout is None or layout.read_at_once is None:
                continue
            shard, inner = divmod(chunk, layout.chunks_per_shard)
            known = reader._indexes.get(shard)
            if known is None or (ask := known.asks[inner]) is None:
                continue
            requests.append((ask.path, ask.offset, ask.nbytes, out, ask.blosc))
            asked.append((k, ask.stamp))
            most = max(most, ask.nbytes)
        if len(requests) > 1:  # one alone is read by `read`, as any other
            for (k, stamp), read in zip(asked, read_many_at_once(requests, _scratch(most)), strict=True):
                if read == stamp:  # else the file was replaced since its index was read: `read` reads the new one's
                    reader, chunk, out = reads[k]
                    last, count = reader._last  # `_samples_of`, without its call
                    got[k] = out if chunk != last else out[:count]
        return got

    def read_many(self, chunks: Sequence[int]) -> np.ndarray:
        """Chunks ``chunks`` read one after the other into one array (``len(chunks)`` whole chunks: past the last
        sample, the last chunk's rows are zeros): those of local shard files by one C call (`read_vouched`, once each
        shard's index is read), any others by `read`, which names what is wrong.

        >>> reader.read_many([3, 0]).shape  # doctest: +SKIP
        (2, 32, 3)
        """
        out = np.zeros((len(chunks), *self._chunk_shape), self._dtype)
        if self._layout is not None and self._layout.read_at_once is not None:
            for shard in {chunk // self._layout.chunks_per_shard for chunk in chunks} - self._indexes.keys():
                with contextlib.suppress(_Unreadable, _Failed, OutcoreError, OSError):  # `read` names it
                    self._index(shard)
        reads = [(self, chunk, rows) for chunk, rows in zip(chunks, out, strict=True)]
        for (_, chunk, rows), read in zip(reads, ShardReader.read_vouched(reads), strict=True):
            if read is None:
                self.read(chunk, rows)
        return out

    def _samples_of(self, chunk: int, out: np.ndarray) -> np.ndarray:
        """The chunk's samples in ``out``, a whole chunk's buffer (the last chunk holds fewer: `_last`)."""
        last, count = self._last
        return out if chunk != last else out[:count]

    def _read_at_once(self, chunk: int, out: np.ndarray) -> bool:
        """Whether the chunk was read, checked and decoded into ``out`` by one C call outside the GIL
        (`chunk_reads.read_at_once`), from the version of its shard file whose index was read. A chunk of a shard
        whose index is not known yet, and any failure, are left to `_read_retried`: it reads the chunk again
        (in that call, once it has the index), and names what is wrong."""
        shard, inner = divmod(chunk, self._layout.chunks_per_shard)
        known = self._indexes.get(shard)
        ask = None if known is None else known.asks[inner]
        if ask is None:
            return False
        return self._layout.read_at_once(ask.path, ask.offset, ask.nbytes, _scratch(ask.nbytes), out,
                                         ask.blosc) == ask.stamp

    def _read_direct(self, chunk: int, out: np.ndarray) -> np.ndarray:
        shard, inner = divmod(chunk, self._layout.chunks_per_shard)
        with self._layout.opened(shard) as file:
            known = self._indexes.get(shard)
            if known is not None and (not file.local or known.stamp == file.stamp()):  # a local stamp costs nothing
                try:
                    return self._read_chunk(file, known.entries[inner], out)
                except _Unreadable:
                    if file.stamp() == known.stamp:
                        raise
            # No index yet, or the file was replaced since its index was read: a Writer appending replaces
            # its last shard file (in one rename) at every flush. The index and the chunk of this one version:
            # in one C call outside the GIL where it reads this version too (an iterator made each epoch reads
            # each shard's first chunk here), else from this file.
            index = self._read_index(shard, file)
            if self._layout.read_at_once is not None and self._read_at_once(chunk, out):
                return out
            return self._read_chunk(file, index.entries[inner], out)

    def _read_chunk(self, file: _ShardFile, entry: np.ndarray, out: np.ndarray) -> np.ndarray:
        offset, nbytes = entry
        if offset == _EMPTY:
            raise _Unreadable("it was never written (its shard index has no entry for it)")
        payload = memoryview(_scratch(int(nbytes)))[: int(nbytes)]
        file.read_into(int(offset), payload)
        data = payload[:-_CHECKSUM_BYTES]
        if crc32c.crc32c(data).to_bytes(4, "little") != payload[-_CHECKSUM_BYTES:]:
            raise _Unreadable("stored and computed crc32c checksums differ")
        try:
            if self._layout.blosc:
                _check_frame(data, out.nbytes)
                blosc.decompress(data, out)
            else:
                out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        except (RuntimeError, ValueError) as error:
            raise _Unreadable(f"cannot decompress ({error})") from None
        return out

    def _index(self, shard: int) -> _ShardIndex:
        known = self._indexes.get(shard)
        if known is None:
            with self._layout.opened(shard) as file:
                known = self._read_index(shard, file)
        return known

    def _read_index(self, shard: int, file: _ShardFile) -> _ShardIndex:
        """The shard's index, read from ``file``; once per shard when threads need it at once (a read-ahead
        and a read): the others wait for the one reading it and take its index or its error, if of their
        version of the file (a growing store's may have been replaced between their openings); else they
        read their own."""
        with self._lock:
            reading, first = self._reading.get(shard), shard not in self._reading
            if first:
                reading = self._reading[shard] = _IndexRead()
        if not first:
            reading.done.wait()
            if reading.stamp is not None and reading.stamp == file.stamp():
                if reading.error is not None:
                    raise reading.error
                return reading.index
            return self._read_index_now(shard, file)
        try:
            reading.index = self._read_index_now(shard, file)
            reading.stamp = reading.index.stamp
            return reading.index
        except BaseException as error:
            reading.error = error
            with contextlib.suppress(Exception):  # the others, not knowing the version, read their own
                reading.stamp = file.stamp()
            raise
        finally:
            with self._lock:
                del self._reading[shard]
            reading.done.set()

    def _read_index_now(self, shard: int, file: _ShardFile) -> _ShardIndex:
        size, index_bytes = file.size(), self._layout.index_bytes
        if size < index_bytes:
            raise _Unreadable(f"its shard file has {size} bytes, fewer than its index's {index_bytes}")
        raw = bytearray(index_bytes)
        file.read_into(size - index_bytes, memoryview(raw))
        if crc32c.crc32c(raw[:-_CHECKSUM_BYTES]).to_bytes(4, "little") != raw[-_CHECKSUM_BYTES:]:
            raise _Unreadable("the shard index fails its checksum")
        index = np.frombuffer(raw[:-_CHECKSUM_BYTES], dtype="<u8").reshape(-1, 2)
        _check_index(index, size - index_bytes, self._max_chunk_bytes())
        stamp = file.stamp()
        known = _ShardIndex(index, stamp, self._asks(shard, index, stamp))
        file.check_growth(index)
        with self._lock:
            self._indexes[shard] = known
        return known

    def _asks(self, shard: int, index: np.ndarray, stamp: Hashable) -> list[_Ask | None]:
        """Each chunk's read by one C call from the shard's local file of version ``stamp``, whose ``index`` was read
        (None for a chunk never written, and for every chunk of a file that is not local)."""
        if self._layout.read_at_once is None:
            return [None] * len(index)
        path, blosc = os.fsencode(self._layout.path(shard)), self._layout.blosc  # bytes: not encoded again at each read
        return [None if offset == _EMPTY else _Ask(path, offset, nbytes, blosc, stamp) for offset, nbytes in index.tolist()]

    def _max_chunk_bytes(self) -> int:
        raw = self.chunk_size * math.prod(self.array.shape[1:]) * self.array.dtype.itemsize
        return raw + _CHECKSUM_BYTES + (_BLOSC_OVERHEAD if self._layout.blosc else 0)

    def _what(self, chunk: int) -> str:
        """``field 'x', chunk 3 (samples 96..127, in file x/c/0/0)``"""
        num_samples, chunk_size = self._samples
        first = chunk * chunk_size
        last = min(num_samples, first + chunk_size) - 1
        key = self._layout.key(chunk // self._layout.chunks_per_shard)
        return f"field {self.field!r}, chunk {chunk} (samples {first}..{last}, in file {key})"

    def _corrupt(self, chunk: int, reason: str) -> CorruptChunkError:
        return CorruptChunkError(
            f"{self.where}: {self._what(chunk)} is corrupt: {reason}. Restore that file from a copy or re-create "
            "the store from its source."
        )


def _scratch(nbytes: int) -> np.ndarray:
    """This thread's read buffer, of ``nbytes`` or more (`_SCRATCH`), uninitialised.

    >>> buffer = _scratch(5000)
    >>> len(buffer) >= 5000 and len(buffer) & (len(buffer) - 1) == 0, _scratch(100) is buffer
    (True, True)
    """
    scratch = getattr(_SCRATCH, "buffer", None)
    if scratch is None or len(scratch) < nbytes:
        scratch = _SCRATCH.buffer = np.empty(1 << max(0, int(nbytes) - 1).bit_length(), np.uint8)
    return scratch


def _check_frame(frame: memoryview, chunk_nbytes: int) -> None:
    """Refuse a Blosc frame that does not decompress to exactly one chunk, or whose header misstates its
    own length: Blosc would fill only part of the chunk, leaving zeros or an earlier chunk's values."""
    if len(frame) < _BLOSC_HEADER.size + 4:
        raise _Unreadable(f"its Blosc frame has {len(frame)} bytes, fewer than a Blosc header")
    nbytes, _, cbytes = _BLOSC_HEADER.unpack_from(frame, 4)
    if nbytes != chunk_nbytes:
        raise _Unreadable(f"its Blosc frame holds {nbytes} bytes where the chunk has {chunk_nbytes}")
    if cbytes != len(frame):
        raise _Unreadable(f"its Blosc frame says it has {cbytes} bytes where {len(frame)} are stored")


def _check_index(index: np.ndarray, data_bytes: int, max_chunk_bytes: int) -> None:
    """Refuse a shard index whose entries lie outside the file's data, overlap, or claim sizes no chunk has."""
    written = index[index[:, 0] != _EMPTY]
    offsets, sizes = written[:, 0], written[:, 1]
    if (sizes < _CHECKSUM_BYTES).any() or (sizes > max_chunk_bytes).any():
        raise _Unreadable(f"its shard index gives chunk sizes outside {_CHECKSUM_BYTES}..{max_chunk_bytes} bytes")
    if (offsets > data_bytes).any() or (offsets + sizes > data_bytes).any():
        raise _Unreadable(f"its shard index points beyond the file's {data_bytes} bytes of chunks")
    ends = np.sort(offsets + sizes)
    if (np.sort(offsets)[1:] < ends[:-1]).any():
        raise _Unreadable("its shard index has chunks that overlap")


class _DirectLayout:
    """Where a field's shard files are and how their chunks are encoded (outcore's layout only)."""

    def __init__(self, array: zarr.Array, files: Any, blosc_codec: bool) -> None:
        self.array, self.files, self.blosc = array, files, blosc_codec
        self.chunks_per_shard = array.shards[0] // array.chunks[0]
        self.index_bytes = 16 * self.chunks_per_shard + _CHECKSUM_BYTES
        self._keys: dict[int, str] = {}  # shard -> its file's key, made once
        self._paths: dict[int, str] = {}  # shard -> its local file's path
        # a local file's chunks read with pread in C calls (`ShardReader._read_at_once`, `read_vouched`), where they can be
        local = isinstance(files, _LocalFiles) and not files.huge_pages
        self.read_at_once = read_at_once if local else None

    def key(self, shard: int) -> str:
        key = self._keys.get(shard)
        if key is None:
            key = self._keys[shard] = shard_path(self.array, shard)
        return key

    def path(self, shard: int) -> str:
        """The shard's local file."""
        path = self._paths.get(shard)
        if path is None:
            path = self._paths[shard] = f"{self.files.root}/{self.key(shard)}"
        return path

    def opened(self, shard: int) -> _ShardFile:
        """The shard file, open (a context manager): all read through it comes from one version of the file."""
        return _ShardFile(self.files, self.key(shard))


class _ShardFile:
    """One shard file, open. A local file is read through one file descriptor, so a file that a Writer
    replaces meanwhile (whole, in one rename) is read from one version or the other, never a mix; an
    object store pins the versions it reads itself (`RemoteFiles`), a zip's members do not change.
    Every failure to read it is an `_Unreadable` (an object store's own is the `OutcoreError` it is)."""

    def __init__(self, files: Any, key: str) -> None:
        self.files, self.key, self._fd, self._reads = files, key, None, None
        if isinstance(files, _LocalFiles):
            try:
                self._fd = os.open(f"{files.root}/{key}", os.O_RDONLY)
            except OSError as error:
                changed = files.pins.missing(key) if files.pins and isinstance(error, FileNotFoundError) else None
                raise (changed or _unreadable(error)) from None
            # reads here are a chunk's exact byte range: the kernel's read-ahead would only read beyond it
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
            self._opened = os.fstat(self._fd)
            self._reads = (HugePageReads(self._fd, self._opened.st_size)
                           if files.huge_pages and stat.S_ISREG(self._opened.st_mode) else None)
            if files.pins:
                try:
                    files.pins.check(key, self._opened)
                except OutcoreError:
                    os.close(self._fd)
                    raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._fd is not None:
            if self._reads is not None:
                self._reads.close()
            os.close(self._fd)

    def size(self) -> int:
        """The file's size in bytes."""
        try:
            if self._fd is not None:
                status = os.fstat(self._fd)
                if stat.S_ISDIR(status.st_mode):
                    raise IsADirectoryError(21, "a folder stands where the file should be")
                return status.st_size
            size = self.files.size(self.key)
        except OutcoreError:
            raise
        except (OSError, KeyError) as error:
            raise _unreadable(error) from None
        if size is None:
            raise _Unreadable("its shard file is missing")
        return size

    @property
    def local(self) -> bool:
        return self._fd is not None

    def stamp(self) -> Hashable:
        """What tells this version of the file from the one a Writer replaces it with: a local file's
        inode, modification time and size; any other's size."""
        return self.size() if self._fd is None else stamp_of(self._opened)

    def check_growth(self, index: np.ndarray) -> None:
        """A local file of another version than the one pinned must be the pinned one grown (`Pins.check_growth`)."""
        if self._fd is not None and self.files.pins:
            self.files.pins.check_growth(self.key, stamp_of(self._opened), index)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from the file at ``offset`` (a read that returns less is continued: a file server
        may; one that returns nothing means the file ends there)."""
        count = 0
        try:
            while count < len(buffer):
                part = buffer[count:]
                if self._fd is not None:
                    got = (self._reads.read_into(offset + count, part) if self._reads is not None
                           else os.preadv(self._fd, [part], offset + count))
                else:
                    got = self.files.read_into(self.key, offset + count, part)
                if got == 0:
                    break
                count += got
        except OutcoreError:
            raise
        except (OSError, KeyError) as error:
            raise _unreadable(error) from None
        if self._fd is not None and self.files.pins and stamp_of(os.fstat(self._fd)) != stamp_of(self._opened):
            raise self.files.pins.changed(self.key, "it was written to while it was read")
        if count != len(buffer):
            raise _Unreadable("its shard file is shorter than its index says")


def _unreadable(error: OSError | KeyError) -> _Unreadable | _Failed:
    """A missing file or a folder in its place is the store's damage; any other failure the system's."""
    if isinstance(error, (FileNotFoundError, KeyError)):
        return _Unreadable("its shard file is missing")
    if isinstance(error, IsADirectoryError):
        return _Unreadable(f"its shard file cannot be read ({error.strerror or error})")
    return _Failed(error)


class _LocalFiles:
    """The shard files of a store in a local folder (read through `_ShardFile`'s file descriptors), and
    what was pinned of them when the store was opened (`outcore.storage.pins`). A store the page cache
    cannot hold is read from the device every epoch: its large chunks are read a 2 MiB page at a time
    (``huge_pages``, `HugePageReads`: fewer device requests); one it holds, by the C extension's one call a
    chunk, in place through the file's mapping where the chunk's pages are in memory, else with ``pread``
    (`chunk_reads.map_files`)."""

    def __init__(self, root: Path, pins: Pins | None) -> None:
        self.root, self.pins = root, pins
        self.huge_pages = pins is not None and _uncached(pins)


def _uncached(pins: Pins) -> bool:
    """Whether the page cache cannot hold the store's files (`Pins.uncached`), found once for a store opened: by its
    first reader, not by each reader of each iterator (an iterator made each epoch makes a few; the machine's memory
    and cgroups read again took about a quarter of a millisecond each, holding the GIL)."""
    if pins.uncached is None:
        pins.uncached = not memory().holds(sum(stamp[2] for stamp in pins.files.values()))
    return pins.uncached


class _ZipFiles:
    def __init__(self, store: RangeZipStore) -> None:
        self.store = store

    def size(self, key: str) -> int:
        return self.store.member_size(key)

    def read_into(self, key: str, offset: int, buffer: memoryview) -> int:
        return self.store.read_range_into(key, offset, buffer)


class _StoreFiles:
    """Any zarr store (fsspec URLs): sizes and ranged reads through the store itself."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def size(self, key: str) -> int | None:
        return sync(self.store.getsize(key)) if sync(self.store.exists(key)) else None

    def read_into(self, key: str, offset: int, buffer: memoryview) -> int:
        request = RangeByteRequest(offset, offset + len(buffer))
        data = sync(self.store.get(key, default_buffer_prototype(), request))
        if data is None:
            raise FileNotFoundError(key)
        raw = data.to_bytes()
        buffer[: len(raw)] = raw
        return len(raw)


def direct_codecs(array: zarr.Array) -> list[dict[str, Any]] | None:
    """The codecs of each chunk of ``array`` (``bytes``, [``blosc``,] ``crc32c``, as their metadata says) when it
    has the layout outcore writes — sharded along axis 0 only, little-endian, each shard's index ``bytes →
    crc32c`` at its end — which the direct shard reader and writer read and write; ``None`` otherwise."""
    metadata = array.metadata.to_dict()
    codecs = metadata.get("codecs") or [{}]
    if metadata.get("zarr_format") != 3 or len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
        return None
    config = codecs[0]["configuration"]
    inner = [codec["name"] for codec in config["codecs"]]
    index = [codec["name"] for codec in config["index_codecs"]]
    little = all(c.get("configuration", {}).get("endian", "little") == "little"
                 for c in (*config["codecs"], *config["index_codecs"]) if c["name"] == "bytes")
    plain = tuple(config["chunk_shape"][1:]) == tuple(array.shape[1:]) == tuple(array.shards[1:])
    if not (little and plain and index == ["bytes", "crc32c"] and config.get("index_location") == "end"
            and inner in (["bytes", "blosc", "crc32c"], ["bytes", "crc32c"])
            and np.dtype(array.dtype).byteorder in ("=", "|", "<")):
        return None
    return config["codecs"]


def _direct_layout(array: zarr.Array, pins: Pins | None) -> _DirectLayout | None:
    codecs = direct_codecs(array)
    if codecs is None:
        return None
    inner = [codec["name"] for codec in codecs]
    store = array.store
    if isinstance(store, RemoteStore):
        files: Any = store.files
    elif isinstance(store, LocalStore):
        files = _LocalFiles(Path(store.root), pins)
    elif isinstance(store, RangeZipStore) and store.stored_only:
        files = _ZipFiles(store)
    else:
        files = _StoreFiles(store)
    return _DirectLayout(array, files, "blosc" in inner)


def read_samples(array: zarr.Array, selection: tuple[slice, ...], field_name: str, where: str) -> np.ndarray:
    """``array[selection]`` through zarr, turning a checksum or decompression failure into a
    `CorruptChunkError` that names the field, the chunk and its shard file, and says what to do."""
    try:
        return array[selection]
    except (ValueError, RuntimeError) as error:
        if not _CORRUPTION.search(str(error)):
            raise
        start = selection[0].start or 0
        chunk_size, shard_size = array.chunks[0], (array.shards or array.chunks)[0]
        chunk = start // chunk_size
        raise CorruptChunkError(
            f"{where}: field {field_name!r}, chunk {chunk} (samples {chunk * chunk_size}.."
            f"{min(array.shape[0], (chunk + 1) * chunk_size) - 1}, in file {shard_path(array, start // shard_size)}) "
            f"is corrupt: {error}. Restore that file from a copy or re-create the store from its source."
        ) from error
