"""Splits in one call: disjoint, reproducible, stable when files are added, with one class list; the index
that open_dataset reads; the folder layout, a CSV's split column and the command."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

import outcore
from outcore.cli import main
from outcore.errors import OptionError, SourceError
from outcore.testing import write_image_folder

FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def _paths(ds) -> set[str]:
    return set(ds["path"].compute().tolist())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("splits") / "photos"
    write_image_folder(root, 60, classes=("a", "b", "c"), size=(12, 12), seed=4)
    return root


def test_fractions_cut_a_folder_into_disjoint_reproducible_splits_with_one_class_list(photos, tmp_path):
    stores = outcore.ingest_splits(photos, tmp_path / "out", split=FRACTIONS, shape=(12, 12, 3), progress=False)
    assert list(stores) == ["train", "val", "test"]
    paths = {name: _paths(ds) for name, ds in stores.items()}
    every = {p.relative_to(photos).as_posix() for p in photos.rglob("*.jpg")}
    assert set.union(*paths.values()) == every and sum(map(len, paths.values())) == len(every)  # disjoint
    assert {tuple(ds.classes) for ds in stores.values()} == {("a", "b", "c")}
    index = json.loads((tmp_path / "out" / "splits.json").read_text())
    assert index["rule"] == {"fractions": FRACTIONS, "seed": 0}
    for name, ds in stores.items():
        counts = np.bincount(ds["labels"].compute(), minlength=3).tolist()
        assert index["splits"][name] == {"store": f"{name}.zarr", "samples": len(ds),
                                         "per_class": dict(zip("abc", counts, strict=True))}
    assert 0.6 < len(stores["train"]) / len(every) < 0.95  # the fractions, up to the noise of 180 draws
    again = outcore.ingest_splits(photos, tmp_path / "again", split="train=0.8,val=0.1,test=0.1",
                                  shape=(12, 12, 3), progress=False)
    assert {name: _paths(ds) for name, ds in again.items()} == paths
    other = outcore.ingest_splits(photos, tmp_path / "other", split=FRACTIONS, seed=1, shape=(12, 12, 3),
                                  progress=False)
    assert {name: _paths(ds) for name, ds in other.items()} != paths
    val = outcore.open_dataset(tmp_path / "out", split="val")
    assert _paths(val) == paths["val"] and len(val) == len(stores["val"])
    with pytest.raises(OptionError, match=r"folder of splits \['train', 'val', 'test'\]: pass split="):
        outcore.open_dataset(tmp_path / "out")
    with pytest.raises(OptionError, match="no split 'dev'"):
        outcore.open_dataset(tmp_path / "out", split="dev")
    with pytest.raises(outcore.NotAStoreError, match="not a folder of splits"):
        outcore.open_dataset(tmp_path / "out" / "val.zarr", split="val")
    with pytest.raises(OptionError, match="split= reads a local folder of splits"):
        outcore.open_dataset("s3://bucket/out", split="val")
    (tmp_path / "out" / "splits.json").write_text("{not json")
    with pytest.raises(outcore.NotAStoreError, match=r"splits.json is not a readable outcore splits index"):
        outcore.open_dataset(tmp_path / "out", split="val")


def test_a_file_keeps_its_split_when_files_are_added(photos, tmp_path):
    grown = tmp_path / "grown"
    shutil.copytree(photos, grown)
    for i, source in enumerate(sorted(photos.rglob("*.jpg"))[::4]):
        shutil.copy(source, grown / source.parent.name / f"new_{i}.jpg")
    before = outcore.ingest_splits(photos, tmp_path / "before", split=FRACTIONS, shape=(12, 12, 3), progress=False)
    after = outcore.ingest_splits(grown, tmp_path / "after", split=FRACTIONS, shape=(12, 12, 3), progress=False)
    for name in FRACTIONS:
        assert _paths(before[name]) == {p for p in _paths(after[name]) if "/new_" not in p}


def test_split_folders_become_stores_whose_labels_mean_the_same_class(tmp_path):
    write_image_folder(tmp_path / "src" / "train", 6, classes=("cat", "dog"), size=(12, 12), seed=1)
    write_image_folder(tmp_path / "src" / "val", 3, classes=("dog", "owl"), size=(12, 12), seed=2)
    stores = outcore.ingest_splits(tmp_path / "src", tmp_path / "out", shape=(12, 12, 3), progress=False)
    assert {name: (len(ds), ds.classes) for name, ds in stores.items()} == {
        "train": (12, ["cat", "dog", "owl"]), "val": (6, ["cat", "dog", "owl"])}
    for ds in stores.values():
        for path, label in zip(ds["path"].compute(), ds["labels"].compute(), strict=True):
            assert path.split("/")[1] == ds.classes[label]  # <split>/<class>/<file>
    index = json.loads((tmp_path / "out" / "splits.json").read_text())
    assert index["rule"] == {"folders": True}
    assert index["splits"]["val"]["per_class"] == {"cat": 0, "dog": 3, "owl": 3}


def test_the_command_splits_a_csv_by_its_column_into_zip_files(photos, tmp_path, capsys):
    files = sorted(p.relative_to(photos).as_posix() for p in photos.rglob("*.jpg"))
    csv = photos / "labels.csv"
    pd.DataFrame({"path": files, "label": [f.split("/")[0] for f in files],
                  "split": ["val" if i % 5 == 0 else "train" for i in range(len(files))]}).to_csv(csv, index=False)
    try:
        code = main(["ingest", str(csv), str(tmp_path / "out"), "--label-columns", "label", "--split-column", "split",
                     "--zip", "--shape", "12x12x3", "--no-progress"])
    finally:
        csv.unlink()
    assert code == 0
    printed = capsys.readouterr().out
    assert "train: 144 samples" in printed and "val: 36 samples" in printed and "splits.json" in printed
    val = outcore.open_dataset(tmp_path / "out", split="val")
    assert val.location.endswith("val.zip") and _paths(val) == set(files[::5])
    assert json.loads((tmp_path / "out" / "splits.json").read_text())["rule"] == {"column": "split"}
    assert main(["info", str(tmp_path / "out")]) == 2
    assert "a folder of splits ['train', 'val']: pass --split one of them" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "out"), "--split", "val"]) == 0 and "val.zip" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "out"), "--split", "train", "--no-progress"]) == 0


def test_bad_splits_are_named(photos, tmp_path, capsys):
    with pytest.raises(OptionError, match="add up to 1"):
        outcore.ingest_splits(photos, tmp_path / "x", split={"train": 0.8, "val": 0.1}, shape=(12, 12, 3))
    with pytest.raises(SourceError, match=r"split\(s\) \['tiny'\] would be empty"):
        outcore.ingest_splits(photos, tmp_path / "x", split={"train": 0.999, "tiny": 0.001}, shape=(12, 12, 3),
                              progress=False)
    assert main(["ingest", str(photos), str(tmp_path / "y"), "--split", "train=0.5,val=0.6", "--shape", "12x12x3"]) == 2
    assert "add up to 1" in capsys.readouterr().err
    assert main(["ingest", str(photos), str(tmp_path / "y"), "--split", "folders", "--shape", "12x12x3"]) == 2
    assert "class folders" in capsys.readouterr().err  # photos/<class>/<image>: no split folders
    assert not (tmp_path / "x").exists() or not list((tmp_path / "x").iterdir())
