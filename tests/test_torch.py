"""PyTorch with real DataLoader workers: every start method, ranks, resume, a training loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.optional import need

import outcore
from outcore.errors import OptionError, OutcoreWarning
from outcore.iterate.shared import is_mapped
from outcore.transforms import BrightnessContrast, Compose, Normalize, RandomFlip

torch = need("torch")

START_METHODS = ["fork", "spawn", "forkserver"]


@pytest.mark.parametrize("start_method", START_METHODS)
def test_torch_workers_and_ranks_share_an_epoch_exactly_once(ids_store, start_method):
    ids_store["images"][:10].compute()  # read in the parent before the workers start
    seen = []
    for rank in range(2):
        loader = ids_store.torch(50, num_workers=2, shuffle=True, rank=rank, world_size=2, seed=4,
                                 multiprocessing_context=start_method)
        batches = list(loader)
        assert len(batches) == len(loader) == 10  # every rank the same number of batches
        seen.append(np.concatenate([b["id"].numpy() for b in batches]))
    assert sorted(np.concatenate(seen).tolist()) == list(range(1000))


@pytest.mark.parametrize("start_method", START_METHODS)
def test_torch_resume_mid_epoch_is_exact_for_every_start_method(ids_store, start_method):
    def loader():
        made = ids_store.torch(64, num_workers=2, shuffle=True, seed=5, multiprocessing_context=start_method)
        made.set_epoch(2)
        return made

    uninterrupted = [b["id"].numpy() for b in loader()]
    interrupted, head = loader(), []
    for batch in interrupted:
        head.append(batch["id"].numpy())
        if len(head) == 5:
            break
    state = json.loads(json.dumps(interrupted.state_dict()))  # saved with a checkpoint
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [b["id"].numpy() for b in resumed]
    assert len(head + tail) == len(uninterrupted) == 16
    for got, expected in zip(head + tail, uninterrupted, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning")  # 2-core CI
def test_batches_are_the_same_whatever_the_number_of_workers(ids_store):
    def epoch(workers, **keywords):
        loader = ids_store.torch(40, num_workers=workers, shuffle=True, seed=9, collate_fn=_step_and_ids, **keywords)
        loader.set_epoch(1)
        return list(loader)

    expected = epoch(0)
    assert [step for step, _ in expected] == list(range(25))
    for workers in (1, 2, 3):
        assert epoch(workers) == expected
    assert sorted(epoch(2, in_order=False, prefetch_factor=4)) == expected  # each step's batch, in any order


def _step_and_ids(batch):  # at module level: spawned workers receive it pickled
    return batch.index, batch["id"].tolist()


def _id_noise(batch, rng):  # an augmentation: each sample's draw depends on the generator of its piece
    return {**batch, "noise": rng.random(len(batch["id"]))}


@pytest.fixture
def pictures_store(tmp_path):
    """960 random 32x32 pictures in chunks of 32, and their ``id``: a batch of 96 pictures is large enough
    for shared memory."""
    images = np.random.default_rng(0).integers(0, 256, (960, 32, 32, 3), dtype=np.uint8)
    return outcore.from_arrays({"images": images, "id": np.arange(960)}, tmp_path / "pictures.zarr",
                               chunk_size=32, progress=False)


def _augmented(batch, rng):  # at module level: spawned workers receive it pickled
    return Compose([RandomFlip(), BrightnessContrast()])(_id_noise(batch, rng), rng)


def _epoch(store, num_workers, **options):
    """Each batch of an epoch of ``store`` as plain lists, and how many batches held are mapped from shared memory."""
    context = {"multiprocessing_context": options.pop("context", "fork")} if num_workers else {}
    loader = store.torch(96, num_workers=num_workers, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented,
                         **context, **options)
    batches = list(loader)
    mapped = len(list(loader._mailbox.folder.glob("taken-*"))) if loader._mailbox is not None else 0
    return [(b.index, b["id"].tolist(), b["noise"].tolist(), b["images"].numpy().tobytes()) for b in batches], mapped


def test_batches_made_by_a_process_of_their_own_are_those_made_here_and_resume(pictures_store):
    made_here = [_epoch(pictures_store, 0)[0] for _ in range(1)]
    loader = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented, process=True)
    while not loader.dataset._process.ready():  # every batch made there
        time.sleep(0.01)
    first = [(b.index, b["id"].tolist(), b["noise"].tolist(), b["images"].numpy().tobytes(), b.samples.tolist())
             for b in loader]
    assert [batch[:4] for batch in first] == made_here[0]
    here = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented)
    assert [batch[4] for batch in first] == [b.samples.tolist() for b in here]  # each batch says its samples
    pid = loader.dataset._process.process.pid
    head = []
    for batch in loader:  # the second epoch, left after three batches
        head.append(batch["id"].tolist())
        if len(head) == 3:
            break
    assert loader.dataset._process.process.pid == pid  # the same process, epoch after epoch
    resumed = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented, process=True)
    resumed.load_state_dict(loader.state_dict())
    whole = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented)
    whole.set_epoch(1)
    assert head + [b["id"].tolist() for b in resumed] == [b["id"].tolist() for b in whole]
    with pytest.raises(outcore.OptionError, match="process= makes the batches in processes of their own"):
        pictures_store.torch(96, num_workers=2, process=True)


def test_batches_made_by_several_processes_together_are_those_made_here(pictures_store):
    loader = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented, process=2)
    while not loader.dataset._process.ready():  # every batch made there, each by both processes
        time.sleep(0.01)
    made = [(b.index, b["id"].tolist(), b["noise"].tolist(), b["images"].numpy().tobytes(), b.samples.tolist())
            for b in loader]
    assert [batch[:4] for batch in made] == _epoch(pictures_store, 0)[0]
    here = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented)
    assert [batch[4] for batch in made] == [b.samples.tolist() for b in here]  # each batch says its samples


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes:UserWarning")  # 2-core CI
@pytest.mark.parametrize("workers", [2, 4])
def test_loader_workers_each_read_only_their_streams_chunks(pictures_store, monkeypatch, tmp_path, workers):
    """Workers taking turns at whole batches each read the chunks of their batches (1.4-3x the rank's share
    between them); making a part of every batch each, written side by side in shared memory, they read the
    rank's share once between them, and the batches, augmentation included, are those of a loader without
    workers, mapped rather than copied."""
    from outcore.iterate.runs import LocalRun

    log = tmp_path / "reads"
    log.mkdir()
    read = LocalRun._read

    def logged(self, chunks):  # runs in the forked workers
        with open(log / str(os.getpid()), "a") as file:
            file.write("".join(f"{chunk}\n" for chunk in chunks))
        return read(self, chunks)

    monkeypatch.setattr(LocalRun, "_read", logged)

    expected, _ = _epoch(pictures_store, 0)
    # the rank's plan: the chunks it reads, once each but for those cut between two streams
    rank_reads = len(pictures_store.batches(96, shuffle=True, seed=3, buffer_chunks=4).plan(0).chunks)
    for path in log.iterdir():
        path.unlink()
    assert _epoch(pictures_store, workers) == (expected, 10)  # every batch's pictures mapped
    reads = [path.read_text().split() for path in log.iterdir()]
    assert len(reads) == workers
    assert sum(len(r) for r in reads) == rank_reads  # was 1.4-3x with workers taking turns
    assert len(set().union(*map(set, reads))) == 30  # every chunk of the store


@pytest.mark.parametrize("start_method", START_METHODS)
def test_loader_workers_parts_for_every_start_method_resume_and_in_any_order(pictures_store, start_method):
    """Parts of each batch by spawned and forkserver workers too; persistent workers across passes, one
    stopped mid-epoch and resumed; in_order=False; channels_first. Nothing is left in shared memory."""
    expected, _ = _epoch(pictures_store, 0)
    assert _epoch(pictures_store, 2, context=start_method) == (expected, 10)
    unordered, mapped = _epoch(pictures_store, 2, context=start_method, in_order=False, prefetch_factor=4)
    assert sorted(unordered) == expected and mapped == 10
    loader = pictures_store.torch(96, num_workers=2, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented,
                                  multiprocessing_context=start_method, persistent_workers=True, channels_first=True)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 4:
            break
    folder = loader._mailbox.folder
    loader.load_state_dict(loader.state_dict())
    tail = list(loader)  # the same workers, a new pass: what the first left unasked is removed
    assert [b.index for b in head + tail] == list(range(10))
    for got, want in zip(head + tail, expected, strict=True):
        assert got["images"].shape == (len(want[1]), 3, 32, 32)  # (N, C, H, W) views of the mapped batch
        assert got["id"].tolist() == want[1]
        assert got["images"].permute(0, 2, 3, 1).numpy().tobytes() == want[3]
    del head, tail, got, batch
    assert not [name for name in os.listdir(folder) if not name.startswith("free-") and name != "owner.lock"]
    del loader
    assert not folder.exists()


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning")  # 2-core CI
@pytest.mark.parametrize("options", [{"drop_last": True}, {"indices": np.arange(5, 650, 3)}, {"rank": 1, "world_size": 2}])
def test_loader_workers_parts_with_text_subsets_ranks_and_uneven_parts(tmp_path, options):
    """3 workers share 8 (or 4) streams unevenly; text comes as strings as wide as the batch's widest."""
    paths = np.array([f"file-{i}" + "x" * (i % 7) for i in range(700)])
    images = np.random.default_rng(1).integers(0, 256, (700, 32, 32, 3), dtype=np.uint8)
    store = outcore.from_arrays({"images": images, "id": np.arange(700), "path": paths}, tmp_path / "text.zarr",
                                chunk_size=32, progress=False)

    def epoch(workers):
        context = {"multiprocessing_context": "fork"} if workers else {}
        loader = store.torch(96, num_workers=workers, shuffle=True, seed=1, **context, **options)
        return [(b["id"].tolist(), b["path"].tolist(), b["images"].numpy().tobytes()) for b in loader], loader

    expected, _ = epoch(0)
    got, loader = epoch(3)
    assert got == expected and loader.dataset.parts == 3
    assert all(path == paths[i] for ids, batch_paths, _ in got for i, path in zip(ids, batch_paths, strict=True))


