"""COCO annotations ingested with their pictures: boxes, categories, crowd flags, keypoints and instance maps.

The annotation file is JSON as COCO writes it, its run-length encodings made by pycocotools, the pictures by
Pillow; each instance is painted in its own colour, so a map, box or keypoint that does not lie on its picture
shows, for every fit (crop, pad, fit, the pictures' own size) and through a training transform.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import zarr
from PIL import Image
from support.optional import need

import outcore
from outcore.cli import describe
from outcore.errors import CorruptChunkError, ImageError, OptionError, SourceError
from outcore.transforms import (
    CenterCrop,
    Compose,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
    ScaleJitter,
    Targets,
    left_right_pairs,
)

COLOURS = np.array([[250, 20, 20], [20, 250, 20], [20, 20, 250], [250, 250, 20]], np.uint8)
CATEGORIES = [{"id": 7, "name": "zebra"}, {"id": 1, "name": "person", "keypoints": ["left_eye", "right_eye"]},
              {"id": 3, "name": "car"}]


def _coco(root, count: int = 14, size: tuple[int, int] | None = None, seed: int = 0) -> list[dict]:
    """``count`` PNG pictures (of ``size``, or varied) of up to 4 rectangular instances each, painted in
    `COLOURS` (the instance's index), as polygons, the last of some as a crowd's run-length encoding; persons have
    a keypoint at their centre (visible) and one unlabelled. Returns the annotations per picture."""
    mask_api = need("pycocotools.mask")
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    images, annotations, per_picture = [], [], []
    for picture in range(count):
        height, width = size or (int(rng.integers(40, 90)), int(rng.integers(40, 90)))
        pixels = np.zeros((height, width, 3), np.uint8)
        found = []
        for k in range(int(rng.integers(0, 5)) if picture else 0):
            x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
            x1, y1 = int(rng.integers(x0 + 4, min(width, x0 + 40) + 1)), int(rng.integers(y0 + 4, min(height, y0 + 40) + 1))
            pixels[y0:y1, x0:x1] = COLOURS[k]
            category = CATEGORIES[int(rng.integers(0, 3))]["id"]
            annotation = {"id": len(annotations) + 1, "image_id": 100 + picture, "category_id": category,
                          "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0,
                          "segmentation": [[x0, y0, x1 - 1, y0, x1 - 1, y1 - 1, x0, y1 - 1]]}
            if k == 3:  # a crowd, by its run-length encoding
                mask = np.zeros((height, width), np.uint8, order="F")
                mask[y0:y1, x0:x1] = 1
                rle = mask_api.encode(np.asfortranarray(mask))
                annotation.update(iscrowd=1, segmentation={"size": rle["size"], "counts": rle["counts"].decode()})
            if category == 1:
                annotation["keypoints"] = [(x0 + x1) / 2, (y0 + y1) / 2, 2, 0, 0, 0]
            annotations.append(annotation)
            found.append(annotation)
        Image.fromarray(pixels).save(root / f"{picture:03}.png")
        images.append({"id": 100 + picture, "file_name": f"{picture:03}.png", "height": height, "width": width})
        per_picture.append(found)
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                     "categories": CATEGORIES}))
    return per_picture


def _stored(ds):
    """Each stored picture's pixels, instance map, boxes, labels, crowd flags and keypoints, with its file name."""
    paths = ds["path"].compute()
    return [(str(paths[i]), ds["images"][i].compute(), ds["masks"][i].compute(), ds["boxes"][i].compute(),
             ds["labels"][i].compute(), ds["iscrowd"][i].compute(), ds["keypoints"][i].compute()) for i in range(len(ds))]


@pytest.mark.parametrize("resize", ["pad", "fit", "crop"])
def test_every_target_lies_on_its_picture_after_the_fit(tmp_path, resize):
    per_picture = _coco(tmp_path / "coco")
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=(48, 56, 3),
                             resize=resize, images="pixels", progress=False)
    assert ds.classes == ["person", "car", "zebra"]  # categories sorted by id
    assert ds.info("keypoints").points == ("left_eye", "right_eye")  # the person's, as the file names them
    assert ds.info("boxes").is_ragged and ds["masks"].dtype == np.uint16 and ds.info("keypoints").sample_shape == (2, 3)
    total = 0
    for name, pixels, ids, boxes, labels, crowd, points in _stored(ds):
        source = per_picture[int(name[:3])]
        if resize != "crop":  # nothing is cut away: every instance, in order
            names = {c["id"]: c["name"] for c in CATEGORIES}
            assert [ds.classes[label] for label in labels] == [names[a["category_id"]] for a in source]
            assert crowd.tolist() == [a["iscrowd"] for a in source]
        assert len(boxes) == len(labels) == len(crowd) == len(points) and set(np.unique(ids)) <= set(range(len(boxes) + 1))
        ys, xs = np.mgrid[0:48, 0:56] + 0.5
        for k, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
            mine = ids == k + 1
            total += 1
            if not mine.any():
                continue
            scale = 56 / 20  # the most an edge pixel of the source is magnified (pictures are at least 40 wide)
            assert (mine <= ((xs > x0 - scale) & (xs < x1 + scale) & (ys > y0 - scale) & (ys < y1 + scale))).all()
            if resize != "crop":
                inner = mine.copy()  # two pixels inside the instance's region: the bilinear picture is flat there
                for shift in (1, 2):
                    for axis in (0, 1):
                        inner &= np.roll(mine, shift, axis) & np.roll(mine, -shift, axis)
                assert (np.abs(pixels[inner].astype(int) - COLOURS[k]) <= 3).all()  # the map lies on its colour
            x, y, visible = points[k, 0]
            if visible:
                assert x0 <= x <= x1 and y0 <= y <= y1
            assert points[k, 1].tolist() == [0, 0, 0]
    assert total > 10


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools' decode, numpy 2
def test_a_crowds_run_length_encoding_is_drawn_exactly_as_pycocotools_decodes_it(tmp_path):
    mask_api = need("pycocotools.mask")
    per_picture = _coco(tmp_path / "coco", count=30, size=(48, 64), seed=1)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=(48, 64, 3),
                             images="encoded", shuffle_on_write=False, progress=False)
    crowds = 0
    for picture, found in enumerate(per_picture):
        ids = ds["masks"][picture].compute()
        for k, annotation in enumerate(found):
            if annotation["iscrowd"]:  # the last instance: nothing drawn over it
                expected = mask_api.decode({"size": [48, 64], "counts": annotation["segmentation"]["counts"]})
                np.testing.assert_array_equal(ids == k + 1, expected.astype(bool))
                crowds += 1
            else:
                x, y, w, h = annotation["bbox"]  # a polygon of the box's pixels: Pillow fills them all
                assert (ids[y : y + h, x : x + w] >= k + 1).all()
    assert crowds >= 2


