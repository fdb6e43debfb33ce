"""`mix`: several datasets read as one, each in a chosen share of every batch (`Mixture`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Unpack

from .adapters.keywords import TorchKeywords, split_torch_keywords
from .adapters.selection import FieldSelection
from .dataset import Dataset
from .errors import OptionError
from .iterate import BatchKeywords, BatchOptions
from .iterate.mixture import MixtureIterator, MixtureLayout, warn_uneven

if TYPE_CHECKING:
    import tensorflow as tf

    from .adapters.keras import KerasBatches
    from .adapters.torch_mixture import MixtureLoader


def mix(sources: Mapping[str, Dataset], *, weights: Mapping[str, float] | None = None,
        repeats: Mapping[str, float] | None = None, epoch_samples: int | None = None) -> Mixture:
    """Read ``sources`` as one dataset: by ``weights`` (each batch holds the sources in those shares), or by
    ``repeats`` (source ``s`` gives about ``repeats[s]`` times its samples an epoch; default 1 each). An
    epoch is ``epoch_samples`` samples (default: the sources' sizes added up), rounded to whole batches; a
    source asked for more than it has repeats its samples, one asked for fewer gives other samples each
    epoch (`outcore.iterate.mixture`).

    A batch holds each source in a fixed share, so an epoch of ``S`` batches gives each source ``S`` times
    its share: its size, every sample once, only when the sizes are in the batch's proportions. Otherwise
    a few samples of a source repeat and a few of another wait for the next epoch (others each epoch);
    ``mixture.layout(batch_size)`` gives the counts, and with the default repeats an `OutcoreWarning` says
    so when the batches are made.

    >>> mixture = outcore.mix({"base": base, "curated": curated}, weights={"base": 0.9, "curated": 0.1})
    ...                                                                     # doctest: +SKIP
    >>> for batch in mixture.batches(256, seed=0):  # 230 base and 26 curated samples each  # doctest: +SKIP
    ...     ...
    """
    return Mixture(sources, weights=weights, repeats=repeats, epoch_samples=epoch_samples)


class Mixture:
    """Datasets read as one (made by `mix`), with the ways to train on it of a `Dataset`: `batches`,
    `keras`, `tf` and `torch` take the same options (but ``indices`` and ``drop_last``)."""

    def __init__(self, sources: Mapping[str, Dataset], *, weights: Mapping[str, float] | None,
                 repeats: Mapping[str, float] | None, epoch_samples: int | None) -> None:
        self.sources = dict(sources)
        if len(self.sources) < 1 or not all(isinstance(ds, Dataset) for ds in self.sources.values()):
            raise OptionError("mix() takes a dict of one or more outcore datasets by name "
                              "({'base': outcore.open_dataset(...), ...})")
        if weights is not None and repeats is not None:
            raise OptionError("mix() takes weights= or repeats=, not both")
        self.concatenated = weights is None and repeats is None  # the default: each source's size an epoch
        if self.concatenated:
            repeats = dict.fromkeys(self.sources, 1.0)
        given = weights if weights is not None else repeats or {}
        if set(given) != set(self.sources) or any(float(value) < 0 for value in given.values()) \
                or not sum(float(value) for value in given.values()) > 0:
            what = "weights" if weights is not None else "repeats"
            raise OptionError(f"{what}= must give each source ({list(self.sources)}) a number of 0 or more, not all "
                              f"0; got {dict(given)}")
        if epoch_samples is not None and epoch_samples < 1:
            raise OptionError(f"epoch_samples={epoch_samples} must be 1 or more")
        self.weights, self.repeats, self.epoch_samples = weights, repeats, epoch_samples
        self.spec_store = next(iter(self.sources.values()))  # what the fields hold (the same in every source)

    def __repr__(self) -> str:
        given = self.weights if self.weights is not None else self.repeats or {}
        what = "weight" if self.weights is not None else "repeats"
        parts = ", ".join(f"{name} ({len(ds):,} samples, {what} {given[name]:g})" for name, ds in self.sources.items())
        length = self.layout(1).steps  # at a batch of one, an epoch's steps are its samples
        return f"<outcore.Mixture of {parts}; epochs of about {length:,} samples>"

    @property
    def roles(self) -> dict[str, str]:
        """The fields' roles (input, target, sample_weight, ...), as the first source has them."""
        return self.spec_store.roles

    @property
    def location(self) -> str:
        return "the mixture of " + ", ".join(f"{name} ({ds.location})" for name, ds in self.sources.items())

    def layout(self, batch_size: int, world_size: int = 1) -> MixtureLayout:
        """Each source's samples per batch and per epoch at ``batch_size`` on ``world_size`` ranks."""
        def ordered(values: Mapping[str, float] | None) -> tuple[float, ...] | None:
            return None if values is None else tuple(float(values[name]) for name in self.sources)

        return MixtureLayout.of(tuple(len(ds) for ds in self.sources.values()), batch_size=batch_size,
                                world_size=world_size, weights=ordered(self.weights), repeats=ordered(self.repeats),
                                epoch_samples=self.epoch_samples)

    def batches(self, batch_size: int, **options: Unpack[BatchKeywords]) -> MixtureIterator:
        """Iterate in batches of ``batch_size`` samples, each source's share of every batch read by its own
        chunk-aware iterator (`outcore.iterate.mixture.MixtureIterator`); the options of `Dataset.batches`."""
        iterator = MixtureIterator(self.sources, BatchOptions.of(batch_size, options), weights=self.weights,
                                   repeats=self.repeats, epoch_samples=self.epoch_samples)
        if self.concatenated and self.epoch_samples is None:
            warn_uneven(self.sources, iterator.layout, batch_size)
        return iterator

    def keras(self, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
              sample_weight: str | None = "auto", **options: Unpack[BatchKeywords]) -> KerasBatches:
        """A ``keras.utils.PyDataset`` of the mixture: see `Dataset.keras`."""
        from .adapters.keras import KerasBatches

        return KerasBatches(self, batch_size, x=x, y=y, sample_weight=sample_weight, **options)

    def tf(self, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
           **options: Unpack[BatchKeywords]) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of the mixture: see `Dataset.tf`."""
        from .adapters.tf import dataset

        return dataset(self, batch_size, x=x, y=y, **options)

    def torch(self, batch_size: int, *, channels_first: bool = False,
              **options: Unpack[TorchKeywords]) -> MixtureLoader:
        """A ``torch.utils.data.DataLoader`` of the mixture's batches (dicts of tensors), made by outcore's
        threads (``num_workers=0``), the rank taken from ``torch.distributed`` at the first use unless
        given; ``shuffle`` is on unless ``shuffle=False``.

        >>> for batch in mixture.torch(256, channels_first=True):  # doctest: +SKIP
        ...     ...
        """
        from .adapters.torch_mixture import MixtureBatches, MixtureLoader

        batch_keywords, dataloader_options = split_torch_keywords(options)
        given = (batch_keywords.pop("rank", 0), batch_keywords.pop("world_size", 1)) \
            if "rank" in batch_keywords or "world_size" in batch_keywords else None

        def make(rank: int, world_size: int) -> MixtureIterator:
            return self.batches(batch_size, rank=rank, world_size=world_size, **batch_keywords)

        return MixtureLoader(MixtureBatches(make, channels_first, given), **dataloader_options)
