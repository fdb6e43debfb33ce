"""A batch's samples gathered out of the loaded chunks that hold them into new arrays: copied (pixels, and any
other array field), decoded (encoded pictures), or cut by a crop, resized and mirrored as they are copied or
decoded (`Cut`). The batch's rows are taken in order of their chunk, in runs that the pool's free threads share
(`outcore.threads.for_each_run`); a run is one call per field (`copy_samples`: one C call for a run's copies;
`decode_rows`, `cut_rows`: its plain JPEGs decoded or cut together in one C call), never a Python call per
sample where the C extensions are built.

>>> chunks = {7: {"x": np.arange(4) * 10}, 2: {"x": np.arange(4)}}
>>> assemble(Rows(np.array([7, 2, 7]), np.array([1, 3, 2])), chunks, ["x"], frozenset())["x"].tolist()
[10, 3, 20]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..format import decode_text, offsets_name
from ..imaging import EncodedChunk, copy_samples, cut_rows, decode_rows, empty_for_decoding, resize_box
from ..storage import RaggedChunk
from ..threads import for_each_run

RUN_BYTES = 4 << 20  # a run of copies moves this much at least: its few microseconds of Python are ~1 % of it
DECODES_PER_RUN = 4  # a run of decodes (60 us to a few ms each) holds this many at least

ChunkValues = Mapping[str, Any]  # field -> one chunk's values: an array, or an EncodedChunk to decode


class Empty(Protocol):
    """Makes a batch's array of field ``field``: `plain` memory, or shared memory (`outcore.iterate.shared`)."""

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray: ...


