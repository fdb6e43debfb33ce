"""Batches made by a process of their own (``process=True``), or by several together (``process=n``): the same
batches as in this process, resumable, a death and an error named here, warnings raised here, nothing left behind
(nor the memory this process made its first batches in), and the script never imported there (a transform it
defines, a lambda too, goes by value)."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import outcore
from outcore.iterate import process as process_module
from outcore.iterate import runs
from outcore.iterate.child import board_file
from outcore.iterate.process import (
    PART_FILES,
    CopyingRun,
    Inbox,
    LoaderProcess,
    LoaderProcesses,
    Opened,
    Order,
    Raised,
    RemoteTraceback,
    make,
    pickled,
    unpacked,
)
from outcore.iterate.shared import Mailbox
from outcore.storage import blocks
from outcore.testing import write_image_folder
from outcore.transforms import Compose, RandomCrop, RandomFlip

pytestmark = pytest.mark.portable


def _noise(batch, rng):
    """A Python transform drawing from its generator (module level: it pickles)."""
    return {**batch, "x": batch["x"] + rng.integers(0, 3, batch["x"].shape, dtype=np.int64)}


def _file_gone(batch, rng):
    raise FileNotFoundError("labels.csv is gone")  # an OSError of the work, not of the connection


class _Locked:
    """A transform holding a lock: it cannot go to another process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, batch, rng):
        with self.lock:
            return batch


def _fails_at_seven(batch, rng):
    if 7 in batch["id"]:
        raise ValueError("sample 7 is not welcome")
    return batch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    ids = np.arange(900)
    return outcore.from_arrays({"x": np.repeat(ids[:, None], 300, axis=1), "id": ids},
                               tmp_path_factory.mktemp("process") / "s.zarr", chunk_size=40, shuffle_on_write=False,
                               progress=False)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """An encoded store of JPEGs."""
    root = tmp_path_factory.mktemp("process")
    write_image_folder(root / "photos", 30, classes=("cat", "dog"), size=(64, 64), extension=".jpg", seed=1)
    return outcore.ingest_images(root / "photos", root / "p.zarr", shape=(64, 64, 3), images="encoded",
                                 chunk_size=16, progress=False)


def _started(iterator):
    """``iterator`` once its process (or processes) has started: every batch from now on made there."""
    while not iterator._process.ready():
        time.sleep(0.01)
    return iterator


def _epochs(iterator, count, pause=0.0):
    """``count`` epochs of ``iterator``, each batch copied (and ``pause`` seconds waited after it: a slow loop)."""
    return [[{name: value.copy() for name, value in batch.items()} for batch in _paused(iterator, pause)]
            for _ in range(count)]


def _paused(batches, pause):
    for batch in batches:
        yield batch
        time.sleep(pause)


def _held_files(folder):
    """The files of ``folder`` that are neither free nor its owner's lock: batches held, or parts left behind."""
    return sorted(path.name for path in folder.iterdir() if not path.name.startswith(("free-", "owner")))


def _spare_files(root):
    """The files of this process's spare folder of free files under ``root`` (`outcore.iterate.shared._spares`)."""
    return {path.name for path in root.glob(f"outcore-batches-{os.getpid()}-spare-*/free-*")}


def _same(made, expected):
    assert len(made) == len(expected)
    for batches, wanted in zip(made, expected, strict=True):
        assert len(batches) == len(wanted)
        for batch, want in zip(batches, wanted, strict=True):
            assert batch.keys() == want.keys()
            for name in want:
                np.testing.assert_array_equal(batch[name], want[name])


def _ready_after(monkeypatch, kind, asks):
    """``kind.ready`` (of `LoaderProcess` or `LoaderProcesses`) not ready for its first ``asks`` calls (the run's
    start, then one a batch), then waited for: the batches before are made here."""
    real, asked = kind.ready, []

    def ready(self):
        asked.append(1)
        while len(asked) > asks and not real(self):
            time.sleep(0.01)
        return len(asked) > asks

    monkeypatch.setattr(kind, "ready", ready)


