"""Fit decoded pixels to a sample's (height, width): resize, crop the centre or pad, by policy."""

from __future__ import annotations

from typing import Literal

import numpy as np
from PIL import Image

from ..errors import ImageError, OptionError

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
        scale = max(target_h / height, target_w / width)
        scaled = _resize(pixels, max(target_h, round(height * scale)), max(target_w, round(width * scale)))
        top, left = (scaled.shape[0] - target_h) // 2, (scaled.shape[1] - target_w) // 2
        return scaled[top : top + target_h, left : left + target_w]
    scale = min(target_h / height, target_w / width)
    scaled_h = min(target_h, max(1, round(height * scale)))
    scaled_w = min(target_w, max(1, round(width * scale)))
    padded = np.zeros((target_h, target_w, pixels.shape[2]), dtype=pixels.dtype)
    top, left = (target_h - scaled_h) // 2, (target_w - scaled_w) // 2
    padded[top : top + scaled_h, left : left + scaled_w] = _resize(pixels, scaled_h, scaled_w)
    return padded


def _resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Antialiased bilinear resize with Pillow; 16-bit data is resized channel by channel in float."""
    if pixels.dtype == np.uint8:
        image = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
        resized = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))
        return resized.reshape(height, width, pixels.shape[2])
    planes = [
        np.asarray(Image.fromarray(pixels[..., c].astype(np.float32)).resize(
            (width, height), Image.Resampling.BILINEAR))
        for c in range(pixels.shape[2])
    ]
    info = np.iinfo(pixels.dtype)
    return np.clip(np.rint(np.stack(planes, axis=-1)), info.min, info.max).astype(pixels.dtype)
