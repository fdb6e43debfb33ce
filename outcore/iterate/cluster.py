"""Batches made on a Dask cluster: its workers read, decode, augment and assemble; the consumer only receives.

``ds.batches(..., client=client)`` cuts the rank's batches into **spans** of consecutive batches (about
`SPAN_SAMPLES` samples each) and submits one task per span, in order: the worker that runs it opens
the store itself (a path every worker sees, or an object-store URL, so the data is never sent from
the consumer), reads the chunks its batches draw on, each once, following the batch schedule
(`outcore.iterate.schedule`), and makes the batches exactly as the local threads do (each piece's
transform generator seeded by ``(seed, epoch, step, stream)``): the batches are identical, pixel for pixel.

Why spans: a Dask task costs its worker about 1-3 ms of event-loop work (messages, bookkeeping)
whatever it does, and a task that needs another task's result adds a transfer. A span is one task and
no transfer: that cost is spread over hundreds of samples, and a worker spends 1.2-1.35x what the
decoding itself needs, against 1.4-1.95x with a task per chunk and per batch (`benchmarks/cluster.py`
measures both). The price: a chunk whose samples fall in two
spans is read by both (its compressed bytes; small next to decoding for encoded images, more for
pixel stores, where local threads are the faster path anyway).

Delivery: a worker on the consumer's machine makes each batch straight into shared memory and sends
only the files' names (`outcore.iterate.shared`); the consumer maps them, without a copy or a socket. A
worker elsewhere sends the batch over Dask's sockets. Either way the batches are the same.

At most twice as many spans as the cluster has worker threads are submitted and not yet received
(measured on 16 cores: 10 % faster at 8 workers than one more span than threads, since spans finish out
of order and only the oldest can be handed over), so every worker thread has a span to make while
finished ones wait: at most that many times `SPAN_BYTES` of batches are held. Several consumers (the ranks of a job, each with its own
``rank``) can share one cluster: each submits its own spans, of its own share of the epoch.

From an iterator's second epoch on, the next epoch's run starts once this one has submitted its last
span (`outcore.iterate.runs.NextEpoch`), so workers do not wait at epoch boundaries.

If a worker dies, Dask reruns its spans on the others: the epoch still yields every sample once, in
the planned order. If the whole cluster goes away, the consumer gets a `ClusterError`; the iterator's
`state_dict` then says how far it got, to resume elsewhere.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from uuid import uuid4

import numpy as np
from dask.base import tokenize

from ..errors import ClusterError, NotAStoreError
from ..storage import Store
from ..threads import available_cpus, cap_threads
from .batch import Batch, Draws, Recipe, make_batch, plain
from .readers import ChunkReader, chunk_readers, sample_bytes
from .runs import WAKE_SECONDS, ChunkBuffers, Run, Work
from .shared import Mailbox, SharedBatch, Slot
from .stats import LoaderStats

SPAN_SAMPLES = 2048  # samples per task: Dask's per-task cost becomes a small part of the work
SPAN_BYTES = 32 << 20  # but no more batch bytes than this per task: finished spans wait in memory


@dataclass(frozen=True)
class StoreFields:
    """What a worker reads: ``fields`` of the store at ``location``, opened by ``opener`` (with the settings it
    was opened with); ``identity`` tells rewritten stores apart."""

    location: str
    fields: tuple[str, ...]
    identity: str
    opener: Callable[[], Store] = field(compare=False, repr=False)


@dataclass(frozen=True)
class SpanStep:
    """One batch of a span: step ``index``, its ``samples``, the chunk each is read from and its pieces' draws
    (`outcore.iterate.batch.batch_draws`)."""

    index: int
    samples: np.ndarray
    chunks: np.ndarray
    draws: Draws


def span_batches(batch_size: int, sample_bytes: int, batches: int, threads: int) -> int:
    """How many batches a task makes: `SPAN_SAMPLES` samples' worth, as long as they hold at most
    `SPAN_BYTES`, and no fewer than two spans per worker thread when the run is short (so that every
    thread has work); at least one.

    >>> span_batches(256, 128 * 128 * 3, 5000, 8), span_batches(64, 224 * 224 * 3, 5000, 8)
    (2, 3)
    >>> span_batches(256, 128 * 128 * 3, 20, 8), span_batches(4096, 8, 5000, 8)
    (1, 1)
    """
    by_bytes = SPAN_BYTES // max(1, batch_size * sample_bytes)
    return max(1, min(math.ceil(SPAN_SAMPLES / batch_size), by_bytes, batches // (2 * threads)))


class ClusterRun(Run):
    """One pass over an epoch's batches, made by the workers of the options' ``client``."""

    def __init__(self, work: Work, stats: LoaderStats) -> None:
        store = work.store
        self.client = work.options.client
        self.source = StoreFields(store.location, work.recipe.fields, tokenize(store.location, store.attrs.to_dict()),
                                  store.opener)
        self.name = f"{uuid4().hex[:8]}-e{work.epoch}"  # task keys: outcore-span-<name>-<first step>
        self.mailbox = Mailbox.open()
        self.pending: deque[Any] = deque()  # futures of the spans submitted, in order
        self.gathered = 0
        super().__init__(work, stats)

    def _produce_batches(self) -> None:
        try:
            self._submit_and_gather()
        except _cluster_lost() as error:
            raise self._lost(error) from error

    def _submit_and_gather(self) -> None:
        work = self.work
        threads = max(1, sum(self.client.nthreads().values()))
        span = span_batches(work.options.batch_size, sample_bytes(work.store, work.recipe), len(work.batches), threads)
        steps: list[SpanStep] = []
        for step in work.steps(read_ahead=0):
            if self.stop.is_set():
                return
            steps.append(SpanStep(step.index, step.samples, work.plan.chunks[step.slots], work.draws(step)))
            if len(steps) == span:
                self._submit(steps)
                steps = []
            if len(self.pending) >= 2 * threads and not self._deliver():
                return
        if steps:
            self._submit(steps)
        self.under_way.set()
        while self.pending:
            if not self._deliver():
                return

    def _submit(self, steps: list[SpanStep]) -> None:
        slot = None if self.mailbox is None else self.mailbox.slot
        self.pending.append(self.client.submit(
            make_span, self.source, self.work.recipe, self.work.store.chunk_size, steps, slot,
            key=f"outcore-span-{self.name}-{steps[0].index}",
        ))

    def _deliver(self) -> bool:
        """Hand the oldest pending span's batches to the consumer once it is made; False when the run was
        closed meanwhile (a closed run never waits on the cluster)."""
        future = self.pending[0]
        while not future.done():
            if self.stop.wait(WAKE_SECONDS):
                return False
        made = self.pending.popleft().result()
        for batch in made:
            self.gathered += 1
            if not self._put(self.mailbox.receive(batch) if self.mailbox is not None else batch):
                return False
        return True

    def _lost(self, error: BaseException) -> ClusterError:
        index = self.work.batches[self.gathered]
        return ClusterError(
            f"lost the Dask cluster while making batch {index} of epoch {self.work.epoch} "
            f"({type(error).__name__}: {error}). The batches before it were delivered, and the iterator's "
            "state_dict() says so: load it into a new iterator (with a new client, or none) to continue from "
            "there. A KilledWorker means a task's workers kept dying: give them more memory."
        )

    def _release(self) -> None:
        futures = list(self.pending)
        self.pending.clear()
        if futures and self.client.status == "running" and not sys.is_finalizing():
            self.client.cancel(futures)
        if self.mailbox is not None:
            self.mailbox.close()


def _cluster_lost() -> tuple[type[BaseException], ...]:
    """What a client raises when its cluster is gone, or keeps losing the workers that run a task."""
    from distributed import KilledWorker
    from distributed.client import ClosedClientError
    from distributed.comm import CommClosedError

    return (CancelledError, ClosedClientError, CommClosedError, KilledWorker, TimeoutError)


def make_span(source: StoreFields, recipe: Recipe, chunk_size: int, steps: Sequence[SpanStep],
              slot: Slot | None) -> list[SharedBatch | Batch]:
    """On a worker: the span's batches, each chunk read once (and its buffer reused once no later batch of the
    span needs it), made as the local path makes them, on as many threads as the cluster gave the worker;
    into the consumer's shared memory when this worker sees it (`outcore.iterate.shared`)."""
    cap_threads(_worker_threads())
    readers = _readers(source)
    used = [np.unique(step.chunks).tolist() for step in steps]
    last_use = {chunk: i for i, chunks in enumerate(used) for chunk in chunks}
    released: list[list[int]] = [[] for _ in steps]  # after each batch, the chunks no later one needs
    for chunk, i in last_use.items():
        released[i].append(chunk)
    if any(reader.remote for reader in readers.values()):  # the span's bytes asked for at once, in order
        for reader in readers.values():
            reader.prefetch(list(last_use))
    buffers = ChunkBuffers(readers)
    loaded: dict[int, tuple[dict[str, Any], dict[str, np.ndarray]]] = {}
    made: list[SharedBatch | Batch] = []
    for step, chunks, release in zip(steps, used, released, strict=True):
        for chunk in chunks:
            if chunk not in loaded:
                loaded[chunk] = buffers.read(chunk)
        arena = slot.arena() if slot is not None else None
        batch = make_batch(recipe, step.samples, chunk_size, step.chunks, {c: v for c, (v, _) in loaded.items()},
                           step.draws, plain if arena is None else arena.empty)
        made.append(batch if arena is None else arena.publish(batch))
        for chunk in release:
            buffers.give(loaded.pop(chunk)[1])
    return made


@lru_cache(maxsize=8)
def _readers(source: StoreFields) -> dict[str, ChunkReader]:
    """The worker's readers of a store's fields as the iterator reads them, opened once per worker process
    (shard indexes stay cached)."""
    try:
        store = source.opener()
    except NotAStoreError as error:
        raise NotAStoreError(
            f"Dask worker {_worker_address()} cannot open the store: {error}. Workers read the store "
            "themselves: put it where every worker sees it at the same path (a shared filesystem), or open "
            "it by URL (s3://…, gs://…)"
        ) from None
    return chunk_readers(store, source.fields)


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
