"""The batch schedule: from an epoch plan to, per batch, its samples, the chunks to load before it and
the chunks to release after it. Pure: the local reader threads and the Dask cluster both follow it.

Slots (a consumer's stretches of the stream, `EpochPlan.chunks`) are loaded in stream order, each at
most once, ``read_ahead`` slots beyond the last one the batch needs, skipping slots that no batch of
the run uses (after a resume, past the end with ``drop_last``, or outside a one-batch run). With
``fetch_ahead`` (from an object store), slots are also named for fetching (their stored bytes asked
for, nothing decoded) that many slots beyond those loaded, each once, as the depth is at that step,
up to a multiple of ``fetch_grain`` (the chunks of a shard file, asked together when read in order;
at most the depth). A
slot is released after the last batch of the run that uses it. So, at any time, at most `max_held` slots are
loaded and not yet released. The schedule keeps one count per slot and the plan's windows in use:
its memory does not grow with the samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .plan import EpochPlan, batches_in


@dataclass(frozen=True)
class BatchStep:
    """Batch ``index``: its ``samples`` and the ``slots`` they are read from (one per sample); the slots
    to ``load`` before making it (in order), those to ``release`` once it is made, and those to ``fetch``
    now (asked of an object store, in order, `schedule`'s ``fetch_ahead``)."""

    index: int
    samples: np.ndarray
    slots: np.ndarray
    load: tuple[int, ...]
    release: tuple[int, ...]
    fetch: tuple[int, ...] = ()

    @property
    def used(self) -> list[int]:
        """The slots the batch reads from, in increasing order."""
        return np.unique(self.slots).tolist()


def max_held(buffer_chunks: int, batch_size: int, chunk_size: int, read_ahead: int) -> int:
    """The most slots a reader following `schedule` holds at once.

    >>> max_held(8, 256, 128, 2)
    14
    """
    return buffer_chunks + 2 + math.ceil(batch_size / chunk_size) + read_ahead


def schedule(plan: EpochPlan, batch_size: int, *, drop_last: bool = False, read_ahead: int = 2, first_batch: int = 0,
             stop_batch: int | None = None, fetch_ahead: Callable[[], int] | None = None,
             fetch_grain: int = 1) -> Iterator[BatchStep]:
    """The steps of batches ``first_batch, ..., stop_batch - 1`` (default: to the epoch's end) of ``plan``
    (see the module docstring).

    >>> from outcore.iterate.plan import EpochPlan
    >>> [(s.load, s.release) for s in schedule(EpochPlan(10, 4, shuffle=False), 4, read_ahead=0)]
    [((0,), (0,)), ((1,), (1,)), ((2,), (2,))]
    >>> [s.fetch for s in schedule(EpochPlan(10, 2, shuffle=False), 4, read_ahead=0, fetch_ahead=lambda: 1)]
    [(0, 1, 2), (3, 4), ()]
    """
    total = batches_in(len(plan), batch_size, drop_last)
    stop_batch = total if stop_batch is None else min(total, stop_batch)
    if first_batch >= stop_batch:
        return
    start, end = first_batch * batch_size, min(len(plan), stop_batch * batch_size)
    remaining = plan.emitted_before(end) - plan.emitted_before(start)  # each slot's samples in this run
    next_slot, next_fetch, held = 0, 0, []
    for index in range(first_batch, stop_batch):
        low, high = index * batch_size, min(end, (index + 1) * batch_size)
        samples, slots = plan.take(low, high)
        horizon = min(len(plan.chunks), int(slots.max()) + 1 + read_ahead)
        load = tuple(j for j in range(next_slot, horizon) if remaining[j] > 0)
        next_slot = max(next_slot, horizon)
        fetch: tuple[int, ...] = ()
        if fetch_ahead is not None:
            depth = fetch_ahead()
            grain = max(1, min(fetch_grain, depth))
            reach = min(len(plan.chunks), -(-(horizon + depth) // grain) * grain)
            fetch = tuple(j for j in range(next_fetch, reach) if remaining[j] > 0)
            next_fetch = max(next_fetch, reach)
        held += load
        remaining -= np.bincount(slots, minlength=len(remaining))
        release = tuple(j for j in held if remaining[j] == 0 or index == stop_batch - 1)
        held = [j for j in held if j not in release]
        yield BatchStep(index, samples, slots, load, release, fetch)
