"""Encoded image fields: the original JPEG/PNG/WebP bytes in the store, decoded when they are read.

A pixel store of photos is about 7-9x larger on disk than the JPEGs it came from; for data larger than
RAM on ordinary disks, storing the files' own bytes and decoding them while training is often faster
overall, and always smaller. The layout keeps the chunk as the unit of I/O and shuffling, and uses only
types that are in the Zarr v3 specification (zarr's variable-length bytes type is not, and warns so):

- the field's array ``F`` is ``uint8`` of shape ``(num_chunks * capacity,)`` with chunks of
  ``capacity`` bytes: sample chunk ``k`` stores its samples' bytes back to back in the region
  ``[k * capacity, (k + 1) * capacity)``, zero-padded (compression squeezes the padding away);
- ``F_ranges`` is ``int64`` of shape ``(N, 2)``, chunked like every other field: sample ``i``'s bytes
  are ``F[F_ranges[i, 0]:F_ranges[i, 1]]``.

Both arrays are sharded like the other fields, so one ingest task writes one shard file of each, and
one chunk of samples is two ranged reads. ``capacity`` is the largest chunk's byte count, known before
writing from the sizes of the source files.

>>> import zarr, imageio.v3 as iio  # doctest: +SKIP
>>> group = zarr.open_group("train.zarr", mode="r")  # doctest: +SKIP
>>> start, stop = group["images_ranges"][7]  # doctest: +SKIP
>>> iio.imread(group["images"][start:stop].tobytes()).shape  # doctest: +SKIP
(375, 500, 3)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import dask
import dask.array as da
import numpy as np
import zarr

from .chunks import FieldChunks
from .errors import ImageError, SampleDecodeError, SourceError
from .imaging import decode_image
from .loaders import BLOB_DTYPE
from .schema import RANGES_SUFFIX, Compression, ImageDecode, Layout
from .store import create_field


def ranges_name(field: str) -> str:
    return field + RANGES_SUFFIX


def chunk_capacity(nbytes: np.ndarray, chunk_size: int) -> int:
    """Bytes of the largest chunk's samples: the size of every chunk's region.

    >>> chunk_capacity(np.array([5, 1, 2, 9, 3]), 2)
    11
    """
    if len(nbytes) == 0:
        return 1
    return max(1, int(np.add.reduceat(np.asarray(nbytes, dtype=np.int64), np.arange(0, len(nbytes), chunk_size)).max()))


def create_encoded_field(
    group: zarr.Group, name: str, num_samples: int, capacity: int, layout: Layout, compression: Compression
) -> None:
    """Create a field's byte array and its ranges array (see the module docstring)."""
    num_chunks = -(-num_samples // layout.chunk_size)
    chunks_per_shard = layout.shard_size // layout.chunk_size
    group.create_array(
        name,
        shape=(num_chunks * capacity,),
        dtype=np.uint8,
        chunks=(capacity,),
        shards=(chunks_per_shard * capacity,),
        compressors=compression.codecs(),
        fill_value=0,
        dimension_names=(f"{name}_bytes",),
    )
    create_field(group, ranges_name(name), np.dtype(np.int64), (2,), num_samples, layout, compression)


def write_encoded_shard(
    group: zarr.Group, name: str, start: int, blobs: Sequence[bytes], chunk_size: int
) -> None:
    """Pack samples ``start, start + 1, ...`` (``start`` at a chunk boundary) into their chunks' regions."""
    array = group[name]
    capacity = array.chunks[0]
    first_chunk = start // chunk_size
    num_chunks = -(-len(blobs) // chunk_size)
    packed = np.zeros(num_chunks * capacity, dtype=np.uint8)
    ranges = np.empty((len(blobs), 2), dtype=np.int64)
    for k in range(num_chunks):
        position = k * capacity
        for i in range(k * chunk_size, min(len(blobs), (k + 1) * chunk_size)):
            blob = blobs[i]
            if position + len(blob) > (k + 1) * capacity:
                raise SourceError(
                    f"field {name!r}: the files of chunk {first_chunk + k} hold more bytes than their sizes said "
                    f"when the ingest began ({capacity} at most): a source file changed during the ingest; run it again"
                )
            packed[position : position + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            ranges[i] = position, position + len(blob)
            position += len(blob)
    array[first_chunk * capacity : (first_chunk + num_chunks) * capacity] = packed
    group[ranges_name(name)][start : start + len(blobs)] = ranges + first_chunk * capacity


def blob_array(directory: str, name: str, num_samples: int, block_size: int) -> da.Array:
    """A field's stored bytes as a lazy object array of ``bytes``, one task per block of samples."""
    read = dask.delayed(_read_blobs, pure=True)
    parts = [
        da.from_delayed(read(directory, name, start, min(num_samples, start + block_size)),
                        (min(num_samples, start + block_size) - start,), dtype=BLOB_DTYPE)
        for start in range(0, num_samples, block_size)
    ]
    return da.concatenate(parts)


def stored_nbytes(group: zarr.Group, name: str, num_samples: int) -> np.ndarray:
    """Each sample's number of encoded bytes."""
    ranges = group[ranges_name(name)][:num_samples]
    return ranges[:, 1] - ranges[:, 0]


def _read_blobs(directory: str, name: str, start: int, stop: int) -> np.ndarray:
    group = zarr.open_group(directory, mode="r")
    blobs = np.empty(stop - start, dtype=BLOB_DTYPE)
    blobs[:] = read_files(group[name], group[ranges_name(name)], start, stop)
    return blobs


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


class EncodedChunk:
    """One chunk of an encoded field, not yet decoded: ``chunk[i]`` decodes its ``i``-th sample.

    It is what a Dask worker passes to the batch tasks that need the chunk: the compressed bytes travel
    between workers, and each sample is decoded once, by the task that puts it in a batch.
    """

    def __init__(self, region: np.ndarray, ranges: np.ndarray, decode: ImageDecode, context: tuple[str, str, int, int]):
        self.region, self.ranges, self.decode = region, ranges, decode
        self.where, self.field, self.chunk, self.first = context
        self.dtype = np.dtype(decode.dtype)
        self.shape = (len(ranges), *decode.shape)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.decode_sample(index)

    def decode_sample(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """Sample ``index``, decoded (into ``out``, of the decoded sample's shape, when given)."""
        start, stop = self.ranges[index].tolist()
        if not 0 <= start <= stop <= len(self.region):
            raise self._error(index, f"its byte range {start}..{stop} lies outside the chunk")
        try:
            return decode_image(self.region[start:stop].tobytes(), self.decode.shape, self.decode.resize, self.dtype,
                                out=out)
        except ImageError as error:
            raise self._error(index, error.reason) from None

    def decode_into(self, out: np.ndarray) -> np.ndarray:
        for i in range(len(self)):
            self.decode_sample(i, out[i])
        return out[: len(self)]

    def _error(self, index: int, reason: str) -> SampleDecodeError:
        return SampleDecodeError(
            f"{self.where}: field {self.field!r}, sample {self.first + index} (chunk {self.chunk}) cannot be decoded: "
            f"{reason}. Find every such sample with `outcore verify {self.where}`, then re-ingest it from a good file."
        )


class EncodedChunks:
    """Like `outcore.chunks.FieldChunks`, for an encoded field: ``read(chunk)`` returns decoded samples.

    A chunk costs two reads (its ranges and its byte region); the images are then decoded one by one
    (the decoders release the GIL, so reader threads decode in parallel). A sample that cannot be
    decoded raises `SampleDecodeError` naming the sample and its chunk.
    """

    def __init__(self, group: zarr.Group, field: str, where: str, num_samples: int, decode: ImageDecode) -> None:
        self.field, self.where, self.num_samples, self.decode = field, where, num_samples, decode
        self.dtype = np.dtype(decode.dtype)
        self.ranges = FieldChunks(group[ranges_name(field)], ranges_name(field), where, num_samples)
        self.chunk_size = self.ranges.chunk_size
        data = group[field]
        self.capacity = data.chunks[0]
        self.bytes = FieldChunks(data, field, where, data.shape[0], samples=(num_samples, self.chunk_size))
        self._scratch = threading.local()
        self.direct = self.bytes.direct and self.ranges.direct

    def empty(self) -> np.ndarray:
        return np.empty((self.chunk_size, *self.decode.shape), dtype=self.dtype)

    def read(self, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        """The chunk's samples, decoded (into ``out``, from `empty`, when given)."""
        region = getattr(self._scratch, "region", None)
        if region is None:
            region = self._scratch.region = self.bytes.empty()
        return self.read_encoded(chunk, region).decode_into(self.empty() if out is None else out)

    def read_encoded(self, chunk: int, region: np.ndarray | None = None) -> EncodedChunk:
        """The chunk's bytes, to decode later (into ``region``, from ``self.bytes.empty()``, when given)."""
        ranges = self.ranges.read(chunk) - chunk * self.capacity
        region = self.bytes.read(chunk, out=region)[: int(ranges[:, 1].max(initial=0))]  # without the padding
        return EncodedChunk(region, ranges, self.decode, (self.where, self.field, chunk, chunk * self.chunk_size))
