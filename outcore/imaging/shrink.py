"""Pictures kept at their own size: the shape each file decodes to, and a smaller copy of the ones whose
longer side exceeds ``max_side`` (FFCV's ``max_resolution``), made once at ingest."""

from __future__ import annotations

import io

import numpy as np
import simplejpeg
from PIL import Image

from ..errors import OptionError
from .decode import MAX_PIXELS, decode_image, decoded_size, upright_size

DEFAULT_QUALITY = 90


def check_max_side(max_side: int | None, quality: int, dtype: np.dtype) -> None:
    """Refuse settings `shrink_image` cannot honour, as an `OptionError` naming the argument."""
    if max_side is not None and (not isinstance(max_side, int) or max_side < 1):
        raise OptionError(f"max_side={max_side!r} is not a positive number of pixels")
    if not isinstance(quality, int) or not 1 <= quality <= 100:
        raise OptionError(f"quality={quality!r} is not a JPEG quality in 1..100")
    if max_side is not None and dtype != np.uint8:
        raise OptionError(f"max_side= re-encodes 8-bit pictures; the images are {dtype}: leave max_side=None")


def shrink_image(
    data: bytes, channels: int, dtype: np.dtype, max_side: int | None, quality: int = DEFAULT_QUALITY,
    name: str = "image", max_pixels: int | None = MAX_PIXELS, upright: tuple[int, int] | None = None,
) -> tuple[tuple[int, int, int], bytes | None]:
    """``(shape, smaller)``: the shape the file decodes to (upright, ``channels`` deep) and, when its longer
    side exceeds ``max_side``, the bytes of a copy whose longer side is ``max_side`` (resized antialiased,
    then JPEG at ``quality``, PNG for 4 channels); ``smaller`` is None when the file is kept as it is.
    The file is decoded either way (at a reduced DCT scale when it is shrunk, or kept: `decoded_size`), so a
    bad file is an `ImageError` naming ``name``. ``upright``: the file's `upright_size`, where the caller has
    read it already.

    >>> shape, smaller = shrink_image(open("big.jpg", "rb").read(), 3, np.dtype("uint8"), 512)  # doctest: +SKIP
    >>> shape  # doctest: +SKIP
    (384, 512, 3)
    """
    height, width = upright if upright is not None else upright_size(data, name, max_pixels)
    if max_side is None or max(height, width) <= max_side:
        return (*decoded_size(data, channels, dtype, name, max_pixels), channels), None
    scale = max_side / max(height, width)
    size = (max(1, round(height * scale)), max(1, round(width * scale)))
    pixels = decode_image(data, (*size, channels), "fit", dtype, name, max_pixels=max_pixels)
    return (*size, channels), encode_image(pixels, quality)


def encode_image(pixels: np.ndarray, quality: int = DEFAULT_QUALITY) -> bytes:
    """8-bit pixels (h, w, c) as a JPEG at ``quality`` (c of 1 or 3; 4:2:0 chroma) or a PNG (c of 4).

    >>> encode_image(np.zeros((8, 8, 3), np.uint8))[:3]
    b'\\xff\\xd8\\xff'
    """
    if pixels.shape[2] in (1, 3):
        colorspace = "RGB" if pixels.shape[2] == 3 else "GRAY"
        return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality, colorspace=colorspace,
                                      colorsubsampling="420")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()

