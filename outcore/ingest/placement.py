"""Where a picture's annotated targets go when the picture is fitted to the store's shape at ingest.

Annotations (COCO, Pascal VOC, TensorFlow's object detection records) place boxes and keypoints in a picture's own
pixels. An ingest with ``shape=`` fits each picture by its ``resize`` policy, which is one box of the picture
resized (`outcore.imaging.policy_crop`); its boxes and keypoints move by that box as its label maps do
(`outcore.imaging.targets`). An instance the fit leaves nothing of goes, with all its rows; the rest are clipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..format import Ragged
from ..imaging import BoxPolicy, move_boxes, move_keypoints, owners, policy_crop
from .sources import SourceTable

KEEP_VISIBLE = BoxPolicy(min_size=0.0)  # at ingest an instance goes only when the fit leaves nothing of its box


@dataclass(frozen=True)
class Placement:
    """Each picture's box in its own pixels (``crops``, (n, 4): top, left, height, width) and the size it is
    resized to (``sizes``, (n, 2)): its fit to the store's shape (its own size and box with ``shape=None``).

    >>> placement = Placement.of(np.array([[100, 200]]), (50, 50, 3), "crop")
    >>> placement.crops.tolist(), placement.boxes(np.array([[50.0, 0, 150, 100]]), np.array([0]))[0].tolist()
    ([[0.0, 50.0, 100.0, 100.0]], [[0.0, 0.0, 50.0, 50.0]])
    """

    crops: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, sizes: np.ndarray, shape: tuple[int | None, ...], resize: str | None) -> Placement:
        """The fits of pictures of ``sizes`` (n, 2: height, width) to ``shape`` by ``resize``."""
        sizes = np.asarray(sizes, np.int64).reshape(-1, 2)
        goals = sizes if shape[0] is None else np.tile(np.asarray(shape[:2], np.int64), (len(sizes), 1))
        crops = np.array([policy_crop(tuple(size), tuple(goal), resize)
                          for size, goal in zip(sizes.tolist(), goals.tolist(), strict=True)], np.float64)
        return cls(crops.reshape(-1, 4), goals)

    def _by_size(self, owners: np.ndarray) -> list[tuple[tuple[int, int], np.ndarray]]:
        """The rows of each output size (a move takes one at a time): (size, which rows)."""
        return [(tuple(size), (self.sizes[owners] == size).all(axis=1)) for size in np.unique(self.sizes, axis=0).tolist()]

    def boxes(self, boxes: np.ndarray, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Boxes (m, 4: x0, y0, x1, y1) of pictures ``owners`` moved and clipped: ``(moved, kept)``."""
        moved, kept = np.zeros((len(boxes), 4), np.float32), np.zeros(len(boxes), bool)
        none = np.zeros((len(self.crops), 2), bool)
        for size, mine in self._by_size(owners):
            moved[mine], kept[mine] = move_boxes(boxes[mine], owners[mine], self.crops, size, none, KEEP_VISIBLE)
        return moved, kept

    def keypoints(self, points: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """Keypoints (m, k, 3: x, y, visibility) moved; an unlabelled one (visibility 0) stays (0, 0, 0)."""
        moved = np.asarray(points, np.float32).copy()
        labelled = moved[..., 2] > 0
        none = np.zeros((len(self.crops), 2), bool)
        for size, mine in self._by_size(owners):
            moved[mine] = move_keypoints(moved[mine], owners[mine], self.crops, size, none)
        moved[~labelled] = 0
        return moved


def instance_fields(rows: Mapping[str, np.ndarray], owners: np.ndarray, kept: np.ndarray,
                    pictures: int) -> dict[str, Ragged]:
    """Each per-instance array of ``rows`` as a ragged field of the kept instances, per picture.

    >>> fields = instance_fields({"labels": np.array([4, 5, 6])}, np.array([0, 0, 2]), np.array([1, 0, 1], bool), 3)
    >>> fields["labels"].offsets.tolist(), fields["labels"].values.tolist()
    ([0, 1, 1, 2], [4, 6])
    """
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owners[kept], minlength=pictures))]).astype(np.int64)
    return {name: Ragged(np.asarray(values)[kept], offsets) for name, values in rows.items()}


def placed(table: SourceTable, shape: tuple[int | None, ...], resize: str | None) -> SourceTable:
    """``table`` with its ragged ``boxes`` (and ``keypoints``) in its pictures' own pixels moved to their fits to
    ``shape``, the instances the fits cut away gone from every ragged field."""
    if "boxes" not in table.instances or table.sizes is None:
        return table
    boxes = table.instances["boxes"]
    which = owners(boxes.offsets)
    placement = Placement.of(table.sizes, shape, resize)
    moved, kept = placement.boxes(boxes.values, which)
    rows = {name: rows.values for name, rows in table.instances.items()} | {"boxes": moved}
    if "keypoints" in rows:
        rows["keypoints"] = placement.keypoints(rows["keypoints"], which)
    return replace(table, instances=instance_fields(rows, which, kept, len(table)))
