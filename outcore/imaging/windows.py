"""A batch's samples copied out of the chunks that hold them: whole samples of any field, or windows of
pictures (a crop: zeros where it lies past the picture's edges) mirrored left-right and top-bottom. One C
call for many samples, outside the GIL (`native.windows`, the ``_windows`` extension), or numpy: the same
bytes.

>>> chunks = [np.arange(2 * 3 * 3).reshape(2, 3, 3), np.arange(100, 118).reshape(2, 3, 3)]
>>> out = np.zeros((2, 2, 2), np.int64)
>>> one = np.ones(2, np.int64)
>>> copy_samples(chunks, np.array([1, 0]), one, out, np.array([0, 1]), tops=np.array([0, -1]), lefts=one,
...              flips=np.array([[0, 0], [1, 0]], np.uint8))
>>> out.tolist()  # chunk 1's sample 1 at (0, 1); chunk 0's sample 1 at (-1, 1) (a row of zeros), mirrored
[[[110, 111], [113, 114]], [[0, 0], [11, 10]]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import native
from .crops import box_part


def copy_samples(chunks: Sequence[np.ndarray], which: np.ndarray, local: np.ndarray, out: np.ndarray,
                 rows: np.ndarray, tops: np.ndarray | None = None, lefts: np.ndarray | None = None,
                 flips: np.ndarray | None = None, boxes: np.ndarray | None = None) -> None:
    """Sample ``local[k]`` of ``chunks[which[k]]`` into ``out[rows[k]]``, for every ``k``: whole, or with ``tops``
    and ``lefts``, the window of ``out``'s height and width whose top-left corner is at ``(tops[k], lefts[k])``
    of the picture (axes 1 and 2), mirrored as ``flips[k]`` (left-right, top-bottom) says; or with ``boxes``
    (``(len(out), 4)``: each row of ``out``'s ``(top, left, height, width)``, windows of whole pixels of its size,
    any other refused), at the top
    and left of ``boxes[rows[k]]``, mirrored as ``flips[rows[k]]`` says: a batch's boxes and mirrors as they are,
    in the batch's order. The chunks and ``out`` are C-contiguous of one dtype (their samples of one shape, or past
    the height and width with windows)."""
    which, local, rows = _int64(which), _int64(local), _int64(rows)
    if boxes is not None and native.windows is None:  # each copy's corner and mirrors, in the copies' order
        taken = np.asarray(boxes, np.float64)[rows]
        wrong = np.flatnonzero(~((taken[:, :2] == np.floor(taken[:, :2])).all(axis=1) & (taken[:, 2:] == out.shape[1:3])
                                 .all(axis=1)))
        if len(wrong):
            raise ValueError(f"copy: out row {rows[wrong[0]]}'s box {tuple(taken[wrong[0]].tolist())} is no window of "
                             f"whole pixels of out's {out.shape[1]}x{out.shape[2]}")
        corners = taken[:, :2].astype(np.int64)
        tops, lefts, flips = corners[:, 0], corners[:, 1], None if flips is None else np.asarray(flips)[rows]
    windowed = tops is not None
    if native.windows is not None:
        mirrors = None if flips is None else np.ascontiguousarray(flips, np.uint8)
        if boxes is not None:
            native.windows.copy(chunks, which, local, out, rows, flips=mirrors,
                                boxes=np.ascontiguousarray(boxes, np.float64))
            return
        native.windows.copy(chunks, which, local, out, rows, *((_int64(tops), _int64(lefts)) if windowed else ()),
                            *((mirrors,) if windowed and mirrors is not None else ()))
        return
    if not windowed:
        for chunk in np.unique(which).tolist():
            taken = which == chunk
            out[rows[taken]] = chunks[chunk][local[taken]]
        return
    size = out.shape[1:3]
    mirrored = np.zeros((len(rows), 2), bool) if flips is None else np.asarray(flips, bool)
    for k, (chunk, index, row, top, left) in enumerate(zip(which.tolist(), local.tolist(), rows.tolist(),
                                                            tops.tolist(), lefts.tolist(), strict=True)):
        picture, target = chunks[chunk][index], out[row]
        flip = (bool(mirrored[k, 0]), bool(mirrored[k, 1]))
        part = box_part((top, left, *size), picture.shape[:2], size, flip)
        if part is None or part[0] != (top, left, *size):
            target[...] = 0
        if part is not None:
            (y, x, height, width), _, (window_rows, window_columns) = part
            inside = picture[y : y + height, x : x + width]
            target[window_rows, window_columns] = inside[:: -1 if flip[1] else 1, :: -1 if flip[0] else 1]


def rows_by_chunk(keys: np.ndarray, samples: np.ndarray,
                  chunk_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """A batch's rows sorted by chunk, as `outcore.iterate.gather.Rows` holds them: ``(order, chunks, which, local)``,
    ``order`` the stable sort of ``keys``, ``chunks`` the keys each once (increasing), ``which`` each sorted row's
    index in ``chunks``, ``local`` its sample's index in its chunk (``samples % chunk_size``); in one C call that keeps
    the GIL (numpy's sort and gathers would each give it up: on a busy pool, a hand-over to another thread). None
    without the extension, or for keys spread too far for its counting sort: numpy then.

    >>> made = rows_by_chunk(np.array([7, 2, 7]), np.array([15, 3, 10]), 4)
    >>> made is None or [part.tolist() for part in made] == [[1, 0, 2], [2, 7], [0, 1, 1], [3, 3, 2]]
    True
    """
    made = getattr(native.windows, "rows", None)  # None: not built (or built before it was)
    if made is None:
        return None
    keys, samples = _int64(keys), _int64(samples)
    order, which, local, chunks = np.empty((4, len(keys)), np.int64)  # four rows, each contiguous
    found = made(keys, samples, int(chunk_size), order, which, local, chunks)
    return None if found < 0 else (order, chunks[:found], which, local)


def gather_ragged(values: Sequence[np.ndarray], ranges: Sequence[np.ndarray], which: np.ndarray, local: np.ndarray,
                  rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A ragged field's samples in a batch (`outcore.format.ragged`): copy ``k`` is the rows
    ``values[c][start:stop]`` of chunk ``c = which[k]``, ``(start, stop) = ranges[c][local[k]]``, put at batch row
    ``rows[k]``; returns the batch's rows back to back in the batch's order, and where each batch row's begin
    (``len(rows) + 1`` offsets). Two C calls for the whole batch (its offsets, then its rows), not numpy's dozen a
    chunk, each of which gives the GIL up; numpy without the extension.

    >>> values = [np.array([[1, 1], [2, 2], [3, 3]]), np.array([[9, 9]])]
    >>> ranges = [np.array([[0, 1], [1, 3]]), np.array([[0, 1]])]
    >>> out, offsets = gather_ragged(values, ranges, np.array([0, 0, 1]), np.array([1, 0, 0]), np.array([2, 0, 1]))
    >>> out.tolist(), offsets.tolist()  # row 0: chunk 0's sample 0, row 1: chunk 1's sample 0, row 2: chunk 0's 1
    ([[1, 1], [9, 9], [2, 2], [3, 3]], [0, 1, 2, 4])
    """
    which, local, rows = _int64(which), _int64(local), _int64(rows)
    values = [np.ascontiguousarray(chunk) for chunk in values]
    ranges = [_int64(spans) for spans in ranges]
    first, offsets = values[0], np.zeros(len(rows) + 1, np.int64)
    if getattr(native.windows, "ragged_rows", None) is not None:  # None: not built (or built before it was)
        out = np.empty((native.windows.ragged_offsets(ranges, which, local, rows, offsets), *first.shape[1:]),
                       first.dtype)
        native.windows.ragged_rows(values, ranges, which, local, rows, offsets, out)
        return out, offsets
    starts, counts = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.int64)
    for chunk, spans_of in enumerate(ranges):
        mine = which == chunk
        spans = spans_of[local[mine]]
        starts[rows[mine]], counts[rows[mine]] = spans[:, 0], spans[:, 1] - spans[:, 0]
    np.cumsum(counts, out=offsets[1:])
    out = np.empty((int(offsets[-1]), *first.shape[1:]), first.dtype)
    for chunk, chunk_rows in enumerate(values):
        samples = rows[which == chunk]
        taken = counts[samples]
        within = np.arange(int(taken.sum())) - np.repeat(np.cumsum(taken) - taken, taken)
        out[np.repeat(offsets[samples], taken) + within] = chunk_rows[np.repeat(starts[samples], taken) + within]
    return out, offsets


def interleave(parts: Sequence[np.ndarray], counts: np.ndarray,
               tables: Sequence[np.ndarray] | None = None) -> np.ndarray | None:
    """Streams' items put batch after batch: each batch ``b``'s next ``counts[b, s]`` items of ``parts[s]``, stream
    after stream (an item ``v`` as ``tables[s][v]`` where ``tables`` are given), in one C call that keeps the GIL for
    an epoch plan's few thousand (numpy's concatenations and gathers of them would give it up, one a part). None
    without the extension.

    >>> made = interleave([np.array([0, 1, 2, 3]), np.array([7, 8])], np.array([[2, 1], [2, 1]]))
    >>> made is None or made.tolist() == [0, 1, 7, 2, 3, 8]
    True
    """
    made = getattr(native.windows, "interleave", None)  # None: not built (or built before it was)
    if made is None:
        return None
    out = np.empty(int(counts.sum()), np.int64)
    made([_int64(part) for part in parts], _int64(counts), None if tables is None else [_int64(t) for t in tables], out)
    return out


def _int64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, np.int64)
