"""A cluster run's lanes (`outcore.iterate.cluster.Lanes`), without a cluster: each batch is its lanes' parts
side by side, and a lane whose spans run on one worker reads each of its chunks once (property tests)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import outcore
from outcore.iterate import cluster
from outcore.iterate.cluster import Carries, Lanes
from outcore.iterate.runs import Work


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    made = {}
    for samples, chunk in [(37, 4), (500, 16), (999, 64)]:
        path = tmp_path_factory.mktemp("lanes") / f"{samples}-{chunk}.zarr"
        made[samples] = outcore.from_arrays({"index": np.arange(samples)}, path, chunk_size=chunk, progress=False)
    return made


@settings(max_examples=150, deadline=None)
@given(data=st.data(), batch_size=st.integers(1, 120), threads=st.integers(1, 9), world_size=st.sampled_from([1, 2]),
       streams=st.sampled_from([2, 8]), shuffle=st.booleans(), drop_last=st.booleans(), span_samples=st.integers(1, 300))
def test_lanes_make_every_batch_side_by_side_and_read_each_chunk_once(
        stores, data, batch_size, threads, world_size, streams, shuffle, drop_last, span_samples):
    ds = stores[data.draw(st.sampled_from(sorted(stores)))]
    order = {"shuffle": True, "streams": streams} if shuffle else {"shuffle": False}
    it = ds.batches(batch_size, seed=3, buffer_chunks=4, drop_last=drop_last, **order,
                    rank=data.draw(st.integers(0, world_size - 1)), world_size=world_size)
    plan = it.plan(0)
    resumed = range(data.draw(st.integers(0, len(it))), len(it))  # a run resumed mid-epoch starts anywhere
    work = Work(it.store, it.recipe, it.options, 0, plan, resumed)
    seats = {f"tcp://127.0.0.1:{port}": 1 for port in range(threads)}
    with mock.patch.object(cluster, "SPAN_SAMPLES", span_samples):  # spans of any length
        lanes = Lanes(work, seats, Lanes.count_for("s3://bucket/store.zarr", len(plan.streams), threads))
    assert lanes.count == min(len(plan.streams), threads)  # from an object store: a lane per thread and stream
    assert lanes.workers == (sorted(seats) if lanes.count == threads else None)  # pinned: a lane per thread

    for lane_plan in lanes.plans:  # the steps a lane has samples in, found without asking each
        assert list(lane_plan.with_samples(resumed)) == [step for step in resumed if lane_plan.pieces(step)]
    made: dict[int, list] = {step: [] for step in resumed}
    for first in range(0, len(resumed), lanes.span):
        for span in lanes.spans("run", resumed[min(first + lanes.span, len(resumed)) - 1]):
            for step in span.steps:
                made[step.index].append((span.lane, step))
    loaded: dict[int, set[int]] = {lane: set() for lane in range(lanes.count)}  # one worker's chunks per lane
    reads = {lane: 0 for lane in range(lanes.count)}
    for index in resumed:
        parts = made[index]
        assert [lane for lane, _ in parts] == sorted(lane for lane, _ in parts)  # in lane order
        assert np.array_equal(np.concatenate([step.samples for _, step in parts]), plan.step(index)[0])
        offsets = np.cumsum([0] + [len(step.samples) for _, step in parts])[:-1].tolist()
        assert [step.offset for _, step in parts] == offsets  # side by side, each where its rows are
        assert {step.size for _, step in parts} == {len(plan.step(index)[0])}
        for lane, step in parts:
            needed = set(np.unique(step.chunks).tolist())
            reads[lane] += len(needed - loaded[lane])
            loaded[lane] = (loaded[lane] | needed) - set(step.release)
    assert not any(loaded.values())  # every chunk freed by the end of the run
    for lane, lane_plan in enumerate(lanes.plans):  # a chunk in two slots of the lane may be read by each
        assert reads[lane] <= len(lane_plan.chunks)
        if not resumed.start:
            assert reads[lane] >= len(np.unique(lane_plan.chunks))


def test_spans_hold_at_most_span_bytes_whatever_the_cluster_and_two_per_thread_in_a_short_run(tmp_path):
    """A span makes as many batches as SPAN_BYTES holds (SPAN_SAMPLES permitting), on a cluster of any size,
    and fewer where the run has fewer than two such spans per worker thread."""
    ds = outcore.from_arrays({"index": np.arange(4096)}, tmp_path / "s.zarr", chunk_size=64, progress=False)
    it = ds.batches(16, seed=1)  # 256 batches of 256 bytes (the index and the source index)
    work = Work(it.store, it.recipe, it.options, 0, it.plan(0), range(len(it)))
    with mock.patch.multiple(cluster, SPAN_SAMPLES=10_000, SPAN_BYTES=2048):
        spans = {threads: Lanes(work, {f"tcp://127.0.0.1:{port}": 1 for port in range(threads)}, 1).span
                 for threads in (1, 2, 4, 16, 32)}
    assert spans == {1: 8, 2: 8, 4: 8, 16: 8, 32: 4}  # 2048 bytes, then 256 batches // (2 x 32 threads)


@pytest.mark.parametrize("location", ["train.zarr", "/data/train.zarr.zip", "file:///data/train.zarr"])
def test_a_store_on_disk_gets_one_lane_of_whole_batches(location):
    assert [Lanes.count_for(location, streams, threads) for streams, threads in [(8, 4), (8, 16), (1, 2)]] == [1, 1, 1]
    assert Lanes.count_for("gs://bucket/train.zarr", 8, 16) == 8


def test_carries_hand_a_lane_its_chunks_once_and_keep_few():
    carries = Carries()
    carries.put(("a", 0, 4), {1: "one"}, most=3)
    carries.put(("a", 0, 9), {2: "two"}, most=3)  # left by a span that ran before the one ending with step 4 was taken
    assert carries.take(("a", 0, 9)) == {2: "two"}
    assert carries.take(("a", 0, 4)) == {}  # dropped as older than the one taken: never taken later
    for step in range(5):
        carries.put(("b", 1, step), {step: step}, most=3)
    assert list(carries.kept) == [("b", 1, 2), ("b", 1, 3), ("b", 1, 4)]  # the oldest dropped first
    assert carries.take(("c", 0, 0)) == {}
