"""Vectorized, seeded batch augmentations: ``transform(batch, rng) -> batch``.

Each transform works on one field of the batch dict (``"images"`` by default, samples on axis 0,
``(N, H, W, C)``) for the whole batch at once, and draws its randomness only from ``rng``. The iterator
calls it on each stream's piece of a batch, with a generator seeded from ``(seed, epoch, step, stream)``
(`outcore.iterate.batch.make_batch`): the same samples get the same augmentation wherever and whenever
they are produced, on any number of ranks. A transform whose ``random`` is False (`Normalize`, `Cast`)
draws nothing: at the end of a pipeline it runs once on the whole batch. Batches are not modified in place.

>>> import numpy as np
>>> augment = Compose([RandomCrop(24, padding=4), RandomFlip(), Normalize(mean=0.5, std=0.25)])
>>> batch = {"images": np.zeros((8, 24, 24, 3), np.uint8), "labels": np.arange(8)}
>>> augment(batch, np.random.default_rng(0))["images"].dtype
dtype('float32')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import OptionError
from ..imaging import (
    Box,
    brightness_contrast,
    center_crop_box,
    random_resized_crop_box,
    resize_boxes,
    table_lookup,
    to_half,
)
from ..seeds import (
    crops_and_flips,
    integers,
    resized_crop_boxes,
    resized_crops_and_flips,
    scale_jitters_and_flips,
    uniform,
)
from ..storage import blocks
from ..threads import for_each_run
from .batch import TRANSFORM_DOMAIN, Batch, Draws, Transform, steps
from .gather import copy_windows, move_pictures, run_length
from .targets import Targets, check_targets, moved


def _field(batch: Batch, field: str) -> np.ndarray:
    if field not in batch:
        raise KeyError(f"transform needs field {field!r}; the batch has {sorted(batch)}")
    return batch[field]


def _replace(batch: Batch, field: str, values: np.ndarray) -> Batch:
    return {**batch, field: values}


@dataclass(frozen=True)
class Compose:
    """Apply transforms in order. Geometric steps of one picture field must move the same `Targets`."""

    transforms: Sequence[Transform]

    def __post_init__(self) -> None:
        check_targets(steps(self))

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        for transform in self.transforms:
            batch = transform(batch, rng)
        return batch


@dataclass(frozen=True)
class RandomFlip:
    """Mirror each image left-right (and/or top-bottom) with probability ``p``, and its ``targets`` with it."""

    p: float = 0.5
    horizontal: bool = True
    vertical: bool = False
    field: str = "images"
    targets: Targets | None = None
    # its own class, not a subclass's: opening the transform of a pixel field without targets, it mirrors each picture
    # as it is copied out of its chunk, drawn as `draw` draws (`outcore.iterate.batch.WholePictures`)
    whole_pictures: ClassVar[bool] = True

    def draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """Which of ``count`` images to mirror: (count, 2) booleans, left-right then top-bottom (a crop
        fused with decoding mirrors each box as it is decoded)."""
        flips = np.zeros((count, 2), dtype=bool)
        for column, enabled in enumerate((self.horizontal, self.vertical)):
            if enabled:
                flips[:, column] = uniform(rng, count) < self.p
        return flips

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = _field(batch, self.field)
        corners = np.zeros((len(images), 2), np.int64)
        flips = self.draw(len(images), rng)
        crops = np.tile([0, 0, *images.shape[1:3]], (len(images), 1))
        return moved(batch, self.field, copy_windows(images, corners, images.shape[1:3], flips), self.targets, crops, flips)


@dataclass(frozen=True)
class RandomCrop:
    """Zero-pad by ``padding`` pixels, then cut a random ``size`` window from each image. Opening a
    transform on an encoded field, each window is cut while decoding (only its pixels are decoded).

    >>> batch = {"images": np.arange(2 * 3 * 3).reshape(2, 3, 3)}
    >>> RandomCrop(2, padding=1).boxes([(3, 3)] * 2, np.random.default_rng(0)).tolist()  # (top, left, height, width)
    [[2, 1, 2, 2], [1, 0, 2, 2]]
    >>> windows = RandomCrop(2, padding=1)(batch, np.random.default_rng(0))["images"]
    >>> windows[0].tolist()  # rows 2 and 3 (the padding) of the first image, columns 1 and 2
    [[7, 8], [0, 0]]
    """

    size: int | tuple[int, int]
    padding: int = 0
    field: str = "images"
    targets: Targets | None = None
    windows: ClassVar[bool] = True  # every box it draws is a window of whole pixels at its size (copied as it is)

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def boxes(self, sizes: Sequence[tuple[int, int]] | np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The window of each image of ``(height, width)`` in ``sizes``, drawn in order (every top, then every
        left): ``(top, left, height, width)`` rows in the image's own pixels, past its edges by up to
        ``padding`` (zeros there). An encoded field's are drawn from its stored sizes and cut while decoding."""
        (height, width), pad = self.output_size, self.padding
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        boxes = np.empty((len(sizes), 4), np.int64)
        boxes[:, 2:] = height, width
        if not len(sizes) or (sizes == sizes[0]).all():  # one size for all (a pixel field's): one bound a side
            (rows, columns), count = (sizes[0].tolist() if len(sizes) else (height, width)), len(sizes)
            self._fits(rows, columns)
            boxes[:, 0] = integers(rng, rows + 2 * pad - height + 1, count)  # every top, then every left
            boxes[:, 1] = integers(rng, columns + 2 * pad - width + 1, count)
            if pad:
                boxes[:, :2] -= pad
            return boxes
        rows, columns = sizes.T
        small = (rows + 2 * pad < height) | (columns + 2 * pad < width)
        if small.any():
            at = int(np.argmax(small))
            self._fits(int(rows[at]), int(columns[at]))
        boxes[:, 0] = rng.integers(0, rows + 2 * pad - height + 1) - pad  # a bound an image
        boxes[:, 1] = rng.integers(0, columns + 2 * pad - width + 1) - pad
        return boxes

    def boxes_of_pieces(self, sizes: np.ndarray, pieces: Draws, flip: object) -> tuple[np.ndarray, np.ndarray] | None:
        """The boxes of a batch's images of ``sizes`` ((n, 2) int64) and ``flip``'s mirrors ((n, 2) uint8, none
        without a flip): each piece ``(count, key)`` of the batch (`outcore.iterate.batch.batch_draws`) drawn as its
        generator draws them in `boxes` then `RandomFlip.draw`, all in one call (`outcore.seeds.crops_and_flips`);
        None where they are drawn piece by piece instead: images of several sizes or too small (`boxes` names
        them), a flip or crop of another kind, no C extension.

        >>> from outcore.iterate.batch import transform_generator
        >>> sizes, pieces = np.full((3, 2), 8), [(2, (0, 0, 0, 0)), (1, (0, 0, 0, 1))]
        >>> boxes, flips = RandomCrop(4).boxes_of_pieces(sizes, pieces, RandomFlip()) or (None, None)
        >>> boxes is None or boxes[2:].tolist() == RandomCrop(4).boxes(sizes[2:], transform_generator((0, 0, 0, 1))).tolist()
        True
        """
        if type(self) is not RandomCrop or not _plain_flip(flip) or not len(sizes) or not _one_size(sizes):
            return None
        (height, width), pad = self.output_size, self.padding
        rows, columns = sizes[0].tolist()
        if rows + 2 * pad < height or columns + 2 * pad < width:
            return None
        return crops_and_flips(TRANSFORM_DOMAIN, pieces, (rows + 2 * pad - height + 1, columns + 2 * pad - width + 1),
                               *_mirrors(flip), window=(height, width), pad=pad)

    def _fits(self, rows: int, columns: int) -> None:
        """Refuse an image of ``rows`` x ``columns`` the window cannot be cut from, padding included."""
        (height, width), pad = self.output_size, self.padding
        if rows + 2 * pad < height or columns + 2 * pad < width:
            raise OptionError(f"RandomCrop cannot cut {height}x{width} from an image of {rows}x{columns} "
                              f"padded by {pad}: crop less, or pad more")

    def cut_boxes(self, pictures: np.ndarray, boxes: np.ndarray, flips: np.ndarray | None = None) -> np.ndarray:
        """The windows ``boxes`` (its own, `boxes`) of ``pictures``, mirrored as ``flips`` says: what it makes of a
        batch (after a user's step, of the joined pieces: `outcore.iterate.batch.on_joined`)."""
        return copy_windows(pictures, np.asarray(boxes, np.int64)[:, :2], self.output_size, flips)

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = _field(batch, self.field)
        boxes = self.boxes([images.shape[1:3]] * len(images), rng)
        return moved(batch, self.field, self.cut_boxes(images, boxes), self.targets, boxes)


