"""Shuffle plans: permutations, determinism, balanced shards with equal batch counts, the order rule
against a plain reference implementation (property tests), and memory that does not grow with the samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.iterate.plan import Consumer, EpochPlan, batch_count, chunk_order, rank_batch_count, span
from outcore.seeds import Domain, generator

layouts = st.tuples(st.integers(0, 3000), st.integers(1, 300)).filter(lambda t: t[0] < 60 * t[1])


def _all(plan):
    return plan.take(0, len(plan))


def _samples(plan):
    return _all(plan)[0]


def _plans(num_samples, chunk_size, world_size, num_workers, **options):
    return [
        EpochPlan(num_samples, chunk_size, consumer=Consumer(rank, world_size, worker, num_workers), **options)
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
    counts = np.bincount(np.concatenate([_samples(p) for p in plans]), minlength=num_samples)
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
        samples, slots = _all(plan)
        assert np.array_equal(plan.chunks[slots], samples // chunk_size)  # each sample from its slot
        if not shuffle:
            np.testing.assert_array_equal(samples, samples[np.argsort(slots, kind="stable")])


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
    first = _samples(EpochPlan(5000, 64, seed=7, epoch=3))
    np.testing.assert_array_equal(first, _samples(EpochPlan(5000, 64, seed=7, epoch=3)))
    assert not np.array_equal(first, _samples(EpochPlan(5000, 64, seed=7, epoch=4)))
    assert not np.array_equal(first, _samples(EpochPlan(5000, 64, seed=8, epoch=3)))


def test_ranks_get_equal_shares_padded_from_the_start_of_the_stream():
    plans = _plans(1001, 10, 4, 1, seed=1)
    assert [len(p) for p in plans] == [251] * 4
    stream_start = _samples(EpochPlan(1001, 10, seed=1, buffer_chunks=0))[:3]
    repeated = sorted(set(_samples(plans[3]).tolist()) & set(_samples(plans[0]).tolist()))
    assert repeated == sorted(stream_start.tolist())  # the 3 padded samples are the stream's first 3
    for a in range(3):
        for b in range(a + 1, 3):
            assert not set(_samples(plans[a]).tolist()) & set(_samples(plans[b]).tolist())
    assert span(10, Consumer(2, 4)) == (6, 9) and span(10, Consumer(2, 4), drop_last=True) == (4, 6)


def test_buffer_mixes_chunks_and_zero_buffer_keeps_chunks_whole():
    whole = EpochPlan(1000, 100, seed=0, buffer_chunks=0)
    runs = _samples(whole).reshape(10, 100) // 100
    assert all(len(set(run.tolist())) == 1 for run in runs)  # chunk after chunk
    mixed = EpochPlan(1000, 100, seed=0, buffer_chunks=4)
    assert len(set((_samples(mixed)[100:200] // 100).tolist())) >= 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank=2"):
        Consumer(2, 2)
    with pytest.raises(ValueError, match="worker=-1"):
        Consumer(0, 1, -1, 2)
    with pytest.raises(ValueError, match="chunk_size >= 1"):
        EpochPlan(10, 0)


def reference_order(num_samples, chunk_size, *, shuffle, seed, epoch, buffer_chunks, consumer, drop_last):
    """The order rule written plainly, one sample at a time (O(samples)): the chunk order, the consumer's
    span of the stream cut into slots, each slot's samples dealt to windows by the documented draws,
    every window emitted in its permuted order."""
    order = chunk_order(-(-num_samples // chunk_size), shuffle=shuffle, seed=seed, epoch=epoch)
    stream = [int(c) * chunk_size + i for c in order for i in range(min(chunk_size, num_samples - c * chunk_size))]
    start, stop = span(num_samples, consumer, drop_last)
    slots, previous = [], None  # slot of each span position: a new slot at each chunk (or lap) change
    for position in range(start, stop):
        stretch = position // num_samples * len(order) + order.tolist().index(stream[position % num_samples] //
                                                                             chunk_size)
        if stretch != previous:
            slots.append([])
            previous = stretch
        slots[-1].append(stream[position % num_samples])
    mixed = shuffle and buffer_chunks > 0
    if not mixed:
        return [s for slot in slots for s in slot]
    key = (seed, epoch, consumer.index, consumer.count)
    deals = generator(Domain.BUFFER_SHUFFLE, *key).multinomial([len(s) for s in slots], [1 / buffer_chunks] *
                                                               buffer_chunks) if slots else []
    windows = [[] for _ in range(len(slots) + buffer_chunks)]
    for j, slot in enumerate(slots):
        dealt = [slot[i] for i in generator(Domain.BUFFER_SHUFFLE, *key, j).permutation(len(slot))]
        for d, count in enumerate(deals[j]):
            windows[j + d] += dealt[:count]
            dealt = dealt[count:]
    emitted = []
    for w, window in enumerate(windows):
        emitted += [window[i] for i in generator(Domain.WINDOW_ORDER, *key, w).permutation(len(window))]
    return emitted


@settings(max_examples=150, deadline=None)
@given(layout=st.tuples(st.integers(0, 700), st.integers(1, 64)).filter(lambda t: t[0] < 40 * t[1]),
       buffer_chunks=st.integers(0, 6), world_size=st.integers(1, 3), num_workers=st.integers(1, 3),
       shuffle=st.booleans(), seed=st.integers(0, 1000), epoch=st.integers(0, 5), drop_last=st.booleans(),
       data=st.data())
def test_the_lazy_plan_follows_the_plain_rule(layout, buffer_chunks, world_size, num_workers, shuffle, seed, epoch,
                                             drop_last, data):
    num_samples, chunk_size = layout
    consumer = Consumer(data.draw(st.integers(0, world_size - 1)), world_size,
                        data.draw(st.integers(0, num_workers - 1)), num_workers)
    options = {"shuffle": shuffle, "seed": seed, "epoch": epoch, "buffer_chunks": buffer_chunks, "consumer": consumer,
                   "drop_last": drop_last}
    expected = reference_order(num_samples, chunk_size, **options)
    plan = EpochPlan(num_samples, chunk_size, **options)
    assert _samples(plan).tolist() == expected
    start = data.draw(st.integers(0, len(plan)))
    stop = data.draw(st.integers(start, len(plan)))
    samples, _slots = plan.take(start, stop)
    assert samples.tolist() == expected[start:stop]
    assert np.array_equal(np.bincount(_all(plan)[1][:start], minlength=len(plan.chunks)), plan.emitted_before(start))
    if shuffle and buffer_chunks:  # a sample of slot j is emitted between chunk-times j and j + buffer_chunks
        window = np.searchsorted(plan.window_ends, np.arange(len(plan)), side="right")
        assert ((window >= _all(plan)[1]) & (window < _all(plan)[1] + buffer_chunks)).all()


def test_a_plan_of_a_hundred_million_samples_is_small_and_quick():
    """The plan holds O(slots x buffer) integers: the first batch of 100M samples needs no per-sample array."""
    import tracemalloc

    tracemalloc.start()
    plan = EpochPlan(100_000_000, 65536, seed=3, buffer_chunks=8)
    samples, _ = plan.take(0, 256)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(plan) == 100_000_000 and len(np.unique(samples)) == 256
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"  # a per-sample plan would be 800 MiB per array
