"""Mixtures of stores: batches that hold each source in a fixed share, every epoch, read chunk-aware.

A mixture's batch of ``B`` samples (on each of ``W`` ranks) holds ``b_s`` samples of source ``s``: ``B``
apportioned by the sources' weights (largest remainders, in source order), the same in every batch. An
epoch is ``S`` global steps (``round(L / (B W))``, at least one) of a length ``L`` (default: the sources'
sizes added up), so source ``s`` gives ``n_s = S W b_s`` samples an epoch: every sample ``n_s // N_s``
times and ``n_s % N_s`` others drawn without replacement, seeded by ``(seed, epoch, s)``: a source
smaller than its share is repeated, a larger one is sub-sampled, with other samples each epoch.
With ``repeats`` instead of weights, ``n_s`` is about ``repeats[s] x N_s`` and the weights follow from
it: ``S W b_s``, a whole number of shares, is ``repeats[s] x N_s`` only when the sizes are in the
batch's proportions (`warn_uneven` says so for the default repeats of 1).

Each source is read by a `BatchIterator` of its own over that multiset of its samples (a subset with
repeats: `outcore.iterate.options.Subset`), with its share ``b_s`` as batch size, so every source is
read chunk by chunk, each of its chunks once an epoch, ranks each reading their own share, and the
mixture's batch ``k`` is the sources' batches ``k`` one after the other. The order is a function of
``(seed, epoch)``, the sources' sizes and the batch layout ``(B, W)``: a state resumes exactly on the same
number of ranks.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import OptionError, OutcoreWarning
from ..format import offsets_name, ragged_names
from ..seeds import Domain, generator
from ..storage import Store
from .batch import Batch, joined_offsets
from .iterator import BatchIterator
from .options import BatchOptions, Subset, check_state
from .process import kept_loader
from .readers import sample_spec
from .stats import LoaderStats, Stats


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` cut in parts proportional to ``weights``: floors, then one more to the largest remainders
    (the first source first on a tie).

    >>> apportion(256, np.array([0.9, 0.1])).tolist(), apportion(10, np.array([1, 1, 1])).tolist()
    ([230, 26], [4, 3, 3])
    """
    exact = total * np.asarray(weights, dtype=np.float64) / np.sum(weights)
    parts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - parts), kind="stable")
    parts[order[: total - int(parts.sum())]] += 1
    return parts


@dataclasses.dataclass(frozen=True)
class MixtureLayout:
    """How a mixture of sources of ``sizes`` is cut into batches of ``batch_size`` on ``world_size`` ranks
    (see the module docstring): ``per_batch[s]`` samples of each source in each batch, ``steps`` an epoch,
    ``per_epoch[s]`` samples of each source an epoch.

    >>> layout = MixtureLayout.of((10_000, 500), batch_size=256, weights=(0.9, 0.1))
    >>> layout.per_batch.tolist(), layout.steps, layout.per_epoch.tolist()
    ([230, 26], 41, [9430, 1066])
    """

    per_batch: np.ndarray
    steps: int
    per_epoch: np.ndarray

    @classmethod
    def of(cls, sizes: tuple[int, ...], *, batch_size: int, world_size: int = 1,
           weights: tuple[float, ...] | None = None, repeats: tuple[float, ...] | None = None,
           epoch_samples: int | None = None) -> MixtureLayout:
        counts = np.asarray(sizes, dtype=np.float64)
        if repeats is not None:
            wanted = counts * np.asarray(repeats, dtype=np.float64)
            shares, length = wanted, float(wanted.sum()) if epoch_samples is None else float(epoch_samples)
        else:
            shares = np.asarray(weights, dtype=np.float64)
            length = float(counts.sum()) if epoch_samples is None else float(epoch_samples)
        per_batch = apportion(batch_size, shares)
        steps = max(1, round(length / (batch_size * world_size)))
        return cls(per_batch, steps, steps * world_size * per_batch)


def warn_uneven(sources: Mapping[str, Store], layout: MixtureLayout, batch_size: int) -> None:
    """An `OutcoreWarning` when a mixture's epochs do not give each source its size (the default repeats
    of 1 ask for every sample once), saying what they give instead.

    >>> warn_uneven({"a": range(1003), "b": range(500)}, MixtureLayout.of((1003, 500), batch_size=10,
    ...             repeats=(1, 1)), 10)  # doctest: +SKIP
    OutcoreWarning: mix(): a batch of 10 holds 7 of a and 3 of b, so an epoch of 150 batches gives a 1,050 ...
    """
    sizes = [len(store) for store in sources.values()]
    if list(layout.per_epoch) == sizes:
        return
    shares = " and ".join(f"{count} of {name}" for name, count in zip(sources, layout.per_batch, strict=True))
    gives = []
    for name, size, count in zip(sources, sizes, layout.per_epoch.tolist(), strict=True):
        if count > size:
            gives.append(f"{name} {count:,} ({count - size:,} of its {size:,} samples twice)")
        elif count < size:
            gives.append(f"{name} {count:,} ({size - count:,} of its {size:,} samples left for another epoch)")
        else:
            gives.append(f"{name} {count:,} (each sample once)")
    warnings.warn(f"mix(): a batch of {batch_size} holds {shares} samples, so an epoch of {layout.steps:,} batches "
                  f"gives {', '.join(gives)}; which samples differs each epoch. A batch holds each source in a fixed "
                  "share: every sample once an epoch needs sizes in those proportions. Pass repeats= or weights= "
                  "to choose (this warning is for the default)", OutcoreWarning, stacklevel=3)