@dataclass(frozen=True)
class RandomResizedCrop:
    """Cut from each image a box of a random share of its area (``scale``) and aspect ratio
    (``ratio``), and resize it to ``size`` (bilinear, antialiased): torchvision's rule, with its 10
    tries and central fallback (`outcore.imaging.crops.random_resized_crop_box`).

    >>> batch = {"images": np.zeros((4, 64, 48, 3), np.uint8)}
    >>> RandomResizedCrop(32)(batch, np.random.default_rng(0))["images"].shape
    (4, 32, 32, 3)
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    field: str = "images"
    targets: Targets | None = None

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def boxes(self, sizes: Sequence[tuple[int, int]], rng: np.random.Generator) -> list[Box]:
        """One box per image of ``(height, width)`` in ``sizes``, drawn in order (an encoded field's boxes
        are drawn from its stored sizes and cut while decoding)."""
        pairs = np.asarray(sizes, np.int64).reshape(-1, 2)
        drawn = resized_crop_boxes(rng, pairs, self.scale, self.ratio)
        if drawn is not None:  # in one C call: a Python loop of a dozen calls a picture held the GIL most
            return list(map(tuple, drawn.tolist()))
        return [random_resized_crop_box(height, width, self.scale, self.ratio, rng) for height, width in pairs.tolist()]

    def boxes_of_pieces(self, sizes: np.ndarray, pieces: Draws, flip: object) -> tuple[np.ndarray, np.ndarray] | None:
        """The boxes of a batch's images of ``sizes`` and ``flip``'s mirrors, each piece's drawn as its generator
        draws them, all in one call (`outcore.seeds.resized_crops_and_flips`): as `RandomCrop.boxes_of_pieces`."""
        if type(self) is not RandomResizedCrop or not _plain_flip(flip):
            return None
        return resized_crops_and_flips(TRANSFORM_DOMAIN, pieces, sizes, self.scale, self.ratio, *_mirrors(flip))

    def cut_boxes(self, pictures: np.ndarray, boxes: Sequence[Box] | np.ndarray,
                  flips: np.ndarray | None = None) -> np.ndarray:
        """``boxes`` of ``pictures`` resized to its size and mirrored as ``flips`` says (`RandomCrop.cut_boxes`)."""
        return resize_boxes(pictures, boxes, self.output_size, flips)

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = _field(batch, self.field)
        boxes = self.boxes([images.shape[1:3]] * len(images), rng)
        return moved(batch, self.field, self.cut_boxes(images, boxes), self.targets, boxes)


@dataclass(frozen=True)
class CenterCrop:
    """Cut the central ``size`` window of each image; with ``resize``, of the image whose shorter side
    was first resized to ``resize`` — validation's ``Resize(256)`` then ``CenterCrop(224)`` is
    ``CenterCrop(224, resize=256)``, one resize of the central box (pictures of varying sizes need it).

    >>> batch = {"images": np.arange(2 * 4 * 4).reshape(2, 4, 4)}
    >>> images = CenterCrop(2)(batch, np.random.default_rng(0))["images"]
    >>> images.shape, int(images[0, 0, 0]), int(images[1, 1, 1])
    ((2, 2, 2), 5, 26)
    >>> CenterCrop(2, resize=4)({"images": np.zeros((1, 8, 12, 3), np.uint8)}, None)["images"].shape
    (1, 2, 2, 3)
    """

    size: int | tuple[int, int]
    resize: int | None = None
    field: str = "images"
    targets: Targets | None = None

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def boxes(self, sizes: Sequence[tuple[int, int]] | np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        """The central box of each image of ``(height, width)`` in ``sizes`` (an encoded field's are cut
        while decoding), (n, 4) float64: found once for each size (a batch's pictures are of a few)."""
        pairs = np.asarray(sizes, np.int64).reshape(-1, 2)
        if not len(pairs):
            return np.empty((0, 4), np.float64)
        if _one_size(pairs):
            found = np.array([center_crop_box(*pairs[0].tolist(), self.output_size, self.resize)], np.float64)
            return np.broadcast_to(found, (len(pairs), 4))
        each, where = np.unique(pairs, axis=0, return_inverse=True)
        found = [center_crop_box(height, width, self.output_size, self.resize) for height, width in each.tolist()]
        return np.array(found, np.float64)[where.reshape(-1)]

    def boxes_of_pieces(self, sizes: np.ndarray, pieces: Draws, flip: object) -> tuple[np.ndarray, np.ndarray] | None:
        """The boxes of a batch's images of ``sizes`` (it draws nothing) and ``flip``'s mirrors, each piece's drawn
        as its generator draws them in `RandomFlip.draw` (`outcore.seeds.crops_and_flips`: a window of one place
        draws nothing), in one call; None for a flip of another kind, a picture too small for it (named where the
        boxes are drawn piece by piece), or without the C extension."""
        if type(self) is not CenterCrop or not _plain_flip(flip):
            return None
        try:
            boxes = np.ascontiguousarray(self.boxes(sizes, None))
        except OptionError:  # a picture too small: found again piece by piece, and named
            return None
        if flip is None:
            return boxes, np.zeros((len(boxes), 2), np.uint8)
        drawn = crops_and_flips(TRANSFORM_DOMAIN, pieces, (1, 1), *_mirrors(flip), window=self.output_size)
        return None if drawn is None else (boxes, drawn[1])

    def cut_boxes(self, pictures: np.ndarray, boxes: np.ndarray, flips: np.ndarray | None = None) -> np.ndarray:
        """``boxes`` of ``pictures``, resized to its size where they are not already of it (a window of whole pixels
        at its size is copied as it is), mirrored as ``flips`` says (`RandomCrop.cut_boxes`)."""
        return move_pictures(pictures, boxes, self.output_size, flips)

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = _field(batch, self.field)
        boxes = self.boxes(np.tile(images.shape[1:3], (len(images), 1)), rng)
        return moved(batch, self.field, self.cut_boxes(images, boxes), self.targets, boxes)


@dataclass(frozen=True)
class ScaleJitter:
    """Large-scale jitter (as torchvision's detection references do it: ``ScaleJitter`` then ``FixedSizeCrop``):
    each picture is resized by a random factor in ``scale`` of the one that fits it in ``size`` (its aspect kept),
    then a ``size`` window is cut at a random place of it, zeros (a label map's ``fill``) past its bottom and right
    edges. The window lies in the picture's own pixels as a box (top, left, height, width) past its edges where the
    scaled picture is smaller: `Targets` move by it, as by any crop. Opening a transform, it is done as the batch
    is made, as the other crops are (while decoding an encoded field: pictures of their own sizes too).

    >>> batch = {"images": np.zeros((4, 60, 80, 3), np.uint8)}
    >>> ScaleJitter(64, scale=(0.5, 1.5))(batch, np.random.default_rng(0))["images"].shape
    (4, 64, 64, 3)
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.1, 2.0)
    field: str = "images"
    targets: Targets | None = None

    @property
    def output_size(self) -> tuple[int, int]:
        return _pair(self.size)

    def boxes(self, sizes: Sequence[tuple[int, int]] | np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each picture's window in its own pixels (n, 4: top, left, height, width; past its bottom and right edges
        where the scaled picture is smaller than the output), drawn in order: every scale, every top, every left."""
        (height, width), sizes = self.output_size, np.asarray(sizes, np.float64).reshape(-1, 2)
        rows, columns = sizes.T
        factor = rng.uniform(*self.scale, len(sizes)) * np.minimum(height / rows, width / columns)
        scaled_rows = np.maximum(1, np.round(rows * factor))
        scaled_columns = np.maximum(1, np.round(columns * factor))
        top = np.floor(rng.random(len(sizes)) * (np.maximum(0, scaled_rows - height) + 1))
        left = np.floor(rng.random(len(sizes)) * (np.maximum(0, scaled_columns - width) + 1))
        sy, sx = rows / scaled_rows, columns / scaled_columns  # picture pixels a scaled pixel
        return np.stack([top * sy, left * sx, height * sy, width * sx], axis=1)

    def boxes_of_pieces(self, sizes: np.ndarray, pieces: Draws, flip: object) -> tuple[np.ndarray, np.ndarray] | None:
        """The windows of a batch's pictures of ``sizes`` and ``flip``'s mirrors, each piece's drawn as its generator
        draws them, all in one call (`outcore.seeds.scale_jitters_and_flips`): as `RandomCrop.boxes_of_pieces`."""
        if type(self) is not ScaleJitter or not _plain_flip(flip):
            return None
        return scale_jitters_and_flips(TRANSFORM_DOMAIN, pieces, sizes, self.scale, self.output_size, *_mirrors(flip))

    def cut_boxes(self, pictures: np.ndarray, boxes: np.ndarray, flips: np.ndarray | None = None) -> np.ndarray:
        """The windows ``boxes`` of ``pictures`` resized to its size, zeros past their edges, mirrored as ``flips``
        says (`RandomCrop.cut_boxes`)."""
        return move_pictures(pictures, boxes, self.output_size, flips)

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = _field(batch, self.field)
        windows = self.boxes(np.tile(images.shape[1:3], (len(images), 1)), rng)
        return moved(batch, self.field, self.cut_boxes(images, windows), self.targets, windows)


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


@dataclass(frozen=True)
class BrightnessContrast:
    """Scale contrast by a factor in ``1 ± contrast`` and shift brightness by ``± brightness`` of the
    range, per image; results are clipped to the dtype's range (``[0, 1]`` for floats, given as float32). By runs of
    images on the pool's free threads: uint8 images a run in one C call (`outcore.imaging.brightness_contrast`, each
    picture's mean exact), others with numpy.

    >>> images = np.array([[[10, 30]]], np.uint8)
    >>> BrightnessContrast(0.1, 0.5)({"images": images}, np.random.default_rng(0))["images"].tolist()
    [[[0, 19]]]
    """

    brightness: float = 0.2
    contrast: float = 0.2
    field: str = "images"

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        return self.apply_draws(batch, self.sample_draws(len(_field(batch, self.field)), rng))

    def sample_draws(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """What it draws for ``count`` pictures from ``rng``: each one's contrast factor, then each one's brightness
        shift (a share of the range). Each picture's result is its own, so the draws of a batch's pieces, each from its
        generator, are applied to the joined batch at once (`outcore.iterate.batch.make_batch`)."""
        factors = rng.uniform(1 - self.contrast, 1 + self.contrast, size=count).astype(np.float32)
        return factors, rng.uniform(-self.brightness, self.brightness, size=count).astype(np.float32)

    def apply_draws(self, batch: Batch, drawn: tuple[np.ndarray, np.ndarray]) -> Batch:
        """``batch`` with each picture adjusted by its draws (`sample_draws`)."""
        images = _field(batch, self.field)
        top = float(np.iinfo(images.dtype).max) if images.dtype.kind in "ui" else 1.0
        factors, shifts = drawn[0], drawn[1] * top
        out = blocks.empty(images.shape, images.dtype if images.dtype.kind in "ui" else np.float32)  # floats: float32
        if images.dtype == np.uint8:

            def run(start: int, stop: int) -> None:
                brightness_contrast(images[start:stop], factors[start:stop], shifts[start:stop], out[start:stop])
        else:
            shape = (-1,) + (1,) * (images.ndim - 1)

            def run(start: int, stop: int) -> None:
                values = images[start:stop].astype(np.float32)
                mean = values.mean(axis=tuple(range(1, images.ndim)), keepdims=True, dtype=np.float64).astype(np.float32)
                adjusted = np.clip((values - mean) * factors[start:stop].reshape(shape) + mean
                                   + shifts[start:stop].reshape(shape), 0, top)
                np.copyto(out[start:stop], adjusted, casting="unsafe")

        for_each_run(run, len(images), run_length(out))
        return _replace(batch, self.field, out)


@dataclass(frozen=True)
class Normalize:
    """``(x * scale - mean) / std`` as ``dtype`` (float32, or float16 for mixed precision: the float32 results
    rounded, as `Cast` after it would, in one pass); ``scale`` defaults to 1/255 for uint8 and 1/65535 for uint16. By
    runs of images on the pool's free threads; uint8 images through a table of the 256 values' results, a run in one
    C call (`outcore.imaging.table_lookup`), into memory used again (`outcore.storage.blocks`).

    >>> images = np.array([[[0, 255]]], np.uint8)
    >>> Normalize(mean=0.5, std=0.5)({"images": images}, None)["images"].tolist()
    [[[-1.0, 1.0]]]
    >>> Normalize(mean=0.5, std=0.5, dtype="float16")({"images": images}, None)["images"].dtype
    dtype('float16')
    """

    mean: float | Sequence[float] = 0.0
    std: float | Sequence[float] = 1.0
    scale: float | None = None
    field: str = "images"
    dtype: str | np.dtype = "float32"
    random: ClassVar[bool] = False  # draws nothing from ``rng``: run once per batch, not per piece
    per_sample: ClassVar[bool] = True  # each sample's result is its own: batches made as one may be cut apart after

    def __post_init__(self) -> None:
        try:
            known = np.dtype(self.dtype) in (np.float32, np.float16)
        except TypeError:  # not a dtype at all
            known = False
        if not known:
            raise OptionError(f"Normalize(dtype={self.dtype!r}): float32 or float16 (Cast after it for another dtype)")

    def then(self, step: object) -> Normalize | None:
        """The `Normalize` that gives what this one then ``step`` give, in one pass, where ``step`` is a `Cast` of its
        field to float16 or float32 (the same values: the float32 results rounded); else None. A batch's tail is so
        made one (`outcore.iterate.batch.Recipe`)."""
        if type(step) is not Cast or step.field != self.field or np.dtype(step.dtype) not in (np.float16, np.float32) \
                or np.dtype(self.dtype).itemsize < np.dtype(step.dtype).itemsize:  # float16's values widened: not so
            return None
        return dataclasses.replace(self, dtype=np.dtype(step.dtype).name)

    def table(self, channels: int) -> np.ndarray | None:
        """What each of the 256 values of a uint8 picture of ``channels`` channels becomes ((256, 1), or (256,
        ``channels``) where the mean or std is one a channel, of ``dtype``): the same floats as computed one by one;
        None where the mean or std is neither one value nor one a channel.

        >>> Normalize(0.5, 0.5).table(3)[[0, 255]].tolist()
        [[-1.0], [1.0]]
        """
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        if not {mean.size, std.size} <= {1, channels} or max(mean.ndim, std.ndim) > 1:
            return None
        scale = np.float32(self.scale if self.scale is not None else 1 / np.iinfo(np.uint8).max)
        table = (np.arange(256, dtype=np.float32)[:, None] * scale - mean.reshape(-1)) / std.reshape(-1)
        return table.astype(np.dtype(self.dtype))

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        images = _field(batch, self.field)
        scale = np.float32(self.scale if self.scale is not None else (
            1 / np.iinfo(images.dtype).max if images.dtype.kind in "ui" else 1.0))
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        out = blocks.empty(np.broadcast_shapes(images.shape, mean.shape, std.shape), np.dtype(self.dtype))
        table = None
        if images.dtype == np.uint8 and out.shape == images.shape:  # a table of the 256 values' floats, per channel
            table = self.table(images.shape[-1] if images.ndim > 1 else 1)
        if table is not None:

            def run(start: int, stop: int) -> None:
                table_lookup(images[start:stop], table, out[start:stop])
        else:

            def run(start: int, stop: int) -> None:
                out[start:stop] = (images[start:stop].astype(np.float32) * scale - mean) / std

        for_each_run(run, len(images), run_length(out))
        return _replace(batch, self.field, out)


@dataclass(frozen=True)
class Cast:
    """Convert a field to ``dtype`` (e.g. float16 images, int32 labels), as numpy's ``astype`` does. By runs of the
    batch's samples on the pool's free threads: uint8 values through a table of the 256 values' results, float32 to
    float16 by the CPU's own conversion (`outcore.imaging.to_half`), a run in one C call each; others with numpy.

    >>> Cast("float16")({"images": np.array([[1, 255]], np.uint8)}, None)["images"].tolist()
    [[1.0, 255.0]]
    """

    dtype: str | np.dtype
    field: str = "images"
    random: ClassVar[bool] = False
    per_sample: ClassVar[bool] = True

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        values, dtype = _field(batch, self.field), np.dtype(self.dtype)
        if values.dtype.kind not in "biuf" or dtype.kind not in "biuf" or not values.ndim:
            return _replace(batch, self.field, values.astype(dtype))
        out = blocks.empty(values.shape, dtype)
        if values.dtype == np.uint8 and dtype.itemsize in (2, 4):
            table = np.arange(256, dtype=np.uint8).astype(dtype)[:, None]

            def run(start: int, stop: int) -> None:
                table_lookup(values[start:stop], table, out[start:stop])
        elif values.dtype == np.float32 and dtype == np.float16:

            def run(start: int, stop: int) -> None:
                to_half(values[start:stop], out[start:stop])
        else:

            def run(start: int, stop: int) -> None:
                np.copyto(out[start:stop], values[start:stop], casting="unsafe")

        for_each_run(run, len(values), run_length(out))
        return _replace(batch, self.field, out)


def _one_size(sizes: np.ndarray) -> bool:
    """Whether pictures of ``sizes`` ((n, 2)) are all of one size: by construction where the rows are one row seen
    n times (a field of one shape: `outcore.iterate.gather.picture_sizes`), else compared (numpy gives the GIL up
    for work on more than 500 items)."""
    return sizes.strides[0] == 0 or bool((sizes == sizes[0]).all())


def _plain_flip(flip: object) -> bool:
    """Whether ``flip`` (after a crop) is none or `RandomFlip` itself, whose draws `outcore.seeds` makes in C."""
    return flip is None or type(flip) is RandomFlip


def _mirrors(flip: RandomFlip | None) -> tuple[float, tuple[bool, bool]]:
    """``flip``'s chance and axes (left-right, top-bottom): none on without one."""
    return (0.0, (False, False)) if flip is None else (flip.p, (flip.horizontal, flip.vertical))