@pytest.mark.parametrize("shape", [(64, 64, 3), None], ids=["fitted", "own-size"])
def test_a_training_transform_moves_boxes_keypoints_and_maps_together(tmp_path, shape):
    _coco(tmp_path / "coco", count=24)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=shape,
                             resize="pad", images="encoded", chunk_size=8, progress=False)
    assert ds.info("masks").is_raster == (shape is None)
    targets = Targets(label_maps=("masks",), boxes="boxes", keypoints="keypoints", instances=("labels", "iscrowd"),
                      flip_pairs=left_right_pairs(ds.info("keypoints").points))
    assert targets.flip_pairs == ((0, 1),)
    transform = Compose([RandomResizedCrop((48, 48), scale=(0.3, 1.0), targets=targets), RandomFlip(targets=targets)])
    seen = 0
    for batch in ds.batches(batch_size=8, seed=5, transform=transform):
        offsets = batch["boxes_offsets"]
        for i in range(len(batch["images"])):
            for row in range(offsets[i], offsets[i + 1]):
                x0, y0, x1, y1 = batch["boxes"][row]
                ys, xs = np.nonzero(batch["masks"][i] == batch["boxes_kept"][row] + 1)
                if len(xs):  # within a pixel and a half of its moved box (the map's pixels, magnified)
                    assert xs.min() + 0.5 > x0 - 2.5 and xs.max() + 0.5 < x1 + 2.5
                    assert ys.min() + 0.5 > y0 - 2.5 and ys.max() + 0.5 < y1 + 2.5
                seen += 1
        assert len(batch["labels"]) == len(batch["iscrowd"]) == len(batch["keypoints"]) == offsets[-1]
    assert seen > 5


