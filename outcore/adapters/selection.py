"""Which fields go to the model: ``x``/``y`` as a field name, a sequence of names or a dict of names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import OptionError
from ..format import offsets_name, ragged_names
from ..iterate import Batch, BatchKeywords

FieldSelection = str | Sequence[str] | Mapping[str, str]


class BatchSource(Protocol):
    """What the Keras and tf.data adapters read: a `outcore.Dataset` or an `outcore.Mixture`."""

    @property
    def location(self) -> str: ...

    @property
    def roles(self) -> dict[str, str]: ...

    def batches(self, batch_size: int, **options: Any) -> Any: ...


def selected_fields(*selections: FieldSelection | None) -> list[str]:
    """The fields the selections name, each once, in order.

    >>> selected_fields("images", {"a": "labels", "b": "weight"}, None)
    ['images', 'labels', 'weight']
    """
    names: list[str] = []
    for selection in selections:
        if selection is None:
            continue
        if isinstance(selection, str):
            names.append(selection)
        elif isinstance(selection, Mapping):
            names += list(selection.values())
        else:
            names += list(selection)
    return list(dict.fromkeys(names))


def padded(batch: Batch, fill: float = -1) -> Batch:
    """``batch`` with each ragged field (rows and ``<field>_offsets``, `outcore.format.ragged`) as a dense array
    (samples, most rows, *row), its missing rows ``fill`` (an unsigned field's: its largest value): KerasCV's
    dense boxes, padded with -1.

    >>> padded({"b": np.array([[1, 1], [2, 2], [3, 3]]), "b_offsets": np.array([0, 2, 2, 3])})["b"].tolist()
    [[[1, 1], [2, 2]], [[-1, -1], [-1, -1]], [[3, 3], [-1, -1]]]
    """
    dense = dict(batch)
    for name in ragged_names(batch):
        values, offsets = batch[name], batch[offsets_name(name)]
        counts = np.diff(offsets)
        pad = np.iinfo(values.dtype).max if values.dtype.kind == "u" else fill
        out = np.full((len(counts), int(counts.max(initial=0)), *values.shape[1:]), pad, values.dtype)
        owner = np.repeat(np.arange(len(counts)), counts)
        out[owner, np.arange(len(values)) - offsets[owner]] = values
        dense[name] = out
    return dense


def select(batch: Batch, selection: FieldSelection) -> Any:
    """A field's array, a tuple of them, or a dict of model names to them."""
    if isinstance(selection, str):
        return batch[selection]
    if isinstance(selection, Mapping):
        return {key: batch[field] for key, field in selection.items()}
    return tuple(batch[field] for field in selection)


def options_with_fields(options: BatchKeywords, *selections: FieldSelection | None) -> BatchKeywords:
    """``options`` reading the fields the selections name; a ``fields=`` of the user's is refused, and so is
    ``decode="later"`` (Keras and ``tf.data`` take pictures, not their files)."""
    if "fields" in options:
        raise TypeError("the fields come from x=, y= (and sample_weight=): fields= is not taken here")
    if options.get("decode", "here") != "here":
        raise OptionError(f"decode={options['decode']!r}: ds.keras and ds.tf hand the model pictures, decoded as "
                          "the batches are made: leave decode= out")
    return {**options, "fields": selected_fields(*selections)}
