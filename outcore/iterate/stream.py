"""One stream of an epoch: a contiguous span of the epoch's chunk stream, buffer-shuffled. Pure, and lazy:
a stream holds O(slots x window) integers, and makes the samples of any stretch of it on demand.

The span, cut at chunk boundaries, is a list of *slots*: slot ``j`` is the ``j``-th stretch of one chunk
it reads. With the buffer shuffle (``window = B``), each slot's samples are dealt at random to the
*windows* ``j, j + 1, ..., j + B - 1`` (a multinomial draw of how many go to each, then a seeded
permutation of the slot says which), and the stream emits window after window, each in a seeded random
order. This is the rule "sample of slot ``j`` gets the key ``j + B * u``, ``u`` uniform in [0, 1); emit
in key order", drawn window by window: a sample of slot ``j`` is emitted between chunk-times ``j`` and
``j + B``, so a reader that loads slots in order holds a bounded number of chunks at once
(`outcore.iterate.schedule`). Without the buffer shuffle each window is one slot, in stream order.

Window sizes are known from the draws alone, so finding the samples of emission positions
``[start, stop)`` costs a binary search and the windows that cover them.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from functools import cached_property

import numpy as np

from ..seeds import Domain, generator, permutation, window_draws

KEPT_WINDOWS = 2  # a stream keeps its windows this close to the last one made: consecutive batches draw on the same;
# a take of more than this many windows (a C run's whole span) makes them in one call and keeps none

Slots = tuple[np.ndarray, np.ndarray, np.ndarray]  # a span's slots: each one's store chunk, first local index, size


class Selection:
    """The samples an epoch is made of, chunk by chunk: all ``num_samples`` of a store in chunks of
    ``chunk_size``, or only ``indices`` (sorted: a subset; a mixture's may repeat one, which is then read
    that many times). The chunk stream of an epoch holds, for each chunk in the epoch's chunk order, the
    chunk's selected samples (none for a chunk with none selected), so a subset is read chunk by chunk
    like the whole store.

    >>> part = Selection(10, 4, np.array([1, 2, 9]))
    >>> len(part), part.sizes.tolist(), part.sample(np.array([0, 2]), np.array([1, 0])).tolist()
    (3, [2, 0, 1], [2, 9])
    """

    def __init__(self, num_samples: int, chunk_size: int, indices: np.ndarray | None = None) -> None:
        self.num_samples, self.chunk_size, self.indices = num_samples, chunk_size, indices

    def __len__(self) -> int:
        return self.num_samples if self.indices is None else len(self.indices)

    @cached_property
    def sizes(self) -> np.ndarray:
        """How many samples of each of the store's chunks are selected."""
        chunks = -(-self.num_samples // self.chunk_size)
        if self.indices is None:
            return np.minimum(self.chunk_size, self.num_samples - np.arange(chunks, dtype=np.int64) * self.chunk_size)
        return np.bincount(self.indices // self.chunk_size, minlength=chunks).astype(np.int64)

    @cached_property
    def _offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def starts(self, chunks: np.ndarray) -> np.ndarray:
        """Where the selected samples of each of ``chunks`` start: in the store, or in ``indices`` (a subset's)."""
        return chunks * self.chunk_size if self.indices is None else self._offsets[chunks]

    def sample(self, chunks: np.ndarray, local: np.ndarray) -> np.ndarray:
        """The store's index of selected sample ``local`` (counted among the chunk's selected ones) of each
        of ``chunks``."""
        at = self.starts(chunks) + local
        return at if self.indices is None else self.indices[at]


class StreamPlan:
    """The samples of a span of an epoch's chunk stream, its ``slots`` (`span_slots`, `streams_slots`), in
    emission order, made on demand by `take`; ``chunks[j]`` is the store chunk of slot ``j`` and
    ``slot_sizes[j]`` how many of its samples the stream reads. ``key`` seeds the draws (each stream its
    own); ``mixed`` turns the buffer shuffle on, over ``window`` windows.

    >>> selection = Selection(10, 4)
    >>> stream = StreamPlan(selection, span_slots(selection, np.arange(3), (2, 9)), window=1, mixed=False, key=(0,))
    >>> stream.take(0, len(stream))[0].tolist(), stream.chunks.tolist()
    ([2, 3, 4, 5, 6, 7, 8], [0, 1, 2])
    """

    def __init__(self, selection: Selection, slots: Slots, *, window: int, mixed: bool, key: tuple[int, ...]) -> None:
        self.selection, self.mixed, self.window, self._key = selection, mixed, window, key
        self.chunks, self._first, self.slot_sizes = slots
        if mixed and window > 1:  # how many samples of slot j go to window j + d: (slots, window)
            self.deals = generator(Domain.BUFFER_SHUFFLE, *key).multinomial(
                self.slot_sizes, np.full(window, 1 / window)).astype(np.int64)
        else:  # each slot's samples all go to one window (a multinomial of one outcome draws nothing else)
            self.deals = self.slot_sizes[:, None].copy()
        self._deal_ends = np.cumsum(self.deals, axis=1)
        self._draws = window_draws(key, self._first, self.slot_sizes, self.deals, self._deal_ends, mixed,
                                   selection.starts(self.chunks), selection.indices)
        window_sizes = np.zeros(len(self.chunks) + self.deals.shape[1] - 1, dtype=np.int64)
        for d in range(self.deals.shape[1]):
            window_sizes[d : d + len(self.chunks)] += self.deals[:, d]
        self.window_ends = np.cumsum(window_sizes)
        self._ends = self.window_ends.tolist()  # searched at every take: `bisect` on a list, not numpy's searchsorted
        self._length = int(self.slot_sizes.sum())
        self._cache: dict[int, np.ndarray] = {}  # slot -> its samples' local indices, in dealing order
        self._windows: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # window -> (samples, slots)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"StreamPlan({len(self)} samples in {len(self.chunks)} slots, window {self.window})"

    def first_emitted(self) -> np.ndarray:
        """The emission position of the window where each slot's first sample is emitted."""
        if not len(self.chunks):
            return np.empty(0, np.int64)
        starts = np.concatenate([[0], self.window_ends])  # where each window starts
        if self.deals.shape[1] == 1:  # slot j's samples all in window j
            return starts[: len(self.chunks)]
        return starts[np.arange(len(self.chunks)) + np.argmax(self.deals > 0, axis=1)]  # the first window dealt any

    def take(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(samples, slots)`` of emission positions ``[start, stop)``: the store's sample index and the
        slot it is read from, for each (views of the window they lie in: do not write them)."""
        start, stop = max(0, start), min(self._length, stop)
        if start >= stop:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        ends = self._ends
        first, last = bisect.bisect_right(ends, start), bisect.bisect_right(ends, stop - 1)
        if self._draws is not None and last - first > KEPT_WINDOWS:  # a whole run's: its windows made in one call,
            before = ends[first - 1] if first else 0  # back to back, none kept
            samples, owner = self._draws(first, last + 1, ends[last] - before)
            return samples[start - before : stop - before], owner[start - before : stop - before]
        samples, slots = [], []
        for w, (window_samples, window_slots) in enumerate(self._windows_made(first, last + 1), start=first):
            begin = ends[w - 1] if w else 0
            low, high = max(start, begin) - begin, min(stop, ends[w]) - begin
            samples.append(window_samples[low:high])
            slots.append(window_slots[low:high])
        if len(samples) == 1:
            return samples[0], slots[0]
        return np.concatenate(samples), np.concatenate(slots)

    def window_contents(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """``(samples, slots)`` of window ``w``, in emission order."""
        return self._windows_made(w, w + 1)[0]

    def _windows_made(self, first: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """`window_contents` of windows ``first`` to ``stop - 1``: those not kept made together, from the first of them
        on (the last few are kept: consecutive batches draw on the same window)."""
        kept = self._windows  # a dict read is atomic: the lock guards the replacements
        missing = next((w for w in range(first, stop) if w not in kept), stop)
        if missing == stop:
            return [kept[w] for w in range(first, stop)]
        made = dict(zip(range(missing, stop), self._make_windows(missing, stop), strict=True))
        with self._lock:
            self._windows = {v: m for v, m in {**self._windows, **made}.items() if abs(v - (stop - 1)) <= KEPT_WINDOWS}
        return [made[w] if w in made else kept[w] for w in range(first, stop)]

    def _make_windows(self, first: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        if self._draws is None:
            return [self._make_window(w) for w in range(first, stop)]
        ends = self._ends  # one C call, the GIL kept: numpy's calls in `_make_window` give it up (to other threads) often
        before = ends[first - 1] if first else 0
        samples, owner = self._draws(first, stop, ends[stop - 1] - before)
        bounds = [0, *(ends[w] - before for w in range(first, stop))]
        return [(samples[low:high], owner[low:high]) for low, high in itertools.pairwise(bounds)]

    def _make_window(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w`` made by numpy's calls (`_make_windows` without the ``_draws`` extension)."""
        low = max(0, w - self.window + 1)
        slots = np.arange(low, min(w + 1, len(self.chunks)))
        groups = [self._dealt(int(j), w - int(j)) for j in slots]
        local = np.concatenate(groups) if groups else np.empty(0, np.int64)
        owner = np.repeat(slots, [len(g) for g in groups])
        if self.mixed:
            order = permutation(Domain.WINDOW_ORDER, (*self._key, w), len(local))
            local, owner = local[order], owner[order]
        return self.selection.sample(self.chunks[owner], local), owner

    def _dealt(self, slot: int, d: int) -> np.ndarray:
        """The local indices of slot ``slot``'s samples dealt to window ``slot + d``."""
        with self._lock:
            dealt = self._cache.get(slot)
            if dealt is None:
                dealt = self._first[slot] + np.arange(self.slot_sizes[slot])
                if self.mixed:
                    dealt = dealt[permutation(Domain.BUFFER_SHUFFLE, (*self._key, slot), len(dealt))]
                near = self.window + 2  # the slots a window or two around this one draws on
                self._cache = {j: v for j, v in self._cache.items() if abs(j - slot) <= near}
                self._cache[slot] = dealt
        end = int(self._deal_ends[slot, d])
        return dealt[end - int(self.deals[slot, d]) : end]

    def emitted_before(self, position: int) -> np.ndarray:
        """How many samples of each slot are emitted before ``position``."""
        done = np.zeros(len(self.chunks), dtype=np.int64)
        w = bisect.bisect_right(self._ends, position)  # the window holding ``position``
        for d in range(self.deals.shape[1]):  # windows before ``w`` are whole
            count = max(0, min(len(self.chunks), w - d))
            done[:count] += self.deals[:count, d]
        if position < self._length:
            before = position - (self._ends[w - 1] if w else 0)
            done += np.bincount(self.window_contents(w)[1][:before], minlength=len(self.chunks))
        return done


def span_slots(selection: Selection, order: np.ndarray, bounds: tuple[int, int]) -> Slots:
    """The slots of stream span ``bounds`` of the chunk stream ``order``: each one's store chunk, first
    local index (among the chunk's selected samples) and size; positions from ``len(selection)`` on repeat
    the stream from its start. Chunks with no sample selected make no slot.

    >>> [part.tolist() for part in span_slots(Selection(10, 4), np.array([2, 0, 1]), (1, 7))]
    [[2, 0, 1], [1, 0, 0], [1, 4, 1]]
    """
    return streams_slots(selection, order, np.array(bounds, np.int64))[0]


def streams_slots(selection: Selection, order: np.ndarray, edges: np.ndarray) -> list[Slots]:
    """`span_slots` of each of the consecutive spans ``[edges[k], edges[k + 1])`` of the chunk stream ``order`` (the
    streams of an epoch), found together: the chunk stream cut once at every chunk's end and every span's edge (a
    dozen numpy calls for all the spans, not for each).

    >>> [[part.tolist() for part in slots] for slots in streams_slots(Selection(10, 4), np.arange(3), np.array([0, 6, 10]))]
    [[[0, 1], [0, 0], [4, 2]], [[1, 2], [2, 0], [2, 2]]]
    """
    start, stop = int(edges[0]), int(edges[-1])
    num_samples = len(selection)
    if start >= stop or num_samples == 0:
        return [(np.empty(0, np.int64),) * 3 for _ in range(len(edges) - 1)]
    sizes = selection.sizes[order]
    ends = np.cumsum(sizes)
    laps = np.arange(start // num_samples, (stop - 1) // num_samples + 1, dtype=np.int64)
    chunk_ends = (laps[:, None] * num_samples + np.concatenate([[0], ends])).ravel()
    cuts = np.unique(np.concatenate([np.clip(chunk_ends, start, stop), edges]))
    position = cuts[:-1] % num_samples
    stretch = np.searchsorted(ends, position, side="right")
    chunks = order[stretch].astype(np.int64)
    first = (position - (ends[stretch] - sizes[stretch])).astype(np.int64)
    slot_sizes = np.diff(cuts).astype(np.int64)
    at = np.searchsorted(cuts, edges).tolist()  # each span's first slot: its edges are cuts
    return [(chunks[low:high], first[low:high], slot_sizes[low:high]) for low, high in itertools.pairwise(at)]