def test_pictures_kept_at_their_own_size_keep_their_boxes_where_the_file_says(tmp_path):
    per_picture = _coco(tmp_path / "coco", count=10, seed=2)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, masks=False,
                             shuffle_on_write=False, progress=False)
    assert "masks" not in ds.fields
    for picture, found in enumerate(per_picture):
        expected = [[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in found)]
        assert ds["boxes"][picture].compute().tolist() == expected


def _painted(pixels: np.ndarray) -> np.ndarray:
    """The instance id each pixel's colour says: k + 1 for `COLOURS`[k], 0 for black."""
    ids = np.zeros(pixels.shape[:-1], np.int64)
    for k, colour in enumerate(COLOURS):
        ids[(pixels == colour).all(axis=-1)] = k + 1
    return ids


def test_instance_maps_of_pictures_kept_at_their_own_size_are_stored_and_cut_with_them_pixel_for_pixel(tmp_path):
    """The maps are drawn at each picture's own size, stored as a raster field, and cut by the windows the
    pictures are cut by as the batch is made: a window copies pixels exactly, so each map id must lie on its
    instance's colour everywhere, the padding on both sides included."""
    per_picture = _coco(tmp_path / "coco", count=16, seed=6)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, chunk_size=4,
                             shuffle_on_write=False, progress=False)
    assert ds.info("masks").is_raster and ds.info("masks").sample_shape == ()
    assert "uint16 (own sizes)" in repr(ds) and outcore.verify(ds.location, progress=False).ok
    assert "points of 'keypoints' (2): left_eye, right_eye" in describe(ds)
    for picture, found in enumerate(per_picture):
        pixels, ids = ds["images"][picture].compute(), ds["masks"][picture].compute()
        assert ids.shape == pixels.shape[:2] and ids.dtype == np.uint16
        np.testing.assert_array_equal(ids, _painted(pixels))  # every instance's pixels, later ones over earlier
        assert int(ids.max(initial=0)) == len(found)
    targets = Targets(label_maps=("masks",), boxes="boxes", instances=("labels",), fill=255)
    transform = Compose([RandomCrop(36, padding=6, targets=targets), RandomFlip(targets=targets, vertical=True)])
    padded = flipped = 0
    for seed in (1, 2):
        for batch in ds.batches(batch_size=6, seed=seed, transform=transform):
            masks, images = batch["masks"], batch["images"]
            assert masks.shape == images.shape[:3] == (len(images), 36, 36)
            outside = masks == 255
            assert (images[outside] == 0).all()
            np.testing.assert_array_equal(np.where(outside, 0, masks), _painted(images))
            padded += int(outside.any(axis=(1, 2)).sum())
            flipped += len(images)
    assert padded > 4 and flipped == 32


@pytest.mark.parametrize("geometry", ["resized crop + flips", "padded crop + flip", "centre of resized",
                                      "scale jitter + flip"])
