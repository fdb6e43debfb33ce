"""Append: new files added to an image store in place, old samples and numbers kept, never a mix."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from support.optional import need

import outcore
from outcore.cli import main
from outcore.errors import OptionError, SourceError, StoreBusyError
from outcore.ingest.splice import publish
from outcore.ingest.writer import writer_lock
from outcore.testing import write_image_folder

SHAPE = (24, 24, 3)


def add_photos(root, classes, per_class, seed, prefix):
    """``per_class`` new pictures in each of ``root/<class>/``, named ``<prefix><name>``."""
    staging = root.parent / f".staging-{prefix}"
    for file in write_image_folder(staging, per_class, classes=classes, size=SHAPE[:2], seed=seed):
        target = root / file.parent.name / f"{prefix}{file.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        file.rename(target)
    shutil.rmtree(staging)


def by_path(ds, field="images"):
    """Each sample's ``field`` (decoded pictures for encoded ones) by its file."""
    return dict(zip(ds["path"].compute().tolist(), ds[field].compute(), strict=True))


@pytest.fixture
def photos(tmp_path):
    root = tmp_path / "photos"
    write_image_folder(root, 15, classes=("cat", "dog"), size=SHAPE[:2], seed=1)  # 30: the last shard is partial
    return root


def ingest(root, location, **options):
    return outcore.ingest_images(root, location, shape=SHAPE, chunk_size=4, progress=False, **options)


@pytest.mark.parametrize("images", ["pixels", "encoded", "both"])
def test_an_append_adds_exactly_the_new_files_and_keeps_every_old_sample(photos, tmp_path, images):
    store = tmp_path / "s.zarr"
    old = ingest(photos, store, images=images)
    before = {name: by_path(old, name) for name in old.fields if name != "path"}
    add_photos(photos, ("dog", "ant"), 5, seed=7, prefix="new_")
    grown = ingest(photos, store, images=images, append=True, seed=3)

    files = sorted(p.relative_to(photos).as_posix() for p in photos.rglob("*.jpg"))
    paths = grown["path"].compute().tolist()
    assert len(grown) == 40 and sorted(paths) == files
    assert paths[:30] == old["path"].compute().tolist()  # the old samples, in their places
    for name, values in before.items():
        now = by_path(grown, name)
        for path, value in values.items():
            np.testing.assert_array_equal(now[path], value, err_msg=f"{name} of {path}")
    assert grown.classes == ["cat", "dog", "ant"]  # old numbers kept, the new class after them
    labels = dict(zip(paths, grown["labels"].compute().tolist(), strict=True))
    assert all(grown.classes[labels[path]] == path.split("/")[0] for path in paths)
    assert sorted(grown["source_index"].compute()[30:].tolist()) == list(range(30, 40))
    appended = grown.attrs.provenance["appended"]
    assert [(a["first_sample"], a["samples"], a["seed"]) for a in appended] == [(30, 10, 3)]

    whole = ingest(photos, tmp_path / "whole.zarr", images=images)  # what a full re-ingest stores
    expected = by_path(whole)
    for path, value in by_path(grown).items():
        np.testing.assert_array_equal(value, expected[path], err_msg=path)
    assert outcore.verify(store, progress=False).ok
    seen = np.concatenate([b["source_index"] for b in grown.batches(8, seed=1, fields=["source_index"])])
    assert sorted(seen.tolist()) == sorted(grown["source_index"].compute().tolist())


def test_pictures_kept_at_their_own_sizes_grow_like_a_fresh_ingest_and_open_in_xarray(photos, tmp_path):
    store, options = tmp_path / "s.zarr", {"shape": None, "images": "encoded", "max_side": 20, "progress": False}
    outcore.ingest_images(photos, store, chunk_size=4, **options)
    write_image_folder(tmp_path / "big", 3, classes=("cat",), size=(40, 30), seed=8)  # shrunk to max_side
    for file in (tmp_path / "big" / "cat").iterdir():
        shutil.copy(file, photos / "cat" / f"big_{file.name}")
    grown = outcore.ingest_images(photos, store, append=True, **options)
    whole = outcore.ingest_images(photos, tmp_path / "whole.zarr", **options)
    for name in ("images_shapes", "file_digest"):
        expected = dict(zip(whole["path"].compute().tolist(), whole.array(name)[:], strict=True))
        for path, value in zip(grown["path"].compute().tolist(), grown.array(name)[:], strict=True):
            np.testing.assert_array_equal(value, expected[path], err_msg=f"{name} of {path}")
    assert outcore.verify(store, progress=False).ok
    xr = need("xarray")
    assert xr.open_zarr(store)["path"].shape[0] == len(grown) == 33


