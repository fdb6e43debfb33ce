"""The chunk reader of each field, as the iterator reads it: stored values, or decoded pixels."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..imaging import DecodedChunks
from ..storage import ShardReader, Store

ChunkReader = ShardReader | DecodedChunks


def chunk_reader(store: Store, field: str) -> ChunkReader:
    """``reader.read(k)`` is chunk ``k`` of ``field``: its stored values (text as UTF-8 bytes), or, for an
    encoded image field, its samples decoded; ``reader.empty()`` is a buffer that ``read`` can fill."""
    if store.info(field).is_image:
        return DecodedChunks(store, field)
    return store.shard_reader(field)


def chunk_readers(store: Store, fields: Sequence[str]) -> dict[str, ChunkReader]:
    return {name: chunk_reader(store, name) for name in fields}


def sample_spec(store: Store, field: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of one sample of ``field`` as batches hold it (decoded pixels, strings)."""
    info = store.info(field)
    if info.is_image:
        return info.decode.shape, np.dtype(info.decode.dtype)
    array = store.array(field)
    if info.is_text:
        return (), np.dtype(f"<U{array.shape[1]}")
    return tuple(array.shape[1:]), np.dtype(array.dtype)
