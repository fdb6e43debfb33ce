"""Batches handed from workers to the consumer through shared memory (`outcore.iterate.shared`), and workers' parts gathered into pinned memory as they come (`outcore.adapters.torch_pinned`)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

from outcore.errors import ClusterError, OutcoreWarning
from outcore.iterate import mappings, shared
from outcore.iterate.shared import FREE, LOCK, SHARED_MIN_BYTES, Mailbox, SharedArray, Slot, is_mapped

BIG = (SHARED_MIN_BYTES // 3 + 1, 3)  # a uint8 array just large enough to go through a file


def files(mailbox: Mailbox) -> list[str]:
    return sorted(name for name in os.listdir(mailbox.folder) if name != LOCK)


@pytest.fixture
def mailbox(tmp_path):
    box = Mailbox.open(tmp_path)
    yield box
    box.close()


def made(mailbox: Mailbox, value: int, shape=BIG) -> shared.SharedBatch:
    """What a worker returns: a batch of ``value`` made in the arena, and a small field beside it."""
    arena = mailbox.slot.arena()
    images = arena.empty(shape, np.dtype("uint8"))
    images.fill(value)
    labels = arena.empty((8,), np.dtype("int64"))
    labels[:] = np.arange(8)
    return arena.publish({"images": images, "labels": labels})


def test_a_batch_made_in_the_arena_arrives_as_mapped_memory_without_a_copy(mailbox):
    handle = made(mailbox, 7)
    assert isinstance(handle.fields["images"], SharedArray)  # only its name travels
    assert isinstance(handle.fields["labels"], np.ndarray)  # small: in the answer itself
    batch = mailbox.receive(handle)
    assert is_mapped(batch["images"]) and batch["images"].shape == BIG and (batch["images"] == 7).all()
    np.testing.assert_array_equal(batch["labels"], np.arange(8))
    batch["images"][0, 0] = 1  # the consumer owns it: writable
    assert batch["images"][0, 0] == 1


def test_a_file_is_made_again_only_once_the_consumer_dropped_every_array_of_it(mailbox):
    held = mailbox.receive(made(mailbox, 1))["images"]
    view = held[:10]
    del held
    gc.collect()
    second = mailbox.receive(made(mailbox, 2))  # the first file is still in use (by the view): a new one
    assert (view == 1).all() and (second["images"] == 2).all()
    assert len(files(mailbox)) == 2
    del view, second
    gc.collect()
    assert all(name.startswith(FREE) for name in files(mailbox))  # both free for the next batches
    third = mailbox.receive(made(mailbox, 3))
    assert (third["images"] == 3).all()
    assert len(files(mailbox)) == 2  # made in a recycled file, not a new one


def test_arrays_a_transform_made_are_copied_into_shared_memory_and_unused_files_freed(mailbox):
    arena = mailbox.slot.arena()
    made_here = arena.empty(BIG, np.dtype("uint8"))
    made_here.fill(4)
    handle = arena.publish({"images": made_here.astype(np.float32) / 2})  # the transform's new array
    assert isinstance(handle.fields["images"], SharedArray)
    batch = mailbox.receive(handle)
    assert batch["images"].dtype == np.float32 and (batch["images"] == 2).all() and is_mapped(batch["images"])
    assert [name for name in files(mailbox) if name.startswith(FREE)]  # the unused uint8 file


def test_batch_arrays_in_shared_memory_start_16_bytes_past_a_multiple_of_32_as_plain_ones_do(mailbox):
    """libjpeg-turbo writes rows that start on a multiple of 32 bytes with non-temporal stores, 8 % slower per
    decoded sample here: a batch's arrays, whole or in parts, never start there, for the worker writing them
    or the consumer reading them (`outcore.imaging.LEAD`)."""
    arena = mailbox.slot.arena()
    images = arena.empty(BIG, np.dtype("uint8"))
    assert images.ctypes.data % 32 == 16
    images.fill(3)
    received = mailbox.receive(arena.publish({"images": images}))["images"]
    assert received.ctypes.data % 32 == 16 and (received == 3).all()
    parts = []
    for offset, value in ((0, 1), (2, 2)):
        part = mailbox.slot.arena(shared.Part("p", offset, 4)).empty((2, 1 << 16), np.dtype("uint8"), "images")
        assert part.ctypes.data % 32 == 16
        part.fill(value)
        parts.append(shared.SharedBatch({"images": SharedArray("p-images", "|u1", (4, 1 << 16))}))
    whole = shared.join_parts(parts, [2, 2], mailbox)["images"]
    assert whole.ctypes.data % 32 == 16 and whole[:, 0].tolist() == [1, 1, 2, 2] and (whole[3] == 2).all()


def test_a_batch_file_of_another_size_than_its_array_is_refused_not_read(mailbox, monkeypatch):
    """A worker of another outcore version (another `LEAD`) would leave the array elsewhere in its file: the
    consumer checks the file's size against what the array needs and names the mismatch."""
    monkeypatch.setattr(shared, "LEAD", 0)  # the worker's version
    handle = made(mailbox, 7)
    monkeypatch.undo()
    with pytest.raises(ClusterError, match=r"holds \d+ bytes where a \|u1.* makes \d+: a worker of another outcore"):
        mailbox.receive(handle)