def test_the_new_part_is_shuffled_within_itself_by_the_seed(photos, tmp_path):
    add = []
    for seed in (0, 0, 1):
        root = tmp_path / f"photos-{len(add)}"
        shutil.copytree(photos, root)
        ingest(root, root.with_suffix(".zarr"))
        add_photos(root, ("cat",), 12, seed=5, prefix="new_")
        add.append(ingest(root, root.with_suffix(".zarr"), append=True, seed=seed)["path"].compute()[30:].tolist())
    assert add[0] == add[1] != add[2] and sorted(add[0]) == sorted(add[2])
    assert add[0] != sorted(add[0])


def test_an_append_of_nothing_new_changes_nothing_and_a_reader_keeps_its_count(photos, tmp_path):
    store = tmp_path / "s.zarr"
    old = ingest(photos, store)
    assert len(ingest(photos, store, append=True)) == 30
    assert "appended" not in outcore.open_dataset(store).attrs.provenance
    reader = outcore.open_dataset(store)
    first = by_path(reader)
    add_photos(photos, ("cat",), 6, seed=2, prefix="new_")
    assert len(ingest(photos, store, append=True)) == 36
    assert len(reader) == 30  # a reader opened before sees the old count, and the same samples
    for path, value in by_path(reader).items():
        np.testing.assert_array_equal(value, first[path])
    assert by_path(old).keys() == first.keys()


def test_a_store_opened_between_its_arrays_growing_and_its_count_reads_the_old_count(photos, tmp_path, monkeypatch):
    """An append moves the arrays' metadata (their new shapes) before the group's (the new count): a
    reader opening the store in between sees arrays longer than the count, which the store's `growing`
    mark allows (an edited count without it is refused)."""
    store = tmp_path / "s.zarr"
    ingest(photos, store)
    add_photos(photos, ("cat",), 6, seed=2, prefix="new_")
    replace, seen = os.replace, []

    def replace_then_look(source, target):
        if os.fspath(target) == os.fspath(store / "zarr.json"):  # the arrays have grown; the count is next
            opened = outcore.open_dataset(store)
            seen.append((len(opened), opened.unpublished()))
        replace(source, target)

    monkeypatch.setattr("outcore.ingest.splice.os.replace", replace_then_look)
    grown = ingest(photos, store, append=True)
    assert seen[-1] == (30, 6) and {count for count, _ in seen} == {30} and len(grown) == 36
    assert "growing" not in json.loads((store / "zarr.json").read_text())["attributes"]["outcore"]


def test_a_store_that_ends_on_a_shard_boundary_grows_by_new_shards(tmp_path):
    root = tmp_path / "photos"
    write_image_folder(root, 16, classes=("cat", "dog"), size=SHAPE[:2], seed=1)
    store = tmp_path / "s.zarr"
    old = ingest(root, store)
    assert old.array("images").shards[0] in (4, 8, 16, 32)
    add_photos(root, ("cat",), 4, seed=2, prefix="new_")
    grown = ingest(root, store, append=True)
    assert len(grown) == 36 and outcore.verify(store, progress=False).ok


def test_a_changed_or_relabelled_file_is_named_and_by_content_tells_a_touch_from_a_change(photos, tmp_path):
    store = tmp_path / "s.zarr"
    ingest(photos, store)
    touched = photos / "cat" / "cat_000001.jpg"
    os.utime(touched, ns=(10**18, 10**18))
    with pytest.raises(SourceError, match=r"1 file\(s\) of .* changed since .*'cat/cat_000001.jpg' \(modified since\)"
                                          r".*by_content=True"):
        ingest(photos, store, append=True)
    renamed = photos / "cat" / "renamed.jpg"
    shutil.copy(photos / "cat" / "cat_000002.jpg", renamed)
    add_photos(photos, ("cat",), 2, seed=4, prefix="new_")
    grown = ingest(photos, store, append=True, by_content=True)  # a touch is no change; a copy is no new file
    assert len(grown) == 32 and "cat/renamed.jpg" not in grown["path"].compute().tolist()
    (photos / "dog" / "dog_000003.jpg").write_bytes((photos / "dog" / "dog_000004.jpg").read_bytes())
    with pytest.raises(SourceError, match="'dog/dog_000003.jpg'"):
        ingest(photos, store, append=True, by_content=True)
    assert len(outcore.open_dataset(store)) == 32  # refused before anything was written