def test_loader_workers_parts_gathered_by_the_pin_thread_are_the_batches(pictures_store, monkeypatch):
    """With ``pin_memory``, the DataLoader's pin thread copies each worker's part into its batch's pinned memory as
    it comes (`Delivered.pin_memory`): the batches are those of a loader without workers, none mapped, their files
    handed back to the workers at once, and a pass stopped early leaves no memory held. No GPU here: the pin
    thread's very call is made as the loader receives each item, plain memory standing in for pinned memory."""
    from torch.utils.data._utils.pin_memory import pin_memory

    import outcore.adapters.torch as adapter
    from outcore.adapters import torch_pinned
    from outcore.adapters.torch_pinned import PinnedParts
    from outcore.iterate.gather import plain
    from outcore.iterate.shared import free_file

    made = []

    def allocate(shape, dtype, field=""):
        made.append(field)
        return plain(shape, dtype)

    monkeypatch.setattr(adapter, "pinned_parts", PinnedParts(allocate))
    whole = adapter.OutcoreLoader._whole
    expected, _ = _epoch(pictures_store, 0)
    monkeypatch.setattr(adapter.OutcoreLoader, "_whole", lambda self, items: whole(self, map(pin_memory, items)))
    assert _epoch(pictures_store, 2) == (expected, 0)  # not one batch mapped from shared memory: each in its own
    assert made == ["images"] * 10  # a batch's memory made once, by the first of its parts to come
    freed = []  # the inode of each batch file handed back
    monkeypatch.setattr(torch_pinned, "free_file", lambda folder, name, size: (
        freed.append(os.stat(os.path.join(folder, name)).st_ino), free_file(folder, name, size)))
    loader = pictures_store.torch(96, num_workers=2, shuffle=True, seed=3, buffer_chunks=4,
                                  multiprocessing_context="fork", persistent_workers=True)
    for index, batch in enumerate(loader):
        assert batch["images"].numpy().base is not None and not is_mapped(batch["images"].numpy())
        kept = {entry.inode() for entry in os.scandir(loader._mailbox.folder)}
        assert len(freed) == index + 1 and set(freed) <= kept  # each batch's file handed back once its rows were
        # copied, and kept: free, or already a later part's (the workers take free files for the parts asked)
        if index == 3:
            break
    assert not adapter.pinned_parts.batches  # the parts of batches the stopped pass never joined: let go of


