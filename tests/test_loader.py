"""BatchIterator on real stores: exact epochs, determinism, resumption in a new process, clean shutdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.optional import need

import outcore
from outcore.errors import CorruptChunkError, OptionError
from outcore.iterate import EpochPlan, max_held, native_run, runs
from outcore.iterate import iterator as iterator_module
from outcore.iterate.mixture import epoch_samples_of
from outcore.testing import corrupt_chunk
from outcore.transforms import (
    BrightnessContrast,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
)


@pytest.fixture
def store(tmp_path, rng):
    images = rng.integers(0, 256, (1000, 8, 8, 3), dtype=np.uint8)
    ds = outcore.from_arrays({"images": images, "labels": np.arange(1000) % 7, "id": np.arange(1000)},
                             tmp_path / "s.zarr", chunk_size=32, shuffle_on_write=False, progress=False)
    return ds, images


def _untaken(target):
    """Whether a thread's target is the producer of a run started ahead and not taken."""
    run = getattr(target, "__self__", None)
    return isinstance(run, runs.Run) and run.untaken is not None


def _ids(batches):
    return np.concatenate([b["id"] for b in batches])


OBJECT_STORE_POOLS = ("outcore-io", "outcore-request")  # live as long as the process, once an object store was read


def _outcore_threads():
    """outcore's threads other than the process's pools (which live as long as the process: the pool of at
    most `outcore.thread_count()` threads, and those for requests to object stores), once the runs that earlier
    tests' iterators started ahead for an epoch never asked for (those TensorFlow's generators keep) have let go."""
    deadline = time.monotonic() + runs.UNTAKEN_SECONDS + 2
    while time.monotonic() < deadline and any(getattr(t, "_target", None) is not None and _untaken(t._target)
                                              for t in threading.enumerate()):
        time.sleep(0.05)
    names = [t.name for t in threading.enumerate() if t.name.startswith("outcore")]
    assert len([n for n in names if n.startswith("outcore-pool")]) <= outcore.thread_count()
    return [n for n in names if not n.startswith(("outcore-pool", *OBJECT_STORE_POOLS))]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("batch_size", "drop_last"), [(64, False), (64, True), (1000, False), (4096, False), (7, False)])
