"""PyTorch: an ``IterableDataset`` of whole batches, sharded over DataLoader workers and DDP ranks.

Each DataLoader worker opens the store itself and starts its reader threads inside the worker, after
the fork (a process that forks while holding running threads can deadlock its children), and reads
only its share of the epoch: the ``(rank, worker)`` consumers of `outcore.shuffle` split every epoch
into disjoint, complete, balanced parts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..loader import BatchIterator

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


class TorchBatches(IterableDataset):
    """Batches of ``dataset`` as dicts of tensors (text fields stay numpy strings).

    Use it with ``DataLoader(batches, batch_size=None, num_workers=...)``, or through `loader`.
    ``rank``/``world_size`` default to ``torch.distributed``'s when it is initialised, else 0/1.
    ``channels_first`` turns 4-D fields from (N, H, W, C) into (N, C, H, W) views (no copy).
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, num_workers: int = 0, rank: int | None = None,
                 world_size: int | None = None, channels_first: bool = False, **options: Any) -> None:
        super().__init__()
        self.location, self.batch_size, self.options = dataset.location, batch_size, options
        self.num_workers, self.channels_first = num_workers, channels_first
        self.rank, self.world_size = _distributed(rank, world_size)
        self.epoch = 0
        BatchIterator(dataset, batch_size, **options)  # check the options now, in the main process

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order at the next iteration (call it before each epoch, as with
        ``DistributedSampler``, or let `OutcoreLoader` count epochs)."""
        self.epoch = int(epoch)

    def _iterator(self, worker: int, num_workers: int) -> BatchIterator:
        from ..dataset import open_dataset

        iterator = BatchIterator(open_dataset(self.location), self.batch_size, rank=self.rank,
                                 world_size=self.world_size, worker=worker, num_workers=num_workers, **self.options)
        iterator.set_epoch(self.epoch)
        return iterator

    def __len__(self) -> int:
        """Batches this rank gets per epoch, over all ``num_workers`` workers."""
        from ..dataset import open_dataset

        dataset, workers = open_dataset(self.location), max(1, self.num_workers)
        return sum(len(BatchIterator(dataset, self.batch_size, rank=self.rank, world_size=self.world_size,
                                     worker=w, num_workers=workers, **self.options)) for w in range(workers))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for batch in self._iterator(worker, num_workers):
            yield {name: self._tensor(values) for name, values in batch.items()}

    def _tensor(self, values: np.ndarray) -> Any:
        if values.dtype.kind in "US":
            return values
        tensor = torch.from_numpy(values)
        return tensor.permute(0, 3, 1, 2) if self.channels_first and tensor.ndim == 4 else tensor


class OutcoreLoader(DataLoader):
    """A DataLoader over `TorchBatches` that moves to the next epoch after each complete pass."""

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        yield from super().__iter__()
        self.dataset.set_epoch(self.dataset.epoch + 1)


def loader(dataset: Dataset, batch_size: int, *, num_workers: int = 2, pin_memory: bool = False,
           rank: int | None = None, world_size: int | None = None, channels_first: bool = False,
           fields: Sequence[str] | None = None, **options: Any) -> OutcoreLoader:
    """A DataLoader of batches of ``dataset``, read by ``num_workers`` worker processes.

    ``options`` are those of `Dataset.batches` (shuffle, seed, buffer_chunks, prefetch, transform,
    drop_last). Batches are made by outcore, so the DataLoader's own batching is off.

    >>> for batch in ds.torch(batch_size=256, num_workers=2):  # doctest: +SKIP
    ...     loss = model(batch["images"].float()).mean()
    """
    batches = TorchBatches(dataset, batch_size, num_workers=num_workers, rank=rank, world_size=world_size,
                           channels_first=channels_first, fields=fields, **options)
    return OutcoreLoader(batches, batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                         persistent_workers=False)


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    return rank, world_size
