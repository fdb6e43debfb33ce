"""Encoded fields of pictures kept at their own size (``shape=None``), capped by ``max_side``, cropped
while decoding."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simplejpeg
import zarr
from PIL import Image
from support.optional import need
from support.pictures import write_mixed_pictures

import outcore
from outcore import transforms
from outcore.cli import main
from outcore.errors import OptionError, SourceError, StorageError
from outcore.imaging import decode_image, native, resize_boxes
from outcore.ingest import decode_tasks
from outcore.ingest import images as images_module
from outcore.ingest import survey as survey_module
from outcore.ingest.decode_tasks import FILES, path_block
from outcore.ingest.records.reader import SampleReader
from outcore.ingest.survey import SurveyOptions, _survey_block
from outcore.iterate.batch import batch_draws, transform_generator
from outcore.storage.report import stored_shapes


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    root = tmp_path_factory.mktemp("variable") / "src"
    return root, write_mixed_pictures(root)


@pytest.fixture(scope="module")
def store(pictures, tmp_path_factory):
    root, _ = pictures
    return outcore.ingest_images(root, tmp_path_factory.mktemp("stores") / "own.zarr", shape=None, images="encoded",
                                 chunk_size=4, progress=False)


def _decoded(data: bytes) -> np.ndarray:
    return decode_image(data, (None, None, 3), None, np.dtype("uint8"))


def test_each_picture_keeps_its_bytes_and_its_upright_shape(pictures, store):
    root, sizes = pictures
    group = zarr.open_group(store.location, mode="r")
    shapes, ranges = group["images_shapes"][:], group["images_ranges"][:]
    for i, name in enumerate(store["path"].compute()):
        start, stop = ranges[i]
        assert group["images"][start:stop].tobytes() == (root / name).read_bytes(), name
        assert tuple(shapes[i]) == (*sizes[name], 3), name
        picture = store["images"][i].compute()
        np.testing.assert_array_equal(picture, _decoded((root / name).read_bytes()), err_msg=name)
    assert store.info("images").decode.shape == (None, None, 3)
    assert store["images"].shape == (16,) and store["images"].dtype == object
    assert "(16, 37..120, 45..100, 3)" in repr(store) and "own sizes" in repr(store)
    assert "16x37..120x45..100x3" in outcore.cli.describe(store)
    np.testing.assert_array_equal(stored_shapes(store, "images"), shapes)  # read chunk by chunk, 4 of them
    assert outcore.verify(store.location, progress=False).ok


def test_random_resized_crop_is_drawn_from_each_pictures_size_and_cut_while_decoding(pictures, store):
    root, _ = pictures
    crop = transforms.RandomResizedCrop(24, scale=(0.3, 1.0))
    options = {"seed": 3, "buffer_chunks": 2, "transform": transforms.Compose([crop, transforms.RandomFlip()])}
    batches = list(store.batches(5, **options))
    again = list(store.batches(5, **options))
    assert [b["images"].shape for b in batches] == [(5, 24, 24, 3)] * 3 + [(1, 24, 24, 3)]
    for a, b in zip(batches, again, strict=True):
        np.testing.assert_array_equal(a["images"], b["images"])
    assert sorted(np.concatenate([b["source_index"] for b in batches]).tolist()) == list(range(16))
    # the same boxes cut from each decoded picture: one resize instead of a DCT-scaled decode and one resize
    iterator = store.batches(5, seed=3, buffer_chunks=2, transform=crop)
    first = next(iter(iterator))
    pictures = [_decoded((root / path).read_bytes()) for path in first["path"]]
    sizes, boxes = [p.shape[:2] for p in pictures], []
    for count, key in batch_draws(3, 0, 0, iterator.plan(0).pieces(0)):  # each piece's boxes from its generator
        boxes += crop.boxes(sizes[len(boxes) : len(boxes) + count], transform_generator(key))
    for i, path in enumerate(first["path"]):
        expected = resize_boxes(pictures[i][None], [boxes[i]], (24, 24))[0]
        difference = np.abs(first["images"][i].astype(int) - expected.astype(int)).mean()
        assert difference < 5, (path, difference)  # DCT-scaled decoding differs a little from a full one


def test_random_crop_windows_are_drawn_from_each_pictures_size_and_cut_exactly_while_decoding(pictures, store):
    """Windows past the edges (the padding) are zeros there, mirrored with the window: every picture, JPEG,
    greyscale, EXIF-rotated and PNG alike, is its decoded pixels padded, cut and mirrored."""
    root, _ = pictures
    crop, flip = transforms.RandomCrop(40, padding=6), transforms.RandomFlip(vertical=True)
    iterator = store.batches(16, seed=5, transform=transforms.Compose([crop, flip]))
    batch = next(iter(iterator))
    assert batch["images"].shape == (16, 40, 40, 3)
    pictures = [_decoded((root / path).read_bytes()) for path in batch["path"]]
    boxes, flips = [], []
    for count, key in batch_draws(5, 0, 0, iterator.plan(0).pieces(0)):  # each piece: its boxes, then its flips
        rng = transform_generator(key)
        boxes += crop.boxes([p.shape[:2] for p in pictures[len(boxes) : len(boxes) + count]], rng).tolist()
        flips += flip.draw(count, rng).tolist()
    padded_somewhere = 0
    for i, (top, left, height, width) in enumerate(boxes):
        padded = np.pad(pictures[i], [(6, 6), (6, 6), (0, 0)])
        window = padded[top + 6 : top + 6 + height, left + 6 : left + 6 + width]
        expected = window[:: -1 if flips[i][1] else 1, :: -1 if flips[i][0] else 1]
        np.testing.assert_array_equal(batch["images"][i], expected, err_msg=batch["path"][i])
        padded_somewhere += not (0 <= top <= pictures[i].shape[0] - 40 and 0 <= left <= pictures[i].shape[1] - 40)
    assert padded_somewhere and any(left_right for left_right, _ in flips) and any(bottom for _, bottom in flips)


@pytest.mark.parametrize("crop", [transforms.RandomCrop(50), transforms.CenterCrop(50)])
def test_a_crop_larger_than_a_picture_names_the_picture(store, crop):
    with pytest.raises(OptionError, match=r"field 'images', sample (\d+) \(chunk (\d+)\): .*50x50") as raised:
        list(store.batches(16, shuffle=False, transform=crop))
    sample, chunk = map(int, re.search(r"sample (\d+) \(chunk (\d+)\)", str(raised.value)).groups())
    height, width = _shapes(store)[sample][:2]
    assert chunk == sample // 4 and min(height, width) < 50 and f"{height}x{width}" in str(raised.value)


def _shapes(store) -> list[tuple[int, ...]]:
    return [tuple(shape) for shape in zarr.open_group(store.location, mode="r")["images_shapes"][:].tolist()]


@pytest.mark.parametrize("crop", [transforms.RandomResizedCrop(24, scale=(0.3, 1.0)), transforms.RandomCrop(40, padding=4)])
def test_crops_cut_while_decoding_are_the_same_on_any_number_of_ranks(store, crop):
    crop = transforms.Compose([crop, transforms.RandomFlip()])

    def steps(world_size):
        ranks = [list(store.batches(8 // world_size, seed=3, transform=crop, rank=r, world_size=world_size))
                 for r in range(world_size)]
        return [{int(i): image.tobytes() for b in batches for i, image in zip(b["source_index"], b["images"],
                                                                              strict=True)}
                for batches in zip(*ranks, strict=True)]

    one = steps(1)
    assert [len(step) for step in one] == [8, 8]
    assert steps(2) == one and steps(4) == one


def test_center_crop_after_resizing_the_shorter_side(pictures, store):
    root, _ = pictures
    batch = next(iter(store.batches(16, shuffle=False, transform=transforms.CenterCrop(24, resize=28))))
    for i, path in enumerate(batch["path"]):
        picture = Image.fromarray(_decoded((root / path).read_bytes()))
        short, long = sorted(picture.size)  # torchvision's Resize(28): the longer side truncated
        size = (28, int(28 * long / short)) if picture.size[0] == short else (int(28 * long / short), 28)
        resized = picture.resize(size, Image.BILINEAR)
        left, top = round((resized.size[0] - 24) / 2), round((resized.size[1] - 24) / 2)
        expected = np.asarray(resized.crop((left, top, left + 24, top + 24)))
        assert np.abs(batch["images"][i].astype(int) - expected.astype(int)).mean() < 6, path


def test_batches_without_a_crop_are_refused_with_what_to_do(store):
    with pytest.raises(OptionError, match="varying sizes.*RandomResizedCrop"):
        store.batches(4)
    with pytest.raises(OptionError, match="varying sizes"):
        store.batches(4, transform=transforms.Compose([transforms.RandomFlip(), transforms.RandomResizedCrop(8)]))
    labels = next(iter(store.batches(4, fields=["labels"], shuffle=False)))["labels"]
    assert labels.shape == (4,)


def test_a_file_that_does_not_match_its_stored_shape_is_named(pictures, store, tmp_path):
    root, _ = pictures
    copy = outcore.ingest_images(root, tmp_path / "copy.zarr", shape=None, images="encoded", chunk_size=4,
                                 progress=False)
    shapes = zarr.open_group(copy.location, mode="r+")["images_shapes"]
    shapes[5] = [shapes[5][0] + 1, shapes[5][1], 3]
    report = outcore.verify(copy.location, progress=False)
    assert not report.ok and "sample 5 (chunk 1)" in report.problems[0] and "stored shape" in report.problems[0]
    damaged = outcore.open_dataset(copy.location)
    with pytest.raises(outcore.errors.SampleDecodeError, match="sample 5 .*stored shape"):
        list(damaged.batches(16, shuffle=False, transform=transforms.RandomResizedCrop(8)))


def test_a_survey_saved_for_a_resume_is_read_back_as_it_was_made_and_as_an_earlier_version_saved_it(pictures,
                                                                                                        tmp_path,
                                                                                                        monkeypatch):
    """An interrupted ingest's survey is saved in its scratch folder; the resumed run reads it back instead of
    surveying again: the same paths (one of them not UTF-8, as Linux allows) and arrays, and a survey saved by an
    earlier version (its paths an array of strings) alike. One of another number of files is refused, named."""
    root, _ = pictures
    odd = tmp_path / "pictures" / "\udcff.jpg"  # the byte 0xff in the file's name
    odd.parent.mkdir()
    shutil.copy(root / "a" / "0.jpg", odd)
    paths = [*sorted(str(path) for path in root.rglob("*.jpg"))[:6], str(odd)]
    options = SurveyOptions(3, np.dtype("uint8"), None, 90)
    made = survey_module.survey_images(paths, options, tmp_path / "scratch", progress=False)
    saved = tmp_path / "scratch" / "survey.npz"
    assert made.paths == paths and saved.exists()

    def not_surveyed_again(*args, **kwargs):
        raise AssertionError("surveyed again")

    monkeypatch.setattr(survey_module, "_survey_block", not_surveyed_again)
    for earlier in (False, True):
        if earlier:
            with np.load(saved) as arrays:
                kept = {name: arrays[name] for name in arrays.files}
            np.savez(saved, **{**kept, "paths": np.array(paths, dtype=str)})
        with np.load(saved) as stored:
            assert stored["paths"].dtype.kind == ("U" if earlier else "u")  # this version's: UTF-8 bytes
        again = survey_module.survey_images(paths, options, tmp_path / "scratch", progress=False)
        assert again.paths == paths
        for name in ("shapes", "nbytes", "errors", "digests", "orientations"):
            np.testing.assert_array_equal(getattr(again, name), getattr(made, name))
    with pytest.raises(StorageError, match=r"survey\.npz holds a survey of 7 paths and 7 shapes where this run has 6 "
                                           "files: it is not this run's survey; remove it"):
        survey_module.survey_images(paths[:6], options, tmp_path / "scratch", progress=False)


@pytest.mark.parametrize("max_side", [None, 100])
def test_the_survey_is_the_same_with_the_c_extensions_check_and_without(pictures, tmp_path, monkeypatch, max_side):
    """A block of every kind of file (plain, grey, turned by EXIF, PNG), a damaged JPEG, one that is not a picture,
    one past ``max_pixels`` and one missing, surveyed three ways: the files read, digested and checked by the C
    extension (`plain_jpeg_files`), the files read by a reader of the caller's and their plain JPEGs checked by it
    (`plain_jpeg_sizes`, a group of files at a time), and without it: the same shapes, sizes, digests,
    orientations, errors and smaller copies, the digests those of hashlib's BLAKE2b."""
    root, sizes = pictures
    good = sorted(str(root / name) for name in sizes)
    broken = {"cut.jpg": (root / "a" / "0.jpg").read_bytes()[:400], "text.jpg": b"not a picture",
              "large.jpg": simplejpeg.encode_jpeg(np.zeros((400, 400, 3), np.uint8)), "missing.jpg": None}
    for name, data in broken.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
    block = path_block([*good, *(str(tmp_path / name) for name in broken)], 0, len(good) + len(broken))
    options = SurveyOptions(3, np.dtype("uint8"), max_side, 90, on_error="skip", max_pixels=150_000)
    monkeypatch.setattr(survey_module, "GROUP_BYTES", 5_000)  # a few files a group: the block read in several

    class OwnReader(SampleReader):  # a reader of the caller's: the survey reads through it, not in C
        pass

    def survey(scratch, reader):
        scratch.mkdir()
        paths, *arrays = _survey_block(block, 0, options, str(scratch), reader)
        return [Path(p).read_bytes() if p else b"" for p in paths], arrays

    in_c = survey(tmp_path / "in_c", FILES)
    by_reader = survey(tmp_path / "by_reader", OwnReader())
    monkeypatch.setattr(native, "extension", None)
    files, arrays = survey(tmp_path / "python", FILES)
    for checked in (in_c, by_reader):
        assert checked[0] == files
        for mine, theirs in zip(checked[1], arrays, strict=True):
            np.testing.assert_array_equal(mine, theirs)
    shapes, nbytes, errors, digests, orientations = arrays
    assert not shapes[len(good) :].any()
    assert [bool(e) for e in errors.tolist()] == [False] * len(good) + [True] * 4
    assert "150,000" in errors[-2] and "file not found" in errors[-1]
    assert [hashlib.blake2b(Path(p).read_bytes(), digest_size=16).digest() for p in good] == \
        [row.tobytes() for row in digests[: len(good)]]
    assert not digests[len(good) :].any() and not nbytes[len(good) :].any() and not orientations[len(good) :].any()


