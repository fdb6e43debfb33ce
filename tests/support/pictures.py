"""Pictures of several sizes and kinds, as people's folders hold them, for the tests of pictures kept at their own
size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from outcore.imaging.synthetic import sample_photo

SIZES = [(60, 80), (80, 60), (45, 100), (100, 45), (64, 64), (37, 90), (90, 51), (120, 70)]


def write_mixed_pictures(root: Path, per_class: int = 8) -> dict[str, tuple[int, int]]:
    """JPEGs cut from a real photograph at the sizes above (a PNG, a greyscale JPEG and an EXIF-rotated
    JPEG among them); return each file's upright size by name."""
    photo = np.asarray(Image.fromarray(sample_photo("astronaut")).resize((1024, 1024), Image.BILINEAR))
    sizes = {}
    rng = np.random.default_rng(0)
    for label, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            height, width = SIZES[(i + label) % len(SIZES)]
            top, left = rng.integers(0, 1024 - 120, size=2)
            pixels = photo[top : top + height, left : left + width]
            path = root / name / f"{i}.jpg"
            if (label, i) == (0, 1):
                path = path.with_suffix(".png")
                Image.fromarray(pixels).save(path)
            elif (label, i) == (0, 2):
                Image.fromarray(pixels).convert("L").save(path, quality=95)
            elif (label, i) == (1, 3):  # stored sideways, shown upright: the file is width x height
                exif = Image.Exif()
                exif[0x0112] = 6
                Image.fromarray(np.ascontiguousarray(np.rot90(pixels, 1))).save(path, quality=95, exif=exif)
            else:
                Image.fromarray(pixels).save(path, quality=95)
            sizes[f"{name}/{path.name}"] = (height, width)
    return sizes