def test_an_epoch_yields_every_sample_once_with_matching_fields(store, shuffle, batch_size, drop_last):
    ds, images = store
    batches = list(ds.batches(batch_size, shuffle=shuffle, seed=3, drop_last=drop_last))
    ids = _ids(batches)
    expected = (1000 // batch_size) * batch_size if drop_last else 1000
    assert len(ids) == expected == len(set(ids.tolist()))
    assert all(len(b["id"]) == batch_size for b in batches[:-1])
    assert len(batches) == len(ds.batches(batch_size, drop_last=drop_last))
    for batch in batches[:3]:
        np.testing.assert_array_equal(batch["images"], images[batch["id"]])
        np.testing.assert_array_equal(batch["labels"], batch["id"] % 7)
    if not shuffle:
        np.testing.assert_array_equal(ids, np.arange(expected))


def test_ranks_split_an_epoch(store):
    ds, _ = store
    seen = [_ids(ds.batches(50, seed=1, rank=rank, world_size=2)) for rank in range(2)]
    assert sorted(np.concatenate(seen).tolist()) == list(range(1000))
    assert len(seen[0]) == len(seen[1]) == 500


@pytest.mark.parametrize("world_size", [3, 6, 16, 24])
def test_any_world_size_runs_with_the_default_options_whole_subsets_and_mixtures(ids_store, world_size):
    """The default options on 3, 6, 16 and 24 ranks (8 streams refused them): the same number of batches
    on every rank, every sample once an epoch with DistributedSampler's repeats; a subset's samples once;
    a mixture's sources each once; a state of each resumes on a rank of the same world size."""
    def epoch(make):
        ranks = [make(rank) for rank in range(world_size)]
        batches = [[b["id"].tolist() for b in it] for it in ranks]
        assert len({len(each) for each in batches}) == 1 and len(batches[0]) == len(ranks[0])
        return [i for each in batches for batch in each for i in batch]

    seen = epoch(lambda rank: ids_store.batches(8, shuffle=True, seed=3, rank=rank, world_size=world_size))
    assert set(seen) == set(range(1000)) and len(seen) == world_size * -(-1000 // world_size)
    ids = ids_store["id"].compute()  # the store's rows hold the ids in a shuffled order
    subset = np.arange(7, 1000, 3)
    seen = epoch(lambda rank: ids_store.batches(4, indices=subset, seed=3, rank=rank, world_size=world_size))
    assert set(seen) == set(ids[subset].tolist()) and len(seen) == world_size * -(-len(subset) // world_size)
    mixture = outcore.mix({"a": ids_store, "b": ids_store}, repeats={"a": 1, "b": 1})  # asked: no warning
    seen = epoch(lambda rank: mixture.batches(8, seed=3, rank=rank, world_size=world_size, fields=["id"]))
    layout = mixture.layout(8, world_size=world_size)
    assert Counter(seen) == sum((Counter(ids[epoch_samples_of(1000, int(layout.per_epoch[s]), 3, 0, s)].tolist())
                                 for s in (0, 1)), Counter())
    it = ids_store.batches(8, seed=3, rank=world_size - 1, world_size=world_size)
    head = [b["id"].tolist() for _, b in zip(range(2), it, strict=False)]
    tail = ids_store.batches(8, seed=3, rank=world_size - 1, world_size=world_size)
    tail.load_state_dict(json.loads(json.dumps(it.state_dict())))
    assert head + [b["id"].tolist() for b in tail] == [b["id"].tolist() for b in
                                                       ids_store.batches(8, seed=3, rank=world_size - 1,
                                                                         world_size=world_size)]


def test_determinism_and_epochs(store):
    ds, _ = store
    first = _ids(ds.batches(64, seed=5))
    np.testing.assert_array_equal(first, _ids(ds.batches(64, seed=5)))
    it = ds.batches(64, seed=5)
    epoch0, epoch1 = _ids(it), _ids(it)  # a full pass moves on to the next epoch
    np.testing.assert_array_equal(epoch0, first)
    assert not np.array_equal(epoch0, epoch1) and sorted(epoch1.tolist()) == list(range(1000))
    it.set_epoch(0)
    np.testing.assert_array_equal(_ids(it), first)


def test_from_the_second_epoch_on_the_next_epochs_run_starts_as_this_one_drains(store, monkeypatch):
    """A training loop that asks for an epoch's first batch finds it made: from the second epoch on, the next
    epoch's run starts once this one's batches are all under way, before its last batch is handed out (the first
    pass never starts one: a single pass makes no batch it does not use). The epochs are the same batches; a run
    started for an epoch that is not asked for (another epoch set) is closed, and so is the last one with the
    iterator."""
    ds, _ = store
    started = []  # (the epoch of each run made, the consumer's batches of its epoch handed out by then)
    made = runs.Run.__init__  # a local run's, or a C run's (`outcore.iterate.native_run`)

    def recorded(self, work, *args):
        started.append((work.epoch, it.epoch, it.batches_done))
        made(self, work, *args)

    monkeypatch.setattr(runs.Run, "__init__", recorded)
    it = ds.batches(64, shuffle=True, seed=5, fields=["id"])
    epochs = [_ids(it) for _ in range(4)]
    for epoch, ids in enumerate(epochs):  # each as a single pass of its own makes it
        np.testing.assert_array_equal(ids, epochs_alone(ds, epoch))
    made_for = started[:4]  # epochs 0-3's runs
    assert made_for[:2] == [(0, 0, 0), (1, 1, 0)], started  # the first two asked for at their start
    assert [epoch for epoch, _, _ in made_for[2:]] == [2, 3], started
    assert all(during == epoch - 1 and 0 < done < len(it) for epoch, during, done in made_for[2:]), started
    ahead = it._next._held[0]  # epoch 4's, started as epoch 3 drained
    assert ahead.work.epoch == 4 and not ahead.stop.is_set()
    it.set_epoch(7)  # not the epoch started: that run is closed, and epoch 7's made
    np.testing.assert_array_equal(next(iter(it))["id"], epochs_alone(ds, 7)[:64])
    assert ahead.stop.is_set() and started[-1][0] == 7
    for _ in it:  # epoch 7 to its end: epoch 8's run is started as it drains
        pass
    ahead = it._next._held[0]
    it.close()  # and goes with the iterator
    ahead.thread.join(5)
    assert ahead.work.epoch == 8 and ahead.stop.is_set() and not ahead.thread.is_alive()


def test_a_run_started_ahead_that_no_one_takes_lets_go_of_what_it_made(store, monkeypatch):
    """An iterator kept after its last epoch (TensorFlow's generators keep theirs) holds no thread for long: the run
    started ahead lets go of its batches once it has waited `UNTAKEN_SECONDS` with none taken, and an epoch asked
    for after that is made anew, the same batches; a run taken first is never let go."""
    monkeypatch.setattr(runs, "UNTAKEN_SECONDS", 0.3)
    ds, _ = store
    it = ds.batches(64, shuffle=True, seed=5, fields=["id"])
    _ids(it), _ids(it)
    ahead = it._next._held[0]
    deadline = time.monotonic() + 5  # a local run's thread stops itself; a C run (which has none waiting) is closed
    while not ahead.stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    ahead.thread.join(5)
    assert ahead.work.epoch == 2 and ahead.stop.is_set() and not ahead.thread.is_alive() and ahead.queue.qsize() == 0
    np.testing.assert_array_equal(_ids(it), epochs_alone(ds, 2))  # made anew
    ahead = it._next._held[0]  # epoch 3's, started as epoch 2 drained
    taken = iter(it)
    first = next(taken)["id"]  # it is taken at once
    time.sleep(0.6)  # and waits for its consumer, taken: never let go
    assert it._active is ahead and not ahead.stop.is_set()
    np.testing.assert_array_equal(np.concatenate([first, *(batch["id"] for batch in taken)]), epochs_alone(ds, 3))
    it.close()


def test_a_fork_stops_the_runs_started_ahead_and_not_taken_first(store):
    """A process forked while a run started ahead works would copy its threads' locks held (DataLoader workers
    forked beside a loader without workers): such runs stop before the fork, and the epoch is made anew."""
    ds, _ = store
    it = ds.batches(64, shuffle=True, seed=5, fields=["id"])
    _ids(it), _ids(it)
    ahead = it._next._held[0]
    with warnings.catch_warnings():  # Python 3.12 on: a fork beside threads is deprecated, as this test says
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert ahead.work.epoch == 2 and ahead.stop.is_set() and not ahead.thread.is_alive()
    np.testing.assert_array_equal(_ids(it), epochs_alone(ds, 2))
    it.close()


def epochs_alone(ds, epoch):
    """Epoch ``epoch``'s ids as a single pass makes them."""
    alone = ds.batches(64, shuffle=True, seed=5, fields=["id"])
    alone.set_epoch(epoch)
    return _ids(alone)


def test_text_fields_come_as_strings(image_folder, tmp_path):
    ds = outcore.ingest_images(image_folder, tmp_path / "p.zarr", shape=(16, 16, 3), chunk_size=4, progress=False)
    batch = next(iter(ds.batches(6, fields=["path", "labels"], seed=0)))
    assert set(batch) == {"path", "labels"} and batch["path"].dtype.kind == "U"
    assert [ds.classes[k] for k in batch["labels"]] == [p.split("/")[0] for p in batch["path"]]


RESUME_SCRIPT = """
import hashlib, json, sys
import outcore
from outcore.transforms import BrightnessContrast, Compose, RandomFlip
store, state_path, skip, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
it = outcore.open_dataset(store).batches(48, seed=11, buffer_chunks=3, prefetch=3,
                                         transform=Compose([RandomFlip(), BrightnessContrast()]))
it.set_epoch(2)
if skip:
    it.load_state_dict(json.load(open(state_path)))
digests = []
for i, batch in enumerate(it):
    digests.append(hashlib.sha256(b"".join(batch[k].tobytes() for k in sorted(batch))).hexdigest())
    if len(digests) == stop:
        json.dump(it.state_dict(), open(state_path, "w"))
        break
print(json.dumps(digests))
"""


def _run_resume(*args):
    result = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, *map(str, args)], capture_output=True, text=True,
                            check=True, timeout=120)
    return json.loads(result.stdout)


def test_resume_in_a_new_process_is_byte_exact(store, tmp_path):
    ds, _ = store
    state = tmp_path / "state.json"
    uninterrupted = _run_resume(ds.location, tmp_path / "unused.json", 0, -1)
    assert len(uninterrupted) == 21
    head = _run_resume(ds.location, state, 0, 8)
    assert json.loads(state.read_text())["batches_done"] == 8
    tail = _run_resume(ds.location, state, 1, -1)
    assert head + tail == uninterrupted


SETTINGS_CHANGED = {  # a setting a resume must match -> options that change only it, and what the refusal names
    "seed": ({"seed": 2}, "seed"),
    "buffer_chunks": ({"buffer_chunks": 4}, "buffer_chunks"),
    "shuffle": ({"shuffle": False}, "shuffle"),
    "drop_last": ({"drop_last": True}, "drop_last"),
    "streams": ({"streams": 16}, "streams=16"),
    "indices": ({"indices": range(0, 1000, 2)}, "indices"),
    "global_batch_size": ({"batch_size": 32}, "global_batch_size"),
    "num_samples": ({"store": "fewer"}, "num_samples"),
    "chunk_size": ({"store": "other chunks"}, "chunk_size"),
}


BASE = {"seed": 1, "buffer_chunks": 8, "shuffle": True, "drop_last": False}


def _each_setting_changed(ids_store, tmp_path):
    """``(store, batch_size, options, named)`` for each setting that fixes an epoch's order (every key of
    `BatchIterator.settings`), changed alone from ``BASE``."""
    stores = {"fewer": outcore.from_arrays({"id": np.arange(999)}, tmp_path / "fewer.zarr", chunk_size=32,
                                           progress=False),
              "other chunks": outcore.from_arrays({"id": np.arange(1000)}, tmp_path / "other.zarr", chunk_size=64,
                                                  progress=False)}
    assert set(SETTINGS_CHANGED) == set(ids_store.batches(64, **BASE).settings())  # a new setting needs its case
    for change, named in SETTINGS_CHANGED.values():
        options = {**BASE, **change}
        store = stores[options.pop("store")] if "store" in options else ids_store
        yield store, options.pop("batch_size", 64), options, named


def test_every_setting_of_a_state_is_checked_on_load(ids_store, tmp_path):
    """A state loaded with any one setting changed is refused, naming it."""
    it = ids_store.batches(64, **BASE)
    next(iter(it))
    state = json.loads(json.dumps(it.state_dict()))
    for store, batch_size, options, named in _each_setting_changed(ids_store, tmp_path):
        with pytest.raises(OptionError, match=named):
            store.batches(batch_size, **options).load_state_dict(state)


def test_every_setting_of_a_state_is_checked_on_load_by_torchs_loader(ids_store, tmp_path):
    need("torch")
    state = {**ids_store.torch(64, fields=["id"], **BASE).state_dict(), "step": 1}
    for store, batch_size, options, named in _each_setting_changed(ids_store, tmp_path):
        with pytest.raises(OptionError, match=named):
            store.torch(batch_size, fields=["id"], **options).load_state_dict(state)


def test_transform_is_seeded_per_batch(store):
    ds, _ = store
    augment = Compose([RandomCrop(6, padding=1), RandomFlip(), BrightnessContrast()])
    a = list(ds.batches(100, seed=4, transform=augment))
    b = list(ds.batches(100, seed=4, transform=augment))
    assert a[0]["images"].shape == (100, 6, 6, 3)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x["images"], y["images"])
    plain = list(ds.batches(100, seed=4))
    assert not np.array_equal(a[0]["images"], plain[0]["images"][:, 1:7, 1:7])


