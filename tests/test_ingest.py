"""Image folders and tables of paths into stores (`outcore.ingest_images`, `outcore.ingest_dataframe`):
round trips, shuffle on write, label columns and their types, malformed CSVs, bad files."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pandas as pd
import pytest
from dask.highlevelgraph import HighLevelGraph
from PIL import Image
from support.rules import write_order

import outcore
from outcore.cli import describe, main
from outcore.errors import ImageError, OutcoreWarning, SourceError, StoreExistsError
from outcore.imaging import decode_image
from outcore.imaging.synthetic import sample_photo
from outcore.ingest import build
from outcore.testing import write_image_folder


def _expected_rgb(path: Path) -> np.ndarray:
    """What imageio decodes, made RGB by the documented rules (grey replicated, alpha dropped)."""
    pixels = iio.imread(path)
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[..., None], 3, axis=2)
    return pixels[..., :3]


def test_folder_round_trip_with_shuffle_on_write(image_folder, tmp_path):
    ds = outcore.ingest_images(image_folder, tmp_path / "train.zarr", shape=(32, 32, 3), progress=False)
    files = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*"))
    assert len(ds) == len(files) == 20
    assert ds.classes == ["cat", "dog", "owl"]
    assert ds.fields == ("images", "labels", "path", "source_index", "file_stat", "file_digest")
    images, labels = ds["images"].compute(), ds["labels"].compute()
    paths, source_index = ds["path"].compute(), ds["source_index"].compute()
    np.testing.assert_array_equal(source_index, write_order(20, 0))  # the documented rule
    assert list(paths) == [files[i] for i in source_index]
    for i, name in enumerate(paths):
        np.testing.assert_array_equal(images[i], _expected_rgb(image_folder / name), err_msg=name)
        assert ds.classes[labels[i]] == name.split("/")[0]
    assert ds.attrs.shuffled_on_write and ds.attrs.seed == 0


def test_class_sorted_folder_is_stored_in_random_order_unless_asked(image_folder, tmp_path):
    shuffled = outcore.ingest_images(image_folder, tmp_path / "a.zarr", shape=(32, 32, 3), progress=False)
    assert not np.all(np.diff(shuffled["labels"].compute()) >= 0)
    ordered = outcore.ingest_images(image_folder, tmp_path / "b.zarr", shape=(32, 32, 3), shuffle_on_write=False,
                                    progress=False)
    assert list(ordered["path"].compute()) == sorted(ordered["path"].compute())
    assert not ordered.attrs.shuffled_on_write and ordered.attrs.seed is None
    again = outcore.ingest_images(image_folder, tmp_path / "c.zarr", shape=(32, 32, 3), seed=5, progress=False)
    assert list(again["source_index"].compute()) != list(shuffled["source_index"].compute())


def test_greyscale_store_and_resize(image_folder, tmp_path):
    ds = outcore.ingest_images(image_folder, tmp_path / "g.zarr", shape=(16, 24), resize="fit", progress=False)
    assert ds["images"].shape == (20, 16, 24) and ds["images"].dtype == np.uint8
    name = ds["path"][0].compute()
    expected = np.asarray(Image.open(image_folder / name).convert("L").resize((24, 16), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(ds["images"][0].compute(), expected)


def test_single_file_zip_store(image_folder, tmp_path):
    ds = outcore.ingest_images(image_folder, tmp_path / "train.zarr.zip", shape=(32, 32, 3), progress=False)
    directory = outcore.ingest_images(image_folder, tmp_path / "train.zarr", shape=(32, 32, 3), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["photos", "train.zarr", "train.zarr.zip"]
    np.testing.assert_array_equal(ds["images"].compute(), directory["images"].compute())


def test_dataframe_and_csv_with_several_label_columns(image_folder, tmp_path):
    names = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*"))[:12]
    frame = pd.DataFrame({
        "path": names,
        "bi": [i % 2 == 0 for i in range(12)],
        "multi": [n.split("/")[0] for n in names],
        "score": np.linspace(0, 1, 12),
    })
    csv = image_folder / "labels.csv"
    frame.to_csv(csv, index=False)
    ds = outcore.ingest_dataframe(csv, tmp_path / "t.zarr", label_columns=["bi", "multi", "score"],
                                  shape=(32, 32, 3), progress=False)
    order = ds["source_index"].compute()
    np.testing.assert_array_equal(ds["bi"].compute(), frame["bi"].to_numpy(dtype=np.int64)[order])
    assert ds.classes_of("multi") == ["cat", "dog"] and ds.classes == ["cat", "dog"]
    assert [ds.classes_of("multi")[k] for k in ds["multi"].compute()] == list(frame["multi"][order])
    np.testing.assert_allclose(ds["score"].compute(), frame["score"].to_numpy()[order].astype(np.float32))
    assert ds["score"].dtype == np.float32 and ds.roles["score"] == "target"
    for i in (0, 5):
        np.testing.assert_array_equal(ds["images"][i].compute(), _expected_rgb(image_folder / names[order[i]]))
    with pytest.warns(OutcoreWarning, match=r"the DataFrame: column\(s\) \['bi', 'score'\] are not ingested; name "
                                            r"them in label_columns= to keep them"):
        from_frame = outcore.ingest_dataframe(frame, tmp_path / "f.zarr", label_columns=["multi"], root=image_folder,
                                              shape=(32, 32, 3), progress=False)
    np.testing.assert_array_equal(from_frame["images"].compute(), ds["images"].compute())


@pytest.mark.parametrize("base", ["/data/set", "/data/set/", "relative", "", ".", "a/./b//c", "/", "//", "//net",
                                  "a/../b"])
def test_a_table_s_paths_are_pathlib_s_whatever_their_form(base, monkeypatch, tmp_path):
    """Paths joined to a table's root as text where they are already in pathlib's form, else by pathlib: the same
    strings as ``str((Path(root) / name).absolute())`` either way, and URLs as they are."""
    from outcore.ingest.sources import _joined

    monkeypatch.chdir(tmp_path)
    names = ["a.jpg", "a/b.jpg", "./a.jpg", "a//b.jpg", "a/./b.jpg", "a/.", "a/", ".", "..", "../a.jpg", "a/../b.jpg",
             "/abs/a.jpg", "//net/a.jpg", "a b/ç.jpg", "~/a.jpg", ".hidden", "a/.b", "...", "s3://bucket/a.jpg"]
    expected = [name if name.startswith("s3://") else str((Path(base) / name).absolute()) for name in names]
    assert _joined(base, names) == expected


def test_a_task_s_opaque_argument_is_tokenized_by_all_of_its_contents():
    """Two block arguments that differ only deep inside (the middle of a large array, which a ``repr`` elides) have
    different Dask tokens, so their tasks are never taken for one; equal ones have equal tokens."""
    from dask.base import tokenize

    from outcore.ingest.decode_tasks import Opaque

    values = np.arange(5000)
    changed = values.copy()
    changed[2500] = -1
    assert tokenize(Opaque([values])) != tokenize(Opaque([changed]))
    assert tokenize(Opaque([((4, 6), 1), "a.png"])) == tokenize(Opaque([((4, 6), 1), "a.png"]))


def _csv_of(image_folder, column):
    names = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*"))[: len(column)]
    csv = image_folder / "labels.csv"
    pd.DataFrame({"path": names, "label": column}).to_csv(csv, index=False)
    return csv


@pytest.mark.parametrize(("stray", "message"), [
    ("x", r"holds numbers except in row 3 \('x'\).*label_dtype='class' to say"),
    (str(10**30), r"not int64 labels in row 3 \(1000000000000000000000000000000\).*label_dtype='float32'"),
])
def test_a_stray_cell_in_a_numeric_label_column_is_named_not_renumbered(image_folder, tmp_path, stray, message):
    csv = _csv_of(image_folder, ["1", "2", "9", stray, "4", "5"])
    with pytest.raises(SourceError, match=message):
        outcore.ingest_dataframe(csv, tmp_path / "t.zarr", label_columns=["label"], shape=(8, 8, 3), progress=False)
    assert not (tmp_path / "t.zarr").exists()
    assert main(["ingest", str(csv), str(tmp_path / "c.zarr"), "--label-columns", "label", "--shape", "8x8x3",
                 "--no-progress"]) == 2


@pytest.mark.parametrize(("text", "error"), [('path,label\n"a.jpg,1\nb.jpg,2,3,4\n', "ParserError"),
                                             ("", "EmptyDataError")])
def test_a_malformed_csv_is_one_clear_error(tmp_path, text, error):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(SourceError, match=f"cannot be read as a table \\({error}"):
        outcore.ingest_dataframe(tmp_path / "bad.csv", tmp_path / "c.zarr", shape=(8, 8, 3))


def test_label_dtype_says_what_a_column_holds_and_number_classes_sort_as_numbers(image_folder, tmp_path):
    csv = _csv_of(image_folder, ["1", "2", "10", "x", "2", "10"])
    ds = outcore.ingest_dataframe(csv, tmp_path / "t.zarr", label_columns=["label"], label_dtype="class",
                                  shape=(8, 8, 3), shuffle_on_write=False, progress=False)
    assert ds.classes_of("label") == ["1", "10", "2", "x"]  # not all numbers: sorted as text
    assert ds["label"].compute().tolist() == [0, 2, 1, 3, 2, 1]
    csv = _csv_of(image_folder, ["1", "2", "10", "2"])
    assert main(["ingest", str(csv), str(tmp_path / "c.zarr"), "--label-columns", "label", "--label-dtype",
                 "label=class", "--shape", "8x8x3", "--no-shuffle", "--no-progress"]) == 0
    ds = outcore.open_dataset(tmp_path / "c.zarr")
    assert ds.classes_of("label") == ["1", "2", "10"]  # every name a number: numeric order
    assert ds["label"].compute().tolist() == [0, 1, 2, 1]
    plain = outcore.ingest_dataframe(csv, tmp_path / "n.zarr", label_columns=["label"], shape=(8, 8, 3),
                                     shuffle_on_write=False, progress=False)
    assert plain["label"].dtype == np.int64 and plain["label"].compute().tolist() == [1, 2, 10, 2]
    with pytest.raises(ValueError, match="label_dtype 'text'"):
        outcore.ingest_dataframe(csv, tmp_path / "v.zarr", label_columns=["label"], label_dtype="text",
                                 shape=(8, 8, 3))


def test_skip_bad_files_and_report_them(image_folder, tmp_path):
    good = next(image_folder.glob("cat/*.jpg"))
    (image_folder / "cat" / "truncated.jpg").write_bytes(good.read_bytes()[:200])
    (image_folder / "dog" / "notes.png").write_text("not a picture")
    ds = outcore.ingest_images(image_folder, tmp_path / "s.zarr", shape=(32, 32, 3), on_error="skip",
                               chunk_size=4, progress=False)
    assert len(ds) == 20
    assert "cat/truncated.jpg" not in set(ds["path"].compute())
    assert ds.attrs.skipped["count"] == 2
    report = (tmp_path / "s.zarr.skipped.txt").read_text().splitlines()
    assert len(report) == 2 and {Path(line.split(":")[0]).name for line in report} == {"truncated.jpg", "notes.png"}
    paths, images = ds["path"].compute(), ds["images"].compute()
    for i in (0, 7, 19):
        np.testing.assert_array_equal(images[i], _expected_rgb(image_folder / paths[i]))
    assert outcore.verify(tmp_path / "s.zarr", progress=False).ok
    assert "skipped 2 source file(s)" in describe(ds)


def test_bad_image_raises_and_leaves_no_store(image_folder, tmp_path):
    (image_folder / "owl" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg")
    with pytest.raises(ImageError, match=r"owl/broken\.jpg: .*on_error='skip'"):
        outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(32, 32, 3), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["photos"]  # neither a store nor a staging folder


def test_the_same_ingest_run_again_returns_its_store(image_folder, tmp_path, capsys):
    """A notebook or script run twice: the second run finds the store the same ingest finished, and
    returns it (no choice of images= said again, nothing written); the CLI likewise."""
    first = outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(32, 32, 3))
    assert "images='" in capsys.readouterr().err  # the choice, said once
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "x.zarr").rglob("*")}
    with pytest.warns(OutcoreWarning, match=r"x.zarr is already complete \(an ingest of the same files, labels and "
                                            r"settings finished it\): it is returned as it is"):
        again = outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(32, 32, 3))
    assert "images=" not in capsys.readouterr().err
    assert again.attrs.to_dict() == first.attrs.to_dict()
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "x.zarr").rglob("*")} == written
    from outcore.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["ingest", str(image_folder), str(tmp_path / "x.zarr"), "--shape", "32x32x3"]) == 0
        assert main(["ingest", str(image_folder), str(tmp_path / "x.zarr"), "--shape", "8x8x3"]) == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("outcore ingest: warning: ") and "is already complete" in said[0]
    assert said[1].startswith("outcore ingest: error: ") and "pass --overwrite to replace it" in said[1]
    assert len(said) == 2  # no images= choice printed before either


def test_failed_overwrite_keeps_the_existing_store(image_folder, tmp_path):
    first = outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(32, 32, 3), progress=False)
    before = first["images"].compute()
    with pytest.raises(StoreExistsError, match=r"not made by this ingest \(shape was \(32, 32, 3\), now \(16, 16, "
                                               r"3\)\): pass overwrite=True to replace it"):
        outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(16, 16, 3), progress=False)
    (image_folder / "owl" / "broken.png").write_bytes(b"garbage")
    with pytest.raises(ImageError, match="broken.png"):
        outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(32, 32, 3), overwrite=True, progress=False)
    np.testing.assert_array_equal(outcore.open_dataset(tmp_path / "x.zarr")["images"].compute(), before)
    assert sorted(os.listdir(tmp_path)) == ["photos", "x.zarr"]


def test_wrong_size_without_resize_names_the_file(image_folder, tmp_path):
    iio.imwrite(image_folder / "dog" / "large.png", np.zeros((50, 40, 3), dtype=np.uint8))
    with pytest.raises(ImageError, match=r"dog/large\.png: image is 50x40, expected 32x32"):
        outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(32, 32, 3), resize=None, progress=False)


def test_source_errors(tmp_path, image_folder):
    with pytest.raises(SourceError, match="does not exist"):
        outcore.ingest_images(tmp_path / "nope", tmp_path / "x.zarr", shape=(8, 8, 3))
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    (tmp_path / "empty" / "cat" / "readme.txt").write_text("no images here")
    with pytest.raises(SourceError, match="no image files"):
        outcore.ingest_images(tmp_path / "empty", tmp_path / "x.zarr", shape=(8, 8, 3))
    iio.imwrite(image_folder / "loose.png", np.zeros((32, 32, 3), dtype=np.uint8))
    with pytest.raises(SourceError, match="'loose.png'.*class folder"):
        outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=(8, 8, 3))


def test_csv_errors(tmp_path, image_folder):
    csv = tmp_path / "labels.csv"
    pd.DataFrame({"path": ["photos/cat/cat_000000.jpg", "photos/cat/missing.jpg"], "label": ["a", "b"]}).to_csv(
        csv, index=False)
    with pytest.raises(SourceError, match=r"1 of 2 files .* do not exist \(e\.g\. '.*missing\.jpg'\)"):
        outcore.ingest_dataframe(csv, tmp_path / "x.zarr", label_columns=["label"], shape=(32, 32, 3))
    ds = outcore.ingest_dataframe(csv, tmp_path / "x.zarr", label_columns=["label"], shape=(32, 32, 3),
                                  on_error="skip", progress=False)
    assert len(ds) == 1 and ds.attrs.skipped["count"] == 1 and "file not found" in ds.attrs.skipped["examples"][0]
    with pytest.raises(SourceError, match=r"column\(s\) \['klass'\] not in CSV"):
        outcore.ingest_dataframe(csv, tmp_path / "y.zarr", label_columns=["klass"], shape=(32, 32, 3))
    with pytest.raises(SourceError, match="CSV file .* does not exist"):
        outcore.ingest_dataframe(tmp_path / "nope.csv", tmp_path / "y.zarr", shape=(32, 32, 3))
    frame = pd.DataFrame({"path": ["a.jpg", None], "label": [1, 2]})
    with pytest.raises(SourceError, match="column 'path' is empty in rows 1"):
        outcore.ingest_dataframe(frame, tmp_path / "y.zarr", shape=(32, 32, 3))


def test_ten_thousand_images_make_tens_of_files(tmp_path, rng):
    root = tmp_path / "many" / "all"
    root.mkdir(parents=True)
    for i in range(10_000):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / f"{i:05d}.png")
    ds = outcore.ingest_images(tmp_path / "many", tmp_path / "many.zarr", shape=(16, 16, 3), chunk_size=64,
                               progress=False)
    assert len(ds) == 10_000 and ds.num_chunks == 157
    files = [f for _, _, names in os.walk(tmp_path / "many.zarr") for f in names]
    assert 10 <= len(files) <= 80, files  # 6 fields x 10 shard files + metadata, not 6 x 157 chunk files


@pytest.mark.parametrize("images", ["encoded", "pixels"])
def test_the_write_tasks_are_made_without_culling_the_graph_once_a_shard(tmp_path, monkeypatch, images):
    """Dask culls the whole graph of a collection met inside a task's argument (a dict of a shard's blocks): made
    so, the write tasks cost shards x the graph's tasks of the one thread making them: quadratic in the files.
    A shard's blocks are the task's own arguments: the graph is culled when computed only."""
    write_image_folder(tmp_path / "photos", 20, classes=("a", "b"), size=(20, 16), kind="photos", seed=1)
    culls, shards = [0], [0]
    cull, write = HighLevelGraph.cull, build._write_shard

    def counted_cull(graph, keys):
        culls[0] += 1
        return cull(graph, keys)

    def counted_write(*args):
        shards[0] += 1
        return write(*args)

    monkeypatch.setattr(HighLevelGraph, "cull", counted_cull)
    monkeypatch.setattr(build, "_write_shard", counted_write)
    shape = None if images == "encoded" else (16, 16, 3)
    ds = outcore.ingest_images(tmp_path / "photos", tmp_path / "s.zarr", shape=shape, images=images, chunk_size=2,
                               progress=False)
    assert len(ds) == 40 and shards[0] >= 8 and culls[0] < shards[0], (culls, shards)


def test_linked_class_folders_are_followed_and_loops_end(tmp_path):
    write_image_folder(tmp_path / "elsewhere", 3, classes=("owl",), size=(16, 16))
    root = tmp_path / "photos"
    write_image_folder(root, 2, classes=("cat",), size=(16, 16))
    (root / "owl").symlink_to(tmp_path / "elsewhere" / "owl", target_is_directory=True)
    (root / "cat" / "again").symlink_to(root, target_is_directory=True)  # a loop
    with pytest.warns(outcore.OutcoreWarning, match="a folder link that leads back"):
        ds = outcore.ingest_images(root, tmp_path / "s.zarr", shape=(16, 16, 3), progress=False)
    assert ds.classes == ["cat", "owl"] and len(ds) == 5


def test_an_image_past_the_pixel_limit_is_a_bad_file(tmp_path):
    root = tmp_path / "photos"
    write_image_folder(root, 3, classes=("cat",), size=(16, 16))
    iio.imwrite(root / "cat" / "huge.png", np.zeros((3000, 3000, 3), np.uint8))  # 9 million pixels
    with pytest.raises(ImageError, match=r"huge.png: 3000x3000 is 9,000,000 pixels, more than the limit of 1,000,000"):
        outcore.ingest_images(root, tmp_path / "r.zarr", shape=(16, 16, 3), max_pixels=1_000_000, progress=False)
    ds = outcore.ingest_images(root, tmp_path / "s.zarr", shape=(16, 16, 3), max_pixels=1_000_000, on_error="skip",
                               progress=False)
    assert len(ds) == 3 and "more than the limit" in ds.attrs.skipped["examples"][0]
    assert len(outcore.ingest_images(root, tmp_path / "t.zarr", shape=(16, 16, 3), progress=False)) == 4  # default


def test_a_pixel_ingest_of_camera_and_phone_jpegs_holds_decode_images_pixels(tmp_path):
    """A folder of JPEGs in each EXIF orientation (a phone's, turned upright), greyscale and CMYK ones, a PNG, a
    damaged JPEG and one past the pixel limit, ingested as pixels (the JPEGs in outcore's C a block at a time where it
    is built): each sample the pixels `decode_image` gives its file and the file's digest hashlib's, in colour and in
    grey; the two bad files skipped and named."""
    root = tmp_path / "photos"
    (root / "cat").mkdir(parents=True)
    photo = Image.fromarray(sample_photo("astronaut")).resize((150, 100))
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        turned = photo.transpose(Image.Transpose.TRANSPOSE) if orientation >= 5 else photo
        turned.save(root / "cat" / f"exif{orientation}.jpg", quality=90, exif=exif)
    photo.convert("L").save(root / "cat" / "grey.jpg")
    photo.convert("CMYK").save(root / "cat" / "cmyk.jpg")
    photo.save(root / "cat" / "photo.png")
    (root / "cat" / "damaged.jpg").write_bytes((root / "cat" / "exif6.jpg").read_bytes()[:1500])
    photo.resize((1100, 1000)).save(root / "cat" / "huge.jpg")
    for channels in (3, 1):  # colours asked for as grey too
        store = tmp_path / f"s{channels}.zarr"
        ds = outcore.ingest_images(root, store, shape=(48, 64, channels), images="pixels", on_error="skip",
                                   max_pixels=1_000_000, progress=False)
        assert {Path(line.split(":")[0]).name for line in
                Path(f"{store}.skipped.txt").read_text().splitlines()} == {"damaged.jpg", "huge.jpg"}
        paths, images, digests = ds["path"].compute(), ds["images"].compute(), ds["file_digest"].compute()
        assert sorted(Path(path).name for path in paths) == sorted(
            [*(f"exif{k}.jpg" for k in range(1, 9)), "grey.jpg", "cmyk.jpg", "photo.png"])
        for path, pixels, digest in zip(paths, images, digests, strict=True):
            data = (root / path).read_bytes()
            expected = decode_image(data, (48, 64, channels), "crop", np.dtype("uint8"))
            np.testing.assert_array_equal(pixels, expected, err_msg=path)
            assert digest.tobytes() == hashlib.blake2b(data, digest_size=16).digest()
        assert outcore.verify(store, progress=False).ok


def test_class_folders_named_like_splits_are_refused(tmp_path):
    write_image_folder(tmp_path / "photos" / "train", 2, classes=("cat", "dog"), size=(8, 8))
    write_image_folder(tmp_path / "photos" / "val", 2, classes=("cat", "dog"), size=(8, 8))
    with pytest.raises(SourceError, match=r"named like splits \(train, val\): ingest each split into a store of its "
                                          r"own \('.*photos/train' into train.zarr and '.*photos/val' into val.zarr\)"):
        outcore.ingest_images(tmp_path / "photos", tmp_path / "x.zarr", shape=(8, 8), progress=False)
    assert not (tmp_path / "x.zarr").exists()
    write_image_folder(tmp_path / "mixed", 2, classes=("cat", "test"), size=(8, 8))
    with pytest.warns(OutcoreWarning, match="class folder named like a split \\('test'\\)"):
        ds = outcore.ingest_images(tmp_path / "mixed", tmp_path / "m.zarr", shape=(8, 8), progress=False)
    assert ds.classes == ["cat", "test"]


def test_every_ingest_path_gives_fields_the_same_roles(image_folder, tmp_path):
    values = {"images": np.zeros((8, 4, 4), np.uint8), "label": np.arange(8), "weight": np.ones(8, np.float32),
              "extra": np.arange(8)}
    expected = {"images": "input", "label": "target", "weight": "sample_weight", "extra": "other"}
    assert outcore.from_arrays(values, tmp_path / "a.zarr", progress=False).roles == {**expected,
                                                                                       "source_index": "metadata"}
    with outcore.Writer(tmp_path / "w.zarr") as writer:
        writer.append(values)
    assert outcore.open_dataset(tmp_path / "w.zarr").roles == expected
    names = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*"))
    frame = pd.DataFrame({"path": names, "label": [n[:3] for n in names], "weight": np.linspace(1, 2, len(names))})
    ds = outcore.ingest_dataframe(frame, tmp_path / "d.zarr", label_columns=["label", "weight"], root=image_folder,
                                  shape=(8, 8, 3), progress=False)
    assert ds.roles == {"images": "input", "label": "target", "weight": "sample_weight", "path": "metadata",
                        "source_index": "metadata", "file_stat": "metadata", "file_digest": "metadata"}
    assert ds["weight"].dtype == np.float32
