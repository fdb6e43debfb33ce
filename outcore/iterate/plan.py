"""Shuffle plans: which samples each rank reads in an epoch, and in which order. Pure, and lazy: a plan
holds O(chunks) integers, and makes the samples of any stretch of the epoch on demand.

The order is elastic: it is fixed by the *global* batch (``batch_size x world_size``) and a number of
canonical ``streams`` (default `default_streams`: 8, or the least multiple of 8 and the world size), not
by how many ranks or loader workers read it, so the samples of every global step (the union of the
ranks' batches at that step) are the same on every number of ranks dividing ``streams`` (1, 2, 4 and 8
by default) and with any number of DataLoader workers, and a run stopped at step ``k`` resumes at step
``k`` on another such number of ranks. An epoch is built in three steps, all seeded by ``(seed, epoch)``,
each use of randomness in its own seed domain (`outcore.seeds`):

1. **Chunk order.** The store's chunks are permuted (storage order when ``shuffle=False``), giving
   a stream of all samples that is contiguous within each chunk.
2. **Streams and steps** (`EpochSteps`). The epoch has ``S = ceil(N / G)`` global steps of ``G``
   samples (``floor`` with ``drop_last``, which leaves out the short last one), the last one short.
   Stream ``s`` of ``C`` gives ``floor((s + 1) G / C) - floor(s G / C)`` samples to every step (and its
   share of the last one, by the same rule on its size), and is the contiguous span of the chunk stream
   that makes those samples, buffer-shuffled on its own (`outcore.iterate.stream`, seeded by the
   stream's number; each stream's buffer is ``ceil(buffer_chunks / C)`` chunks, so a step draws on
   about ``max(buffer_chunks, C)`` chunks). Rank ``r`` of ``W`` owns streams ``[r C / W, (r + 1) C / W)``
   (``W`` must divide ``C``): by the rule above its streams give exactly ``G / W`` samples to every full
   step, so it reads only its own share of the chunks, and its batch at step ``k`` is its streams'
   samples of step ``k``, stream after stream.
3. **Equal counts.** Every rank makes the same number of batches (a rank with one batch more would
   wait forever at its first collective operation): ``S``. In the short last step the ranks' shares
   differ by one sample at most; the ranks short of one repeat the first samples of the epoch's chunk
   stream, one each (torch's ``DistributedSampler`` rule), so every rank gets ``ceil(N / W)`` samples;
   with one rank, nothing is repeated.

Without ``shuffle`` there is one stream per rank (``C = W``): each rank reads its contiguous part of the
store in storage order, so predictions line up with the store's rows (the steps then depend on ``W``).

Loader workers of a rank either make whole batches of the rank, taking turns (worker ``w`` of ``n`` makes
steps ``w, w + n, ...``, as a DataLoader asks them), or, with ``part=(w, n)``, worker ``w`` makes its
**part** of every batch: the samples of its share of the rank's streams, so that each worker reads only
its streams' chunks (`outcore.adapters.torch.OutcoreLoader` joins the parts); either way the batches do
not depend on their number.
A subset (``indices``) is read the same way: the chunk stream holds only each chunk's selected samples
(`outcore.iterate.stream.Selection`), so it is read chunk by chunk, chunks with none selected not at all.

The result is a function of ``(seed, epoch, rank, world_size, batch_size, streams)``, the store's
``(num_samples, chunk_size)`` and the subset only, so it can be recomputed anywhere: that is what makes
resuming mid-epoch and running on other processes exact.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import OptionError
from ..imaging.windows import interleave
from ..seeds import Domain, permutation
from .stream import Selection, StreamPlan, span_slots, streams_slots

DEFAULT_STREAMS = 8  # global steps the same on 1, 2, 4 and 8 ranks


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

    def steps(self, total: int, first: int = 0) -> range:
        """The rank's steps of ``[first, total)`` this worker makes: the workers take turns, from ``first``.

        >>> list(Consumer(worker=1, num_workers=3).steps(10, first=2))
        [3, 6, 9]
        """
        return range(first + self.worker, max(first, total), self.num_workers)


def default_streams(world_size: int) -> int:
    """The canonical streams of an epoch on ``world_size`` ranks when ``streams=`` is left out: the least
    multiple of `DEFAULT_STREAMS` and ``world_size``. Every world size runs; the order is the same on 1, 2, 4
    and 8 ranks (8 streams), and a run on 3, 6, 12 or 24 ranks (24 streams) resumes on any of those and on
    1, 2, 4 or 8. Each rank has ``8 / gcd(8, world_size)`` streams (8 at most, as on one rank), so what a
    rank holds and reads stays within one rank's.

    >>> tuple(default_streams(w) for w in (1, 2, 4, 8, 3, 6, 12, 16, 24, 1024))
    (8, 8, 8, 8, 24, 24, 24, 16, 24, 1024)
    """
    if world_size < 1:
        raise OptionError(f"world_size={world_size} must be at least 1")
    return math.lcm(DEFAULT_STREAMS, world_size)


def check_streams(streams: int, world_size: int) -> None:
    """A world size the streams cannot be shared among is an `OptionError` saying what to do.

    >>> check_streams(8, 3)
    Traceback (most recent call last):
    ...
    outcore.errors.OptionError: world_size=3 does not divide streams=8: the order of an epoch is ...
    """
    if streams < 1:
        raise OptionError(f"streams={streams} must be at least 1")
    if streams % world_size:
        raise OptionError(
            f"world_size={world_size} does not divide streams={streams}: the order of an epoch is made of "
            f"streams that the ranks share, so pass streams= a multiple of every world size you run on (e.g. "
            f"streams={math.lcm(streams, world_size)}), the same in every run that resumes another; it changes "
            "the order"
        )


def chunk_order(num_chunks: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's chunk permutation (storage order without ``shuffle``)."""
    if not shuffle:
        return np.arange(num_chunks, dtype=np.int64)
    return permutation(Domain.CHUNK_ORDER, (seed, epoch), num_chunks)


