"""Generated image folders for the demo, the tests and the benchmarks (no download needed).

Two kinds of pictures:

- ``"shapes"``: a noisy background with one class-specific figure (disc, square, stripes, ring, …) in a
  class-specific colour, at a random place and size: easy to learn, varied enough to compress like photos.
- ``"photos"``: random crops of the photographs scikit-learn ships (``load_sample_images``), for realistic
  codec and decode figures; every class draws from the same photos, so these carry no learnable label;
- ``"sample-photos"``: random crops of one photograph per class (`SAMPLE_PHOTOS`, which scikit-image
  and scikit-learn ship): real pictures with a learnable label, for the demo.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from PIL import Image

from ..errors import OptionError

SHAPE_CLASSES = ("disc", "square", "hstripes", "vstripes", "ring", "cross")
SAMPLE_PHOTOS = ("astronaut", "cat", "coffee", "rocket", "china", "flower")  # scikit-image's, then scikit-learn's
KINDS = ("shapes", "photos", "sample-photos")
_COLOURS = np.array([[220, 60, 50], [50, 160, 70], [60, 90, 210], [230, 190, 40], [160, 60, 180], [40, 180, 190]])


def shapes_image(label: int, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """One RGB uint8 picture of class ``label`` (0 <= label < 6).

    >>> shapes_image(0, (32, 32), np.random.default_rng(0)).shape
    (32, 32, 3)
    """
    height, width = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 200, size=3)
    tilt = rng.uniform(-0.5, 0.5, size=3) * (yy[..., None] / height * 80)
    image = base + tilt + rng.normal(0, 12, size=(height, width, 3))
    cy, cx = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width
    radius = rng.uniform(0.18, 0.3) * min(height, width)
    dy, dx = yy - cy, xx - cx
    masks = (
        dy**2 + dx**2 < radius**2,
        (np.abs(dy) < radius) & (np.abs(dx) < radius),
        (np.sin(yy / max(2.0, radius / 3)) > 0.3) & (np.abs(dx) < 1.5 * radius),
        (np.sin(xx / max(2.0, radius / 3)) > 0.3) & (np.abs(dy) < 1.5 * radius),
        np.abs(np.sqrt(dy**2 + dx**2) - radius) < radius / 3,
        (np.abs(dy) < radius / 3) | (np.abs(dx) < radius / 3),
    )
    mask = masks[label % len(masks)]
    image[mask] = _COLOURS[label % len(_COLOURS)] + rng.normal(0, 10, size=(int(mask.sum()), 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def sample_photo(name: str) -> np.ndarray:
    """One of `SAMPLE_PHOTOS` as RGB uint8 (optional dependencies: scikit-image, scikit-learn).

    >>> sample_photo("cat").shape  # doctest: +SKIP
    (300, 451, 3)
    """
    if name in ("china", "flower"):
        from sklearn.datasets import (
            load_sample_image,  # an optional dependency (the demo, bench and dev extras)
        )

        return load_sample_image(f"{name}.jpg")
    import skimage.data  # an optional dependency (the demo and dev extras)

    return getattr(skimage.data, name)()


def photo_crops(count: int, size: tuple[int, int], rng: np.random.Generator,
                photos: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """``count`` random crops (random scale, random flip) of ``photos`` (default: scikit-learn's sample
    photographs), resized to ``size``."""
    if photos is None:
        from sklearn.datasets import load_sample_images  # an optional dependency (the bench and dev extras)

        photos = load_sample_images().images
    crops = []
    for _ in range(count):
        photo = photos[rng.integers(len(photos))]
        side = int(rng.integers(min(size) * 1.5, min(photo.shape[:2])))
        top = int(rng.integers(0, photo.shape[0] - side + 1))
        left = int(rng.integers(0, photo.shape[1] - side + 1))
        crop = Image.fromarray(photo[top : top + side, left : left + side]).resize(size[::-1])
        crops.append(np.asarray(crop)[:, :: rng.choice([-1, 1])])
    return crops


def write_image_folder(
    root: str | os.PathLike,
    per_class: int,
    *,
    classes: Sequence[str] = SHAPE_CLASSES[:3],
    size: tuple[int, int] = (64, 64),
    kind: str = "shapes",
    extension: str = ".jpg",
    seed: int = 0,
) -> list[Path]:
    """Write ``per_class`` images into ``root/<class>/`` for each class; return the files in sorted order.

    >>> write_image_folder("photos/train", 10, size=(32, 32))  # doctest: +SKIP
    """
    if kind not in KINDS:
        raise OptionError(f"kind={kind!r} is not one of {KINDS}")
    rng = np.random.default_rng(seed)
    files = []
    for label, name in enumerate(classes):
        folder = Path(root) / name
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "photos":
            pictures = photo_crops(per_class, size, rng)
        elif kind == "sample-photos":
            pictures = photo_crops(per_class, size, rng, [sample_photo(SAMPLE_PHOTOS[label % len(SAMPLE_PHOTOS)])])
        else:
            pictures = [shapes_image(label, size, rng) for _ in range(per_class)]
        for index, picture in enumerate(pictures):
            path = folder / f"{name}_{index:06d}{extension}"
            iio.imwrite(path, picture, **({"quality": 90} if extension in (".jpg", ".jpeg") else {}))
            files.append(path)
    return sorted(files)
