"""PyTorch: an ``IterableDataset`` of whole batches, sharded over DataLoader workers and DDP ranks.

`TorchBatches` holds plain values only — where the store is, the batch options, the epoch and where
each worker resumes — so a DataLoader may start its workers by fork, spawn or forkserver: each worker
opens the store itself, reads and decodes on its own share of the CPUs (`outcore.threads.share_cpus`),
started inside the worker (a process that forks while holding running threads can deadlock its
children), and reads only its share of the epoch. The ``(rank, worker)`` consumers of
`outcore.iterate.plan` split every epoch into disjoint, balanced parts, and every rank gets the same
number of batches (see the plan's sharding rule).

The rank and world size are those given, or else ``torch.distributed``'s when an iteration starts (or
``len`` is asked): a loader built before ``init_process_group`` still shards.

Workers that persist across epochs (``persistent_workers=True``) received the dataset once: the epoch
and where each share resumes reach them through a small shared array (`EpochBoard`) that the loader
writes before each iteration, and each keeps its store open from one epoch to the next.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from collections.abc import Iterable, Iterator
from typing import Any, Unpack

import numpy as np

from ..errors import OptionError
from ..iterate import BatchIterator, BatchKeywords, BatchOptions, Consumer, batch_count, rank_batch_count
from ..storage import Store
from ..threads import share_cpus
from .torch_module import IterableDataset, get_worker_info, torch

CLIENT_IN_WORKERS = (
    "with client=, the Dask workers read, decode and augment, and batches arrive in the main process: "
    "use num_workers=0 (DataLoader worker processes cannot share the client)"
)


class TorchBatch(dict):
    """A batch (field name -> tensor; text fields stay numpy strings) that knows where it comes from:
    ``epoch``, ``worker`` (whose share of the rank's samples), ``index`` (its position in that share)
    and ``samples``, the store's indices of its samples (where each prediction belongs)."""

    def __init__(self, values: dict[str, Any], epoch: int, worker: int, index: int, samples: np.ndarray) -> None:
        super().__init__(values)
        self.epoch, self.worker, self.index, self.samples = epoch, worker, index, samples


class EpochBoard:
    """Where the next iteration starts (its epoch, the share the DataLoader's worker 0 makes first, and each
    share's resume position), in shared memory made by the process that starts the workers, so that
    persistent workers read it at each epoch. Pickles only while workers are being started."""

    def __init__(self, shares: int, context: Any) -> None:
        self.shares = shares
        self.values = context.RawArray("q", 3 + shares)  # epoch, first worker, resuming, positions...

    def write(self, epoch: int, first_worker: int, positions: tuple[int, ...]) -> None:
        self.values[: 3 + self.shares] = [epoch, first_worker, int(bool(positions)), *(positions or (0,) * self.shares)]

    def read(self) -> tuple[int, int, tuple[int, ...]]:
        values = list(self.values)
        return values[0], values[1], tuple(values[3:]) if values[2] else ()


class TorchBatches(IterableDataset):
    """Batches of a store as `TorchBatch` dicts, for ``DataLoader(batches, batch_size=None, num_workers=n)``
    (pass the same ``num_workers`` here for an exact ``len``; each worker reads its share of the epoch
    whatever the count), or through `outcore.adapters.torch.loader`.

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
        for name in options.fields or ():
            store.info(name)  # a KeyError naming the fields, here rather than in a worker
        self.location, self.num_samples, self.options = store.location, len(store), options
        self.opener = store.opener  # each worker opens the store itself, with the settings it was opened with
        self.num_workers, self.channels_first = num_workers, channels_first
        self.epoch = 0
        self.positions: tuple[int, ...] = ()  # batches each worker's share has delivered, when resuming
        self.first_worker = 0  # the share whose batch the DataLoader's worker 0 makes first
        self.board: EpochBoard | None = None  # for persistent workers: `persist`
        self._store: Store | None = None  # a worker's store, opened once (persistent workers keep it)

    def persist(self, context: Any = None) -> None:
        """Prepare for DataLoader workers that persist across epochs, started by ``context`` (a start method's
        name, a multiprocessing context, or None: the default): they read each iteration's start from an
        `EpochBoard` that `publish` writes."""
        if isinstance(context, str) or context is None:
            context = multiprocessing.get_context(context)
        self.board = EpochBoard(self.shares, context)

    def publish(self) -> None:
        """Write where the next iteration starts for persistent workers (nothing without them)."""
        if self.board is not None:
            self.board.write(self.epoch, self.first_worker, self.positions)

    @property
    def shares(self) -> int:
        return max(1, self.num_workers)

    def resolve_rank(self) -> None:
        """Take the rank and world size from ``torch.distributed`` now, unless they were given."""
        if not self.explicit_rank:
            rank, world_size = distributed_rank()
            self.options = dataclasses.replace(self.options, rank=rank, world_size=world_size)
            self.resolved = True

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for DataLoader workers started by spawn or forkserver, which do not inherit the process
        group: the rank and world size go with it, resolved here, in the process that starts them."""
        state = dict(self.__dict__)
        state["_store"] = None  # each worker opens its own
        if not state["resolved"]:
            rank, world_size = distributed_rank()
            state.update(options=dataclasses.replace(self.options, rank=rank, world_size=world_size), resolved=True)
        return state

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order, from its start, at the next iteration (call it before each epoch,
        as with ``DistributedSampler``, or let `OutcoreLoader` count epochs)."""
        self.epoch, self.positions, self.first_worker = int(epoch), (), 0

    def resume(self, epoch: int, positions: Iterable[int], first_worker: int) -> None:
        """Continue ``epoch`` with share ``w`` after its first ``positions[w]`` batches, share
        ``first_worker`` first."""
        positions = tuple(int(p) for p in positions)
        if len(positions) != self.shares:
            raise OptionError(f"{len(positions)} positions given for {self.shares} DataLoader worker shares")
        self.epoch, self.positions, self.first_worker = int(epoch), positions, int(first_worker)

    def share_lengths(self) -> list[int]:
        """Batches per epoch of each worker's share of this rank."""
        return [batch_count(self.num_samples, self._consumer(w), self.options.batch_size, self.options.drop_last)
                for w in range(self.shares)]

    def __len__(self) -> int:
        """Batches this rank gets per epoch, over all workers: the same for every rank."""
        self.resolve_rank()
        options = self.options
        return rank_batch_count(self.num_samples, options.rank, options.world_size, self.shares, options.batch_size,
                                options.drop_last)

    def __iter__(self) -> Iterator[TorchBatch]:
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
            self.epoch, self.first_worker, self.positions = self.board.read()
        if self.positions and num_workers != self.shares:
            raise OptionError(f"the epoch was interrupted with {self.shares} DataLoader worker(s); it cannot resume "
                             f"with {num_workers}: use num_workers={self.shares}")
        worker = (loader_worker + self.first_worker) % num_workers
        if self._store is None or info is None:
            self._store = self.opener()
        iterator = BatchIterator(self._store, self.options, worker=worker, num_workers=num_workers)
        iterator.set_epoch(self.epoch)
        iterator.batches_done = self.positions[worker] if self.positions else 0
        if iterator.batches_done >= len(iterator):
            return  # this share was all delivered before the interruption
        plan, size = iterator.plan(self.epoch), self.options.batch_size
        for index, batch in enumerate(iterator, start=iterator.batches_done):
            yield TorchBatch({name: self._tensor(values) for name, values in batch.items()}, self.epoch, worker,
                             index, plan.take(index * size, (index + 1) * size)[0])

    def _consumer(self, worker: int) -> Consumer:
        return Consumer(self.options.rank, self.options.world_size, worker, self.shares)

    def _tensor(self, values: np.ndarray) -> Any:
        if values.dtype.kind in "US":
            return values
        tensor = torch.from_numpy(values)
        return tensor.permute(0, 3, 1, 2) if self.channels_first and tensor.ndim == 4 else tensor


def distributed_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` process group, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1
