"""The keywords `Dataset.torch` takes: the batch options and the DataLoader's own (no framework imported)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..iterate import BatchKeywords


class TorchKeywords(BatchKeywords, total=False):
    """`BatchKeywords`, and these, passed to ``torch.utils.data.DataLoader`` as they are:

    ``num_workers``, ``pin_memory``, ``multiprocessing_context``, ``prefetch_factor``, ``worker_init_fn``,
    ``timeout``, ``generator``, ``pin_memory_device``, ``in_order``, ``collate_fn``, ``persistent_workers``
    (workers kept across epochs read each epoch's start from shared memory and keep the store open).
    """

    num_workers: int
    pin_memory: bool
    multiprocessing_context: Any
    prefetch_factor: int | None
    worker_init_fn: Callable[[int], None] | None
    timeout: float
    generator: Any
    pin_memory_device: str
    in_order: bool
    collate_fn: Callable[[Any], Any] | None
    persistent_workers: bool


def split_torch_keywords(keywords: TorchKeywords) -> tuple[BatchKeywords, dict[str, Any]]:
    """``(batch options, DataLoader keywords)``."""
    batch_keys = set(BatchKeywords.__optional_keys__)
    batch: BatchKeywords = {k: v for k, v in keywords.items() if k in batch_keys}  # type: ignore[assignment]
    return batch, {k: v for k, v in keywords.items() if k not in batch_keys}
