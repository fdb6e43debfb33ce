"""`NativeRun`: a run of plain batches made start to end by C threads that never hold the GIL.

A `LocalRun` makes each batch in tasks of the process's pool, planned and handed over by Python: a few hundred Python
calls a batch, one thread at a time whatever the cores (`benchmarks/python_calls.py`). Where nothing in a batch needs
Python (every field stored as it is batched, read from local shard files, no transform: ``ds.batches(256)`` over
a pixel store), the whole run is handed to the C engine of `outcore.storage.chunk_reads` at once: the rows of its
batches, by slot (`EpochPlan.span`), the slots each batch reads, and each slot's chunk reads, as its shard's index
gives them (`ShardReader.local_reads`). Its threads (as many as the pool's) read the slots in the schedule's order
(a chunk's crc32c checked and its Blosc frame decoded, `read_at_once`'s reads), up to ``read_ahead`` slots past the
batches being made, copy each batch's rows into arrays given to it a few batches ahead (`outcore.storage.blocks`,
as any batch's), and give a slot's buffers back once the last batch reading it is made. The run's thread takes the
batches in order and hands them over as any run's: a dozen Python calls a batch.

The batches are those a `LocalRun` makes, byte for byte (`tests/test_native_run.py`). A read the engine cannot
vouch for (a file damaged, unreadable, or replaced since its index was read) ends it: that batch and the rest are
made by a `LocalRun`, which reads the chunks again and names what is wrong. The run's plan is held as arrays, 8
bytes a sample.

>>> run = native_run(work, stats, buffers)  # doctest: +SKIP
>>> run is None or isinstance(run, NativeRun)  # doctest: +SKIP
True
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any

import numpy as np

from ..storage import ShardReader, blocks
from ..storage.chunk_reads import Engine
from ..threads import thread_count
from .batch import plain
from .readers import sample_bytes, sample_spec
from .runs import _DONE, WAKE_SECONDS, ChunkBuffers, LocalRun, Run, Work, _Failure
from .stats import LoaderStats


class NativeRun(Run):
    """Batches ``work.batches`` made by ``engine`` (`native_run` makes it), reading ``chunks`` (each once, in the
    plan's order); the rest by a `LocalRun` of ``buffers`` from the first batch whose chunks the engine could not vouch
    for."""

    threads_here = True

    def __init__(self, work: Work, stats: LoaderStats, buffers: ChunkBuffers, engine: Any, window: int,
                 specs: list[tuple[str, tuple[int, ...], np.dtype]], bounds: np.ndarray, lent: list[np.ndarray],
                 chunks: np.ndarray) -> None:
        self.buffers, self.engine, self.window, self.specs = buffers, engine, window, specs
        self.bounds, self.lent, self.chunks = bounds.tolist(), lent, chunks
        self.rest: LocalRun | None = None  # making the batches from the first the engine could not
        super().__init__(work, stats)

    def _produce_batches(self) -> None:
        engine, steps = self.engine, self.work.batches
        given = min(len(steps), self.window)
        window = deque(self._give(k) for k in range(given))  # the arrays of the batches given, not yet taken
        for k in range(len(steps)):
            if given == len(steps):
                self.under_way.set()  # every batch's arrays given: the next epoch's run may start (`NextEpoch`)
            began = time.perf_counter()
            while (made := engine.take(WAKE_SECONDS)) is None:
                if self.stop.is_set():
                    return
            if made is not True:  # a slot's read was not vouched for: this batch and the rest made by a LocalRun
                self._make_rest(steps[k:])
                return
            self.stats.made(time.perf_counter() - began)
            if given < len(steps):
                window.append(self._give(given))
                given += 1
            if not self._put(window.popleft()):
                return

    def _give(self, k: int) -> dict[str, np.ndarray]:
        """Batch ``k``'s arrays (of the run's), given to the engine to make it into."""
        rows = self.bounds[k + 1] - self.bounds[k]
        batch = {name: blocks.empty((rows, *shape), dtype) for name, shape, dtype in self.specs}
        self.engine.give(list(batch.values()))
        return batch

    def _make_rest(self, steps: Any) -> None:
        """Batches ``steps`` made by a `LocalRun`, handed over as they come (a failure too, raised at its batch)."""
        self.engine.close()
        self.rest = rest = LocalRun(dataclasses.replace(self.work, batches=steps), self.stats, self.buffers)
        self.under_way.set()
        while True:
            item = rest._take()
            if item is _DONE:
                return
            rest.delivered += 1
            if not self._put(item) or isinstance(item, _Failure):
                return

    def _release(self) -> None:
        self.engine.close()  # its threads stopped: the blocks it read into are free
        lent, self.lent = self.lent, []
        self.buffers.take_back(lent, self.engine.most_held)
        if self.rest is not None:
            self.rest.close()


def native_run(work: Work, stats: LoaderStats, buffers: ChunkBuffers) -> NativeRun | None:
    """A `NativeRun` of ``work`` where its batches need no Python (as the module docstring says), else None: made by a
    `LocalRun` then. Every shard index its chunks are in is read here (none again: the readers keep them)."""
    recipe, options = work.recipe, work.options
    steps = work.batches
    if (Engine is None or recipe.transform is not None or recipe.text_fields or recipe.ragged_fields
            or work.allocator is not None or work.empty is not plain or options.skip_damaged
            or not isinstance(steps, range) or steps.step != 1 or len(steps) < 2
            or not all(isinstance(buffers.readers.get(name), ShardReader) for name in recipe.fields)):
        return None
    plan, chunk_size = work.plan, work.store.chunk_size
    samples, slots, bounds = plan.span(steps.start, steps.stop)
    bounds = np.asarray(bounds, np.int64)
    if len(bounds) != len(steps) + 1 or not np.diff(bounds).all():
        return None
    slots_read, slot_of_row = np.unique(slots, return_inverse=True)  # the slots the run reads, in the plan's order
    unique, first, of_slot = np.unique(plan.chunks[slots_read], return_index=True, return_inverse=True)
    order = np.argsort(first)  # each chunk read once, where its first slot is (two streams may share one)
    place = np.empty(len(unique), np.int64)
    place[order] = np.arange(len(unique))
    row_slot, chunks = place[of_slot[slot_of_row]], unique[order]
    readers = [buffers.readers[name] for name in recipe.fields]
    files: list[tuple[bytes, Any]] = []  # every field's shard files, (path, stamp) each
    asks = np.empty((len(chunks), len(readers), 4), np.int64)
    for f, reader in enumerate(readers):
        reads = reader.local_reads(chunks)
        if reads is None:
            return None
        asks[:, f] = reads[1]
        asks[:, f, 0] += len(files)
        files.extend(reads[0])
    specs, row_bytes, chunk_bytes = [], [], []
    for name, reader in zip(recipe.fields, readers, strict=True):
        shape, dtype = sample_spec(work.store, name)
        sample = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if reader.chunk_nbytes != sample * chunk_size:  # not a stored field's rows as they are batched
            return None
        specs.append((name, shape, dtype))
        row_bytes.append(sample)
        chunk_bytes.append(reader.chunk_nbytes)
    batch = np.repeat(np.arange(len(steps)), np.diff(bounds))
    used = np.unique(batch * len(chunks) + row_slot)  # each batch's slots, each once, batch after batch
    used_bounds = np.searchsorted(used // len(chunks), np.arange(len(steps) + 1))
    reach = np.maximum.accumulate(np.maximum.reduceat(row_slot, bounds[:-1]))
    threads = thread_count()
    window, read_ahead = engine_window(work, threads), min(LocalRun.MAX_READ_AHEAD, max(2, threads))
    lent = buffers.lend(sum(chunk_bytes))
    try:
        engine = Engine([path for path, _ in files], np.array([stamp for _, stamp in files], np.int64).reshape(-1, 3), asks, np.array(row_bytes, np.int64),
                        np.array(chunk_bytes, np.int64), bounds, row_slot.astype(np.int32),
                        (samples % chunk_size).astype(np.int32), reach, used_bounds.astype(np.int64),
                        used % len(chunks), threads, read_ahead, window, lent)
    except BaseException:
        buffers.take_back(lent, 0)
        raise
    return NativeRun(work, stats, buffers, engine, window, specs, bounds, lent, chunks)


def engine_window(work: Work, threads: int) -> int:
    """The batches made at once (and not yet taken): as a `LocalRun` makes, two at least, one a thread, about
    `LocalRun.MAKING_BYTES` in all."""
    batch_bytes = max(1, sample_bytes(work.store, work.recipe) * work.options.batch_size)
    return max(2, min(threads, LocalRun.MAKING_BYTES // batch_bytes))
