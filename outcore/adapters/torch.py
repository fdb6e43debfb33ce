"""PyTorch: an ``IterableDataset`` of whole batches, sharded over DataLoader workers and DDP ranks.

Each DataLoader worker opens the store itself and starts its reader threads inside the worker, after
the fork (a process that forks while holding running threads can deadlock its children), and reads
only its share of the epoch: the ``(rank, worker)`` consumers of `outcore.shuffle` split every epoch
into disjoint, complete, balanced parts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..loader import BatchIterator, LoaderStats
from ..shuffle import Consumer, batch_count

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "ds.torch() needs PyTorch: pip install 'outcore[torch]' (on a CPU-only machine, install the CPU "
        "build of torch first)"
    ) from error

if TYPE_CHECKING:
    from ..dataset import Dataset

_CLIENT_IN_WORKERS = (
    "with client=, the Dask workers read, decode and augment, and batches arrive in the main process: "
    "use num_workers=0 (DataLoader worker processes cannot share the client)"
)


class TorchBatches(IterableDataset):
    """Batches of ``dataset`` as dicts of tensors (text fields stay numpy strings).

    Use it with ``DataLoader(batches, batch_size=None, num_workers=...)`` (pass the same
    ``num_workers`` here for an exact ``len``), or through `loader`.
    ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialised, else 0/1.
    ``channels_first`` turns 4-D fields from (N, H, W, C) into (N, C, H, W) views (no copy).
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, num_workers: int = 0, rank: int | None = None,
                 world_size: int | None = None, channels_first: bool = False, **options: Any) -> None:
        super().__init__()
        if options.get("client") is not None and num_workers > 0:
            raise ValueError(_CLIENT_IN_WORKERS)
        self.location, self.num_samples, self.batch_size, self.options = (
            dataset.location, len(dataset), batch_size, options)
        self.num_workers, self.channels_first = num_workers, channels_first
        self.rank, self.world_size = _distributed(rank, world_size)
        self.epoch, self.batches_done = 0, 0  # batches_done: of this epoch, over all workers
        self._probe = BatchIterator(dataset, batch_size, **options)  # checks the options in the main process

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order at the next iteration (call it before each epoch, as with
        ``DistributedSampler``, or let `OutcoreLoader` count epochs)."""
        self.epoch, self.batches_done = int(epoch), 0

    def resume(self, epoch: int, batches_done: int) -> None:
        """Start the next iteration after the first ``batches_done`` batches of ``epoch``."""
        self.epoch, self.batches_done = int(epoch), int(batches_done)

    def worker_batches(self, num_workers: int | None = None) -> list[int]:
        """Batches per epoch of each DataLoader worker of this rank (default: ``num_workers`` workers)."""
        workers = max(1, self.num_workers if num_workers is None else num_workers)
        return [batch_count(self.num_samples, Consumer(self.rank, self.world_size, w, workers), self.batch_size,
                            self.options.get("drop_last", False)) for w in range(workers)]

    def __len__(self) -> int:
        """Batches this rank gets per epoch, over all workers."""
        return sum(self.worker_batches())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from ..dataset import open_dataset

        info = get_worker_info()
        if info is not None and self.options.get("client") is not None:
            raise ValueError(_CLIENT_IN_WORKERS)
        loader_worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        taken, first = _done_by_each(self.worker_batches(num_workers), self.batches_done)
        # The DataLoader asks its worker 0 first; after a resume the next batch is due from worker
        # `first` of the interrupted run, so loader worker w reads that run's share of worker w + first.
        worker = (loader_worker + first) % num_workers
        iterator = BatchIterator(open_dataset(self.location), self.batch_size, rank=self.rank,
                                 world_size=self.world_size, worker=worker, num_workers=num_workers, **self.options)
        if taken[worker] >= len(iterator):
            return  # this worker's share was all delivered before the interruption
        iterator.set_epoch(self.epoch)
        iterator.batches_done = taken[worker]
        for batch in iterator:
            yield {name: self._tensor(values) for name, values in batch.items()}

    def _tensor(self, values: np.ndarray) -> Any:
        if values.dtype.kind in "US":
            return values
        tensor = torch.from_numpy(values)
        return tensor.permute(0, 3, 1, 2) if self.channels_first and tensor.ndim == 4 else tensor


class OutcoreLoader(DataLoader):
    """A DataLoader over `TorchBatches` that counts epochs (the next pass is the next epoch) and can
    resume mid-epoch: `state_dict` after k batches, `load_state_dict` in a new loader, and iteration
    continues with exactly the batches the interrupted run would have produced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stats = LoaderStats()

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        batches = super().__iter__()
        while True:
            asked = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                break
            self._stats.record(time.perf_counter() - asked, 0, _batch_length(batch))
            self.dataset.batches_done += 1
            yield batch
        self.dataset.set_epoch(self.dataset.epoch + 1)

    def stats(self) -> dict[str, float]:
        """How long the training loop waited for each batch: see `BatchIterator.stats` (``ready_mean``
        is not known through a DataLoader and reads 0)."""
        return self._stats.summary()

    def state_dict(self) -> dict[str, Any]:
        return {**self.dataset._probe.state_dict(), "epoch": self.dataset.epoch,
                "batches_done": self.dataset.batches_done, "num_workers": self.num_workers,
                "rank": self.dataset.rank, "world_size": self.dataset.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        mismatched = {k: (v, mine[k]) for k, v in state.items()
                      if k not in ("epoch", "batches_done", "worker") and mine.get(k) != v}
        if mismatched:
            raise ValueError(f"state does not match this loader (saved, current): {mismatched}")
        self.dataset.resume(state["epoch"], state["batches_done"])


def loader(dataset: Dataset, batch_size: int, *, num_workers: int = 0, pin_memory: bool = False,
           rank: int | None = None, world_size: int | None = None, channels_first: bool = False,
           fields: Sequence[str] | None = None, **options: Any) -> OutcoreLoader:
    """A DataLoader of batches of ``dataset``, read by ``num_workers`` worker processes.

    ``options`` are those of `Dataset.batches` (shuffle, seed, buffer_chunks, prefetch, transform,
    drop_last, client: with a Dask client, its workers make the batches and ``num_workers`` stays 0).
    Batches are made by outcore, so the DataLoader's own batching is off. outcore already reads ahead
    on background threads, so ``num_workers=0`` is the default: worker processes add a copy of every
    batch between processes (benchmarks/training.py measured 5 % of the time waiting
    for data with 0 workers, 21 % with 2, on 2 cores); use them for heavy per-batch Python transforms.

    >>> for batch in ds.torch(batch_size=256, num_workers=2):  # doctest: +SKIP
    ...     loss = model(batch["images"].float()).mean()
    """
    batches = TorchBatches(dataset, batch_size, num_workers=num_workers, rank=rank, world_size=world_size,
                           channels_first=channels_first, fields=fields, **options)
    return OutcoreLoader(batches, batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                         persistent_workers=False)


def _batch_length(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values())))


def _done_by_each(counts: list[int], done: int) -> tuple[list[int], int]:
    """Split ``done`` batches among workers as the DataLoader hands them out — round robin over the
    workers that still have batches — and say which worker's batch comes next."""
    taken, worker = [0] * len(counts), 0
    while done > 0 and any(t < c for t, c in zip(taken, counts, strict=True)):
        if taken[worker] < counts[worker]:
            taken[worker] += 1
            done -= 1
        worker = (worker + 1) % len(counts)
    while sum(taken) < sum(counts) and taken[worker] >= counts[worker]:
        worker = (worker + 1) % len(counts)
    return taken, worker


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    return rank, world_size


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
