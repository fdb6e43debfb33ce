"""PyTorch: a DataLoader of a mixture's batches (`outcore.Mixture.torch`), made by outcore's threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..errors import OptionError
from ..iterate.mixture import MixtureIterator
from .torch_batches import as_tensor, distributed_rank
from .torch_module import DataLoader, IterableDataset

IN_WORKERS = ("a mixture's batches are made by outcore's own threads in this process (each source read ahead): "
              "use num_workers=0")


class MixtureBatches(IterableDataset):
    """The batches of a mixture as dicts of tensors, from an iterator ``make(rank, world_size)`` made at the
    first use, with the rank of ``torch.distributed`` then unless ``rank`` was given."""

    def __init__(self, make: Callable[[int, int], MixtureIterator], channels_first: bool,
                 rank: tuple[int, int] | None) -> None:
        super().__init__()
        self.make, self.channels_first, self.rank = make, channels_first, rank
        self._iterator: MixtureIterator | None = None

    @property
    def iterator(self) -> MixtureIterator:
        if self._iterator is None:
            self._iterator = self.make(*(self.rank or distributed_rank()))
        return self._iterator

    def __len__(self) -> int:
        return len(self.iterator)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.iterator:
            yield {name: as_tensor(values, self.channels_first) for name, values in batch.items()}


class MixtureLoader(DataLoader):
    """A DataLoader over `MixtureBatches` (``num_workers=0``): the next pass is the next epoch, and
    ``state_dict``/``load_state_dict`` resume mid-epoch (on the same number of ranks)."""

    dataset: MixtureBatches

    def __init__(self, batches: MixtureBatches, **dataloader_options: Any) -> None:
        if dataloader_options.get("num_workers", 0):
            raise OptionError(IN_WORKERS)
        super().__init__(batches, batch_size=None, **dataloader_options)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.iterator.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.iterator.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.iterator.load_state_dict(state)

    def stats(self) -> dict[str, float]:
        return self.dataset.iterator.stats()
