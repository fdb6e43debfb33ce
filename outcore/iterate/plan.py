"""Shuffle plans: which samples each consumer reads in an epoch, and in which order. Pure, and lazy:
a plan holds O(chunks) integers, and makes the samples of any stretch of the epoch on demand.

A *consumer* is one (rank, worker) pair: ``world_size`` training processes times ``num_workers``
loader workers each. The plan for an epoch is built in three steps, all seeded by ``(seed, epoch)``,
each use of randomness in its own seed domain (`outcore.seeds`):

1. **Chunk order.** The store's chunks are permuted (storage order when ``shuffle=False``), giving
   a stream of all samples that is contiguous within each chunk.
2. **Sharding.** Every rank gets the same number of samples, so that every rank makes the same number
   of batches (a rank with one batch more would wait forever at its first collective operation):
   ``ceil(N / world_size)`` samples each, the last ranks repeating up to ``world_size - 1`` samples from
   the start of the stream, or, with ``drop_last``, ``floor(N / world_size)`` each, up to
   ``world_size - 1`` samples from the end of the stream left out (torch's ``DistributedSampler`` rule).
   With one rank, nothing is repeated or left out. Each rank's span is cut into one contiguous span per
   worker, of near-equal sizes (differing by one sample at most). A consumer's span, cut at chunk
   boundaries, is its list of *slots*: slot ``j`` is the ``j``-th stretch of one chunk it reads.
3. **Buffer shuffle** (``shuffle`` with ``buffer_chunks = B > 0``). Each slot's samples are dealt at
   random to the *windows* ``j, j + 1, ..., j + B - 1`` (a multinomial draw of how many go to each,
   then a seeded permutation of the slot says which), and the epoch emits window after window, each in
   a seeded random order. This is the rule "sample of slot ``j`` gets the key ``j + B * u``, ``u``
   uniform in [0, 1); emit in key order", drawn window by window: a sample of slot ``j`` is emitted
   between chunk-times ``j`` and ``j + B``, so a reader that loads slots in order holds a bounded
   number of chunks at once (`outcore.iterate.schedule`), and every batch draws from about ``B``
   chunks. Without the buffer shuffle each window is one slot, in stream order.

Window sizes are known from the draws alone (O(slots x B) integers), so finding the samples of
emission positions ``[start, stop)`` costs a binary search and the windows that cover them: a plan
starts, resumes mid-epoch or answers a batch by index without making the whole epoch's order. The
result is a function of ``(seed, epoch, rank, world_size, worker, num_workers)`` and the store's
``(num_samples, chunk_size)`` only, so it can be recomputed anywhere: that is what makes resuming
mid-epoch and running on other processes exact.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..seeds import Domain, generator


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


def chunk_order(num_chunks: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's chunk permutation (storage order without ``shuffle``)."""
    if not shuffle:
        return np.arange(num_chunks, dtype=np.int64)
    return generator(Domain.CHUNK_ORDER, seed, epoch).permutation(num_chunks).astype(np.int64)


def next_use(num_chunks: int, *, shuffle: bool, seed: int, epoch: int, consumers: int = 1) -> np.ndarray:
    """When each chunk is read again, in epochs: ``epoch + 1`` plus how far into its consumer's share of
    the next epoch it comes (the ``consumers`` read their shares side by side). A cache smaller than the
    store keeps the chunks read soonest (`outcore.storage.ChunkCache.expect`).

    >>> next_use(4, shuffle=False, seed=0, epoch=0).tolist()
    [1.0, 1.25, 1.5, 1.75]
    >>> next_use(4, shuffle=False, seed=0, epoch=0, consumers=2).tolist()
    [1.0, 1.5, 1.0, 1.5]
    """
    order = chunk_order(num_chunks, shuffle=shuffle, seed=seed, epoch=epoch + 1)
    position = np.empty(num_chunks, dtype=np.float64)
    position[order] = np.arange(num_chunks)
    return epoch + 1 + (position * consumers / max(1, num_chunks)) % 1.0


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


