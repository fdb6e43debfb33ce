"""`BatchIterator`: batches in a chunk-aware shuffled order, read ahead by background threads.

A run (`outcore.iterate.runs`) follows the epoch's batch schedule: chunk reads run ahead on a small
thread pool (the direct shard reader decodes outside the GIL), each batch is assembled from the loaded
chunks into new arrays, the transform applied, and finished batches wait for the consumer in a queue
of ``prefetch`` batches. Chunks are released after their last use, so memory is bounded by
`outcore.iterate.schedule.max_held` chunks plus ``prefetch`` batches, whatever the store's size. With a
Dask client, the same schedule runs as tasks on the cluster's workers instead (`outcore.iterate.cluster`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import OptionError
from ..storage import Store
from .batch import Batch, ChunkValues, batch_rng_key, make_batch
from .cluster import ClusterRun
from .options import BatchOptions
from .plan import Consumer, EpochPlan, batch_count, epoch_plan
from .readers import ChunkReader, check_batchable, chunk_readers
from .runs import LocalRun, Run, Work
from .schedule import max_held
from .stats import LoaderStats


class BatchIterator:
    """Iterate a store in batches: dicts of numpy arrays, one per field, samples on axis 0.

    Every epoch yields each of this consumer's samples exactly once, in an order that depends only
    on ``(seed, epoch, rank, world_size, worker, num_workers)``. A full pass moves to the next epoch;
    `set_epoch` chooses one. `state_dict` after k batches, loaded into a new iterator (in any
    process), continues with exactly the batches an uninterrupted run would have produced. Every batch
    is made of new arrays: keep them as long as you like.

    Made by `Dataset.batches`; ``worker`` of ``num_workers`` says which share of the rank's samples
    this iterator reads when a rank runs several loader workers (the torch adapter sets them). With a
    ``client`` in the options, the cluster's workers read, decode and augment the batches
    (`outcore.iterate.cluster`); they are identical to those of the local threads.

    >>> it = ds.batches(batch_size=256, shuffle=True, seed=0)  # doctest: +SKIP
    >>> for batch in it:  # doctest: +SKIP
    ...     train_step(batch["images"], batch["labels"])
    """

    def __init__(self, store: Store, options: BatchOptions, *, worker: int = 0, num_workers: int = 1) -> None:
        self.store, self.options = store, options
        self.fields = options.fields if options.fields is not None else store.fields
        unknown = [f for f in self.fields if f not in store]
        if unknown:
            raise KeyError(f"no field(s) {unknown} in {store.location}; fields: {list(store.fields)}")
        check_batchable(store, self.fields, options.transform)
        self.text_fields = frozenset(name for name in self.fields if store.info(name).is_text)
        self.consumer = Consumer(options.rank, options.world_size, worker, num_workers)
        self.epoch = 0
        self.batches_done = 0  # batches of the current epoch already handed out
        self._readers: dict[str, ChunkReader] | None = None  # opened at the first read
        self._active: Run | None = None
        self._stats = LoaderStats()
        self._random_access = _ChunkCache(max_held(options.buffer_chunks, options.batch_size, store.chunk_size, 0))
        self._stream = _ClusterStream()

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    # -- epochs and resumption ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration."""
        self.epoch, self.batches_done = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """Where this iterator stands: a few integers, JSON-serialisable."""
        return {"epoch": self.epoch, "batches_done": self.batches_done, **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the store and settings must match those it was taken with."""
        mismatched = {k: (state.get(k), v) for k, v in self._settings().items() if state.get(k) != v}
        if mismatched:
            raise OptionError(f"state does not match this iterator (saved, current): {mismatched}")
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])

    def _settings(self) -> dict[str, Any]:
        return {"num_samples": len(self.store), "chunk_size": self.store.chunk_size, **self.options.plan_settings(),
                "worker": self.consumer.worker, "num_workers": self.consumer.num_workers}

    # -- the plan ------------------------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This consumer's samples of ``epoch`` (default: the current one) in emission order."""
        options = self.options
        return epoch_plan(
            len(self.store), self.store.chunk_size, shuffle=options.shuffle, seed=options.seed,
            epoch=self.epoch if epoch is None else epoch, buffer_chunks=options.buffer_chunks,
            consumer=self.consumer, drop_last=options.drop_last,
        )

    def __len__(self) -> int:
        """Batches per epoch for this consumer."""
        return batch_count(len(self.store), self.consumer, self.batch_size, self.options.drop_last)

    # -- iteration -------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        self.close()
        if self.batches_done >= len(self):  # a finished epoch: move on
            self.set_epoch(self.epoch + 1)
        run = self._run(self.epoch, self.batches_done)
        self._active = run
        try:
            for batch in run:
                self.batches_done += 1
                yield batch
            self.set_epoch(self.epoch + 1)
        finally:
            run.close()
            if self._active is run:
                self._active = None

    def _run(self, epoch: int, first_batch: int) -> Run:
        work = Work(self.store, self.fields, self.text_fields, self.options, self.consumer, epoch, self.plan(epoch),
                    first_batch)
        if self.options.client is not None:
            return ClusterRun(work, self._stats)
        return LocalRun(work, self._stats, self.readers)

    @property
    def readers(self) -> dict[str, ChunkReader]:
        """The fields' chunk readers, opened at the first read (so an unused iterator holds no file or lock)."""
        if self._readers is None:
            self._readers = chunk_readers(self.store, self.fields, self.options.transform)
        return self._readers

    def batch(self, index: int) -> Batch:
        """Batch ``index`` of the current epoch, read on demand: for frameworks that ask for batches
        by index, in any order and from several threads (Keras). Recently used chunks are cached, so
        requests in roughly increasing order read each chunk once. Same batches as iterating. With a
        ``client``, batches come from a cluster run started at the requested batch, so requests should
        come in about increasing order (as Keras makes them).
        """
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is not in [0, {len(self)})")
        epoch = self.epoch
        if self.options.client is not None:
            return self._stream.get(self, epoch, index)
        plan = self._random_access.plan(self, epoch)
        samples = plan.samples[index * self.batch_size : (index + 1) * self.batch_size]
        chunks = samples // self.store.chunk_size
        data = {chunk: self._random_access.chunk(self, chunk) for chunk in np.unique(chunks).tolist()}
        return make_batch(samples, self.store.chunk_size, chunks, data, self.fields, self.text_fields,
                          self.options.transform, batch_rng_key(self.options.seed, epoch, self.consumer, index))

    def stats(self) -> dict[str, float]:
        """Is the consumer waiting for data? Figures since the iterator was made (or `reset_stats`).

        ``wait_mean_ms`` / ``wait_p95_ms``: time the consumer spent blocked on each batch (near 0 when
        the loader keeps ahead); ``ready_mean``: batches already waiting when one was asked for (near
        ``prefetch`` when the loader keeps ahead); ``wait_fraction``: waiting time / elapsed time.

        >>> it.stats()  # doctest: +SKIP
        {'batches': 171, 'samples': 44000, 'samples_per_s': 30510.2, 'wait_mean_ms': 0.4, ...}
        """
        return self._stats.summary()

    def reset_stats(self) -> None:
        self._stats = LoaderStats()

    def close(self) -> None:
        """Stop the background threads of an unfinished iteration (also done on ``break``)."""
        if self._active is not None:
            self._active.close()
            self._active = None
        self._stream.close()


class _ChunkCache:
    """The epoch plan and the most recently used chunks, for `BatchIterator.batch`; thread-safe."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        self.plans: dict[int, EpochPlan] = {}
        self.chunks: OrderedDict[int, ChunkValues] = OrderedDict()

    def plan(self, owner: BatchIterator, epoch: int) -> EpochPlan:
        with self.lock:
            if epoch not in self.plans:
                self.plans = {epoch: owner.plan(epoch)}
            return self.plans[epoch]

    def chunk(self, owner: BatchIterator, chunk: int) -> ChunkValues:
        with self.lock:
            if chunk in self.chunks:
                self.chunks.move_to_end(chunk)
                return self.chunks[chunk]
        values = {name: reader.read(chunk) for name, reader in owner.readers.items()}
        with self.lock:
            self.chunks[chunk] = values
            while len(self.chunks) > self.capacity:
                self.chunks.popitem(last=False)
        return values


class _ClusterStream:
    """`BatchIterator.batch` with a client: batches of a cluster run, for requests in about increasing
    order from several threads. A request behind the run, or far ahead of it, restarts it there."""

    SKIP_AHEAD = 8  # batches a run may make unasked before a restart is cheaper

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.run: Run | None = None
        self.batches: Iterator[Batch] = iter(())
        self.epoch, self.next = -1, 0
        self.ready: dict[int, Batch] = {}  # made before they were asked for

    def get(self, owner: BatchIterator, epoch: int, index: int) -> Batch:
        with self.lock:
            if epoch == self.epoch and index in self.ready:
                return self.ready.pop(index)
            if self.run is None or epoch != self.epoch or not self.next <= index <= self.next + self.SKIP_AHEAD:
                self.close()
                self.run = owner._run(epoch, index)
                self.batches, self.epoch, self.next = iter(self.run), epoch, index
            while True:
                batch, made = next(self.batches), self.next
                self.next += 1
                if made == index:
                    return batch
                self.ready[made] = batch

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
        self.run, self.ready = None, {}
