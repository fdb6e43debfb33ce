"""PyTorch: an ``IterableDataset`` of whole batches, sharded over DataLoader workers and DDP ranks.

`TorchBatches` holds plain values only — where the store is, the batch options, the epoch and where
each worker resumes — so a DataLoader may start its workers by fork, spawn or forkserver: each worker
opens the store itself, reads and decodes on its own share of the CPUs (`outcore.threads.share_cpus`),
started inside the worker (a process that forks while holding running threads can deadlock its
children), and makes its turns of the rank's batches: worker ``w`` of ``n`` makes batches ``w, w + n, ...``
(from where the epoch resumes), the order in which the DataLoader asks its workers, so the rank's
batches are the same whatever the number of workers. Under `outcore.adapters.torch.OutcoreLoader`,
where the rank has a stream for each worker and there is shared memory (`split_batches`), worker ``w``
makes instead part ``w`` of every batch, written at its rows of the batch's files in shared memory
(`outcore.iterate.shared.Part`), and the loader joins the parts: each worker reads only its streams'
chunks. Ranks read disjoint shares of each epoch and make the same number of batches (`outcore.iterate.plan`); the union of their batches at each step depends
on the global batch size only, so a state saved on some number of ranks and workers resumes on others.

The rank and world size are those given, or else ``torch.distributed``'s when an iteration starts (or
``len`` is asked): a loader built before ``init_process_group`` still shards.

Workers that persist across epochs (``persistent_workers=True``) received the dataset once: the epoch
and where it resumes reach them through a small shared array (`EpochBoard`) that the loader writes
before each iteration, and each keeps its store open from one epoch to the next.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Unpack

import numpy as np

from ..errors import OptionError
from ..iterate import BatchIterator, BatchKeywords, BatchOptions, Consumer, check_fields
from ..iterate.batch import Empty, plain
from ..iterate.process import kept_loader
from ..iterate.runs import NextEpoch
from ..iterate.shared import Arena, Part, SharedBatch, Slot
from ..storage import Store
from ..threads import share_cpus
from .torch_module import IterableDataset, get_worker_info, torch

PART_FILE = "part-p"  # files of a batch that loader workers write parts of: part-p<pass>-e<epoch>-s<step>-<field>
BOARD_CAPACITY = 64  # batches per worker that a DataLoader with in_order=False may deliver ahead of the oldest one
REBUILT = (
    "a DataLoader rebuilt from the loader of ds.torch(...) (accelerator.prepare(loader) or a framework's "
    "setup_dataloaders does that) would read this rank's share of each batch and then shard it again, "
    "losing or repeating samples: do not prepare the loader; prepare the model and optimizer, iterate the "
    "loader as it is and move each batch to the device (docs/howto/trainers.md). For a DataLoader of your "
    "own, use DataLoader(outcore.adapters.torch.TorchBatches(...), batch_size=None)"
)
PROCESS_AND_WORKERS = (
    "process= makes the batches in processes of their own, num_workers= in DataLoader workers: leave one of "
    "them out (with process=, their threads use every core)"
)
CLIENT_IN_WORKERS = (
    "with client=, the Dask workers read, decode and augment, and batches arrive in the main process: "
    "use num_workers=0 (DataLoader worker processes cannot share the client)"
)


class TorchBatch(dict):
    """A batch (field name -> tensor; text fields stay numpy strings) that knows where it comes from:
    ``epoch``, ``worker`` (the loader worker that made it), ``index`` (its step: the rank's batch ``index``
    of the epoch) and ``samples``, the store's indices of its samples (where each prediction belongs).
    ``TorchBatch(values)`` alone, as frameworks rebuild a mapping they moved to a device (Lightning,
    Accelerate), knows none of them (None)."""

    def __init__(self, values: Mapping[str, Any], epoch: int | None = None, worker: int | None = None,
                 index: int | None = None, samples: np.ndarray | None = None, part: int | None = None) -> None:
        super().__init__(values)
        self.epoch, self.worker, self.index, self.samples = epoch, worker, index, samples
        self.part = part  # a worker's part of batch ``index`` (`TorchBatches.parts`), for the loader to join
        self.no_room = False  # the part's worker found no room for it in shared memory (the loader says so)
        self.offset, self.folder = 0, None  # a part's first row in the batch, and the folder of the batch's files


class EpochBoard:
    """Where the next iteration starts (its epoch, the first step not delivered, and the later steps already
    delivered, at most ``capacity``), in shared memory made by the process that starts the workers, so that
    persistent workers read it at each epoch. Pickles only while workers are being started."""

    def __init__(self, capacity: int, context: Any) -> None:
        self.capacity = capacity
        self.values = context.RawArray("q", 4 + capacity)  # pass, epoch, step, count of skipped, skipped steps...

    def write(self, passes: int, epoch: int, step: int, skip: tuple[int, ...]) -> None:
        if len(skip) > self.capacity:
            raise OptionError(f"{len(skip)} batches were delivered out of order, more than the {self.capacity} "
                              "persistent workers can be told of: resume without persistent_workers")
        self.values[: 4 + len(skip)] = [passes, epoch, step, len(skip), *skip]

    def read(self) -> tuple[int, int, int, tuple[int, ...]]:
        """``(pass, epoch, step, skip)``: the loader's pass number and where it starts."""
        passes, epoch, step, count = self.values[:4]
        return passes, epoch, step, tuple(self.values[4 : 4 + count])