def epoch_samples_of(size: int, count: int, seed: int, epoch: int, source: int) -> np.ndarray:
    """The samples source ``source`` (of ``size``) gives epoch ``epoch``, ``count`` of them: each one
    ``count // size`` times, and ``count % size`` others drawn without replacement.

    >>> epoch_samples_of(4, 10, 0, 0, 0).tolist().count(0) in (2, 3)
    True
    """
    times, rest = divmod(count, size)
    drawn = generator(Domain.MIXTURE, seed, epoch, source).choice(size, rest, replace=False)
    return np.sort(np.concatenate([np.repeat(np.arange(size, dtype=np.int64), times), drawn.astype(np.int64)]))


class MixtureIterator:
    """Batches of a mixture of ``stores`` (see the module docstring), each a dict of numpy arrays with
    the sources' samples one source after the other; the `BatchIterator` protocol: ``len``, iteration
    (a full pass moves to the next epoch), `set_epoch`, `batch`, `state_dict`/`load_state_dict`, `stats`,
    `close`.

    >>> it = outcore.mix({"base": base, "curated": curated}, weights={"base": 0.9, "curated": 0.1}
    ...                  ).batches(256, seed=0)  # doctest: +SKIP
    """

    def __init__(self, stores: Mapping[str, Store], options: BatchOptions, *, weights: Mapping[str, float] | None,
                 repeats: Mapping[str, float] | None, epoch_samples: int | None) -> None:
        if options.indices is not None:
            raise OptionError("indices= selects samples of one store: a mixture takes each source whole "
                              "(mix subsets by ingesting them, or by weights)")
        if options.drop_last:
            raise OptionError("a mixture's batches are all whole (its epoch is a number of whole batches): "
                              "leave drop_last= out")
        self.stores, self.options = dict(stores), options
        self.names = list(self.stores)
        self.fields = _common_fields(self.stores, options.fields)
        sizes = tuple(len(store) for store in self.stores.values())
        self.layout = MixtureLayout.of(
            sizes, batch_size=options.batch_size, world_size=options.world_size,
            weights=None if weights is None else tuple(weights[name] for name in self.names),
            repeats=None if repeats is None else tuple(repeats[name] for name in self.names),
            epoch_samples=epoch_samples)
        empty = [name for name, count in zip(self.names, self.layout.per_batch, strict=True) if count == 0]
        if empty:
            raise OptionError(f"batch_size={options.batch_size} gives source(s) {empty} no sample per batch at "
                              "their weight: use a larger batch, or larger weights")
        self.seeds = [int(generator(Domain.MIXTURE, options.seed, i).integers(2**31)) for i in range(len(sizes))]
        self.epoch, self.batches_done = 0, 0
        self._pass: list[BatchIterator] | None = None
        # with ``process``: each source's process making its part of the batches, kept across epochs
        self._processes = [kept_loader(self, options) if options.process else None for _ in self.names]
        self._stats = LoaderStats()
        self._counts = dict.fromkeys(self.names, 0)

    def __len__(self) -> int:
        return self.layout.steps

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.batches_done = int(epoch), 0

    def sources(self, epoch: int) -> list[BatchIterator]:
        """Each source's iterator of ``epoch``: its share of each batch, over that epoch's samples of it."""
        made = []
        for i, (name, store) in enumerate(self.stores.items()):
            samples = epoch_samples_of(len(store), int(self.layout.per_epoch[i]), self.options.seed, epoch, i)
            options = dataclasses.replace(self.options, batch_size=int(self.layout.per_batch[i]), seed=self.seeds[i],
                                          fields=self.fields, indices=Subset(samples, repeats=True))
            iterator = BatchIterator(store, options, self._processes[i])
            iterator.set_epoch(epoch)
            made.append(iterator)
        return made

    def __iter__(self) -> Iterator[Batch]:
        if self.batches_done >= len(self):
            self.set_epoch(self.epoch + 1)
        self._end_pass()
        self._pass = sources = self.sources(self.epoch)
        for source in sources:
            source.batches_done = self.batches_done
        passes = [iter(source) for source in sources]
        try:
            while self.batches_done < len(self):
                asked = time.perf_counter()
                parts = [next(each) for each in passes]
                batch = self._join(parts)
                self._stats.record(time.perf_counter() - asked, 0, sum(len(p[self.fields[0]]) for p in parts))
                for name, part in zip(self.names, parts, strict=True):
                    self._counts[name] += len(part[self.fields[0]])
                self.batches_done += 1
                yield batch
            self.set_epoch(self.epoch + 1)
        finally:
            for each in passes:
                each.close()
            self._end_pass()

    def batch(self, index: int, epoch: int | None = None) -> Batch:
        """Batch ``index`` of ``epoch`` (default: the current one), read on demand (see `BatchIterator.batch`)."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is not in [0, {len(self)})")
        sources = self.sources(self.epoch if epoch is None else epoch)
        return self._join([source.batch(index) for source in sources])

    def _join(self, parts: list[Batch]) -> Batch:
        """The sources' batches, one after the other; fields of other sample shapes (a transform that
        does not crop pictures of varying sizes to one) are an `OptionError` naming the sources."""
        joined = {}
        offsets = {offsets_name(name) for name in ragged_names(parts[0])}
        for field in parts[0]:
            if field in offsets:  # each source's rows come after the rows of those before it
                joined[field] = joined_offsets([part[field] for part in parts])
                continue
            shapes = {name: part[field].shape[1:] for name, part in zip(self.names, parts, strict=True)}
            if len(set(shapes.values())) > 1:
                raise OptionError(f"field {field!r} has samples of other shapes in the mixture's sources {shapes}: "
                                  "give them one shape (ingest with one shape=, or crop in the transform)")
            joined[field] = np.concatenate([part[field] for part in parts])
        return joined

    def settings(self) -> dict[str, Any]:
        """What fixes the order of every epoch: a state must have been taken with the same."""
        kept = {key: value for key, value in self.options.plan_settings().items() if key != "indices"}
        sources = {name: {"num_samples": len(store), "chunk_size": store.chunk_size, "per_batch": int(per_batch)}
                   for (name, store), per_batch in zip(self.stores.items(), self.layout.per_batch, strict=True)}
        return {**kept, "batch_size": self.options.batch_size, "world_size": self.options.world_size,
                "steps": self.layout.steps, "sources": sources}

    def state_dict(self) -> dict[str, Any]:
        """Where this mixture stands: JSON-serialisable; it loads on the same number of ranks."""
        return {"epoch": self.epoch, "batches_done": self.batches_done, **self.settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.settings(), "mixture")
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])

    def stats(self) -> dict[str, float]:
        """`BatchIterator.stats`, and ``samples_<source>``: the samples each source gave since."""
        return Stats({**self._stats.summary(), **{f"samples_{name}": count for name, count in self._counts.items()}})

    def reset_stats(self) -> None:
        self._stats, self._counts = LoaderStats(), dict.fromkeys(self.names, 0)

    def _end_pass(self) -> None:
        """Stop the sources' background threads (at the end of a pass, or on ``break``)."""
        for source in self._pass or ():
            source.close()
        self._pass = None

    def close(self) -> None:
        """Stop the sources' background threads, and end their processes (``process=True``: the next iteration
        starts others)."""
        self._end_pass()
        for loader in self._processes:
            if loader is not None:
                loader.close()


