"""Where one crop and flip of a picture move its dense targets: label maps, boxes and keypoints.

Every function takes a batch's draws as arrays: ``crops`` (n, 4) is each picture's box ``(top, left, height,
width)`` in its own pixels (`outcore.imaging.crops`; past its edges for a padded RandomCrop), resized to ``size``
(height, width), then mirrored as ``flips`` (n, 2) says (left-right, top-bottom). Coordinates are continuous:
pixel ``j`` spans ``[j, j + 1)``, so a point ``x`` of the picture lands at ``(x - left) * width_out / width`` and
a left-right flip sends it to ``width_out - x``. Label maps are cut by the same rule, nearest-neighbour: output
pixel ``i`` takes the picture's pixel under its centre, ``floor(top + (i + 0.5) * height / height_out)``, so an
id is never blended into another, and a box rasterised into a map before the transform covers exactly the
output pixels whose centres lie in the moved box after it (tests/test_targets.py proves it draw by draw).

A batch's instances (boxes, their keypoints and labels) are values with owners: ``owners[m]`` is the picture
instance ``m`` belongs to (`owners`, from offsets). All work is vectorised over the batch: one numpy call per
step, never a Python call per sample or per box.

>>> crops = np.array([[0.0, 10.0, 20.0, 20.0]])  # the window of rows 0-19, columns 10-29
>>> moved, kept = move_boxes(np.array([[12.0, 0.0, 16.0, 4.0]]), np.array([0]), crops, (40, 40),
...                          np.array([[True, False]]), BoxPolicy())
>>> moved.tolist(), kept.tolist()  # scaled by 2, then mirrored left-right in the 40-pixel output
([[28.0, 0.0, 36.0, 8.0]], [True])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from . import native


@dataclass(frozen=True)
class BoxPolicy:
    """Which boxes a crop keeps (with their labels, keypoints and other instance fields): a box goes when no
    part of it lies in the crop, when its part in the crop is narrower or lower than ``min_size`` output
    pixels, when that part is less than ``min_visible`` of the box's area, or, with ``centroid``, when its
    centre lies outside the crop (SSD's rule). Kept boxes are clipped to the crop.

    >>> BoxPolicy(min_visible=0.3)
    BoxPolicy(min_size=1.0, min_visible=0.3, centroid=False)
    """

    min_size: float = 1.0
    min_visible: float = 0.0
    centroid: bool = False

    def __post_init__(self) -> None:
        if not self.min_size >= 0:
            raise OptionError(f"BoxPolicy(min_size={self.min_size}): a size of output pixels, 0 or more")
        if not 0 <= self.min_visible <= 1:
            raise OptionError(f"BoxPolicy(min_visible={self.min_visible}): a share of the box's area, from 0 to 1")


def owners(offsets: np.ndarray) -> np.ndarray:
    """The picture each value belongs to, from ``offsets`` (n + 1,): picture ``i`` owns values
    ``offsets[i]:offsets[i + 1]``.

    >>> owners(np.array([0, 2, 2, 3])).tolist()
    [0, 0, 2]
    """
    offsets = np.asarray(offsets, np.int64)
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _scales(crops: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each crop's output pixels per picture pixel: (rows, columns), (n,) each."""
    crops = np.asarray(crops, np.float64).reshape(-1, 4)
    return size[0] / crops[:, 2], size[1] / crops[:, 3]


def move_points(xy: np.ndarray, which: np.ndarray, crops: np.ndarray, size: tuple[int, int],
                flips: np.ndarray) -> np.ndarray:
    """Points ``xy`` (..., 2: x, y) of pictures ``which`` (broadcast against ``xy[..., 0]``) moved by their
    picture's crop and flip, as float64.

    >>> move_points(np.array([[3.0, 1.0]]), np.array([0]), np.array([[0, 2, 4, 4]]), (8, 8), np.array([[1, 0]]))
    array([[6., 2.]])
    """
    crops = np.asarray(crops, np.float64).reshape(-1, 4)
    rows, columns = _scales(crops, size)
    flips = np.asarray(flips, bool).reshape(-1, 2)
    x = (xy[..., 0] - crops[which, 1]) * columns[which]
    y = (xy[..., 1] - crops[which, 0]) * rows[which]
    x = np.where(flips[which, 0], size[1] - x, x)
    y = np.where(flips[which, 1], size[0] - y, y)
    return np.stack([x, y], axis=-1)


def move_boxes(boxes: np.ndarray, which: np.ndarray, crops: np.ndarray, size: tuple[int, int], flips: np.ndarray,
               policy: BoxPolicy) -> tuple[np.ndarray, np.ndarray]:
    """Boxes ``(x0, y0, x1, y1)`` (m, 4) of pictures ``which`` (m,) moved by their picture's crop and flip and
    clipped to it: ``(moved, kept)``, moved (m, 4) float32 and kept (m,) the boxes `BoxPolicy` keeps."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    which = np.asarray(which, np.int64)
    corners = move_points(boxes.reshape(-1, 2, 2), which[:, None], crops, size, flips)  # (m, 2 corners, 2)
    low, high = corners.min(axis=1), corners.max(axis=1)  # a flip swaps the corners' order
    clipped_low = np.clip(low, 0, (size[1], size[0]))
    clipped_high = np.clip(high, 0, (size[1], size[0]))
    extent, whole = clipped_high - clipped_low, high - low
    visible = extent.prod(axis=1)
    kept = (extent > 0).all(axis=1) & (extent >= policy.min_size).all(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kept &= visible >= policy.min_visible * whole.prod(axis=1)
    if policy.centroid:
        centre = (low + high) / 2
        kept &= ((centre >= 0) & (centre < (size[1], size[0]))).all(axis=1)
    return np.concatenate([clipped_low, clipped_high], axis=1).astype(np.float32), kept


def move_keypoints(points: np.ndarray, which: np.ndarray, crops: np.ndarray, size: tuple[int, int], flips: np.ndarray,
                   pairs: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Keypoints (m, k, 2 or 3: x, y[, visibility]) of pictures ``which`` (m,) moved by their picture's crop and
    flip, as float32. A point that leaves the output is marked not visible (0) where there is a visibility;
    after a mirror image (one flip, not both) each of ``pairs`` (left, right indices) swaps places, as a left
    hand becomes a right one.

    >>> points = np.array([[[1.0, 1.0, 2.0], [3.0, 1.0, 2.0]]])  # a left and a right eye
    >>> move_keypoints(points, np.array([0]), np.array([[0, 0, 4, 4]]), (4, 4), np.array([[1, 0]]), [(0, 1)]).tolist()
    [[[1.0, 1.0, 2.0], [3.0, 1.0, 2.0]]]
    """
    points = np.asarray(points)
    which = np.asarray(which, np.int64)
    moved = points.astype(np.float32, copy=True)
    if points.shape[-1] < 2 or points.ndim != 3:
        raise OptionError(f"keypoints of shape {points.shape}: they are (instances, points, 2 or 3: x, y[, visibility])")
    xy = move_points(points[..., :2].astype(np.float64), which[:, None], crops, size, flips)
    moved[..., :2] = xy
    if points.shape[-1] > 2:
        outside = ((xy < 0) | (xy >= (size[1], size[0]))).any(axis=-1)
        moved[..., 2] = np.where(outside, 0, moved[..., 2])
    if pairs:
        flips = np.asarray(flips, bool).reshape(-1, 2)
        mirrored = flips[which, 0] != flips[which, 1]
        left, right = np.asarray(pairs, np.int64).reshape(-1, 2).T
        swapped = moved.copy()
        swapped[:, left], swapped[:, right] = moved[:, right], moved[:, left]
        moved = np.where(mirrored[:, None, None], swapped, moved)
    return moved


def source_lines(starts: np.ndarray, lengths: np.ndarray, count: int, mirrored: np.ndarray) -> np.ndarray:
    """For each crop, the picture's line (row or column) under the centre of each of its ``count`` output
    lines: ``floor(start + (i + 0.5) * length / count)``, reversed where ``mirrored``; (n, count) int64.

    >>> source_lines(np.array([2.0, 0.0]), np.array([2.0, 4.0]), 4, np.array([False, True])).tolist()
    [[2, 2, 3, 3], [3, 2, 1, 0]]
    """
    centres = (np.arange(count) + 0.5) / count
    lines = np.floor(starts[:, None] + centres[None, :] * lengths[:, None]).astype(np.int64)
    return np.where(np.asarray(mirrored, bool)[:, None], lines[:, ::-1], lines)


def cut_label_maps(maps: np.ndarray, crops: np.ndarray, size: tuple[int, int], flips: np.ndarray, fill: int = 0,
                   out: np.ndarray | None = None) -> np.ndarray:
    """Each label map (n, h, w[, c]) cut to its crop, resized to ``size`` nearest-neighbour and mirrored, into
    ``out`` (n, *size[, c]) when given: every value is one of the map's own (``fill`` where the crop lies past
    the picture's edges). One C call for the whole batch, outside the GIL (a numpy gather without the C extension).

    >>> maps = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    >>> cut_label_maps(maps, np.array([[0, 0, 2, 2]]), (4, 4), np.array([[0, 0]])).tolist()
    [[[0, 0, 1, 1], [0, 0, 1, 1], [4, 4, 5, 5], [4, 4, 5, 5]]]
    """
    maps = np.ascontiguousarray(maps)
    count, (height, width) = len(maps), maps.shape[1:3]
    target = out if out is not None and out.flags.c_contiguous else np.empty((count, *size, *maps.shape[3:]),
                                                                              maps.dtype)
    every = np.arange(count, dtype=np.int64)
    cut_maps([maps], np.zeros(count, np.int64), every * height * width, np.tile([height, width], (count, 1)), crops,
             size, flips, fill, target, every)
    if out is not None and target is not out:
        out[...] = target
    return target if out is None else out


def cut_maps(chunks: Sequence[np.ndarray], which: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
             crops: np.ndarray, size: tuple[int, int], flips: np.ndarray, fill: int, out: np.ndarray,
             targets: np.ndarray) -> None:
    """Map ``k``, the ``sizes[k]`` (height, width) pixels stored from pixel ``starts[k]`` of ``chunks[which[k]]``
    (C-contiguous arrays of ``out``'s dtype, a pixel ``out.shape[3:]``), cut to ``crops[k]``, resized to ``size``
    nearest-neighbour and mirrored as ``flips[k]`` says, into ``out[targets[k]]``, for every ``k``: maps of one
    size in one array (`cut_label_maps`), or maps of their pictures' own sizes back to back in the chunks of a
    field (a raster field, `outcore.format.encoded`). One C call, outside the GIL (numpy, map by map, without it).

    >>> chunk = np.arange(10, dtype=np.uint8)  # a 2 x 2 map, then a 2 x 3 one
    >>> out = np.zeros((2, 2, 2), np.uint8)
    >>> cut_maps([chunk], np.array([0, 0]), np.array([0, 4]), np.array([[2, 2], [2, 3]]),
    ...          np.array([[0, 0, 2, 2], [0, 1, 2, 2]]), (2, 2), np.array([[0, 0], [1, 0]]), 0, out, np.array([1, 0]))
    >>> out.tolist()
    [[[6, 5], [9, 8]], [[0, 1], [2, 3]]]
    """
    if out.ndim < 3 or out.shape[1:3] != tuple(size):  # the C call cuts to out's size: the two must agree
        raise ValueError(f"cut_maps: out's maps are {out.shape[1:3]}, not the size {tuple(size)} asked for")
    crops = np.ascontiguousarray(crops, np.float64).reshape(-1, 4)
    sizes = np.ascontiguousarray(sizes, np.int64).reshape(-1, 2)
    pixel = out.shape[3:]
    if native.windows is not None:  # one C call, outside the GIL, each map's lines found there (`source_lines`)
        native.windows.lines(list(chunks), np.ascontiguousarray(which, np.int64), np.ascontiguousarray(starts, np.int64),
                             sizes, crops, np.ascontiguousarray(flips, np.uint8).reshape(-1, 2), out,
                             np.ascontiguousarray(targets, np.int64), np.full(pixel, fill, out.dtype).tobytes())
        return
    flips = np.asarray(flips, bool).reshape(-1, 2)
    rows = source_lines(crops[:, 0], crops[:, 2], size[0], flips[:, 1])
    columns = source_lines(crops[:, 1], crops[:, 3], size[1], flips[:, 0])
    for k, (chunk, start, (height, width)) in enumerate(zip(np.asarray(which).tolist(), np.asarray(starts).tolist(),
                                                            sizes.tolist(), strict=True)):
        values = chunks[chunk].reshape(-1, *pixel)
        if start < 0 or start + height * width > len(values):
            raise IndexError(f"map {k} (pixels {start} of {height} x {width}) lies past its chunk's {len(values)}")
        picture = values[start : start + height * width].reshape(height, width, *pixel)
        cut = picture[np.clip(rows[k], 0, max(0, height - 1))[:, None], np.clip(columns[k], 0, max(0, width - 1))[None, :]] \
            if height and width else np.zeros((*size, *pixel), out.dtype)
        outside = ((rows[k] < 0) | (rows[k] >= height))[:, None] | ((columns[k] < 0) | (columns[k] >= width))[None, :]
        cut[outside] = fill
        out[targets[k]] = cut