@pytest.mark.parametrize("at_once", [True, False])
@pytest.mark.parametrize("change", ["grown", "removed"])
def test_a_file_changed_after_the_survey_stops_the_ingest_naming_it(pictures, tmp_path, monkeypatch, change, at_once):
    """Between the survey and the writes a file grows or goes: the write task that reads it again (the files of its
    shard read in one C call, `read_files_at_once`, or one by one) stops the ingest with a `SourceError` naming it."""
    root = tmp_path / "src"
    shutil.copytree(pictures[0], root)
    changed = sorted(root.rglob("*.jpg"))[3]
    surveyed = images_module.survey_images

    def survey_then_change(*args, **kwargs):
        found = surveyed(*args, **kwargs)
        if change == "grown":
            changed.write_bytes(changed.read_bytes() + b"\0")
        else:
            changed.unlink()
        return found

    monkeypatch.setattr(images_module, "survey_images", survey_then_change)
    if not at_once:
        monkeypatch.setattr(decode_tasks, "read_files_at_once", None)
    reason = "changed during the ingest" if change == "grown" else "file not found since the ingest began"
    with pytest.raises(SourceError, match=f"{re.escape(str(changed))}:? .*{reason}"):
        outcore.ingest_images(root, tmp_path / "changed.zarr", shape=None, images="encoded", progress=False)