def _common_fields(stores: Mapping[str, Store], fields: tuple[str, ...] | None) -> tuple[str, ...]:
    """The fields a mixture reads (default: those every source has, with an `OutcoreWarning` naming those
    left out), each with one sample shape and dtype, and one class list, in every source: anything else is
    an `OptionError` naming the sources."""
    first = next(iter(stores.values()))
    if fields is None:
        fields = tuple(name for name in first.fields if all(name in store for store in stores.values()))
        left_out = {source: [name for name in store.fields if name not in fields] for source, store in stores.items()}
        left_out = {source: names for source, names in left_out.items() if names}
        if left_out:
            warnings.warn(f"the mixture reads the fields every source has, {list(fields)}; left out: {left_out} "
                          "(pass fields= to choose them)", OutcoreWarning, stacklevel=4)
    for name in fields:
        missing = [source for source, store in stores.items() if name not in store]
        if missing:
            raise OptionError(f"field {name!r} is not in the mixture's source(s) {missing}")
        classes = {source: tuple(store.classes_of(name)) for source, store in stores.items()}
        if len(set(classes.values())) > 1:
            raise OptionError(f"field {name!r} numbers other classes in the mixture's sources {classes}: a label "
                              "would mean another class in each; ingest them with one class list")
        specs = {source: sample_spec(store, name) for source, store in stores.items()}
        kinds = {source: (shape, dtype.kind if dtype.kind == "U" else dtype.str) for source, (shape, dtype)
                 in specs.items()}
        if len(set(kinds.values())) > 1:
            raise OptionError(f"field {name!r} has other sample shapes or dtypes in the mixture's sources {kinds}")
    return tuple(fields)
