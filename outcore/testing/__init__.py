"""A test kit for outcore and for code built on it: store factories of every kind, damage helpers, a
conformance suite that every store kind passes, and hypothesis strategies.

>>> from outcore.testing import make_store, corrupt_chunk  # doctest: +SKIP
>>> ds = make_store(tmp_path, kind="zip")  # doctest: +SKIP
>>> corrupt_chunk(ds.location, "images", 3)  # doctest: +SKIP
"""

from ..imaging.synthetic import write_image_folder
from .conformance import StoreConformance
from .damage import (
    chunk_location,
    corrupt_chunk,
    delete_shard,
    replace_chunk,
    rewrite_shard_index,
    shard_key,
    truncate_shard,
)
from .stores import STORE_KINDS, make_store, sample_arrays, write_h5_images

__all__ = [
    "STORE_KINDS",
    "StoreConformance",
    "chunk_location",
    "corrupt_chunk",
    "delete_shard",
    "make_store",
    "replace_chunk",
    "rewrite_shard_index",
    "sample_arrays",
    "shard_key",
    "truncate_shard",
    "write_h5_images",
    "write_image_folder",
]
