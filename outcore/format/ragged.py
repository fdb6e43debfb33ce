"""Ragged fields: a variable number of rows per sample (a picture's boxes, their labels, their keypoints).

On disk a ragged field is laid out as an encoded one (`outcore.format.encoded`), with rows for bytes, so the chunk
stays the unit of I/O and shuffling and only types of the Zarr v3 specification are used:

- the field's array ``F`` is of the rows' dtype, shape ``(num_chunks * capacity, *row_shape)``, chunks of
  ``capacity`` rows: sample chunk ``k`` stores its samples' rows back to back in rows ``[k * capacity, (k + 1) *
  capacity)``, zero-padded;
- ``F_ranges`` is ``int64`` of shape ``(N, 2)``, chunked like every other field: sample ``i``'s rows are
  ``F[F_ranges[i, 0]:F_ranges[i, 1]]``.

In memory (what an ingest writes, what a batch holds) a ragged field is its rows back to back and ``offsets`` (N +
1,): sample ``i``'s rows are ``values[offsets[i]:offsets[i + 1]]``, a `Ragged`. A batch holds the rows under the
field's name and the offsets under ``<field>_offsets`` (`offsets_name`).

>>> import zarr  # doctest: +SKIP
>>> group = zarr.open_group("coco.zarr", mode="r")  # doctest: +SKIP
>>> start, stop = group["boxes_ranges"][7]  # doctest: +SKIP
>>> group["boxes"][start:stop]  # doctest: +SKIP
array([[ 12.5,  40. , 211. , 180.2], [300. ,  10. , 320. ,  44. ]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

OFFSETS_SUFFIX = "_offsets"
KEPT_SUFFIX = "_kept"


def offsets_name(field: str) -> str:
    """The batch field holding a ragged field's offsets.

    >>> offsets_name("boxes")
    'boxes_offsets'
    """
    return field + OFFSETS_SUFFIX


def ragged_names(fields: Collection[str]) -> list[str]:
    """The ragged fields among a batch's ``fields``: those with their offsets (`offsets_name`) beside them.

    >>> ragged_names({"images": 0, "boxes": 0, "boxes_offsets": 0})
    ['boxes']
    """
    return [name for name in fields if offsets_name(name) in fields]


def kept_name(field: str) -> str:
    """The batch field saying, after a crop dropped some of a ragged field's rows, which of its sample's rows each
    kept row was (`outcore.transforms.Targets`).

    >>> kept_name("boxes")
    'boxes_kept'
    """
    return field + KEPT_SUFFIX


UNDECODED_SUFFIXES = ("_boxes", "_flips", "_sizes")


def undecoded_names(field: str) -> tuple[str, str, str]:
    """The batch fields beside a picture field whose files a batch holds undecoded (``decode="later"``, as ragged
    rows of bytes with their offsets): each sample's box to cut (top, left, height, width in its picture's pixels,
    float64), its mirrors (left-right, top-bottom, uint8) and its picture's size (height, width, int64).

    >>> undecoded_names("images")
    ('images_boxes', 'images_flips', 'images_sizes')
    """
    return tuple(field + suffix for suffix in UNDECODED_SUFFIXES)  # type: ignore[return-value]


@dataclass(frozen=True)
class Ragged:
    """Rows of many samples back to back: sample ``i``'s are ``values[offsets[i]:offsets[i + 1]]``.

    >>> boxes = Ragged.of([np.zeros((2, 4)), np.zeros((0, 4)), np.ones((1, 4))])
    >>> len(boxes), boxes.offsets.tolist(), boxes[1:].offsets.tolist(), boxes.row_shape
    (3, [0, 2, 2, 3], [0, 0, 1], (4,))
    """

    values: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        offsets = np.asarray(self.offsets, np.int64)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or (np.diff(offsets) < 0).any() \
                or offsets[-1] != len(self.values):
            raise ValueError(f"offsets {offsets[:4].tolist()}... do not cut {len(self.values)} rows into samples: "
                             "(samples + 1,) integers from 0 to the rows, never decreasing")
        object.__setattr__(self, "offsets", offsets)

    @classmethod
    def of(cls, samples: Sequence[np.ndarray], dtype: np.typing.DTypeLike | None = None,
           row_shape: tuple[int, ...] | None = None) -> Ragged:
        """The rows of ``samples`` (arrays of rows), as ``dtype`` rows of ``row_shape`` (by default the first's)."""
        arrays = [np.asarray(sample, dtype) for sample in samples]
        shape = row_shape if row_shape is not None else (arrays[0].shape[1:] if arrays else ())
        values = np.concatenate([a.reshape(-1, *shape) for a in arrays]) if arrays else np.zeros((0, *shape), dtype)
        return cls(values, np.concatenate([[0], np.cumsum([len(a.reshape(-1, *shape)) for a in arrays])]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape[1:])

    @property
    def counts(self) -> np.ndarray:
        """Each sample's number of rows."""
        return np.diff(self.offsets)

    def __getitem__(self, samples: slice) -> Ragged:
        """The samples of a slice (step 1), their rows a view."""
        start, stop, step = samples.indices(len(self))
        if step != 1:
            raise ValueError("a Ragged is sliced in steps of 1")
        low, high = self.offsets[start], self.offsets[max(start, stop)]
        return Ragged(self.values[low:high], self.offsets[start : max(start, stop) + 1] - low)

    def rows(self, sample: int) -> np.ndarray:
        """Sample ``sample``'s rows."""
        return self.values[self.offsets[sample] : self.offsets[sample + 1]]

    def samples(self) -> list[np.ndarray]:
        """Every sample's rows, in order."""
        return np.split(self.values, self.offsets[1:-1])

    def take(self, order: np.ndarray) -> Ragged:
        """The samples ``order[0], order[1], ...``: one gather of their rows.

        >>> Ragged.of([np.arange(2), np.arange(3) + 10]).take(np.array([1, 0])).values.tolist()
        [10, 11, 12, 0, 1]
        """
        order = np.asarray(order, np.int64)
        counts = self.counts[order]
        offsets = np.concatenate([[0], np.cumsum(counts)])
        rows = np.repeat(self.offsets[order] - offsets[:-1], counts) + np.arange(offsets[-1])
        return Ragged(self.values[rows], offsets)
