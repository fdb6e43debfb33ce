"""TensorFlow's object detection TFRecords ingested: each picture's boxes (fractions of its size) and classes.

The records are written by TensorFlow (``tf.train.Example``, ``tf.io.TFRecordWriter``) with the features of its
object detection API; each box is painted in its class's colour on its picture, so boxes that do not lie on their
picture show, at the pictures' size and fitted to another.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image
from support.optional import need

import outcore
from outcore.errors import ImageError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
COLOURS = {1: (230, 30, 30), 2: (30, 230, 30), 3: (30, 30, 230)}
NAMES = {1: "cat", 2: "dog", 3: "owl"}


def _records(path, count: int = 20, size: tuple[int, int] = (48, 64), lie: int | None = None,
             boxless: int | None = None, masks: bool = False) -> list[list]:
    """``count`` records of JPEG pictures with 0-3 boxes each (``lie``: that record says another height; ``boxless``:
    that record has no box features at all; ``masks``: each box's PNG instance mask too)."""
    tf = need("tensorflow")
    rng = np.random.default_rng(0)
    truth = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for number in range(count):
            pixels = np.zeros((*size, 3), np.uint8)
            boxes = []
            for _ in range(int(rng.integers(0, 4))):
                x0, y0 = int(rng.integers(0, size[1] - 16)), int(rng.integers(0, size[0] - 16))
                x1, y1 = x0 + int(rng.integers(12, 17)), y0 + int(rng.integers(12, 17))
                label = int(rng.integers(1, 4))
                pixels[y0:y1, x0:x1] = COLOURS[label]
                boxes.append((x0, y0, x1, y1, label))
            encoded = io.BytesIO()
            Image.fromarray(pixels).save(encoded, "JPEG", quality=95)
            height = size[0] + (number == lie)

            def floats(values):
                return tf.train.Feature(float_list=tf.train.FloatList(value=values))

            def ints(values):
                return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

            def texts(values):
                return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))

            feature = {"image/encoded": texts([encoded.getvalue()]), "image/format": texts([b"jpeg"]),
                       "image/height": ints([height]), "image/width": ints([size[1]]),
                       "image/object/bbox/xmin": floats([b[0] / size[1] for b in boxes]),
                       "image/object/bbox/ymin": floats([b[1] / height for b in boxes]),
                       "image/object/bbox/xmax": floats([b[2] / size[1] for b in boxes]),
                       "image/object/bbox/ymax": floats([b[3] / height for b in boxes]),
                       "image/object/class/label": ints([b[4] for b in boxes]),
                       "image/object/class/text": texts([NAMES[b[4]].encode() for b in boxes])}
            if masks:
                pngs = []
                for x0, y0, x1, y1, _ in boxes:
                    mask, png = np.zeros(size, np.uint8), io.BytesIO()
                    mask[y0:y1, x0:x1] = 1
                    Image.fromarray(mask).save(png, "PNG")
                    pngs.append(png.getvalue())
                feature["image/object/mask"] = texts(pngs)
            if number == boxless:
                feature = {key: value for key, value in feature.items() if not key.startswith("image/object/bbox")}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            truth.append(boxes)
    return truth


def test_boxes_and_classes_of_object_detection_records_are_stored_in_pixels(tmp_path):
    truth = _records(tmp_path / "train.tfrecord")
    ds = outcore.ingest_records(tmp_path / "train.tfrecord", tmp_path / "s.zarr", shape=(48, 64, 3),
                                format=outcore.TFRecord.object_detection(), shuffle_on_write=False, progress=False)
    assert ds.classes == ["", "cat", "dog", "owl"]  # the records' label ids, named by their class texts
    for number, boxes in enumerate(truth):
        np.testing.assert_allclose(ds["boxes"][number].compute(), np.reshape([b[:4] for b in boxes], (-1, 4)), atol=1e-4)
        assert ds["labels"][number].compute().tolist() == [b[4] for b in boxes]


def test_records_with_instance_masks_are_said_to_keep_their_boxes_without_them(tmp_path):
    truth = _records(tmp_path / "train.tfrecord", count=6, masks=True)
    with pytest.warns(outcore.OutcoreWarning, match="instance masks .image/object/mask., which outcore does not read"):
        ds = outcore.ingest_records(tmp_path / "train.tfrecord", tmp_path / "s.zarr", shape=(48, 64, 3),
                                    format=outcore.TFRecord.object_detection(), shuffle_on_write=False, progress=False)
    assert "masks" not in ds.fields
    assert [len(ds["boxes"][i].compute()) for i in range(6)] == [len(boxes) for boxes in truth]


def test_fitted_pictures_keep_their_boxes_on_their_colours(tmp_path):
    _records(tmp_path / "train.tfrecord", count=30)
    ds = outcore.ingest_records(tmp_path / "train.tfrecord", tmp_path / "s.zarr", shape=(40, 40, 3), resize="pad",
                                format=outcore.TFRecord.object_detection(), progress=False)
    checked = 0
    for number in range(len(ds)):
        picture = ds["images"][number].compute().astype(int)
        for (x0, y0, x1, y1), label in zip(ds["boxes"][number].compute(), ds["labels"][number].compute(), strict=True):
            centre = picture[int((y0 + y1) / 2), int((x0 + x1) / 2)]
            assert (np.abs(centre - COLOURS[int(label)]) < 40).all()
            checked += 1
    assert checked > 15


def test_a_record_without_the_box_features_is_named_not_taken_for_one_without_boxes(tmp_path):
    _records(tmp_path / "train.tfrecord", count=5, boxless=2)
    with pytest.raises(outcore.SourceError, match=r"record 2: the box features \['image/object/bbox/xmin'"):
        outcore.ingest_records(tmp_path / "train.tfrecord", tmp_path / "s.zarr", shape=(32, 32, 3),
                               format=outcore.TFRecord.object_detection(), progress=False)


def test_a_record_whose_size_is_not_its_pictures_is_refused_by_name(tmp_path):
    _records(tmp_path / "train.tfrecord", count=5, lie=3)
    with pytest.raises(ImageError, match="record 3.*annotated as 49x64, its picture .* is 48x64"):
        outcore.ingest_records(tmp_path / "train.tfrecord", tmp_path / "s.zarr", shape=(32, 32, 3),
                               format=outcore.TFRecord.object_detection(), progress=False)


def test_splits_of_object_detection_records_keep_each_records_boxes(tmp_path):
    truth = _records(tmp_path / "train.tfrecord", count=24)
    stores = outcore.ingest_splits(tmp_path / "train.tfrecord", tmp_path / "splits", split={"a": 0.5, "b": 0.5},
                                   format=outcore.TFRecord.object_detection(), shape=(48, 64, 3), progress=False)
    seen = 0
    for ds in stores.values():
        for row, path in enumerate(ds["path"].compute().tolist()):
            boxes = truth[int(path.rpartition("record ")[2])]
            np.testing.assert_allclose(ds["boxes"][row].compute(), np.reshape([b[:4] for b in boxes], (-1, 4)),
                                       atol=1e-4)
            assert ds["labels"][row].compute().tolist() == [b[4] for b in boxes]
            seen += 1
    assert seen == 24