def next_use(num_chunks: int, *, shuffle: bool, seed: int, epoch: int, consumers: int = 1) -> np.ndarray:
    """When each chunk is read again, in epochs: ``epoch + 1`` plus how far into its stream of the next
    epoch it comes (the ``consumers`` streams are read side by side). A cache smaller than the store
    keeps the chunks read soonest (`outcore.storage.ChunkCache.expect`).

    >>> next_use(4, shuffle=False, seed=0, epoch=0).tolist()
    [1.0, 1.25, 1.5, 1.75]
    >>> next_use(4, shuffle=False, seed=0, epoch=0, consumers=2).tolist()
    [1.0, 1.5, 1.0, 1.5]
    """
    order = chunk_order(num_chunks, shuffle=shuffle, seed=seed, epoch=epoch + 1)
    position = np.empty(num_chunks, dtype=np.float64)
    position[order] = np.arange(num_chunks)
    return epoch + 1 + (position * consumers / max(1, num_chunks)) % 1.0


def batches_in(samples: int, batch_size: int, drop_last: bool = False) -> int:
    """How many batches ``samples`` samples make: the last one short, or dropped with ``drop_last``.

    >>> batches_in(10, 4), batches_in(10, 4, drop_last=True)
    (3, 2)
    """
    full, rest = divmod(samples, batch_size)
    return full + (rest > 0 and not drop_last)


def _even(total: int, parts: int) -> np.ndarray:
    """``total`` cut in ``parts`` by ``floor((i + 1) total / parts) - floor(i total / parts)``: any ``W``
    dividing ``parts`` and ``total`` sees sums of ``total / W`` over consecutive groups of ``parts / W``."""
    edges = np.arange(parts + 1, dtype=np.int64) * total // parts
    return np.diff(edges)


