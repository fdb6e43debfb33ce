"""Where appended encoded pictures go: an order of the new samples in which every chunk's files fit the
room its region has (pure functions of the files' sizes: no store, no I/O).

An append places the new samples after the store's, in the order the part was shuffled into; a chunk's
files must fit the bytes its region holds (sized at ingest by the fullest chunk). `fitting_order` keeps
that order but for the fewest swaps that make every chunk fit, else packs them.

>>> fitting_order(np.array([9, 9, 1, 1]), first=0, used=0, chunk_size=2, capacity=10).tolist()
[2, 1, 0, 3]
"""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import SourceError


def chunk_loads(nbytes: np.ndarray, first: int, used: int, chunk_size: int) -> np.ndarray:
    slots = (first + np.arange(len(nbytes))) // chunk_size - first // chunk_size
    loads = np.bincount(slots, weights=nbytes, minlength=int(slots[-1]) + 1 if len(slots) else 1).astype(np.int64)
    loads[0] += used
    return loads


def fitting_order(nbytes: np.ndarray, first: int, used: int, chunk_size: int, capacity: int, name: str = "images",
                  shown: str = "the store") -> np.ndarray:
    """An order of samples of ``nbytes`` bytes, placed from sample ``first`` of a store on (the chunk
    ``first`` falls in already holds ``used`` bytes), in which each chunk's bytes fit ``capacity``: the
    given order, but for a few swaps of a sample of a chunk over capacity with a smaller one of the chunk
    with the most room; when swaps cannot make them fit, a packing of all of them (`packed_order`). A
    `SourceError` when that does not fit either.

    >>> fitting_order(np.array([9, 9, 1, 1]), 0, 0, 2, 10).tolist()
    [2, 1, 0, 3]
    """
    swapped = swapped_order(nbytes, first, used, chunk_size, capacity)
    if swapped is None:
        swapped = packed_order(nbytes, first, used, chunk_size, capacity)
    if swapped is None:
        raise SourceError(f"field {name!r}: the appended files are larger than the chunks of {shown} have room "
                          f"for ({capacity} bytes a chunk, sized at ingest by its largest): ingest all the files "
                          "again with overwrite=True")
    return swapped


def swapped_order(nbytes: np.ndarray, first: int, used: int, chunk_size: int, capacity: int) -> np.ndarray | None:
    """The given order with a few swaps that make every chunk fit (see `fitting_order`), or None."""
    order = np.arange(len(nbytes))
    slots = (first + order) // chunk_size - first // chunk_size
    loads = chunk_loads(nbytes, first, used, chunk_size)
    for _ in range(4 * len(nbytes) + 8):
        over = np.flatnonzero(loads > capacity)
        if not over.size:
            return order
        chunk, donor = over[0], int(np.argmin(loads))
        swap = _swap(nbytes[order], np.flatnonzero(slots == chunk), np.flatnonzero(slots == donor),
                     int(loads[chunk] - capacity), int(capacity - loads[donor]))
        if swap is None:
            return None
        big, small = swap
        delta = int(nbytes[order[big]] - nbytes[order[small]])
        order[[big, small]] = order[[small, big]]
        loads[chunk] -= delta
        loads[donor] += delta
    return None


def packed_order(nbytes: np.ndarray, first: int, used: int, chunk_size: int, capacity: int) -> np.ndarray | None:
    """An order in which every chunk fits, found by packing: the samples, largest first, each into the chunk
    with the most room left that has a place left (each chunk takes as many samples as its place in the
    store gives it), then each chunk's samples in the given order (the part's shuffled one); None when
    that leaves a chunk over ``capacity``.

    >>> packed_order(np.array([6, 6, 5, 5, 1, 1]), 0, 0, 3, 12).tolist()
    [0, 2, 4, 1, 3, 5]
    """
    count = len(nbytes)
    chunk_of = (first + np.arange(count)) // chunk_size - first // chunk_size
    places = np.bincount(chunk_of).tolist()
    room = [capacity - (used if chunk == 0 else 0) for chunk in range(len(places))]
    most_room = [(-room[chunk], chunk) for chunk in range(len(places))]
    heapq.heapify(most_room)
    for sample in np.argsort(-nbytes, kind="stable").tolist():
        _, chunk = heapq.heappop(most_room)
        chunk_of[sample] = chunk
        room[chunk] -= int(nbytes[sample])
        places[chunk] -= 1
        if places[chunk]:
            heapq.heappush(most_room, (-room[chunk], chunk))
    if min(room) < 0:
        return None
    return np.lexsort((np.arange(count), chunk_of))


def _swap(sizes: np.ndarray, mine: np.ndarray, theirs: np.ndarray, excess: int, spare: int) -> tuple[int, int] | None:
    """Positions ``(a, b)`` of ``mine`` and ``theirs`` whose exchange moves from 1 to ``spare`` bytes to
    theirs: ``excess`` or more if any pair can, else as many as can be."""
    theirs = theirs[np.argsort(sizes[theirs], kind="stable")]
    sorted_sizes = sizes[theirs]
    best: tuple[int, int, int] | None = None  # (bytes moved, a, b)
    for a in mine:
        i = int(np.searchsorted(sorted_sizes, sizes[a] - spare))  # the largest move that still fits
        if i == len(theirs) or sorted_sizes[i] >= sizes[a]:
            continue
        moved = int(sizes[a] - sorted_sizes[i])
        if moved >= excess:
            return int(a), int(theirs[i])
        if best is None or moved > best[0]:
            best = (moved, int(a), int(theirs[i]))
    return None if best is None else best[1:]
