"""Runs: one pass over an epoch's batches, made by a producer thread and handed to the consumer
through a queue of ``prefetch`` batches. `LocalRun` makes them in this process; `ClusterRun`
(`outcore.iterate.cluster`) on a Dask cluster. Both follow the same schedule (`outcore.iterate.schedule`).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..storage import Store
from .batch import Batch, batch_rng_key, make_batch
from .options import BatchOptions
from .plan import Consumer, EpochPlan
from .readers import ChunkReader
from .schedule import BatchStep, schedule
from .stats import LoaderStats


@dataclass(frozen=True)
class Work:
    """What a run makes: batches ``first_batch, ...`` of ``plan``, epoch ``epoch`` of ``consumer``."""

    store: Store
    fields: tuple[str, ...]
    text_fields: frozenset[str]
    options: BatchOptions
    consumer: Consumer
    epoch: int
    plan: EpochPlan
    first_batch: int

    def steps(self, read_ahead: int) -> Iterator[BatchStep]:
        return schedule(self.plan, self.options.batch_size, drop_last=self.options.drop_last,
                        read_ahead=read_ahead, first_batch=self.first_batch)

    def rng_key(self, index: int) -> tuple[int, ...]:
        """The seed of batch ``index``'s augmentation generator: the same wherever the batch is made."""
        return batch_rng_key(self.options.seed, self.epoch, self.consumer, index)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class Run:
    """A producer thread that makes the batches (`_produce_batches`, by a subclass) and a queue of
    ``prefetch`` finished batches that the consumer takes them from."""

    def __init__(self, work: Work, stats: LoaderStats) -> None:
        self.work, self.stats = work, stats
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=work.options.prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="outcore-batches", daemon=True)
        self.thread.start()

    def __iter__(self) -> Iterator[Batch]:
        while True:
            began = time.perf_counter()
            ready = self.queue.qsize()
            item = self.queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            self.stats.record(time.perf_counter() - began, ready, len(next(iter(item.values()))))
            yield item

    def close(self) -> None:
        """Stop the producer and free what it used. At interpreter exit the threads are frozen, not stopped
        (Python 3.13 finalizes an unfinished generator after that): nothing is waited for then."""
        self.stop.set()
        while self.thread.is_alive() and not sys.is_finalizing():
            try:  # unblock a producer waiting for room in the queue
                self.queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._release()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            self._produce_batches()
            self._put(_DONE)
        except BaseException as error:  # noqa: BLE001 - any failure must reach the consumer, which raises it
            self._put(_Failure(error))

    def _produce_batches(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the producer used, once it has stopped."""


class ChunkBuffers:
    """The run's own chunk buffers, one list of free ones per field: a buffer is taken to read a chunk
    into and given back when the schedule releases that chunk. Batches never share memory with them."""

    def __init__(self, readers: dict[str, ChunkReader]) -> None:
        self.readers = readers
        self.free: dict[str, list[np.ndarray]] = {name: [] for name in readers}
        self.lock = threading.Lock()

    def take(self, field: str) -> np.ndarray:
        with self.lock:
            if self.free[field]:
                return self.free[field].pop()
        return self.readers[field].empty()

    def give(self, buffers: dict[str, np.ndarray]) -> None:
        with self.lock:
            for field, buffer in buffers.items():
                self.free[field].append(buffer)


class LocalRun(Run):
    """Batches made in this process: chunk reads on a small thread pool, assembly on the producer thread."""

    READ_AHEAD = 2  # slots read beyond those the next batch needs
    READ_THREADS = 2

    def __init__(self, work: Work, stats: LoaderStats, readers: dict[str, ChunkReader]) -> None:
        self.readers = readers
        self.buffers = ChunkBuffers(readers)
        self.pool = ThreadPoolExecutor(max_workers=self.READ_THREADS, thread_name_prefix="outcore-read")
        super().__init__(work, stats)

    def _release(self) -> None:
        self.pool.shutdown(wait=not sys.is_finalizing(), cancel_futures=True)

    def _produce_batches(self) -> None:
        work = self.work
        text_fields, chunk_size = work.text_fields, work.store.chunk_size
        loading: dict[int, Future[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]] = {}
        for step in work.steps(self.READ_AHEAD):
            if self.stop.is_set():
                return
            for slot in step.load:
                loading[slot] = self.pool.submit(self._read, int(work.plan.chunks[slot]))
            data = {slot: loading[slot].result()[0] for slot in np.unique(step.slots).tolist()}
            batch = make_batch(step.samples, chunk_size, step.slots, data, work.fields, text_fields,
                               work.options.transform, work.rng_key(step.index))
            for slot in step.release:
                self.buffers.give(loading.pop(slot).result()[1])
            if not self._put(batch):
                return

    def _read(self, chunk: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Chunk ``chunk`` of every field, read into the run's buffers: ``(values, buffers)``."""
        buffers = {name: self.buffers.take(name) for name in self.readers}
        return {name: reader.read(chunk, out=buffers[name]) for name, reader in self.readers.items()}, buffers
