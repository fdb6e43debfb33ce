"""One chunk of a local shard file read, checked (crc32c) and decoded (Blosc) by one call of outcore's C
extension ``_chunks``, which holds the GIL only to start and to return: `read_at_once` (several chunks, a chunk's
fields, in one call: `read_many_at_once`); and whole files (picture files at ingest) by others: `read_file_at_once`,
`read_files_at_once`; files' sizes and times: `stat_files_at_once`; a shard's chunks compressed and checksummed for
writing: `encode_at_once`; a chunk's samples joined in its region to write it: `join_at_once`.

Where a chunk's pages are all in the page cache (a store that fits in memory, after its first epoch), the call reads
it in place through its file's mapping, made at the file's first read and kept (`map_files`): the kernel neither
looks up nor copies its pages, a quarter of a pixel batch's CPU time. Other chunks are read by ``pread``.

Read by Python's calls, a chunk takes seven system calls (open, advice, two fstat, pread, close) and the
checksum and codec calls, each releasing the GIL and taking it again, with a dozen Python calls between them:
time that a thread holds the GIL, one thread at a time however many cores the machine has.
`outcore.storage.shard_reader` reads a chunk so whenever it knows the chunk's place in its shard file (its
shard's index was read) and the file is read with ``pread``; anything the call does not vouch for (the file
is not the version its index was read from, or cannot be read, checked or decoded) is read again by
Python's calls, which name what is wrong. The same bytes either way (tests/test_chunk_reads.py).

The extension needs a C compiler at install, a POSIX system, the CRC32 instruction of x86-64 (SSE 4.2) or
ARMv8, and numcodecs' Blosc library (which zarr decodes with); `how` says whether chunks are read so here.
``OUTCORE_NATIVE=0`` in the environment turns it off.

>>> how().split(" (")[0] in ("C extension", "Python's calls")
True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
from numcodecs import blosc

try:
    from . import _chunks
except ImportError as error:  # not built (no C compiler at install), or another interpreter's build
    _chunks, _missing = None, f"not built or cannot load ({error}): building it needs a C compiler at install"


def _bound() -> tuple[Callable[..., Any] | None, str]:
    """``(_chunks.read, "")`` where it can run here; otherwise ``(None, why not)``."""
    if _chunks is None:
        return None, _missing
    if os.environ.get("OUTCORE_NATIVE", "1") == "0":
        return None, "turned off by OUTCORE_NATIVE=0"
    if not hasattr(_chunks, "read"):
        return None, "not on this system: it needs POSIX file calls"
    if not _chunks.HARDWARE:
        return None, "this CPU has no CRC32C instruction"
    if not _chunks.bind(blosc.__file__):
        return None, "numcodecs' Blosc library does not export blosc_decompress_ctx"
    return _chunks.read, ""


read_at_once: Callable[..., Any] | None
read_at_once, _why_not = _bound()
"""``read_at_once(path, offset, nbytes, scratch, out, blosc)``: the file's stamp ``(inode, mtime_ns, size)``
once bytes ``[offset, offset + nbytes)`` of the file at ``path`` (a chunk's encoded bytes and their crc32c)
are read, checked and decoded into ``out`` (Blosc frames through ``scratch``, a writable buffer of ``nbytes``
or more); None when anything failed or the file changed while it was read. None where it cannot run here."""


Engine: type | None = getattr(_chunks, "Engine", None) if read_at_once is not None else None
"""``Engine(paths, stamps, asks, row_bytes, chunk_bytes, bounds, row_slot, row_local, reach, used_bounds, used,
threads, read_ahead, window, lent, picture=None, windows=None, mirrors=None)``: a run of plain batches (stored fields'
rows copied out of their chunks, a picture field's windows cut and mirrored) made on C threads that never hold the GIL, their chunks read as `read_at_once` reads one (``_batch_engine.h``;
`outcore.iterate.native_run`); None where chunks are not read so here."""

set_engine_turns: Callable[[int], None] | None = getattr(_chunks, "set_engine_turns", None) if Engine else None
"""``set_engine_turns(limit)``: the most threads of the process's engines at work at once (a read or a batch each),
however many engines run (the pool's gauge's limit, `outcore.iterate.native_run`). None where there is no `Engine`."""

engine_clocks: Callable[[float], tuple[float, float] | None] | None
engine_clocks = getattr(_chunks, "engine_clocks", None) if Engine else None
"""``engine_clocks(least)``: ``(cpu, wall)``, the seconds the batches the engines made since it last gave them took,
summed over them, once their wall time sums to ``least`` seconds or more; else None (the pool's `Gauge` is fed them:
a thread that waits for a core spends wall time without CPU time). None where there is no `Engine`."""

read_many_at_once: Callable[[Sequence[tuple[Any, ...]], bytearray], list[Any]] | None
read_many_at_once = getattr(_chunks, "read_many", None) if read_at_once is not None else None  # None: built before it
"""``read_many_at_once(requests, scratch)``: each request ``(path, offset, nbytes, out, blosc)`` read, checked and
decoded as `read_at_once` reads it, one after the other through ``scratch`` (of each ``nbytes`` or more), by one
call that releases the GIL once for them all (a chunk's fields): their stamps, None for each that failed. None where
it cannot run here."""


read_file_at_once: Callable[[str], bytes | None] | None
read_file_at_once = _chunks.read_file if read_at_once is not None else None
"""``read_file_at_once(path)``: the whole regular file at ``path`` (a picture file at ingest) read by one call that
releases the GIL twice (to open it, then to read it), instead of at each of Python's five system calls; None when
it cannot be read so (the caller reads it its own way, which names what is wrong). None where it cannot run here."""


read_files_at_once: Callable[[Sequence[str], np.ndarray], list[bytes | None]] | None
read_files_at_once = getattr(_chunks, "read_files", None) if read_at_once is not None else None  # None: built before it
"""``read_files_at_once(paths, sizes)``: the regular files at ``paths``, each of ``sizes[k]`` bytes (int64; the
ingest's write tasks know them from its survey), read by one call that releases the GIL once for them all; None
for each that cannot be read so (another size, a record's reference, a URL: the caller reads it its own way, which
names what is wrong). None where it cannot run here."""


join_at_once: Callable[[Sequence[Any], np.ndarray], bool] | None
join_at_once = getattr(_chunks, "join", None) if read_at_once is not None else None  # None: built before it
"""``join_at_once(blobs, out)``: the bytes of ``blobs`` (a chunk's files, label maps or ragged rows) back to back in
``out`` (C-contiguous rows: a chunk's region, as far as they reach) by one copy outside the GIL: True; False, and
``out`` untouched, unless each blob is C-contiguous, of ``out``'s dtype and of whole rows of it, and together they
fill ``out`` exactly (the caller joins them its own way). None where it cannot run here."""


stat_files_at_once: Callable[[Sequence[str], np.ndarray], None] | None
stat_files_at_once = getattr(_chunks, "stat_files", None) if read_at_once is not None else None
"""``stat_files_at_once(paths, out)``: each path's size and modification time in ns (``os.stat``'s ``st_size``
and ``st_mtime_ns``; with a third column, its ``st_mode`` too) written into ``out[k]`` ((paths, 2) or (paths, 3) int64;
zeros for one that cannot be stat'ed) by one call that releases the GIL once for them all. None where it cannot run
here."""


def _mapping() -> Callable[..., bool] | None:
    """``_chunks.map_files`` where chunks are read with the extension and files can be mapped here (Linux), turned
    off where ``OUTCORE_MAP_FILES=0`` is in the environment; else None."""
    map_files = getattr(_chunks, "map_files", None) if read_at_once is not None else None
    if map_files is not None and os.environ.get("OUTCORE_MAP_FILES", "1") == "0":
        map_files(False)
    return map_files


map_files: Callable[..., bool] | None = _mapping()
"""``map_files(on=None)``: whether `read_at_once` and `read_many_at_once` read a chunk whose pages are all in the page
cache in place, through its file's mapping (made at the file's first read and kept: no copy into a buffer, no
search for each page), rather than by ``pread``; on by default, off with ``OUTCORE_MAP_FILES=0``. Returns the
setting before (without ``on``, the setting now); turned off, the mappings no read holds are unmapped. None where
files are not mapped (not Linux, or chunks not read with the extension)."""


def unmap_idle(under: str | os.PathLike[str] | None = None) -> None:
    """Unmap the shard files that no read is reading through their mappings (`map_files`; they are mapped again at
    their next reads): the file ``under``, or the files inside the folder ``under``, or all. Their pages can then
    leave the page cache (``posix_fadvise`` leaves mapped pages: `outcore.storage.page_cache.evict` unmaps first),
    and a store replaced or removed gives its files' space back (`outcore.storage.staging.put_in_place`). Nothing
    where files are not mapped.

    >>> unmap_idle("/no/such/store.zarr")
    """
    if map_files is None:
        return
    if under is None:
        _chunks.unmap_idle()
    elif os.path.isdir(under):
        for folder, _, files in os.walk(under):
            for name in files:
                _chunks.unmap_idle(os.path.join(folder, name))
    else:
        _chunks.unmap_idle(under)


def _encoder() -> Callable[..., int | None] | None:
    """``_chunks.encode`` where chunks are read with the extension and numcodecs' library lends it Blosc's
    compressor too (a trial call says), else None."""
    if read_at_once is None or not hasattr(_chunks, "encode"):
        return None
    try:
        _chunks.encode(bytes(8), 1, 1, 5, 1, "lz4", 0, 8, bytearray(28), np.zeros((1, 2), np.uint64))
    except RuntimeError:  # numcodecs' library does not export blosc_compress_ctx
        return None
    return _chunks.encode


encode_at_once: Callable[..., int | None] | None = _encoder()
"""``encode_at_once(chunks, count, typesize, clevel, shuffle, cname, blocksize, raw_above, out, index)``: the ``count``
chunks of equal size back to back in ``chunks``, each compressed as numcodecs' ``blosc.compress`` makes a Blosc frame
with these settings (one of more than ``raw_above`` bytes made again at level 0: `outcore.format.raw_above`) and
followed by the frame's crc32c, written back to back into ``out`` (count x (chunk bytes + 20)
bytes or more), each one's offset and bytes into ``index`` ((count, 2) uint64), in one call that releases the GIL
once for them all: the bytes written, None when Blosc fails. None where it cannot run here."""


def extension() -> ModuleType | None:
    """The C extension ``_chunks`` where chunks are read with it here (`how`), else None."""
    return None if read_at_once is None else _chunks


def how() -> str:
    """How chunks of local shard files are read (and a shard's chunks encoded to write it) in this process, in words
    (``outcore info --system``)."""
    if read_at_once is not None:
        mapped = ("" if map_files is None else "; chunks in memory read in place from mapped files" if map_files()
                  else "; files not mapped (OUTCORE_MAP_FILES=0)")
        writes = "; a shard's chunks encoded in one" if encode_at_once is not None else ""
        return f"C extension (a chunk read, checked and decoded in one call outside the GIL{mapped}{writes})"
    return f"Python's calls ({_why_not})"
