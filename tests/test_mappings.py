"""Mappings of shared-memory files kept for the next batch in the same file (`outcore.iterate.mappings`)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from types import SimpleNamespace

import numpy as np
import pytest

from outcore.iterate import shared
from outcore.iterate.mappings import KeptMappings, kept_mappings

SIZE = 1 << 16


@pytest.fixture
def folder(tmp_path):
    made = tmp_path / "mailbox"
    made.mkdir()
    yield made
    shutil.rmtree(made, ignore_errors=True)
    kept_mappings.prune()


def test_a_file_renamed_is_mapped_once_and_others_each_their_own(folder):
    kept = KeptMappings()
    first = kept.map(folder / "a", SIZE, create=True)
    os.rename(folder / "a", folder / "b")
    assert kept.map(folder / "b", SIZE) is first
    other = kept.map(folder / "c", SIZE, create=True)
    assert other is not first and kept.inodes() == {os.stat(folder / "b").st_ino, os.stat(folder / "c").st_ino}
    np.frombuffer(first, np.uint8)[:4] = 7  # the same memory, whatever the name
    assert (np.fromfile(folder / "b", np.uint8, 4) == 7).all()
    assert kept.map(folder / "b", SIZE // 2) is not first  # another size: another mapping


def test_a_file_moved_to_another_folder_keeps_its_mapping_until_it_is_removed(folder, tmp_path):
    """A consumer's free files go to its spare folder as a run closes and on to its next run's folder: a
    worker that mapped one in the first run finds it mapped in the next; once removed, it lets go of it."""
    kept = KeptMappings()
    stays = kept.map(folder / "b", SIZE, create=True)
    goes = kept.map(folder / "c", SIZE, create=True)
    (tmp_path / "spare").mkdir()
    os.rename(folder / "b", tmp_path / "spare" / "b")
    shutil.rmtree(folder)  # the run's folder, with the file left in it
    kept.prune()
    assert len(kept.kept) == 1 and kept.map(tmp_path / "spare" / "b", SIZE) is stays
    (tmp_path / "next").mkdir()
    os.rename(tmp_path / "spare" / "b", tmp_path / "next" / "free-b")
    assert kept.map(tmp_path / "next" / "free-b", SIZE) is stays
    del goes  # its memory now lives only as long as arrays made from it
    (tmp_path / "next" / "free-b").unlink()
    kept.prune()
    assert kept.kept == {}


def test_a_new_file_in_the_place_of_a_removed_one_is_mapped_anew(folder):
    kept = KeptMappings()
    old = kept.map(folder / "a", SIZE, create=True)
    np.frombuffer(old, np.uint8)[:4] = 9
    (folder / "a").unlink()
    new = kept.map(folder / "a", SIZE, create=True)
    assert new is not old and (np.frombuffer(new, np.uint8)[:4] == 0).all()
    assert kept.map(folder / "a", SIZE) is new


def test_a_kept_mapping_is_handed_out_only_for_its_own_file(folder):
    """Were another file given a kept file's inode number (tmpfs wraps 32-bit numbers after 4 billion
    files), it is mapped anew: here the new file's status is made to carry the kept file's number."""
    kept = KeptMappings()
    old = kept.map(folder / "a", SIZE, create=True)
    np.frombuffer(old, np.uint8)[:4] = 9
    (folder / "new").write_bytes(bytes(SIZE))

    def as_if_numbered_like(path, other):
        status = os.stat(path)
        return SimpleNamespace(st_dev=status.st_dev, st_ino=os.stat(other).st_ino, st_ctime_ns=status.st_ctime_ns,
                               st_size=status.st_size)

    time.sleep(0.05)  # past the filesystem's clock tick
    os.rename(folder / "a", folder / "a-kept")  # still named, changed after the new file was made
    first = kept.map(folder / "new", SIZE, status=as_if_numbered_like(folder / "new", folder / "a-kept"))
    assert first is not old and (np.frombuffer(first, np.uint8)[:4] == 0).all()
    gone = os.stat(folder / "a-kept")
    (folder / "a-kept").unlink()  # removed: its number could be given again
    (folder / "newer").write_bytes(bytes(SIZE))
    status = os.stat(folder / "newer")
    as_if = SimpleNamespace(st_dev=status.st_dev, st_ino=gone.st_ino, st_ctime_ns=gone.st_ctime_ns, st_size=SIZE)
    assert kept.map(folder / "newer", SIZE, status=as_if) is not old
    assert kept.map(folder / "new", SIZE) is first  # its own file: handed out


def _count_in_child(queue):
    queue.put((len(kept_mappings.kept), kept_mappings.lock.acquire(timeout=5)))


def test_a_forked_child_starts_with_no_mappings_and_a_free_lock(folder):
    kept_mappings.map(folder / "a", SIZE, create=True)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    with kept_mappings.lock:  # held at the fork, as another thread may hold it
        child = context.Process(target=_count_in_child, args=(queue,))
        child.start()
    assert queue.get(timeout=30) == (0, True)
    child.join(timeout=30)


def test_a_worker_takes_back_a_free_file_it_has_mapped_before_others(folder):
    for name in ("x", "y", "z"):
        (folder / f"{shared.FREE}{SIZE}-{name}").write_bytes(b"\0" * SIZE)
    mine = os.stat(folder / f"{shared.FREE}{SIZE}-y").st_ino
    assert shared._take_free(folder, "taken", SIZE, {mine}) == mine
    assert os.stat(folder / "taken").st_ino == mine
    assert shared._take_free(folder, "other", SIZE, {mine}) not in (None, mine)  # none of mine left: any
    assert shared._take_free(folder, "none", SIZE * 2) is None
