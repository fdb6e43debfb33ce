"""Keras 3: a ``keras.utils.PyDataset`` that ``model.fit``, ``evaluate`` and ``predict`` take directly.

Batch ``i`` of an epoch is the ``i``-th batch of `Dataset.batches`, read from the store when Keras
asks for it — never an array that pretends to be small (Keras would load all of it). Each epoch end
moves to the next epoch's order, so every epoch reshuffles, deterministically.
"""

from __future__ import annotations

from typing import Any, Unpack

from ..errors import OptionError
from ..iterate import BatchIterator, BatchKeywords, BatchOptions
from ..storage import Store
from .selection import FieldSelection, options_with_fields, select

try:
    import keras
except ImportError as error:  # pragma: no cover - exercised only without keras
    raise ImportError("ds.keras() needs Keras 3: pip install 'outcore[tf]'") from error


AUTO = "auto"  # sample_weight: the store's sample-weight field, when it has one and y is given


class KerasBatches(keras.utils.PyDataset):
    """Batches as ``(x, y)`` or ``(x, y, sample_weight)``; ``x``/``y`` name a field, a list of fields
    (a tuple goes to the model) or a dict of model input/output names to fields.

    Keras asks for batches by index, from ``workers`` threads and not always in order, so each batch
    is read on demand (`BatchIterator.batch`, with a cache of recent chunks): the same batches, in
    the same epochs, as iterating the dataset. An epoch ends (and the next one's order is used) once
    every batch of it has been served.

    Training data (``y`` given) is shuffled unless ``shuffle=False``; inputs alone (``x`` only, what
    ``model.predict`` takes) come in store order unless ``shuffle=True``, so predictions line up with
    the store's labels and paths. With ``y``, the store's ``sample_weight`` field (the role) is the
    sample weights unless ``sample_weight=None`` or another field is named.

    >>> model.fit(ds.keras(256, x="images", y="labels"), epochs=5,
    ...           validation_data=val.keras(256, x="images", y="labels", shuffle=False))  # doctest: +SKIP
    >>> predictions = model.predict(test.keras(256, x="images"))  # row i is sample i  # doctest: +SKIP
    """

    def __init__(self, store: Store, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
                 sample_weight: str | None = AUTO, workers: int = 2, max_queue_size: int = 10,
                 **options: Unpack[BatchKeywords]) -> None:
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=max_queue_size)
        if sample_weight == AUTO:
            sample_weight = _store_sample_weight(store) if y is not None else None
        self.x, self.y, self.sample_weight = x, y, sample_weight
        options = {"shuffle": y is not None, **options}
        self.iterator = BatchIterator(store, BatchOptions.of(batch_size, options_with_fields(options, x, y,
                                                                                             sample_weight)))
        self._served: set[int] = set()

    def __len__(self) -> int:
        return len(self.iterator)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        if index < 0:
            index += len(self)
        batch = self.iterator.batch(index)
        self._served.add(index)
        inputs = (select(batch, self.x),)
        if self.y is None:
            return inputs
        targets = (select(batch, self.y),)
        return inputs + targets + ((batch[self.sample_weight],) if self.sample_weight else ())

    def on_epoch_end(self) -> None:
        if len(self._served) == len(self):  # Keras also calls this after peeking at a batch or two
            self.set_epoch(self.iterator.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.iterator.set_epoch(epoch)
        self._served = set()

    def state_dict(self) -> dict[str, Any]:
        """The epoch to continue with: save it with the model checkpoint at the end of an epoch."""
        return self.iterator.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iterator.load_state_dict(state)
        self._served = set()


def _store_sample_weight(store: Store) -> str | None:
    """The store's one field with the ``sample_weight`` role, or None; several is an error, not a guess."""
    weights = [name for name, role in store.roles.items() if role == "sample_weight"]
    if len(weights) > 1:
        raise OptionError(f"{store.location} has {len(weights)} sample-weight fields {weights}: name the one to use "
                          "with sample_weight=, or sample_weight=None for none")
    return weights[0] if weights else None
