"""Text fields: strings stored as zero-padded UTF-8 bytes, ``uint8`` of shape (N, longest encoding).

Zarr's string data types are not yet in the v3 specification (zarr warns when writing them);
fixed-width bytes are, so every Zarr reader can read outcore's text fields.
"""

from __future__ import annotations

import numpy as np

TEXT_ENCODING = "utf-8"


def encode_text(values: np.ndarray, min_width: int = 1) -> np.ndarray:
    """Strings as zero-padded UTF-8 bytes: as many as the longest takes, and at least ``min_width``.

    >>> decode_text(encode_text(np.array(["a.jpg", "é.png"]))).tolist()
    ['a.jpg', 'é.png']
    >>> encode_text(np.array(["a"]), min_width=4)
    array([[97,  0,  0,  0]], dtype=uint8)
    """
    strings = np.asarray(values)
    if strings.dtype.kind != "U":
        strings = strings.astype(str)
    try:  # ASCII (UTF-8 alike), a byte a character: straight to the padded width, in one C loop
        encoded = strings.astype(f"S{max(1, min_width, strings.dtype.itemsize // 4)}")
    except UnicodeEncodeError:
        encoded = np.char.encode(strings, TEXT_ENCODING)  # a str method call each
        encoded = encoded.astype(f"S{max(1, min_width, encoded.dtype.itemsize)}")
    return encoded.view(np.uint8).reshape(len(encoded), encoded.dtype.itemsize)  # a new array's bytes, not copied


def decode_text(raw: np.ndarray) -> np.ndarray:
    """The inverse of `encode_text`, for any leading shape: strings of ``raw.shape[-1]`` characters at
    most, so every block of a field decodes to the same dtype.

    >>> decode_text(encode_text(np.array(["a", "bcd"]))[:1]).dtype
    dtype('<U3')
    """
    raw = np.ascontiguousarray(raw)
    width = raw.shape[-1]
    return np.char.decode(raw.view(f"S{width}")[..., 0], TEXT_ENCODING).astype(f"<U{width}")