def test_a_relabelled_row_of_a_table_is_refused_and_new_rows_get_class_numbers_by_name(photos, tmp_path):
    names = sorted(p.relative_to(photos).as_posix() for p in photos.rglob("*.jpg"))
    frame = pd.DataFrame({"path": names, "kind": ["b" if "cat" in n else "a" for n in names],
                          "score": np.linspace(0, 1, 30)})  # stored as float32
    store = tmp_path / "t.zarr"
    options = {"label_columns": ["kind", "score"], "root": photos, "shape": SHAPE, "progress": False}
    outcore.ingest_dataframe(frame, store, **options)
    add_photos(photos, ("cat",), 3, seed=4, prefix="new_")
    new = pd.DataFrame({"path": [f"cat/new_cat_00000{i}.jpg" for i in range(3)], "kind": ["0", "b", "a"],
                        "score": [1.5, 2.5, 3.5]})
    grown = outcore.ingest_dataframe(pd.concat([frame, new]), store, append=True, **options)
    assert grown.classes_of("kind") == ["a", "b", "0"]
    kinds = dict(zip(grown["path"].compute().tolist(), grown["kind"].compute().tolist(), strict=True))
    assert [kinds[f"cat/new_cat_00000{i}.jpg"] for i in range(3)] == [2, 1, 0]
    relabelled = pd.concat([frame, new]).assign(kind=lambda f: np.where(f.path == names[0], "z", f.kind))
    with pytest.raises(SourceError, match=f"label field 'kind'.*'{names[0]}'"):
        outcore.ingest_dataframe(relabelled, store, append=True, **options)


def test_other_settings_and_stores_that_cannot_grow_are_refused_by_name(photos, tmp_path):
    store = tmp_path / "s.zarr"
    ingest(photos, store)
    with pytest.raises(OptionError, match=r"made with shape '24,24,3'.*append with the store's settings"):
        outcore.ingest_images(photos, store, shape=(32, 32, 3), progress=False, append=True)
    with pytest.raises(OptionError, match="made with images 'pixels'"):
        ingest(photos, store, images="encoded", append=True)
    with pytest.raises(OptionError, match="leave out compression='zstd'"):
        ingest(photos, store, compression="zstd", append=True)
    with pytest.raises(OptionError, match="pass one of them"):
        ingest(photos, store, append=True, overwrite=True)
    with pytest.raises(OptionError, match="pass append=True"):
        ingest(photos, tmp_path / "o.zarr", by_content=True)
    outcore.from_arrays({"x": np.zeros((4, 2))}, tmp_path / "a.zarr", progress=False)
    with pytest.raises(OptionError, match="does not record its files' sizes"):
        ingest(photos, tmp_path / "a.zarr", append=True)
    with pytest.raises(OptionError, match="local directory store"):
        ingest(photos, tmp_path / "z.zip", append=True)
    deep = photos / "cat" / ("d" * 130) / ("e" * 130)
    deep.mkdir(parents=True)
    shutil.copy(photos / "cat" / "cat_000001.jpg", deep / "long.jpg")
    with pytest.raises(SourceError, match="longer than the 256 bytes the path field"):
        ingest(photos, store, append=True)
    with writer_lock(store, str(store)), pytest.raises(StoreBusyError):
        ingest(photos, store, append=True)


def test_the_first_append_to_a_missing_store_ingests_it(photos, tmp_path):
    assert len(ingest(photos, tmp_path / "new.zarr", append=True)) == 30