def test_loader_workers_without_room_in_shared_memory_send_their_parts_and_it_is_said(pictures_store, monkeypatch):
    from outcore.iterate import mappings

    def full(path, size, *, create):  # a /dev/shm with no room: what posix_fallocate says
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mappings, "open_file", full)  # in the forked workers
    expected, _ = _epoch(pictures_store, 0)
    with pytest.warns(OutcoreWarning, match="no room .* for batches in shared memory"):
        assert _epoch(pictures_store, 2) == (expected, 0)  # the same batches, joined by the loader


def test_loader_workers_take_turns_without_shared_memory(pictures_store, monkeypatch):
    monkeypatch.setenv("OUTCORE_SHARED_MEMORY", "0")
    expected, _ = _epoch(pictures_store, 0)
    assert _epoch(pictures_store, 2) == (expected, 0)  # whole batches, sent by the DataLoader

def test_a_state_saved_on_4_ranks_resumes_on_2_and_on_8_each_sample_once(ids_store):
    """Ranks simulated in one process (rank=, world_size=): 4 ranks of 20 stop after 5 of 13 global steps;
    any rank's state loads on 2 ranks of 40, or 8 of 10, and the job sees every sample exactly once."""
    def ranks(world_size):
        return [ids_store.torch(80 // world_size, shuffle=True, seed=2, rank=rank, world_size=world_size,
                                num_workers=rank % 2) for rank in range(world_size)]

    def steps(loaders, first=0):
        """The union of the ranks' batches at each global step (sorted ids)."""
        per_rank = [[b["id"].tolist() for b in loader] for loader in loaders]
        assert len({len(batches) for batches in per_rank}) == 1  # equal step counts on every rank
        return [sorted(i for batches in per_rank for i in batches[k]) for k in range(len(per_rank[0]))]

    uninterrupted = steps(ranks(4))
    assert len(uninterrupted) == 13 and sorted(i for step in uninterrupted for i in step) == list(range(1000))
    interrupted = ranks(4)
    head = [[] for _ in range(5)]
    for loader in interrupted:
        for k, batch in enumerate(loader):
            head[k] += batch["id"].tolist()
            if k == 4:
                break
    states = [json.loads(json.dumps(loader.state_dict())) for loader in interrupted]
    assert all(state == states[0] for state in states)  # the same on every rank
    for world_size in (2, 8, 1):
        resumed = ranks(world_size)
        for loader in resumed:
            loader.load_state_dict(states[3])
        tail = steps(resumed)
        assert [sorted(h) for h in head] + tail == uninterrupted  # the same global steps, each sample once
    with pytest.raises(ValueError, match="global_batch_size"):
        ids_store.torch(30, shuffle=True, seed=2, rank=0, world_size=2).load_state_dict(states[0])


def test_a_state_saved_on_6_ranks_with_the_defaults_resumes_where_its_streams_allow(ids_store):
    """6 ranks of 16 with the default options (24 streams; 8 streams refused 6 ranks), DataLoader workers
    0 to 2: every sample once an epoch, equal step counts; a state saved after 4 of 11 global steps resumes
    on 4, 3, 12 or 1 ranks (they divide 24) with the same global steps, and 16 ranks are refused naming
    the streams to pass from the first run on."""
    def ranks(world_size):
        return [ids_store.torch(96 // world_size, shuffle=True, seed=7, rank=rank, world_size=world_size,
                                num_workers=rank % 3) for rank in range(world_size)]

    def steps(loaders):
        per_rank = [[b["id"].tolist() for b in loader] for loader in loaders]
        assert len({len(batches) for batches in per_rank}) == 1
        return [sorted(i for batches in per_rank for i in batches[k]) for k in range(len(per_rank[0]))]

    def once(epoch):
        """An epoch's global steps, the last one without its repeats (which depend on the world size)."""
        before = {i for step in epoch[:-1] for i in step}
        return [*epoch[:-1], [i for i in epoch[-1] if i not in before]]

    uninterrupted = steps(ranks(6))
    assert len(uninterrupted) == 11 and {i for step in uninterrupted for i in step} == set(range(1000))
    interrupted, head = ranks(6), [[] for _ in range(4)]
    for loader in interrupted:
        for k, batch in zip(range(4), loader, strict=False):
            head[k] += batch["id"].tolist()
    state = json.loads(json.dumps(interrupted[5].state_dict()))
    assert state["streams"] == 24
    for world_size in (4, 3, 12, 1):
        resumed = ranks(world_size)
        for loader in resumed:
            loader.load_state_dict(state)
        assert once([sorted(h) for h in head] + steps(resumed)) == once(uninterrupted), world_size
    with pytest.raises(OptionError, match=r"24 streams, which world_size=16 cannot share.*streams=48\)"):
        ids_store.torch(6, shuffle=True, seed=7, rank=0, world_size=16).load_state_dict(state)


