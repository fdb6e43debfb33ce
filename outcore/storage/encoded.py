"""The bytes of encoded image fields on disk (layout: `outcore.format.encoded`): create, write, read."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import SourceError
from ..format import SAMPLE_DIM, Compression, Layout, pack_regions, ranges_name, shapes_name
from .chunk_reads import join_at_once
from .groups import create_field
from .pins import Pins
from .shard_reader import ShardReader
from .shard_writer import write_rows


def create_encoded_field(
    group: zarr.Group, name: str, num_samples: int, capacity: int, layout: Layout, compression: Compression,
    variable: bool = False, dtype: np.typing.DTypeLike = np.uint8, row_shape: tuple[int, ...] = (),
) -> None:
    """Create a field's byte array (for a ragged field, of rows of ``dtype`` and ``row_shape``: `outcore.format.ragged`),
    its ranges array and, for pictures of varying sizes, its shapes array."""
    num_chunks = -(-num_samples // layout.chunk_size)
    group.create_array(
        name,
        shape=(num_chunks * capacity, *row_shape),
        dtype=dtype,
        chunks=(capacity, *row_shape),
        shards=(layout.chunks_per_shard * capacity, *row_shape),
        compressors=compression.codecs(),
        fill_value=0,
        dimension_names=(f"{name}_bytes" if not row_shape and np.dtype(dtype) == np.uint8 else f"{name}_rows",
                         *(f"{name}_axis{axis}" for axis in range(1, 1 + len(row_shape)))),
    )
    create_field(group, ranges_name(name), np.dtype(np.int64), (2,), num_samples, layout, compression, small=True)
    if variable:
        create_field(group, shapes_name(name), np.dtype(np.int32), (3,), num_samples, layout, compression,
                     (SAMPLE_DIM, "height_width_channel"), small=True)


def write_encoded_shard(group: zarr.Group | Mapping[str, zarr.Array], name: str, start: int,
                        blobs: Sequence[bytes] | Sequence[np.ndarray], chunk_size: int) -> None:
    """Write samples ``start, start + 1, ...`` (``start`` at a chunk boundary) into their chunks' regions, and
    their ranges; ``group`` holds the arrays by name (a group, or a mapping placing the ranges apart). A ragged
    field's samples are arrays of rows."""
    array = group[name]
    capacity = array.chunks[0]
    first_chunk = start // chunk_size
    try:
        regions, ranges = pack_regions(blobs, chunk_size, capacity, array.dtype, array.shape[1:], join=join_at_once)
    except OverflowError as overflow:
        raise SourceError(
            f"field {name!r}: the files of chunk {first_chunk + overflow.args[0]} hold more bytes than their sizes "
            f"said when the ingest began ({capacity} at most): a source file changed during the ingest; run it again"
        ) from None
    write_rows(array, first_chunk * capacity, regions)
    write_rows(group[ranges_name(name)], start, ranges + first_chunk * capacity)


def stored_nbytes(group: zarr.Group, name: str, num_samples: int) -> np.ndarray:
    """Each sample's number of encoded bytes."""
    ranges = group[ranges_name(name)][:num_samples]
    return ranges[:, 1] - ranges[:, 0]


def read_files(data: zarr.Array, ranges: zarr.Array, start: int, stop: int) -> list[bytes]:
    """The stored files of samples ``start .. stop - 1``, with plain zarr: their ranges, then one read of
    the bytes that span them.

    >>> read_files(ds.array("images"), ds.array("images_ranges"), 0, 2)  # doctest: +SKIP
    [b'\\xff\\xd8\\xff\\xe0...', b'\\xff\\xd8\\xff\\xe0...']
    """
    spans = ranges[start:stop]
    low, high = int(spans[:, 0].min()), int(spans[:, 1].max())
    raw = data[low:high]
    return [raw[begin - low : end - low].tobytes() for begin, end in spans.tolist()]


class EncodedBytes:
    """Chunk by chunk, the stored bytes of an encoded field: ``read(chunk)`` is ``(region, ranges)``,
    the chunk's bytes (without padding) and each sample's ``[start, stop)`` in them; for pictures of
    varying sizes, ``read_shapes(chunk)`` is each sample's decoded shape.

    A chunk costs two reads (three when sizes vary), through the direct shard reader. ``arrays(name)``
    is the store's array ``name`` (`outcore.storage.Store.array`), ``indexes(name)`` the shard indexes its readers
    share (`outcore.storage.Store.shard_indexes`; without, each reader reads its own).
    """

    def __init__(self, arrays: Callable[[str], zarr.Array], field: str, where: str, num_samples: int,
                 variable: bool = False, pins: Pins | None = None,
                 indexes: Callable[[str], dict[int, Any]] | None = None) -> None:
        self.field = field

        def reader(name: str, count: int, **samples: tuple[int, int]) -> ShardReader:
            return ShardReader(arrays(name), name, where, count, pins=pins, indexes=indexes and indexes(name),
                               **samples)

        self.ranges = reader(ranges_name(field), num_samples)
        self.chunk_size = self.ranges.chunk_size
        data = arrays(field)
        self.capacity = data.chunks[0]
        self.bytes = reader(field, data.shape[0], samples=(num_samples, self.chunk_size))
        self.shapes = reader(shapes_name(field), num_samples) if variable else None

    @property
    def direct(self) -> bool:
        return self.bytes.direct and self.ranges.direct

    def empty(self) -> np.ndarray:
        """A buffer for `read`: one chunk's region."""
        return self.bytes.empty()

    @property
    def remote(self) -> bool:
        return self.bytes.remote

    def prefetch(self, chunks: Sequence[int]) -> None:
        """Fetch the chunks' stored bytes now, for the `read` calls that follow (see `ShardReader.prefetch`)."""
        for reader in (self.ranges, self.bytes, self.shapes):
            if reader is not None:
                reader.prefetch(chunks)

    def expect(self, chunk: int, when: float) -> None:
        """Tell the node's cache when the chunk will be read next (see `ShardReader.expect`)."""
        for reader in (self.ranges, self.bytes, self.shapes):
            if reader is not None:
                reader.expect(chunk, when)

    def read(self, chunk: int, region: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The chunk's bytes (into ``region``, from `empty`, when given) and its samples' ranges in them."""
        return self._cut(chunk, self.ranges.read(chunk), self.bytes.read(chunk, out=region))

    @property
    def sources(self) -> tuple[ShardReader, ...]:
        """The shard readers `read` and `read_shapes` read a chunk with: its bytes' (into the buffer `empty` makes), its
        ranges' and its shapes' (each into a buffer of its own ``empty``), for `ShardReader.read_vouched` to read with
        other fields' in one C call; `of_parts` makes the chunk of them as read."""
        return (self.bytes, self.ranges) if self.shapes is None else (self.bytes, self.ranges, self.shapes)

    def of_parts(self, chunk: int, read: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """What `read` and `read_shapes` give of the chunk, from its `sources`' reads: ``(bytes, ranges, shapes)``."""
        return *self._cut(chunk, read[1], read[0]), (read[2] if self.shapes is not None else None)

    def _cut(self, chunk: int, ranges: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chunk's bytes as far as its samples' ranges reach, and the ranges counted from the chunk's start."""
        ranges = ranges - chunk * self.capacity
        return data[: int(ranges[:, 1].max(initial=0))], ranges

    def read_shapes(self, chunk: int) -> np.ndarray | None:
        """The decoded shape of each of the chunk's samples, (n, 3); None when the field has one shape."""
        return None if self.shapes is None else self.shapes.read(chunk)
