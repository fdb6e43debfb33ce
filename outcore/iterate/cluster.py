"""Batches made on a Dask cluster: its workers read, decode and augment; the consumer only receives.

``ds.batches(..., client=client)`` turns the batch schedule (`outcore.iterate.schedule`) into two kinds
of tasks, submitted in plan order:

- ``outcore-chunk-…``: read one chunk of every field. The worker opens the store itself — a path
  every worker sees, or an fsspec URL — so the data is never sent from the consumer. Encoded images
  stay encoded (`outcore.imaging.EncodedChunk`): when a batch task runs on another worker, only the
  JPEG bytes travel, about 8x less than pixels.
- ``outcore-batch-…``: take one batch's samples from the chunk results it depends on, decoding the
  encoded ones, and apply the transform with the generator seeded by ``(seed, epoch, rank,
  step)``, exactly as the local threads do: the batches are identical, pixel for pixel.

At most ``prefetch`` + (worker threads) batch tasks are pending, so every worker thread has a batch
to make while ``prefetch`` finished ones wait, and chunk reads run ahead of them by one more chunk per
worker thread; a chunk result is released as soon as the last batch that needs it has been
submitted, so the cluster holds at most `outcore.iterate.schedule.max_held` chunks (read-ahead:
threads + 1).
A background thread gathers finished batches in order into the consumer's queue.

If a worker dies, Dask reruns its tasks (and recomputes the chunks it held) on the others: the epoch
still yields every sample once, in the planned order. If the whole cluster goes away, the consumer
gets a `ClusterError`; the iterator's `state_dict` then says how far it got, to resume elsewhere.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from uuid import uuid4

import numpy as np
from dask.base import tokenize

from ..errors import ClusterError, NotAStoreError
from ..imaging import DecodedChunks
from ..storage import Store
from ..threads import available_cpus, cap_threads
from .batch import Batch, ChunkValues, Recipe, make_batch
from .readers import ChunkReader, chunk_reader
from .runs import WAKE_SECONDS, Run, Work
from .stats import LoaderStats


@dataclass(frozen=True)
class StoreFields:
    """What a worker reads: ``fields`` of the store at ``location``, opened by ``opener`` (with the settings it
    was opened with); ``identity`` tells rewritten stores apart."""

    location: str
    fields: tuple[str, ...]
    identity: str
    opener: Callable[[], Store] = field(compare=False, repr=False)


class ClusterRun(Run):
    """One pass over an epoch's batches, made by the workers of the options' ``client``."""

    def __init__(self, work: Work, stats: LoaderStats) -> None:
        store = work.store
        self.client = work.options.client
        self.source = StoreFields(store.location, work.recipe.fields, tokenize(store.location, store.attrs.to_dict()),
                                  store.opener)
        self.name = f"{uuid4().hex[:8]}-e{work.epoch}"  # task keys: outcore-chunk-<name>-<chunk>, outcore-batch-<name>-<i>
        self.chunks: dict[int, Any] = {}  # slot -> future of its chunk
        self.pending: deque[Any] = deque()
        self.gathered = 0
        super().__init__(work, stats)

    def _produce_batches(self) -> None:
        try:
            self._submit_and_gather()
        except _cluster_lost() as error:
            raise self._lost(error) from error

    def _submit_and_gather(self) -> None:
        work, client = self.work, self.client
        threads = max(1, sum(client.nthreads().values()))
        in_flight = work.options.prefetch + threads
        for step in work.steps(read_ahead=threads + 1):
            if self.stop.is_set():
                return
            for slot in step.load:
                chunk = int(work.plan.chunks[slot])
                self.chunks[slot] = client.submit(read_chunk, self.source, chunk,  # slots of one chunk share it
                                                  key=f"outcore-chunk-{self.name}-{chunk}")
            self.pending.append(client.submit(
                batch_task, work.recipe, step.samples, work.store.chunk_size, step.slots, step.used,
                work.rng_key(step.index), *[self.chunks[slot] for slot in step.used],
                key=f"outcore-batch-{self.name}-{step.index}",
            ))
            for slot in step.release:
                del self.chunks[slot]  # its batches hold it on the cluster until they have run
            if len(self.pending) >= in_flight and not self._deliver():
                return
        while self.pending:
            if not self._deliver():
                return

    def _deliver(self) -> bool:
        """Hand the oldest pending batch to the consumer once it is made; False when the run was closed
        meanwhile (a closed run never waits on the cluster)."""
        future = self.pending[0]
        while not future.done():
            if self.stop.wait(WAKE_SECONDS):
                return False
        batch = self.pending.popleft().result()
        self.gathered += 1
        return self._put(batch)

    def _lost(self, error: BaseException) -> ClusterError:
        index = self.work.batches[self.gathered]
        return ClusterError(
            f"lost the Dask cluster while making batch {index} of epoch {self.work.epoch} "
            f"({type(error).__name__}: {error}). The batches before it were delivered, and the iterator's "
            "state_dict() says so: load it into a new iterator (with a new client, or none) to continue from "
            "there. A KilledWorker means a task's workers kept dying: give them more memory."
        )

    def _release(self) -> None:
        futures = [*self.pending, *self.chunks.values()]
        self.pending.clear()
        self.chunks.clear()
        if futures and self.client.status == "running" and not sys.is_finalizing():
            self.client.cancel(futures)


def _cluster_lost() -> tuple[type[BaseException], ...]:
    """What a client raises when its cluster is gone, or keeps losing the workers that run a task."""
    from distributed import KilledWorker
    from distributed.client import ClosedClientError
    from distributed.comm import CommClosedError

    return (CancelledError, ClosedClientError, CommClosedError, KilledWorker, TimeoutError)


def read_chunk(source: StoreFields, chunk: int) -> dict[str, ChunkValues]:
    """On a worker: chunk ``chunk`` of every field; encoded images stay encoded until a batch takes them."""
    readers = _readers(source)
    return {name: reader.read_encoded(chunk) if isinstance(reader, DecodedChunks) else reader.read(chunk)
            for name, reader in readers.items()}


def batch_task(recipe: Recipe, samples: np.ndarray, chunk_size: int, slots: np.ndarray, used: list[int],
               rng_key: tuple[int, ...], *values: ChunkValues) -> Batch:
    """On a worker: one batch from the chunks it draws on (decoding its encoded samples), augmented as the
    local path would, on as many threads as the cluster gave the worker."""
    cap_threads(_worker_threads())
    return make_batch(recipe, samples, chunk_size, slots, dict(zip(used, values, strict=True)), rng_key)


@lru_cache(maxsize=8)
def _readers(source: StoreFields) -> dict[str, ChunkReader]:
    """The worker's readers of a store, opened once per worker process (shard indexes stay cached); its
    reads and decodes use as many threads as the cluster gave the worker."""
    cap_threads(_worker_threads())
    try:
        store = source.opener()
    except NotAStoreError as error:
        raise NotAStoreError(
            f"Dask worker {_worker_address()} cannot open the store: {error}. Workers read the store "
            "themselves: put it where every worker sees it at the same path (a shared filesystem), or open "
            "it by URL (s3://…, gs://…)"
        ) from None
    return {name: chunk_reader(store, name) for name in source.fields}


def _worker_threads() -> int:
    from distributed import get_worker

    try:
        return get_worker().state.nthreads
    except ValueError:  # not in a worker
        return available_cpus()


def _worker_address() -> str:
    from distributed import get_worker

    try:
        return get_worker().address
    except ValueError:
        return "(not in a worker)"
