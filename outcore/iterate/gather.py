"""A batch's samples gathered out of the loaded chunks that hold them into new arrays: copied (pixels, and any
other array field), decoded (encoded pictures), or cut by a crop, resized and mirrored as they are copied or
decoded (`Cut`). The batch's rows are taken in order of their chunk, in runs that the pool's free threads share
(`outcore.threads.for_each_run`); a run is one call per field (`copy_samples`: one C call for a run's copies;
`RowDecodes.run`, `BoxCuts.run`: its plain JPEGs decoded or cut together in one C call, on arrays made ready once a
batch), never a Python call per sample where the C extensions are built.

>>> chunks = {7: {"x": np.arange(4) * 10}, 2: {"x": np.arange(4)}}
>>> assemble(Rows(np.array([7, 2, 7]), np.array([1, 3, 2])), chunks, ["x"], frozenset())["x"].tolist()
[10, 3, 20]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import OptionError
from ..format import decode_text, offsets_name, undecoded_names
from ..imaging import (
    BoxCuts,
    EncodedChunk,
    RowDecodes,
    copy_samples,
    cut_maps,
    gather_ragged,
    resize_boxes,
    resize_rows,
    resize_spans,
    rows_by_chunk,
)
from ..storage import RaggedChunk, blocks
from ..threads import for_each_run

RUN_BYTES = 16 << 20  # a run of copies moves this much at least: each run takes the GIL back and hands a thread work
# or waits for one, a third to half as long as copying 4 MiB that the caches hold (docs/benchmarks.md, "Figures
# behind the code")
# A run of decodes (60 us to a few ms each) holds DECODES_PER_RUN of them, or fewer of large pictures: as many as read
# RUN_PIXELS of their files' pixels, at least one. Each run holds the GIL a few microseconds (its slices of the arrays
# `RowDecodes` and `BoxCuts` made ready), so runs of small pictures are long, and a batch of large ones is shared out
# in shorter runs, whose ends leave fewer threads idle at the end of a batch (docs/benchmarks.md, "Figures behind the
# code").
DECODES_PER_RUN = 16
# A field whose batch holds fewer bytes (its labels) is copied in one call as the batch is made, not in each run: the
# C extension copies that little holding the GIL, where a call a run would let it go and take it back each time.
SMALL_BYTES = 64 << 10
RUN_PIXELS = 1_200_000

ChunkValues = Mapping[str, Any]  # field -> one chunk's values: an array, or an EncodedChunk to decode


class Empty(Protocol):
    """Makes a batch's array of field ``field``: `plain` memory, or shared memory (`outcore.iterate.shared`)."""

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray: ...


