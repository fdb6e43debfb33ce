"""Fit decoded pixels to a sample's (height, width): resize, crop the centre or pad, by policy; resize
boxes of a batch (RandomResizedCrop)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import numpy as np
from PIL import Image

from ..errors import ImageError, OptionError
from ..threads import for_each_run
from . import native
from .crops import Box, box_edges, box_part, within

ResizePolicy = Literal["fit", "crop", "pad"] | None
RESIZE_POLICIES: tuple[ResizePolicy, ...] = ("fit", "crop", "pad", None)


def parse_resize(resize: ResizePolicy) -> ResizePolicy:
    if resize not in RESIZE_POLICIES:
        raise OptionError(f"resize={resize!r} is not one of {RESIZE_POLICIES}")
    return resize


def fit(pixels: np.ndarray, size: tuple[int, int], resize: ResizePolicy, path: str) -> np.ndarray:
    """``pixels`` (h, w, c) at exactly ``size`` by the ``resize`` policy; `ImageError` naming ``path``
    when the policy is ``None`` and the size differs."""
    height, width = pixels.shape[:2]
    target_h, target_w = size
    if (height, width) == size:
        return pixels
    if resize is None:
        raise ImageError(
            path,
            f"image is {height}x{width}, expected {target_h}x{target_w}; "
            "pass resize='crop' (or resize='fit', resize='pad') to convert other sizes",
        )
    if resize == "fit":
        return _resize(pixels, target_h, target_w)
    if resize == "crop":
        return resize_edges(pixels, cover_box((height, width), size), size)
    (scaled_h, scaled_w), (top, left) = pad_placement((height, width), size)
    padded = np.zeros((target_h, target_w, pixels.shape[2]), dtype=pixels.dtype)
    padded[top : top + scaled_h, left : left + scaled_w] = _resize(pixels, scaled_h, scaled_w)
    return padded


def pad_placement(size: tuple[int, int], target: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """How the ``pad`` policy fits a picture of ``size`` into ``target``: the size it is resized to (within the
    target, keeping its shape) and where that lies (top, left), the rest padded.

    >>> pad_placement((100, 200), (100, 100))
    ((50, 100), (25, 0))
    """
    scale = min(target[0] / size[0], target[1] / size[1])
    scaled = min(target[0], max(1, round(size[0] * scale))), min(target[1], max(1, round(size[1] * scale)))
    return scaled, ((target[0] - scaled[0]) // 2, (target[1] - scaled[1]) // 2)


def cover(size: tuple[int, int], target: tuple[int, int]) -> tuple[float, float, int, int]:
    """``(sy, sx, top, left)``: how the ``crop`` policy scales a picture of ``size`` to cover ``target``
    (the scaled picture's sides over the picture's) and where it cuts the centre (in scaled pixels)."""
    height, width = size
    target_h, target_w = target
    scale = max(target_h / height, target_w / width)
    scaled_h, scaled_w = max(target_h, round(height * scale)), max(target_w, round(width * scale))
    return scaled_h / height, scaled_w / width, (scaled_h - target_h) // 2, (scaled_w - target_w) // 2


def cover_box(size: tuple[int, int], target: tuple[int, int]) -> tuple[float, float, float, float]:
    """The edges (top, left, bottom, right) of a picture of ``size`` that the ``crop`` policy keeps:
    resized to ``target``, they are the picture scaled to cover it with the centre cut, in one resize.

    >>> cover_box((300, 400), (150, 150))
    (0.0, 50.0, 300.0, 350.0)
    """
    sy, sx, top, left = cover(size, target)
    return top / sy, left / sx, (top + target[0]) / sy, (left + target[1]) / sx


def _resize(pixels: np.ndarray, height: int, width: int, box: Box | None = None, out: np.ndarray | None = None,
            flip: tuple[bool, bool] = (False, False)) -> np.ndarray:
    """``box`` (top, left, height, width; the whole picture by default) of ``pixels`` (h, w, c) resized to
    (height, width), as `resize_edges` does."""
    box = (0, 0, pixels.shape[0], pixels.shape[1]) if box is None else box
    return resize_edges(pixels, box_edges(box), (height, width), out, flip)


def resize_edges(pixels: np.ndarray, edges: tuple[float, float, float, float], size: tuple[int, int],
                 out: np.ndarray | None = None, flip: tuple[bool, bool] = (False, False)) -> np.ndarray:
    """The region of ``pixels`` (h, w, c) between ``edges`` (top, left, bottom, right) resized to ``size``,
    antialiased bilinear, columns first, then rows, mirrored left-right and top-bottom as ``flip`` says, into
    ``out`` when given. 8-bit data is rounded to 8 bits between the two passes, as Pillow's 8-bit resize rounds;
    other data is resized channel by channel as Pillow resizes a 32-bit float picture (float32 between and after the
    passes; integers then rounded half to even and held to their type's range). By the C extension where it is
    built (8-bit pictures of 1 or 3 channels; uint16, int16, float32 and float64 ones of any), else by Pillow one
    axis at a time: Pillow's own two-axis resize may take the axes in either order, and which depends on its
    version and the sizes; this order is outcore's, always. A region of whole pixels at its own size (a plain crop)
    is its pixels as they are: what the filter gives them, and, for RGBA, what Pillow's premultiplied alpha would
    not (it changes the colour of translucent pixels).

    >>> resize_edges(np.arange(16, dtype=np.uint8).reshape(4, 4, 1), (0, 0, 2, 4), (1, 2))[..., 0].tolist()
    [[4, 5]]
    """
    top, left, bottom, right = edges
    if (bottom - top, right - left) == tuple(size) and float(top).is_integer() and float(left).is_integer():
        region = pixels[int(top) : int(bottom), int(left) : int(right)]
        return _placed(region if out is not None else region.copy(), out, flip)
    if native.extension is not None and resized_in_c(pixels.dtype, pixels.shape[2]):
        with written_into(out, (*size, pixels.shape[2]), pixels.dtype) as target:
            native.extension.resize(np.ascontiguousarray(pixels), edges, target, *flip)
        return target if out is None else out
    if pixels.dtype == np.uint8:  # RGBA too: Pillow premultiplies its alpha
        image = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
        return _placed(np.asarray(_columns_then_rows(image, size, edges)).reshape(*size, pixels.shape[2]), out, flip)
    planes = np.stack([np.asarray(_columns_then_rows(Image.fromarray(pixels[..., c].astype(np.float32)), size, edges))
                       for c in range(pixels.shape[2])], axis=-1)
    if pixels.dtype.kind in "ui":
        info = np.iinfo(pixels.dtype)
        planes = np.clip(np.rint(planes), info.min, info.max)
    return _placed(planes.astype(pixels.dtype), out, flip)


C_KINDS = tuple(np.dtype(kind) for kind in ("uint16", "int16", "float32", "float64"))  # any channels; uint8: 1 or 3


def resized_in_c(dtype: np.dtype, channels: int) -> bool:
    """Whether the C extension resizes pictures of ``dtype`` with ``channels`` (as `resize_edges` says): uint8 ones of
    1 or 3 channels (Pillow premultiplies RGBA's alpha), uint16, int16, float32 and float64 ones of any, in the
    machine's byte order."""
    if dtype == np.uint8:
        return channels in (1, 3)
    return dtype in C_KINDS and dtype.isnative and channels >= 1


def _columns_then_rows(image: Image.Image, size: tuple[int, int], edges: tuple[float, float, float, float]
                       ) -> Image.Image:
    """Region ``edges`` of ``image`` resized to ``size`` by Pillow's bilinear filter, columns first, then rows: two
    resizes of one axis each."""
    height, width = size
    columns = image.resize((width, image.height), Image.Resampling.BILINEAR, box=(edges[1], 0, edges[3], image.height))
    return columns.resize((width, height), Image.Resampling.BILINEAR, box=(0, edges[0], width, edges[2]))


PRECISION_BITS = 22  # the C extension's fixed-point weights (as Pillow's): 8-bit samples times weights fit 32 bits


def resize_taps(starts: Sequence[float], ends: Sequence[float], limits: Sequence[int], size: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pillow's antialiased bilinear filter (outcore's resize, `resize_edges`) along one axis, as taps, for ``n``
    regions at once: ``(first, span, columns, weights)``: output pixel ``i`` of region ``k`` (``[starts[k],
    ends[k])`` of an axis of ``limits[k]`` pixels) resized to ``size`` is ``sum_j weights[k, i, j] * pixels[first[k]
    + columns[k, i, j]]``, rounded half up, the pixels read lying in ``[first[k], first[k] + span[k])`` (``first``
    and ``span`` (n,) int64; ``columns`` (n, size, taps) int64, ``weights`` float64: the C extension's fixed-point
    weights over ``2 ** PRECISION_BITS``, found as it finds them; unused taps weigh 0): for a device that resizes
    by such sums (`outcore.adapters.torch_decode`), the pixels outcore's threads give.

    >>> first, span, columns, weights = resize_taps([1.0], [3.0], [4], 1)  # a triangle twice as wide: pixels 1, 2 halved
    >>> first.tolist(), span.tolist(), columns[0].tolist(), (weights[0] * 8).tolist()
    ([0], [4], [[0, 1, 2, 3, 3]], [[1.0, 3.0, 3.0, 1.0, 0.0]])
    >>> first, span, columns, weights = resize_taps([1.0], [3.0], [4], 2)  # a plain crop: its pixels
    >>> first.tolist(), columns[0, :, 0].tolist(), weights[0, :, 0].tolist()
    ([1], [0, 1], [1.0, 1.0])
    """
    first_edge, last_edge = np.asarray(starts, np.float32), np.asarray(ends, np.float32)  # single, as in Pillow
    scale = (last_edge - first_edge).astype(np.float64)[:, None] / size
    support = np.maximum(scale, 1.0)  # the filter widens when shrinking: antialiasing
    widths = np.ceil(support).astype(np.int64) * 2 + 1
    centers = first_edge.astype(np.float64)[:, None] + (np.arange(size) + 0.5) * scale  # (n, size)
    low = np.maximum(np.trunc(centers - support + 0.5), 0).astype(np.int64)
    high = np.minimum(np.trunc(centers + support + 0.5), np.asarray(limits)[:, None]).astype(np.int64)
    count = np.clip(high - low, 0, widths)
    taps = np.arange(int(widths.max(initial=1)))
    distance = (taps + low[..., None] - centers[..., None] + 0.5) * (1.0 / support)[..., None]
    raw = np.where(taps < count[..., None], np.clip(1.0 - np.abs(distance), 0, None), 0.0)
    total = np.zeros(raw.shape[:2])
    for tap in range(raw.shape[2]):  # summed in order, as the C extension sums them
        total += raw[..., tap]
    normal = np.divide(raw, total[..., None], out=raw.copy(), where=total[..., None] != 0)
    weights = np.trunc(normal * (1 << PRECISION_BITS) + 0.5) / (1 << PRECISION_BITS)
    first = low.min(axis=1)
    span = np.maximum(1, (low + count).max(axis=1) - first)
    columns = np.minimum(low[..., None] - first[:, None, None] + taps, span[:, None, None] - 1)  # unused: inside, 0
    return first, span, columns, weights


@contextmanager
def written_into(out: np.ndarray | None, shape: tuple[int, int, int], dtype: type | np.dtype = np.uint8
                 ) -> Iterator[np.ndarray]:
    """A C-contiguous array of ``shape`` and ``dtype`` for C code to write: ``out`` itself (reshaped) where it can
    be, else a new one, copied into ``out`` (when given) afterwards."""
    direct = out is not None and out.flags.c_contiguous and out.dtype == dtype and out.size == np.prod(shape)
    target = out.reshape(shape) if direct else np.empty(shape, dtype)
    yield target
    if out is not None and not direct:
        out[...] = target.reshape(out.shape)


def _placed(resized: np.ndarray, out: np.ndarray | None, flip: tuple[bool, bool]) -> np.ndarray:
    """``resized`` mirrored as ``flip`` says, written into ``out`` when given."""
    mirrored = resized[::-1 if flip[1] else 1, ::-1 if flip[0] else 1]
    if out is None:
        return mirrored
    out[...] = mirrored.reshape(out.shape)
    return out


def resize_box(pixels: np.ndarray, box: Box, size: tuple[int, int], out: np.ndarray | None = None,
               flip: tuple[bool, bool] = (False, False)) -> np.ndarray:
    """``box`` of ``pixels`` (h, w, c) resized to ``size`` (bilinear, antialiased), mirrored as ``flip``
    (left-right, top-bottom) says, into ``out`` when given.

    >>> resize_box(np.arange(16, dtype=np.uint8).reshape(4, 4, 1), (0, 0, 2, 2), (1, 1))[..., 0].tolist()
    [[4]]
    """
    return _resize(pixels, size[0], size[1], box, out, flip)


def resize_boxes(images: np.ndarray, boxes: Sequence[Box] | np.ndarray, size: tuple[int, int],
                 flips: np.ndarray | None = None) -> np.ndarray:
    """``boxes[i]`` of ``images[i]`` (N, H, W[, C]) resized to ``size``, mirrored as ``flips[i]`` (left-right,
    top-bottom) says when given, into a new (N, *size[, C]) array; a box past its picture's edges is zeros there
    (`resize_part`). In runs on the pool's threads, a run's boxes one C call where it takes them (`resize_rows`).

    >>> images = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    >>> resize_boxes(images, [(0, 0, 2, 2), (2, 2, 2, 2)], (2, 2))[1].tolist()
    [[26, 27], [30, 31]]
    """
    out = np.empty((len(images), *size, *images.shape[3:]), images.dtype)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    mirrored = np.zeros((len(images), 2), np.uint8) if flips is None else np.asarray(flips, np.uint8).reshape(-1, 2)
    chunks, every = [np.ascontiguousarray(images)], np.arange(len(images))

    def run(start: int, stop: int) -> None:
        resize_rows(chunks, np.zeros(stop - start, np.int64), every[start:stop], boxes[start:stop], out,
                    every[start:stop], mirrored[start:stop])

    for_each_run(run, len(images))
    return out


def resize_rows(chunks: Sequence[np.ndarray], which: np.ndarray, local: np.ndarray, boxes: np.ndarray,
                out: np.ndarray, rows: np.ndarray, flips: np.ndarray) -> None:
    """Box ``boxes[k]`` (top, left, height, width) of picture ``local[k]`` of ``chunks[which[k]]`` resized into
    ``out[rows[k]]`` and mirrored as ``flips[k]`` (left-right, top-bottom) says, as `resize_part` does (zeros past
    the picture's edges), for every ``k``: in one C call outside the GIL for them all (``resize_each``), where the
    extension is built and takes the pictures (`resized_in_c`: uint8 of 1 or 3 channels, or none; uint16, int16,
    float32 or float64 of any), the chunks and ``out`` C-contiguous; else one by one, as are boxes past the edges by
    no more than ``crops.ROUNDING`` that single precision does not find inside.

    >>> chunks = [np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)]
    >>> out = np.zeros((1, 2, 2, 3), np.uint8)
    >>> resize_rows(chunks, np.array([0]), np.array([1]), np.array([[0.0, 0.0, 4.0, 4.0]]), out, np.array([0]),
    ...             np.zeros((1, 2), np.uint8))
    >>> bool((out[0] == resize_box(chunks[0][1], (0, 0, 4, 4), (2, 2))).all())
    True
    """
    pictures = [chunk[..., None] if chunk.ndim == 3 else chunk for chunk in chunks]  # (pictures, h, w, channels)
    for k in _resized_in_c(pictures, which, local, boxes, out, rows, flips):
        flip = flips[k].astype(bool).tolist()
        resize_part(chunks[which[k]][local[k]], tuple(boxes[k].tolist()), out.shape[1:3], out[rows[k]],
                    (flip[0], flip[1]))


def resize_spans(chunks: Sequence[np.ndarray], which: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                 boxes: np.ndarray, out: np.ndarray, rows: np.ndarray, flips: np.ndarray) -> None:
    """`resize_rows` for pictures of their own sizes stored one after the other (a raster field's rows: each chunk's
    values, (pixels[, channels])): picture ``k`` is ``sizes[k]`` (height, width) from pixel ``starts[k]`` of
    ``chunks[which[k]]``. In one C call outside the GIL for them all where the extension takes them (`resized_in_c`),
    else, and for the boxes it leaves, one by one (`resize_part`).

    >>> values = np.arange(4 * 4 + 2 * 2, dtype=np.uint8)  # a 4x4 picture, then a 2x2 one
    >>> out = np.zeros((1, 2, 2), np.uint8)
    >>> resize_spans([values], np.array([0]), np.array([16]), np.array([[2, 2]]), np.array([[0.0, 0.0, 2.0, 2.0]]),
    ...              out, np.array([0]), np.zeros((1, 2), np.uint8))
    >>> out[0].tolist()
    [[16, 17], [18, 19]]
    """
    values = [chunk.reshape(len(chunk), -1) for chunk in chunks]  # (pixels, channels)
    for k in _resized_in_c(values, which, starts, boxes, out, rows, flips, sizes):
        (height, width), first = sizes[k].tolist(), int(starts[k])
        picture = chunks[which[k]][first : first + height * width].reshape(height, width, *out.shape[3:])
        resize_part(picture, tuple(boxes[k].tolist()), out.shape[1:3], out[rows[k]],
                    (bool(flips[k, 0]), bool(flips[k, 1])))


def _resized_in_c(pictures: Sequence[np.ndarray], which: np.ndarray, local: np.ndarray, boxes: np.ndarray,
                  out: np.ndarray, rows: np.ndarray, flips: np.ndarray, sizes: np.ndarray | None = None
                  ) -> Sequence[int]:
    """`resize_rows` (``pictures``: each chunk's, (pictures, height, width, channels)) or `resize_spans` (with
    ``sizes``; ``pictures``: each chunk's values, (pixels, channels), ``local`` each picture's first pixel) by the C
    extension's ``resize_each``: the positions ``k`` it left (all where it is not built, or the arrays are not of its
    kinds)."""
    resize_each = getattr(native.extension, "resize_each", None)  # None: not built (or built before it was)
    into = out[..., None] if out.ndim == 3 else out
    if resize_each is None or not pictures or not resized_in_c(pictures[0].dtype, pictures[0].shape[-1]) \
            or into.dtype != pictures[0].dtype or not into.flags.c_contiguous \
            or not all(picture.flags.c_contiguous for picture in pictures):
        return range(len(which))
    which, local, rows = (np.ascontiguousarray(values, np.int64) for values in (which, local, rows))
    spans = () if sizes is None else (np.ascontiguousarray(sizes, np.int64),)
    return resize_each(pictures, which, local, np.ascontiguousarray(boxes, np.float64), into, rows,
                       np.ascontiguousarray(flips, np.uint8), *spans)


def resize_part(picture: np.ndarray, box: Box, size: tuple[int, int], out: np.ndarray, flip: tuple[bool, bool]) -> None:
    """``box`` of ``picture`` (h, w[, c]) resized to ``size`` (bilinear, antialiased) and mirrored as ``flip`` says,
    into ``out``: where the box passes the picture's edges, the part inside it resized to the part of the output it
    covers (`box_part`), zeros elsewhere.

    >>> out = np.full((2, 4), 9, np.uint8)
    >>> resize_part(np.full((4, 4), 5, np.uint8), (-4, 0, 8, 4), (2, 4), out, (False, False))
    >>> out.tolist()
    [[0, 0, 0, 0], [5, 5, 5, 5]]
    """
    if not (math.isfinite(sum(box)) and box[2] > 0 and box[3] > 0):
        raise OptionError(f"a crop drew the box {tuple(box)} (top, left, height, width): a crop's boxes are of "
                          "finite numbers, of a positive height and width")
    pixels = picture.reshape(*picture.shape[:2], -1)
    if within(box, pixels.shape[:2]):  # past the edges by rounding at most: held to them
        top, left, bottom, right = box_edges(box)
        edges = (max(top, 0), max(left, 0), min(bottom, pixels.shape[0]), min(right, pixels.shape[1]))
        resize_edges(pixels, edges, size, out.reshape(*size, -1), flip)
        return
    out[...] = 0
    part = box_part(box, pixels.shape[:2], size, flip)
    if part is not None:
        inside, part_size, (rows, columns) = part
        resize_box(pixels, inside, part_size, out[rows, columns].reshape(*part_size, -1), flip)