def test_a_pass_stopped_at_its_last_batch_moves_to_the_next_epoch(ids_store):
    """Lightning takes len(loader) batches and never asks for the end: the next pass was left empty."""
    import itertools

    loader = ids_store.torch(100, shuffle=True, seed=3)
    first = [b["id"].tolist() for b in itertools.islice(loader, len(loader))]
    second = [b["id"].tolist() for b in itertools.islice(loader, len(loader))]
    assert len(second) == 10 and loader.state_dict()["epoch"] == 1 and second != first
    assert sorted(i for batch in second for i in batch) == list(range(1000))


def test_torch_passes_dataloader_keywords_through(ids_store):
    loader = ids_store.torch(100, num_workers=2, prefetch_factor=3, timeout=60, worker_init_fn=_set_threads,
                             multiprocessing_context="fork", seed=1)
    assert (loader.prefetch_factor, loader.timeout, loader.worker_init_fn) == (3, 60, _set_threads)
    assert sorted(np.concatenate([b["id"].numpy() for b in loader]).tolist()) == list(range(1000))


def _with_worker(batch, rng):  # at module level: spawned workers receive it pickled
    return {**batch, "pid": np.full(len(batch["id"]), os.getpid())}


@pytest.mark.parametrize("start_method", START_METHODS)
def test_persistent_workers_follow_each_epoch_and_resume(ids_store, start_method):
    def loader(transform=None):
        return ids_store.torch(64, num_workers=2, shuffle=True, seed=5, multiprocessing_context=start_method,
                               persistent_workers=True, transform=transform)

    fresh = ids_store.torch(64, shuffle=True, seed=5)  # made here: workers make the same batches (tested above)
    expected = [[b["id"].numpy() for b in fresh] for _ in range(2)]  # epochs 0 and 1, counted by the loader
    fresh.set_epoch(7)
    expected.append([b["id"].numpy() for b in fresh])
    kept = loader(_with_worker)
    epochs, workers = [], set()
    for epoch in range(3):
        if epoch == 2:
            kept.set_epoch(7)
        delivered = list(kept)
        epochs.append([b["id"].numpy() for b in delivered])
        workers |= {int(pid) for b in delivered for pid in b["pid"]}
    assert len(workers) == 2  # the same two processes served every epoch
    for got, want in zip(epochs, expected, strict=True):
        assert len(got) == len(want) == 16
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    interrupted, head = loader(), []  # stopped mid-epoch, then resumed by persistent workers
    interrupted.set_epoch(7)
    for batch in interrupted:
        head.append(batch["id"].numpy())
        if len(head) == 5:
            break
    resumed = loader()
    resumed.load_state_dict(json.loads(json.dumps(interrupted.state_dict())))
    tail = [b["id"].numpy() for b in resumed]
    rest = [b["id"].numpy() for b in interrupted]  # the interrupted loader's own workers continue too
    for got in (head + tail, head + rest):
        assert len(got) == 16
        for a, b in zip(got, expected[2], strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_wrokers'"):
        ids_store.torch(100, num_wrokers=2)


def test_a_transform_that_cannot_pickle_is_named_before_spawned_workers_start(ids_store):
    with pytest.raises(ValueError, match="started by 'spawn' receive the dataset .* pickled.*module level"):
        ids_store.torch(100, num_workers=2, multiprocessing_context="spawn", transform=lambda batch, rng: batch)
    ids_store.torch(100, num_workers=2, multiprocessing_context="fork", transform=lambda batch, rng: batch)
    with pytest.raises(ValueError, match="receive the collate_fn pickled.*module level"):
        ids_store.torch(100, num_workers=2, multiprocessing_context="spawn", collate_fn=lambda batch: batch)


def _set_threads(worker: int) -> None:
    torch.set_num_threads(1)


def test_torch_batches_in_a_plain_dataloader(ids_store):
    from outcore.adapters.torch import TorchBatches

    batches = TorchBatches(ids_store, 100, seed=1)  # built without knowing the DataLoader's workers
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2)
    assert sorted(np.concatenate([b["id"].numpy() for b in loader]).tolist()) == list(range(1000))


def test_a_loader_without_workers_reads_each_epoch_into_the_chunk_buffers_the_ones_before_freed(ids_store,
                                                                                               monkeypatch):
    """``ds.torch`` keeps its iterator from one pass to the next, and with it the chunk buffers each pass reads
    into (as ``ds.batches``' epochs share theirs, a run's more at most for the next epoch's, started as a pass
    drains: tests/test_loader.py)."""
    from outcore.iterate import iterator
    from outcore.storage.shard_reader import ShardReader

    monkeypatch.setattr(iterator, "native_run", lambda *args: None)  # local runs' (C runs': test_native_run.py)
    made, empty = [], ShardReader.empty
    monkeypatch.setattr(ShardReader, "empty", lambda self: made.append(1) or empty(self))
    loader = ids_store.torch(100, shuffle=True, seed=4)
    assert sorted(np.concatenate([b["id"].numpy() for b in loader]).tolist()) == list(range(1000))
    first = len(made)
    for _ in range(3):
        assert sorted(np.concatenate([b["id"].numpy() for b in loader]).tolist()) == list(range(1000))
    assert first >= 4 and len(made) - first <= first, (first, len(made))


