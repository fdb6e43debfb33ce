"""PyTorch, imported once for the torch adapter's modules, with a message saying how to install it."""

from __future__ import annotations

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
    from torch.utils.data._utils.pin_memory import pin_memory
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "ds.torch() needs PyTorch: pip install 'outcore[torch]' (on a CPU-only machine, install the CPU "
        "build of torch first)"
    ) from error

__all__ = ["DataLoader", "IterableDataset", "get_worker_info", "pin_memory", "torch"]