def _where_made(iterator):
    """An epoch of ``iterator``: its batches copied, where each was made (`LocalRun` here, or the process's run),
    and the runs that made them."""
    made, kinds, runs = [], [], []
    for batch in iterator:
        made.append({name: value.copy() for name, value in batch.items()})
        kinds.append(type(iterator._active.current).__name__)
        runs.append(iterator._active)
    return made, kinds, list(dict.fromkeys(runs))


def test_the_batches_are_those_made_here_epoch_after_epoch_by_one_process(store):
    options = {"shuffle": True, "seed": 3, "transform": _noise}
    iterator = _started(store.batches(64, process=True, **options))
    made = _epochs(iterator, 1)
    pid = iterator._process.process.pid
    made += _epochs(iterator, 1)
    _same(made, _epochs(store.batches(64, **options), 2))
    assert pid != os.getpid() and iterator._process.process.pid == pid  # one process, kept across epochs
    assert iterator.stats()["batches"] == 2 * len(iterator)
    iterator.close()


@pytest.mark.parametrize("process", [True, 2])
def test_from_the_second_epoch_on_the_next_epoch_is_ordered_as_this_one_is_taken(store, monkeypatch, process):
    """From the second epoch on, the next epoch is asked of the processes as this one's first batch is taken, so
    that they start it as this one drains (and its first batch is made when asked for): the same batches, epoch
    after epoch; the last epoch ordered and never taken goes with the iterator."""
    options = {"shuffle": True, "seed": 3, "transform": _noise}
    iterator = _started(store.batches(64, process=process, **options))
    ordered, order = [], LoaderProcess.order

    def recorded(self, work, *args):
        ordered.append((work.epoch, iterator.epoch, iterator.batches_done))
        return order(self, work, *args)

    monkeypatch.setattr(LoaderProcess, "order", recorded)
    made = _epochs(iterator, 4)
    _same(made, _epochs(store.batches(64, **options), 4))
    runs = list(dict.fromkeys(ordered))  # one a process
    assert runs[:2] == [(0, 0, 0), (1, 1, 0)], ordered  # the first two asked for at their start
    assert [(epoch, during, done) for epoch, during, done in runs[2:]] == [(2, 1, 1), (3, 2, 1), (4, 3, 1)], ordered
    folder = iterator._process.mailbox.folder
    iterator.close()
    assert not folder.exists()


def test_a_process_begins_the_next_run_ordered_as_this_one_drains_and_sends_its_batches_in_turn(store, tmp_path):
    """`make`, as the process runs it: once a run's batches are all under way, the next run ordered is begun (its
    first batches made while this one's wait for the consumer) and handed to the next call, which sends the
    batches a run begun in its turn sends; a run begun and then stopped sends none."""
    options = {"shuffle": True, "seed": 3, "transform": _noise}
    iterator = store.batches(64, **options)
    expected = _epochs(iterator, 2)
    mailbox = Mailbox.open(tmp_path)
    ours, theirs = multiprocessing.Pipe()
    board = multiprocessing.RawValue("q", -1)
    inbox, opened, raised = Inbox(theirs, board), Opened(), Raised()
    sent = {number: pickled(Order(store.opener, dataclasses.replace(iterator.options, process=False), epoch,
                                  list(range(len(iterator)))))
            for number, epoch in ((0, 0), (1, 1), (2, 0))}
    for number, order in sent.items():
        ours.send(("run", number, order))
    inbox.read(1.0)
    messages = []  # what the process sends, taken as it comes (a pipe holds a few)
    taking = threading.Thread(target=lambda: messages.extend(iter(lambda: ours.recv() if ours.poll(2) else None,
                                                                  None)))
    taking.start()
    begun = None
    for number in range(3):
        board.value = number << 32 | 1000  # the consumer took every batch: no wait for its credit
        assert inbox.next_order() == (number, sent[number])
        begun = make(inbox, number, sent[number], mailbox.slot, opened, raised, begun)
        assert (begun.number if begun else None) == (number + 1 if number < 2 else None)
        if number < 2:
            assert begun.run.delivered == 0 and begun.run.thread.is_alive()  # begun, its batches being made
        if number == 1:
            ours.send(("stop", 2))  # the consumer closed it: it reads that at its first batch
    taking.join()
    made = {0: [], 1: [], 2: []}
    for kind, number, *said in messages:
        assert kind in ("batch", "done"), said
        if kind == "batch":
            made[number].append({name: value.copy() for name, value in mailbox.receive(unpacked(said[2])).items()})
    _same([made[0], made[1]], expected)
    assert made[2] == []  # stopped before its turn: begun, and closed unsent
    mailbox.close()


