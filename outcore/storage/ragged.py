"""Ragged fields on disk (layout: `outcore.format.ragged`): create, write, and read a chunk's rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..errors import CorruptChunkError
from ..format import Compression, Layout, Ragged, chunk_capacity, ranges_name
from .encoded import EncodedBytes, create_encoded_field, write_encoded_shard
from .pins import Pins


def create_ragged_field(group: zarr.Group, name: str, counts: np.ndarray, layout: Layout, compression: Compression,
                        dtype: np.typing.DTypeLike, row_shape: tuple[int, ...]) -> None:
    """Create a ragged field of ``len(counts)`` samples of ``counts[i]`` rows each, and its ranges array."""
    capacity = chunk_capacity(np.asarray(counts, np.int64), layout.chunk_size)
    create_encoded_field(group, name, len(counts), capacity, layout, compression, dtype=dtype, row_shape=row_shape)


def write_ragged_shard(arrays: zarr.Group | dict[str, zarr.Array], name: str, start: int, rows: Ragged,
                       chunk_size: int) -> None:
    """Write the samples of ``rows`` as samples ``start, start + 1, ...`` (``start`` at a chunk boundary)."""
    write_encoded_shard(arrays, name, start, rows.samples(), chunk_size)


def read_ragged(group: zarr.Group, name: str, start: int, stop: int) -> Ragged:
    """Samples ``start .. stop - 1`` of a ragged field, with plain zarr: their ranges, then one read of the rows
    that span them."""
    spans = np.asarray(group[ranges_name(name)][start:stop], np.int64).reshape(-1, 2)
    values = group[name]
    if not len(spans):
        return Ragged(np.zeros((0, *values.shape[1:]), values.dtype), np.zeros(1, np.int64))
    low, high = int(spans[:, 0].min()), int(spans[:, 1].max())
    rows = values[low:high]
    return Ragged.of([rows[begin - low : end - low] for begin, end in spans.tolist()], values.dtype, values.shape[1:])


@dataclass(frozen=True)
class RaggedChunk:
    """One chunk of a ragged field as stored: its rows (``values``) and each sample's ``[start, stop)`` in them; for
    a raster field, each sample's ``shapes`` (height, width, channels) too, its rows its pixels in C order."""

    values: np.ndarray
    ranges: np.ndarray
    shapes: np.ndarray | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape[1:])

    def samples(self) -> np.ndarray:
        """Each sample's rows (a raster's: its pixels at its height and width), as an object array (a sample of
        ``ds[field]``)."""
        out = np.empty(len(self.ranges), object)
        if self.shapes is None:
            out[:] = [self.values[begin:end] for begin, end in self.ranges.tolist()]
        else:
            out[:] = [self.values[begin:end].reshape(height, width, *self.row_shape)
                      for (begin, end), (height, width, _) in zip(self.ranges.tolist(), self.shapes.tolist(), strict=True)]
        return out


class RaggedRows(EncodedBytes):
    """Chunk by chunk, the rows of a ragged field (through the direct shard reader, as an encoded field's bytes):
    ``read(chunk)`` is a `RaggedChunk`; ``arrays(name)`` is the store's array ``name`` (`outcore.storage.Store.array`).
    A raster field's (``raster=True``) come with their shapes, checked against their rows: a sample of a size its
    pixels do not fill is a `CorruptChunkError` naming it."""

    def __init__(self, arrays: Callable[[str], zarr.Array], field: str, where: str, num_samples: int,
                 raster: bool = False, pins: Pins | None = None,
                 indexes: Callable[[str], dict[int, Any]] | None = None) -> None:
        super().__init__(arrays, field, where, num_samples, variable=raster, pins=pins, indexes=indexes)
        self.where = where

    def read(self, chunk: int, out: np.ndarray | None = None) -> RaggedChunk:
        values, ranges = super().read(chunk, out)
        return self._checked(chunk, values, ranges, self.read_shapes(chunk))

    def of_parts(self, chunk: int, read: Sequence[np.ndarray]) -> RaggedChunk:
        """`read`'s chunk from its `sources`' reads (its rows, ranges and shapes), made by `ShardReader.read_vouched` with
        other fields' in one call."""
        return self._checked(chunk, *super().of_parts(chunk, read))

    def _checked(self, chunk: int, values: np.ndarray, ranges: np.ndarray, shapes: np.ndarray | None) -> RaggedChunk:
        """The chunk's rows, ranges and shapes as a `RaggedChunk`, once each raster sample's shape is found to fill its
        rows."""
        if shapes is not None:
            wrong = np.flatnonzero(ranges[:, 1] - ranges[:, 0] != shapes[:, 0].astype(np.int64) * shapes[:, 1])
            if len(wrong):
                sample = chunk * self.chunk_size + int(wrong[0])
                raise CorruptChunkError(
                    f"{self.where}: field {self.field!r}, sample {sample} (chunk {chunk}) holds "
                    f"{int(ranges[wrong[0], 1] - ranges[wrong[0], 0])} pixels, but its shape says "
                    f"{shapes[wrong[0], 0]} x {shapes[wrong[0], 1]}: the store was changed or damaged; re-ingest it")
        return RaggedChunk(values, ranges, shapes)


class RaggedSamples(RaggedRows):
    """A ragged field's chunks as ``ds[field]`` holds them: ``read(chunk)`` is an object array of each sample's
    rows."""

    def empty(self) -> np.ndarray:
        return np.empty(0, object)

    def read(self, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        return super().read(chunk).samples()