def batches_in(samples: int, batch_size: int, drop_last: bool = False) -> int:
    """How many batches ``samples`` samples make: the last one short, or dropped with ``drop_last``.

    >>> batches_in(10, 4), batches_in(10, 4, drop_last=True)
    (3, 2)
    """
    full, rest = divmod(samples, batch_size)
    return full + (rest > 0 and not drop_last)


def batch_count(num_samples: int, consumer: Consumer, batch_size: int, drop_last: bool = False) -> int:
    """Batches per epoch of ``consumer``: its span in batches, the last one short unless ``drop_last``.

    >>> batch_count(1000, Consumer(0, 3), 100)  # a span of 334 samples
    4
    """
    start, stop = span(num_samples, consumer, drop_last)
    return batches_in(stop - start, batch_size, drop_last)


def rank_batch_count(num_samples: int, rank: int, world_size: int, num_workers: int, batch_size: int,
                     drop_last: bool = False) -> int:
    """Batches per epoch of one rank, over all its workers: the same for every rank.

    >>> [rank_batch_count(1023, r, 2, 1, 256, drop_last=True) for r in range(2)]
    [1, 1]
    """
    return sum(batch_count(num_samples, Consumer(rank, world_size, w, num_workers), batch_size, drop_last)
               for w in range(num_workers))


