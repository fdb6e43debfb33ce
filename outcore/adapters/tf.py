"""TensorFlow: a ``tf.data.Dataset`` of batches streamed from `Dataset.batches`, with static shapes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Unpack

import numpy as np

from ..format import offsets_name
from ..iterate import BatchKeywords, recipe, sample_spec
from ..iterate.batch import apply_transform
from ..storage import Store
from .selection import BatchSource, FieldSelection, options_with_fields, select

try:
    import tensorflow as tf
except ImportError as error:  # pragma: no cover - exercised only without tensorflow
    raise ImportError("ds.tf() needs TensorFlow: pip install 'outcore[tf]'") from error


def dataset(source: BatchSource, batch_size: int, *, x: FieldSelection, y: FieldSelection | None = None,
            **options: Unpack[BatchKeywords]) -> tf.data.Dataset:
    """Batches as ``x`` or ``(x, y)``, each field a tensor with a known ``element_spec``. As with
    `outcore.adapters.keras.KerasBatches`, ``(x, y)`` batches are shuffled unless ``shuffle=False`` and
    ``x`` alone comes in store order unless ``shuffle=True``.

    A ragged field (boxes, keypoints) comes as a ``tf.RaggedTensor`` of each sample's rows.
    The batch dimension is static when ``drop_last=True``; the other dimensions are those the
    ``transform`` (if any) gives a blank sample. Each pass over the dataset is the next
    epoch (a new order); the data comes batch by batch, with no per-sample Python work.

    >>> model.fit(ds.tf(256, x="images", y="labels").prefetch(2), epochs=3)  # doctest: +SKIP
    """
    options = options_with_fields({"shuffle": y is not None, **options}, x, y)
    iterator = source.batches(batch_size, **options)
    batch_options = iterator.options
    store: Store = source if isinstance(source, Store) else source.spec_store  # a mixture: its sources' fields
    made = recipe(store, iterator.fields, batch_options.transform)
    batch_dim = batch_size if batch_options.drop_last else None

    # what the transform makes of a batch (it may crop, cast, ...): shapes and dtypes from one blank sample;
    # a crop opening it on an encoded field is done while decoding, so its field (and the rasters it cuts with it)
    # starts at the crop's size
    cut = {made.crop_field, *(name for name in made.fields if store.info(name).is_raster)}
    blank = {name: np.zeros((1, *made.crop.output_size, *shape[2:]) if name in cut else (1, *shape), dtype)
             for name, (shape, dtype) in ((name, sample_spec(store, name)) for name in made.fields)}
    ragged = [name for name in made.fields if store.info(name).is_ragged]
    blank.update({offsets_name(name): np.array([0, 1]) for name in ragged})  # one sample of one row
    example = apply_transform(made.rest, blank, [0])

    def spec(field: str) -> tf.TensorSpec | tf.RaggedTensorSpec:
        values = example[field]
        dtype = tf.string if values.dtype.kind in "US" else tf.as_dtype(values.dtype)
        if field in ragged:  # a tf.RaggedTensor: each sample's rows
            return tf.RaggedTensorSpec((batch_dim, None, *values.shape[1:]), dtype, 1, tf.int64)
        return tf.TensorSpec((batch_dim, *values.shape[1:]), dtype, name=field)

    def structure(selection: FieldSelection) -> Any:
        return select({name: spec(name) for name in made.fields}, selection)

    signature = structure(x) if y is None else (structure(x), structure(y))
    epochs = itertools.count()

    def generate() -> Iterator[Any]:
        # each pass is the next epoch, with an iterator of its own: two passes at once do not interfere
        one_pass = source.batches(batch_size, **options)
        one_pass.set_epoch(next(epochs))
        for batch in one_pass:
            batch = {**batch, **{name: tf.RaggedTensor.from_row_splits(batch[name], batch[offsets_name(name)])
                                 for name in ragged}}
            yield select(batch, x) if y is None else (select(batch, x), select(batch, y))

    generated = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return generated.apply(tf.data.experimental.assert_cardinality(len(iterator)))