def plain(shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray:
    """A new array in plain memory, where the decoders write fastest (`outcore.imaging.empty_for_decoding`):
    the default `Empty`."""
    return empty_for_decoding(shape, dtype)


class Rows:
    """A batch's rows in order of the chunks they are read from: ``order[i]`` is the ``i``-th row so taken,
    ``chunks`` the chunks (each once, increasing), ``which[i]`` its chunk (an index into ``chunks``) and
    ``local[i]`` its sample there.

    >>> rows = Rows(np.array([7, 2, 7]), np.array([1, 3, 2]))
    >>> rows.order.tolist(), rows.chunks.tolist(), rows.which.tolist(), rows.local.tolist()
    ([1, 0, 2], [2, 7], [0, 1, 1], [3, 1, 2])
    """

    def __init__(self, keys: np.ndarray, local: np.ndarray) -> None:
        self.order = np.argsort(keys, kind="stable")
        self.chunks, self.which = np.unique(keys[self.order], return_inverse=True)
        self.local = np.asarray(local)[self.order]

    def __len__(self) -> int:
        return len(self.order)

    def sources(self, data: Mapping[int, ChunkValues], field: str) -> list[Any]:
        """Field ``field``'s values in each of the chunks, in the order of ``chunks``."""
        return [data[int(chunk)][field] for chunk in self.chunks]


@dataclass(frozen=True)
class Cut:
    """The crop of ``field`` done as the batch is made: row ``i``'s box ``boxes[i]`` (top, left, height, width
    in its picture's pixels, of ``sizes[i]``) resized to ``size`` and mirrored as ``flips[i]`` (left-right,
    top-bottom) says."""

    field: str
    size: tuple[int, int]
    boxes: np.ndarray  # (rows, 4) float64
    flips: np.ndarray  # (rows, 2) uint8
    sizes: np.ndarray  # (rows, 2) int64

    def windows(self) -> bool:
        """Whether every box is a window of whole pixels at the output size (a plain crop, copied as it is)."""
        whole = np.all(self.boxes == np.round(self.boxes))
        return bool(whole and np.all(self.boxes[:, 2:] == self.size))


def assemble(rows: Rows, data: Mapping[int, ChunkValues], fields: Sequence[str], text_fields: frozenset[str],
             empty: Empty = plain, cut: Cut | None = None) -> dict[str, np.ndarray]:
    """A new batch of ``rows``: each sample copied once, straight from its chunk into the batch (no
    temporaries), encoded pictures decoded into it, text decoded to strings, a ragged field's rows back to back
    with their offsets (`outcore.format.ragged`); ``cut``'s field cut as it says.
    The batch's arrays are always new (made by ``empty(shape, dtype, field=name)``): nothing the caller is
    handed is ever written again."""
    first = data[int(rows.chunks[0])]
    batch: dict[str, np.ndarray] = {}
    copies: list[tuple[Callable[[int, int], None], int]] = []  # (run, bytes a row) of the cheap work
    decodes: list[Callable[[int, int], None]] = []
    for name in fields:
        values = first[name]
        if isinstance(values, RaggedChunk):
            batch[name], batch[offsets_name(name)] = _gather_rows(rows, data, name)
            continue
        if cut is not None and name == cut.field:
            shape = (len(rows), *cut.size, *_sample_shape(values)[2:])
            batch[name] = out = empty(shape, values.dtype, field=name)
            if isinstance(values, np.ndarray) and cut.windows():
                copies.append((_window_copies(rows, data, cut, out), out[0].nbytes))
            else:
                decodes.append(_cuts(rows, data, cut, out))
            continue
        shape = (len(rows), *_sample_shape(values))
        batch[name] = out = np.empty(shape, values.dtype) if name in text_fields else empty(shape, values.dtype, field=name)
        if isinstance(values, EncodedChunk):
            decodes.append(_each_run(decode_rows, rows, data, name, out))
        else:
            copies.append((_each_run(copy_samples, rows, data, name, out), out[0].nbytes if len(out) else 1))
    if copies:
        least = max(1, RUN_BYTES // max(1, sum(nbytes for _, nbytes in copies)))
        for_each_run(lambda start, stop: [run(start, stop) for run, _ in copies], len(rows), least)
    if decodes:
        for_each_run(lambda start, stop: [run(start, stop) for run in decodes], len(rows), DECODES_PER_RUN)
    return {name: decode_text(values) if name in text_fields else values for name, values in batch.items()}


def _gather_rows(rows: Rows, data: Mapping[int, ChunkValues], field: str) -> tuple[np.ndarray, np.ndarray]:
    """A ragged field's rows of the batch's samples, back to back in the batch's order, and their offsets (n + 1,):
    one gather per chunk, never a Python call per sample. In plain memory: not an `Empty`'s, which makes a
    DataLoader worker's part of a batch in rows of the batch's files (one per sample, not per row)."""
    sources: list[RaggedChunk] = rows.sources(data, field)
    starts, counts = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.int64)
    for chunk, source in enumerate(sources):
        mine = rows.which == chunk
        spans = source.ranges[rows.local[mine]]
        starts[rows.order[mine]], counts[rows.order[mine]] = spans[:, 0], spans[:, 1] - spans[:, 0]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    first = sources[0]
    values = np.empty((int(offsets[-1]), *first.row_shape), first.dtype)
    for chunk, source in enumerate(sources):
        samples = rows.order[rows.which == chunk]
        taken = counts[samples]
        within = np.arange(int(taken.sum())) - np.repeat(np.cumsum(taken) - taken, taken)
        values[np.repeat(offsets[samples], taken) + within] = source.values[np.repeat(starts[samples], taken) + within]
    return values, offsets


def _sample_shape(values: np.ndarray | EncodedChunk) -> tuple[int, ...]:
    return values.decode.shape if isinstance(values, EncodedChunk) else values.shape[1:]


def _each_run(call: Callable[..., None], rows: Rows, data: Mapping[int, ChunkValues], field: str,
              out: np.ndarray) -> Callable[[int, int], None]:
    """A run's ``call(sources, which, local, out, rows)``: its copies (`copy_samples`) or decodes (`decode_rows`)."""
    sources = rows.sources(data, field)

    def run(start: int, stop: int) -> None:
        call(sources, rows.which[start:stop], rows.local[start:stop], out, rows.order[start:stop])

    return run


def _window_copies(rows: Rows, data: Mapping[int, ChunkValues], cut: Cut, out: np.ndarray) -> Callable[[int, int], None]:
    sources = rows.sources(data, cut.field)
    corners = cut.boxes[rows.order, :2].astype(np.int64)
    flips = cut.flips[rows.order]

    def run(start: int, stop: int) -> None:
        copy_samples(sources, rows.which[start:stop], rows.local[start:stop], out, rows.order[start:stop],
                     corners[start:stop, 0], corners[start:stop, 1], flips[start:stop])

    return run


def _cuts(rows: Rows, data: Mapping[int, ChunkValues], cut: Cut, out: np.ndarray) -> Callable[[int, int], None]:
    """Boxes cut while decoding (encoded fields: `cut_rows`) or resized out of their pixels, one by one."""
    sources = rows.sources(data, cut.field)
    boxes, flips, sizes = cut.boxes[rows.order], cut.flips[rows.order], cut.sizes[rows.order]
    encoded = isinstance(sources[0], EncodedChunk)

    def run(start: int, stop: int) -> None:
        which, local, targets = rows.which[start:stop], rows.local[start:stop], rows.order[start:stop]
        if encoded:
            cut_rows(sources, which, local, boxes[start:stop], sizes[start:stop], cut.size, out, targets,
                     flips[start:stop])
            return
        for chunk, index, box, flip, target in zip(which.tolist(), local.tolist(), boxes[start:stop].tolist(),
                                                   flips[start:stop].astype(bool).tolist(), targets.tolist(), strict=True):
            picture = sources[chunk][index]
            resize_box(picture.reshape(*picture.shape[:2], -1), box, cut.size, out[target], tuple(flip))

    return run


def picture_sizes(sources: Sequence[np.ndarray | EncodedChunk], which: np.ndarray, local: np.ndarray) -> np.ndarray:
    """The (height, width) of sample ``local[k]`` of ``sources[which[k]]`` (the chunks' values of one picture
    field), (n, 2): one size for them all where the field has one (pixels, or encoded pictures of one shape)."""
    first = sources[0]
    if isinstance(first, np.ndarray) or first.shapes is None:
        return np.tile(np.asarray(_sample_shape(first)[:2], np.int64), (len(local), 1))
    sizes = np.empty((len(local), 2), np.int64)
    for chunk in np.unique(which).tolist():
        mine = which == chunk
        sizes[mine] = sources[chunk].shapes[local[mine], :2]
    return sizes