class EpochPlan:
    """One consumer's epoch (see the module docstring): ``len(plan)`` samples in emission order, made on
    demand by `take`; ``chunks[j]`` is the store chunk of slot ``j`` and ``slot_sizes[j]`` how many of its
    samples the consumer reads (a chunk appears in two slots only when a rank repeats samples).

    >>> plan = EpochPlan(10, 4, shuffle=False)
    >>> plan.take(0, len(plan))[0].tolist(), plan.chunks.tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2])
    """

    def __init__(self, num_samples: int, chunk_size: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                 buffer_chunks: int = 8, consumer: Consumer = Consumer(), drop_last: bool = False) -> None:
        if num_samples < 0 or chunk_size < 1 or buffer_chunks < 0:
            raise OptionError(
                f"need num_samples >= 0, chunk_size >= 1, buffer_chunks >= 0; "
                f"got {num_samples}, {chunk_size}, {buffer_chunks}"
            )
        self.chunk_size = chunk_size
        self.mixed = shuffle and buffer_chunks > 0
        self.window = buffer_chunks if self.mixed else 1  # B: the windows a slot's samples are dealt to
        self._key = (seed, epoch, consumer.index, consumer.count)
        order = chunk_order(math.ceil(num_samples / chunk_size), shuffle=shuffle, seed=seed, epoch=epoch)
        self.chunks, self._first, self.slot_sizes = _slots(num_samples, chunk_size, order,
                                                           span(num_samples, consumer, drop_last))
        if self.mixed:  # how many samples of slot j go to window j + d: (slots, B)
            self.deals = generator(Domain.BUFFER_SHUFFLE, *self._key).multinomial(
                self.slot_sizes, np.full(self.window, 1 / self.window)).astype(np.int64)
        else:
            self.deals = self.slot_sizes[:, None]
        self._deal_ends = np.cumsum(self.deals, axis=1)
        window_sizes = np.zeros(len(self.chunks) + self.window - 1, dtype=np.int64)
        for d in range(self.window):
            window_sizes[d : d + len(self.chunks)] += self.deals[:, d]
        self.window_ends = np.cumsum(window_sizes)
        self._cache: dict[int, np.ndarray] = {}  # slot -> its samples' local indices, in dealing order
        self._windows: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # window -> (samples, slots)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.slot_sizes.sum())

    def __repr__(self) -> str:
        return f"EpochPlan({len(self)} samples in {len(self.chunks)} slots, window {self.window})"

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(samples, slots)`` of emission positions ``[start, stop)``: the store's sample index and the
        slot it is read from, for each."""
        start, stop = max(0, start), min(len(self), stop)
        if start >= stop:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        first = int(np.searchsorted(self.window_ends, start, side="right"))
        last = int(np.searchsorted(self.window_ends, stop - 1, side="right"))
        samples, slots = [], []
        for w in range(first, last + 1):
            begin = int(self.window_ends[w - 1]) if w else 0
            low, high = max(start, begin) - begin, min(stop, int(self.window_ends[w])) - begin
            window_samples, window_slots = self.window_contents(w)
            samples.append(window_samples[low:high])
            slots.append(window_slots[low:high])
        return np.concatenate(samples), np.concatenate(slots)  # copies: the windows stay as made

    def window_contents(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """``(samples, slots)`` of window ``w``, in emission order (the last few are kept: consecutive
        batches draw on the same window)."""
        with self._lock:
            made = self._windows.get(w)
        if made is None:
            made = self._make_window(w)
            with self._lock:
                self._windows = {v: m for v, m in self._windows.items() if abs(v - w) <= 2}
                self._windows[w] = made
        return made

    def _make_window(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        low = max(0, w - self.window + 1)
        slots = np.arange(low, min(w + 1, len(self.chunks)))
        groups = [self._dealt(int(j), w - int(j)) for j in slots]
        local = np.concatenate(groups) if groups else np.empty(0, np.int64)
        owner = np.repeat(slots, [len(g) for g in groups])
        if self.mixed:
            permutation = generator(Domain.WINDOW_ORDER, *self._key, w).permutation(len(local))
            local, owner = local[permutation], owner[permutation]
        return self.chunks[owner] * self.chunk_size + local, owner

    def _dealt(self, slot: int, d: int) -> np.ndarray:
        """The local indices of slot ``slot``'s samples dealt to window ``slot + d``."""
        with self._lock:
            dealt = self._cache.get(slot)
            if dealt is None:
                dealt = self._first[slot] + np.arange(self.slot_sizes[slot])
                if self.mixed:
                    dealt = dealt[generator(Domain.BUFFER_SHUFFLE, *self._key, slot).permutation(len(dealt))]
                near = self.window + 2  # the slots a window or two around this one draws on
                self._cache = {j: v for j, v in self._cache.items() if abs(j - slot) <= near}
                self._cache[slot] = dealt
        end = int(self._deal_ends[slot, d])
        return dealt[end - int(self.deals[slot, d]) : end]

    def emitted_before(self, position: int) -> np.ndarray:
        """How many samples of each slot are emitted before ``position``."""
        done = np.zeros(len(self.chunks), dtype=np.int64)
        w = int(np.searchsorted(self.window_ends, position, side="right"))  # the window holding ``position``
        for d in range(self.window):  # windows before ``w`` are whole
            count = max(0, min(len(self.chunks), w - d))
            done[:count] += self.deals[:count, d]
        if position < len(self):
            before = position - (int(self.window_ends[w - 1]) if w else 0)
            done += np.bincount(self.window_contents(w)[1][:before], minlength=len(self.chunks))
        return done


def _slots(num_samples: int, chunk_size: int, order: np.ndarray, bounds: tuple[int, int]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The consumer's slots: each one's store chunk, first local index and size, from its stream span
    ``bounds``; positions from ``num_samples`` on repeat the stream from its start."""
    start, stop = bounds
    if start >= stop or num_samples == 0:
        return (np.empty(0, np.int64),) * 3
    sizes = np.minimum(chunk_size, num_samples - order * chunk_size)
    ends = np.cumsum(sizes)
    laps = range(start // num_samples, (stop - 1) // num_samples + 1)
    cuts = np.concatenate([lap * num_samples + np.concatenate([[0], ends]) for lap in laps])
    cuts = np.unique(np.clip(cuts, start, stop))
    begins = cuts[:-1]
    _lap, position = np.divmod(begins, num_samples)
    stretch = np.searchsorted(ends, position, side="right")
    chunks = order[stretch]
    first = position - (ends[stretch] - sizes[stretch])
    return chunks.astype(np.int64), first.astype(np.int64), np.diff(cuts).astype(np.int64)