class TorchBatches(IterableDataset):
    """Batches of a store as `TorchBatch` dicts, for ``DataLoader(batches, batch_size=None, num_workers=n)``
    (the workers take turns at the rank's batches, whatever their number), or through
    `outcore.adapters.torch.loader`.

    ``channels_first`` turns 4-D fields from (N, H, W, C) into (N, C, H, W) views (no copy).
    """

    def __init__(self, store: Store, batch_size: int, *, num_workers: int = 0, channels_first: bool = False,
                 **keywords: Unpack[BatchKeywords]) -> None:
        super().__init__()
        self.resolved = "rank" in keywords or "world_size" in keywords  # given: never taken from torch
        self.explicit_rank = self.resolved
        options = BatchOptions.of(batch_size, keywords)
        if options.client is not None and num_workers > 0:
            raise OptionError(CLIENT_IN_WORKERS)
        if options.process and num_workers > 0:
            raise OptionError(PROCESS_AND_WORKERS)
        for name in options.fields or ():
            store.info(name)  # a KeyError naming the fields, here rather than in a worker
        check_fields(options.transform, options.fields or store.fields)  # likewise for the transform's fields
        self.location, self.store_samples, self.options = store.location, len(store), options
        self.chunk_size = store.chunk_size  # with the store's samples, what a resumed order is made of
        self.num_samples = options.num_samples(len(store))  # an epoch's: the store's, or the subset's
        self.opener = store.opener  # each worker opens the store itself, with the settings it was opened with
        self.num_workers, self.channels_first = num_workers, channels_first
        self.epoch = 0
        self.step = 0  # the first of the epoch's batches not delivered yet: the DataLoader's worker 0 makes it
        self.skip: tuple[int, ...] = ()  # later batches already delivered (by a DataLoader with in_order=False)
        self.own_turn = False  # ``step`` is this worker's next turn (a StatefulDataLoader's worker state), not the rank's
        self.parts = 1  # with more (`split_batches`), each worker makes its part of every batch
        self.slot: Slot | None = None  # where the workers write the parts of each batch, side by side
        self.passes = 0  # the loader's passes begun: names the files of this pass's batches
        self.board: EpochBoard | None = None  # for persistent workers: `persist`
        self._store: Store | None = store  # this process's store: the loader's, or a worker's, opened once
        self._iterator: BatchIterator | None = None  # this process's, kept across passes (its chunk buffers)
        self._opened_in = os.getpid()  # a forked worker opens its own
        self._next: NextEpoch | None = None  # in the main process: the next epoch's run, started as a pass drains
        self.loader_passes: int | None = None  # an OutcoreLoader's: its passes under way (read in those only)
        self.pinned = False  # batches made in this process go straight to pinned memory (`OutcoreLoader` sets it)
        # with ``process``: the process making them, kept across passes
        self._process = kept_loader(self, options) if options.process else None

    def persist(self, context: Any = None) -> None:
        """Prepare for DataLoader workers that persist across epochs, started by ``context`` (a start method's
        name, a multiprocessing context, or None: the default): they read each iteration's start from an
        `EpochBoard` that `publish` writes."""
        if isinstance(context, str) or context is None:
            context = multiprocessing.get_context(context)
        self.board = EpochBoard(BOARD_CAPACITY * max(1, self.num_workers), context)

    def publish(self) -> None:
        """Write where the next iteration starts for persistent workers (nothing without them)."""
        if self.board is not None:
            self.board.write(self.passes, self.epoch, self.step, self.skip)

    def split_batches(self, slot: Slot | None) -> None:
        """Have the DataLoader's workers each make a part of every batch (`EpochPlan`'s ``part``), written
        side by side into one file of ``slot`` per field, where the rank's streams can be shared among them
        and there is a slot (shared memory), for a loader that maps the batches (`OutcoreLoader`): each
        worker then reads only its own streams' chunks, instead of the chunks of every batch it makes
        (workers taking turns read the chunks that straddle consecutive batches once each: 1.4-3x the
        rank's share), and no batch is copied between processes. One worker makes the whole of every batch
        there too: a batch the DataLoader sends over costs the loader's thread several times as much."""
        options = self.options
        streams = options.canonical_streams // options.world_size
        shared = 1 <= self.num_workers <= streams and slot is not None
        self.parts = self.num_workers if shared else 1
        self.slot = slot if shared else None

    def resolve_rank(self) -> None:
        """Take the rank and world size from ``torch.distributed`` now, unless they were given."""
        if not self.explicit_rank:
            rank, world_size = distributed_rank()
            if (rank, world_size) != (self.options.rank, self.options.world_size):
                self.options = dataclasses.replace(self.options, rank=rank, world_size=world_size)
            self.resolved = True

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for DataLoader workers started by spawn or forkserver, which do not inherit the process
        group: the rank and world size go with it, resolved here, in the process that starts them."""
        state = dict(self.__dict__)
        state["_store"] = state["_iterator"] = state["_next"] = state["_process"] = None  # each worker opens its own
        if not state["resolved"]:
            rank, world_size = distributed_rank()
            state.update(options=dataclasses.replace(self.options, rank=rank, world_size=world_size), resolved=True)
        return state

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order, from its start, at the next iteration (call it before each epoch,
        as with ``DistributedSampler``, or let `OutcoreLoader` count epochs)."""
        self.epoch, self.step, self.skip, self.own_turn = int(epoch), 0, (), False

    def resume(self, epoch: int, step: int, skip: Iterable[int] = ()) -> None:
        """Continue ``epoch`` from the rank's batch ``step``, leaving out the later batches ``skip`` (already
        delivered)."""
        self.epoch, self.step, self.own_turn = int(epoch), int(step), False
        self.skip = tuple(sorted(int(s) for s in skip))

    def state_dict(self) -> dict[str, Any]:
        """torchdata's ``Stateful`` protocol, for ``StatefulDataLoader(batches, batch_size=None, num_workers=n)``,
        which asks each worker for its part: the epoch and the next batch that worker makes (in the main
        process, the next batch). Each part is loaded into the same worker by `load_state_dict`. For a
        state that loads with any number of workers and ranks, use `OutcoreLoader.state_dict`.

        >>> batches.state_dict()  # doctest: +SKIP
        {'epoch': 2, 'step': 7, 'own_turn': True}
        """
        return {"epoch": self.epoch, "step": self.step, "own_turn": self.own_turn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue as `state_dict` says: a worker from its next batch, taking turns as before."""
        self.epoch, self.step, self.skip = int(state["epoch"]), int(state["step"]), ()
        self.own_turn = bool(state["own_turn"])

    def __len__(self) -> int:
        """Batches this rank gets per epoch: the same for every rank, whatever the number of workers."""
        self.resolve_rank()
        return self.options.steps(self.num_samples)

    def __iter__(self) -> Iterator[TorchBatch]:
        if self.loader_passes == 0:  # an OutcoreLoader's batches, iterated outside its passes
            raise OptionError(REBUILT)
        info = get_worker_info()
        if info is None:
            self.resolve_rank()  # in the main process: the process group as it is now
        elif self.options.client is not None:
            raise OptionError(CLIENT_IN_WORKERS)
        else:
            share_cpus(info.num_workers)
            if not self.resolved:  # a plain DataLoader's forked worker: the group it inherited
                self.resolve_rank()
        loader_worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None and self.board is not None:  # a persistent worker: this iteration's start
            (self.passes, self.epoch, self.step, self.skip), self.own_turn = self.board.read(), False
        if self._store is None or self._opened_in != os.getpid():
            self._store, self._opened_in = self.opener(), os.getpid()
        iterator = self._iterator
        if iterator is None or iterator.store is not self._store or iterator.options is not self.options:
            iterator = self._iterator = BatchIterator(self._store, self.options, self._process)
        if info is not None and self.slot is not None:
            yield from self._parts(iterator, (loader_worker, num_workers))
            return
        turns = Consumer(self.options.rank, self.options.world_size, loader_worker, num_workers)
        first = self.step - loader_worker if self.own_turn else self.step  # a worker's own state: its next turn
        skip = set(self.skip)
        steps = [step for step in turns.steps(len(iterator), first) if step not in skip]
        if not steps:
            return  # this worker's turns were all delivered before the interruption
        if info is None and self._next is None:  # in the main process (a worker makes its turns: no whole epoch)
            self._next = NextEpoch()
        ahead = self._next.take(self.epoch, steps) if self._next is not None else None
        empty = pinned_empty if self.pinned and info is None else plain
        run = ahead or iterator.run(self.epoch, steps, empty=empty)
        total = len(iterator)
        try:
            for step, batch in zip(steps, run, strict=False):
                self.step, self.own_turn = step + num_workers, True  # what `state_dict` says once this is delivered
                if self._next is not None:
                    self._next.handed(run, step == total - 1,
                                      lambda: iterator.run(self.epoch + 1, range(total), empty=empty))
                yield TorchBatch({name: self._tensor(values) for name, values in batch.items()}, self.epoch,
                                 loader_worker, step, run.samples(step))
        finally:
            run.close()

    def _parts(self, iterator: BatchIterator, part: tuple[int, int]) -> Iterator[TorchBatch]:
        """This worker's part of every batch not delivered yet; an empty part (the last batch may leave a
        worker's streams none) comes as a batch with no fields, so that the loader counts every part."""
        plan = iterator.plan(self.epoch, part)
        skip = set(self.skip)
        rest = range(self.step, len(iterator))
        steps = [step for step in rest if step not in skip] if skip else rest
        arenas: dict[int, Arena] = {}  # each step's, made as the run makes its batch into the batch's files

        def allocate(step: int) -> Empty:
            arenas[step] = self.slot.arena(Part(f"{PART_FILE}{self.passes}-e{self.epoch}-s{step}",
                                                *plan.placement(step)))
            return arenas[step].empty

        run = iterator.run(self.epoch, plan.with_samples(steps), part, allocate)
        batches = iter(run)
        try:
            for step in steps:  # a step where this part has no samples comes as an empty part
                made, offset = SharedBatch({}), 0
                if plan.pieces(step):
                    batch = next(batches)  # made (its arena too) by the run's producer thread
                    arena = arenas.pop(step)
                    made, offset = arena.publish(batch), arena.part.offset
                values = TorchBatch(made.fields, self.epoch, part[0], step, plan.step(step)[0], part[0])
                values.no_room, values.folder, values.offset = made.no_room, self.slot.folder, offset
                yield values
        finally:
            run.close()

    def _tensor(self, values: np.ndarray) -> Any:
        return as_tensor(values, self.channels_first)


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray:
    """A new array in pinned (page-locked) memory from PyTorch's caching host allocator (an `Empty`): a batch
    made there is copied to the GPU as it is, and a DataLoader's ``pin_memory`` leaves it as it is (no copy
    on the training loop's thread)."""
    dtype = np.dtype(dtype)
    memory = torch.empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype=torch.uint8, pin_memory=True)
    return memory.numpy().view(dtype).reshape(shape)  # the array keeps the tensor, and so the memory, alive


def as_tensor(values: np.ndarray, channels_first: bool) -> Any:
    """A batch's field as a tensor sharing its memory (text stays numpy strings); with ``channels_first``,
    4-D fields as (N, C, H, W) views."""
    if values.dtype.kind in "US":
        return values
    tensor = torch.from_numpy(values)
    return tensor.permute(0, 3, 1, 2) if channels_first and tensor.ndim == 4 else tensor


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
