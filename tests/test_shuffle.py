"""Shuffle plans: permutations, determinism, disjoint balanced shards, bounded buffers (property tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.shuffle import Consumer, epoch_plan, span

layouts = st.tuples(st.integers(0, 3000), st.integers(1, 300)).filter(lambda t: t[0] < 60 * t[1])


def _plans(num_samples, chunk_size, world_size, num_workers, **options):
    return [
        epoch_plan(num_samples, chunk_size, consumer=Consumer(rank, world_size, worker, num_workers), **options)
        for rank in range(world_size)
        for worker in range(num_workers)
    ]


@settings(max_examples=300, deadline=None)
@given(layout=layouts, buffer_chunks=st.integers(0, 12), world_size=st.integers(1, 5), num_workers=st.integers(1, 4),
       shuffle=st.booleans(), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_every_sample_exactly_once_across_consumers(layout, buffer_chunks, world_size, num_workers, shuffle, seed,
                                                    epoch):
    num_samples, chunk_size = layout
    plans = _plans(num_samples, chunk_size, world_size, num_workers, shuffle=shuffle, seed=seed, epoch=epoch,
                   buffer_chunks=buffer_chunks)
    everything = np.concatenate([p.samples for p in plans])
    np.testing.assert_array_equal(np.sort(everything), np.arange(num_samples))
    sizes = [len(p) for p in plans]
    assert max(sizes) - min(sizes) <= 1  # balanced: so no consumer has more than one extra batch
    for plan in plans:
        assert set(plan.chunks.tolist()) == set((plan.samples // chunk_size).tolist())
        if not shuffle:
            np.testing.assert_array_equal(plan.samples, np.sort(plan.samples))


@settings(max_examples=150, deadline=None)
@given(layout=layouts, buffer_chunks=st.integers(0, 12), batch_size=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_a_reader_in_stream_order_holds_a_bounded_number_of_chunks(layout, buffer_chunks, batch_size, seed):
    num_samples, chunk_size = layout
    plan = epoch_plan(num_samples, chunk_size, seed=seed, buffer_chunks=buffer_chunks)
    slot = {c: j for j, c in enumerate(plan.chunks.tolist())}
    bound = buffer_chunks + 2 + math.ceil(batch_size / chunk_size)
    needed = -1
    for start in range(0, len(plan), batch_size):
        batch_slots = [slot[c] for c in (plan.samples[start : start + batch_size] // chunk_size).tolist()]
        needed = max(needed, *batch_slots)
        live = [j for j in range(needed + 1) if plan.last_use[j] >= start]
        assert len(live) <= bound


def test_same_seed_and_epoch_same_order_other_epochs_differ():
    first = epoch_plan(5000, 64, seed=7, epoch=3).samples
    np.testing.assert_array_equal(first, epoch_plan(5000, 64, seed=7, epoch=3).samples)
    assert not np.array_equal(first, epoch_plan(5000, 64, seed=7, epoch=4).samples)
    assert not np.array_equal(first, epoch_plan(5000, 64, seed=8, epoch=3).samples)


def test_ranks_are_disjoint_and_spans_near_equal():
    plans = _plans(1001, 10, 4, 1, seed=1)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not set(plans[a].samples.tolist()) & set(plans[b].samples.tolist())
    assert [len(p) for p in plans] == [251, 250, 250, 250]
    assert span(10, Consumer(2, 4)) == (6, 8)


def test_buffer_mixes_chunks_and_zero_buffer_keeps_chunks_whole():
    whole = epoch_plan(1000, 100, seed=0, buffer_chunks=0)
    runs = whole.samples.reshape(10, 100) // 100
    assert all(len(set(run.tolist())) == 1 for run in runs)  # chunk after chunk
    mixed = epoch_plan(1000, 100, seed=0, buffer_chunks=4)
    assert len(set((mixed.samples[100:200] // 100).tolist())) >= 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank=2"):
        Consumer(2, 2)
    with pytest.raises(ValueError, match="worker=-1"):
        Consumer(0, 1, -1, 2)
    with pytest.raises(ValueError, match="chunk_size >= 1"):
        epoch_plan(10, 0)
