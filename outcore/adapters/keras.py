"""Keras 3: a ``keras.utils.PyDataset`` that ``model.fit``, ``evaluate`` and ``predict`` take directly.

Keras asks a PyDataset for its batches by index: in order for ``evaluate`` and ``predict``, in a random
order of its own for ``fit(shuffle=True)`` (Keras' default). Reading batches in a random order would
read every chunk again for each batch that draws on it (about ``buffer_chunks`` times an epoch), so
`KerasBatches` serves the epoch's batches from one scheduled pass over the store (`Dataset.batches`),
which reads each chunk once:

- an index asked for the first time in an epoch gets the pass's next batch when the batches are
  shuffled (outcore's seeded order: Keras' ``shuffle`` then only changes which index it names, not
  which batches come or in which order), or when it is the next index in order;
- an unshuffled dataset asked out of order (``predict`` through threads of your own) reads that
  batch on demand, so row ``i`` is always sample ``i``;
- an index asked again in the same epoch gets the same batch again, read on demand, and so does one
  asked outside an epoch (between Keras' ``on_epoch_end`` and ``on_epoch_begin``, when TensorFlow's
  Keras peeks at batches to learn their shapes, or a call of your own): batch ``i`` of the epoch's order;
- a batch Keras peeks at inside an epoch of its own before the first (the JAX and torch backends build
  the model from one batch in a one-batch epoch: `_peeking`) is the pass's first batch, kept and
  served again to the first index the real epoch asks for: so it is read once, and trained on in
  its place.

So every epoch serves each batch of outcore's order exactly once, whatever order Keras asks in. An
epoch ends (and the next one's order is used) when Keras ends an epoch in which every index was served.

Under Keras' torch backend on a CUDA machine, the batches are made in pinned (page-locked) memory, as
``ds.torch(pin_memory=True)``'s are: Keras copies each to the GPU as it takes it, and a copy from pinned memory
goes straight to the device, not through a staging buffer.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any, Unpack

from ..errors import OptionError
from ..iterate import Batch, BatchIterator, BatchKeywords
from .selection import BatchSource, FieldSelection, options_with_fields, padded, select

try:
    import keras
except ImportError as error:  # pragma: no cover - exercised only without keras
    raise ImportError("ds.keras() needs Keras 3: pip install 'outcore[tf]'") from error


AUTO = "auto"  # sample_weight: the store's sample-weight field, when it has one and y is given


class KerasBatches(keras.utils.PyDataset):
    """Batches as ``(x, y)`` or ``(x, y, sample_weight)``; ``x``/``y`` name a field, a list of fields
    (a tuple goes to the model) or a dict of model input/output names to fields.

    Each epoch is one pass over the store in outcore's order (see the module docstring): Keras' own
    ``workers`` are not used (requests come one at a time; outcore reads and decodes ahead on its own
    threads, ``prefetch`` batches deep).

    Training data (``y`` given) is shuffled unless ``shuffle=False``; inputs alone (``x`` only, what
    ``model.predict`` takes) come in store order unless ``shuffle=True``, so predictions line up with
    the store's labels and paths. With ``y``, the store's ``sample_weight`` field (the role) is the
    sample weights unless ``sample_weight=None`` or another field is named. A ragged field (boxes, keypoints)
    comes dense, each sample's rows padded with -1 to the batch's most (KerasCV's dense boxes).

    >>> model.fit(ds.keras(256, x="images", y="labels"), epochs=5,
    ...           validation_data=val.keras(256, x="images", y="labels", shuffle=False))  # doctest: +SKIP
    >>> predictions = model.predict(test.keras(256, x="images"))  # row i is sample i  # doctest: +SKIP
    """

    def __init__(self, store: BatchSource, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
                 sample_weight: str | None = AUTO, **options: Unpack[BatchKeywords]) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        if sample_weight == AUTO:
            sample_weight = _store_sample_weight(store) if y is not None else None
        self.x, self.y, self.sample_weight = x, y, sample_weight
        options = {"shuffle": y is not None, **options}
        self.iterator = store.batches(batch_size, **options_with_fields(options, x, y, sample_weight))
        if isinstance(self.iterator, BatchIterator) and self.iterator.options.client is None and _to_cuda():
            from .torch_batches import pinned_empty

            self.iterator.empty = pinned_empty
        self._lock = threading.Lock()
        self._epoch = _Epoch(self.iterator, 0)
        self._in_epoch = False  # between Keras' on_epoch_begin and on_epoch_end

    def __len__(self) -> int:
        return len(self.iterator)

    @property
    def epoch(self) -> int:
        return self._epoch.number

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is not in [0, {len(self)})")
        with self._lock:
            epoch, in_epoch = self._epoch, self._in_epoch
            batch = (epoch.peek(index) if _peeking() else epoch.serve(index)) if in_epoch else None
        if batch is None:  # outside an epoch, asked again, or out of order without shuffling: read on demand
            batch = self.iterator.batch(epoch.assigned[index] if in_epoch else index, epoch.number)
        batch = padded(batch)  # ragged fields (boxes) as Keras takes them: dense, padded with -1
        inputs = (select(batch, self.x),)
        if self.y is None:
            return inputs
        targets = (select(batch, self.y),)
        return inputs + targets + ((batch[self.sample_weight],) if self.sample_weight else ())

    def on_epoch_begin(self) -> None:
        """Keras starts an epoch: its requests are served from the pass (before, Keras only peeks)."""
        with self._lock:
            self._in_epoch = True

    def on_epoch_end(self) -> None:
        """Keras ends an epoch: move to the next one if every batch of this one was served (Keras also
        calls this after peeking at a batch or two)."""
        with self._lock:
            self._in_epoch = False
            if len(self._epoch.assigned) == len(self):
                self._start(self._epoch.number + 1)

    def set_epoch(self, epoch: int) -> None:
        with self._lock:
            self._start(int(epoch))

    def _start(self, epoch: int) -> None:
        self._epoch.close()
        self._epoch = _Epoch(self.iterator, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The epoch to continue with, from its start: save it with the model checkpoint at the end of an
        epoch (Keras resumes epoch by epoch)."""
        return {"epoch": self.epoch, "batches_done": 0, **self.iterator.settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue with the epoch ``state`` names, from its start."""
        self.iterator.load_state_dict({**state, "batches_done": 0})
        self.set_epoch(state["epoch"])

    def stats(self) -> dict[str, float]:
        """Is Keras waiting for data? See `BatchIterator.stats`."""
        return self.iterator.stats()


class _Epoch:
    """One epoch's serving: which index got which batch of the pass (``assigned``), and the pass."""

    def __init__(self, iterator: BatchIterator, number: int) -> None:
        self.iterator, self.number = iterator, number
        self.assigned: dict[int, int] = {}  # index -> position of its batch in the epoch's order
        self.taken: set[int] = set()  # positions read on demand for an unshuffled dataset: the pass skips them
        self.position = 0  # the position of the pass's next batch
        self.peeked: dict[int, Batch] = {}  # batches of the pass Keras peeked at, by position, to serve again
        self._pass: Iterator[Batch] | None = None

    def serve(self, index: int) -> Batch | None:
        """The batch for ``index`` from the pass, or None when it is to be read on demand (at
        ``assigned[index]``)."""
        if index in self.assigned:
            return None
        first = min(self.peeked, default=None)
        if first is not None and (self.iterator.options.shuffle or index == first):
            self.assigned[index] = first
            return self.peeked.pop(first)
        while self.position in self.taken:
            self._next()
        if self.iterator.options.shuffle or index == self.position:
            self.assigned[index] = self.position
            return self._next()
        self.assigned[index] = index
        self.taken.add(index)
        return None

    def peek(self, index: int) -> Batch | None:
        """The batch for a peek at ``index``: the pass's next one, kept for the index the epoch asks first
        (for an unshuffled dataset, only when ``index`` is that position; else None: read on demand)."""
        if index in self.assigned or not (self.iterator.options.shuffle or index == self.position):
            return None
        position = self.position
        self.peeked[position] = self._next()
        return self.peeked[position]

    def _next(self) -> Batch:
        if self._pass is None:
            self.iterator.set_epoch(self.number)
            self.iterator.batches_done = self.position
            self._pass = iter(self.iterator)
        self.position += 1
        return next(self._pass)

    def close(self) -> None:
        if self._pass is not None:
            self._pass.close()


def _to_cuda() -> bool:
    """Whether Keras copies the batches to a CUDA GPU with PyTorch (its torch backend, a GPU there)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.cuda.is_available()


def _peeking() -> bool:
    """Whether Keras asks for a batch to build the model from it (its trainer's ``_symbolic_build``: the
    JAX and torch backends do so inside a one-batch epoch before the first), not to train on it."""
    frame = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return False
        if frame.f_code.co_name == "_symbolic_build" and frame.f_globals.get("__name__", "").startswith("keras"):
            return True
        frame = frame.f_back
    return False


def _store_sample_weight(store: BatchSource) -> str | None:
    """The store's one field with the ``sample_weight`` role, or None; several is an error, not a guess."""
    weights = [name for name, role in store.roles.items() if role == "sample_weight"]
    if len(weights) > 1:
        raise OptionError(f"{store.location} has {len(weights)} sample-weight fields {weights}: name the one to use "
                          "with sample_weight=, or sample_weight=None for none")
    return weights[0] if weights else None
