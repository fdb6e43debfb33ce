"""Shuffle plans: which samples each consumer reads in an epoch, and in which order. Pure functions.

A *consumer* is one (rank, worker) pair: ``world_size`` training processes times ``num_workers``
loader workers each. The plan for an epoch is built in three steps, all seeded by ``(seed, epoch)``:

1. **Chunk order.** The store's chunks are permuted (storage order when ``shuffle=False``), giving
   a stream of all samples that is contiguous within each chunk.
2. **Sharding.** Every rank gets the same number of samples, so that every rank makes the same number
   of batches (a rank with one batch more would wait forever at its first collective operation):
   ``ceil(N / world_size)`` samples each, the last ranks repeating up to ``world_size - 1`` samples from
   the start of the stream, or, with ``drop_last``, ``floor(N / world_size)`` each, up to
   ``world_size - 1`` samples from the end of the stream left out (torch's ``DistributedSampler`` rule).
   With one rank, nothing is repeated or left out. Each rank's span is cut into one contiguous span per
   worker, of near-equal sizes (differing by one sample at most). A consumer reads only the chunks its
   span touches.
3. **Buffer shuffle.** Within a span, the sample at stream position ``p`` of the consumer's ``j``-th
   chunk gets the key ``j + buffer_chunks * u`` with ``u`` uniform in [0, 1), and samples are emitted
   in key order. A sample of chunk ``j`` is thus emitted between chunk-times ``j`` and
   ``j + buffer_chunks``, so a reader that loads chunks in stream order holds a bounded number of
   chunks at once (`outcore.iterate.schedule`), and every batch draws from about ``buffer_chunks`` chunks.

The result is a function of ``(seed, epoch, rank, world_size, worker, num_workers)`` and the store's
``(num_samples, chunk_size)`` only, so it can be recomputed anywhere: that is what makes resuming
mid-epoch and running on other processes exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError


@dataclass(frozen=True)
class Consumer:
    """Who reads: ``rank`` of ``world_size`` processes, ``worker`` of ``num_workers`` loader workers."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise OptionError(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise OptionError(f"worker={self.worker} must be in [0, num_workers={self.num_workers})")

    @property
    def index(self) -> int:
        """Position among all ``world_size * num_workers`` consumers (rank-major)."""
        return self.rank * self.num_workers + self.worker

    @property
    def count(self) -> int:
        return self.world_size * self.num_workers


@dataclass(frozen=True)
class EpochPlan:
    """One consumer's epoch: ``samples`` in emission order, and the chunks to read in stream order.

    ``chunks[j]`` is the store chunk of the consumer's ``j``-th *slot* (its ``j``-th stretch of the
    stream; a chunk appears twice only when a rank repeats samples, see the module docstring), and
    ``slots[i]`` the slot that ``samples[i]`` is read from.
    """

    samples: np.ndarray
    slots: np.ndarray
    chunks: np.ndarray

    def __len__(self) -> int:
        return len(self.samples)


def chunk_order(num_chunks: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's chunk permutation (storage order without ``shuffle``)."""
    if not shuffle:
        return np.arange(num_chunks, dtype=np.int64)
    return np.random.default_rng([seed, epoch, 0]).permutation(num_chunks).astype(np.int64)


def rank_samples(num_samples: int, world_size: int, drop_last: bool) -> int:
    """Samples every rank gets per epoch: the same for all ranks (see the module docstring).

    >>> rank_samples(1023, 2, drop_last=False), rank_samples(1023, 2, drop_last=True)
    (512, 511)
    """
    return num_samples // world_size if drop_last else -(-num_samples // world_size)


def span(num_samples: int, consumer: Consumer, drop_last: bool = False) -> tuple[int, int]:
    """``[start, stop)`` of the consumer's positions in the epoch's stream; positions from ``num_samples``
    on repeat the stream from its start. Spans of a rank's workers are near-equal and contiguous.

    >>> span(10, Consumer(1, 4)), span(10, Consumer(1, 4), drop_last=True)
    ((3, 6), (2, 4))
    """
    per_rank = rank_samples(num_samples, consumer.world_size, drop_last)
    base, extra = divmod(per_rank, consumer.num_workers)
    start = consumer.rank * per_rank + consumer.worker * base + min(consumer.worker, extra)
    return start, start + base + (consumer.worker < extra)


def batch_count(num_samples: int, consumer: Consumer, batch_size: int, drop_last: bool = False) -> int:
    """Batches per epoch of ``consumer``: its span in batches, the last one short unless ``drop_last``.

    >>> batch_count(1000, Consumer(0, 3), 100)  # a span of 334 samples
    4
    """
    start, stop = span(num_samples, consumer, drop_last)
    full, rest = divmod(stop - start, batch_size)
    return full + (rest > 0 and not drop_last)


def rank_batch_count(num_samples: int, rank: int, world_size: int, num_workers: int, batch_size: int,
                     drop_last: bool = False) -> int:
    """Batches per epoch of one rank, over all its workers: the same for every rank.

    >>> [rank_batch_count(1023, r, 2, 1, 256, drop_last=True) for r in range(2)]
    [1, 1]
    """
    return sum(batch_count(num_samples, Consumer(rank, world_size, w, num_workers), batch_size, drop_last)
               for w in range(num_workers))


def epoch_plan(
    num_samples: int,
    chunk_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    buffer_chunks: int = 8,
    consumer: Consumer = Consumer(),
    drop_last: bool = False,
) -> EpochPlan:
    """The consumer's samples for this epoch in emission order (see the module docstring).

    >>> plan = epoch_plan(10, 4, shuffle=False)
    >>> plan.samples.tolist(), plan.chunks.tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2])
    """
    if num_samples < 0 or chunk_size < 1 or buffer_chunks < 0:
        raise OptionError(
            f"need num_samples >= 0, chunk_size >= 1, buffer_chunks >= 0; "
            f"got {num_samples}, {chunk_size}, {buffer_chunks}"
        )
    num_chunks = math.ceil(num_samples / chunk_size)
    order = chunk_order(num_chunks, shuffle=shuffle, seed=seed, epoch=epoch)
    sizes = np.minimum(chunk_size, num_samples - order * chunk_size)
    ends = np.cumsum(sizes)
    start, stop = span(num_samples, consumer, drop_last)
    positions = np.arange(start, stop)
    lap, position = np.divmod(positions, max(1, num_samples))  # a lap past the end repeats the stream
    in_order = np.searchsorted(ends, position, side="right")  # which chunk of the epoch's stream
    samples = order[in_order] * chunk_size + (position - (ends[in_order] - sizes[in_order])) if len(positions) \
        else positions
    stretch = lap * num_chunks + in_order  # chunks of the stream, counted over laps
    first = stretch[0] if len(stretch) else 0
    slots = stretch - first
    chunks = order[np.unique(stretch) % max(1, num_chunks)] if len(stretch) else stretch
    if shuffle and buffer_chunks > 0:
        rng = np.random.default_rng([seed, epoch, 1, consumer.index, consumer.count])
        emission = np.argsort(slots + buffer_chunks * rng.random(len(slots)), kind="stable")
        samples, slots = samples[emission], slots[emission]
    return EpochPlan(samples.astype(np.int64), slots.astype(np.int64), chunks.astype(np.int64))
