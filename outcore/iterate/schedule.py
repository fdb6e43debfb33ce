"""The batch schedule: from an epoch plan to, per batch, its samples, the chunks to load before it and
the chunks to release after it. Pure: the local reader threads and the Dask cluster both follow it.

Slots (a consumer's stretches of the stream, `EpochPlan.slots`) are loaded in stream order, each at
most once, ``read_ahead`` slots beyond the last one the batch needs, skipping slots that no batch from
here on uses (after a resume, or past the end with ``drop_last``). A slot is released after the last
batch that uses it. So, at any time, at most `max_held` slots are loaded and not yet released.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .plan import EpochPlan


@dataclass(frozen=True)
class BatchStep:
    """Batch ``index``: its ``samples`` and the ``slots`` they are read from (one per sample); the slots
    to ``load`` before making it (in order) and those to ``release`` once it is made."""

    index: int
    samples: np.ndarray
    slots: np.ndarray
    load: tuple[int, ...]
    release: tuple[int, ...]


def batches_in(plan: EpochPlan, batch_size: int, drop_last: bool) -> int:
    """How many batches the plan makes: the last one short, or dropped with ``drop_last``.

    >>> from outcore.iterate.plan import epoch_plan
    >>> batches_in(epoch_plan(10, 4), 4, drop_last=False), batches_in(epoch_plan(10, 4), 4, drop_last=True)
    (3, 2)
    """
    full, rest = divmod(len(plan), batch_size)
    return full + (rest > 0 and not drop_last)


def max_held(buffer_chunks: int, batch_size: int, chunk_size: int, read_ahead: int) -> int:
    """The most slots a reader following `schedule` holds at once.

    >>> max_held(8, 256, 128, 2)
    14
    """
    return buffer_chunks + 2 + math.ceil(batch_size / chunk_size) + read_ahead


def schedule(
    plan: EpochPlan, batch_size: int, *, drop_last: bool = False, read_ahead: int = 2, first_batch: int = 0
) -> Iterator[BatchStep]:
    """The steps of batches ``first_batch, ...`` of ``plan`` (see the module docstring).

    >>> from outcore.iterate.plan import epoch_plan
    >>> [(s.load, s.release) for s in schedule(epoch_plan(10, 4, shuffle=False), 4, read_ahead=0)]
    [((0,), (0,)), ((1,), (1,)), ((2,), (2,))]
    """
    total = batches_in(plan, batch_size, drop_last)
    emitted = min(len(plan), total * batch_size)
    last_use = np.full(len(plan.chunks), -1, dtype=np.int64)  # -1: no batch uses the slot
    np.maximum.at(last_use, plan.slots[:emitted], np.arange(emitted))
    next_slot, held = 0, []
    for index in range(first_batch, total):
        start, stop = index * batch_size, min(emitted, (index + 1) * batch_size)
        slots = plan.slots[start:stop]
        horizon = min(len(plan.chunks), int(slots.max()) + 1 + read_ahead)
        load = tuple(j for j in range(next_slot, horizon) if last_use[j] >= start)
        next_slot = max(next_slot, horizon)
        held += load
        release = tuple(j for j in held if last_use[j] < stop or index == total - 1)
        held = [j for j in held if j not in release]
        yield BatchStep(index, plan.samples[start:stop], slots, load, release)
