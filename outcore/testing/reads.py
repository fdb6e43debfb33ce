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

from ..iterate import native_run, runs

_reads = [0]  # by cluster spans (and anything else that reads into chunk buffers outside a run)
_by_run: dict[runs.Run, int] = {}  # by each local or C run: counted once its first batch is taken
_lock = threading.Lock()  # reads run on several threads
_in_run = threading.local()  # set while a local run's read is under way on this thread


def count_chunk_reads() -> None:
    """Count, from now on, the chunks that runs in this process read (`outcore.iterate.runs.ChunkBuffers`:
    local threads and cluster spans alike): `chunk_reads` says how many."""
    with _lock:
        _reads[0] = 0
        _by_run.clear()
    read_many, read, release = runs.ChunkBuffers.read_many, runs.LocalRun._read, native_run.NativeRun._release
    if getattr(read_many, "counted", False):
        return

    def counted(self: runs.ChunkBuffers, chunks: Sequence[int]) -> list[runs.Loaded | Exception]:
        if not getattr(_in_run, "reading", False):
            with _lock:
                _reads[0] += len(chunks)
        return read_many(self, chunks)

    def counted_by_run(self: runs.LocalRun, chunks: list[int]) -> list[runs.Loaded | Exception]:
        with _lock:
            _by_run[self] = _by_run.get(self, 0) + len(chunks)
        _in_run.reading = True
        try:
            return read(self, chunks)
        finally:
            _in_run.reading = False

    def counted_at_release(self: native_run.NativeRun) -> None:  # the chunks its engine read (its threads' reads)
        with _lock:
            _by_run[self] = self.engine.reads if self.engine is not None else 0  # all so far: closed twice, once
        release(self)

    counted.counted = True  # type: ignore[attr-defined]
    runs.ChunkBuffers.read_many = counted  # type: ignore[method-assign]
    runs.LocalRun._read = counted_by_run  # type: ignore[method-assign]
    native_run.NativeRun._release = counted_at_release  # type: ignore[method-assign]


def chunk_reads() -> int:
    """Chunks read in this process since `count_chunk_reads`: by cluster spans, and by the local runs whose
    batches were taken (not by a run started ahead for an epoch never asked for: `outcore.iterate.runs.NextEpoch`;
    the runs counted are kept until the next `count_chunk_reads`); a C run's (`outcore.iterate.native_run`) once it
    is closed (an iterator closes its run at the end of each epoch)."""
    with _lock:
        return _reads[0] + sum(count for run, count in _by_run.items() if run.delivered)
