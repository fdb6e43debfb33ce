"""PyTorch: an ``IterableDataset`` of whole batches, sharded over DataLoader workers and DDP ranks.

`TorchBatches` holds plain values only — where the store is, the batch options, the epoch and where
each worker resumes — so a DataLoader may start its workers by fork, spawn or forkserver: each worker
opens the store itself, starts its reader threads inside the worker (a process that forks while
holding running threads can deadlock its children) and reads only its share of the epoch. The
``(rank, worker)`` consumers of `outcore.iterate.plan` split every epoch into disjoint, balanced
parts, and every rank gets the same number of batches (see the plan's sharding rule).

Each batch says which worker's share it belongs to and its position there (`TorchBatch`);
`OutcoreLoader` counts them, so its ``state_dict`` is the iterators' own positions, not a guess at
how the DataLoader interleaves its workers.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from collections.abc import Iterable, Iterator
from typing import Any, Unpack

import numpy as np

from ..errors import OptionError
from ..iterate import BatchIterator, BatchKeywords, BatchOptions, Consumer, batch_count, rank_batch_count
from ..iterate.stats import LoaderStats
from ..storage import Store, open_store
from .keywords import TorchKeywords, split_torch_keywords

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "ds.torch() needs PyTorch: pip install 'outcore[torch]' (on a CPU-only machine, install the CPU "
        "build of torch first)"
    ) from error

_CLIENT_IN_WORKERS = (
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


class TorchBatches(IterableDataset):
    """Batches of a store as `TorchBatch` dicts, for ``DataLoader(batches, batch_size=None, num_workers=n)``
    (pass the same ``num_workers`` here for an exact ``len``; each worker reads its share of the epoch
    whatever the count), or through `loader`.

    ``channels_first`` turns 4-D fields from (N, H, W, C) into (N, C, H, W) views (no copy).
    """

    def __init__(self, store: Store, batch_size: int, *, num_workers: int = 0, channels_first: bool = False,
                 **keywords: Unpack[BatchKeywords]) -> None:
        super().__init__()
        options = BatchOptions.of(batch_size, keywords)
        if options.client is not None and num_workers > 0:
            raise OptionError(_CLIENT_IN_WORKERS)
        for name in options.fields or ():
            store.info(name)  # a KeyError naming the fields, here rather than in a worker
        self.location, self.num_samples, self.options = store.location, len(store), options
        self.num_workers, self.channels_first = num_workers, channels_first
        self.epoch = 0
        self.positions: tuple[int, ...] = ()  # batches each worker's share has delivered, when resuming
        self.first_worker = 0  # the share whose batch the DataLoader's worker 0 makes first

    @property
    def shares(self) -> int:
        return max(1, self.num_workers)

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
        options = self.options
        return rank_batch_count(self.num_samples, options.rank, options.world_size, self.shares, options.batch_size,
                                options.drop_last)

    def __iter__(self) -> Iterator[TorchBatch]:
        info = get_worker_info()
        if info is not None and self.options.client is not None:
            raise OptionError(_CLIENT_IN_WORKERS)
        loader_worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.positions and num_workers != self.shares:
            raise OptionError(f"the epoch was interrupted with {self.shares} DataLoader worker(s); it cannot resume "
                             f"with {num_workers}: use num_workers={self.shares}")
        worker = (loader_worker + self.first_worker) % num_workers
        iterator = BatchIterator(open_store(self.location), self.options, worker=worker, num_workers=num_workers)
        iterator.set_epoch(self.epoch)
        iterator.batches_done = self.positions[worker] if self.positions else 0
        if iterator.batches_done >= len(iterator):
            return  # this share was all delivered before the interruption
        samples, size = iterator.plan(self.epoch).samples, self.options.batch_size
        for index, batch in enumerate(iterator, start=iterator.batches_done):
            yield TorchBatch({name: self._tensor(values) for name, values in batch.items()}, self.epoch, worker,
                             index, samples[index * size : (index + 1) * size])

    def _consumer(self, worker: int) -> Consumer:
        return Consumer(self.options.rank, self.options.world_size, worker, self.shares)

    def _tensor(self, values: np.ndarray) -> Any:
        if values.dtype.kind in "US":
            return values
        tensor = torch.from_numpy(values)
        return tensor.permute(0, 3, 1, 2) if self.channels_first and tensor.ndim == 4 else tensor


class OutcoreLoader(DataLoader):
    """A DataLoader over `TorchBatches` that counts epochs (the next pass is the next epoch) and can
    resume mid-epoch: `state_dict` after k batches, `load_state_dict` in a new loader, and iteration
    continues with exactly the batches the interrupted run would have produced, in the same order."""

    dataset: TorchBatches

    def __init__(self, batches: TorchBatches, **dataloader_options: Any) -> None:
        super().__init__(batches, batch_size=None, **dataloader_options)
        self._stats = LoaderStats()

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        batches = self.dataset
        lengths = batches.share_lengths()
        positions = list(batches.positions) or [0] * batches.shares
        batches_of = super().__iter__()
        while True:
            asked = time.perf_counter()
            try:
                batch = next(batches_of)
            except StopIteration:
                break
            self._stats.record(time.perf_counter() - asked, 0, _batch_length(batch))
            positions[batch.worker] = batch.index + 1
            batches.positions, batches.first_worker = tuple(positions), _next_share(batch.worker, positions, lengths)
            yield batch
        batches.set_epoch(batches.epoch + 1)

    def stats(self) -> dict[str, float]:
        """How long the training loop waited for each batch: see `BatchIterator.stats` (``ready_mean``
        is not known through a DataLoader and reads 0)."""
        return self._stats.summary()

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: the batches each worker's share has delivered, and whose batch is next."""
        batches = self.dataset
        return {**self._settings(), "epoch": batches.epoch,
                "positions": list(batches.positions) or [0] * batches.shares, "first_worker": batches.first_worker}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mismatched = {k: (state.get(k), v) for k, v in self._settings().items() if state.get(k) != v}
        if mismatched:
            raise OptionError(f"state does not match this loader (saved, current): {mismatched}")
        self.dataset.resume(state["epoch"], state["positions"], state["first_worker"])

    def _settings(self) -> dict[str, Any]:
        batches = self.dataset
        return {**batches.options.plan_settings(), "num_samples": batches.num_samples,
                "num_workers": batches.num_workers}


