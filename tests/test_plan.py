"""Shuffle plans: permutations, determinism, balanced shards with equal batch counts (property tests)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.iterate.plan import Consumer, batch_count, epoch_plan, rank_batch_count, span

layouts = st.tuples(st.integers(0, 3000), st.integers(1, 300)).filter(lambda t: t[0] < 60 * t[1])


def _plans(num_samples, chunk_size, world_size, num_workers, **options):
    return [
        epoch_plan(num_samples, chunk_size, consumer=Consumer(rank, world_size, worker, num_workers), **options)
        for rank in range(world_size)
        for worker in range(num_workers)
    ]


@settings(max_examples=300, deadline=None)
@given(layout=layouts, buffer_chunks=st.integers(0, 12), world_size=st.integers(1, 5), num_workers=st.integers(1, 4),
       shuffle=st.booleans(), seed=st.integers(0, 2**31), epoch=st.integers(0, 50), drop_last=st.booleans())
def test_consumers_share_an_epoch_by_the_documented_rule(layout, buffer_chunks, world_size, num_workers, shuffle,
                                                         seed, epoch, drop_last):
    num_samples, chunk_size = layout
    plans = _plans(num_samples, chunk_size, world_size, num_workers, shuffle=shuffle, seed=seed, epoch=epoch,
                   buffer_chunks=buffer_chunks, drop_last=drop_last)
    per_rank = num_samples // world_size if drop_last else -(-num_samples // world_size)
    counts = np.bincount(np.concatenate([p.samples for p in plans]), minlength=num_samples)
    assert counts.sum() == world_size * per_rank
    if world_size == 1 or num_samples % world_size == 0:
        assert (counts == 1).all()  # every sample exactly once
    elif drop_last:
        assert counts.max() <= 1  # fewer than world_size samples left out
    else:
        assert counts.min() >= 1  # every sample, fewer than world_size of them twice (or more, if N < world_size)
    for rank in range(world_size):
        sizes = [len(p) for p in plans[rank * num_workers : (rank + 1) * num_workers]]
        assert sum(sizes) == per_rank and max(sizes) - min(sizes) <= 1
    for plan in plans:
        assert np.array_equal(plan.chunks[plan.slots], plan.samples // chunk_size)  # each sample from its slot
        if not shuffle:
            np.testing.assert_array_equal(plan.samples, plan.samples[np.argsort(plan.slots, kind="stable")])


@settings(max_examples=500, deadline=None)
@given(num_samples=st.integers(0, 5000), world_size=st.integers(1, 16), num_workers=st.integers(1, 8),
       batch_size=st.integers(1, 600), drop_last=st.booleans())
def test_every_rank_gets_the_same_number_of_batches(num_samples, world_size, num_workers, batch_size, drop_last):
    counts = {rank_batch_count(num_samples, rank, world_size, num_workers, batch_size, drop_last)
              for rank in range(world_size)}
    assert len(counts) == 1


def test_the_reported_ddp_hang_is_gone():
    """1,023 samples on 2 ranks at batch 256 with drop_last gave 2 batches on rank 0 and 1 on rank 1."""
    assert [batch_count(1023, Consumer(r, 2), 256, drop_last=True) for r in range(2)] == [1, 1]
    assert [batch_count(1023, Consumer(r, 2), 256) for r in range(2)] == [2, 2]


def test_same_seed_and_epoch_same_order_other_epochs_differ():
    first = epoch_plan(5000, 64, seed=7, epoch=3).samples
    np.testing.assert_array_equal(first, epoch_plan(5000, 64, seed=7, epoch=3).samples)
    assert not np.array_equal(first, epoch_plan(5000, 64, seed=7, epoch=4).samples)
    assert not np.array_equal(first, epoch_plan(5000, 64, seed=8, epoch=3).samples)


def test_ranks_get_equal_shares_padded_from_the_start_of_the_stream():
    plans = _plans(1001, 10, 4, 1, seed=1)
    assert [len(p) for p in plans] == [251] * 4
    stream_start = epoch_plan(1001, 10, seed=1, buffer_chunks=0).samples[:3]
    repeated = sorted(set(plans[3].samples.tolist()) & set(plans[0].samples.tolist()))
    assert repeated == sorted(stream_start.tolist())  # the 3 padded samples are the stream's first 3
    for a in range(3):
        for b in range(a + 1, 3):
            assert not set(plans[a].samples.tolist()) & set(plans[b].samples.tolist())
    assert span(10, Consumer(2, 4)) == (6, 9) and span(10, Consumer(2, 4), drop_last=True) == (4, 6)


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