def test_maps_at_their_pictures_own_size_are_cut_exactly_as_maps_of_one_size(tmp_path, geometry):
    """Pictures all of one size, stored once fitted (maps of one size, moved after the crop: proven aligned in
    tests/test_targets.py by boxes rasterised into the maps) and once at their own size (raster maps, cut as the
    batch is made): the same draws give the same batches, byte for byte."""
    _coco(tmp_path / "coco", count=20, size=(37, 53), seed=9)
    stores = [outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / f"{name}.zarr", shape=shape,
                                  images="encoded", chunk_size=4, shuffle_on_write=False, progress=False)
              for name, shape in (("fitted", (37, 53, 3)), ("own", None))]
    assert [ds.info("masks").is_raster for ds in stores] == [False, True]
    targets = Targets(label_maps=("masks",), boxes="boxes", keypoints="keypoints", instances=("labels",), fill=77)
    head = {"resized crop + flips": RandomResizedCrop((29, 23), scale=(0.1, 1.0), targets=targets),
            "padded crop + flip": RandomCrop((31, 45), padding=7, targets=targets),
            "centre of resized": CenterCrop(30, resize=41, targets=targets),
            "scale jitter + flip": ScaleJitter((40, 36), scale=(0.3, 2.0), targets=targets)}[geometry]
    transform = Compose([head, RandomFlip(vertical=True, targets=targets)])
    fitted, own = ([batch for batch in ds.batches(6, seed=4, transform=transform)] for ds in stores)
    assert len(fitted) == len(own) == 4
    for a, b in zip(fitted, own, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert sum(int((batch["masks"] > 0).sum()) for batch in own) > 100


def test_dataloader_workers_cut_maps_of_pictures_kept_at_their_own_size_as_the_main_process_does(tmp_path):
    need("torch")
    _coco(tmp_path / "coco", count=20, seed=8)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, chunk_size=4,
                             progress=False)
    targets = Targets(label_maps=("masks",), boxes="boxes", instances=("labels",))
    transform = Compose([RandomResizedCrop(24, scale=(0.3, 1.0), targets=targets), RandomFlip(targets=targets)])

    def epoch(workers):
        loader = ds.torch(5, num_workers=workers, seed=3, transform=transform,
                          fields=["images", "masks", "boxes", "labels"])
        return [{name: value.numpy() for name, value in batch.items()} for batch in loader]

    expected = epoch(0)
    assert len(expected) == 4 and expected[0]["masks"].shape == (5, 24, 24)
    for got, want in zip(epoch(2), expected, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_tf_data_and_keras_take_maps_of_pictures_kept_at_their_own_size_cut_with_them(tmp_path):
    need("tensorflow")
    _coco(tmp_path / "coco", count=12, seed=10)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, progress=False)
    targets = Targets(label_maps=("masks",))
    transform = Compose([RandomResizedCrop(24, targets=targets), RandomFlip(targets=targets)])
    data = ds.tf(4, x="images", y="masks", transform=transform, drop_last=True)
    assert data.element_spec[1].shape.as_list() == [4, 24, 24]
    pictures, masks = next(iter(data))
    assert pictures.shape == (4, 24, 24, 3) and masks.dtype.name == "uint16"
    x, y = next(iter(ds.keras(4, x="images", y="masks", transform=transform)))
    assert x.shape == (4, 24, 24, 3) and y.shape == (4, 24, 24)


def test_every_rank_and_a_resume_cut_each_pictures_raster_alike(tmp_path):
    _coco(tmp_path / "coco", count=30, seed=12)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, chunk_size=4,
                             progress=False)
    targets = Targets(label_maps=("masks",))
    transform = Compose([RandomResizedCrop((15, 17), targets=targets), RandomFlip(vertical=True, targets=targets)])
    options = {"seed": 4, "transform": transform, "fields": ["images", "masks", "source_index"]}

    def masks(batches) -> dict[int, bytes]:
        return {int(i): mask.tobytes() + picture.tobytes() for batch in batches
                for i, mask, picture in zip(batch["source_index"], batch["masks"], batch["images"], strict=True)}

    one = masks(ds.batches(6, **options))
    assert len(one) == 30 and len(set(one.values())) > 15  # crops of black alone look alike
    two = {**masks(ds.batches(3, rank=0, world_size=2, **options)),
           **masks(ds.batches(3, rank=1, world_size=2, **options))}
    assert two == one
    first = ds.batches(6, **options)
    seen = masks(batch for _, batch in zip(range(2), first))
    resumed = ds.batches(6, **options)
    resumed.load_state_dict(first.state_dict())
    assert {**seen, **masks(resumed)} == one


