"""The batch schedule: from an epoch plan to, per batch, its samples, the chunks to load before it and
the chunks to release after it. Pure: the local reader threads and the Dask cluster both follow it.

Slots (a rank's stretches of the chunk stream, `EpochPlan.chunks`) are loaded in the order it first reads them, each at
most once, ``read_ahead`` slots beyond the last one the batch needs, skipping slots that no batch of
the run uses (after a resume, in another loader worker's batches, or outside a one-batch run). With
``fetch_ahead`` (from an object store), slots are also named for fetching (their stored bytes asked
for, nothing decoded) that many slots beyond those loaded, each once, as the depth is at that step,
up to a multiple of ``fetch_grain`` (the chunks of a shard file, asked together when read in order;
at most the depth). A
slot is released after the last batch of the run that uses it. So, at any time, at most `max_held` slots are
loaded and not yet released. The schedule keeps one count per slot and the plan's windows in use:
its memory does not grow with the samples.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .plan import EpochPlan


@dataclass(frozen=True)
class BatchStep:
    """Batch ``index``: its ``samples`` and the ``slots`` they are read from (one per sample); the slots
    to ``load`` before making it (in order), those to ``release`` once it is made, and those to ``fetch``
    now (asked of an object store, in order, `schedule`'s ``fetch_ahead``); its ``pieces``, augmented
    each with a generator of its own (`EpochPlan.pieces`)."""

    index: int
    samples: np.ndarray
    slots: np.ndarray
    load: tuple[int, ...]
    release: tuple[int, ...]
    fetch: tuple[int, ...] = ()
    pieces: tuple[tuple[int, int], ...] = ()

    @functools.cached_property
    def used(self) -> list[int]:
        """The slots the batch reads from, in increasing order (found once: asked for twice a batch)."""
        return np.unique(self.slots).tolist()


def max_held(plan: EpochPlan, read_ahead: int) -> int:
    """The most slots a reader of ``plan`` following `schedule` holds at once: per stream, its buffer, two
    slots it is between and those its share of a batch spans; the repeated sample's slot; the read-ahead.

    >>> from outcore.iterate.plan import EpochPlan
    >>> max_held(EpochPlan(10_000, 128, batch_size=256), 2)  # 8 streams of 32 samples a batch, buffers of 1
    35
    """
    spans = sum(math.ceil(int(take) / plan.chunk_size) for take in plan.takes)
    return len(plan.streams) * (plan.window + 2) + spans + 1 + read_ahead


def schedule(plan: EpochPlan, steps: Sequence[int], *, read_ahead: int = 2, fetch_ahead: Callable[[], int] | None = None,
             fetch_grain: int = 1) -> Iterator[BatchStep]:
    """The steps of batches ``steps`` of ``plan`` (increasing; a loader worker's take turns: see
    `outcore.iterate.plan.Consumer.steps`), as the module docstring says.

    >>> from outcore.iterate.plan import EpochPlan
    >>> plan = EpochPlan(10, 4, batch_size=4, shuffle=False, streams=1)
    >>> [(s.load, s.release) for s in schedule(plan, range(3), read_ahead=0)]
    [((0,), (0,)), ((1,), (1,)), ((2,), (2,))]
    >>> [s.fetch for s in schedule(EpochPlan(10, 2, batch_size=4, shuffle=False, streams=1), range(3), read_ahead=0,
    ...                            fetch_ahead=lambda: 1)]
    [(0, 1, 2), (3, 4), ()]
    """
    steps = [step for step in steps if step < plan.steps] if not isinstance(steps, range) else \
        range(steps.start, min(steps.stop, plan.steps), steps.step)
    if not steps:
        return
    size = plan.batch_size
    if isinstance(steps, range) and steps.step == 1:  # each slot's samples in this run
        remaining = plan.emitted_before(steps.stop * size) - plan.emitted_before(steps.start * size)
    else:
        remaining = np.zeros(len(plan.chunks), np.int64)
        for index in steps:
            remaining += np.bincount(plan.step(index)[1], minlength=len(remaining))
    next_slot, next_fetch, held = 0, 0, []
    for index in steps:
        samples, slots = plan.step(index)
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
        release = tuple(j for j in held if remaining[j] == 0 or index == steps[-1])
        held = [j for j in held if j not in release]
        yield BatchStep(index, samples, slots, load, release, fetch, plan.pieces(index))