def test_torch_epochs_advance_and_set_epoch_repeats(ids_store):
    loader = ids_store.torch(100, num_workers=2, shuffle=True, seed=4)
    first = np.concatenate([b["id"].numpy() for b in loader])
    stats = loader.stats()
    assert stats["batches"] == 10 and stats["samples"] == 1000 and 0 <= stats["wait_fraction"] <= 1
    second = np.concatenate([b["id"].numpy() for b in loader])
    assert not np.array_equal(first, second) and sorted(second.tolist()) == list(range(1000))
    loader.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate([b["id"].numpy() for b in loader]), first)


def test_torch_training_loop_learns(splits):
    train, val = splits
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = train.torch(32, num_workers=2, shuffle=True, channels_first=True, fields=["images", "labels"],
                         transform=Normalize())
    for _ in range(3):
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
            loss.backward()
            optimizer.step()
    correct = 0
    with torch.no_grad():
        for batch in val.torch(64, num_workers=0, shuffle=False, channels_first=True, transform=Normalize()):
            correct += int((model(batch["images"]).argmax(1) == batch["labels"]).sum())
    assert correct / len(val) > 0.5  # three classes: chance is 1/3


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning")  # 2-core CI
@pytest.mark.parametrize(("workers", "stop"), [(2, 7), (3, 1), (3, 16)])
def test_torch_resume_mid_epoch_in_a_new_loader(ids_store, workers, stop):
    loader = ids_store.torch(64, num_workers=workers, shuffle=True, seed=5)
    loader.set_epoch(3)
    uninterrupted = [b["id"].numpy() for b in loader]
    assert len(uninterrupted) == len(loader)
    if stop == len(uninterrupted):  # stopped after the epoch's last batch: a new pass is the next epoch
        uninterrupted += [b["id"].numpy() for b in loader]
    interrupted = ids_store.torch(64, num_workers=workers, shuffle=True, seed=5)
    interrupted.set_epoch(3)
    head = []
    for batch in interrupted:
        head.append(batch["id"].numpy())
        if len(head) == stop:
            break
    state = interrupted.state_dict()
    assert state["epoch"] == 3 and state["step"] == stop and state["skip"] == []
    for resumed_workers in (workers, 0, 1):  # with the same number of workers, or another
        resumed = ids_store.torch(64, num_workers=resumed_workers, shuffle=True, seed=5)
        resumed.load_state_dict(state)
        tail = [b["id"].numpy() for b in resumed]
        assert len(head) + len(tail) == len(uninterrupted)
        for got, expected in zip(head + tail, uninterrupted, strict=True):
            np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="seed"):
        ids_store.torch(64, num_workers=workers, shuffle=True, seed=6).load_state_dict(state)


def test_to_device_on_the_cpu_passes_batches_through(ids_store):
    from outcore.adapters.torch import to_device

    loader = ids_store.torch(100, num_workers=0, shuffle=False)
    moved = [b["id"].numpy() for b in to_device(loader, "cpu")]
    np.testing.assert_array_equal(np.concatenate(moved), ids_store["id"].compute())  # storage order


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_to_device_overlaps_copies_on_a_gpu(ids_store):
    from outcore.adapters.torch import to_device

    on_the_cpu = [b["id"] for b in ids_store.torch(100, num_workers=2, shuffle=True, seed=3)]
    loader = ids_store.torch(100, num_workers=2, shuffle=True, seed=3, pin_memory=True)
    batches = list(to_device(loader, "cuda"))
    assert all(b["id"].device.type == "cuda" for b in batches)
    assert len(batches) == len(on_the_cpu) == 10  # the same batches, in the same order, on the GPU
    for got, expected in zip(batches, on_the_cpu, strict=True):
        assert torch.equal(got["id"].cpu(), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_to_device_computes_on_a_batch_without_waiting_for_the_next_ones_copy():
    """When batch 0 is handed over, batch 1's copy is already queued on the side stream; work on batch 0 waits for
    batch 0's copy only. Batch 1 is 1 GiB (tens of milliseconds to copy): a kernel on batch 0 that waited for it
    would end after it."""
    from outcore.adapters.torch import to_device

    small = {"x": torch.arange(1024, dtype=torch.float32).pin_memory()}
    large = {"x": torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)}
    (torch.ones(4, device="cuda") + 1).sum().item()  # the kernels loaded, the context made: not timed below
    moved = to_device(iter([small, large]), "cuda")
    first = next(moved)  # batch 1's copy is under way now
    began = time.perf_counter()
    total = (first["x"] + 1).sum()
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    computed = time.perf_counter() - began
    second = next(moved)
    torch.cuda.synchronize()
    copied = time.perf_counter() - began
    assert float(total) == 1024 * 1023 / 2 + 1024 and second["x"].numel() == 1 << 30
    assert computed < copied / 4, (computed, copied)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pin_memory_gathers_the_workers_parts_in_the_pin_thread(pictures_store):
    """Parts of each batch copied into pinned memory by the DataLoader's pin thread: the batches of a loader
    without workers, pinned, none mapped from shared memory."""
    expected, _ = _epoch(pictures_store, 0)
    loader = pictures_store.torch(96, num_workers=2, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented,
                                  multiprocessing_context="fork", pin_memory=True)
    batches = list(loader)
    assert all(b["images"].is_pinned() and not is_mapped(b["images"].numpy()) for b in batches)
    got = [(b.index, b["id"].tolist(), b["noise"].tolist(), b["images"].numpy().tobytes()) for b in batches]
    assert got == expected and not list(loader._mailbox.folder.glob("taken-*"))


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the warning is for machines without an accelerator")
def test_without_workers_pin_memory_without_an_accelerator_is_said_as_a_dataloader_says_it(ids_store):
    """Without workers the loader hands its batches over itself, not through the DataLoader's iterator; what that
    iterator says still comes: asked to pin with nothing to pin for, a DataLoader's warning, each pass."""
    loader = ids_store.torch(100, shuffle=True, seed=3, pin_memory=True)
    for _ in range(2):
        with pytest.warns(UserWarning, match="'pin_memory' argument is set as true but no accelerator is found"):
            batches = list(loader)
        assert len(batches) == 10 and not batches[0]["id"].is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("workers", "streams"), [(0, 8), (2, 8), (2, 1)])  # threads, parts, turns
