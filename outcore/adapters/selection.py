"""Which fields go to the model: ``x``/``y`` as a field name, a sequence of names or a dict of names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

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


def select(batch: Batch, selection: FieldSelection) -> Any:
    """A field's array, a tuple of them, or a dict of model names to them."""
    if isinstance(selection, str):
        return batch[selection]
    if isinstance(selection, Mapping):
        return {key: batch[field] for key, field in selection.items()}
    return tuple(batch[field] for field in selection)


def options_with_fields(options: BatchKeywords, *selections: FieldSelection | None) -> BatchKeywords:
    """``options`` reading the fields the selections name; a ``fields=`` of the user's is refused."""
    if "fields" in options:
        raise TypeError("the fields come from x=, y= (and sample_weight=): fields= is not taken here")
    return {**options, "fields": selected_fields(*selections)}