def test_max_side_shrinks_only_the_larger_pictures(pictures, tmp_path):
    root, sizes = pictures
    ds = outcore.ingest_images(root, tmp_path / "capped.zarr", shape=None, images="encoded", max_side=64,
                               quality=92, chunk_size=4, progress=False)
    group = zarr.open_group(ds.location, mode="r")
    shapes, ranges = group["images_shapes"][:], group["images_ranges"][:]
    shrunk = 0
    for i, name in enumerate(ds["path"].compute()):
        height, width = sizes[name]
        stored = group["images"][ranges[i, 0] : ranges[i, 1]].tobytes()
        if max(height, width) <= 64:
            assert stored == (root / name).read_bytes() and tuple(shapes[i]) == (height, width, 3)
            continue
        shrunk += 1
        scale = 64 / max(height, width)
        assert tuple(shapes[i]) == (round(height * scale), round(width * scale), 3), name
        assert stored[:3] == b"\xff\xd8\xff" and Image.open(io.BytesIO(stored)).size == (shapes[i][1], shapes[i][0])
        reference = np.asarray(Image.fromarray(_decoded((root / name).read_bytes())).resize(
            (int(shapes[i][1]), int(shapes[i][0])), Image.BILINEAR))
        assert np.abs(_decoded(stored).astype(int) - reference.astype(int)).mean() < 8, name  # 4:2:0 JPEG of a tiny picture
    assert shrunk == sum(max(size) > 64 for size in sizes.values()) > 0
    assert outcore.verify(ds.location, progress=False).ok