def test_a_mixture_of_stores_at_their_pictures_own_sizes_cuts_each_ones_rasters(tmp_path):
    stores = {}
    for name, seed in (("a", 13), ("b", 14)):
        _coco(tmp_path / name, count=8, seed=seed)
        stores[name] = outcore.ingest_coco(tmp_path / name / "instances.json", tmp_path / f"{name}.zarr", shape=None,
                                           chunk_size=4, progress=False)
    targets = Targets(label_maps=("masks",), boxes="boxes", instances=("labels",))
    transform = Compose([RandomCrop(30, padding=3, targets=targets), RandomFlip(targets=targets)])
    mixture = outcore.mix(stores, weights={"a": 0.5, "b": 0.5})
    batches = list(mixture.batches(4, seed=2, transform=transform, fields=["images", "masks", "boxes", "labels"]))
    assert len(batches) == 4
    for batch in batches:
        assert batch["masks"].shape == (4, 30, 30) and batch["boxes_offsets"][-1] == len(batch["labels"])
        np.testing.assert_array_equal(batch["masks"], _painted(batch["images"]))  # windows: each id on its colour


def test_a_raster_whose_shape_its_pixels_do_not_fill_is_named_by_verify_and_by_the_batches(tmp_path):
    _coco(tmp_path / "coco", count=6, seed=11)
    outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, chunk_size=4,
                        shuffle_on_write=False, progress=False)
    shapes = zarr.open_array(tmp_path / "s.zarr" / "masks_shapes", mode="r+")
    wrong = shapes[5]
    shapes[5] = [wrong[0] + 1, wrong[1], wrong[2]]  # one row more than its pixels
    report = outcore.verify(tmp_path / "s.zarr", progress=False)
    assert len(report.problems) == 1
    assert re.search(r"field 'masks', sample 5 \(chunk 1\) holds \d+ pixels, but its shape says \d+ x \d+", report.problems[0])
    transform = RandomResizedCrop(16, targets=Targets(label_maps=("masks",)))
    with pytest.raises(CorruptChunkError, match="field 'masks', sample 5 .chunk 1."):
        list(outcore.open_dataset(tmp_path / "s.zarr").batches(2, fields=["images", "masks"], transform=transform))


def test_maps_of_their_pictures_own_sizes_go_only_with_a_crop_that_moves_them(tmp_path):
    _coco(tmp_path / "coco", count=4, seed=7)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, progress=False)
    with pytest.raises(OptionError, match="field 'masks' of .* holds maps of their pictures' own sizes: .*targets="):
        ds.batches(2, fields=["images", "masks"], transform=RandomResizedCrop(24))
    with pytest.raises(OptionError, match="field 'masks' .* own sizes"):
        ds.batches(2, fields=["masks"])
    batch = next(iter(ds.batches(2, fields=["images", "masks"], transform=RandomResizedCrop(
        24, targets=Targets(label_maps=("masks",))))))
    assert batch["masks"].shape == (2, 24, 24)