def _augmented_steps(ds, world_size, transform, batch):
    """Per global step: each sample's id and its augmented image, over the ranks' batches."""
    ranks = [list(ds.batches(batch // world_size, seed=5, buffer_chunks=4, transform=transform, rank=r,
                             world_size=world_size)) for r in range(world_size)]
    steps = []
    for batches in zip(*ranks, strict=True):
        ids = np.concatenate([b["id"] for b in batches])
        images = np.concatenate([b["images"] for b in batches])
        steps.append({int(i): images[j].tobytes() for j, i in enumerate(ids)})
    return steps


@pytest.mark.parametrize("transform", [Compose([RandomCrop(6, padding=1), RandomFlip(), BrightnessContrast()]),
                                       RandomResizedCrop(5)])
def test_a_global_step_is_augmented_alike_on_any_number_of_ranks(store, transform):
    """Each stream's piece of a step draws from a generator of its own: a run resumed on another number of
    ranks sees the same augmented samples at every step (a repeated sample aside), not only the same samples."""
    ds, _ = store
    one = _augmented_steps(ds, 1, transform, 96)
    assert len(one) == 11 and len({image for step in one for image in step.values()}) > 900
    for world_size in (2, 4, 8):
        assert _augmented_steps(ds, world_size, transform, 96) == one, world_size


