"""TensorFlow: a ``tf.data.Dataset`` of batches streamed from `Dataset.batches`, with static shapes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..loader import BatchIterator, apply_transform
from .keras import FieldSelection, _names, _select

try:
    import tensorflow as tf
except ImportError as error:  # pragma: no cover - exercised only without tensorflow
    raise ImportError("ds.tf() needs TensorFlow: pip install 'outcore[tf]'") from error

if TYPE_CHECKING:
    from ..dataset import Dataset


def dataset(ds: Dataset, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
            **options: Any) -> tf.data.Dataset:
    """Batches as ``x`` or ``(x, y)``, each field a tensor with a known ``element_spec``.

    The batch dimension is static when ``drop_last=True``; the other dimensions are those the
    ``transform`` (if any) gives a blank sample. Each pass over the dataset is the next
    epoch (a new order); the data comes batch by batch, with no per-sample Python work.

    >>> model.fit(ds.tf(256, x="images", y="labels").prefetch(2), epochs=3)  # doctest: +SKIP
    """
    fields = list(dict.fromkeys([*_names(x), *(_names(y) if y is not None else [])]))
    iterator = BatchIterator(ds, batch_size, fields=fields, **options)
    batch_dim = batch_size if options.get("drop_last") else None

    # what the transform makes of a batch (it may crop, cast, ...): shapes and dtypes from one blank sample
    blank = {name: np.zeros((1, *ds[name].shape[1:]), ds[name].dtype) for name in fields}
    example = apply_transform(options.get("transform"), blank, [0])

    def spec(field: str) -> tf.TensorSpec:
        values = example[field]
        dtype = tf.string if values.dtype.kind in "US" else tf.as_dtype(values.dtype)
        return tf.TensorSpec((batch_dim, *values.shape[1:]), dtype, name=field)

    def structure(selection: FieldSelection) -> Any:
        return _select({name: spec(name) for name in fields}, selection)

    signature = structure(x) if y is None else (structure(x), structure(y))

    def generate() -> Iterator[Any]:
        for batch in iterator:
            yield _select(batch, x) if y is None else (_select(batch, x), _select(batch, y))

    generated = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return generated.apply(tf.data.experimental.assert_cardinality(len(iterator)))