def test_bad_new_files_are_skipped_and_reported_beside_the_old_ones(photos, tmp_path):
    store = tmp_path / "s.zarr"
    ingest(photos, store, on_error="skip")
    add_photos(photos, ("cat",), 3, seed=4, prefix="new_")
    (photos / "cat" / "new_broken.jpg").write_bytes(b"not a picture")
    grown = ingest(photos, store, append=True, on_error="skip")
    report = tmp_path / "s.zarr.skipped.txt"
    assert len(grown) == 33 and grown.attrs.skipped["count"] == 1 and "new_broken.jpg" in report.read_text()
    with pytest.warns(outcore.OutcoreWarning, match=r"1 file\(s\) that an earlier run skipped as bad .* not tried again"):
        assert len(ingest(photos, store, append=True)) == 33  # a file skipped before, unchanged, is not tried again
    broken = photos / "cat" / "new_broken.jpg"
    later = report.stat().st_mtime_ns + 10**9
    os.utime(broken, ns=(later, later))  # modified since: tried again, and still bad
    with pytest.raises(SourceError, match="new_broken.jpg"):
        ingest(photos, store, append=True)
    again = ingest(photos, store, append=True, on_error="skip")
    assert len(again) == 33 and again.attrs.skipped["count"] == 1 and report.read_text().count("new_broken") == 1
    shutil.copy(photos / "cat" / "cat_000001.jpg", broken)  # mended, after the report the last run wrote
    mended_at = report.stat().st_mtime_ns + 10**9  # (that run rewrote it: however long it took, the file is newer)
    os.utime(broken, ns=(mended_at, mended_at))
    mended = ingest(photos, store, append=True, on_error="skip")
    assert len(mended) == 34 and mended.attrs.skipped is None and not report.exists()


def test_pictures_larger_than_the_chunks_have_room_for_grow_the_room_once(tmp_path):
    """New photos five times the store's side: no order fits the chunks' room, so the encoded field is written
    again with room for its fullest chunk (saying what it cost), the other fields' files kept (hard links);
    every old sample is the same, the store verifies, a reader opened before stops naming the field's file."""
    photos, store = tmp_path / "photos", tmp_path / "s.zarr"
    write_image_folder(photos, 20, classes=("a", "b"), size=(32, 32), kind="photos", seed=1)
    old = ingest(photos, store, images="both")
    before = {name: by_path(old, name) for name in ("images", "images_encoded", "labels")}
    pixels_file = store / "images" / "c" / "0" / "0" / "0" / "0"  # the first shard of pixels: full, kept
    pixels_inode = os.stat(pixels_file).st_ino
    for file in write_image_folder(tmp_path / "big", 6, classes=("a", "c"), size=(160, 160), kind="photos", seed=2):
        (photos / file.parent.name).mkdir(exist_ok=True)
        file.rename(photos / file.parent.name / f"big_{file.name}")
    room = old.array("images_encoded").chunks[0]
    with pytest.warns(outcore.OutcoreWarning, match=rf"grew the room of field\(s\) 'images_encoded' from {room:,} to "
                                            r"[\d,]+ bytes a chunk, writing those fields again \([\d.]+ MiB written"):
        grown = ingest(photos, store, images="both", append=True)
    assert len(grown) == 52 and grown.array("images_encoded").chunks[0] > room
    assert not outcore.verify(store, progress=False).problems
    for name, values in before.items():
        after = by_path(grown, name)
        assert all(np.array_equal(after[path], value) for path, value in values.items()), name
    assert os.stat(pixels_file).st_ino == pixels_inode  # kept, not copied: a reader opened before reads it still
    assert {path: int(v) for path, v in by_path(old, "labels").items()} == \
        {path: int(v) for path, v in before["labels"].items()}
    with pytest.raises(outcore.StoreChangedError, match="images_encoded"):
        old["images_encoded"].compute()


KILL = textwrap.dedent("""
    import os, signal, sys
    import outcore
    from outcore.ingest import build, splice

    where, after, count = sys.argv[3], int(sys.argv[4]), [0]

    def counted(function):
        def dying(*args, **kwargs):
            result = function(*args, **kwargs)
            count[0] += 1
            if count[0] == after:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return dying

    if where == "part":  # killed once the part's ingest has written a number of shards
        build._write_shard = counted(build._write_shard)
    else:  # killed once the splice has moved a number of files into the store
        publish, replace = splice.publish, os.replace
        def publishing(splice, target):
            os.replace = counted(replace)
            publish(splice, target)
        splice.publish = publishing
    outcore.ingest_images(sys.argv[1], sys.argv[2], shape=(24, 24, 3), chunk_size=4, progress=False, append=True)
""")


