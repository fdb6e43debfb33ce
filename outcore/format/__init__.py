"""What is on disk, version 1: attributes, field layouts (pixel, encoded, text) and codec choices.

Pure values and functions: no I/O policy and no dask. `outcore.storage` puts them on disk.
"""

from .attrs import (
    ATTRS_KEY,
    FORMAT_VERSION,
    IMAGE_ENCODING,
    RAGGED_ENCODING,
    RASTER_ENCODING,
    ROLES,
    WEIGHT_NAMES,
    FieldInfo,
    ImageDecode,
    StoreAttrs,
    class_flags,
    guess_roles,
)
from .compression import Compression, raw_above, unsafe_codecs
from .dims import SAMPLE_DIM, dimension_names
from .encoded import (
    RANGES_SUFFIX,
    SHAPES_SUFFIX,
    chunk_capacity,
    companion_names,
    pack_regions,
    ranges_name,
    shapes_name,
)
from .layout import Layout
from .ragged import OFFSETS_SUFFIX, Ragged, kept_name, offsets_name, ragged_names, undecoded_names
from .text import TEXT_ENCODING, decode_text, encode_text

__all__ = [
    "ATTRS_KEY",
    "FORMAT_VERSION",
    "IMAGE_ENCODING",
    "OFFSETS_SUFFIX",
    "RAGGED_ENCODING",
    "RANGES_SUFFIX",
    "RASTER_ENCODING",
    "ROLES",
    "SAMPLE_DIM",
    "SHAPES_SUFFIX",
    "TEXT_ENCODING",
    "WEIGHT_NAMES",
    "Compression",
    "FieldInfo",
    "ImageDecode",
    "Layout",
    "Ragged",
    "StoreAttrs",
    "chunk_capacity",
    "class_flags",
    "companion_names",
    "decode_text",
    "dimension_names",
    "encode_text",
    "guess_roles",
    "kept_name",
    "offsets_name",
    "pack_regions",
    "ragged_names",
    "ranges_name",
    "raw_above",
    "shapes_name",
    "undecoded_names",
    "unsafe_codecs",
]
