"""What a batch is (a dict of numpy arrays, samples on axis 0) and how one is made from loaded chunks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..format import decode_text
from ..imaging import EncodedChunk
from .plan import Consumer

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]
ChunkValues = Mapping[str, Any]  # field -> one chunk's values: an array, or an EncodedChunk to decode


def assemble(
    samples: np.ndarray, chunk_size: int, keys: np.ndarray, data: Mapping[int, ChunkValues], fields: Sequence[str],
    text_fields: frozenset[str],
) -> Batch:
    """A new batch of ``samples``: sample ``i`` is copied once, straight from chunk ``data[keys[i]]`` into
    the batch (no temporaries); encoded images are decoded into the batch, text fields decoded to strings.
    The batch's arrays are always new: nothing the caller is handed is ever written again.
    """
    local = (samples % chunk_size).tolist()
    batch = {}
    for name in fields:
        first = next(iter(data.values()))[name]
        out = np.empty((len(samples), *first.shape[1:]), first.dtype)
        if out.ndim == 1:  # scalars per sample: one vectorized gather per chunk is cheaper
            for key, values in data.items():
                where = keys == key
                out[where] = values[name][samples[where] % chunk_size]
        elif isinstance(first, EncodedChunk):  # decoded straight into the batch
            for i, (key, index) in enumerate(zip(keys.tolist(), local, strict=True)):
                data[key][name].decode_sample(index, out[i])
        else:
            sources = [data[key][name] for key in keys.tolist()]
            for i, (source, index) in enumerate(zip(sources, local, strict=True)):
                out[i] = source[index]
        batch[name] = decode_text(out) if name in text_fields else out
    return batch


def batch_rng_key(seed: int, epoch: int, consumer: Consumer, index: int) -> tuple[int, ...]:
    """The seed of batch ``index``'s augmentation generator: the same wherever the batch is made.

    >>> batch_rng_key(0, 3, Consumer(1, 2), 7)
    (0, 3, 1, 7)
    """
    return (seed, epoch, consumer.index, index)


def apply_transform(transform: Transform | None, batch: Batch, rng_key: Sequence[int]) -> Batch:
    """``transform(batch, rng)`` with the generator seeded by ``rng_key`` (`BatchIterator.rng_key`)."""
    return batch if transform is None else transform(batch, np.random.default_rng(list(rng_key)))