def test_the_first_batches_are_made_here_until_the_process_has_started(store, monkeypatch):
    _ready_after(monkeypatch, LoaderProcess, 5)  # not started when the run is made, nor for its first four batches
    options = {"shuffle": True, "seed": 8, "transform": _noise}
    made, kinds, _ = _where_made(store.batches(64, process=True, **options))
    assert kinds == ["LocalRun"] * 4 + ["ProcessRun"] * (len(made) - 4)
    _same([made], _epochs(store.batches(64, **options), 1))


def test_the_memory_of_the_first_batches_made_here_goes_back_once_the_processes_take_over(tmp_path, monkeypatch):
    """Chunks and batches of a megabyte or more (made in kept blocks): once the processes make the batches, none of
    the blocks this process made the first ones in is alive or kept, nor a chunk buffer."""
    ids = np.arange(1024)
    pictures = np.repeat(ids.astype(np.uint8)[:, None, None], 96 * 96, axis=1).reshape(-1, 96, 96, 1)
    wide = outcore.from_arrays({"x": np.broadcast_to(pictures, (1024, 96, 96, 3)), "id": ids}, tmp_path / "w.zarr",
                               chunk_size=128, shuffle_on_write=False, progress=False)
    _ready_after(monkeypatch, LoaderProcesses, 4)  # not started for the first three batches
    first = next(blocks.BLOCKS.numbers)
    iterator = wide.batches(128, process=2, shuffle=True, seed=2)
    made, kinds, (run,) = _where_made(iterator)
    local = run.local
    gc.collect()
    assert kinds == ["LocalRun"] * 3 + ["PartsRun"] * 5
    assert sorted(np.concatenate([batch["id"] for batch in made]).tolist()) == ids.tolist()
    assert blocks.BLOCKS.keep_from > first  # blocks were made here, then let go
    alive = [number for _, _, number in blocks.BLOCKS.watched.values() if first <= number < blocks.BLOCKS.keep_from]
    assert alive == [] and blocks.BLOCKS.free == []
    assert iterator.buffers.free == []
    assert local.queue.qsize() == 0 and not local.made and not local.loading
    iterator.close()


def test_decoded_pictures_cut_and_flipped_there_are_those_cut_here(pictures):
    options = {"shuffle": True, "seed": 1, "transform": Compose([RandomCrop(32), RandomFlip()])}
    _same(_epochs(_started(pictures.batches(16, process=True, **options)), 2), _epochs(pictures.batches(16, **options), 2))


def test_a_resumed_epoch_goes_on_where_it_stopped(store):
    expected = _epochs(store.batches(50, shuffle=True, seed=4), 1)[0]
    first = _started(store.batches(50, shuffle=True, seed=4, process=True))
    taken = iter(first)
    head = [next(taken)["id"].copy() for _ in range(5)]
    state = first.state_dict()
    first.close()
    resumed = _started(store.batches(50, shuffle=True, seed=4, process=True))
    resumed.load_state_dict(state)
    rest = [batch["id"].copy() for batch in resumed]
    assert [ids.tolist() for ids in head + rest] == [batch["id"].tolist() for batch in expected]


