"""Shared fixtures: small image folders written to disk with known pixels."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from outcore.testing import write_image_folder


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Three classes (cat, dog, owl) of 32x32 pictures: JPEG RGB, PNG RGB, PNG greyscale, PNG RGBA."""
    root = tmp_path / "photos"
    write_image_folder(root, 5, classes=("cat", "dog"), size=(32, 32), extension=".jpg", seed=1)
    write_image_folder(root, 4, classes=("dog", "owl"), size=(32, 32), extension=".png", seed=2)
    rng = np.random.default_rng(3)
    iio.imwrite(root / "owl" / "grey.png", rng.integers(0, 256, (32, 32), dtype=np.uint8))
    iio.imwrite(root / "cat" / "alpha.png", rng.integers(0, 256, (32, 32, 4), dtype=np.uint8))
    return root
