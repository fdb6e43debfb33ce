"""How random is an epoch? Label mixing per batch, next to a fully random permutation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..seeds import Domain, permutation
from ..storage import Store
from .plan import EpochPlan
from .readers import chunk_reader


@dataclass(frozen=True)
class ShuffleQuality:
    """Mean total-variation distance between each batch's label histogram and the whole store's.

    0 means every batch has the store's class proportions; a fully random permutation scores
    ``random`` (not 0: a batch is a finite sample), and a class-sorted stream scores close to 1.
    ``ratio`` is ``outcore / random``: 1.0 is as good as a full shuffle.
    """

    outcore: float
    random: float
    batches: int

    @property
    def ratio(self) -> float:
        return self.outcore / self.random if self.random else float("inf")

    def __str__(self) -> str:
        return (f"label TV distance per batch: outcore {self.outcore:.4f}, full random permutation "
                f"{self.random:.4f} (ratio {self.ratio:.2f}, over {self.batches} batches)")


def shuffle_quality(
    store: Store,
    *,
    field: str | None = None,
    batch_size: int = 256,
    buffer_chunks: int = 8,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    streams: int | None = None,
) -> ShuffleQuality:
    """Score the shuffled order of ``ds.batches(...)`` with these settings on a label ``field``: every
    rank's batches of ``batch_size`` when the epoch is shared by ``world_size`` ranks.

    Only the labels are read. ``field`` defaults to the first of the store's `label_fields`.

    >>> print(outcore.shuffle_quality(ds, batch_size=256))  # doctest: +SKIP
    label TV distance per batch: outcore 0.0621, full random permutation 0.0598 (ratio 1.04, ...)
    """
    field = field or next(iter(label_fields(store)), None)
    if field is None:
        raise OptionError(f"{store.location} has no target field of one label per sample; name the label field "
                          "with field=")
    batches = len(store) // batch_size
    if batches == 0:
        raise OptionError(f"batch_size={batch_size} is larger than the store ({len(store)} samples)")
    reader = chunk_reader(store, field)
    labels = np.concatenate([reader.read(chunk) for chunk in range(store.num_chunks)]).astype(np.int64)
    plans = [EpochPlan(len(store), store.chunk_size, batch_size=batch_size, shuffle=True, seed=seed, epoch=epoch,
                       buffer_chunks=buffer_chunks, rank=rank, world_size=world_size, streams=streams)
             for rank in range(world_size)]
    order = permutation(Domain.REFERENCE, (seed, epoch), len(store))
    outcore = np.mean([mean_label_tv(labels, plan.take(0, len(plan))[0], batch_size) for plan in plans])
    return ShuffleQuality(float(outcore), mean_label_tv(labels, order, batch_size), batches)


def label_fields(store: Store) -> list[str]:
    """The target fields of one value per sample (class labels, a regression's numbers), in the store's order: not
    a picture's maps, boxes or keypoints.

    >>> label_fields(outcore.open_dataset("coco.zarr"))  # doctest: +SKIP
    []
    """
    return [name for name, role in store.roles.items()
            if role == "target" and not store.info(name).in_regions and store.array(name).ndim == 1]


def mean_label_tv(labels: np.ndarray, order: np.ndarray, batch_size: int) -> float:
    """The mean total-variation distance between the label histogram of each full batch of ``order`` (sample
    indices) and that of all ``labels``.

    >>> mean_label_tv(np.array([0, 0, 1, 1]), np.array([0, 2, 1, 3]), 2)
    0.0
    """
    _, codes = np.unique(labels, return_inverse=True)
    classes = int(codes.max()) + 1
    batches = len(order) // batch_size
    ordered = codes[order[: batches * batch_size]].reshape(batches, batch_size)
    counts = np.zeros((batches, classes))
    np.add.at(counts, (np.arange(batches)[:, None], ordered), 1)
    overall = np.bincount(codes, minlength=classes) / len(codes)
    return float(0.5 * np.abs(counts / batch_size - overall).sum(axis=1).mean())
