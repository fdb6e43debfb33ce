"""Decoding the chunks of an encoded image field: whole chunks for reading, or sample by sample into batches."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ..errors import ImageError, SampleDecodeError
from ..format import ImageDecode
from ..storage import EncodedBytes, Store, blocks
from .crops import Box, box_part, within
from .decode import decode_image, decode_region, plain_jpeg_crops, plain_jpeg_decodes


class EncodedChunk:
    """One chunk of an encoded field, not yet decoded: ``chunk[i]`` decodes its ``i``-th sample.

    It is what a Dask worker passes to the batch tasks that need the chunk: the compressed bytes travel
    between workers, and each sample is decoded once, by the task that puts it in a batch.
    """

    def __init__(self, region: np.ndarray, ranges: np.ndarray, decode: ImageDecode, context: tuple[str, str, int, int],
                 shapes: np.ndarray | None = None):
        self.region, self.ranges, self.decode, self.shapes = region, ranges, decode, shapes
        self.where, self.field, self.chunk, self.first = context
        self.dtype = np.dtype(decode.dtype)
        self.shape = (len(ranges), *decode.shape)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.decode_sample(index)

    def sample_shape(self, index: int) -> tuple[int, ...]:
        """The shape sample ``index`` decodes to (its own, for pictures kept at their size)."""
        if self.shapes is None:
            return self.decode.shape
        return tuple(self.shapes[index].tolist()) if len(self.decode.shape) == 3 else tuple(self.shapes[index, :2].tolist())

    def decode_sample(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """Sample ``index``, decoded (into ``out``, of the decoded sample's shape, when given)."""
        data = self._bytes(index)
        if out is None and self.shapes is not None:
            out = np.empty(self.sample_shape(index), self.dtype)
        try:
            return decode_image(data, self.decode.shape, self.decode.resize, self.dtype, out=out)
        except ImageError as error:
            raise self._error(index, error.reason) from None

    def decode_samples(self, samples: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
        """Samples ``samples[k]`` decoded into ``out[rows[k]]``, for every ``k`` (`decode_rows`)."""
        decode_rows([self], np.zeros(len(samples), np.int64), samples, out, rows)

    def decode_region(self, index: int, box: Box, size: tuple[int, int], out: np.ndarray,
                      flip: tuple[bool, bool] = (False, False)) -> np.ndarray:
        """``box`` of sample ``index`` (in the decoded sample's pixels) resized to ``size`` and mirrored as
        ``flip`` says, into ``out``, decoded from the file as `outcore.imaging.decode.decode_region` does. A
        box past the sample's edges (`RandomCrop`'s padding, `ScaleJitter`'s window) is zeros there
        (`box_part`)."""
        data, picture = self._bytes(index), self.sample_shape(index)[:2]
        stored = None if self.shapes is None else picture
        target = out
        if not within(box, picture):
            out[...] = 0
            if (part := box_part(box, picture, size, flip)) is None:
                return out
            box, size, (rows, columns) = part
            target = out[rows, columns]
        try:
            decode_region(data, self.decode, box, size, target, stored=stored, flip=flip)
        except ImageError as error:
            raise self._error(index, error.reason) from None
        return out

    def _bytes(self, index: int) -> bytes:
        start, stop = self.ranges[index].tolist()
        if not 0 <= start <= stop <= len(self.region):
            raise self._error(index, f"its byte range {start}..{stop} lies outside the chunk")
        return self.region[start:stop].tobytes()

    def files(self) -> tuple[np.ndarray, np.ndarray]:
        """``(bytes, ranges)``: the chunk's bytes and each sample's ``[start, stop)`` in them, checked (a range
        outside the bytes is the sample's `SampleDecodeError`)."""
        starts, stops = self.ranges[:, 0], self.ranges[:, 1]
        wrong = np.flatnonzero((starts < 0) | (stops < starts) | (stops > len(self.region)))
        if len(wrong):
            self._bytes(int(wrong[0]))  # raises, naming it
        return self.region, self.ranges

    def decode_into(self, out: np.ndarray) -> np.ndarray:
        """Every sample decoded into ``out``: one array of samples, or, for pictures kept at their size,
        an object array of one array per sample."""
        if out.dtype != object:
            everyone = np.arange(len(self))
            self.decode_samples(everyone, out, everyone)
            return out[: len(self)]
        for i in range(len(self)):
            out[i] = self.decode_sample(i)
        return out[: len(self)]

    def sample_name(self, index: int) -> str:
        """Sample ``index`` in an error's words: ``<store>: field 'images', sample 12 (chunk 3)``."""
        return f"{self.where}: field {self.field!r}, sample {self.first + index} (chunk {self.chunk})"

    def _error(self, index: int, reason: str) -> SampleDecodeError:
        return SampleDecodeError(
            f"{self.sample_name(index)} cannot be decoded: {reason}. Find every such sample with "
            f"`outcore verify {self.where}`, then re-ingest it from a good file."
        )


def decode_rows(chunks: Sequence[EncodedChunk], which: np.ndarray, samples: np.ndarray, out: np.ndarray,
                rows: np.ndarray) -> None:
    """Sample ``samples[k]`` of ``chunks[which[k]]`` (chunks of one field) decoded into ``out[rows[k]]``, for every
    ``k``: the plain JPEGs of the field's shape all at once, in one C call (`decode_plain_jpegs`), any others one
    by one as `EncodedChunk.decode_sample` does."""
    RowDecodes(chunks, which, samples, out, rows).run(0, len(samples))


def cut_rows(chunks: Sequence[EncodedChunk], which: np.ndarray, samples: np.ndarray, boxes: np.ndarray,
             pictures: np.ndarray, size: tuple[int, int], out: np.ndarray, rows: np.ndarray, flips: np.ndarray) -> None:
    """``boxes[k]`` (top, left, height, width) of sample ``samples[k]`` of ``chunks[which[k]]``, a picture of
    ``pictures[k]`` (height, width), resized to ``size`` and mirrored as ``flips[k]`` (left-right, top-bottom)
    says, into ``out[rows[k]]``, for every ``k``, as `EncodedChunk.decode_region` does: the boxes of plain JPEGs of
    their sample's size all at once, in one C call (`crop_plain_jpegs`), any others one by one."""
    BoxCuts(chunks, which, samples, boxes, pictures, size, out, rows, flips).run(0, len(samples))


class RowDecodes:
    """`decode_rows` of a batch, made ready once for its runs (`run`): a run of plain JPEGs is one C call on slices
    of the arrays made here, a few microseconds of Python where each run's own conversions held the GIL for tens
    (a batch of 256 decodes in 16 runs)."""

    def __init__(self, chunks: Sequence[EncodedChunk], which: np.ndarray, samples: np.ndarray, out: np.ndarray,
                 rows: np.ndarray) -> None:
        self.chunks, self.which, self.samples, self.out, self.rows = chunks, which, samples, out, rows
        first = chunks[0]
        self.plain = None if first.shapes is not None or out.shape[1:] != first.decode.shape else \
            plain_jpeg_decodes([chunk.region for chunk in chunks], [chunk.ranges for chunk in chunks], which, samples,
                               out, rows)

    def run(self, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` decoded: the plain JPEGs in C, the others one by one."""
        left = range(start, stop) if self.plain is None else [start + k for k in self.plain(slice(start, stop))]
        for k in left:
            self.chunks[self.which[k]].decode_sample(int(self.samples[k]), self.out[self.rows[k]])


class BoxCuts:
    """`cut_rows` of a batch, made ready once for its runs (`run`), as `RowDecodes`: the C call's arrays (a run is
    one call on slices of them)."""

    def __init__(self, chunks: Sequence[EncodedChunk], which: np.ndarray, samples: np.ndarray, boxes: np.ndarray,
                 pictures: np.ndarray, size: tuple[int, int], out: np.ndarray, rows: np.ndarray,
                 flips: np.ndarray) -> None:
        self.chunks, self.which, self.samples, self.boxes, self.size = chunks, which, samples, boxes, size
        self.out, self.rows, self.flips = out, rows, flips
        first = chunks[0]
        self.crop = None
        if first.dtype == np.uint8 and (first.decode.variable or first.decode.resize in ("crop", "fit")):
            self.crop = plain_jpeg_crops([chunk.region for chunk in chunks], [chunk.ranges for chunk in chunks], which,
                                         samples, pictures, boxes, out, rows, flips)

    def run(self, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` cut: the boxes of plain JPEGs in C (past their edges too), the others one by one."""
        left = range(start, stop) if self.crop is None else [start + k for k in self.crop(slice(start, stop))]
        for k in left:
            self.chunks[self.which[k]].decode_region(int(self.samples[k]), tuple(self.boxes[k].tolist()), self.size,
                                                     self.out[self.rows[k]],
                                                     (bool(self.flips[k, 0]), bool(self.flips[k, 1])))


class DecodedChunks:
    """The chunk reader of an encoded field: ``read(chunk)`` returns the chunk's samples, decoded — for
    pictures kept at their own size, as an object array of one array per sample.

    The images are decoded one by one (the decoders release the GIL, so reader threads decode in
    parallel). A sample that cannot be decoded, or whose size is not the one stored for it, raises
    `SampleDecodeError` naming the sample and its chunk.
    """

    def __init__(self, store: Store, field: str) -> None:
        self.field, self.where = field, store.location
        self.decode = store.info(field).decode
        self.dtype = np.dtype(self.decode.dtype)
        self.bytes = EncodedBytes(store.array, field, store.location, len(store), variable=self.decode.variable,
                                  pins=store.pins, indexes=store.shard_indexes)
        self.chunk_size = self.bytes.chunk_size
        self._scratch = threading.local()

    @property
    def direct(self) -> bool:
        return self.bytes.direct

    def empty(self) -> np.ndarray:
        """A buffer for `read`: one chunk of decoded samples (one object per sample when sizes vary)."""
        if self.decode.variable:
            return np.empty(self.chunk_size, dtype=object)
        return blocks.empty((self.chunk_size, *self.decode.shape), self.dtype)

    @property
    def remote(self) -> bool:
        return self.bytes.remote

    def prefetch(self, chunks: Sequence[int]) -> None:
        """Fetch the chunks' stored bytes now, for the `read` calls that follow (object stores)."""
        self.bytes.prefetch(chunks)

    def expect(self, chunk: int, when: float) -> None:
        """Tell the node's cache when the chunk will be read next (object stores)."""
        self.bytes.expect(chunk, when)

    def read(self, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        """The chunk's samples, decoded (into ``out``, from `empty`, when given)."""
        region = getattr(self._scratch, "region", None)
        if region is None:
            region = self._scratch.region = self.bytes.empty()
        return self.read_encoded(chunk, region).decode_into(self.empty() if out is None else out)

    def read_encoded(self, chunk: int, region: np.ndarray | None = None) -> EncodedChunk:
        """The chunk's bytes, to decode later (into ``region``, from ``self.bytes.empty()``, when given)."""
        data, ranges = self.bytes.read(chunk, region)
        shapes = self.bytes.read_shapes(chunk) if self.decode.variable else None
        return self._encoded(chunk, data, ranges, shapes)

    def encoded_of_parts(self, chunk: int, read: Sequence[np.ndarray]) -> EncodedChunk:
        """`read_encoded`'s chunk from its shard reads (`EncodedBytes.sources`), read by another call."""
        return self._encoded(chunk, *self.bytes.of_parts(chunk, read))

    def _encoded(self, chunk: int, data: np.ndarray, ranges: np.ndarray, shapes: np.ndarray | None) -> EncodedChunk:
        return EncodedChunk(data, ranges, self.decode, (self.where, self.field, chunk, chunk * self.chunk_size), shapes)
