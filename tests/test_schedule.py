"""The batch schedule, checked once for every reader that follows it (property tests)."""

from __future__ import annotations

from itertools import cycle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.iterate.plan import Consumer, EpochPlan
from outcore.iterate.schedule import max_held, schedule


@settings(max_examples=400, deadline=None)
@given(num_samples=st.integers(0, 3000), chunk_size=st.integers(1, 300), buffer_chunks=st.integers(0, 12),
       batch_size=st.integers(1, 300), read_ahead=st.integers(0, 6), world_size=st.sampled_from([1, 2, 4]),
       streams=st.sampled_from([4, 8]), shuffle=st.booleans(), drop_last=st.booleans(), seed=st.integers(0, 2**31),
       workers=st.integers(1, 5), data=st.data())
@pytest.mark.slow
def test_every_chunk_is_loaded_before_use_released_after_its_last_use_and_few_are_held(
        num_samples, chunk_size, buffer_chunks, batch_size, read_ahead, world_size, streams, shuffle, drop_last, seed,
        workers, data):
    plan = EpochPlan(num_samples, chunk_size, batch_size=batch_size, shuffle=shuffle, seed=seed,
                     buffer_chunks=buffer_chunks, rank=data.draw(st.integers(0, world_size - 1)),
                     world_size=world_size, drop_last=drop_last, streams=streams)
    first_batch = data.draw(st.integers(0, plan.steps))  # a resumed run starts anywhere
    kind = data.draw(st.sampled_from(["rest", "one", "turns"]))  # to the end, one batch, a loader worker's turns
    turns = Consumer(0, 1, data.draw(st.integers(0, workers - 1)), workers).steps(plan.steps, first_batch)
    wanted = {"rest": range(first_batch, plan.steps), "one": range(first_batch, first_batch + 1), "turns": turns}[kind]
    steps = list(schedule(plan, wanted, read_ahead=read_ahead))
    assert [s.index for s in steps] == [i for i in wanted if i < plan.steps]
    loaded, released, held_most = set(), set(), 0
    bound = max_held(plan, read_ahead)
    for step in steps:
        assert not set(step.load) & (loaded | released)  # each slot loaded once, never after its release
        assert list(step.load) == sorted(step.load)  # in stream order
        loaded |= set(step.load)
        assert set(step.slots.tolist()) <= loaded - released  # what the batch reads is loaded and held
        assert set(step.load) <= {slot for s in steps for slot in s.slots.tolist()}  # nothing read in vain
        assert (plan.chunks[step.slots] == step.samples // chunk_size).all()
        held_most = max(held_most, len(loaded - released))
        assert set(step.release) <= loaded - released
        released |= set(step.release)
        later = {slot for s in steps if s.index > step.index for slot in s.slots.tolist()}
        assert not set(step.release) & later  # released only after its last use
    assert loaded == released  # nothing left held at the end
    assert held_most <= bound
    assert [len(s.samples) for s in steps] == [min(batch_size, len(plan) - s.index * batch_size) for s in steps]


@settings(max_examples=300, deadline=None)
@given(num_samples=st.integers(1, 3000), chunk_size=st.integers(1, 300), batch_size=st.integers(1, 300),
       read_ahead=st.integers(0, 4), grain=st.integers(1, 16), shuffle=st.booleans(), seed=st.integers(0, 2**31),
       depths=st.lists(st.integers(1, 40), min_size=1, max_size=20), data=st.data())
def test_every_slot_used_is_fetched_once_in_order_before_its_load_and_within_the_depth(
        num_samples, chunk_size, batch_size, read_ahead, grain, shuffle, seed, depths, data):
    plan = EpochPlan(num_samples, chunk_size, batch_size=batch_size, shuffle=shuffle, seed=seed)
    first_batch = data.draw(st.integers(0, plan.steps - 1))
    asked = cycle(depths)  # the depth changes as it is measured
    used = []
    steps = schedule(plan, range(first_batch, plan.steps), read_ahead=read_ahead,
                     fetch_ahead=lambda: used.append(next(asked)) or used[-1], fetch_grain=grain)
    fetched: list[int] = []
    loaded: set[int] = set()
    for step in steps:
        fetched += step.fetch
        loaded |= set(step.load)
        assert loaded <= set(fetched)  # a slot's bytes are asked for no later than it is loaded
        beyond = [slot for slot in step.fetch if slot not in loaded]
        if beyond:  # never further than the depth (rounded up to the grain) past the last slot loaded
            assert max(beyond) < max(loaded, default=-1) + 1 + used[-1] + min(grain, used[-1])
    assert fetched == sorted(set(fetched))  # each once, in stream order
    assert set(fetched) == loaded  # only slots that the run loads


def one_at_a_time(plan, steps, read_ahead):
    """The schedule made batch by batch, as `schedule` made it before it planned batches in blocks: what it must
    still give, step for step."""
    steps = [step for step in steps if step < plan.steps]
    remaining = np.zeros(len(plan.chunks), np.int64)
    for index in steps:
        remaining += np.bincount(plan.step(index)[1], minlength=len(remaining))
    next_slot, held = 0, []
    for index in steps:
        samples, slots = plan.step(index)
        horizon = min(len(plan.chunks), int(slots.max()) + 1 + read_ahead)
        load = tuple(j for j in range(next_slot, horizon) if remaining[j] > 0)
        next_slot = max(next_slot, horizon)
        held += load
        remaining -= np.bincount(slots, minlength=len(remaining))
        release = tuple(j for j in held if remaining[j] == 0 or index == steps[-1])
        held = [j for j in held if j not in release]
        yield index, samples.tolist(), slots.tolist(), load, release, plan.pieces(index)


@settings(max_examples=200, deadline=None)
@given(num_samples=st.integers(0, 2000), chunk_size=st.integers(1, 100), buffer_chunks=st.integers(0, 12),
       batch_size=st.integers(1, 100), read_ahead=st.integers(0, 4), world_size=st.sampled_from([1, 2, 4]),
       shuffle=st.booleans(), drop_last=st.booleans(), seed=st.integers(0, 2**31), data=st.data())
def test_batches_planned_in_blocks_are_those_planned_one_at_a_time(
        num_samples, chunk_size, buffer_chunks, batch_size, read_ahead, world_size, shuffle, drop_last, seed, data):
    parts = data.draw(st.integers(1, 8 // world_size if shuffle else 1))  # parts of the rank's streams
    plan = EpochPlan(num_samples, chunk_size, batch_size=batch_size, shuffle=shuffle, seed=seed,
                     buffer_chunks=buffer_chunks, rank=data.draw(st.integers(0, world_size - 1)), world_size=world_size,
                     drop_last=drop_last, part=(data.draw(st.integers(0, parts - 1)), parts))
    first = data.draw(st.integers(0, plan.steps))
    samples, slots, bounds = plan.span(first, plan.steps)
    for k, index in enumerate(range(first, plan.steps)):  # a span is its batches' steps, batch after batch
        assert samples[bounds[k] : bounds[k + 1]].tolist() == plan.step(index)[0].tolist()
        assert slots[bounds[k] : bounds[k + 1]].tolist() == plan.step(index)[1].tolist()
    wanted = plan.with_samples(range(first, plan.steps))
    made = [(s.index, s.samples.tolist(), s.slots.tolist(), s.load, s.release, s.pieces)
            for s in schedule(plan, wanted, read_ahead=read_ahead)]
    assert made == list(one_at_a_time(plan, wanted, read_ahead))