def test_pin_memory_pins_every_batch_however_it_was_made(ids_store, workers, streams):
    expected = [b["id"] for b in ids_store.torch(100, num_workers=workers, shuffle=True, seed=3, streams=streams)]
    loader = ids_store.torch(100, num_workers=workers, shuffle=True, seed=3, streams=streams, pin_memory=True)
    batches = list(loader)
    assert all(b["id"].is_pinned() for b in batches)  # workers making parts: pinned once joined
    assert len(batches) == len(expected) == 10
    for got, wanted in zip(batches, expected, strict=True):
        assert torch.equal(got["id"], wanted)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_batches_made_by_the_loaders_threads_are_born_pinned_and_not_copied_to_be(ids_store):
    """No workers: each batch is made in pinned memory, so the DataLoader's pinning (on the training loop's
    thread) leaves it as it is: the tensor handed over is the memory the batch was made in (batches of a few
    kilobytes are made a few together, each a view of its part of the arrays made: `runs.LocalRun`)."""
    from outcore.adapters import torch_batches

    made = []
    born = torch_batches.pinned_empty

    def recorded(shape, dtype, field=""):
        made.append(array := born(shape, dtype, field))
        return array

    torch_batches.pinned_empty = recorded
    try:
        batches = list(ids_store.torch(100, shuffle=True, seed=3, pin_memory=True))
    finally:
        torch_batches.pinned_empty = born
    spans = [(array.ctypes.data, array.ctypes.data + array.nbytes) for array in made]

    def made_in_pinned_memory(value):
        start, end = value.data_ptr(), value.data_ptr() + value.numel() * value.element_size()
        return value.is_pinned() and any(low <= start and end <= high for low, high in spans)

    assert len(batches) == 10 and all(made_in_pinned_memory(b["id"]) for b in batches)


@pytest.mark.timeout(120)
def test_a_process_of_its_own_copying_into_pinned_memory_feeds_epoch_after_epoch(pictures_store, monkeypatch):
    """`ds.torch(pin_memory=True, process=True)` on a GPU machine: a thread of the loop's process copies each batch
    into pinned memory as it comes from the process, and from the second epoch on the next epoch's run is ordered
    ahead, its own thread waiting on the same connection (it took this epoch's batches for a closed run's and
    dropped them: the H200's training loop hung in its second epoch). Here a numpy array stands in for pinned
    memory: every epoch's batches, those made without a process."""
    from outcore.adapters import torch_batches

    made = []

    def stand_in(shape, dtype, field=""):
        made.append(shape)
        return np.empty(shape, dtype)

    monkeypatch.setattr(torch_batches, "pinned_empty", stand_in)
    loader = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented, process=True)
    loader.dataset.pinned = True  # as on a GPU machine with pin_memory=True
    while not loader.dataset._process.ready():  # every batch made there
        time.sleep(0.01)
    got = [[b["id"].tolist() for b in loader] for _ in range(4)]
    here = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented)
    assert got == [[b["id"].tolist() for b in here] for _ in range(4)]
    assert len(made) >= 4 * 10  # copied into the stand-in: each batch's fields


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_pinned_batches_from_a_process_of_their_own_reach_the_gpu_epoch_after_epoch(pictures_store):
    """The H200's hang, on a GPU: four epochs of `ds.torch(pin_memory=True, process=True)` through `to_device`."""
    from outcore.adapters.torch import to_device

    loader = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented, process=True,
                                  pin_memory=True)
    got = [[b["id"].tolist() for b in to_device(loader, "cuda")] for _ in range(4)]
    here = pictures_store.torch(96, shuffle=True, seed=3, buffer_chunks=4, transform=_augmented)
    assert got == [[b["id"].tolist() for b in here] for _ in range(4)]


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_batches_say_which_samples_they_hold_and_come_in_store_order(ids_store, workers):
    ids = ids_store["id"].compute()  # the store was shuffled on write: ids[i] is sample i's source index
    batches = list(ids_store.torch(64, num_workers=workers))  # no shuffle unless asked, as a DataLoader
    for batch in batches:
        np.testing.assert_array_equal(batch["id"].numpy(), ids[batch.samples])
    order = np.concatenate([batch.samples for batch in batches])
    assert order.tolist() == list(range(1000))  # predictions line up with the store's labels and paths
    shuffled = next(iter(ids_store.torch(64, shuffle=True, seed=1)))
    np.testing.assert_array_equal(shuffled["id"].numpy(), ids[shuffled.samples])
    assert shuffled.samples.tolist() != list(range(64))


def _ids_and_weight(batch):  # a collate_fn at module level: spawned workers receive it pickled
    return batch["id"], float(batch["id"].float().mean())


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_collate_fn_gets_each_outcore_batch(ids_store, start_method):
    """collate_fn was accepted, then failed with AttributeError: it now gets each TorchBatch, as a
    DataLoader with batch_size=None gives it each item, and the loader still counts and resumes."""
    loader = ids_store.torch(100, num_workers=2, shuffle=True, seed=2, collate_fn=_ids_and_weight,
                             multiprocessing_context=start_method, pin_memory=False)
    collated = list(loader)
    assert len(collated) == 10 and all(isinstance(mean, float) for _, mean in collated)
    plain = [b["id"] for b in ids_store.torch(100, num_workers=2, shuffle=True, seed=2,
                                              multiprocessing_context=start_method)]
    for (ids, mean), expected in zip(collated, plain, strict=True):
        assert torch.equal(ids, expected) and mean == pytest.approx(float(expected.float().mean()))
    assert loader.state_dict()["epoch"] == 1  # counted as always


