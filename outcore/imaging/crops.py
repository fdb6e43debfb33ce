"""Crop boxes: where RandomResizedCrop, CenterCrop and RandomCrop cut a picture (pure functions of its size).

A box is ``(top, left, height, width)`` in the picture's pixels (whole pixels, except where a resize
before the crop puts its edges between them). The same boxes serve pixel fields
(cut from the stored picture) and, drawn from a file's stored size, encoded fields. A RandomCrop window
may lie past the picture's edges, by its padding, and so may a ScaleJitter's: zeros there (`box_part`).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import OptionError

Box = tuple[float, float, float, float]  # integers, but for CenterCrop's resize


def box_edges(box: Box) -> tuple[float, float, float, float]:
    """A box's edges: (top, left, bottom, right).

    >>> box_edges((2, 3, 10, 20))
    (2, 3, 12, 23)
    """
    return box[0], box[1], box[0] + box[2], box[1] + box[3]


ROUNDING = 1e-6  # pixels: how far a box computed in floating point may pass a picture's edges and lie within


def within(box: Box, size: tuple[int, int]) -> bool:
    """Whether ``box`` lies inside a picture of ``size`` (h, w), its edges rounded off by up to `ROUNDING`
    (`center_crop_box` with ``resize`` gives edges such as 511.00000000000006 of a 511-pixel side).

    >>> within((0, 2, 4, 3), (4, 5)), within((-1, 0, 2, 2), (4, 5)), within((0, 0, 4.0000000000001, 5), (4, 5))
    (True, False, True)
    """
    top, left, bottom, right = box_edges(box)
    return min(top, left) > -ROUNDING and bottom < size[0] + ROUNDING and right < size[1] + ROUNDING


def box_part(box: Box, picture: tuple[int, int], size: tuple[int, int],
             flip: tuple[bool, bool] = (False, False)) -> tuple[Box, tuple[int, int], tuple[slice, slice]] | None:
    """The part of ``box`` (resized to ``size``) that lies inside a picture of ``picture`` (h, w): ``(part, its
    size, (rows, columns))``, the part's box in the picture, the output pixels it is resized to (its edges rounded
    to whole output pixels) and where they lie in the output mirrored as ``flip`` (left-right, top-bottom) says;
    None where nothing of it does. A box past the edges is `RandomCrop`'s padded window (at its own size: the part
    is copied as it is) or `ScaleJitter`'s window of a picture scaled smaller than the output (zeros elsewhere).

    >>> box_part((-2, 3, 4, 4), (10, 5), (4, 4))
    ((0, 3, 2, 2), (2, 2), (slice(2, 4, None), slice(0, 2, None)))
    >>> box_part((-2, 3, 4, 4), (10, 5), (4, 4), flip=(True, False))[2]
    (slice(2, 4, None), slice(2, 4, None))
    >>> box_part((0, 0, 20, 20), (10, 5), (8, 8))  # a picture scaled to 4 x 2 of an 8 x 8 output
    ((0, 0, 10, 5), (4, 2), (slice(0, 4, None), slice(0, 2, None)))
    >>> box_part((-4, 0, 4, 4), (10, 5), (4, 4)) is None
    True
    """
    top, left, rows, columns = box
    y0, y1, x0, x1 = max(top, 0), min(top + rows, picture[0]), max(left, 0), min(left + columns, picture[1])
    r0, r1 = round((y0 - top) * size[0] / rows), round((y1 - top) * size[0] / rows)
    c0, c1 = round((x0 - left) * size[1] / columns), round((x1 - left) * size[1] / columns)
    if y1 <= y0 or x1 <= x0 or r1 <= r0 or c1 <= c0:
        return None
    placed = (_placed(r0, r1, size[0], flip[1]), _placed(c0, c1, size[1], flip[0]))
    return (y0, x0, y1 - y0, x1 - x0), (r1 - r0, c1 - c0), placed


def _placed(low: int, high: int, length: int, mirrored: bool) -> slice:
    """Where ``[low, high)`` of a line of ``length`` lands, with the line mirrored or not."""
    return slice(length - high, length - low) if mirrored else slice(low, high)


def random_resized_crop_box(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float],
                            rng: np.random.Generator) -> Box:
    """A box of a random share of the area (``scale``) and a random aspect ratio (``ratio``, width over
    height, drawn log-uniformly), at a random place; after 10 tries that do not fit, the largest
    central box whose aspect ratio lies within ``ratio``. torchvision's ``RandomResizedCrop`` rule.

    >>> random_resized_crop_box(300, 400, (0.08, 1.0), (3 / 4, 4 / 3), np.random.default_rng(0))
    (28, 242, 137, 103)
    >>> random_resized_crop_box(100, 400, (0.9, 1.0), (3 / 4, 4 / 3), np.random.default_rng(0))  # too wide
    (0, 133, 100, 133)
    """
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        box_width = round(math.sqrt(target_area * aspect))
        box_height = round(math.sqrt(target_area / aspect))
        if 0 < box_width <= width and 0 < box_height <= height:
            top = int(rng.integers(0, height - box_height + 1))
            left = int(rng.integers(0, width - box_width + 1))
            return top, left, box_height, box_width
    aspect = width / height
    if aspect < min(ratio):
        box_width, box_height = width, round(width / min(ratio))
    elif aspect > max(ratio):
        box_width, box_height = round(height * max(ratio)), height
    else:
        box_width, box_height = width, height
    return (height - box_height) // 2, (width - box_width) // 2, box_height, box_width


def center_crop_box(height: int, width: int, size: tuple[int, int], resize: int | None = None) -> Box:
    """The central ``size`` box, offsets rounded as torchvision's ``CenterCrop`` rounds them. With
    ``resize``, the box that torchvision's ``Resize(resize)`` (shorter side to ``resize``, the longer
    truncated) then ``CenterCrop(size)`` cuts, in the original picture's pixels (fractional): resizing
    it to ``size`` gives the same picture with one resize instead of two.

    >>> center_crop_box(256, 320, (224, 224)), center_crop_box(257, 224, (224, 224))
    ((16, 48, 224, 224), (16, 0, 224, 224))
    >>> [round(v, 2) for v in center_crop_box(375, 500, (224, 224), resize=256)]
    [23.44, 85.04, 328.12, 328.45]
    """
    if resize is not None:
        if resize < max(size):
            raise OptionError(f"CenterCrop(size={size}, resize={resize}): resize must be at least the crop size")
        short, long = sorted((height, width))
        resized_long = int(resize * long / short)
        resized = (resize, resized_long) if height <= width else (resized_long, resize)
        top, left, box_height, box_width = center_crop_box(*resized, size)
        sy, sx = height / resized[0], width / resized[1]
        return top * sy, left * sx, box_height * sy, box_width * sx
    if size[0] > height or size[1] > width:
        raise OptionError(f"cannot cut a central {size[0]}x{size[1]} box from a {height}x{width} picture; "
                          "CenterCrop(size, resize=...) resizes pictures first")
    return round((height - size[0]) / 2), round((width - size[1]) / 2), size[0], size[1]