@dataclass(frozen=True)
class EpochSteps:
    """How an epoch of ``num_samples`` is cut into global steps of ``global_batch`` samples and shared among
    ``streams`` (see the module docstring): ``steps`` steps; stream ``s`` gives ``takes[s]`` samples to
    each full step, ``last[s]`` to the last one, and reads span ``[edges[s], edges[s + 1])`` of ``lengths[s]``.

    >>> steps = EpochSteps(1000, 256, 8)
    >>> steps.steps, steps.takes.tolist(), steps.last.tolist()
    (4, [32, 32, 32, 32, 32, 32, 32, 32], [29, 29, 29, 29, 29, 29, 29, 29])
    >>> steps.rank_batch(3, 0, 2), steps.rank_batch(3, 1, 2)  # the last step: 116 and 116 of 232
    (116, 116)
    """

    num_samples: int
    global_batch: int
    streams: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.num_samples < 0 or self.global_batch < 1:
            raise OptionError(f"need num_samples >= 0 and a batch of 1 or more; got {self.num_samples}, "
                              f"{self.global_batch}")
        check_streams(self.streams, 1)

    # Computed once each (a plan reads them for every stream and batch); the arrays are read-only.
    @cached_property
    def steps(self) -> int:
        return batches_in(self.num_samples, self.global_batch, self.drop_last)

    @cached_property
    def takes(self) -> np.ndarray:
        return _frozen(_even(self.global_batch, self.streams))

    @cached_property
    def last(self) -> np.ndarray:
        """Each stream's samples in the last step."""
        if self.steps == 0:
            return _frozen(np.zeros(self.streams, np.int64))
        return _frozen(_even(self.num_samples - (self.steps - 1) * self.global_batch if not self.drop_last
                             else self.global_batch, self.streams))

    @cached_property
    def lengths(self) -> np.ndarray:
        return _frozen(np.maximum(self.steps - 1, 0) * self.takes + self.last)

    @cached_property
    def edges(self) -> np.ndarray:
        """Where each stream's span of the chunk stream starts, and the last one's end."""
        return _frozen(np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64))

    def rank_streams(self, rank: int, world_size: int) -> range:
        check_streams(self.streams, world_size)
        per_rank = self.streams // world_size
        return range(rank * per_rank, (rank + 1) * per_rank)

    def rank_batch(self, step: int, rank: int, world_size: int) -> int:
        """Samples of rank ``rank``'s own streams in step ``step`` (before the last step's repeats)."""
        shares = self.last if step == self.steps - 1 else self.takes
        return int(shares[self.rank_streams(rank, world_size)].sum())

    def padded(self, world_size: int) -> int:
        """Samples of every rank in the last step, with the repeats: ``ceil(last step / world_size)``."""
        return -(-int(self.last.sum()) // world_size) if self.steps else 0


def _frozen(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values


def part_streams(streams: range, part: int, parts: int) -> range:
    """The streams of part ``part`` of ``parts`` of a rank's ``streams``: a consecutive share (at least one).

    >>> part_streams(range(8, 16), 1, 3), part_streams(range(8), 0, 1)
    (range(10, 13), range(0, 8))
    """
    if not 0 <= part < parts <= len(streams):
        raise OptionError(f"part {part} of {parts}: a rank's {len(streams)} streams make at most {len(streams)} parts")
    return streams[part * len(streams) // parts : (part + 1) * len(streams) // parts]


class EpochPlan:
    """One rank's epoch (see the module docstring): ``len(plan)`` samples in emission order, batch ``k``
    at positions ``[k * batch_size, (k + 1) * batch_size)``, made on demand by `take`; ``chunks[j]`` is
    the store chunk of slot ``j`` and ``slot_sizes[j]`` how many of its samples the rank reads. Slots are
    numbered in the order the rank first reads them (a chunk appears in two slots only when it is cut
    between two streams, or holds a repeated sample). With ``indices`` (sorted store indices: a subset,
    or a mixture's source, whose indices may repeat), the epoch is made of those samples only. With ``part``,
    ``(w, n)``, the plan makes part ``w`` of each batch: its streams' samples (`part_streams`), the repeat in
    the last part; positions still count the rank's batches of ``batch_size``.

    >>> plan = EpochPlan(10, 4, batch_size=4, shuffle=False)  # storage order
    >>> plan.take(0, len(plan))[0].tolist(), plan.chunks.tolist()
    ([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 2])
    >>> plan = EpochPlan(10, 4, batch_size=4, buffer_chunks=0, streams=2)  # stream 0: 5 samples, stream 1: 5
    >>> [plan.step(k)[0].tolist() for k in range(plan.steps)]
    [[0, 1, 5, 6], [2, 3, 7, 8], [4, 9]]
    >>> EpochPlan(10, 4, batch_size=4, shuffle=False, indices=np.array([1, 2, 9])).take(0, 3)[0].tolist()
    [1, 2, 9]
    """

    PLANNED = 4  # the spans `step` looks in: a schedule plans blocks of 16 batches, its consumer a block behind at most

    def __init__(self, num_samples: int, chunk_size: int, *, batch_size: int, shuffle: bool = True, seed: int = 0,
                 epoch: int = 0, buffer_chunks: int = 8, rank: int = 0, world_size: int = 1,
                 drop_last: bool = False, streams: int | None = None, indices: np.ndarray | None = None,
                 part: tuple[int, int] = (0, 1)) -> None:
        if chunk_size < 1 or buffer_chunks < 0 or batch_size < 1:
            raise OptionError(f"need chunk_size >= 1, buffer_chunks >= 0 and batch_size >= 1; got {chunk_size}, "
                              f"{buffer_chunks}, {batch_size}")
        Consumer(rank, world_size)
        selection = Selection(num_samples, chunk_size, indices)
        streams = world_size if not shuffle else default_streams(world_size) if streams is None else streams
        self.layout = EpochSteps(len(selection), batch_size * world_size, streams, drop_last)
        self.chunk_size, self.batch_size, self.rank, self.world_size = chunk_size, batch_size, rank, world_size
        mixed = shuffle and buffer_chunks > 0
        self.window = -(-buffer_chunks // streams) if mixed else 1
        order = chunk_order(math.ceil(num_samples / chunk_size), shuffle=shuffle, seed=seed, epoch=epoch)
        layout, owned = self.layout, part_streams(self.layout.rank_streams(rank, world_size), *part)
        slots = streams_slots(selection, order, layout.edges[owned.start : owned.stop + 1])
        self.streams = [StreamPlan(selection, made, window=self.window, mixed=mixed, key=(seed, epoch, s, streams))
                        for s, made in zip(owned, slots, strict=True)]
        self.stream_numbers = tuple(owned)
        self.takes, self.last = layout.takes[owned], layout.last[owned]
        self.steps = layout.steps
        before = slice(layout.rank_streams(rank, world_size).start, owned.start)  # the rank's streams before the part's
        self._offsets = int(layout.takes[before].sum()), int(layout.last[before].sum())  # in a full step, in the last
        self._length = 0 if not self.steps else self.steps * batch_size if drop_last else \
            (self.steps - 1) * batch_size + layout.padded(world_size)
        self._pad = self._repeat(selection, order) if part[0] == part[1] - 1 else None  # the last part's
        self._number_slots()
        self._planned: deque[tuple[int, int, np.ndarray, np.ndarray, list[int]]] = deque(maxlen=self.PLANNED)
        self._full_pieces: tuple[tuple[int, int], ...] | None = None  # `pieces` of a full step (all alike)

    def _repeat(self, selection: Selection, order: np.ndarray) -> tuple[int, int, int] | None:
        """``(chunk, sample, position)`` of the sample this rank repeats in the last step, if it is short of
        one: the chunk stream's sample ``position``."""
        layout = self.layout
        if not layout.steps or self.world_size == 1:
            return None
        last = layout.steps - 1
        short = [layout.rank_batch(last, r, self.world_size) < layout.padded(self.world_size)
                 for r in range(self.rank + 1)]
        if not short[-1]:
            return None
        position = sum(short) - 1  # the ranks short of one repeat the chunk stream's first samples, in rank order
        chunks, first, _ = span_slots(selection, order, (position, position + 1))
        return int(chunks[0]), int(selection.sample(chunks, first)[0]), position

    def _number_slots(self) -> None:
        """Rank slots: every stream's slots (and the repeat's), numbered by the step they are first read at."""
        steps, chunks, sizes = [], [], []  # each stream's: the step each slot is first read at, its chunk, its size
        last = self.steps - 1
        for stream, take in zip(self.streams, self.takes.tolist(), strict=True):
            first = stream.first_emitted()
            steps.append(np.minimum(first // take, last) if take else np.full(len(first), last))
            chunks.append(stream.chunks)
            sizes.append(stream.slot_sizes)
        if self._pad is not None:
            steps.append(np.array([last]))
            chunks.append(np.array([self._pad[0]]))
            sizes.append(np.array([1]))
        rank_order = np.argsort(np.concatenate(steps), kind="stable")  # by step, then stream, then slot: as listed
        self.chunks = np.concatenate(chunks)[rank_order].astype(np.int64)
        self.slot_sizes = np.concatenate(sizes)[rank_order].astype(np.int64)
        number = np.empty(len(rank_order), np.int64)
        number[rank_order] = np.arange(len(rank_order))
        bounds = np.cumsum([0] + [len(c) for c in chunks])
        self._numbers = [number[bounds[i] : bounds[i + 1]] for i in range(len(chunks))]

    @property
    def repeats(self) -> int:
        """Samples this rank repeats at the end of its last batch (0 or 1) to make its share equal."""
        return int(self._pad is not None)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return (f"EpochPlan({len(self)} samples in {self.steps} batches of {self.batch_size}, {len(self.chunks)} "
                f"slots, {len(self.streams)} streams)")

    def _pieces(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Each own stream's ``[start, stop)`` in step ``step``."""
        if step < self.steps - 1:
            return step * self.takes, (step + 1) * self.takes
        return step * self.takes, step * self.takes + self.last

    def step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(samples, slots)`` of batch ``step``: each stream's samples of the step, then the repeat. Taken from the
        spans planned last (`PLANNED` of them) where one holds it: a run's consumer asks for the samples of each batch
        its producer planned a little earlier (`outcore.adapters.torch_batches`), on the training loop's thread."""
        for first, stop, samples, slots, bounds in reversed(tuple(self._planned)):  # a copy: the producer adds to it
            if first <= step < stop:
                break
        else:
            first, (samples, slots, bounds) = step, self.span(step, step + 1)
        low, high = bounds[step - first], bounds[step - first + 1]
        return samples[low:high].copy(), slots[low:high].copy()  # the spans' own arrays stay as planned

    def span(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """``(samples, slots, bounds)`` of batches ``first`` to ``stop - 1``, batch after batch (`step`'s each):
        batch ``first + k``'s at ``[bounds[k], bounds[k + 1])``. Planned together: each stream's samples of all
        of them taken at once, then dealt to their batches (a schedule plans batches so, a few at a time).

        >>> plan = EpochPlan(10, 4, batch_size=4, buffer_chunks=0, streams=2)
        >>> samples, slots, bounds = plan.span(0, 3)
        >>> samples.tolist(), bounds
        ([0, 1, 5, 6, 2, 3, 7, 8, 4, 9], [0, 4, 8, 10])
        """
        stop = min(stop, self.steps)
        if first >= stop:
            return np.empty(0, np.int64), np.empty(0, np.int64), [0]
        counts = np.tile(self.takes, (stop - first, 1))  # (batches, streams): each stream's share of each
        if stop == self.steps:
            counts[-1] = self.last
        samples, slots = [], []  # each stream's, its slots numbered as the stream numbers them
        for stream, start, count in zip(self.streams, (first * self.takes).tolist(), counts.sum(axis=0).tolist()):
            stream_samples, stream_slots = stream.take(start, start + count)
            samples.append(stream_samples)
            slots.append(stream_slots)
        numbers = self._numbers  # the rank's number of each stream's slots (and of the repeat's)
        if self._pad is not None and stop == self.steps:
            samples.append(np.array([self._pad[1]]))
            slots.append(np.zeros(1, np.int64))
            counts = np.concatenate([counts, np.zeros((len(counts), 1), counts.dtype)], axis=1)
            counts[-1, -1] = 1
        if not samples:
            return np.empty(0, np.int64), np.empty(0, np.int64), [0] * (stop - first + 1)
        samples_all = interleave(samples, counts)  # one C call each, the GIL kept: numpy's calls give it up a stream
        if samples_all is not None:
            slots_all = interleave(slots, counts, numbers[: len(slots)])
        else:
            samples_all = np.concatenate(samples).astype(np.int64, copy=False)
            slots_all = np.concatenate([table[part] for table, part in zip(numbers, slots)]).astype(np.int64, copy=False)
            if len(counts) > 1 and counts.shape[1] > 1:  # stream after stream, to batch after batch
                order = batch_major(counts)
                samples_all, slots_all = samples_all[order], slots_all[order]
        bounds = [0, *np.cumsum(counts.sum(axis=1)).tolist()]
        self._planned.append((first, stop, samples_all, slots_all, bounds))
        return samples_all, slots_all, bounds

    def pieces(self, step: int) -> tuple[tuple[int, int], ...]:
        """``(key, samples)`` of each piece of batch ``step``, in the batch's order: each own stream's share,
        keyed by the stream's number in the epoch, then the repeat, keyed ``streams + position`` (its place in
        the chunk stream); empty pieces left out. A batch is augmented piece by piece, each piece drawing from
        a generator of its key (`outcore.iterate.batch.batch_draws`), so the samples of a global step are
        augmented alike on any number of ranks and loader workers.

        >>> EpochPlan(10, 4, batch_size=4, buffer_chunks=0, streams=2).pieces(2)
        ((0, 1), (1, 1))
        >>> [EpochPlan(9, 4, batch_size=2, streams=2, rank=r, world_size=2).pieces(2) for r in (0, 1)]  # 1 sample left
        [((2, 1),), ((1, 1),)]
        """
        if step < self.steps - 1:  # every full step's pieces are alike: found once
            if self._full_pieces is None:
                self._full_pieces = self._made_pieces(step)
            return self._full_pieces
        return self._made_pieces(step)

    def _made_pieces(self, step: int) -> tuple[tuple[int, int], ...]:
        starts, stops = self._pieces(step)
        pieces = [(number, int(stop - start)) for number, start, stop in zip(self.stream_numbers, starts, stops,
                                                                               strict=True)]
        if self._pad is not None and step == self.steps - 1:
            pieces.append((self.layout.streams + self._pad[2], 1))
        return tuple(piece for piece in pieces if piece[1])

    def with_samples(self, steps: Sequence[int]) -> Sequence[int]:
        """The steps of ``steps`` where this plan (a part's) has samples; a range where ``steps`` is one (the
        schedule of a range starts at once; of a list, it first counts every step's samples). The full steps
        all give a part the same share, so they all have samples or none; the short last step may differ.

        >>> EpochPlan(9, 4, batch_size=4, streams=8, part=(0, 2)).with_samples(range(3))  # 1 sample left
        range(0, 2)
        """
        if not (isinstance(steps, range) and steps.step == 1):
            return [step for step in steps if self.pieces(step)]
        last = self.steps - 1
        full, tail = last > 0 and bool(self.pieces(0)), last >= 0 and bool(self.pieces(last))
        if full == tail:
            return steps if full else range(0)
        if full:  # every step but the short last one
            return range(steps.start, min(steps.stop, last))
        return [last] if last in steps else []

    def placement(self, step: int) -> tuple[int, int]:
        """``(offset, size)``: where this part's samples of batch ``step`` start in the rank's batch, and the
        rank's batch's size (a whole plan's part starts at 0).

        >>> [EpochPlan(100, 10, batch_size=16, streams=4, part=(w, 2)).placement(6) for w in (0, 1)]  # 4 left
        [(0, 4), (2, 4)]
        """
        offset = self._offsets[step == self.steps - 1]
        return offset, min(self.batch_size, self._length - step * self.batch_size)

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(samples, slots)`` of emission positions ``[start, stop)``: the store's sample index and the
        slot it is read from, for each."""
        start, stop = max(0, start), min(len(self), stop)
        if start >= stop:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        samples, slots = [], []
        for step in range(start // self.batch_size, (stop - 1) // self.batch_size + 1):
            step_samples, step_slots = self.step(step)
            low = max(start - step * self.batch_size, 0)
            high = stop - step * self.batch_size
            samples.append(step_samples[low:high])
            slots.append(step_slots[low:high])
        return np.concatenate(samples), np.concatenate(slots)

    def emitted_before(self, position: int) -> np.ndarray:
        """How many samples of each slot are emitted before ``position``."""
        done = np.zeros(len(self.chunks), dtype=np.int64)
        if position <= 0:  # a run from the epoch's start (`schedule`)
            return done
        if position >= len(self):
            return self.slot_sizes.copy()
        step, offset = divmod(position, self.batch_size)
        starts, stops = self._pieces(step)
        into = np.cumsum(np.concatenate([[0], stops - starts]))[:-1]  # where each piece starts in the batch
        for i, stream in enumerate(self.streams):
            count = int(starts[i]) + int(np.clip(offset - into[i], 0, stops[i] - starts[i]))
            done[self._numbers[i]] += stream.emitted_before(count)
        return done


def batch_major(counts: np.ndarray) -> np.ndarray:
    """Where each item of the batch-major order is in the stream-major one, for ``counts[b, s]`` items of stream
    ``s`` in batch ``b``: items stream after stream (each stream's batch after batch) to batch after batch (each
    batch's stream after stream).

    >>> batch_major(np.array([[2, 1], [2, 1]])).tolist()  # stream 0: a0 a1 b0 b1, stream 1: a2 b2
    [0, 1, 4, 2, 3, 5]
    """
    stream_major = np.cumsum(counts.sum(axis=0)) - counts.sum(axis=0) + np.cumsum(counts, axis=0) - counts
    sizes = counts.ravel()
    batch_major_starts = np.cumsum(sizes) - sizes
    return np.repeat(stream_major.ravel() - batch_major_starts, sizes) + np.arange(int(sizes.sum()))