RANKS_SCRIPT = """
import json, os, sys
import numpy as np
import torch
import torch.distributed as dist
import outcore
from outcore.adapters.torch import TorchBatches

rank, workers, how = int(sys.argv[2]), int(sys.argv[4]), sys.argv[5]
ds = outcore.open_dataset(sys.argv[1])
if how == "loader":
    loader = ds.torch(50, shuffle=True, seed=3, num_workers=workers)
else:  # a plain DataLoader over TorchBatches, its workers spawned: they do not inherit the process group
    loader = torch.utils.data.DataLoader(TorchBatches(ds, 50, shuffle=True, seed=3, num_workers=workers),
                                         batch_size=None, num_workers=workers, multiprocessing_context="spawn")
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[3], rank=rank, world_size=2)
ids = [b["id"].tolist() for b in loader]
print(json.dumps({"rank": rank, "len": len(loader), "ids": sum(ids, [])}))
dist.destroy_process_group()
"""


@pytest.mark.parametrize(("how", "workers"), [("loader", 0), ("loader", 2), ("plain", 2)])
def test_a_loader_built_before_init_process_group_shards_by_rank(ids_store, how, workers):
    """The rank was read when the loader was built: before init_process_group, every rank got the whole
    epoch. Two gloo processes on loopback now read disjoint halves."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    ranks = [subprocess.Popen([sys.executable, "-c", RANKS_SCRIPT, ids_store.location, str(rank), port,
                               str(workers), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    outputs = [rank.communicate(timeout=240) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-2000:] for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["len"] for r in results] == [10, 10]
    first, second = (set(r["ids"]) for r in results)
    assert len(first) == len(second) == 500 and not first & second and first | second == set(range(1000))


def _record_threads(batch, rng):  # at module level: spawned workers receive it pickled
    import outcore

    return {**batch, "threads": np.full(len(batch["id"]), outcore.thread_count())}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_dataloader_workers_share_the_cpus(ids_store, start_method):
    """Each DataLoader worker reads and decodes on its share of the CPUs: together they stay within them."""
    import outcore

    loader = ids_store.torch(100, num_workers=2, transform=_record_threads, multiprocessing_context=start_method)
    counts = {int(t) for batch in loader for t in batch["threads"]}
    assert counts == {max(1, outcore.available_cpus() // 2)}


TORCHRUN_SCRIPT = """
import json, sys
import torch.distributed as dist
import outcore

store, global_batch, stop, state_path, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
loader = outcore.open_dataset(store).torch(global_batch // world_size, shuffle=True, seed=11, num_workers=rank % 2)
loader.set_epoch(4)
if stop == 0:
    with open(state_path) as saved:
        loader.load_state_dict(json.load(saved))
batches = []
for batch in loader:
    batches.append(batch["id"].tolist())
    if len(batches) == stop:
        if rank == world_size - 1:  # any rank's state will do: they are the same
            with open(state_path, "w") as saved:
                json.dump(loader.state_dict(), saved)
        break
with open(f"{out}.{rank}", "w") as result:
    json.dump({"len": len(loader), "batches": batches}, result)
dist.barrier()
dist.destroy_process_group()
"""


def _torchrun(tmp_path, processes, *arguments, script_text=TORCHRUN_SCRIPT):
    """Run ``script_text`` under torchrun with ``processes`` gloo processes on loopback; each rank's result
    (the JSON it wrote to ``<its last argument>.<rank>``)."""
    import socket

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    script = tmp_path / "train.py"
    script.write_text(script_text)
    out = tmp_path / f"run{processes}"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                           str(processes), "--master-addr", "127.0.0.1", "--master-port", port, str(script),
                           *map(str, arguments), str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"run{processes}.{rank}").read_text()) for rank in range(processes)]


def test_torchrun_stopped_at_4_processes_resumes_at_2_with_every_sample_once(ids_store, tmp_path):
    """torchrun, gloo on loopback: 4 processes (workers on odd ranks) stop after 5 of 10 global steps of
    100 and save a state; 2 processes load it and finish the epoch: every sample exactly once, and every
    rank of each run made the same number of batches."""
    state = tmp_path / "state.json"
    first = _torchrun(tmp_path, 4, ids_store.location, 100, 5, state)
    assert [len(rank["batches"]) for rank in first] == [5] * 4 and {rank["len"] for rank in first} == {10}
    second = _torchrun(tmp_path, 2, ids_store.location, 100, 0, state)
    assert [len(rank["batches"]) for rank in second] == [5] * 2
    seen = [i for run in (first, second) for rank in run for batch in rank["batches"] for i in batch]
    assert sorted(seen) == list(range(1000))
    for rank in second:
        assert all(len(batch) == 50 for batch in rank["batches"])


@pytest.mark.trainers
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata 0.11 on torch 2.13
@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_torch_batches_mid_epoch(ids_store, workers):
    """torchdata's StatefulDataLoader asks each worker's TorchBatches for its state and gives it back on load."""
    stateful = need("torchdata.stateful_dataloader")
    from outcore.adapters.torch import TorchBatches

    def loader():
        batches = TorchBatches(ids_store, 64, shuffle=True, seed=5, num_workers=workers)
        batches.set_epoch(2)
        return stateful.StatefulDataLoader(batches, batch_size=None, num_workers=workers)

    uninterrupted = [b["id"].tolist() for b in loader()]
    assert len(uninterrupted) == 16
    for stop in (1, 5):
        interrupted, head = loader(), []
        for batch in interrupted:
            head.append(batch["id"].tolist())
            if len(head) == stop:
                break
        state = interrupted.state_dict()
        next_turns = sorted(part["step"] for part in _dataset_states(state))  # each worker's next batch
        assert next_turns == ([stop] if workers == 0 else {1: [0, 2], 5: [5, 6]}[stop])  # 0: worker 1 from the start
        resumed = loader()
        resumed.load_state_dict(state)
        assert head + [b["id"].tolist() for b in resumed] == uninterrupted


def _dataset_states(state):
    """The ``dataset_state`` parts of a StatefulDataLoader state, wherever torchdata keeps them."""
    if not isinstance(state, dict):
        return []
    found = [state["dataset_state"]] if isinstance(state.get("dataset_state"), dict) else []
    return found + [part for value in state.values() for part in _dataset_states(value)]


@pytest.mark.trainers
@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's hints (workers, logging intervals) on a tiny run
@pytest.mark.filterwarnings("ignore::FutureWarning")  # Lightning 2.6's own use of torch 2.13's deprecated pytree API
def test_lightning_epochs_and_a_mid_epoch_checkpoint(ids_store, tmp_path):
    """Lightning stops each epoch at len(loader), and keeps the loader's state in its checkpoints: a run
    stopped after 13 of 20 steps resumes with exactly the 7 batches the uninterrupted run made next."""
    lightning = need("lightning")
    from support.lightning_model import IdsModel

    seen = []

    def model():
        return IdsModel(lambda: ids_store.torch(100, shuffle=True, seed=1, fields=["id"]), seen)

    class Crash(lightning.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 13:
                trainer.save_checkpoint(tmp_path / "step13.ckpt")
                raise SystemExit("stopped")

    def trainer(*callbacks):
        return lightning.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks))

    trainer().fit(model())
    uninterrupted, seen[:] = list(seen), []
    assert [epoch for epoch, _ in uninterrupted] == [0] * 10 + [1] * 10
    for epoch in (0, 1):
        assert sorted(i for e, ids in uninterrupted if e == epoch for i in ids) == list(range(1000))
    with pytest.raises(SystemExit):
        trainer(Crash()).fit(model())
    head, seen[:] = list(seen), []
    trainer().fit(model(), ckpt_path=tmp_path / "step13.ckpt")
    assert len(head) == 13 and head + seen == uninterrupted


LIGHTNING_DDP_SCRIPT = """
import json, sys, warnings
warnings.filterwarnings("ignore")  # Lightning 2.6 on torch 2.13: its own deprecated calls
import lightning
import outcore

store, tests, out = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tests)
from support.lightning_model import IdsModel