def test_a_pass_left_early_then_iterated_again_drops_what_was_sent_meanwhile(store):
    expected = [batch["id"].tolist() for batch in store.batches(120, shuffle=True, seed=2)]
    iterator = _started(store.batches(120, shuffle=True, seed=2, prefetch=3, process=True))  # files of 288 KB
    got = []
    for _ in range(3):  # each pass leaves after two batches, with three more sent ahead
        for batch in iterator:
            got.append(batch["id"].tolist())
            if len(got) % 2 == 0:
                time.sleep(0.3)  # the process sends the next three meanwhile
                break
    del batch  # the last one this loop took: its file goes back too
    got += [batch["id"].tolist() for batch in iterator]
    assert got == expected
    folder = iterator._process.mailbox.folder
    assert _held_files(folder) == []  # the files of the batches dropped unseen went back to the free ones
    iterator.close()
    assert not folder.exists()


def test_a_killed_process_is_named_and_the_next_pass_starts_another(store):
    expected = [batch["id"].tolist() for batch in store.batches(100, shuffle=True, seed=6)]
    iterator = _started(store.batches(100, shuffle=True, seed=6, process=True))
    taken = iter(iterator)
    got = [next(taken)["id"].tolist()]
    os.kill(iterator._process.process.pid, signal.SIGKILL)
    with pytest.raises(outcore.LoaderProcessError, match=r"ended \(killed by SIGKILL\) while batch \d of epoch 0"):
        for batch in taken:
            got.append(batch["id"].tolist())
    got += [batch["id"].tolist() for batch in iterator]  # a new process, from the first batch not handed out
    assert got == expected


def test_an_error_there_is_raised_here_with_its_traceback(store):
    iterator = _started(store.batches(100, transform=_fails_at_seven, process=True))
    with pytest.raises(ValueError, match="sample 7 is not welcome") as raised:
        list(iterator)
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert "_fails_at_seven" in str(raised.value.__cause__)
    assert "in the process making the batches" in str(raised.value.__cause__)


def test_an_oserror_there_is_raised_here_not_taken_for_the_consumer_gone(store):
    iterator = _started(store.batches(100, transform=_file_gone, process=True))
    with pytest.raises(FileNotFoundError, match="labels.csv is gone") as raised:
        list(iterator)
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert iterator._process.process.is_alive()  # it failed the run, not itself: it waits for the next order


def _ids_taken_slowly(iterator):
    ids = []
    for batch in iterator:
        ids += batch["id"].tolist()
        time.sleep(0.1)
    return ids


def test_damaged_chunks_left_out_there_are_warned_of_and_counted_here(tmp_path):
    ids = np.arange(320)
    ds = outcore.from_arrays({"x": np.repeat(ids[:, None], 8, axis=1).astype(np.float32), "id": ids},
                             tmp_path / "d.zarr", chunk_size=32, progress=False)
    for chunk in (2, 7):
        outcore.testing.corrupt_chunk(ds.location, "x", chunk)
    ds = outcore.open_dataset(ds.location)
    iterator = ds.batches(50, seed=1, skip_damaged=2, process=True)
    for _ in range(3):  # each epoch's, said again, in that epoch
        with pytest.warns(outcore.OutcoreWarning) as caught:
            seen = _ids_taken_slowly(iterator)  # the process begins the next epoch meanwhile (from the second on)
        left_out = sorted(str(warning.message).split("left out chunk ")[1].split()[0] for warning in caught)
        assert left_out == ["2", "7"]  # left out of that epoch too, said with its batches
        assert sorted(seen) == sorted(set(range(320)) - set(ds.array("id")[64:96]) - set(ds.array("id")[224:256]))
    assert iterator.stats()["damaged_chunks"] == 6


def test_what_cannot_reach_a_process_is_refused_saying_why(store, monkeypatch):
    with pytest.raises(outcore.OptionError, match="do not pickle .* a transform must hold nothing that cannot go "
                                                  r"to another process \(a lock"):
        list(store.batches(100, transform=_Locked(), process=True))
    with pytest.raises(outcore.OptionError, match="with client=, the cluster's workers make them"):
        store.batches(100, process=True, client=object())
    monkeypatch.setenv("OUTCORE_SHARED_MEMORY", "0")
    with pytest.raises(outcore.OptionError, match=r"shared memory \(/dev/shm\).*leave process= out"):
        list(store.batches(100, process=True))


