"""Pascal VOC ingested with its pictures: XML boxes, and the class and object segmentation PNGs.

A VOC folder (``VOCdevkit/VOC2012``) holds ``JPEGImages/<id>.jpg``, ``Annotations/<id>.xml`` (the picture's
``size`` and its ``object`` s: ``name``, ``difficult``, ``truncated``, ``bndbox`` in 1-based pixels, both ends
included), ``ImageSets/Main/<split>.txt`` and ``ImageSets/Segmentation/<split>.txt`` (the pictures of a split),
``SegmentationClass/<id>.png`` (palette PNGs: the class of each pixel, 0 background, 255 void) and
``SegmentationObject/<id>.png`` (the object of each pixel, numbered from 1 in the XML's order). The store holds,
per picture: ``boxes`` (x0, y0, x1, y1 in the stored picture's pixels: ``xmin - 1, ymin - 1, xmax, ymax``),
``labels`` (the class's index in ``classes``: VOC's 20 by default; a name not among them is an error naming it),
``difficult`` and ``truncated``; with ``masks=True``, ``masks`` (the class map; the class ``labels[k]`` is id
``labels[k] + 1`` there) and ``objects`` (the object map, its ids those of the stored boxes + 1).

Fitted to ``shape=`` as the pictures are, with every target (`outcore.ingest.placement`); an object the fit cuts
away goes, and the object map is renumbered to match.

>>> ds = outcore.ingest_voc("VOCdevkit/VOC2012", "voc-train.zarr", split="train", shape=(320, 320, 3),
...                         resize="pad")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Unpack
from xml.etree import ElementTree

import numpy as np

from ..dataset import Dataset
from ..errors import SourceError
from ..imaging import Renumbered
from ..storage import check_target
from .fields import missing_files
from .images import ingest_table
from .options import IngestKeywords, IngestOptions
from .placement import Placement, instance_fields
from .sources import SourceTable

VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
               "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")
VOID = 255  # the segmentation PNGs' id of pixels left out (objects' edges)


def ingest_voc(root: str | os.PathLike, location: str | os.PathLike, *, split: str = "train", masks: bool = False,
               classes: Sequence[str] = VOC_CLASSES, **options: Unpack[IngestKeywords]) -> Dataset:
    """Ingest the pictures of split ``split`` of a Pascal VOC folder with their boxes, classes and flags, and with
    ``masks=True`` their class and object maps (the pictures of ``ImageSets/Segmentation/<split>.txt``; else of
    ``ImageSets/Main``). ``classes`` are the class names in label order (a dataset in VOC's layout with classes of
    its own: in the order its class maps number them, from 1). See the module's text for the fields; the other
    keywords are those of every ingest.

    >>> ds = outcore.ingest_voc("VOCdevkit/VOC2012", "seg-val.zarr", split="val", masks=True,
    ...                         shape=(512, 512, 3), resize="pad")  # doctest: +SKIP
    """
    settings = IngestOptions.of(options)
    check_target(location)
    table = voc_table(Path(root), split, masks, settings.shape, settings.resize, tuple(classes))
    return ingest_table(table, location, settings)


def voc_table(root: Path, split: str, masks: bool, shape: tuple[int | None, ...], resize: str | None,
              classes: tuple[str, ...] = VOC_CLASSES) -> SourceTable:
    """The pictures of a VOC split, their targets moved to ``shape`` as ``resize`` fits them."""
    listing = root / "ImageSets" / ("Segmentation" if masks else "Main") / f"{split}.txt"
    if not listing.is_file():
        raise SourceError(f"{listing} does not exist: {root} is not a Pascal VOC folder with a split {split!r}")
    names = [line.split()[0] for line in listing.read_text().splitlines() if line.strip()]
    parsed = [_annotation(root / "Annotations" / f"{name}.xml") for name in names]
    sizes = np.array([size for size, _ in parsed], np.int64).reshape(-1, 2)
    objects = [found for _, found in parsed]
    unknown = next(((name, item["name"]) for name, found in zip(names, objects, strict=True) for item in found
                    if item["name"] not in classes), None)
    if unknown is not None:
        raise SourceError(f"{root / 'Annotations' / unknown[0]}.xml: class {unknown[1]!r} is not among the classes "
                          f"{list(classes)[:5]}...: pass classes= (CLI: --voc-classes), every class name in the order of their ids")
    owners = np.repeat(np.arange(len(names)), [len(found) for found in objects])
    flat = [item for found in objects for item in found]
    boxes = np.array([item["box"] for item in flat], np.float64).reshape(-1, 4)
    placement = Placement.of(sizes, shape, resize)
    moved, kept = placement.boxes(boxes, owners)
    rows = {"boxes": moved, "labels": np.array([classes.index(item["name"]) for item in flat], np.int64),
            "difficult": np.array([item["difficult"] for item in flat], np.uint8),
            "truncated": np.array([item["truncated"] for item in flat], np.uint8)}
    paths = [str(root / "JPEGImages" / f"{name}.jpg") for name in names]
    table = SourceTable(paths, [f"JPEGImages/{name}.jpg" for name in names], {}, {"labels": classes},
                        missing_files(paths),
                        f"Pascal VOC {str(root)!r}, split {split!r}",
                        instances=instance_fields(rows, owners, kept, len(names)), sizes=sizes)
    if masks:
        class_maps = [str(root / "SegmentationClass" / f"{name}.png") for name in names]
        object_maps = [Renumbered(str(root / "SegmentationObject" / f"{name}.png"), _numbering(kept[owners == i]))
                       for i, name in enumerate(names)]
        absent = missing_files([*class_maps, *(m.path for m in object_maps)])
        if absent:
            raise SourceError(f"{len(absent)} segmentation PNGs of split {split!r} do not exist (e.g. {absent[0]!r}): "
                              "masks=True reads SegmentationClass/ and SegmentationObject/")
        table.layers.update({"masks": (class_maps, np.dtype(np.uint8)), "objects": (object_maps, np.dtype(np.uint8))})
    return table


def _numbering(kept: np.ndarray) -> tuple[int, ...]:
    """The object map's new id of each old one: the kept objects numbered from 1 in order, the cut-away ones 0,
    void kept.

    >>> _numbering(np.array([True, False, True]))[:4], _numbering(np.array([True]))[255]
    ((0, 1, 0, 2), 255)
    """
    ids = np.zeros(VOID + 1, np.int64)
    ids[1 : len(kept) + 1] = np.where(kept, np.cumsum(kept), 0)
    ids[VOID] = VOID
    return tuple(ids.tolist())


def _annotation(path: Path) -> tuple[tuple[int, int], list[dict]]:
    """A VOC XML file's picture size (height, width) and objects (name, box as x0, y0, x1, y1, flags)."""
    try:
        tree = ElementTree.parse(path).getroot()
    except FileNotFoundError:
        raise SourceError(f"{path} does not exist: every picture of the split needs its annotation") from None
    except ElementTree.ParseError as error:
        raise SourceError(f"{path} is not XML ({error})") from None
    try:
        size = tree.find("size")
        height, width = int(size.findtext("height")), int(size.findtext("width"))
        objects = []
        for item in tree.iter("object"):
            box = item.find("bndbox")
            xmin, ymin, xmax, ymax = (float(box.findtext(side)) for side in ("xmin", "ymin", "xmax", "ymax"))
            objects.append({"name": item.findtext("name").strip(), "box": (xmin - 1, ymin - 1, xmax, ymax),
                            "difficult": int(item.findtext("difficult") or 0),
                            "truncated": int(item.findtext("truncated") or 0)})
    except (AttributeError, TypeError, ValueError) as error:
        raise SourceError(f"{path}: not a VOC annotation (its size, or an object's name or bndbox: {error})") from None
    return (height, width), objects