def loader(store: Store, batch_size: int, *, channels_first: bool = False,
           **options: Unpack[TorchKeywords]) -> OutcoreLoader:
    """A DataLoader of batches of ``store``, read by ``num_workers`` worker processes (default 0).

    The batch options are those of `Dataset.batches`, but ``shuffle`` is off unless asked for, as in a
    DataLoader: pass ``shuffle=True`` to train. Without it, and with ``num_workers=0``, batches come in
    store order, so predictions line up with the store's labels and paths; DataLoader workers take
    turns, so with more use each batch's ``samples``. ``rank``/``world_size`` default to
    ``torch.distributed``'s when it is initialised. Every other keyword goes to the DataLoader as it is
    (``num_workers``, ``pin_memory``, ``multiprocessing_context``, ``prefetch_factor``, ...). Batches are
    made by outcore, so the DataLoader's own batching is off. outcore already reads ahead on background
    threads, so ``num_workers=0`` is the default: worker processes add a copy of every batch between
    processes (benchmarks/training.py measured 5 % of the time waiting for data with 0 workers, 21 % with
    2, on 2 cores); use them for heavy per-batch Python transforms. Workers may start by fork, spawn or
    forkserver; with spawn and forkserver, the transform must pickle (defined at module level).

    >>> for batch in ds.torch(batch_size=256, shuffle=True, num_workers=2):  # doctest: +SKIP
    ...     loss = model(batch["images"].float()).mean()
    """
    batch_keywords, dataloader_options = split_torch_keywords(options)
    if dataloader_options.get("persistent_workers"):
        raise OptionError(
            "persistent_workers=True is not supported: each epoch's order and resume position reach the "
            "DataLoader's workers when they start, so they start again every epoch"
        )
    rank, world_size = _distributed_rank()
    batch_keywords.setdefault("shuffle", False)
    batch_keywords.setdefault("rank", rank)
    batch_keywords.setdefault("world_size", world_size)
    num_workers = int(dataloader_options.get("num_workers", 0))
    batches = TorchBatches(store, batch_size, num_workers=num_workers, channels_first=channels_first,
                           **batch_keywords)
    if num_workers > 0:
        _check_picklable(batches, dataloader_options.get("multiprocessing_context"))
    return OutcoreLoader(batches, **dataloader_options)


def _check_picklable(batches: TorchBatches, context: Any) -> None:
    """Workers started by spawn or forkserver receive the dataset pickled: say so now, not in a worker."""
    method = context if isinstance(context, str) else (
        context.get_start_method() if context is not None else multiprocessing.get_start_method())
    if method == "fork":
        return
    try:
        pickle.dumps(batches)
    except Exception as error:  # noqa: BLE001 - whatever pickle raises, the message below says what to do
        raise OptionError(
            f"DataLoader workers started by {method!r} receive the dataset pickled, and this one cannot be "
            f"({type(error).__name__}: {error}): define the transform at module level (not a lambda or a local "
            "function), or use multiprocessing_context='fork'"
        ) from None


def _batch_length(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values())))


def _next_share(last: int, positions: list[int], lengths: list[int]) -> int:
    """The share the DataLoader takes its next batch from: it visits its workers in turn, skipping those
    whose share is exhausted."""
    for step in range(1, len(lengths) + 1):
        share = (last + step) % len(lengths)
        if positions[share] < lengths[share]:
            return share
    return 0


def _distributed_rank() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def to_device(batches: Iterable[dict[str, Any]], device: str | Any = "cuda") -> Iterator[dict[str, Any]]:
    """Yield ``batches`` with their tensors on ``device``; on CUDA, batch k+1 is copied on a side
    stream while the caller computes on batch k, so host-to-device copies overlap compute.

    Pair it with ``ds.torch(..., pin_memory=True)``: copies from pinned memory are asynchronous.

    >>> for batch in to_device(ds.torch(256, pin_memory=True), "cuda"):  # doctest: +SKIP
    ...     loss = model(batch["images"]).mean()
    """
    device = torch.device(device)
    if device.type != "cuda":
        for batch in batches:
            yield _moved(batch, device)
        return
    copies = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def send(batch: dict[str, Any]) -> dict[str, Any]:
        with torch.cuda.stream(copies):
            return _moved(batch, device, non_blocking=True)

    def ready(batch: dict[str, Any]) -> dict[str, Any]:
        compute.wait_stream(copies)
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.record_stream(compute)  # keep its memory until the compute stream is done with it
        return batch

    pending = None
    for batch in batches:
        following = send(batch)
        if pending is not None:
            yield ready(pending)
        pending = following
    if pending is not None:
        yield ready(pending)


def _moved(batch: dict[str, Any], device: Any, non_blocking: bool = False) -> dict[str, Any]:
    return {name: value.to(device, non_blocking=non_blocking) if isinstance(value, torch.Tensor) else value
            for name, value in batch.items()}