SCRIPT = """
import os, sys, time
import numpy as np
import outcore

with open("imported.txt", "a") as imported:  # each process that imports this script says so
    imported.write(f"{{os.getpid()}}\\n")

STEP = np.int64(1)  # what the script's transform refers to goes with it


def plus_one(batch, rng):  # a transform of the script's own: it goes to the process by value
    return {{**batch, "x": batch["x"] + STEP}}

{work}
"""
WORK = """
ds = outcore.open_dataset(sys.argv[1])
options = {{"shuffle": True, "seed": 3{transform}}}
iterator = ds.batches(10, process=True, **options)
while not iterator._process.ready():  # every batch made there from now on
    time.sleep(0.01)
there = [batch["x"].tolist() for _ in range(2) for batch in iterator]
here = ds.batches(10, **options)
print("same" if there == [batch["x"].tolist() for _ in range(2) for batch in here] else "not")
print(os.getpid(), iterator._process.process.pid, sorted(sum(there, [])) == sorted(2 * ({plain})))
"""
TRANSFORMS = {"none": "", "the script's": ', "transform": plus_one',
              "a lambda": ', "transform": lambda batch, rng: {**batch, "x": batch["x"] + 1}'}


@pytest.mark.parametrize(("transform", "guarded"), [("none", False), ("the script's", False), ("a lambda", False),
                                                    ("the script's", True)])
