"""`BatchIterator`: batches in a chunk-aware shuffled order, read ahead by background threads.

A run (`outcore.iterate.runs`) follows the epoch's batch schedule: chunk reads run ahead on the
process's thread pool (the direct shard reader decodes outside the GIL), each batch is assembled from
the loaded chunks into new arrays, the transform applied, and finished batches wait for the consumer
in a queue of ``prefetch`` batches. Chunks are released after their last use, so memory is bounded by
`outcore.iterate.schedule.max_held` chunks plus ``prefetch`` batches, whatever the store's size. With a
Dask client, the same schedule runs as tasks on the cluster's workers instead (`outcore.iterate.cluster`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..storage import Store
from .batch import Batch, Empty, check_fields, plain
from .cluster import ClusterRun
from .native_run import native_run
from .options import BatchOptions, check_state
from .plan import EpochPlan
from .process import LoaderProcess, LoaderProcesses, PartsRun, ProcessRun, StartingRun, kept_loader
from .readers import ChunkReader, chunk_readers, recipe
from .runs import ChunkBuffers, LocalRun, NextEpoch, Run, Work
from .stats import LoaderStats


class BatchIterator:
    """Iterate a store in batches: dicts of numpy arrays, one per field, samples on axis 0.

    Every epoch yields each of this rank's samples exactly once, in an order that depends only on
    ``(seed, epoch, rank, world_size, batch_size, streams)``; the union of the ranks' batches at each step
    depends on the global batch size (``batch_size x world_size``) only, not on the number of ranks
    (`outcore.iterate.plan`). A full pass moves to the next epoch; `set_epoch` chooses one. `state_dict`
    after k batches, loaded into a new iterator (in any process, on any number of ranks with the same
    global batch size), continues with exactly the global steps an uninterrupted run would have made.
    Every batch is made of new arrays: keep them as long as you like.

    One iteration runs at a time: a new ``iter()`` closes the one before, and a consumer still waiting
    on that one gets `outcore.IterationClosedError` (as does one waiting when `close` is called).

    Made by `Dataset.batches`. With a
    ``client`` in the options, the cluster's workers read, decode and augment the batches
    (`outcore.iterate.cluster`); they are identical to those of the local threads. From the second epoch
    on, the threads (or a cluster) start the next epoch as this one drains, so that its first batch is
    ready when asked for (`outcore.iterate.runs.NextEpoch`): `close` the iterator when done.

    >>> it = ds.batches(batch_size=256, shuffle=True, seed=0)  # doctest: +SKIP
    >>> for batch in it:  # doctest: +SKIP
    ...     train_step(batch["images"], batch["labels"])
    """

    def __init__(self, store: Store, options: BatchOptions,
                 loader_process: LoaderProcess | LoaderProcesses | None = None) -> None:
        self.store, self.options = store, options
        fields = options.fields if options.fields is not None else store.fields
        unknown = [f for f in fields if f not in store]
        if unknown:
            raise KeyError(f"no field(s) {unknown} in {store.location}; fields: {list(store.fields)}")
        check_fields(options.transform, fields)
        self.recipe = recipe(store, fields, options.transform, options.decode)
        self.num_samples = options.num_samples(len(store))  # an epoch's: the store's, or the subset's
        self.epoch = 0
        self.batches_done = 0  # batches of the current epoch already handed out
        self._buffers: ChunkBuffers | None = None  # the fields' readers, opened at the first read, and their buffers
        self._active: Run | None = None
        self._next = NextEpoch()  # the next epoch's run, started as this one's drains
        self._stats = LoaderStats()
        self.empty: Empty = plain  # what makes the arrays of the batches it hands out, iterated or read on demand
        # (`batch`): pinned memory, for an adapter feeding a GPU (`outcore.adapters.keras`)
        # with ``process``: the process making the batches (``loader_process``, its owner's: kept across iterators)
        self._process, self._own_process = loader_process, loader_process is None
        if options.process and loader_process is None:
            self._process = kept_loader(self, options)

    @property
    def fields(self) -> tuple[str, ...]:
        return self.recipe.fields

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    # -- epochs and resumption ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration."""
        self.epoch, self.batches_done = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """Where this iterator stands: a few integers, JSON-serialisable."""
        return {"epoch": self.epoch, "batches_done": self.batches_done, **self.settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the store and settings must match those it was taken with (left out,
        ``streams`` are the state's: `BatchOptions.resuming`)."""
        options = self.options.resuming(state)
        if options != self.options:  # a next epoch started ahead was made in another order
            self._next.close()
            self.options = options
        check_state(state, self.settings(), "iterator")
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])

    def settings(self) -> dict[str, Any]:
        """What fixes the order of every epoch: a state must have been taken with the same."""
        return {"num_samples": len(self.store), "chunk_size": self.store.chunk_size, **self.options.plan_settings()}

    # -- the plan ------------------------------------------------------------------------------------------

    def plan(self, epoch: int | None = None, part: tuple[int, int] = (0, 1)) -> EpochPlan:
        """This rank's samples of ``epoch`` (default: the current one) in emission order (with ``part``, those of
        that part of each batch: `EpochPlan`)."""
        return self.options.plan(len(self.store), self.store.chunk_size, self.epoch if epoch is None else epoch, part)

    def __len__(self) -> int:
        """Batches per epoch of this rank: the same on every rank (the global steps)."""
        return self.options.steps(self.num_samples)

    # -- iteration -------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        if self.batches_done >= len(self):  # a finished epoch: move on
            self.set_epoch(self.epoch + 1)
        total = len(self)
        steps = range(total)[self.batches_done :]
        run = self._next.take(self.epoch, steps) or self.run(self.epoch, steps, empty=self.empty)
        previous, self._active = self._active, run
        if previous is not None:
            previous.close()
        try:
            for batch in run:
                self.batches_done += 1
                self._next.handed(run, self.batches_done == total,
                                  lambda: self.run(self.epoch + 1, range(total), empty=self.empty))
                yield batch
            self.set_epoch(self.epoch + 1)
        finally:
            run.close()
            if self._active is run:
                self._active = None

    def run(self, epoch: int, steps: Sequence[int], part: tuple[int, int] = (0, 1),
            allocator: Callable[[int], Empty] | None = None,
            empty: Empty = plain) -> Run | ProcessRun | PartsRun | StartingRun:
        """A run making the rank's batches ``steps`` (increasing) of ``epoch`` (with ``part``, that part of each;
        with ``allocator``, each step's arrays made by what it gives for the step, else by ``empty``): iterate it
        for the batches, close it when done (a DataLoader worker makes its turns or its parts so)."""
        work = Work(self.store, self.recipe, self.options, epoch, self.plan(epoch, part), steps, allocator, empty)
        if self.options.client is not None:
            return ClusterRun(work, self._stats)
        if self._process is not None:
            if self._process.ready() or self.options.skip_damaged:  # a chunk left out is said by one run only
                return self._process.run(work, self._stats)
            return StartingRun(self._process, work, self._stats, LocalRun(work, self._stats, self.buffers))
        return native_run(work, self._stats, self.buffers) or LocalRun(work, self._stats, self.buffers)

    @property
    def buffers(self) -> ChunkBuffers:
        """The fields' chunk readers, opened at the first read (so an unused iterator holds no file or lock), and
        the buffers each run reads chunks into."""
        if self._buffers is None:
            self._buffers = ChunkBuffers(chunk_readers(self.store, self.recipe.fields))
        return self._buffers

    @property
    def readers(self) -> dict[str, ChunkReader]:
        """The fields' chunk readers."""
        return self.buffers.readers

    def batch(self, index: int, epoch: int | None = None) -> Batch:
        """Batch ``index`` of ``epoch`` (default: the current one), read on demand: the batch that iterating
        would make, by a run of that one batch (it reads the chunks that batch draws on, about
        ``buffer_chunks`` of them). For a whole epoch, iterate: it reads each chunk once.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is not in [0, {len(self)})")
        run = self.run(self.epoch if epoch is None else epoch, [index], empty=self.empty)
        try:
            return next(iter(run))
        finally:
            run.close()

    def stats(self) -> dict[str, float]:
        """Is the consumer waiting for data? Figures since the iterator was made (or `reset_stats`).

        ``wait_mean_ms`` / ``wait_p95_ms``: time the consumer spent blocked on each batch (near 0 when
        the loader keeps ahead); ``ready_mean``: batches already waiting when one was asked for (near
        ``prefetch`` when the loader keeps ahead); ``wait_fraction``: waiting time / elapsed time. With a
        ``client``, also how the cluster's batches (or lanes' parts) reached this process:
        ``batches_shared_memory`` (from workers on this machine), ``batches_straight`` (over sockets
        straight from their workers), ``batches_through_scheduler``; and ``spans_hedged``: spans made
        again on other workers because theirs was late (`outcore.iterate.hedge`). Where batches are made in
        this process: ``transform_share``, the share of making them spent in the transform after a crop done
        as they are made (your own Python transform's share, if it is one: high means its Python holds the
        GIL, and DataLoader workers would help); ``threads``, the pool's threads; ``threads_busy_limit``, how
        many it keeps busy at most now (fewer when threads wait for the GIL or a core); ``threads_cpu_share``,
        their CPU time over their wall time when last measured.

        >>> it.stats()  # doctest: +SKIP
        {'batches': 171, 'samples': 44000, 'samples_per_s': 30510.2, 'wait_mean_ms': 0.4, ...}
        """
        return self._stats.summary()

    def reset_stats(self) -> None:
        self._stats = LoaderStats()

    def close(self) -> None:
        """Stop the background threads of an unfinished iteration (also done on ``break``), and end the process
        making the batches (``process=True``: the next iteration starts another); a consumer waiting on it gets
        `outcore.IterationClosedError`."""
        self._next.close()
        if self._active is not None:
            self._active.close()
            self._active = None
        if self._process is not None and self._own_process:
            self._process.close()
