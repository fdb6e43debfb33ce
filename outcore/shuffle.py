"""Shuffle plans: which samples each consumer reads in an epoch, and in which order. Pure functions.

A *consumer* is one (rank, worker) pair: ``world_size`` training processes times ``num_workers``
loader workers each. The plan for an epoch is built in three steps, all seeded by ``(seed, epoch)``:

1. **Chunk order.** The store's chunks are permuted (storage order when ``shuffle=False``), giving
   a stream of all samples that is contiguous within each chunk.
2. **Sharding.** The stream is cut into one contiguous span per consumer, of ``N // P`` or
   ``N // P + 1`` samples: spans are disjoint, cover every sample, and differ by at most one sample
   (so at most one batch). A consumer reads only the chunks its span touches; a chunk is split
   between two consumers at most at span boundaries.
3. **Buffer shuffle.** Within a span, the sample at stream position ``p`` of the consumer's ``j``-th
   chunk gets the key ``j + buffer_chunks * u`` with ``u`` uniform in [0, 1), and samples are emitted
   in key order. A sample of chunk ``j`` is thus emitted between chunk-times ``j`` and
   ``j + buffer_chunks``, so a reader that loads chunks in stream order holds at most
   ``buffer_chunks + 1`` chunks at once, and every batch draws from about ``buffer_chunks`` chunks.

The result is a function of ``(seed, epoch, rank, world_size, worker, num_workers)`` and the store's
``(num_samples, chunk_size)`` only, so it can be recomputed anywhere: that is what makes resuming
mid-epoch and running on other processes exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Consumer:
    """Who reads: ``rank`` of ``world_size`` processes, ``worker`` of ``num_workers`` loader workers."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} must be in [0, world_size={self.world_size})")
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker={self.worker} must be in [0, num_workers={self.num_workers})")

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

    ``chunk_of[i]`` is the chunk of ``samples[i]``; ``chunks`` lists the chunks in the order a reader
    should load them, and ``last_use[k]`` is the emission position after which ``chunks[k]`` is no
    longer needed.
    """

    samples: np.ndarray
    chunks: np.ndarray
    last_use: np.ndarray

    def __len__(self) -> int:
        return len(self.samples)


def chunk_order(num_chunks: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's chunk permutation (storage order without ``shuffle``)."""
    if not shuffle:
        return np.arange(num_chunks, dtype=np.int64)
    return np.random.default_rng([seed, epoch, 0]).permutation(num_chunks).astype(np.int64)


def span(num_samples: int, consumer: Consumer) -> tuple[int, int]:
    """``[start, stop)`` of the consumer's share of the epoch's sample stream: near-equal, disjoint, complete."""
    base, extra = divmod(num_samples, consumer.count)
    start = consumer.index * base + min(consumer.index, extra)
    return start, start + base + (consumer.index < extra)


def batch_count(num_samples: int, consumer: Consumer, batch_size: int, drop_last: bool = False) -> int:
    """Batches per epoch of ``consumer``: its span in batches, the last one short unless ``drop_last``.

    >>> batch_count(1000, Consumer(0, 3), 100)  # a span of 334 samples
    4
    """
    start, stop = span(num_samples, consumer)
    full, rest = divmod(stop - start, batch_size)
    return full + (rest > 0 and not drop_last)


def epoch_plan(
    num_samples: int,
    chunk_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    buffer_chunks: int = 8,
    consumer: Consumer = Consumer(),
) -> EpochPlan:
    """The consumer's samples for this epoch in emission order (see the module docstring).

    >>> plan = epoch_plan(10, 4, shuffle=False)
    >>> plan.samples.tolist(), plan.chunks.tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2])
    """
    if num_samples < 0 or chunk_size < 1 or buffer_chunks < 0:
        raise ValueError(
            f"need num_samples >= 0, chunk_size >= 1, buffer_chunks >= 0; "
            f"got {num_samples}, {chunk_size}, {buffer_chunks}"
        )
    order = chunk_order(math.ceil(num_samples / chunk_size), shuffle=shuffle, seed=seed, epoch=epoch)
    sizes = np.minimum(chunk_size, num_samples - order * chunk_size)
    ends = np.cumsum(sizes)
    start, stop = span(num_samples, consumer)
    stream = np.arange(start, stop)
    rank_in_order = np.searchsorted(ends, stream, side="right")  # which chunk of the epoch's stream
    samples = order[rank_in_order] * chunk_size + (stream - (ends[rank_in_order] - sizes[rank_in_order]))
    position = rank_in_order - (rank_in_order[0] if len(stream) else 0)  # j: the consumer's j-th chunk
    if shuffle and buffer_chunks > 0:
        rng = np.random.default_rng([seed, epoch, 1, consumer.index, consumer.count])
        emission = np.argsort(position + buffer_chunks * rng.random(len(stream)), kind="stable")
        samples, position = samples[emission], position[emission]
    chunks = order[np.unique(rank_in_order)]
    last_use = np.zeros(len(chunks), dtype=np.int64)
    np.maximum.at(last_use, position, np.arange(len(samples)))
    return EpochPlan(samples.astype(np.int64), chunks.astype(np.int64), last_use)