def test_a_script_s_loader_process_never_imports_it_and_needs_no_main_guard(tmp_path, transform, guarded):
    """A script run as it is, its work under a main guard or not, its transform defined in it (a function, a
    lambda) or none: the batches are those made without a process, each sample once an epoch (plus one where
    transformed), and only the script's own process imported it (each import appends its pid to
    ``imported.txt``)."""
    plain = "list(range(50))" if transform == "none" else "list(range(1, 51))"
    work = WORK.format(transform=TRANSFORMS[transform], plain=plain)
    if guarded:
        work = 'if __name__ == "__main__":\n' + textwrap.indent(work, "    ")
    (tmp_path / "train.py").write_text(SCRIPT.format(work=work))
    outcore.from_arrays({"x": np.arange(50)}, tmp_path / "s.zarr", chunk_size=10, progress=False)
    done = subprocess.run([sys.executable, "train.py", "s.zarr"], check=False, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    same, script, loader, every = done.stdout.split()
    assert same == "same" and loader != script and every == "True"
    assert (tmp_path / "imported.txt").read_text().split() == [script]  # not by the loader process


def test_a_process_run_copies_into_the_memory_the_consumer_makes(store):
    made: list[tuple[int, ...]] = []

    def empty(shape, dtype, field=""):
        made.append(shape)
        return np.empty(shape, dtype)

    iterator = _started(store.batches(100, shuffle=False, process=True))
    run = iterator.run(0, range(len(iterator)), empty=empty)
    assert isinstance(run, CopyingRun)  # a thread of this process copies them as they come
    try:
        ids = [batch["id"].tolist() for batch in run]
        samples = run.samples(8)  # of the last batch
    finally:
        run.close()
        iterator.close()
    assert ids == [list(range(start, min(start + 100, 900))) for start in range(0, 900, 100)]
    assert (100, 300) in made  # the large field, copied out of its file into the consumer's memory
    assert samples.tolist() == list(range(800, 900))


def test_a_run_closing_while_the_next_starts_leaves_it_every_batch(store):
    """Two threads reading the process's messages at once (a copying run closing, the next one's starting): each
    run gets its own batches, and those of the closed run go back to the free files."""
    iterator = _started(store.batches(120, shuffle=False, process=True))
    copy = lambda shape, dtype, field="": np.empty(shape, dtype)  # the consumer's memory, here
    for _ in range(5):
        first = iterator.run(0, range(len(iterator)), empty=copy)
        taken = iter(first)
        assert next(taken)["id"].tolist() == list(range(120))
        second = iterator.run(1, range(3, len(iterator)), empty=copy)  # made while the first still runs
        time.sleep(0.05)
        first.close()
        ids = [batch["id"].tolist() for batch in second]
        second.close()
        assert ids == [list(range(start, min(start + 120, 900))) for start in range(360, 900, 120)]
    time.sleep(0.2)  # the process has stopped the first runs
    assert _held_files(iterator._process.mailbox.folder) == []
    iterator.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("process", [True, 2])
def test_epochs_copied_into_the_consumers_memory_each_get_every_batch_while_the_next_is_taken_ahead(store, process):
    """Batches copied into the consumer's memory (pinned, for a GPU) are taken from the processes by a thread of
    each run; from the second epoch on, the next epoch's run starts with this one's first batch, and its thread
    waits for the processes' messages while this one's does: neither drops the other's (a lost batch hung the
    second epoch), nor removes the files of the other's parts not taken yet (a slow loop: the next epoch's first
    parts come while this one's last wait). Each epoch's batches are those made here."""
    options = {"shuffle": True, "seed": 3, "transform": _noise}
    iterator = _started(store.batches(150, process=process, **options))  # every batch's x in files: 360 KB
    iterator.empty = lambda shape, dtype, field="": np.empty(shape, dtype)  # the consumer's memory, here
    made = _epochs(iterator, 4, pause=0.03)
    _same(made, _epochs(store.batches(150, **options), 4))
    iterator.close()


def test_a_run_s_count_of_batches_taken_never_replaces_a_later_run_s():
    """The next epoch's run, ordered ahead, may take its first batch on its own thread (copying into pinned memory)
    before this run's thread takes its last. The process is on the later run by then and reads that run's count
    only: the earlier run's count written after it would leave the process waiting for it, and the later run's
    thread waiting for the process, for good (an iterator kept after its training held its processes so)."""
    loader = LoaderProcess()
    loader.board, descriptor = board_file()
    os.close(descriptor)
    inbox = Inbox(None, loader.board)
    assert inbox.taken(0) == 0
    loader.taken(1, 14)
    loader.taken(2, 1)
    loader.taken(1, 15)  # the earlier run's last, late
    assert (inbox.taken(2), inbox.taken(1)) == (1, 0)
    loader.taken(2, 2)
    assert inbox.taken(2) == 2


@pytest.mark.parametrize("copying", [False, True])
@pytest.mark.parametrize("process", [True, 2])
def test_an_iterator_kept_after_its_training_lets_its_processes_go_and_starts_them_again(store, monkeypatch,
                                                                                         process, copying):
    """An iterator kept after its last epoch (TensorFlow's generators keep theirs): the next epoch's run, ordered
    ahead and never taken, is closed after `UNTAKEN_SECONDS`; the processes, with no run open, end after
    `IDLE_SECONDS`, and their shared memory goes. Iterated again, it starts them again: the same batches."""
    options = {"shuffle": True, "seed": 3, "transform": _noise}
    iterator = _started(store.batches(64, process=process, **options))
    if copying:
        iterator.empty = lambda shape, dtype, field="": np.empty(shape, dtype)  # the consumer's memory, here
    monkeypatch.setattr(runs, "UNTAKEN_SECONDS", 0.5)
    monkeypatch.setattr(process_module, "IDLE_SECONDS", 0.5)
    made = _epochs(iterator, 2)  # the third epoch's run is ordered as the second is taken
    loader = iterator._process
    members = loader.members if process == 2 else [loader]
    started = [member.process for member in members]
    folder = loader.mailbox.folder
    spare = _spare_files(folder.parent)
    deadline = time.monotonic() + 20
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists()
    assert _spare_files(folder.parent) <= spare  # its free files went too, not kept for a next mailbox
    assert not any(each.is_alive() for each in started) and all(member.process is None for member in members)
    monkeypatch.setattr(process_module, "IDLE_SECONDS", 60.0)  # the ones started again stay (a slow machine's epoch,
    made += _epochs(iterator, 1)  # made here while they start, could outlast half a second)
    _same(made, _epochs(store.batches(64, **options), 3))
    assert all(member.process.pid not in [each.pid for each in started] for member in members)
    iterator.close()


# -- several processes, each making its part of every batch (process=n) ---------------------------------------------


@pytest.mark.parametrize("count", [2, 3])
def test_several_processes_make_each_batch_together_the_batches_made_here(store, count):
    options = {"shuffle": True, "seed": 3, "transform": _noise}
    iterator = _started(store.batches(64, process=count, **options))
    assert isinstance(iterator._process, LoaderProcesses)
    made = _epochs(iterator, 1)
    pids = [member.process.pid for member in iterator._process.members]
    made += _epochs(iterator, 1)
    _same(made, _epochs(store.batches(64, **options), 2))
    assert len(set(pids)) == count and os.getpid() not in pids  # processes of their own, kept across epochs
    assert [member.process.pid for member in iterator._process.members] == pids
    assert iterator.stats()["batches"] == 2 * len(iterator)
    folder = iterator._process.mailbox.folder
    iterator.close()
    assert not folder.exists()


def test_four_processes_make_a_ranks_batches_of_a_subset_as_here(store):
    """Rank 1 of 2 over a subset, the short last batch left out: each process's part has samples or none at a step,
    as its streams say, and the joined batches are those made here."""
    options = {"shuffle": True, "seed": 11, "rank": 1, "world_size": 2, "drop_last": True,
               "indices": np.random.default_rng(0).choice(900, 500, replace=False)}
    iterator = _started(store.batches(48, process=4, **options))
    made = _epochs(iterator, 2)
    _same(made, _epochs(store.batches(48, **options), 2))
    assert len(made[0]) == 500 // 96
    iterator.close()


def test_several_processes_cut_and_flip_decoded_pictures_as_here_from_the_first_batch(pictures, monkeypatch):
    """The first batches made here while the processes start (as for one), the rest there."""
    _ready_after(monkeypatch, LoaderProcesses, 3)  # not started for the first two batches
    options = {"shuffle": True, "seed": 1, "transform": Compose([RandomCrop(32), RandomFlip()])}
    iterator = pictures.batches(4, process=2, **options)
    made, kinds, _ = _where_made(iterator)
    assert kinds == ["LocalRun"] * 2 + ["PartsRun"] * (len(iterator) - 2)
    _same([made, *_epochs(iterator, 1)], _epochs(pictures.batches(4, **options), 2))
    iterator.close()


def test_an_epoch_made_by_some_processes_resumes_on_another_number(store):
    expected = _epochs(store.batches(50, shuffle=True, seed=4), 1)[0]
    first = _started(store.batches(50, shuffle=True, seed=4, process=2))
    taken = iter(first)
    head = [next(taken)["id"].copy() for _ in range(5)]
    state = first.state_dict()
    first.close()
    resumed = _started(store.batches(50, shuffle=True, seed=4, process=3))
    resumed.load_state_dict(state)
    rest = [batch["id"].copy() for batch in resumed]
    assert [ids.tolist() for ids in head + rest] == [batch["id"].tolist() for batch in expected]


def test_parts_of_passes_left_early_are_removed_and_nothing_is_lost(store):
    expected = [batch["id"].tolist() for batch in store.batches(120, shuffle=True, seed=2)]
    iterator = _started(store.batches(120, shuffle=True, seed=2, prefetch=3, process=2))
    folder = iterator._process.mailbox.folder
    got, left = [], []
    for _ in range(3):  # each pass leaves after two batches, with more made ahead
        for batch in iterator:
            got.append(batch["id"].tolist())
            if len(got) % 2 == 0:
                time.sleep(0.3)  # the processes write their parts of the next batches meanwhile
                left.append([name for name in _held_files(folder) if name.startswith(PART_FILES)])
                break
    del batch  # the last one this loop took: its file goes back too
    got += [batch["id"].tolist() for batch in iterator]
    assert got == expected
    assert all(left)  # each pass left parts of batches it never took...
    assert _held_files(folder) == []  # ...removed once the processes had gone on to the next pass
    iterator.close()


def test_a_batch_copied_into_the_consumers_memory_is_joined_first(store):
    made: list[tuple[int, ...]] = []

    def empty(shape, dtype, field=""):
        made.append(shape)
        return np.empty(shape, dtype)

    iterator = _started(store.batches(100, shuffle=True, seed=5, process=2))
    run = iterator.run(0, range(len(iterator)), empty=empty)
    assert isinstance(run, CopyingRun)
    try:
        ids = [batch["id"].tolist() for batch in run]
        samples = run.samples(8)
    finally:
        run.close()
        iterator.close()
    assert ids == [batch["id"].tolist() for batch in store.batches(100, shuffle=True, seed=5)]
    assert (100, 300) in made and samples.tolist() == ids[8]


def test_one_of_the_processes_killed_is_named_and_the_next_pass_starts_it_again(store):
    expected = [batch["id"].tolist() for batch in store.batches(100, shuffle=True, seed=6)]
    iterator = _started(store.batches(100, shuffle=True, seed=6, process=2))
    taken = iter(iterator)
    got = [next(taken)["id"].tolist()]
    killed = iterator._process.members[1].process.pid
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(outcore.LoaderProcessError, match=rf"\(pid {killed}\) ended \(killed by SIGKILL\) while batch"):
        for batch in taken:
            got.append(batch["id"].tolist())
    got += [batch["id"].tolist() for batch in iterator]  # started again, from the first batch not handed out
    assert got == expected
    assert iterator._process.members[1].process.pid != killed
    iterator.close()


def test_an_error_in_one_of_the_processes_is_raised_here(store):
    iterator = _started(store.batches(100, shuffle=True, transform=_fails_at_seven, process=2))
    with pytest.raises(ValueError, match="sample 7 is not welcome") as raised:
        list(iterator)
    assert "_fails_at_seven" in str(raised.value.__cause__)
    iterator.close()


NO_ROOM_SCRIPT = """
import hashlib, sys, time, warnings, outcore

def digests(iterator, epochs=2):
    return [hashlib.sha1(b["x"].tobytes() + b["id"].tobytes()).hexdigest() for _ in range(epochs) for b in iterator]

if __name__ == "__main__":
    ds = outcore.open_dataset(sys.argv[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iterator = ds.batches(120, shuffle=True, seed=7, process=2)
        while not iterator._process.ready():  # every batch made there (a slow start would make them all here)
            time.sleep(0.01)
        there = digests(iterator)
    print("same" if there == digests(ds.batches(120, shuffle=True, seed=7)) else "different")
    print(sorted({str(warning.message).split(":")[0] for warning in caught}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a small /dev/shm of its own needs root and unshare (a mount namespace): CI runs as root")
def test_parts_without_room_in_a_small_shared_memory_come_joined_all_the_same(store, tmp_path):
    """A /dev/shm of 600 KB (batch files of 288 KB): the parts a process finds no room for are sent as arrays and
    copied in, and the batches are those made here; the warning says so."""
    script = tmp_path / "no_room.py"
    script.write_text(NO_ROOM_SCRIPT)
    small = f"mount -t tmpfs -o size=600k tmpfs /dev/shm && exec {sys.executable} {script} {store.location}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", small], capture_output=True, text=True, timeout=120,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["same", "['no room in /dev/shm for batches in shared memory']"]


@pytest.mark.parametrize(("options", "said"), [
    ({"process": 9}, (r"process=9 splits each batch among processes by the rank's streams, and it has 8: use "
                      r"process=8 or fewer, or streams=9")),
    ({"process": 5, "world_size": 2}, r"and it has 4: use process=4 or fewer, or streams=10"),
    ({"process": 2, "shuffle": False}, r"without shuffle a rank reads its part of the store as one: use process=True"),
    ({"process": 2, "skip_damaged": 1}, r"would each count their own: use process=True with skip_damaged="),
    ({"process": -1}, r"process=-1: say True .*, a number of processes, or False"),
    ({"process": "2"}, r"process='2': say True"),
])
def test_processes_that_cannot_make_the_batches_are_refused_saying_why(store, options, said):
    with pytest.raises(outcore.OptionError, match=said):
        store.batches(60, **options)