def test_break_and_exceptions_leave_no_thread_behind(store):
    ds, _ = store
    it = ds.batches(16, seed=0, prefetch=2)
    for i, _batch in enumerate(it):
        if i == 2:
            break
    assert _outcore_threads() == []
    assert it.batches_done == 3

    def failing(batch, rng):
        raise RuntimeError("augmentation broke")

    with pytest.raises(RuntimeError, match="augmentation broke"):
        list(ds.batches(16, transform=failing))
    assert _outcore_threads() == []
    unfinished = iter(ds.batches(16))
    next(unfinished)
    unfinished.close()
    assert _outcore_threads() == []


def test_corrupt_chunk_is_named_in_the_consumer(store, tmp_path):
    corrupt_chunk(tmp_path / "s.zarr", "images", 0)
    with pytest.raises(CorruptChunkError, match=r"field 'images', chunk 0 "):
        list(outcore.open_dataset(tmp_path / "s.zarr").batches(64, shuffle=False))
    assert _outcore_threads() == []


def _peak_while_iterating(ds, epochs=6):
    """The highest of ``epochs`` epochs' peaks of traced memory but the first's, which also allocates what stays
    (imports, caches): an epoch's peak moves with the threads' timing, by about a megabyte here (the peak of an
    epoch of 40 chunks was 1.7 MB in some, 2.5-2.7 MB in others), and the highest is what memory must hold."""
    peaks = []
    for _ in range(epochs):
        tracemalloc.start()
        try:
            for _ in ds.batches(32, seed=0, buffer_chunks=4, prefetch=2):
                pass
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return max(peaks[1:])


