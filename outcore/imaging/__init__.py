"""Pictures: decoding (libjpeg-turbo, Pillow) with DCT scaling, resizing by policy, encoded chunks, and
generated pictures for demos, tests and benchmarks. Used by ingest and by the read path."""

from .decode import (
    IMAGE_DTYPES,
    IMAGE_EXTENSIONS,
    MAX_PIXELS,
    decode_image,
    load_image,
    parse_image_dtype,
    parse_image_shape,
    read_image_file,
)
from .encoded import DecodedChunks, EncodedChunk
from .resize import RESIZE_POLICIES, ResizePolicy, fit, parse_resize

__all__ = [
    "IMAGE_DTYPES",
    "IMAGE_EXTENSIONS",
    "MAX_PIXELS",
    "RESIZE_POLICIES",
    "DecodedChunks",
    "EncodedChunk",
    "ResizePolicy",
    "decode_image",
    "fit",
    "load_image",
    "parse_image_dtype",
    "parse_image_shape",
    "parse_resize",
    "read_image_file",
]
