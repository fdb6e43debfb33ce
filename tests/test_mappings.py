"""Mappings of shared-memory files kept for the next batch in the same file (`outcore.iterate.mappings`)."""

from __future__ import annotations

import multiprocessing
import os
import shutil

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
    kept_mappings.drop(made)


def test_a_file_renamed_in_its_folder_is_mapped_once_and_others_each_their_own(folder):
    kept = KeptMappings()
    first = kept.map(folder, "a", SIZE, create=True)
    os.rename(folder / "a", folder / "b")
    assert kept.map(folder, "b", SIZE) is first
    other = kept.map(folder, "c", SIZE, create=True)
    assert other is not first and kept.kept(folder) == {os.stat(folder / "b").st_ino, os.stat(folder / "c").st_ino}
    np.frombuffer(first, np.uint8)[:4] = 7  # the same memory, whatever the name
    assert (np.fromfile(folder / "b", np.uint8, 4) == 7).all()
    assert kept.map(folder, "b", SIZE // 2) is not first  # another size: another mapping


def test_files_moved_keep_their_mappings_and_gone_folders_are_forgotten(folder, tmp_path):
    kept = KeptMappings()
    stays = kept.map(folder, "b", SIZE, create=True)
    inode = os.stat(folder / "b").st_ino
    kept.prune()  # the folder is there: nothing forgotten
    assert kept.kept(folder) == {inode}
    spare = tmp_path / "spare"
    spare.mkdir()
    os.rename(folder / "b", spare / "b")
    kept.move(folder, spare, inode)  # the consumer moving a free file to its spare folder
    assert kept.kept(folder) == set() and kept.map(spare, "b", SIZE) is stays
    shutil.rmtree(spare)
    kept.prune()
    assert kept.folders == {}


def _count_in_child(queue):
    queue.put((len(kept_mappings.folders), kept_mappings.lock.acquire(timeout=5)))


def test_a_forked_child_starts_with_no_mappings_and_a_free_lock(folder):
    kept_mappings.map(folder, "a", SIZE, create=True)
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
