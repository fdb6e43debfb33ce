"""Fit decoded pixels to a sample's (height, width): resize, crop the centre or pad, by policy; resize
boxes of a batch (RandomResizedCrop)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from PIL import Image

from ..errors import ImageError, OptionError
from ..threads import for_each
from .crops import Box

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


def _resize(pixels: np.ndarray, height: int, width: int, box: Box | None = None) -> np.ndarray:
    """Antialiased bilinear resize with Pillow of ``pixels`` (h, w, c), or of its ``box`` (top, left,
    height, width); other than 8-bit data is resized channel by channel in float."""
    region = None if box is None else (box[1], box[0], box[1] + box[3], box[0] + box[2])  # Pillow's order
    if pixels.dtype == np.uint8:
        image = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
        resized = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR, box=region))
        return resized.reshape(height, width, pixels.shape[2])
    planes = np.stack([
        np.asarray(Image.fromarray(pixels[..., c].astype(np.float32)).resize(
            (width, height), Image.Resampling.BILINEAR, box=region))
        for c in range(pixels.shape[2])
    ], axis=-1)
    if pixels.dtype.kind not in "ui":
        return planes.astype(pixels.dtype)
    info = np.iinfo(pixels.dtype)
    return np.clip(np.rint(planes), info.min, info.max).astype(pixels.dtype)


def resize_box(pixels: np.ndarray, box: Box, size: tuple[int, int]) -> np.ndarray:
    """``box`` of ``pixels`` (h, w, c) resized to ``size`` (bilinear, antialiased)."""
    return _resize(pixels, size[0], size[1], box)


def resize_boxes(images: np.ndarray, boxes: Sequence[Box], size: tuple[int, int]) -> np.ndarray:
    """``boxes[i]`` of ``images[i]`` (N, H, W[, C]) resized to ``size``, into a new (N, *size[, C]) array.

    >>> images = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    >>> resize_boxes(images, [(0, 0, 2, 2), (2, 2, 2, 2)], (2, 2))[1].tolist()
    [[26, 27], [30, 31]]
    """
    channels = images[..., None] if images.ndim == 3 else images
    out = np.empty((len(images), *size, channels.shape[3]), images.dtype)

    def resize(i: int) -> None:
        out[i] = _resize(channels[i], size[0], size[1], boxes[i])

    for_each(resize, len(images))
    return out[..., 0] if images.ndim == 3 else out