seen = []
trainer = lightning.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(IdsModel(lambda: outcore.open_dataset(store).torch(50, shuffle=True, seed=1, fields=["id"]), seen))
with open(f"{out}.{trainer.global_rank}", "w") as result:
    json.dump(seen, result)
"""


@pytest.mark.trainers
def test_lightning_ddp_on_2_processes_makes_the_global_steps_of_one(ids_store, tmp_path):
    """Lightning's DDP under torchrun (gloo on loopback) leaves the loader's sharding to outcore: each rank
    makes 10 steps an epoch, and at every step the two ranks' batches together are the batch one process
    makes with the same global batch; every sample once an epoch."""
    need("lightning")
    ranks = _torchrun(tmp_path, 2, ids_store.location, Path(__file__).parent, script_text=LIGHTNING_DDP_SCRIPT)
    one = ids_store.batches(100, shuffle=True, seed=1, fields=["id"])
    for epoch in (0, 1):
        steps = [[ids for e, ids in rank if e == epoch] for rank in ranks]
        assert [len(rank_steps) for rank_steps in steps] == [10, 10]
        global_steps = [sorted(a + b) for a, b in zip(*steps, strict=True)]
        assert global_steps == [sorted(batch["id"].tolist()) for batch in one]
        assert sorted(i for batch in global_steps for i in batch) == list(range(1000))


@pytest.mark.trainers
def test_accelerate_checkpoints_the_loader_with_save_state(ids_store, tmp_path):
    accelerate = need("accelerate")

    def run(stop=None, resume=False):
        accelerator = accelerate.Accelerator(cpu=True)
        loader = ids_store.torch(100, shuffle=True, seed=1, fields=["id"])
        accelerator.register_for_checkpointing(loader)
        if resume:
            accelerator.load_state(tmp_path / "state")
        ids = []
        for batch in loader:
            ids.append(batch["id"].tolist())
            if len(ids) == stop:
                accelerator.save_state(tmp_path / "state")
                break
        return ids

    uninterrupted = run()
    head, tail = run(stop=4), run(resume=True)
    assert len(uninterrupted) == 10 and len(head) == 4 and head + tail == uninterrupted


@pytest.mark.trainers
@pytest.mark.parametrize("num_workers", [0, 2])
def test_accelerate_prepare_of_the_loader_is_refused_naming_the_recipe(ids_store, num_workers):
    accelerate = need("accelerate")
    loader = ids_store.torch(100, shuffle=True, seed=1, fields=["id"], num_workers=num_workers)
    prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    with pytest.raises(OptionError, match=r"do not prepare the loader.*docs/howto/trainers\.md"):
        next(iter(prepared))
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(1000))  # the loader still works


def test_a_subset_through_dataloader_workers_makes_the_iterators_batches(ids_store):
    subset = np.random.default_rng(5).choice(1000, 410, replace=False)
    expected = [b["id"].tolist() for b in ids_store.batches(50, indices=subset, seed=4, fields=["id"])]
    loader = ids_store.torch(50, indices=subset, shuffle=True, seed=4, fields=["id"], num_workers=2)
    assert len(loader) == 9 and [b["id"].tolist() for b in loader] == expected
    assert loader.state_dict()["indices"]["samples"] == 410