def plain(shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray:
    """A new array in plain memory, where the decoders write fastest, used again once nothing refers to it
    (`outcore.storage.blocks`): the default `Empty`."""
    return blocks.empty(shape, dtype)


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
        ordered = keys[self.order]
        first = np.empty(len(ordered), bool)  # each chunk's first row (np.unique sorts again, in more calls)
        first[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
        self.chunks, self.which = ordered[first], np.cumsum(first) - 1
        self.local = np.asarray(local)[self.order]

    @classmethod
    def of(cls, keys: np.ndarray, samples: np.ndarray, chunk_size: int) -> Rows:
        """``Rows(keys, samples % chunk_size)``, in one C call where the extension is built (`rows_by_chunk`).

        >>> Rows.of(np.array([7, 2, 7]), np.array([15, 3, 10]), 4).local.tolist()
        [3, 3, 2]
        """
        made = rows_by_chunk(keys, samples, chunk_size)
        if made is None:
            return cls(keys, samples % chunk_size)
        rows = cls.__new__(cls)
        rows.order, rows.chunks, rows.which, rows.local = made
        return rows

    def __len__(self) -> int:
        return len(self.order)

    def sources(self, data: Mapping[int, ChunkValues], field: str) -> list[Any]:
        """Field ``field``'s values in each of the chunks, in the order of ``chunks``."""
        return [data[chunk][field] for chunk in self.chunks.tolist()]


@dataclass(frozen=True)
class Cut:
    """The crop of ``field`` done as the batch is made: row ``i``'s box ``boxes[i]`` (top, left, height, width
    in its picture's pixels, of ``sizes[i]``) resized to ``size`` and mirrored as ``flips[i]`` (left-right,
    top-bottom) says. The raster fields of the batch (label maps and paired pictures at their pictures' own sizes,
    `outcore.format.attrs`) are cut by the same boxes: those in ``label_maps`` nearest-neighbour, the others as
    pictures."""

    field: str
    size: tuple[int, int]
    boxes: np.ndarray  # (rows, 4) float64
    flips: np.ndarray  # (rows, 2) uint8
    sizes: np.ndarray  # (rows, 2) int64
    label_maps: frozenset[str] = frozenset()  # raster fields cut with it, nearest-neighbour, ``fill`` past the edges
    fill: int = 0
    whole: bool = False  # every box is a window of whole pixels at the output size, as the crop draws them

    def pixels(self) -> float:
        """The mean pixels of the pictures the boxes are cut from."""
        return float(np.prod(self.sizes, axis=1).mean()) if len(self.sizes) else 0.0

    def windows(self) -> bool:
        """Whether every box is a window of whole pixels at the output size (a plain crop, copied as it is): known
        where the crop draws only such boxes (``whole``; numpy's checks of a batch's boxes give up the GIL)."""
        if self.whole:
            return True
        whole = np.all(self.boxes == np.round(self.boxes))
        return bool(whole and np.all(self.boxes[:, 2:] == self.size))


def assemble(rows: Rows, data: Mapping[int, ChunkValues], fields: Sequence[str], text_fields: frozenset[str],
             empty: Empty = plain, cut: Cut | None = None, later: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """A new batch of ``rows``: each sample copied once, straight from its chunk into the batch (no
    temporaries), encoded pictures decoded into it, text decoded to strings, a ragged field's rows back to back
    with their offsets (`outcore.format.ragged`); ``cut``'s field cut as it says. The encoded fields in ``later``
    are left undecoded, for a decoder elsewhere (`undecoded`).
    The batch's arrays are always new (made by ``empty(shape, dtype, field=name)``): nothing the caller is
    handed is ever written again."""
    first = data[int(rows.chunks[0])]
    batch: dict[str, np.ndarray] = {}
    copies: list[tuple[Callable[[int, int], None], int]] = []  # (run, bytes a row) of the cheap work
    decodes: list[tuple[Callable[[int, int], None], float]] = []  # (run, its files' pixels a row)
    for name in fields:
        values = first[name]
        if isinstance(values, RaggedChunk) and values.shapes is not None:  # a raster: cut with its pictures
            if cut is None:
                raise ValueError(f"raster field {name!r} is cut with its pictures: the batch has no crop")
            batch[name] = out = empty((len(rows), *cut.size, *values.row_shape), values.dtype, field=name)
            decodes.append((_raster_cuts(rows, data, name, cut, out), cut.pixels()))
            continue
        if isinstance(values, RaggedChunk) or name in later:
            batch[name], batch[offsets_name(name)] = _gather_rows(rows, data, name)
            if name in later:
                batch.update(undecoded(rows, data, name, cut))
            continue
        if cut is not None and name == cut.field:
            shape = (len(rows), *cut.size, *_sample_shape(values)[2:])
            batch[name] = out = empty(shape, values.dtype, field=name)
            if isinstance(values, np.ndarray) and cut.windows():
                copies.append((_window_copies(rows, data, cut, out), out[0].nbytes))
            else:
                decodes.append((_cuts(rows, data, cut, out), cut.pixels()))
            continue
        shape = (len(rows), *_sample_shape(values))
        batch[name] = out = np.empty(shape, values.dtype) if name in text_fields else empty(shape, values.dtype, field=name)
        if isinstance(values, EncodedChunk):
            decodes.append((RowDecodes(rows.sources(data, name), rows.which, rows.local, out, rows.order).run,
                            math.prod(shape[1:3])))
        elif out.nbytes < SMALL_BYTES:  # a batch's labels: one call, at once
            _each_run(copy_samples, rows, data, name, out)(0, len(rows))
        else:
            copies.append((_each_run(copy_samples, rows, data, name, out), out[0].nbytes if len(out) else 1))
    if copies:
        least = max(1, RUN_BYTES // max(1, sum(nbytes for _, nbytes in copies)))
        for_each_run(lambda start, stop: [run(start, stop) for run, _ in copies], len(rows), least)
    if decodes:
        least = decode_run(sum(pixels for _, pixels in decodes))
        for_each_run(lambda start, stop: [run(start, stop) for run, _ in decodes], len(rows), least)
    return {name: decode_text(values) if name in text_fields else values for name, values in batch.items()}


def decode_run(pixels: float) -> int:
    """The fewest decodes a run of a batch holds where each row's files hold ``pixels`` pixels: `DECODES_PER_RUN`, or as
    many as hold `RUN_PIXELS`.

    >>> decode_run(128 * 128), decode_run(500 * 600), decode_run(5000 * 4000)
    (16, 4, 1)
    """
    return max(1, min(DECODES_PER_RUN, math.ceil(RUN_PIXELS / max(1.0, pixels))))


def _gather_rows(rows: Rows, data: Mapping[int, ChunkValues], field: str) -> tuple[np.ndarray, np.ndarray]:
    """A ragged field's rows of the batch's samples, back to back in the batch's order, and their offsets (n + 1,):
    two C calls for the batch (`gather_ragged`), never a Python call per sample. In plain memory: not an `Empty`'s,
    which makes a DataLoader worker's part of a batch in rows of the batch's files (one per sample, not per row)."""
    sources = [source.files() if isinstance(source, EncodedChunk) else (source.values, source.ranges)
               for source in rows.sources(data, field)]  # (rows, ranges) of each chunk: an encoded one's bytes
    return gather_ragged([values for values, _ in sources], [ranges for _, ranges in sources], rows.which,
                         rows.local, rows.order)


def undecoded(rows: Rows, data: Mapping[int, ChunkValues], field: str, cut: Cut | None) -> dict[str, np.ndarray]:
    """What a decoder elsewhere needs besides the files of encoded field ``field`` (`undecoded_names`): each row's
    box (``cut``'s where it cuts ``field``, else the whole picture), its mirrors and its picture's size.

    >>> from outcore.format import ImageDecode
    >>> chunks = {0: {"x": EncodedChunk(np.zeros(8, np.uint8), np.array([[0, 4], [4, 8]]),
    ...                                 ImageDecode((6, 5, 3)), ("s", "x", 0, 0))}}
    >>> undecoded(Rows(np.array([0]), np.array([1])), chunks, "x", None)["x_boxes"].tolist()
    [[0.0, 0.0, 6.0, 5.0]]
    """
    names = undecoded_names(field)
    if cut is not None and cut.field == field:
        return dict(zip(names, (cut.boxes, cut.flips, np.ascontiguousarray(cut.sizes)), strict=True))  # its own
    sizes = np.empty((len(rows), 2), np.int64)
    sizes[rows.order] = picture_sizes(rows.sources(data, field), rows.which, rows.local)
    boxes = np.zeros((len(rows), 4), np.float64)
    boxes[:, 2:] = sizes
    return dict(zip(names, (boxes, np.zeros((len(rows), 2), np.uint8), sizes), strict=True))


def _sample_shape(values: np.ndarray | EncodedChunk) -> tuple[int, ...]:
    return values.decode.shape if isinstance(values, EncodedChunk) else values.shape[1:]


def _each_run(call: Callable[..., None], rows: Rows, data: Mapping[int, ChunkValues], field: str,
              out: np.ndarray) -> Callable[[int, int], None]:
    """A run's ``call(sources, which, local, out, rows)``: its copies (`copy_samples`)."""
    sources = rows.sources(data, field)

    def run(start: int, stop: int) -> None:
        call(sources, rows.which[start:stop], rows.local[start:stop], out, rows.order[start:stop])

    return run


def _window_copies(rows: Rows, data: Mapping[int, ChunkValues], cut: Cut, out: np.ndarray) -> Callable[[int, int], None]:
    """A run's windows copied out of their pictures: each row's box and mirrors taken where they are, in the batch's
    order (numpy's gathers of them into the copies' order would give the GIL up)."""
    sources = rows.sources(data, cut.field)

    def run(start: int, stop: int) -> None:
        copy_samples(sources, rows.which[start:stop], rows.local[start:stop], out, rows.order[start:stop],
                     flips=cut.flips, boxes=cut.boxes)

    return run


def _cuts(rows: Rows, data: Mapping[int, ChunkValues], cut: Cut, out: np.ndarray) -> Callable[[int, int], None]:
    """Boxes cut while decoding (encoded fields: `cut_rows`) or resized out of their pixels (`resize_rows`: a run's
    boxes in one C call)."""
    sources = rows.sources(data, cut.field)
    boxes, flips, sizes = cut.boxes[rows.order], cut.flips[rows.order], cut.sizes[rows.order]
    if isinstance(sources[0], EncodedChunk):
        return BoxCuts(sources, rows.which, rows.local, boxes, sizes, cut.size, out, rows.order, flips).run

    def run(start: int, stop: int) -> None:
        resize_rows(sources, rows.which[start:stop], rows.local[start:stop], boxes[start:stop], out,
                    rows.order[start:stop], flips[start:stop])

    return run


def _raster_cuts(rows: Rows, data: Mapping[int, ChunkValues], field: str, cut: Cut,
                 out: np.ndarray) -> Callable[[int, int], None]:
    """A raster field's maps cut by ``cut``'s boxes as they are copied out of their chunks: label maps in one C call a
    run (`cut_maps`), paired pictures resized in one C call a run too (`resize_spans`). A map not of its picture's size
    is an `OptionError` naming it."""
    sources: list[RaggedChunk] = rows.sources(data, field)
    starts, sizes = np.empty(len(rows), np.int64), np.empty((len(rows), 2), np.int64)
    for chunk, source in enumerate(sources):
        mine = rows.which == chunk
        starts[mine], sizes[mine] = source.ranges[rows.local[mine], 0], source.shapes[rows.local[mine], :2]
    wrong = np.flatnonzero((sizes != cut.sizes[rows.order]).any(axis=1))
    if len(wrong):
        k = int(wrong[0])
        raise OptionError(f"field {field!r}: sample {rows.local[k]} of chunk {rows.chunks[rows.which[k]]} is "
                          f"{sizes[k, 0]}x{sizes[k, 1]}, but its picture in {cut.field!r} is "
                          f"{cut.sizes[rows.order[k], 0]}x{cut.sizes[rows.order[k], 1]}: a map moves with its picture "
                          "only at the picture's own size")
    chunks = [source.values for source in sources]
    boxes, flips = cut.boxes[rows.order], cut.flips[rows.order]

    def maps(start: int, stop: int) -> None:
        cut_maps(chunks, rows.which[start:stop], starts[start:stop], sizes[start:stop], boxes[start:stop], cut.size,
                 flips[start:stop], cut.fill, out, rows.order[start:stop])

    def pictures(start: int, stop: int) -> None:
        resize_spans(chunks, rows.which[start:stop], starts[start:stop], sizes[start:stop], boxes[start:stop], out,
                     rows.order[start:stop], flips[start:stop])

    return maps if field in cut.label_maps else pictures


def picture_sizes(sources: Sequence[np.ndarray | EncodedChunk], which: np.ndarray, local: np.ndarray) -> np.ndarray:
    """The (height, width) of sample ``local[k]`` of ``sources[which[k]]`` (the chunks' values of one picture
    field), (n, 2): where the field has one size (pixels, or encoded pictures of one shape), that size seen n times
    (read-only, made without work: numpy gives the GIL up for a copy of more than 500 items)."""
    first = sources[0]
    if one_size(sources):
        return np.broadcast_to(np.asarray(_sample_shape(first)[:2], np.int64), (len(local), 2))
    sizes = np.empty((len(local), 2), np.int64)
    for chunk in np.unique(which).tolist():
        mine = which == chunk
        sizes[mine] = sources[chunk].shapes[local[mine], :2]
    return sizes


def one_size(sources: Sequence[np.ndarray | EncodedChunk]) -> bool:
    """Whether the pictures of ``sources`` (the chunks' values of one picture field) are all of one size: pixels, or
    encoded pictures of one shape."""
    return isinstance(sources[0], np.ndarray) or sources[0].shapes is None


def move_pictures(pictures: np.ndarray, crops: np.ndarray, size: tuple[int, int],
                  flips: np.ndarray | None = None) -> np.ndarray:
    """Each picture (n, h, w[, c]) cut to its crop, resized to ``size`` (bilinear, antialiased) and mirrored as
    ``flips`` says (none mirrored without it): a window of whole pixels at the output size is copied as it is, and
    zeros fill the output past the picture's edges (a padded `RandomCrop`, a `ScaleJitter` smaller than its size)."""
    crops = np.asarray(crops, np.float64).reshape(-1, 4)
    flips = None if flips is None else np.asarray(flips, bool).reshape(-1, 2)
    if np.all(crops == np.round(crops)) and np.all(crops[:, 2:] == size):
        return copy_windows(pictures, crops[:, :2].astype(np.int64), size, flips)
    return resize_boxes(pictures, crops, size, flips)


def copy_windows(images: np.ndarray, corners: np.ndarray, size: tuple[int, int],
                 flips: np.ndarray | None = None) -> np.ndarray:
    """Image ``i``'s window of ``size`` at ``corners[i]`` (top, left; zeros past the edges), mirrored as
    ``flips[i]`` says, into a new array: a C call a run of images, on the pool's free threads (`copy_samples`)."""
    source = np.ascontiguousarray(images)
    out = blocks.empty((len(images), *size, *images.shape[3:]), images.dtype)
    every = np.arange(len(images))

    def run(start: int, stop: int) -> None:
        copy_samples([source], np.zeros(stop - start, np.int64), every[start:stop], out, every[start:stop],
                     corners[start:stop, 0], corners[start:stop, 1], None if flips is None else flips[start:stop])

    for_each_run(run, len(images), run_length(out))
    return out


def run_length(out: np.ndarray) -> int:
    """Samples of ``out`` a run of the pool's work makes at least (`RUN_BYTES`)."""
    return max(1, RUN_BYTES // max(1, out[:1].nbytes))
