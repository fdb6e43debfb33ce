"""COCO detection, segmentation and keypoint annotations ingested with their pictures.

A COCO annotation file lists ``images`` (``id``, ``file_name``, ``height``, ``width``), ``annotations`` (``image_id``,
``bbox`` as x, y, width, height, ``category_id``, ``iscrowd``, ``segmentation`` as polygons or a run-length
encoding, ``keypoints`` as x, y, visibility triples) and ``categories``. The store holds, per picture:

- ``boxes``: its instances' boxes, (rows, 4) float32 x0, y0, x1, y1 in the stored picture's pixels (ragged,
  `outcore.format.ragged`);
- ``labels``: each instance's category, an index into the categories sorted by id (their names are the classes);
- ``iscrowd``: each instance's crowd flag (uint8);
- ``keypoints``: (rows, K, 3) float32 x, y, visibility, when a category names keypoints (their names are the
  field's ``points``: ``ds.info("keypoints").points``, `outcore.transforms.left_right_pairs` makes a flip's pairs);
- ``masks`` (unless ``masks=False``): the instance map, uint16, id ``k + 1`` on the pixels of its ``k``-th instance
  (`outcore.imaging.drawings`), drawn at the picture's size in the task that decodes it.

With ``shape=``, pictures are fitted as ``resize`` says and every target is moved by the same box
(`outcore.ingest.placement`): the map nearest-neighbour, boxes and keypoints by the same scale and shift, boxes
clipped to the picture; an instance the fit leaves nothing of is dropped with all its rows (and its id renumbered).
With ``shape=None`` each picture keeps its own size, and its targets theirs: the map is stored as a raster field
(`outcore.format.attrs`), cut by the picture's crop as batches are made. A picture that is not of its annotated
size, or is stored turned (EXIF), is an error naming it.

>>> ds = outcore.ingest_coco("annotations/instances_val2017.json", "val.zarr", root="val2017",
...                          shape=(512, 512, 3), resize="pad")  # doctest: +SKIP
>>> ds.classes[:3]  # doctest: +SKIP
['person', 'bicycle', 'car']
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from ..dataset import Dataset
from ..errors import OutcoreError, SourceError
from ..imaging import Drawing
from ..storage import check_target
from .fields import missing_files
from .images import ingest_table
from .options import IngestKeywords, IngestOptions
from .placement import Placement, instance_fields
from .sources import SourceTable


def ingest_coco(annotations: str | os.PathLike, location: str | os.PathLike, *, root: str | os.PathLike | None = None,
                masks: bool = True, **options: Unpack[IngestKeywords]) -> Dataset:
    """Ingest the pictures of a COCO annotation file with their boxes, categories, crowd flags, keypoints and
    instance maps (see the module's text for the fields). ``root`` is the pictures' folder (default: the
    annotation file's). The other keywords are those of every ingest (`IngestKeywords`); ``max_side`` is refused
    (it would shrink pictures after their targets were placed).

    >>> ds = outcore.ingest_coco("instances_train2017.json", "train.zarr", root="train2017",
    ...                          shape=(640, 640, 3), resize="pad")  # doctest: +SKIP
    """
    settings = IngestOptions.of(options)
    check_target(location)
    table = coco_table(Path(annotations), Path(root) if root is not None else Path(annotations).parent,
                       settings.shape, settings.resize, masks)
    return ingest_table(table, location, settings)


def coco_table(annotations: Path, root: Path, shape: tuple[int | None, ...], resize: str | None,
               masks: bool) -> SourceTable:
    """The pictures of a COCO annotation file, their targets moved to ``shape`` as ``resize`` fits them; an entry
    that lacks what COCO gives it, or holds another kind of value, is a `SourceError` naming the file."""
    document = _document(annotations)
    try:
        return _table(document, annotations, root, shape, resize, masks)
    except OutcoreError:
        raise
    except (KeyError, TypeError, ValueError) as error:
        said = f"no {error}" if isinstance(error, KeyError) else f"{type(error).__name__}: {error}"
        raise SourceError(f"{annotations}: an image, annotation or category is not as COCO writes it ({said}); "
                          "fix the file") from None


def _table(document: Mapping[str, Any], annotations: Path, root: Path, shape: tuple[int | None, ...],
           resize: str | None, masks: bool) -> SourceTable:
    images = document["images"]
    categories = sorted(document["categories"], key=lambda category: category["id"])
    index = {category["id"]: number for number, category in enumerate(categories)}
    points = max((len(category.get("keypoints") or ()) for category in categories), default=0)
    per_image: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for annotation in document["annotations"]:
        per_image[annotation["image_id"]].append(annotation)
    unknown = {annotation["category_id"] for annotation in document["annotations"]} - set(index)
    if unknown:
        raise SourceError(f"{annotations}: annotations name categories {sorted(unknown)[:5]} that the file does not list")
    orphans = set(per_image) - {image["id"] for image in images}
    if orphans:  # their boxes would be left out without a word
        raise SourceError(f"{annotations}: annotations name images {sorted(orphans, key=str)[:5]} that the file does "
                          "not list")
    sizes = np.array([[image["height"], image["width"]] for image in images], np.int64).reshape(-1, 2)
    placement = Placement.of(sizes, shape, resize)
    listed = [per_image.get(image["id"], []) for image in images]
    owners = np.repeat(np.arange(len(images)), [len(found) for found in listed])
    flat = [annotation for found in listed for annotation in found]
    boxes = np.array([annotation["bbox"] for annotation in flat], np.float64).reshape(-1, 4)
    boxes[:, 2:] += boxes[:, :2]  # x, y, width, height -> x0, y0, x1, y1
    moved, kept = placement.boxes(boxes, owners)
    rows = {"boxes": moved, "labels": np.array([index[a["category_id"]] for a in flat], np.int64),
            "iscrowd": np.array([a.get("iscrowd", 0) for a in flat], np.uint8)}
    if points:
        rows["keypoints"] = placement.keypoints(_keypoints(flat, points), owners)
    instances = instance_fields(rows, owners, kept, len(images))
    paths = [str(root / image["file_name"]) for image in images]
    named = next((tuple(map(str, category["keypoints"])) for category in categories
                  if len(category.get("keypoints") or ()) == points), None) if points else None
    table = SourceTable(paths, [image["file_name"] for image in images], {},
                        {"labels": tuple(str(category["name"]) for category in categories)},
                        missing_files(paths),
                        f"COCO annotations {str(annotations)!r} (pictures under {root.absolute()})",
                        instances=instances, sizes=sizes, points={"keypoints": named} if named else {})
    if masks:
        table.layers["masks"] = _drawings(annotations, images, flat, owners, kept, sizes), np.dtype(np.uint16)
    return table


def _document(annotations: Path) -> dict[str, Any]:
    """The annotation file's JSON, checked to hold COCO's three lists."""
    try:
        document = json.loads(annotations.read_text())
    except FileNotFoundError:
        raise SourceError(f"COCO annotation file {str(annotations)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SourceError(f"{annotations} is not JSON ({error}); pass a COCO annotation file") from None
    missing = [key for key in ("images", "annotations", "categories") if not isinstance(document.get(key), list)]
    if not isinstance(document, dict) or missing:
        raise SourceError(f"{annotations} lacks COCO's lists {missing or ['images', 'annotations', 'categories']}")
    return document


def _keypoints(flat: Sequence[Mapping[str, Any]], points: int) -> np.ndarray:
    """Each instance's keypoints (points, 3); none given: all unlabelled (zeros)."""
    values = np.zeros((len(flat), points, 3), np.float32)
    for row, annotation in enumerate(flat):
        given = np.asarray(annotation.get("keypoints") or (), np.float32).reshape(-1, 3)
        if len(given) > points:
            raise ValueError(f"annotation {annotation.get('id')!r} has {len(given)} keypoints; its categories name "
                             f"{points} at most")
        values[row, : len(given)] = given
    return values


def _drawings(annotations: Path, images: Sequence[Mapping[str, Any]], flat: Sequence[Mapping[str, Any]],
              owners: np.ndarray, kept: np.ndarray, sizes: np.ndarray) -> list[Drawing]:
    """Each picture's instance map: its kept instances' segmentations, numbered from 1 in their stored order."""
    shapes: list[list[tuple[int, Any]]] = [[] for _ in images]
    for annotation, owner, keep in zip(flat, owners.tolist(), kept.tolist(), strict=True):
        if keep:
            shapes[owner].append((len(shapes[owner]) + 1, annotation.get("segmentation") or []))
    return [Drawing(f"{annotations}: image {image['file_name']!r}", tuple(size), tuple(found))
            for image, size, found in zip(images, sizes.tolist(), shapes, strict=True)]