def test_memory_stays_flat_as_the_store_grows(tmp_path, rng, monkeypatch):
    """A run made by the pool's tasks holds what its schedule holds, whatever the store's size (a C run's plan takes
    some bytes a sample: tests/test_native_run.py)."""
    monkeypatch.setattr(iterator_module, "native_run", lambda *args: None)
    chunk = rng.integers(0, 256, (32, 32, 32, 3), dtype=np.uint8)  # 96 KiB chunks
    sizes = {}
    for name, chunks in (("small", 40), ("large", 160)):
        images = np.concatenate([chunk] * chunks)
        ds = outcore.from_arrays({"images": images}, tmp_path / f"{name}.zarr", chunk_size=32, progress=False)
        sizes[name] = (images.nbytes, _peak_while_iterating(ds))
    (small_bytes, small_peak), (large_bytes, large_peak) = sizes["small"], sizes["large"]
    assert large_bytes == 4 * small_bytes
    plan = EpochPlan(len(images), 32, batch_size=32, buffer_chunks=4)  # 8 streams
    making = max(2, outcore.thread_count())  # batches made at once: each step more loads a slot per stream at most
    held = max_held(plan, read_ahead=2 + (making - 1) * len(plan.streams))
    bound = held * chunk.nbytes + (2 + making) * chunk.nbytes  # chunks the schedule may hold, batches queued and made
    assert small_peak < bound and large_peak < bound, sizes
    assert large_peak < 1.5 * small_peak, sizes  # flat in the dataset size
    assert large_peak < large_bytes / 5  # a fifth of the store here (160 chunks), whatever its size (above)


@pytest.mark.parametrize("skip_damaged", [0, 2])
def test_the_batches_tasks_take_their_chunks_values_the_thread_planning_them_waits_for_no_read(store, monkeypatch,
                                                                                                skip_damaged):
    """The thread that plans a run's batches asks for their reads and tasks and waits for no read: each batch's task
    takes its chunks' values, once read (a wait on another thread costs tens of microseconds of CPU on either side).
    Where damaged chunks may be left out (``skip_damaged``), that thread finds them, in the schedule's order, and
    says them itself (a loader process sends each run's thread's warnings with that run's batches)."""
    ds, _ = store
    monkeypatch.setattr(iterator_module, "native_run", lambda *args: None)  # local runs' tasks, not a C run's
    found, values = [], runs.LocalRun._found  # each chunk's values found once, by the thread recorded
    monkeypatch.setattr(runs.LocalRun, "_found", lambda run, chunk: found.append(
        threading.current_thread().name) or values(run, chunk))
    outcore.set_threads(2)
    try:
        assert sorted(_ids(ds.batches(64, seed=0, fields=["images", "id"], skip_damaged=skip_damaged))) == \
            list(range(1000))
    finally:
        outcore.set_threads(None)
    planning = [thread for thread in found if thread == "outcore-batches"]
    assert len(found) >= 32 and (planning == found if skip_damaged else not planning), found


def test_each_epoch_reads_into_the_chunk_buffers_the_ones_before_freed(store, monkeypatch):
    """An iterator's runs (an epoch each) share its chunk buffers, and a run gives back those of its last batches
    too: after the first epoch, the iterator takes no more memory for chunks than the next epoch's run reads into
    while this one's last batches hold theirs (it starts as this one drains): at most a run's again, once, where
    buffers taken anew each epoch would be four runs' more."""
    ds, _ = store
    monkeypatch.setattr(iterator_module, "native_run", lambda *args: None)  # local runs' (C runs': test_native_run.py)
    it = ds.batches(64, seed=0, fields=["images", "id"])
    made = []
    for reader in it.readers.values():
        reader.empty = lambda empty=reader.empty: made.append(1) or empty()
    for _ in it:
        pass
    first = len(made)
    for _ in range(4):
        for _ in it:
            pass
    assert first >= 4 and len(made) - first <= first, (first, len(made))


def test_bad_options(store):
    ds, _ = store
    with pytest.raises(ValueError, match="batch_size=0"):
        ds.batches(0)
    with pytest.raises(KeyError, match="nope"):
        ds.batches(8, fields=["nope"])
    with pytest.raises(ValueError, match="rank=3"):
        ds.batches(8, rank=3, world_size=2)


