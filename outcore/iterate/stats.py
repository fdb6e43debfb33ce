"""Is the consumer waiting for data? Per-batch waits, as `BatchIterator.stats` reports them."""

from __future__ import annotations

import time
from collections import deque

import numpy as np


class LoaderStats:
    """Per-batch waits of the consumer, kept as a bounded window of the most recent batches."""

    WINDOW = 10_000

    def __init__(self) -> None:
        self.waits: deque[float] = deque(maxlen=self.WINDOW)
        self.ready: deque[int] = deque(maxlen=self.WINDOW)
        self.batches = self.samples = 0
        self.started: float | None = None

    def record(self, wait: float, ready: int, samples: int) -> None:
        if self.started is None:
            self.started = time.perf_counter() - wait
        self.batches += 1
        self.samples += samples
        self.waits.append(wait)
        self.ready.append(ready)

    def summary(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started if self.started is not None else 0.0
        waits = np.array(self.waits or [0.0])
        return {
            "batches": self.batches,
            "samples": self.samples,
            "samples_per_s": self.samples / elapsed if elapsed else 0.0,
            "wait_mean_ms": float(waits.mean() * 1e3),
            "wait_p95_ms": float(np.percentile(waits, 95) * 1e3),
            "wait_fraction": float(waits.sum() / elapsed) if elapsed else 0.0,
            "ready_mean": float(np.mean(self.ready)) if self.ready else 0.0,
        }
