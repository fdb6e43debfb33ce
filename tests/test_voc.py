"""Pascal VOC ingested with its pictures: XML boxes, and the class and object segmentation PNGs.

The folder is laid out as VOCdevkit's, its XML written by ElementTree, its palette PNGs and JPEGs by Pillow;
objects are painted in their class's colour, so a box or map that does not lie on its picture shows.
"""

from __future__ import annotations

from xml.etree import ElementTree

import numpy as np
import pytest
from PIL import Image

import outcore
from outcore.errors import SourceError
from outcore.ingest.voc import VOC_CLASSES

PALETTE = np.zeros((256, 3), np.uint8)
PALETTE[1:21] = np.random.default_rng(3).integers(40, 256, (20, 3))
PALETTE[255] = 224


def _voc(root, count: int = 12, size: tuple[int, int] = (60, 80), margin: bool = False) -> list[list[dict]]:
    """A VOC folder of ``count`` pictures with 0-3 rectangular objects each (a void edge around each in the maps);
    with ``margin``, the first of each within the 8 columns at the left (a central crop cuts it away)."""
    rng = np.random.default_rng(0)
    for folder in ("JPEGImages", "Annotations", "SegmentationClass", "SegmentationObject", "ImageSets/Main",
                   "ImageSets/Segmentation"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    every = []
    for number in range(count):
        name = f"2007_{number:06}"
        classes, objects = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
        annotation = ElementTree.Element("annotation")
        dims = ElementTree.SubElement(annotation, "size")
        for tag, value in (("width", size[1]), ("height", size[0]), ("depth", 3)):
            ElementTree.SubElement(dims, tag).text = str(value)
        found = []
        for k in range(int(rng.integers(0, 4))):
            x0, y0 = int(rng.integers(0, size[1] - 20)), int(rng.integers(0, size[0] - 20))
            x1, y1 = int(rng.integers(x0 + 10, size[1] + 1)), int(rng.integers(y0 + 10, size[0] + 1))
            if margin and k == 0:
                x0, x1 = 0, 8
            label = int(rng.integers(0, 20))
            classes[y0:y1, x0:x1], objects[y0:y1, x0:x1] = 255, 255  # the void edge, then the inside
            classes[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1], objects[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1] = label + 1, k + 1
            item = ElementTree.SubElement(annotation, "object")
            ElementTree.SubElement(item, "name").text = VOC_CLASSES[label]
            ElementTree.SubElement(item, "difficult").text = str(k % 2)
            ElementTree.SubElement(item, "truncated").text = "0"
            box = ElementTree.SubElement(item, "bndbox")
            for tag, value in (("xmin", x0 + 1), ("ymin", y0 + 1), ("xmax", x1), ("ymax", y1)):
                ElementTree.SubElement(box, tag).text = str(value)
            found.append({"box": [x0, y0, x1, y1], "label": label, "difficult": k % 2})
        ElementTree.ElementTree(annotation).write(root / "Annotations" / f"{name}.xml")
        Image.fromarray(PALETTE[classes]).save(root / "JPEGImages" / f"{name}.jpg", quality=95)
        for folder, ids in (("SegmentationClass", classes), ("SegmentationObject", objects)):
            image = Image.fromarray(ids, mode="P")
            image.putpalette(PALETTE.reshape(-1).tolist())
            image.save(root / folder / f"{name}.png")
        every.append(found)
    names = "".join(f"2007_{number:06}\n" for number in range(count))
    (root / "ImageSets" / "Main" / "train.txt").write_text(names)
    (root / "ImageSets" / "Segmentation" / "train.txt").write_text(names)
    return every


@pytest.mark.parametrize("shape", [(60, 80, 3), None], ids=["fitted", "own-size"])
def test_boxes_classes_and_maps_are_stored_as_the_files_say(tmp_path, shape):
    every = _voc(tmp_path / "VOC2012")
    ds = outcore.ingest_voc(tmp_path / "VOC2012", tmp_path / "s.zarr", masks=True, shape=shape,
                            shuffle_on_write=False, progress=False)
    assert ds.info("masks").is_raster == ds.info("objects").is_raster == (shape is None)
    assert ds.classes == list(VOC_CLASSES)
    for number, found in enumerate(every):
        assert ds["boxes"][number].compute().tolist() == [item["box"] for item in found]
        assert ds["labels"][number].compute().tolist() == [item["label"] for item in found]
        assert ds["difficult"][number].compute().tolist() == [item["difficult"] for item in found]
        name = f"2007_{number:06}.png"
        np.testing.assert_array_equal(ds["masks"][number].compute(),
                                      np.asarray(Image.open(tmp_path / "VOC2012" / "SegmentationClass" / name)))
        np.testing.assert_array_equal(ds["objects"][number].compute(),
                                      np.asarray(Image.open(tmp_path / "VOC2012" / "SegmentationObject" / name)))


def test_a_fit_that_cuts_objects_away_renumbers_the_object_map_to_the_kept_boxes(tmp_path):
    every = _voc(tmp_path / "VOC2012", count=30, margin=True)
    ds = outcore.ingest_voc(tmp_path / "VOC2012", tmp_path / "s.zarr", masks=True, shape=(24, 24, 3), resize="crop",
                            progress=False)  # the central 60x60: the first object of each picture goes
    assert sum(len(ds["boxes"][i].compute()) for i in range(len(ds))) == sum(max(0, len(f) - 1) for f in every)
    objects, classes, pictures = ds["objects"].compute(), ds["masks"].compute(), ds["images"].compute()
    checked = 0
    for i in range(len(ds)):
        boxes, labels = ds["boxes"][i].compute(), ds["labels"][i].compute()
        assert set(np.unique(objects[i])) <= {0, 255, *range(1, len(boxes) + 1)}
        for k, (x0, y0, x1, y1) in enumerate(boxes.tolist()):
            ys, xs = np.nonzero(objects[i] == k + 1)
            if len(xs):
                assert xs.min() + 0.5 >= x0 - 1 and xs.max() + 0.5 <= x1 + 1 and ys.min() + 0.5 >= y0 - 1
                assert (classes[i][ys, xs] == labels[k] + 1).all()  # the object is of its box's class
                checked += 1
        inside = (classes[i] > 0) & (classes[i] < 255)
        if inside.any():  # the map lies on the picture's colours (a JPEG's, resized)
            close = (np.abs(pictures[i][inside].astype(int) - PALETTE[classes[i][inside]].astype(int)) < 60).all(axis=1)
            assert close.mean() > 0.9
    assert checked > 10


def test_a_class_not_among_the_classes_is_refused_by_name_and_classes_of_ones_own_are_taken(tmp_path):
    _voc(tmp_path / "VOC2012", count=4)
    annotation = tmp_path / "VOC2012" / "Annotations" / "2007_000003.xml"
    tree = ElementTree.parse(annotation)
    item = ElementTree.SubElement(tree.getroot(), "object")
    ElementTree.SubElement(item, "name").text = "unicorn"
    box = ElementTree.SubElement(item, "bndbox")
    for tag, value in (("xmin", 1), ("ymin", 1), ("xmax", 10), ("ymax", 10)):
        ElementTree.SubElement(box, tag).text = str(value)
    tree.write(annotation)
    with pytest.raises(SourceError, match="2007_000003.xml: class 'unicorn' is not among the classes"):
        outcore.ingest_voc(tmp_path / "VOC2012", tmp_path / "s.zarr", shape=(60, 80, 3))
    ds = outcore.ingest_voc(tmp_path / "VOC2012", tmp_path / "s.zarr", shape=(60, 80, 3), shuffle_on_write=False,
                            classes=[*VOC_CLASSES, "unicorn"], progress=False)
    assert ds.classes[-1] == "unicorn" and ds["labels"][3].compute()[-1] == 20


def test_a_folder_that_is_not_voc_is_refused_by_name(tmp_path):
    _voc(tmp_path / "VOC2012", count=2)
    with pytest.raises(SourceError, match="ImageSets/Main/val.txt does not exist"):
        outcore.ingest_voc(tmp_path / "VOC2012", tmp_path / "s.zarr", split="val", shape=(60, 80, 3))
    (tmp_path / "VOC2012" / "Annotations" / "2007_000001.xml").write_text("<annotation><size></size></annotation>")
    with pytest.raises(SourceError, match="2007_000001.xml: not a VOC annotation"):
        outcore.ingest_voc(tmp_path / "VOC2012", tmp_path / "s.zarr", shape=(60, 80, 3))
