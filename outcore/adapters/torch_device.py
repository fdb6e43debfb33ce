"""PyTorch: batches moved to a device, the next one copied while the current one is used."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .torch_module import torch


def to_device(batches: Iterable[dict[str, Any]], device: str | Any = "cuda") -> Iterator[dict[str, Any]]:
    """Yield ``batches`` with their tensors on ``device``; on CUDA, batch k+1 is copied on a side
    stream while the caller computes on batch k, so host-to-device copies overlap compute.

    Pair it with ``ds.torch(..., pin_memory=True)``: copies from pinned memory are asynchronous.

    Batch k+1 is taken from ``batches`` and its copy queued before batch k is handed over (a loop that waits for each
    step, e.g. for its loss, still finds the next batch's copy under way); batch k's compute waits for batch k's copy
    alone (an event recorded after it), not for everything queued on the side stream since (batch k+1's copy).

    >>> for batch in to_device(ds.torch(256, pin_memory=True), "cuda"):  # doctest: +SKIP
    ...     loss = model(batch["images"]).mean()
    """
    device = torch.device(device)
    if device.type != "cuda":
        for batch in batches:
            yield _moved(batch, device)
        return
    copies = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def send(batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """``batch``'s copy queued on the side stream, and the event that says it is done."""
        with torch.cuda.stream(copies):
            moved = _moved(batch, device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(copies)
        return moved, copied

    def ready(batch: dict[str, Any], copied: Any) -> dict[str, Any]:
        compute.wait_event(copied)
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.record_stream(compute)  # keep its memory until the compute stream is done with it
        return batch

    pending = None
    for batch in batches:
        following = send(batch)
        if pending is not None:
            yield ready(*pending)
        pending = following
    if pending is not None:
        yield ready(*pending)


def _moved(batch: dict[str, Any], device: Any, non_blocking: bool = False) -> dict[str, Any]:
    return {name: value.to(device, non_blocking=non_blocking) if isinstance(value, torch.Tensor) else value
            for name, value in batch.items()}
