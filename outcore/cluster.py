"""Batches made on a Dask cluster: its workers read, decode and augment; the consumer only receives.

``ds.batches(..., client=client)`` turns the epoch plan (`outcore.shuffle`) into two kinds of tasks,
submitted in plan order:

- ``outcore-chunk-…``: read one chunk of every field. The worker opens the store itself — a path
  every worker sees, or an fsspec URL — so the data is never sent from the consumer. Encoded images
  stay encoded (`outcore.encoded.EncodedChunk`): when a batch task runs on another worker, only the
  JPEG bytes travel, about 8x less than pixels.
- ``outcore-batch-…``: take one batch's samples from the chunk results it depends on, decoding the
  encoded ones, and apply the transform with the generator seeded by ``(seed, epoch, consumer,
  batch)``, exactly as the local threads do: the batches are identical, pixel for pixel.

At most ``prefetch`` + (worker threads) batch tasks are pending, so every worker thread has a batch
to make while ``prefetch`` finished ones wait, and chunk reads run ahead of them by one more chunk per
worker thread; a chunk result is released as soon as the last batch that needs it has been
submitted, so the cluster holds about ``buffer_chunks`` + 2 x threads chunks.
A background thread gathers finished batches in order into the consumer's queue.

If a worker dies, Dask reruns its tasks (and recomputes the chunks it held) on the others: the epoch
still yields every sample once, in the planned order. If the whole cluster goes away, the consumer
gets a `ClusterError`; the iterator's `state_dict` then says how far it got, to resume elsewhere.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import CancelledError
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING
from uuid import uuid4

import numpy as np
from dask.base import tokenize
from distributed import Future, KilledWorker, get_worker
from distributed.client import ClosedClientError
from distributed.comm import CommClosedError

from .encoded import EncodedChunk, EncodedChunks
from .errors import ClusterError, NotAStoreError
from .loader import Batch, Run, Transform, apply_transform, as_consumed, assemble, new_array

if TYPE_CHECKING:
    from .chunks import FieldChunks
    from .loader import BatchIterator
    from .shuffle import EpochPlan

# what a client raises when its cluster is gone, or keeps losing the workers that run a task
_CLUSTER_LOST = (CancelledError, ClosedClientError, CommClosedError, KilledWorker, TimeoutError)


@dataclass(frozen=True)
class StoreFields:
    """What a worker reads: ``fields`` of the store at ``location`` (``identity`` tells rewritten stores apart)."""

    location: str
    fields: tuple[str, ...]
    text_fields: frozenset[str]
    identity: str


class ClusterRun(Run):
    """One pass over an epoch's batches, made by the workers of ``owner.client``."""

    def __init__(self, owner: BatchIterator, plan: EpochPlan, epoch: int, first_batch: int, total: int) -> None:
        dataset = owner.dataset
        self.client = owner.client
        self.store = StoreFields(dataset.location, owner.fields, frozenset(owner._text_fields),
                                 tokenize(dataset.location, dataset.attrs.to_dict()))
        self.name = f"{uuid4().hex[:8]}-e{epoch}"  # task keys: outcore-chunk-<name>-<chunk>, outcore-batch-<name>-<i>
        self.chunks: dict[int, Future] = {}
        self.pending: deque[Future] = deque()
        self.delivered = 0
        super().__init__(owner, plan, epoch, first_batch, total)

    def _produce_batches(self) -> None:
        try:
            self._submit_and_gather()
        except _CLUSTER_LOST as error:
            raise self._lost(error) from error

    def _submit_and_gather(self) -> None:
        owner, plan, client = self.owner, self.plan, self.client
        chunk_size, batch_size = owner.dataset.chunk_size, owner.batch_size
        slot = {int(c): j for j, c in enumerate(plan.chunks)}
        threads = max(1, sum(client.nthreads().values()))
        read_ahead, in_flight = threads + 1, self.owner.prefetch + threads
        next_read = 0
        for index in range(self.first_batch, self.total):
            if self.stop.is_set():
                return
            samples = plan.samples[index * batch_size : (index + 1) * batch_size]
            used = np.unique(samples // chunk_size).tolist()
            needed = max(slot[c] for c in used)
            while next_read < len(plan.chunks) and next_read <= needed + read_ahead:
                chunk = int(plan.chunks[next_read])
                self.chunks[next_read] = client.submit(
                    read_chunk, self.store, chunk, key=f"outcore-chunk-{self.name}-{chunk}")
                next_read += 1
            self.pending.append(client.submit(
                make_batch, samples, chunk_size, used, owner.fields, owner.transform,
                owner.rng_key(self.epoch, index), *[self.chunks[slot[c]] for c in used],
                key=f"outcore-batch-{self.name}-{index}",
            ))
            for j in [j for j in self.chunks if plan.last_use[j] < (index + 1) * batch_size]:
                del self.chunks[j]  # its batches hold it on the cluster until they have run
            if len(self.pending) >= in_flight and not self._deliver():
                return
        while self.pending:
            if not self._deliver():
                return

    def _deliver(self) -> bool:
        batch = self.pending.popleft().result()
        self.delivered += 1
        return self._put(batch)

    def _lost(self, error: BaseException) -> ClusterError:
        index = self.first_batch + self.delivered
        return ClusterError(
            f"lost the Dask cluster while making batch {index} of epoch {self.epoch} "
            f"({type(error).__name__}: {error}). The batches before it were delivered, and the iterator's "
            "state_dict() says so: load it into a new iterator (with a new client, or none) to continue from "
            "there. A KilledWorker means a task's workers kept dying: give them more memory."
        )

    def _release(self) -> None:
        futures = [*self.pending, *self.chunks.values()]
        self.pending.clear()
        self.chunks.clear()
        if futures and self.client.status == "running":
            self.client.cancel(futures)


def read_chunk(store: StoreFields, chunk: int) -> dict[str, np.ndarray | EncodedChunk]:
    """On a worker: chunk ``chunk`` of every field; encoded images stay encoded until a batch takes them."""
    readers = _readers(store)
    return {
        name: readers[name].read_encoded(chunk) if isinstance(readers[name], EncodedChunks)
        else as_consumed(readers[name].read(chunk), name in store.text_fields)
        for name in store.fields
    }


def make_batch(
    samples: np.ndarray, chunk_size: int, chunks: list[int], fields: tuple[str, ...], transform: Transform | None,
    rng_key: list[int], *values: dict[str, np.ndarray | EncodedChunk],
) -> Batch:
    """On a worker: one batch from the chunks it draws on (decoding its encoded samples), augmented as the
    local path would."""
    batch = assemble(samples, chunk_size, dict(zip(chunks, values, strict=True)), fields, new_array)
    return apply_transform(transform, batch, rng_key)


@lru_cache(maxsize=8)
def _readers(store: StoreFields) -> dict[str, FieldChunks | EncodedChunks]:
    """The worker's readers of a store, opened once per worker process (shard indexes stay cached)."""
    from .dataset import open_dataset

    try:
        dataset = open_dataset(store.location)
    except NotAStoreError as error:
        raise NotAStoreError(
            f"Dask worker {_worker_address()} cannot open the store: {error}. Workers read the store "
            "themselves: put it where every worker sees it at the same path (a shared filesystem), or open "
            "it by URL (s3://…, gs://…)"
        ) from None
    return {name: dataset.chunk_reader(name) for name in store.fields}


def _worker_address() -> str:
    try:
        return get_worker().address
    except ValueError:
        return "(not in a worker)"