def test_interpreter_exit_with_an_unfinished_iteration_does_not_hang(store):
    ds, _ = store
    code = ("import sys, outcore\n"
            "it = iter(outcore.open_dataset(sys.argv[1]).batches(8, prefetch=1))\n"
            "next(it)\n"
            "print('left')\n")  # exits with the producer blocked on a full queue
    result = subprocess.run([sys.executable, "-c", code, ds.location], capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.strip() == "left"


def test_interpreter_exit_stops_the_producers_before_finalizing(store):
    ds, _ = store
    code = ("import atexit, sys, threading, outcore\n"
            "it = iter(outcore.open_dataset(sys.argv[1]).batches(8, prefetch=1))\n"
            "next(it)\n"
            "atexit._run_exitfuncs()\n"  # what the interpreter runs at exit, before it finalizes
            "print([t.name for t in threading.enumerate() if t.name == 'outcore-batches'])\n")
    result = subprocess.run([sys.executable, "-c", code, ds.location], capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.strip() == "[]"  # no daemon thread left in native code when the interpreter ends it


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    stores = {}
    for num_samples, chunk_size in [(1, 1), (37, 8), (37, 64), (500, 7), (500, 64), (999, 128)]:
        path = tmp_path_factory.mktemp("layouts") / f"{num_samples}-{chunk_size}.zarr"
        stores[num_samples, chunk_size] = outcore.from_arrays(
            {"id": np.arange(num_samples)}, path, chunk_size=chunk_size, progress=False)
    return stores


@settings(max_examples=60, deadline=None)
@given(data=st.data(), batch_size=st.integers(1, 300), buffer_chunks=st.integers(0, 10),
       world_size=st.integers(1, 4), shuffle=st.booleans(), drop_last=st.booleans())
def test_iterator_epochs_follow_the_sharding_rule(layouts, data, batch_size, buffer_chunks, world_size, shuffle,
                                                  drop_last):
    ds = layouts[data.draw(st.sampled_from(sorted(layouts)))]
    seen, rank_batches = [], []
    for rank in range(world_size):
        it = ds.batches(batch_size, shuffle=shuffle, seed=2, buffer_chunks=buffer_chunks, rank=rank,
                        world_size=world_size, drop_last=drop_last)  # default streams: any world size runs
        batches = [b["id"] for b in it]
        assert len(batches) == len(it)
        assert all(len(b) == batch_size for b in (batches if drop_last else batches[:-1]))
        rank_batches.append(len(batches))
        seen.append(np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64))
    assert len(set(rank_batches)) == 1  # every rank the same number of batches: no DDP rank waits forever
    counts = np.bincount(np.concatenate(seen), minlength=len(ds))
    if drop_last:
        assert counts.max() <= 1  # nothing repeated; the short last global step left out
    else:  # the rank shares are padded by repeating samples from the start of the epoch's stream
        total = world_size * -(-len(ds) // world_size)
        assert counts.sum() == total and set(np.unique(counts)) <= {total // len(ds), total // len(ds) + 1}
        assert (counts == total // len(ds) + 1).sum() == total % len(ds)


def test_random_access_batches_equal_iterated_batches(store):
    ds, _ = store
    augment = Compose([RandomFlip(), BrightnessContrast()])
    it = ds.batches(48, seed=9, buffer_chunks=3, transform=augment)
    it.set_epoch(2)
    iterated = list(it)
    it.set_epoch(2)
    for index in reversed(range(len(it))):  # any order
        batch = it.batch(index)
        for name in batch:
            np.testing.assert_array_equal(batch[name], iterated[index][name])
    with pytest.raises(IndexError, match="batch 21"):
        it.batch(21)


class OwnBrightness(BrightnessContrast):
    """A user's class made from `BrightnessContrast`: run piece by piece, as the transform it is."""


@pytest.mark.parametrize("transform", [None, Compose([RandomCrop(6, padding=1), RandomFlip()]),
                                       Compose([RandomResizedCrop(5), RandomFlip(), Normalize(0.5, 0.2)]),
                                       Compose([RandomFlip(), BrightnessContrast()]),
                                       Compose([RandomFlip(), BrightnessContrast(), RandomResizedCrop(5), RandomFlip()]),
                                       Compose([RandomFlip(), OwnBrightness()])])
def test_batches_made_together_are_those_made_alone(store, monkeypatch, transform):
    """Consecutive batches made as one and cut apart (`LocalRun.together`) hold what each holds made alone, from the
    same draws (`BrightnessContrast`'s of each piece too, a crop's after it); a transform that draws or works piece by piece (a class of
    the user's) makes them one by one."""
    ds, _ = store
    outcore.set_threads(4)  # 4 batches made at once: up to 4 together
    monkeypatch.setattr(iterator_module, "native_run", lambda *args: None)  # local runs (a C run makes each alone)
    try:
        with monkeypatch.context() as alone_each:
            alone_each.setattr(runs.LocalRun, "MOST_TOGETHER", 1)
            alone = list(ds.batches(40, seed=5, buffer_chunks=3, transform=transform, drop_last=False))
        together = list(ds.batches(40, seed=5, buffer_chunks=3, transform=transform, drop_last=False))
    finally:
        outcore.set_threads(None)
    assert len(together) == len(alone) == 25
    for made, expected in zip(together, alone, strict=True):
        assert made.keys() == expected.keys()
        for name in made:
            assert made[name].dtype == expected[name].dtype
            np.testing.assert_array_equal(made[name], expected[name])
    joinable = transform is None or not isinstance(transform.transforms[-1], OwnBrightness)
    assert (together[0]["images"].base is together[1]["images"].base) is joinable  # one array cut in two
    assert alone[0]["images"].base is None or alone[0]["images"].base is not alone[1]["images"].base


def test_loader_stats(ids_store):
    it = ids_store.batches(100)
    for _ in it:
        pass
    stats = it.stats()
    assert stats["batches"] == 10 and stats["samples"] == 1000
    assert set(stats) >= {"samples_per_s", "wait_mean_ms", "wait_p95_ms", "wait_fraction", "ready_mean"}
    assert 0 <= stats["wait_fraction"] <= 1


def _slow(batch, rng):
    time.sleep(1.5)  # the producer is busy: the consumer waits on the queue
    return batch


@pytest.mark.parametrize("closing", ["close", "iter again"])
def test_a_consumer_waiting_on_a_closed_iteration_ends_within_a_second(store, closing):
    """close() (or a second iter() of the same iterator) while the consumer waited for a batch: the
    producer's end marker was refused and the consumer blocked in queue.get() forever."""
    ds, _ = store
    it = ds.batches(100, transform=_slow, prefetch=1, streams=1)  # one piece a batch: 1.5 s a batch
    first = iter(it)
    outcome = {}

    def consume():
        waiting.set()
        try:
            for _ in first:
                pass
        except outcore.IterationClosedError as error:
            outcome["error"], outcome["at"] = error, time.perf_counter()

    waiting = threading.Event()  # closed before its first next(), the iteration ends quietly: wait for the consumer
    consumer = threading.Thread(target=consume)
    consumer.start()
    assert waiting.wait(10)
    time.sleep(0.3)
    closed_at = time.perf_counter()
    if closing == "close":
        it.close()
    else:
        second = iter(it)
        next(second)  # starts the new run, which closes the first
    consumer.join(timeout=10)
    assert not consumer.is_alive()
    assert "closed" in str(outcome["error"]) and "batch 0 of epoch 0" in str(outcome["error"])
    assert outcome["at"] - closed_at < 1 + (1.5 if closing == "iter again" else 0)  # + the new run's first batch
    it.close()


def test_seed_domains_do_not_collide(store):
    """default_rng([s, 0, 0]) is default_rng(s): epoch 0's chunk order, the write order and batch 0's
    augmentation drew the same stream."""
    from outcore.ingest.permute import write_order
    from outcore.iterate.batch import transform_generator
    from outcore.iterate.plan import chunk_order
    from outcore.seeds import Domain, generator

    n = 64
    draws = [chunk_order(n, shuffle=True, seed=0, epoch=0), write_order(n, shuffle=True, seed=0),
             transform_generator((0, 0, 0, 0)).permutation(n), generator(Domain.REFERENCE, 0, 0).permutation(n),
             generator(Domain.CHUNK_ORDER, 0, 0, 0).permutation(n)]
    assert len({tuple(d.tolist()) for d in draws}) == len(draws)
    assert np.random.default_rng([0, 0, 0]).permutation(n).tolist() == np.random.default_rng(0).permutation(n).tolist()


def test_one_pool_of_threads_whatever_the_batches(tmp_path, rng):
    """The fused crop started a pool of os.cpu_count() threads per batch; now every read, decode and
    resize of the process shares one pool of outcore.thread_count() threads."""
    from outcore.testing import write_image_folder
    from outcore.transforms import RandomResizedCrop

    write_image_folder(tmp_path / "photos", 64, classes=("a", "b"), size=(48, 40), seed=0)
    ds = outcore.ingest_images(tmp_path / "photos", tmp_path / "p.zarr", shape=None, images="encoded",
                               chunk_size=8, progress=False)
    seen, started = set(), set()
    for batch in ds.batches(16, transform=Compose([RandomResizedCrop(24), RandomFlip()])):
        assert batch["images"].shape == (len(batch["images"]), 24, 24, 3)
        now = {t for t in threading.enumerate()
               if t.name.startswith("outcore") and not t.name.startswith(OBJECT_STORE_POOLS)}
        started |= {t.ident for t in now}
        seen.add(len(now))
    pool = {t.ident for t in threading.enumerate() if t.name.startswith("outcore-pool")}
    assert max(seen) <= outcore.thread_count() + 1  # the pool, and the run's producer thread
    assert len(started) <= outcore.thread_count() + 4  # threads are not started per batch (4 runs' producers)
    assert pool and len(pool) <= outcore.thread_count()


def test_the_thread_count_follows_affinity_and_the_knob(monkeypatch):
    from outcore import threads

    monkeypatch.setattr(threads.cpus.os, "sched_getaffinity", lambda pid: {0})
    assert threads.available_cpus() == 1
    monkeypatch.setenv("OUTCORE_THREADS", "3")
    assert outcore.thread_count() == 3
    outcore.set_threads(2)
    try:
        assert outcore.thread_count() == 2
    finally:
        outcore.set_threads(None)
    monkeypatch.setenv("OUTCORE_THREADS", "none")
    with pytest.raises(outcore.OptionError, match="OUTCORE_THREADS='none'"):
        outcore.thread_count()


@pytest.fixture(scope="module")
def in_order(tmp_path_factory):
    """1,000 samples in chunks of 50, stored in order: sample i's ``id`` is i."""
    return outcore.from_arrays({"x": np.zeros((1000, 2), np.float32), "id": np.arange(1000)},
                               tmp_path_factory.mktemp("subset") / "s.zarr", chunk_size=50, shuffle_on_write=False,
                               progress=False)


def test_a_subset_epoch_is_its_samples_once_and_resumes_exactly(in_order):
    subset = np.random.default_rng(3).choice(1000, 337, replace=False)
    it = in_order.batches(40, indices=subset, seed=2, fields=["id"])
    assert len(it) == 9
    epochs = [[b["id"].tolist() for b in it] for _ in range(2)]
    for epoch in epochs:
        assert sorted(i for batch in epoch for i in batch) == sorted(subset.tolist())
    assert epochs[0] != epochs[1]  # a new order each epoch
    again = in_order.batches(40, indices=subset[::-1], seed=2, fields=["id"])  # a set: its order does not matter
    assert [b["id"].tolist() for b in again] == epochs[0]
    head = in_order.batches(40, indices=subset, seed=2, fields=["id"])
    first = [b["id"].tolist() for _, b in zip(range(4), head)]
    tail = in_order.batches(40, indices=subset, seed=2, fields=["id"])
    tail.load_state_dict(json.loads(json.dumps(head.state_dict())))
    assert first + [b["id"].tolist() for b in tail] == epochs[0]
    ranks = [in_order.batches(20, indices=subset, seed=2, fields=["id"], rank=r, world_size=2) for r in range(2)]
    steps = [sorted(a["id"].tolist() + b["id"].tolist()) for a, b in zip(*ranks, strict=True)]
    assert steps[:-1] == [sorted(batch) for batch in epochs[0][:-1]]  # the global steps of one rank
    for other in ({"indices": subset[:-1]}, {}):
        with pytest.raises(outcore.OptionError, match="indices"):
            in_order.batches(40, seed=2, fields=["id"], **other).load_state_dict(head.state_dict())
    in_order_run = in_order.batches(40, indices=subset, shuffle=False, fields=["id"])
    assert [i for b in in_order_run for i in b["id"].tolist()] == sorted(subset.tolist())  # store order


@pytest.mark.parametrize("native", [True, False])
def test_a_subset_reads_only_the_chunks_that_hold_its_samples(in_order, monkeypatch, native):
    """By a C run (`outcore.iterate.native_run`: the chunks it plans, each read once by its engine) or local runs."""
    if not native:
        monkeypatch.setattr(iterator_module, "native_run", lambda *args: None)
    it = in_order.batches(16, indices=[*range(100, 130), 777, 990, 999], seed=1, fields=["id"])
    read, original = [], it.buffers.read_many  # every chunk a local run reads, in one C call or by its reader
    it.buffers.read_many = lambda chunks: read.extend(chunks) or original(chunks)
    ids = []
    for batch in it:
        ids += batch["id"].tolist()
        if isinstance(it._active, native_run.NativeRun):
            run = it._active
    assert sorted(ids) == [*range(100, 130), 777, 990, 999]
    if native and native_run.Engine is not None:
        assert not read and sorted(run.chunks.tolist()) == [2, 15, 19] and run.engine.reads == 3  # each once
    else:
        assert sorted(read) == [2, 15, 19]  # each once


def test_a_subset_outside_the_store_or_repeating_a_sample_is_refused(in_order):
    with pytest.raises(outcore.OptionError, match=r"sample 1000, outside the store's 1,000 samples"):
        in_order.batches(10, indices=[3, 1000])
    with pytest.raises(outcore.OptionError, match="sample 3 more than once"):
        in_order.batches(10, indices=[3, 4, 3])
    with pytest.raises(outcore.OptionError, match="integers"):
        in_order.batches(10, indices=[0.5, 2.0])
    with pytest.raises(outcore.OptionError, match="indices= is empty"):
        in_order.batches(10, indices=[])
