"""Encoded image fields: the files' own bytes (JPEG, PNG, WebP, ...), decoded when they are read.

A pixel store of photos is about 7-9x larger on disk than the JPEGs it came from; for data larger than
RAM on ordinary disks, storing the files' own bytes and decoding them while training is often faster
overall, and always smaller. The layout keeps the chunk as the unit of I/O and shuffling, and uses only
types that are in the Zarr v3 specification (zarr's variable-length bytes type is not, and warns so):

- the field's array ``F`` is ``uint8`` of shape ``(num_chunks * capacity,)`` with chunks of
  ``capacity`` bytes: sample chunk ``k`` stores its samples' bytes back to back in the region
  ``[k * capacity, (k + 1) * capacity)``, zero-padded (compression squeezes the padding away);
- ``F_ranges`` is ``int64`` of shape ``(N, 2)``, chunked like every other field: sample ``i``'s bytes
  are ``F[F_ranges[i, 0]:F_ranges[i, 1]]``.

- for a field of pictures of varying sizes (``shape=None`` at ingest), ``F_shapes`` is ``int32`` of
  shape ``(N, 3)``, chunked like every other field: sample ``i`` decodes to an array of shape
  ``F_shapes[i]`` (height, width, channels; upright, as its EXIF orientation says).

All arrays are sharded like the other fields, so one ingest task writes one shard file of each, and
one chunk of samples is two ranged reads. ``capacity`` is the largest chunk's byte count, known before
writing from the sizes of the source files.

>>> import zarr, imageio.v3 as iio  # doctest: +SKIP
>>> group = zarr.open_group("train.zarr", mode="r")  # doctest: +SKIP
>>> start, stop = group["images_ranges"][7]  # doctest: +SKIP
>>> iio.imread(group["images"][start:stop].tobytes()).shape  # doctest: +SKIP
(375, 500, 3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

RANGES_SUFFIX = "_ranges"
SHAPES_SUFFIX = "_shapes"


def ranges_name(field: str) -> str:
    """The array holding each sample's byte range of encoded field ``field``.

    >>> ranges_name("images")
    'images_ranges'
    """
    return field + RANGES_SUFFIX


def shapes_name(field: str) -> str:
    """The array holding each sample's decoded shape, for an encoded field of pictures of varying sizes.

    >>> shapes_name("images")
    'images_shapes'
    """
    return field + SHAPES_SUFFIX


def companion_names(field: str, variable: bool) -> list[str]:
    """The arrays beside an encoded field's bytes: its ranges, and its samples' shapes when they vary.

    >>> companion_names("images", variable=True)
    ['images_ranges', 'images_shapes']
    """
    return [ranges_name(field), shapes_name(field)] if variable else [ranges_name(field)]


def chunk_capacity(nbytes: np.ndarray, chunk_size: int) -> int:
    """Bytes of the largest chunk's samples: the size of every chunk's region.

    >>> chunk_capacity(np.array([5, 1, 2, 9, 3]), 2)
    11
    """
    if len(nbytes) == 0:
        return 1
    return max(1, int(np.add.reduceat(np.asarray(nbytes, dtype=np.int64), np.arange(0, len(nbytes), chunk_size)).max()))


def pack_regions(blobs: Sequence[bytes] | Sequence[np.ndarray], chunk_size: int, capacity: int,
                 dtype: np.typing.DTypeLike = np.uint8, row_shape: tuple[int, ...] = (),
                 join: Callable[[Sequence[Any], np.ndarray], bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Samples' bytes (or rows of ``dtype`` and ``row_shape``: a ragged field's, `outcore.format.ragged`) packed
    into consecutive chunk regions of ``capacity`` entries: ``(regions, ranges)``, ranges relative to the first
    region. Raise ``OverflowError`` naming the chunk (counted from 0) whose entries do not fit. A chunk's samples
    are joined by one call, not one by one: ``join(samples, region)`` where given and it can (True: the storage layer's
    copy outside the GIL, `outcore.storage.chunk_reads.join_at_once`), else bytes by ``bytes.join`` (which copies
    exact bytes outside the GIL), other rows cast to ``dtype``.

    >>> regions, ranges = pack_regions([b"ab", b"c", b"def"], 2, 4)
    >>> regions.tobytes(), ranges.tolist()
    (b'abc\\x00def\\x00', [[0, 2], [2, 3], [4, 7]])
    """
    dtype = np.dtype(dtype)
    lengths = np.fromiter(map(len, blobs), np.int64, len(blobs))
    regions = np.zeros((-(-len(blobs) // chunk_size) * capacity, *row_shape), dtype=dtype)
    ranges = np.empty((len(blobs), 2), dtype=np.int64)
    for k, first in enumerate(range(0, len(blobs), chunk_size)):
        part = slice(first, first + chunk_size)
        stops = np.cumsum(lengths[part])
        if stops[-1] > capacity:
            raise OverflowError(k)
        ranges[part, 1] = k * capacity + stops
        ranges[part, 0] = ranges[part, 1] - lengths[part]
        region = regions[k * capacity : k * capacity + stops[-1]]
        if join is None or not join(blobs[part], region):
            region[...] = _joined(blobs[part], int(stops[-1]), dtype, row_shape)
    return regions, ranges


def _joined(blobs: Sequence[bytes] | Sequence[np.ndarray], count: int, dtype: np.dtype,
            row_shape: tuple[int, ...]) -> np.ndarray:
    """The ``count`` entries of ``blobs`` back to back: bytes (and single bytes) joined as they are, rows of other
    types cast to ``dtype``."""
    if dtype == np.uint8 and not row_shape:
        try:
            joined = np.frombuffer(b"".join(blobs), np.uint8)
        except (TypeError, BufferError):  # not bytes-like, or not contiguous
            joined = None
        if joined is not None and len(joined) == count:  # else rows of wider items: cast below
            return joined
    rows = [np.asarray(blob).reshape(-1, *row_shape) for blob in blobs]
    return np.concatenate(rows).astype(dtype, copy=False) if rows else np.zeros((0, *row_shape), dtype)
