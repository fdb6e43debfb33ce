"""The batch schedule, checked once for every reader that follows it (property tests)."""

from __future__ import annotations

from itertools import cycle

from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.iterate.plan import Consumer, EpochPlan, batches_in
from outcore.iterate.schedule import max_held, schedule


@settings(max_examples=400, deadline=None)
@given(num_samples=st.integers(0, 3000), chunk_size=st.integers(1, 300), buffer_chunks=st.integers(0, 12),
       batch_size=st.integers(1, 300), read_ahead=st.integers(0, 6), world_size=st.integers(1, 3),
       shuffle=st.booleans(), drop_last=st.booleans(), seed=st.integers(0, 2**31), data=st.data())
def test_every_chunk_is_loaded_before_use_released_after_its_last_use_and_few_are_held(
        num_samples, chunk_size, buffer_chunks, batch_size, read_ahead, world_size, shuffle, drop_last, seed, data):
    consumer = Consumer(data.draw(st.integers(0, world_size - 1)), world_size)
    plan = EpochPlan(num_samples, chunk_size, shuffle=shuffle, seed=seed, buffer_chunks=buffer_chunks,
                     consumer=consumer, drop_last=drop_last)
    total = batches_in(len(plan), batch_size, drop_last)
    first_batch = data.draw(st.integers(0, total))  # a resumed run starts anywhere
    stop_batch = data.draw(st.sampled_from([None, first_batch + 1]))  # to the end, or one batch (random access)
    steps = list(schedule(plan, batch_size, drop_last=drop_last, read_ahead=read_ahead, first_batch=first_batch,
                          stop_batch=stop_batch))
    last = total if stop_batch is None else min(total, stop_batch)
    assert [s.index for s in steps] == list(range(first_batch, last))
    loaded, released, held_most = set(), set(), 0
    bound = max_held(buffer_chunks, batch_size, chunk_size, read_ahead)
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
    assert [len(s.samples) for s in steps] == [min(batch_size, len(plan) - i * batch_size)
                                               for i in range(first_batch, last)]


@settings(max_examples=300, deadline=None)
@given(num_samples=st.integers(1, 3000), chunk_size=st.integers(1, 300), batch_size=st.integers(1, 300),
       read_ahead=st.integers(0, 4), grain=st.integers(1, 16), shuffle=st.booleans(), seed=st.integers(0, 2**31),
       depths=st.lists(st.integers(1, 40), min_size=1, max_size=20), data=st.data())
def test_every_slot_used_is_fetched_once_in_order_before_its_load_and_within_the_depth(
        num_samples, chunk_size, batch_size, read_ahead, grain, shuffle, seed, depths, data):
    plan = EpochPlan(num_samples, chunk_size, shuffle=shuffle, seed=seed)
    first_batch = data.draw(st.integers(0, batches_in(len(plan), batch_size, False) - 1))
    asked = cycle(depths)  # the depth changes as it is measured
    used = []
    steps = schedule(plan, batch_size, read_ahead=read_ahead, first_batch=first_batch,
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
