"""How many chunks this process's runs read: to check that an epoch reads each chunk once, here or on
the workers of a Dask cluster.

>>> from outcore.testing.reads import chunk_reads, count_chunk_reads
>>> count_chunk_reads()  # from now on (or client.run(count_chunk_reads), on every worker)
>>> chunk_reads()  # since then (or sum(client.run(chunk_reads).values()))
0
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..iterate import runs

_reads = [0]
_lock = threading.Lock()  # reads run on several threads


def count_chunk_reads() -> None:
    """Count, from now on, the chunks that runs in this process read (`outcore.iterate.runs.ChunkBuffers`:
    local threads and cluster spans alike): `chunk_reads` says how many."""
    with _lock:
        _reads[0] = 0
    read_many = runs.ChunkBuffers.read_many
    if getattr(read_many, "counted", False):
        return

    def counted(self: runs.ChunkBuffers, chunks: Sequence[int]) -> list[runs.Loaded | Exception]:
        with _lock:
            _reads[0] += len(chunks)
        return read_many(self, chunks)

    counted.counted = True  # type: ignore[attr-defined]
    runs.ChunkBuffers.read_many = counted  # type: ignore[method-assign]


def chunk_reads() -> int:
    """Chunks read in this process since `count_chunk_reads`."""
    return _reads[0]
