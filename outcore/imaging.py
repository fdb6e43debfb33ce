"""Decode one image file and fit it to the store's sample shape.

The rules, applied in this order:

1. Channels: the file is converted to the target's channel count by Pillow (palette, CMYK, grey+alpha, …
   all handled); alpha is dropped when the target has 1 or 3 channels. 16-bit greyscale keeps its depth.
2. Depth: 16-bit samples become 8-bit by rounding ``v * 255 / 65535``; 8-bit samples become 16-bit by ``v * 257``.
3. Size, by the ``resize`` policy (an image already of the target size is never touched):

   - ``None``: refuse any other size, naming the file.
   - ``"fit"``: resize to exactly (H, W); the aspect ratio is not kept.
   - ``"crop"``: keep the aspect ratio, resize to cover (H, W), then cut the centre.
   - ``"pad"``: keep the aspect ratio, resize to fit inside (H, W), then pad the borders with zeros.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Literal

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import ImageError

ResizePolicy = Literal["fit", "crop", "pad"] | None
RESIZE_POLICIES: tuple[ResizePolicy, ...] = ("fit", "crop", "pad", None)
IMAGE_DTYPES = (np.dtype("uint8"), np.dtype("uint16"))
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")

_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_HIGH_DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I", "F")
# what Pillow raises for truncated, damaged or oversized files
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


def parse_image_shape(shape: Sequence[int] | str) -> tuple[int, ...]:
    """Validate a sample shape: ``(H, W)`` for greyscale or ``(H, W, C)`` with C in 1, 3, 4.

    >>> parse_image_shape("128x128x3")
    (128, 128, 3)
    """
    if isinstance(shape, str):
        try:
            shape = tuple(int(part) for part in shape.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {shape!r} is not of the form HxW or HxWxC, e.g. 128x128x3") from None
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (2, 3) or any(s <= 0 for s in shape):
        raise ValueError(f"shape {shape} must be (H, W) or (H, W, C) with positive sizes")
    if len(shape) == 3 and shape[2] not in _PIL_MODES:
        raise ValueError(f"shape {shape} has {shape[2]} channels; images have 1, 3 or 4")
    return shape


def parse_resize(resize: ResizePolicy) -> ResizePolicy:
    if resize not in RESIZE_POLICIES:
        raise ValueError(f"resize={resize!r} is not one of {RESIZE_POLICIES}")
    return resize


def parse_image_dtype(dtype: np.typing.DTypeLike) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in IMAGE_DTYPES:
        raise ValueError(f"image dtype {dtype} is not supported; use uint8 or uint16")
    return dtype


def load_image(path: str, shape: tuple[int, ...], resize: ResizePolicy, dtype: np.dtype) -> np.ndarray:
    """Decode ``path`` and return an array of exactly ``shape`` and ``dtype``; raise `ImageError` if impossible.

    >>> load_image("cat.jpg", (64, 64, 3), "crop", np.dtype("uint8")).shape  # doctest: +SKIP
    (64, 64, 3)
    """
    channels = shape[2] if len(shape) == 3 else 1
    pixels = _decode(path, channels)
    pixels = _convert_depth(pixels, dtype)
    pixels = _fit(pixels, shape[:2], resize, path)
    return pixels.reshape(shape)


def _decode(path: str, channels: int) -> np.ndarray:
    """Decode the first frame, upright (EXIF orientation applied), as (h, w, channels).

    Pillow is called directly: imageio's Pillow plugin runs the same decoder with about twice the
    per-file overhead (an import attempt per call; benchmarks/ingest.py measures both), and gives the
    same pixels (tests/test_imaging.py checks).
    """
    try:
        with Image.open(path) as image:
            if "exif" in image.info or image.format == "TIFF":  # the only places an orientation lives
                image = ImageOps.exif_transpose(image)
            mode = image.mode if image.mode in _HIGH_DEPTH_MODES and channels == 1 else _PIL_MODES[channels]
            pixels = np.asarray(image if image.mode == mode else image.convert(mode))
    except FileNotFoundError:
        raise ImageError(path, "file not found") from None
    except UnidentifiedImageError:
        raise ImageError(path, "not an image file Pillow can read") from None
    except _DECODE_ERRORS as error:
        raise ImageError(path, f"cannot decode ({type(error).__name__}: {error})") from None
    if pixels.dtype not in IMAGE_DTYPES:
        raise ImageError(path, f"{pixels.dtype} samples are not supported; images must be 8 or 16 bit")
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels)


def _convert_depth(pixels: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if pixels.dtype == dtype:
        return pixels
    if dtype == np.uint8:  # from uint16
        return ((pixels.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    return pixels.astype(np.uint16) * 257


def _fit(pixels: np.ndarray, size: tuple[int, int], resize: ResizePolicy, path: str) -> np.ndarray:
    height, width = pixels.shape[:2]
    target_h, target_w = size
    if (height, width) == size:
        return pixels
    if resize is None:
        raise ImageError(
            path,
            f"image is {height}x{width}, expected {target_h}x{target_w}; "
            "pass resize='fit', 'crop' or 'pad' to convert other sizes",
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