def test_annotations_that_do_not_fit_their_pictures_are_refused_by_name(tmp_path):
    _coco(tmp_path / "coco", count=3, seed=3)
    document = json.loads((tmp_path / "coco" / "instances.json").read_text())
    document["images"][1]["width"] += 1
    (tmp_path / "coco" / "wrong.json").write_text(json.dumps(document))
    with pytest.raises(ImageError, match=r"001.png: annotated as \d+x\d+, its picture .*001.png is"):
        outcore.ingest_coco(tmp_path / "coco" / "wrong.json", tmp_path / "s.zarr", shape=(32, 32, 3), progress=False)
    document["images"][1]["width"] -= 1
    document["annotations"].append({**document["annotations"][0], "category_id": 99})
    (tmp_path / "coco" / "unknown.json").write_text(json.dumps(document))
    with pytest.raises(SourceError, match="categories \\[99\\] that the file does not list"):
        outcore.ingest_coco(tmp_path / "coco" / "unknown.json", tmp_path / "t.zarr", shape=(32, 32, 3))
    document["annotations"][-1] = {**document["annotations"][0], "image_id": 999}
    (tmp_path / "coco" / "orphan.json").write_text(json.dumps(document))
    with pytest.raises(SourceError, match="annotations name images \\[999\\] that the file does not list"):
        outcore.ingest_coco(tmp_path / "coco" / "orphan.json", tmp_path / "t.zarr", shape=(32, 32, 3))
    document["annotations"].pop()
    document["images"][2]["file_name"] = "gone.png"
    (tmp_path / "coco" / "gone.json").write_text(json.dumps(document))
    with pytest.raises(SourceError, match="1 of 3 files .* do not exist"):
        outcore.ingest_coco(tmp_path / "coco" / "gone.json", tmp_path / "u.zarr", shape=(32, 32, 3))
    broken = json.loads((tmp_path / "coco" / "instances.json").read_text())
    broken["annotations"] = [{"id": 5, "image_id": 101, "category_id": 7}]  # no bbox
    (tmp_path / "coco" / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(SourceError, match=r"broken.json: an image, annotation or category is not as COCO writes it "
                                          r"\(no 'bbox'\)"):
        outcore.ingest_coco(tmp_path / "coco" / "broken.json", tmp_path / "w.zarr", shape=(32, 32, 3))
    broken["annotations"] = [{"id": 5, "image_id": 101, "category_id": 1, "bbox": [1, 1, 4, 4],
                              "keypoints": [1, 1, 2] * 3}]  # persons have 2
    (tmp_path / "coco" / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(SourceError, match="annotation 5 has 3 keypoints; its categories name 2 at most"):
        outcore.ingest_coco(tmp_path / "coco" / "broken.json", tmp_path / "w.zarr", shape=(32, 32, 3))
    with pytest.raises(SourceError, match="lacks COCO's lists"):
        (tmp_path / "coco" / "empty.json").write_text("{}")
        outcore.ingest_coco(tmp_path / "coco" / "empty.json", tmp_path / "v.zarr", shape=(32, 32, 3))


def test_pictures_of_their_own_sizes_are_cropped_while_decoding_with_their_boxes(tmp_path):
    """Each picture's box drawn from its own size: the boxes move by it (a box's middle stays on its colour)."""
    _coco(tmp_path / "coco", count=20, seed=4)
    ds = outcore.ingest_coco(tmp_path / "coco" / "instances.json", tmp_path / "s.zarr", shape=None, masks=False,
                             progress=False)
    targets = Targets(boxes="boxes", keypoints="keypoints", instances=("labels", "iscrowd"))
    transform = Compose([RandomResizedCrop((32, 32), scale=(0.5, 1.0), targets=targets), RandomFlip(targets=targets)])
    checked = 0
    for batch in ds.batches(batch_size=5, seed=3, transform=transform):
        offsets = batch["boxes_offsets"]
        for i in range(len(batch["images"])):
            for row in range(offsets[i], offsets[i + 1]):
                x0, y0, x1, y1 = batch["boxes"][row]
                assert 0 <= x0 < x1 <= 32 and 0 <= y0 < y1 <= 32
                if min(x1 - x0, y1 - y0) >= 4:  # large enough that its middle pixel is inside it, away from its edges
                    middle = batch["images"][i, int((y0 + y1) / 2), int((x0 + x1) / 2)].astype(int)
                    assert (np.abs(middle - COLOURS).max(axis=1) < 60).any()  # one of the instances' colours
                    checked += 1
    assert checked > 5
