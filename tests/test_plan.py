"""Shuffle plans: elastic global steps (the same on any number of ranks), equal batch counts, each rank
reading its own share of the chunks, the order rule against a plain reference implementation (property
tests), and memory that does not grow with the samples."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.rules import BUFFER_SHUFFLE, WINDOW_ORDER, chunk_permutation, seeded

from outcore import seeds
from outcore.errors import OptionError
from outcore.imaging import native
from outcore.iterate import BatchOptions, stream
from outcore.iterate import plan as plan_module
from outcore.iterate.options import Subset
from outcore.iterate.plan import Consumer, EpochPlan, EpochSteps, default_streams
from outcore.iterate.schedule import max_held
from outcore.iterate.stream import Selection, StreamPlan, span_slots, streams_slots

layouts = st.tuples(st.integers(0, 3000), st.integers(1, 300)).filter(lambda t: t[0] < 60 * t[1])


def _samples(plan):
    return plan.take(0, len(plan))[0]


def _rank_plans(num_samples, chunk_size, global_batch, world_size, **options):
    return [EpochPlan(num_samples, chunk_size, batch_size=global_batch // world_size, rank=rank,
                      world_size=world_size, **options) for rank in range(world_size)]


def _pieces_by_key(plans, step):
    """The samples of each own stream's piece of global step ``step``, by the piece's key (a stream's number)."""
    pieces = {}
    for plan in plans:
        samples, start = plan.step(step)[0], 0
        for key, count in plan.pieces(step):
            if key < plan.layout.streams:
                pieces[key] = samples[start : start + count].tolist()
            start += count
        assert start == len(samples)  # the pieces cut the rank's batch
    return pieces


def _global_steps(plans):
    """Per global step: the sorted samples of the ranks' own streams, and the repeated ones."""
    steps = []
    for k in range(plans[0].steps):
        own, repeated = [], []
        for plan in plans:
            samples = plan.step(k)[0]
            if plan.repeats and k == plan.steps - 1:
                samples, repeated = samples[:-1], [*repeated, int(samples[-1])]
            own.append(samples)
        steps.append((np.sort(np.concatenate(own)), repeated))
    return steps


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(layout=layouts, batch=st.integers(1, 80), buffer_chunks=st.integers(0, 40), streams=st.sampled_from([8, 16, 24]),
       seed=st.integers(0, 2**31), epoch=st.integers(0, 50), drop_last=st.booleans())
def test_global_steps_are_the_same_on_1_2_4_and_8_ranks(layout, batch, buffer_chunks, streams, seed, epoch, drop_last):
    num_samples, chunk_size = layout
    global_batch, shuffle = 8 * batch, True
    options = {"shuffle": shuffle, "seed": seed, "epoch": epoch, "buffer_chunks": buffer_chunks, "streams": streams,
               "drop_last": drop_last}
    reference = _global_steps(_rank_plans(num_samples, chunk_size, global_batch, 1, **options))
    steps = num_samples // global_batch if drop_last else -(-num_samples // global_batch)
    assert len(reference) == steps
    every = np.concatenate([own for own, _ in reference] + [np.empty(0, np.int64)])
    if drop_last:
        assert len(every) == steps * global_batch and len(np.unique(every)) == len(every)
    else:
        assert np.array_equal(np.sort(every), np.arange(num_samples))  # every sample exactly once
    stream_start = chunk_permutation(-(-num_samples // chunk_size), shuffle=shuffle, seed=seed, epoch=epoch)
    for world_size in (2, 4, 8):
        plans = _rank_plans(num_samples, chunk_size, global_batch, world_size, **options)
        by_step = _global_steps(plans)
        assert [own.tolist() for own, _ in by_step] == [own.tolist() for own, _ in reference]
        one_rank = _rank_plans(num_samples, chunk_size, global_batch, 1, **options)
        for k in range(steps):  # and each stream's piece, augmented with its own generator, too
            assert _pieces_by_key(plans, k) == _pieces_by_key(one_rank, k)
        per_rank = math.ceil(num_samples / world_size) if not drop_last else steps * global_batch // world_size
        assert {len(plan) for plan in plans} == {per_rank}  # DistributedSampler's counts
        assert {plan.steps for plan in plans} == {steps}
        for k in range(steps):  # equal batches on every rank at every step
            assert len({len(plan.step(k)[0]) for plan in plans}) == 1
        repeated = by_step[-1][1] if by_step else []
        assert len(repeated) == (world_size * per_rank - num_samples if not drop_last else 0)
        stream = [int(c) * chunk_size + i for c in stream_start for i in range(min(chunk_size, num_samples -
                                                                                    int(c) * chunk_size))]
        assert repeated == [stream[q % num_samples] for q in range(len(repeated))]  # the stream's first samples


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(layout=layouts.filter(lambda t: t[0] >= 1), batch=st.integers(1, 40), world_size=st.integers(1, 64),
       buffer_chunks=st.integers(0, 40), seed=st.integers(0, 1000), drop_last=st.booleans())
def test_every_world_size_runs_with_the_default_options(layout, batch, world_size, buffer_chunks, seed, drop_last):
    """Any number of ranks, default options: the same number of batches on every rank, equal at every step;
    every sample once an epoch (the short ranks repeating one in the last step); the global steps of one
    process with the same streams; and per rank no more streams, chunks held or chunks read than one
    process reading a batch of the rank's size holds and reads of its share."""
    num_samples, chunk_size = layout
    keywords = {"seed": seed, "buffer_chunks": buffer_chunks, "drop_last": drop_last}
    plans = [BatchOptions(batch, rank=rank, world_size=world_size, **keywords).plan(num_samples, chunk_size, 0)
             for rank in range(world_size)]
    steps = num_samples // (batch * world_size) if drop_last else -(-num_samples // (batch * world_size))
    assert {plan.steps for plan in plans} == {steps}
    for k in range(steps):
        assert len({len(plan.step(k)[0]) for plan in plans}) == 1
    seen = np.concatenate([_samples(plan) for plan in plans] + [np.empty(0, np.int64)])
    if drop_last:
        assert len(seen) == steps * batch * world_size and len(np.unique(seen)) == len(seen)
    else:
        assert len(seen) == world_size * -(-num_samples // world_size)
        assert np.array_equal(np.unique(seen), np.arange(num_samples))
    one = BatchOptions(batch * world_size, streams=default_streams(world_size), **keywords).plan(num_samples, chunk_size, 0)
    assert [own.tolist() for own, _ in _global_steps(plans)] == [own.tolist() for own, _ in _global_steps([one])]
    alone = BatchOptions(batch, **keywords).plan(num_samples, chunk_size, 0)  # today's one process
    for plan in plans:
        assert len(plan.streams) <= 8 and max_held(plan, 2) <= max_held(alone, 2)
        share = math.ceil(len(plan) / chunk_size)
        assert len(plan.chunks) <= share + len(plan.streams) + 2  # its share, and the cuts between its streams


@settings(max_examples=100, deadline=None)
@given(layout=layouts.filter(lambda t: t[0] >= 1), batch=st.integers(1, 40), world_size=st.sampled_from([1, 2, 4, 8]),
       seed=st.integers(0, 1000), buffer_chunks=st.integers(0, 40))
def test_the_default_order_on_1_2_4_and_8_ranks_is_the_order_of_8_streams(layout, batch, world_size, seed,
                                                                          buffer_chunks):
    num_samples, chunk_size = layout
    for rank in range(world_size):
        options = {"rank": rank, "world_size": world_size, "seed": seed, "buffer_chunks": buffer_chunks}
        default = BatchOptions(batch, **options).plan(num_samples, chunk_size, 3)
        eight = BatchOptions(batch, streams=8, **options).plan(num_samples, chunk_size, 3)
        assert _samples(default).tolist() == _samples(eight).tolist()
        assert default.chunks.tolist() == eight.chunks.tolist()


@pytest.mark.parametrize(("saved_on", "resumed_on", "streams"), [(6, 4, 24), (3, 2, 24), (6, 12, 24), (16, 8, 16),
                                                                  (8, 2, 8), (24, 1, 24)])
def test_a_default_order_resumes_on_any_world_size_dividing_its_streams(saved_on, resumed_on, streams):
    saved = BatchOptions(96 // saved_on, world_size=saved_on)
    resumed = BatchOptions(96 // resumed_on, world_size=resumed_on).resuming(saved.plan_settings())
    assert saved.canonical_streams == resumed.canonical_streams == streams
    assert resumed.plan_settings() == saved.plan_settings()


@pytest.mark.parametrize(("saved_on", "resumed_on", "hint"), [(8, 16, 16), (6, 5, 120), (16, 3, 48), (1, 3, 24)])
def test_a_resume_the_saved_order_cannot_make_says_which_streams_to_pass_from_the_first_run(saved_on, resumed_on, hint):
    saved = BatchOptions(48, world_size=saved_on).plan_settings()
    with pytest.raises(OptionError, match=rf"order of {saved['streams']} streams, which world_size={resumed_on} cannot "
                                          rf"share.*streams={hint}\) from the first run on"):
        BatchOptions(48, world_size=resumed_on).resuming(saved)
    with pytest.raises(OptionError, match=r"not the streams=96 asked for"):
        BatchOptions(48, streams=96).resuming(saved)  # never a silent change of order


@settings(max_examples=100, deadline=None)
@given(layout=layouts.filter(lambda t: t[0] >= 1), batch=st.integers(1, 80), world_size=st.sampled_from([1, 2, 4, 8]),
       buffer_chunks=st.integers(0, 40), seed=st.integers(0, 1000))
def test_each_rank_reads_its_own_share_of_the_chunks(layout, batch, world_size, buffer_chunks, seed):
    """Ranks' slots cover the store once, but for the chunks cut between two streams and the repeats."""
    num_samples, chunk_size = layout
    plans = _rank_plans(num_samples, chunk_size, 8 * batch, world_size, seed=seed, buffer_chunks=buffer_chunks)
    chunks = math.ceil(num_samples / chunk_size)
    slots = sum(len(plan.chunks) for plan in plans)
    assert slots <= chunks + 8 + world_size  # 8 streams: 7 cuts between them (+1 slack), a repeat per rank
    for plan in plans:
        samples, slots_of = plan.take(0, len(plan))
        assert np.array_equal(plan.chunks[slots_of], samples // chunk_size)  # each sample from its slot
        assert np.array_equal(np.bincount(slots_of, minlength=len(plan.chunks)), plan.slot_sizes)


@settings(max_examples=100, deadline=None)
@given(layout=layouts.filter(lambda t: t[0] >= 1), batch=st.integers(1, 80), world_size=st.sampled_from([1, 2, 4, 8]),
       buffer_chunks=st.integers(0, 40), seed=st.integers(0, 1000), parts=st.integers(1, 8), drop_last=st.booleans())
def test_loader_workers_parts_make_the_ranks_batches_and_read_its_chunks_once(layout, batch, world_size,
                                                                                buffer_chunks, seed, parts, drop_last):
    """Part w of n of every batch (a DataLoader worker's, with OutcoreLoader): the parts, in order, are the
    rank's batch, piece for piece, and together they read the rank's chunks as often as the rank does."""
    num_samples, chunk_size = layout
    options = {"seed": seed, "buffer_chunks": buffer_chunks, "drop_last": drop_last,
               "batch_size": 8 * batch // world_size, "rank": world_size - 1, "world_size": world_size}
    rank = EpochPlan(num_samples, chunk_size, **options)
    parts = min(parts, 8 // world_size)
    split = [EpochPlan(num_samples, chunk_size, part=(w, parts), **options) for w in range(parts)]
    for k in range(rank.steps):
        assert np.concatenate([plan.step(k)[0] for plan in split]).tolist() == rank.step(k)[0].tolist()
        assert sum((plan.pieces(k) for plan in split), ()) == rank.pieces(k)
        sizes = [len(plan.step(k)[0]) for plan in split]
        assert [plan.placement(k) for plan in split] == [(sum(sizes[:w]), len(rank.step(k)[0])) for w in range(parts)]
    assert sum(len(plan.chunks) for plan in split) == len(rank.chunks)
    assert sorted(np.concatenate([plan.chunks for plan in split]).tolist()) == sorted(rank.chunks.tolist())
    for plan in split:  # the quick answer for a range of steps is the one of looking at every step
        assert list(plan.with_samples(range(rank.steps))) == [k for k in range(rank.steps) if plan.pieces(k)]
        if buffer_chunks == 0:
            _assert_slots_numbered_by_first_step(plan)
    with pytest.raises(OptionError, match="at most"):
        EpochPlan(num_samples, chunk_size, part=(0, 8 // world_size + 1), **options)


def _assert_slots_numbered_by_first_step(plan):
    """A plan's slots are numbered 0, 1, ... in the order of the step each is first needed at (the order its
    chunks are read ahead in): without a shuffle buffer a slot is needed when its first sample is taken, so a
    slot first taken at a later step never has a smaller number."""
    first_step = {}
    for k in range(plan.steps):
        for slot in plan.step(k)[1].tolist():
            first_step.setdefault(slot, k)
    assert sorted(first_step) == list(range(len(plan.chunks)))
    steps = [first_step[slot] for slot in range(len(plan.chunks))]
    assert steps == sorted(steps)


@pytest.mark.parametrize("num_samples, chunk_size", [(50, 1), (100, 3), (333, 7), (1000, 16)])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_slots_are_numbered_by_the_step_they_are_first_needed(num_samples, chunk_size, world_size):
    for batch_size, seed in ((8 // world_size, 0), (40 // world_size, 1)):
        for rank in range(world_size):
            _assert_slots_numbered_by_first_step(EpochPlan(num_samples, chunk_size, batch_size=batch_size, seed=seed,
                                                           buffer_chunks=0, rank=rank, world_size=world_size))


def test_the_steps_with_samples_of_a_two_step_plan_are_both():
    plan = EpochPlan(8, 2, batch_size=4, streams=2, part=(0, 1))
    assert list(plan.with_samples(range(2))) == [0, 1]


def test_a_subset_is_its_set_of_samples_and_an_index_outside_the_store_is_named():
    assert Subset([5, 1, 3]) == Subset([1, 3, 5]) and hash(Subset([5, 1, 3])) == hash(Subset([1, 3, 5]))
    assert Subset([1, 3, 5]) != Subset([1, 3, 6]) and Subset([1, 3]) != [1, 3]
    assert BatchOptions(2, indices=[4, 0]) == BatchOptions(2, indices=[0, 4])
    Subset([0, 2, 9]).check(10)
    for indices, bad in (([0, 1, 2, 10], 10), ([-1, 3, 4], -1), ([3, 12, 4], 12)):
        with pytest.raises(OptionError, match=rf"indices= holds sample {bad}, outside the store's 10 samples"):
            Subset(indices).check(10)


@settings(max_examples=150, deadline=None)
@given(layout=layouts.filter(lambda t: t[0] >= 1), data=st.data(), batch=st.integers(1, 40),
       buffer_chunks=st.integers(0, 40), seed=st.integers(0, 1000), shuffle=st.booleans())
def test_a_subset_is_read_like_a_store_of_its_samples(layout, data, batch, buffer_chunks, seed, shuffle):
    """Every selected sample once an epoch, the same global steps on 1, 2, 4 and 8 ranks, each sample from
    a slot of its chunk, no slot of a chunk with none selected; all indices make the store's own plan."""
    num_samples, chunk_size = layout
    chosen = data.draw(st.sets(st.integers(0, num_samples - 1), min_size=1, max_size=num_samples))
    indices = np.array(sorted(chosen), dtype=np.int64)
    options = {"seed": seed, "buffer_chunks": buffer_chunks, "shuffle": shuffle, "indices": indices}
    reference = _global_steps(_rank_plans(num_samples, chunk_size, 8 * batch, 1, **options))
    every = np.concatenate([own for own, _ in reference])
    assert np.array_equal(np.sort(every), indices)
    if shuffle:
        for world_size in (2, 4, 8):
            by_step = _global_steps(_rank_plans(num_samples, chunk_size, 8 * batch, world_size, **options))
            assert [own.tolist() for own, _ in by_step] == [own.tolist() for own, _ in reference]
    plan = _rank_plans(num_samples, chunk_size, 8 * batch, 1, **options)[0]
    samples, slots_of = plan.take(0, len(plan))
    assert np.array_equal(plan.chunks[slots_of], samples // chunk_size)
    assert set(plan.chunks.tolist()) == set((indices // chunk_size).tolist())
    whole = {**options, "indices": np.arange(num_samples)}
    assert np.array_equal(_samples(_rank_plans(num_samples, chunk_size, 8 * batch, 1, **whole)[0]),
                          _samples(_rank_plans(num_samples, chunk_size, 8 * batch, 1, **{**options, "indices": None})[0]))


@settings(max_examples=300, deadline=None)
@given(steps=st.integers(0, 500), workers=st.integers(1, 16), first=st.integers(0, 600))
def test_loader_workers_take_turns_at_every_step_once(steps, workers, first):
    turns = [list(Consumer(0, 1, w, workers).steps(steps, first)) for w in range(workers)]
    assert sorted(s for t in turns for s in t) == list(range(first, steps))
    merged = [turns[i % workers][i // workers] for i in range(max(0, steps - first))]  # the DataLoader's order
    assert merged == list(range(first, steps))


@settings(max_examples=100, deadline=None)
@given(layout=layouts, batch_size=st.integers(1, 100), world_size=st.integers(1, 6), drop_last=st.booleans())
def test_without_shuffle_each_rank_reads_its_part_of_the_store_in_order(layout, batch_size, world_size, drop_last):
    num_samples, chunk_size = layout
    plans = [EpochPlan(num_samples, chunk_size, batch_size=batch_size, shuffle=False, rank=rank,
                       world_size=world_size, drop_last=drop_last) for rank in range(world_size)]
    orders = [_samples(plan) for plan in plans]
    for plan, order in zip(plans, orders, strict=True):
        own = order[: len(order) - plan.repeats]
        assert (np.diff(own) == 1).all()  # storage order, so predictions line up with the store's rows
    joined = np.concatenate([o[: len(o) - p.repeats] for p, o in zip(plans, orders, strict=True)] +
                            [np.empty(0, np.int64)])
    assert np.array_equal(joined, np.arange(len(joined)))


def test_the_reported_ddp_hang_is_gone():
    """1,023 samples on 2 ranks at batch 256 with drop_last gave 2 batches on rank 0 and 1 on rank 1."""
    assert [p.steps for p in _rank_plans(1023, 64, 512, 2, drop_last=True)] == [1, 1]
    assert [p.steps for p in _rank_plans(1023, 64, 512, 2)] == [2, 2]
    assert [len(p) for p in _rank_plans(1023, 64, 512, 2)] == [512, 512]


def test_a_step_found_in_the_spans_planned_last_is_the_step_planned_alone():
    """`EpochPlan.step` takes a batch's samples from the spans planned last (a run's producer plans blocks of
    batches; its consumer asks for each batch's samples): the same as a plan that planned nothing, and copies (a
    consumer changing them changes nothing the plan hands out)."""
    options = {"batch_size": 32, "seed": 3, "epoch": 1, "buffer_chunks": 4, "world_size": 2, "rank": 1}
    planned, alone = EpochPlan(1000, 24, **options), EpochPlan(1000, 24, **options)
    expected = [EpochPlan(1000, 24, **options).step(step) for step in range(planned.steps)]
    for first in range(5, planned.steps, 5):  # the first 5 steps are not planned: found on demand
        planned.span(first, first + 5)
    for step in range(planned.steps):
        for plan in (planned, alone):
            samples, slots = plan.step(step)
            np.testing.assert_array_equal(samples, expected[step][0])
            np.testing.assert_array_equal(slots, expected[step][1])
            samples[:] = -1
            assert (plan.step(step)[0] >= 0).all()


def test_same_seed_and_epoch_same_order_other_epochs_differ():
    def order(**options):
        return _samples(EpochPlan(5000, 64, batch_size=100, **options))

    first = order(seed=7, epoch=3)
    np.testing.assert_array_equal(first, order(seed=7, epoch=3))
    assert not np.array_equal(first, order(seed=7, epoch=4))
    assert not np.array_equal(first, order(seed=8, epoch=3))


def test_a_step_draws_on_every_stream_and_zero_buffer_keeps_chunks_whole_within_a_stream():
    plan = EpochPlan(8000, 100, batch_size=80, seed=0, buffer_chunks=0)
    pieces = plan.step(3)[0].reshape(8, 10) // 100
    assert all(len(set(piece.tolist())) == 1 for piece in pieces)  # each stream's ten from one chunk
    assert len(set(pieces[:, 0].tolist())) == 8  # eight streams, eight chunks
    mixed = EpochPlan(8000, 100, batch_size=80, seed=0, buffer_chunks=32).step(20)[0].reshape(8, 10) // 100
    assert max(len(set(piece.tolist())) for piece in mixed) >= 3  # a buffer of 4 chunks per stream


def test_bad_arguments():
    with pytest.raises(OptionError, match="rank=2"):
        Consumer(2, 2)
    with pytest.raises(OptionError, match="worker=-1"):
        Consumer(0, 1, -1, 2)
    with pytest.raises(OptionError, match="chunk_size >= 1"):
        EpochPlan(10, 0, batch_size=1)
    with pytest.raises(OptionError, match=r"world_size=3 does not divide streams=8.*streams=24"):
        EpochPlan(10, 2, batch_size=1, rank=0, world_size=3, streams=8)
    with pytest.raises(OptionError, match=r"world_size=3 does not divide streams=8.*streams=24"):
        BatchOptions(10, world_size=3, streams=8)
    with pytest.raises(OptionError, match=r"streams=4 orders shuffled epochs.*leave streams= out"):
        BatchOptions.of(8, {"shuffle": False, "streams": 4})  # it would change nothing: never silently


def reference_rank(num_samples, chunk_size, *, batch_size, shuffle, seed, epoch, buffer_chunks, rank, world_size,
                   drop_last, streams):
    """The order rule written plainly, one sample at a time (O(samples)): the chunk order, the streams'
    spans, each cut into slots whose samples are dealt to windows by the documented draws, every window
    emitted in its permuted order; then the rank's streams' pieces, step after step, and the repeat."""
    order = chunk_permutation(-(-num_samples // chunk_size), shuffle=shuffle, seed=seed, epoch=epoch)
    stream = [c * chunk_size + i for c in order for i in range(min(chunk_size, num_samples - c * chunk_size))]
    global_batch, streams = batch_size * world_size, streams if shuffle else world_size
    steps = num_samples // global_batch if drop_last else -(-num_samples // global_batch)
    if steps == 0:
        return []
    takes = [(s + 1) * global_batch // streams - s * global_batch // streams for s in range(streams)]
    rest = global_batch if drop_last else num_samples - (steps - 1) * global_batch
    last = [(s + 1) * rest // streams - s * rest // streams for s in range(streams)]
    lengths = [(steps - 1) * t + z for t, z in zip(takes, last, strict=True)]
    mixed = shuffle and buffer_chunks > 0
    window = -(-buffer_chunks // streams) if mixed else 1
    emitted = []
    for s in range(streams):
        start = sum(lengths[:s])
        slots, previous = [], None  # a new slot at each chunk change
        for sample in stream[start : start + lengths[s]]:
            if sample // chunk_size != previous:
                slots.append([])
                previous = sample // chunk_size
            slots[-1].append(sample)
        if not mixed:
            emitted.append([sample for slot in slots for sample in slot])
            continue
        key = (seed, epoch, s, streams)
        deals = seeded(BUFFER_SHUFFLE, *key).multinomial([len(x) for x in slots], [1 / window] * window) \
            if slots else []
        windows = [[] for _ in range(len(slots) + window)]
        for j, slot in enumerate(slots):
            dealt = [slot[i] for i in seeded(BUFFER_SHUFFLE, *key, j).permutation(len(slot))]
            for d, count in enumerate(deals[j]):
                windows[j + d] += dealt[:count]
                dealt = dealt[count:]
        emitted.append([w[i] for v, w in enumerate(windows)
                        for i in seeded(WINDOW_ORDER, *key, v).permutation(len(w))])
    own = range(rank * streams // world_size, (rank + 1) * streams // world_size)
    out = []
    for k in range(steps):
        for s in own:
            begin = k * takes[s]
            out += emitted[s][begin : begin + (takes[s] if k < steps - 1 else last[s])]
    counts = [sum(last[s] for s in range(r * streams // world_size, (r + 1) * streams // world_size))
              for r in range(world_size)]
    short = [c < max(counts) for c in counts]
    if short[rank] and not drop_last:
        out.append(stream[sum(short[:rank]) % num_samples])  # fewer samples than ranks: the stream again
    return out


@settings(max_examples=150, deadline=None)
@given(layout=st.tuples(st.integers(0, 700), st.integers(1, 64)).filter(lambda t: t[0] < 40 * t[1]),
       batch_size=st.integers(1, 50), buffer_chunks=st.integers(0, 20), world_size=st.sampled_from([1, 2, 4]),
       streams=st.sampled_from([4, 8]), shuffle=st.booleans(), seed=st.integers(0, 1000), epoch=st.integers(0, 5),
       drop_last=st.booleans(), data=st.data())
def test_the_lazy_plan_follows_the_plain_rule(layout, batch_size, buffer_chunks, world_size, streams, shuffle, seed,
                                             epoch, drop_last, data):
    num_samples, chunk_size = layout
    options = {"batch_size": batch_size, "shuffle": shuffle, "seed": seed, "epoch": epoch,
               "buffer_chunks": buffer_chunks, "rank": data.draw(st.integers(0, world_size - 1)),
               "world_size": world_size, "drop_last": drop_last, "streams": streams}
    expected = reference_rank(num_samples, chunk_size, **options)
    plan = EpochPlan(num_samples, chunk_size, **options)
    assert _samples(plan).tolist() == expected
    start = data.draw(st.integers(0, len(plan)))
    stop = data.draw(st.integers(start, len(plan)))
    assert plan.take(start, stop)[0].tolist() == expected[start:stop]
    slots = plan.take(0, len(plan))[1]
    assert np.array_equal(np.bincount(slots[:start], minlength=len(plan.chunks)), plan.emitted_before(start))


def plain_slots(selection: Selection, order: np.ndarray, start: int, stop: int) -> list[tuple[int, int, int]]:
    """The slots of span ``[start, stop)`` of the chunk stream ``order``, chunk after chunk, lap after lap: each
    ``(chunk, first local index, size)``."""
    slots, position = [], 0
    while position < stop:
        for chunk in order.tolist():
            size = int(selection.sizes[chunk])
            low, high = max(start, position), min(stop, position + size)
            if low < high:
                slots.append((chunk, low - position, high - low))
            position += size
    return slots


@settings(max_examples=200, deadline=None)
@given(layout=layouts.filter(lambda t: t[0] >= 1), subset=st.booleans(), seed=st.integers(0, 1000), data=st.data())
def test_the_streams_slots_found_together_are_each_span_s_cut_alone(layout, subset, seed, data):
    """`streams_slots` cuts the chunk stream once for all of an epoch's consecutive spans (empty ones, spans past the
    stream's end and subsets with chunks of no sample included): each span's slots are the ones it has alone."""
    num_samples, chunk_size = layout
    rng = np.random.default_rng(seed)
    indices = np.sort(rng.integers(0, num_samples, rng.integers(1, num_samples + 1))) if subset else None
    selection = Selection(num_samples, chunk_size, indices)
    order = rng.permutation(-(-num_samples // chunk_size))
    edges = np.array(sorted(data.draw(st.lists(st.integers(0, 2 * len(selection) + 3), min_size=2, max_size=12))))
    found = streams_slots(selection, order, edges)
    assert len(found) == len(edges) - 1
    for (start, stop), slots in zip(itertools.pairwise(edges.tolist()), found, strict=True):
        expected = plain_slots(selection, order, start, stop)
        assert list(zip(*(part.tolist() for part in slots))) == expected
        assert list(zip(*(part.tolist() for part in span_slots(selection, order, (start, stop))))) == expected
        assert all(part.dtype == np.int64 for part in slots)


@settings(max_examples=150, deadline=None)
@given(layout=layouts, window=st.integers(1, 6), mixed=st.booleans(), key=st.lists(st.integers(0, 2**40), min_size=4,
       max_size=4), data=st.data())
def test_a_stream_s_windows_made_in_one_c_call_are_those_numpy_makes(layout, window, mixed, key, data):
    """`seeds.window_draws` makes a run of windows in one C call that keeps the GIL: the very samples and slots, in the
    very order, that numpy's calls make window by window (subsets with repeats, spans past the stream's end)."""
    if getattr(seeds._draws, "window", None) is None:
        pytest.skip(f"outcore's seeds._draws extension is not in use here: {seeds.how()}")
    num_samples, chunk_size = layout
    indices = np.sort(np.array(data.draw(st.lists(st.integers(0, max(0, num_samples - 1)), max_size=num_samples)),
                               np.int64)) if num_samples and data.draw(st.booleans()) else None
    selection = Selection(num_samples, chunk_size, indices)
    order = np.random.default_rng(key[0]).permutation(-(-num_samples // chunk_size))
    start = data.draw(st.integers(0, max(0, len(selection))))
    bounds = (start, data.draw(st.integers(start, 2 * len(selection) + 1)))
    options = {"window": window if mixed else 1, "mixed": mixed, "key": tuple(key)}
    span = span_slots(selection, order, bounds)
    ours = StreamPlan(selection, span, **options)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "window_draws", lambda *args: None)
        numpys = StreamPlan(selection, span, **options)
        expected = [numpys.window_contents(w) for w in range(len(numpys.window_ends))]
    for w, (samples, slots) in enumerate(expected):
        made = ours.window_contents(w)
        assert made[0].tolist() == samples.tolist() and made[1].tolist() == slots.tolist()
    every = (np.concatenate([part[0] for part in expected]), np.concatenate([part[1] for part in expected])) \
        if expected else (np.empty(0, np.int64),) * 2
    for _ in range(3):  # runs of windows made in one call each, from a new stream (none kept) and from one with some
        fresh = StreamPlan(selection, span, **options)
        low = data.draw(st.integers(0, len(fresh)))
        high = data.draw(st.integers(low, len(fresh)))
        for stream_plan in (fresh, ours):
            taken = stream_plan.take(low, high)
            assert taken[0].tolist() == every[0][low:high].tolist() and taken[1].tolist() == every[1][low:high].tolist()


@settings(max_examples=100, deadline=None)
@given(layout=layouts, batch_size=st.integers(1, 50), buffer_chunks=st.integers(0, 20), world_size=st.sampled_from([1, 3]),
       seed=st.integers(0, 1000), drop_last=st.booleans(), data=st.data())
def test_a_span_put_together_in_one_c_call_is_the_one_numpy_puts_together(layout, batch_size, buffer_chunks,
                                                                         world_size, seed, drop_last, data):
    """`EpochPlan.span` puts its streams' samples batch after batch, each slot numbered, in one C call each
    (`interleave`, the GIL kept): the very arrays numpy's concatenations and gathers make (the repeat included)."""
    if getattr(native.windows, "interleave", None) is None:
        pytest.skip(f"outcore's _windows extension is not in use here: {native.copies()}")
    num_samples, chunk_size = layout
    options = {"batch_size": batch_size, "seed": seed, "buffer_chunks": buffer_chunks, "world_size": world_size,
               "rank": data.draw(st.integers(0, world_size - 1)), "drop_last": drop_last,
               "streams": 3 * data.draw(st.integers(1, 3))}
    ours, numpys = EpochPlan(num_samples, chunk_size, **options), EpochPlan(num_samples, chunk_size, **options)
    first = data.draw(st.integers(0, ours.steps))
    stop = data.draw(st.integers(first, ours.steps + 1))
    made = ours.span(first, stop)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module, "interleave", lambda *args: None)
        expected = numpys.span(first, stop)
    assert [part.tolist() for part in made[:2]] == [part.tolist() for part in expected[:2]] and made[2] == expected[2]
    with pytest.raises(ValueError, match="adding up"):
        native.windows.interleave([np.arange(3)], np.array([[2]]), None, np.empty(3, np.int64))


def test_a_plan_of_a_hundred_million_samples_is_small_and_quick():
    """The plan holds O(slots x buffer) integers: the first batch of 100M samples needs no per-sample array."""
    import tracemalloc

    tracemalloc.start()
    plan = EpochPlan(100_000_000, 65536, batch_size=256, seed=3, buffer_chunks=64)
    samples, _ = plan.take(0, 256)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(plan) == 100_000_000 and len(np.unique(samples)) == 256
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB"  # a per-sample plan would be 800 MiB per array


def test_epoch_steps_share_every_step_evenly():
    steps = EpochSteps(1000, 24, 16)
    assert steps.takes.sum() == 24 and set(steps.takes.tolist()) == {1, 2}
    for world_size in (1, 2, 4, 8, 16):
        assert {steps.rank_batch(0, r, world_size) for r in range(world_size)} == {24 // world_size} or \
            24 % world_size  # 16 ranks cannot share a batch of 24 evenly: the global batch is batch_size x 16
