"""Instance maps drawn from COCO's segmentations: polygons, and run-length encodings (plain or compressed).

An instance map is a label map (`outcore.imaging.label_maps`) whose id ``k + 1`` marks the pixels of a picture's
``k``-th instance (0: none; where instances overlap, the later one). It is drawn in the ingest task that decodes
the picture, at the picture's size, then fitted to the store's shape as the picture is, nearest-neighbour.

>>> Drawing("a.jpg", (3, 4), ((1, {"size": [3, 4], "counts": "1350"}),)).draw().tolist()
[[0, 1, 0, 1], [1, 0, 0, 1], [1, 0, 0, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ..errors import ImageError


def rle_counts(text: str) -> list[int]:
    """The run lengths of a compressed COCO run-length encoding (pycocotools' ``counts`` string): each number in
    characters of 5 bits from ``"0"``, the third on given as its difference from the one two before.

    >>> rle_counts("1350")
    [1, 3, 5, 3]
    """
    counts: list[int] = []
    position = 0
    while position < len(text):
        value, shift, more = 0, 0, True
        while more:
            bits = ord(text[position]) - 48
            value |= (bits & 0x1F) << shift
            more = bool(bits & 0x20)
            position += 1
            shift += 5
            if not more and bits & 0x10:
                value |= -1 << shift
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
    return counts


def rle_mask(rle: dict[str, Any], size: tuple[int, int]) -> np.ndarray:
    """The pixels (``size``, bool) of a COCO run-length encoding: runs of out, in, out, ... down each column."""
    height, width = (int(side) for side in rle.get("size", size))
    if (height, width) != tuple(size):
        raise ValueError(f"a run-length encoding of {height}x{width} for a {size[0]}x{size[1]} picture")
    counts = rle["counts"]
    counts = rle_counts(counts.decode() if isinstance(counts, bytes) else counts) if isinstance(counts, str | bytes) \
        else [int(count) for count in counts]
    if sum(counts) != height * width or min(counts, default=0) < 0:
        raise ValueError(f"run lengths adding up to {sum(counts)}, not the picture's {height * width} pixels")
    inside = np.repeat(np.arange(len(counts)) % 2 == 1, counts)
    return inside.reshape(width, height).T


def polygon_mask(polygons: Sequence[Sequence[float]], size: tuple[int, int]) -> np.ndarray:
    """The pixels (``size``, bool) of COCO polygons (each ``[x0, y0, x1, y1, ...]`` in the picture's pixels),
    filled with their edges, as Pillow draws them (pycocotools rounds edges its own way: the two agree within a
    pixel of the edges)."""
    canvas = Image.new("1", (size[1], size[0]), 0)
    draw = ImageDraw.Draw(canvas)
    for polygon in polygons:
        points = [float(value) for value in polygon]
        if len(points) < 6 or len(points) % 2:
            raise ValueError(f"a polygon of {len(points)} numbers: at least 3 points, as x, y pairs")
        draw.polygon(points, fill=1, outline=1)
    return np.asarray(canvas, bool)


@dataclass(frozen=True)
class Drawing:
    """The instance map of the picture ``name`` of ``size`` (height, width): each of ``shapes`` is ``(id,
    segmentation)``, a COCO segmentation (a list of polygons, or a run-length encoding)."""

    name: str
    size: tuple[int, int]
    shapes: tuple[tuple[int, Any], ...]

    def draw(self, dtype: np.typing.DTypeLike = np.uint16) -> np.ndarray:
        """The map, (height, width) of ``dtype``; an `ImageError` naming the picture for a segmentation that
        cannot be drawn."""
        ids = np.zeros(self.size, dtype)
        for number, segmentation in self.shapes:
            try:
                mask = rle_mask(segmentation, self.size) if isinstance(segmentation, dict) else \
                    polygon_mask(segmentation, self.size)
            except (ValueError, KeyError, TypeError) as error:
                raise ImageError(self.name, f"instance {number - 1}'s segmentation cannot be drawn: {error}") from None
            ids[mask] = number
        return ids