def test_max_side_on_a_fixed_shape_store_decodes_to_that_shape(pictures, tmp_path):
    root, _ = pictures
    ds = outcore.ingest_images(root, tmp_path / "fixed.zarr", shape=(32, 32, 3), images="encoded", max_side=48,
                               progress=False)
    assert ds["images"].shape == (16, 32, 32, 3) and "images_shapes" not in zarr.open_group(ds.location, mode="r")
    assert outcore.verify(ds.location, progress=False).ok


def test_bad_files_are_skipped_and_reported_as_everywhere(pictures, tmp_path):
    root, _ = pictures
    source = tmp_path / "src"
    source.mkdir()
    for folder in root.iterdir():
        (source / folder.name).symlink_to(folder)
    (source / "c").mkdir()
    (source / "c" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a picture")
    (source / "c" / "fine.jpg").write_bytes((root / "a" / "0.jpg").read_bytes())
    with pytest.raises(outcore.errors.ImageError, match="broken.jpg.*on_error='skip'"):
        outcore.ingest_images(source, tmp_path / "raise.zarr", shape=None, images="encoded", progress=False)
    assert not (tmp_path / "raise.zarr").exists()
    ds = outcore.ingest_images(source, tmp_path / "skip.zarr", shape=None, images="encoded", max_side=50,
                               on_error="skip", progress=False)
    assert len(ds) == 17 and ds.attrs.skipped["count"] == 1
    assert "c/broken.jpg" not in set(ds["path"].compute())
    assert outcore.verify(ds.location, progress=False).ok


@pytest.mark.parametrize(("options", "message"), [
    ({"shape": None, "images": "pixels"}, "images='encoded'"),
    ({"shape": (None, None, 3), "images": "both"}, "images='encoded'"),
    ({"shape": (32, 32, 3), "max_side": 64, "images": "pixels"}, "images='encoded'"),
    ({"shape": None, "images": "encoded", "max_side": 0}, "max_side=0"),
    ({"shape": None, "images": "encoded", "max_side": 64, "quality": 101}, "quality=101"),
    ({"shape": None, "images": "encoded", "max_side": 64, "dtype": "uint16"}, "8-bit"),
])
def test_settings_that_cannot_work_are_refused_before_anything_is_read(pictures, tmp_path, options, message):
    root, _ = pictures
    with pytest.raises(OptionError, match=message):
        outcore.ingest_images(root, tmp_path / "never.zarr", progress=False, **options)
    assert not any(tmp_path.iterdir())


def test_the_command_line_ingests_pictures_at_their_own_size(pictures, tmp_path, capsys):
    root, _ = pictures
    target = tmp_path / "cli.zarr"
    assert main(["ingest", str(root), str(target), "--shape", "any", "--images", "encoded", "--max-side", "64",
                 "--no-progress"]) == 0
    assert re.search(r"16x\d+\.\.64x\d+\.\.64x3 ", capsys.readouterr().out)
    assert main(["ingest", str(root), str(tmp_path / "no.zarr"), "--shape", "any", "--images", "pixels",
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().endswith("pass --images encoded")
    assert main(["ingest", str(root), str(tmp_path / "chosen.zarr"), "--shape", "any", "--no-progress"]) == 0
    chosen = outcore.open_dataset(tmp_path / "chosen.zarr")
    assert chosen.info("images").is_image and chosen.attrs.provenance["recipe"]["images"] == "encoded"


def test_bench_reads_pictures_at_their_own_size_as_training_does(store, capsys):
    assert main(["bench", store.location, "--batch-size", "4", "--repeats", "1", "--crop", "16"]) == 0
    assert "shuffled, crop 16 + flip" in capsys.readouterr().out


CROP = transforms.Compose([transforms.RandomResizedCrop(16), transforms.Normalize()])


def test_tf_batches_of_cropped_pictures(store):
    tf_batches = store.tf(4, x="images", y="labels", transform=CROP, drop_last=True)
    assert tuple(tf_batches.element_spec[0].shape) == (4, 16, 16, 3)
    assert next(iter(tf_batches))[0].shape == (4, 16, 16, 3)


def test_torch_workers_crop_pictures_at_their_own_size(store):
    need("torch")
    loader = store.torch(4, shuffle=True, num_workers=2, transform=CROP, fields=["images", "labels"])
    assert {tuple(batch["images"].shape) for batch in loader} == {(4, 16, 16, 3)}


def test_a_table_of_paths_ingests_the_same_way_and_xarray_sees_one_picture_per_sample(pictures, store, tmp_path):
    root, sizes = pictures
    table = pd.DataFrame({"path": sorted(sizes), "label": [name.split("/")[0] for name in sorted(sizes)]})
    ds = outcore.ingest_dataframe(table, tmp_path / "table.zarr", root=root, label_columns=["label"], shape=None,
                                  images="encoded", shuffle_on_write=False, progress=False)
    for i, name in enumerate(sorted(sizes)):
        assert tuple(ds.array("images_shapes")[i]) == (*sizes[name], 3)
    view = ds.to_xarray()
    assert view["images"].dims == ("sample",) and view["images"][3].values.shape == (*sizes[sorted(sizes)[3]], 3)
