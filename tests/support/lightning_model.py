"""The LightningModule of the Lightning tests (imported by them, and by the DDP test's torchrun script): it
trains on nothing, and records the ids of every batch it is given, with the epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning
import torch


class IdsModel(lightning.LightningModule):
    def __init__(self, loader: Callable[[], Any], seen: list[tuple[int, list[int]]]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.loader, self.seen = loader, seen

    def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch["id"].tolist()))
        return self.layer(batch["id"][:, None].float()).pow(2).mean() * 0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self) -> Any:
        return self.loader()
