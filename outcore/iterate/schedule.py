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
import itertools
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
        """The slots the batch reads from, in increasing order (found once: asked for twice a batch; a set of a
        batch's few slots costs less than `np.unique`'s sort)."""
        return sorted(set(self.slots.tolist()))


BLOCK = 16  # batches planned at once (`EpochPlan.span`): the plan's per-call costs shared by them


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
    wanted = (remaining > 0).tolist()  # the slots the run reads
    next_slot, next_fetch, held = 0, 0, {}  # held: the slots loaded and not released, in the order loaded
    for block in _blocks(steps, BLOCK):
        samples, slots, bounds = plan.span(block[0], block[-1] + 1)
        highest, released = _uses(slots, bounds, remaining)
        for k, index in enumerate(block):
            horizon = min(len(plan.chunks), highest[k] + 1 + read_ahead)
            load = tuple(itertools.compress(range(next_slot, horizon), wanted[next_slot:horizon]))
            next_slot = max(next_slot, horizon)
            fetch: tuple[int, ...] = ()
            if fetch_ahead is not None:
                depth = fetch_ahead()
                grain = max(1, min(fetch_grain, depth))
                reach = min(len(plan.chunks), -(-(horizon + depth) // grain) * grain)
                fetch = tuple(itertools.compress(range(next_fetch, reach), wanted[next_fetch:reach]))
                next_fetch = max(next_fetch, reach)
            held.update(dict.fromkeys(load))
            release = tuple(held) if index == steps[-1] else released[k]
            for j in release:
                del held[j]
            yield BatchStep(index, samples[bounds[k] : bounds[k + 1]], slots[bounds[k] : bounds[k + 1]], load, release,
                            fetch, plan.pieces(index))


def _blocks(steps: Sequence[int], most: int) -> Iterator[list[int]]:
    """``steps`` in blocks of at most ``most`` consecutive batches (a loader worker's turns: one at a time).

    >>> list(_blocks([0, 1, 2, 5, 6], 2))
    [[0, 1], [2], [5, 6]]
    """
    block: list[int] = []
    for index in steps:
        if block and (index != block[-1] + 1 or len(block) == most):
            yield block
            block = []
        block.append(index)
    if block:
        yield block


def _uses(slots: np.ndarray, bounds: list[int], remaining: np.ndarray) -> tuple[list[int], list[tuple[int, ...]]]:
    """For each batch of a block (its ``slots`` at ``bounds``): the highest slot it reads, and the slots it is
    the last to read (ascending), counted off ``remaining`` (each slot's samples still to read: updated)."""
    batches = len(bounds) - 1
    batch = np.repeat(np.arange(batches), np.diff(bounds))
    last = np.full(len(remaining), -1, np.int64)
    np.maximum.at(last, slots, batch)
    remaining -= np.bincount(slots, minlength=len(remaining))
    done = np.flatnonzero((remaining == 0) & (last >= 0))  # read for the last time in this block, ascending
    order = np.argsort(last[done], kind="stable")  # by batch, each batch's ascending
    ends = np.searchsorted(last[done][order], np.arange(batches + 1)).tolist()
    done = done[order].tolist()
    highest = np.maximum.reduceat(slots, bounds[:-1]).tolist() if np.diff(bounds).all() else \
        [int(slots[low:high].max(initial=-1)) for low, high in itertools.pairwise(bounds)]
    return highest, [tuple(done[ends[k] : ends[k + 1]]) for k in range(batches)]