def test_without_room_in_shared_memory_arrays_travel_as_plain_memory(mailbox, monkeypatch):
    def full(descriptor, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    handle = made(mailbox, 5)
    assert isinstance(handle.fields["images"], np.ndarray)
    with pytest.warns(OutcoreWarning, match=r"no room in .* for batches in shared memory.*--shm-size"):
        batch = mailbox.receive(handle)
    assert (batch["images"] == 5).all() and not is_mapped(batch["images"])
    assert files(mailbox) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mailbox.receive(made(mailbox, 6))  # said once per run, not per batch


def test_a_worker_that_does_not_see_the_folder_sends_plain_arrays(tmp_path):
    arena = Slot(str(tmp_path / "on-another-machine")).arena()
    images = arena.empty(BIG, np.dtype("uint8"))
    images.fill(3)
    handle = arena.publish({"images": images})
    assert isinstance(handle.fields["images"], np.ndarray) and (handle.fields["images"] == 3).all()
    assert not handle.no_room  # another machine: sockets are the way, nothing to warn of


def test_shared_memory_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("OUTCORE_SHARED_MEMORY", "0")
    assert Mailbox.open(tmp_path) is None


def test_closing_removes_the_folder_and_batches_received_stay_valid(tmp_path):
    box = Mailbox.open(tmp_path)
    batch = box.receive(made(box, 9))
    box.close()
    assert not box.folder.exists()
    assert (batch["images"] == 9).all()


def test_the_next_mailbox_of_the_process_starts_with_the_free_files_of_the_last(tmp_path):
    first = Mailbox.open(tmp_path)
    first.receive(made(first, 1))  # dropped at once: its file is free
    gc.collect()
    freed = [name for name in files(first) if name.startswith(FREE)]
    first.close()
    second = Mailbox.open(tmp_path)  # the next epoch's run
    assert [name for name in files(second) if name.startswith(FREE)] == freed
    batch = second.receive(made(second, 2))
    assert (batch["images"] == 2).all() and not [name for name in files(second) if name.startswith(FREE)]
    second.close()


def test_a_taken_batch_whose_file_went_is_a_named_cluster_error(mailbox):
    handle = made(mailbox, 1)
    (mailbox.folder / handle.fields["images"].name).unlink()
    with pytest.raises(shared.ClusterError, match="OUTCORE_SHARED_MEMORY=0"):
        mailbox.receive(handle)


OWNER = """
import sys, time
from pathlib import Path
from outcore.iterate.shared import Mailbox
box = Mailbox.open(Path(sys.argv[1]))
print(box.folder, flush=True)
time.sleep(120)
"""


def test_a_killed_consumers_folder_is_removed_by_the_next_mailbox_and_a_live_ones_kept(tmp_path):
    owners = [subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
              for _ in range(2)]
    try:
        killed, alive = (owner.stdout.readline().strip() for owner in owners)
        owners[0].send_signal(signal.SIGKILL)
        owners[0].wait(timeout=30)
        assert os.path.isdir(killed)  # left behind
        box = Mailbox.open(tmp_path)
        assert not os.path.exists(killed) and os.path.isdir(alive)
        box.close()
    finally:
        for owner in owners:
            owner.kill()
            owner.wait(timeout=30)
            owner.stdout.close()


def test_parts_of_a_batch_are_written_side_by_side_and_never_once_taken(mailbox):
    """Workers making parts of a batch (`Part`) write their rows of one file per field: the first makes it
    (from a free one of its size when there is one), the others map it; once the consumer takes it, its
    name is gone, so nothing writes the memory the consumer handed out."""
    shape = (2, 1 << 16)

    def part(offset, value, batch="b", width=1 << 16):
        arena = mailbox.slot.arena(shared.Part(batch, offset, 4))
        images = arena.empty((2, width), np.dtype("uint8"), field="images")
        images.fill(value)
        return arena.publish({"images": images, "labels": np.full(2, value)})

    parts = [part(0, 1), part(2, 2)]
    assert parts[0].fields["images"] == parts[1].fields["images"] == SharedArray("b-images", "|u1", (4, 1 << 16))
    batch = shared.join_parts(parts, [2, 2], mailbox)
    assert batch["images"][:, 0].tolist() == [1, 1, 2, 2] and batch["labels"].tolist() == [1, 1, 2, 2]
    assert "b-images" not in files(mailbox)
    part(0, 7)  # a later batch of the same name: another file
    assert batch["images"][:, 0].tolist() == [1, 1, 2, 2]
    wrong = part(2, 3, width=1 << 17)  # a part that disagrees on the batch's shape
    with pytest.raises(ClusterError, match="disagree"):
        shared.join_parts([part(0, 7), wrong], [2, 2], mailbox)
    del batch
    gc.collect()
    free = [name for name in files(mailbox) if name.startswith(FREE)]
    assert len(free) == 2  # both batches taken, freed for the next batches of their size
    part(0, 5, batch="again")
    assert len([name for name in files(mailbox) if name.startswith(FREE)]) == 1  # ... which took one
    with pytest.raises(ClusterError, match="gone"):
        mailbox.take(SharedArray("never-made", "|u1", shape))


def test_parts_of_text_keep_their_widths_and_parts_of_other_dtypes_are_refused(mailbox):
    """Text never goes into a batch's shared file (each part is as wide as its own widest string: copied into
    the first part's width it would be cut short); parts that disagree on a dtype are an error, not a cast."""
    rows = SHARED_MIN_BYTES // 4  # the batch's text is large enough for shared memory

    def part(offset, text, numbers):
        arena = mailbox.slot.arena(shared.Part("t", offset, 2 * rows))
        return arena.publish({"path": np.full(rows, text), "x": numbers})

    parts = [part(0, "a", np.zeros((rows, 64), np.uint8)), part(rows, "bcd", np.ones((rows, 64), np.uint8))]
    assert not isinstance(parts[0].fields["path"], SharedArray)
    batch = shared.join_parts(parts, [rows, rows], mailbox)
    assert batch["path"].dtype == np.dtype("<U3") and batch["path"][[0, -1]].tolist() == ["a", "bcd"]
    assert batch["x"][[0, -1], 0].tolist() == [0, 1]
    other = [{"x": np.zeros(2, np.int32)}, {"x": np.zeros(2, np.int64)}]
    with pytest.raises(TypeError, match="Cannot cast"):
        shared.join_parts(other, [2, 2], mailbox)


@pytest.mark.slow
@pytest.mark.portable
def test_a_file_that_comes_back_is_written_and_read_through_the_mapping_kept(tmp_path, monkeypatch):
    """Each file is mapped once (in one process, the worker's arena and the consumer share the mapping) and
    each batch still reads as made; a batch the consumer holds is never written again; the next epoch's
    mailbox keeps the mappings of the free files it takes over."""
    mapped = []
    original = mappings.map_descriptor
    monkeypatch.setattr(mappings, "map_descriptor",
                        lambda descriptor, *a, **k: mapped.append(descriptor) or original(descriptor, *a, **k))
    first = Mailbox.open(tmp_path)
    held = first.receive(made(first, 200))["images"]
    for value in range(20):
        assert (first.receive(made(first, value))["images"] == value).all()
        gc.collect()  # each dropped: its file free for the next
    assert (held == 200).all() and len(files(first)) == 2 and len(mapped) == 2
    first.close()
    second = Mailbox.open(tmp_path)
    assert (second.receive(made(second, 21))["images"] == 21).all() and len(mapped) == 2
    second.close()


def test_a_run_keeps_the_free_files_it_used_not_the_most_the_process_ever_held(tmp_path):
    first = Mailbox.open(tmp_path)
    held = [first.receive(made(first, value)) for value in range(3)]  # three held at once: three files
    del held
    gc.collect()
    first.close()
    second = Mailbox.open(tmp_path)
    assert len([name for name in files(second) if name.startswith(FREE)]) == 3  # taken over
    assert (second.receive(made(second, 4))["images"] == 4).all()  # a short run: one batch, one file
    gc.collect()
    second.close()
    third = Mailbox.open(tmp_path)
    assert len([name for name in files(third) if name.startswith(FREE)]) == 1  # the two never needed went
    third.close()


def test_a_run_closing_while_the_next_is_open_hands_it_its_free_files(tmp_path):
    """The next epoch's run opens its mailbox as this one drains (`NextEpoch`): the free files this run
    leaves go to it, to be written again, not to a spare folder it no longer looks at."""
    first = Mailbox.open(tmp_path)
    held = [first.receive(made(first, value)) for value in range(2)]
    inodes = {os.stat(first.folder / name).st_ino for name in files(first)}
    second = Mailbox.open(tmp_path)  # the next epoch's, opened before the first closes
    (tmp_path / "elsewhere").mkdir()
    other_root = Mailbox.open(tmp_path / "elsewhere")  # newer, but under another root: no heir of the first
    del held
    gc.collect()
    first.close()
    free = [name for name in files(second) if name.startswith(FREE)]
    assert {os.stat(second.folder / name).st_ino for name in free} == inodes and not files(other_root)
    batches = [second.receive(made(second, value)) for value in (3, 4)]  # made in them, no new file
    assert {os.stat(second.folder / name).st_ino for name in files(second)} == inodes
    assert [int(batch["images"][0, 0]) for batch in batches] == [3, 4]
    other_root.close()
    second.close()


def test_parts_copied_as_they_come_make_the_batch_and_free_its_file_once_all_are_in(mailbox):
    """`PinnedParts` (what the DataLoader's pin thread does with each part, plain memory standing in for pinned):
    each part's rows copied into the batch's array, made once; the file freed once every row is copied; a part
    that a worker sent as an array (no room) copied in as the batch is taken; a missing or disagreeing part is a
    named error, and the batches of a stopped pass are let go of."""
    from outcore.adapters.torch_pinned import PinnedParts

    folder, allocated = str(mailbox.folder), []

    def allocate(shape, dtype, field=""):
        allocated.append(field)
        return np.empty(shape, dtype)

    def part(offset, value, batch="p1-b", room=True):
        arena = mailbox.slot.arena(shared.Part(batch, offset, 6))
        images = arena.empty((2, 1 << 16), np.dtype("uint8"), field="images") if room else np.empty((2, 1 << 16), "u1")
        images.fill(value)
        return arena.publish({"images": images, "labels": np.full(2, value)})

    pinned = PinnedParts(allocate)
    copied = [pinned.copy(part(offset, offset + 1), folder, offset, 2) for offset in (0, 2)]
    assert "p1-b-images" in files(mailbox)  # two of its three parts copied: still the workers'
    copied.append(pinned.copy(part(4, 9, room=False), folder, 4, 2))  # no room: the part sent as an array
    fields, rest = pinned.take(copied, [2, 2, 2])
    assert fields["images"][:, 0].tolist() == [1, 1, 3, 3, 9, 9] and allocated == ["images"]
    assert shared.join_parts(rest, [2, 2, 2], mailbox)["labels"].tolist() == [1, 1, 3, 3, 9, 9]
    assert [name for name in files(mailbox) if name.startswith(FREE)] == [f"{FREE}{(6 << 16) + 16}-p1-b-images"]
    assert not pinned.batches

    missing = [pinned.copy(part(0, 1, batch="p1-c"), folder, 0, 2)]
    with pytest.raises(ClusterError, match="hold 2 rows of field 'images', not its 6: a worker's part of it is missing"):
        pinned.take(missing, [2])
    with pytest.raises(ClusterError, match="not within its file"):
        pinned.copy(part(0, 1, batch="p1-d"), folder, 5, 2)
    short = part(0, 1, batch="p1-s")
    os.truncate(mailbox.folder / "p1-s-images", 1024)  # never mapped past its end: refused by name
    with pytest.raises(ClusterError, match="p1-s-images .* holds 1024 bytes"):
        pinned.copy(short, folder, 0, 2)
    os.unlink(mailbox.folder / "p1-s-images")
    with pytest.raises(ClusterError, match="shared memory is gone"):
        pinned.copy(short, folder, 0, 2)
    assert all(name != "p1-s-images" for _, name in pinned.batches)  # no memory made for a part refused
    pinned.copy(part(0, 1, batch="p1-e"), folder, 0, 2)
    pinned.copy(part(0, 1, batch="p2-e"), folder, 0, 2)
    pinned.drop(folder, keep="p2-")  # a new pass: what the stopped one left is let go of
    assert [key[1] for key in pinned.batches] == ["p2-e-images"]
    pinned.drop(folder)
    assert not pinned.batches