@pytest.mark.slow  # a process killed at each of five instants: the same files on every interpreter
@pytest.mark.parametrize("when", ["part", "first shard", "a shard", "array metadata", "all but the group"])
def test_a_killed_append_leaves_the_old_store_and_running_it_again_finishes_it(photos, tmp_path, when, monkeypatch):
    store = tmp_path / "s.zarr"
    first = by_path(ingest(photos, store))
    add_photos(photos, ("dog", "ant"), 5, seed=7, prefix="new_")
    reference = tmp_path / "reference" / "s.zarr"
    shutil.copytree(store, reference)
    moved = []
    replace = os.replace
    monkeypatch.setattr("outcore.ingest.splice.publish", lambda splice, target: (
        monkeypatch.setattr(os, "replace", lambda a, b: (moved.append(str(b)), replace(a, b))),
        publish(splice, target), monkeypatch.setattr(os, "replace", replace)))
    expected = ingest(photos, reference, append=True)
    monkeypatch.undo()
    shards = sum(not path.endswith("zarr.json") for path in moved)
    after = {"part": 1, "first shard": 1, "a shard": shards - 1, "array metadata": shards + 1,
             "all but the group": len(moved) - 1}[when]
    script = tmp_path / "kill.py"
    script.write_text(KILL)
    run = subprocess.run([sys.executable, str(script), str(photos), str(store), "part" if when == "part" else "splice",
                          str(after)], check=False, capture_output=True)
    assert run.returncode == -signal.SIGKILL, run.stderr.decode()
    killed = outcore.open_dataset(store)
    assert len(killed) == 30  # the old count, and the old samples
    for path, value in by_path(killed).items():
        np.testing.assert_array_equal(value, first[path])
    assert outcore.verify(store, progress=False).ok
    again = ingest(photos, store, append=True)
    assert len(again) == 40
    for name in expected.fields:
        np.testing.assert_array_equal(again[name].compute(), expected[name].compute(), err_msg=name)
    assert not [p.name for p in tmp_path.iterdir() if ".append" in p.name]


def test_the_command_appends_and_names_a_changed_file_in_one_line(photos, tmp_path, capsys):
    store = tmp_path / "s.zarr"
    args = ["ingest", str(photos), str(store), "--shape", "24,24,3", "--no-progress"]
    assert main(args) == 0
    add_photos(photos, ("cat",), 4, seed=3, prefix="new_")
    capsys.readouterr()
    assert main([*args, "--append"]) == 0
    assert "appended 4 samples (30 before)" in capsys.readouterr().out
    os.utime(photos / "cat" / "new_cat_000000.jpg", ns=(10**18, 10**18))
    assert main([*args, "--append"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "'cat/new_cat_000000.jpg'" in error and "--by-content" in error
    assert main([*args, "--append", "--by-content"]) == 0
    assert main([*args[:3], "--shape", "16,16,3", "--no-progress", "--append"]) == 2
    assert "--shape 24,24,3" in capsys.readouterr().err


def test_splits_grow_each_by_its_own_new_files_with_one_class_list(photos, tmp_path):
    folder = tmp_path / "splits"
    options = {"split": {"train": 0.7, "val": 0.3}, "shape": SHAPE, "progress": False}
    first = outcore.ingest_splits(photos, folder, **options)
    add_photos(photos, ("cat", "ant"), 8, seed=9, prefix="new_")
    grown = outcore.ingest_splits(photos, folder, append=True, **options)
    for name in ("train", "val"):
        old = first[name]["path"].compute().tolist()
        now = grown[name]["path"].compute().tolist()
        assert now[: len(old)] == old and grown[name].classes == ["cat", "dog", "ant"]
    fresh = outcore.ingest_splits(photos, tmp_path / "fresh", **options)
    for name in ("train", "val"):
        assert sorted(grown[name]["path"].compute().tolist()) == sorted(fresh[name]["path"].compute().tolist())
    index = json.loads((folder / "splits.json").read_text())
    assert sum(entry["samples"] for entry in index["splits"].values()) == 46
    assert index["classes"] == ["cat", "dog", "ant"]
    with pytest.raises(OptionError, match="append with the same split rule"):
        outcore.ingest_splits(photos, folder, append=True, **{**options, "seed": 5})
    add_photos(photos, ("dog",), 4, seed=10, prefix="newer_")
    assert main(["ingest", str(photos), str(folder), "--split", "train=0.7,val=0.3", "--shape", "24,24,3",
                 "--append", "--no-progress"]) == 0
    index = json.loads((folder / "splits.json").read_text())
    assert sum(entry["samples"] for entry in index["splits"].values()) == 50
