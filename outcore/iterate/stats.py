"""Is the consumer waiting for data? Per-batch waits, as `BatchIterator.stats` reports them."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, deque
from typing import Any

import numpy as np

from ..threads import shared_pool

ROUTES = ("shared_memory", "straight", "through_scheduler")  # how a cluster's batches reach the consumer


class SpanClock:
    """Times of an iterator's recent cluster spans, from submission to their batches being ready, across its
    runs (`outcore.iterate.hedge` waits for a span against them).

    >>> clock = SpanClock()
    >>> clock.median(), clock.record(0.2), clock.record(0.8), clock.record(1.0), clock.median()
    (None, None, None, None, 0.8)
    """

    RECENT = 32  # spans whose times are kept

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=self.RECENT)

    def record(self, seconds: float) -> None:
        self.times.append(seconds)

    def started(self, future: Any) -> None:
        """Time the span of Dask future ``future`` from now to its end."""
        began = time.monotonic()
        future.add_done_callback(lambda _: self.record(time.monotonic() - began))

    def median(self) -> float | None:
        """The median time of the recent spans (None before any ended)."""
        return statistics.median(self.times) if self.times else None


class Stats(dict):
    """`BatchIterator.stats`'s figures: a dict, whose repr ends with what ``wait_fraction`` means here.

    >>> Stats(batches=20, wait_fraction=0.98)
    {'batches': 20, 'wait_fraction': 0.98}
    # wait_fraction 0.98: the loop waited for batches 98% of its time. With a training step in the loop, the \
model waits for data (docs/frameworks.md says what helps); in a loop that only reads, that is as it should be: \
samples_per_s is then the loader's own rate.
    """

    def __repr__(self) -> str:
        return f"{dict.__repr__(self)}\n# {self.meaning()}" if "wait_fraction" in self else dict.__repr__(self)

    def meaning(self) -> str:
        """What ``wait_fraction`` says, in words."""
        share = self["wait_fraction"]
        if share < 0.05:
            return f"wait_fraction {share:.2f}: the loader keeps ahead of the loop (it waited {share:.0%} of its time)."
        said = f"wait_fraction {share:.2f}: the loop waited for batches {share:.0%} of its time."
        if share < 0.5:
            return f"{said} The loader keeps up only in part: docs/frameworks.md says what helps."
        return (f"{said} With a training step in the loop, the model waits for data (docs/frameworks.md says what "
                "helps); in a loop that only reads, that is as it should be: samples_per_s is then the loader's own "
                "rate.")


class LoaderStats:
    """Per-batch waits of the consumer, kept as a bounded window of the most recent batches."""

    WINDOW = 10_000

    def __init__(self) -> None:
        self.waits: deque[float] = deque(maxlen=self.WINDOW)
        self.ready: deque[int] = deque(maxlen=self.WINDOW)
        self.batches = self.samples = 0
        self.started: float | None = None
        self.routes: Counter[tuple[str, str]] = Counter()  # (worker address, route) -> batches (or parts) delivered
        self.spans = SpanClock()  # a cluster's spans: how long they take
        self.hedged = 0  # spans made again elsewhere because they were late
        self.damaged = 0  # chunks left out as damaged (``skip_damaged``)
        self.making = self.transforming = 0.0  # seconds making batches here, and in their transform after the crop
        self.lock = threading.Lock()  # batches are made on several threads

    def record(self, wait: float, ready: int, samples: int) -> None:
        if self.started is None:
            self.started = time.perf_counter() - wait
        self.batches += 1
        self.samples += samples
        self.waits.append(wait)
        self.ready.append(ready)

    def made(self, seconds: float) -> None:
        """A batch was made in this process in ``seconds``."""
        with self.lock:
            self.making += seconds

    def transformed(self, seconds: float) -> None:
        """A batch's transform (after a crop done as it is made) took ``seconds``."""
        with self.lock:
            self.transforming += seconds

    def delivered(self, worker: str, route: str, count: int) -> None:
        """``count`` batches (or lanes' parts of batches) made by ``worker`` reached the consumer by ``route``."""
        self.routes[worker, route] += count

    def _made_here(self) -> dict[str, float]:
        """How batches made in this process were made: the transform's share of the time (after a crop done
        as they are made), and the thread pool's threads, the most kept busy and their CPU share (`Gauge`)."""
        pool = shared_pool()
        return {"transform_share": self.transforming / self.making, "threads": pool.threads,
                "threads_busy_limit": pool.gauge.limit, "threads_cpu_share": pool.gauge.last}

    def summary(self) -> Stats:
        elapsed = time.perf_counter() - self.started if self.started is not None else 0.0
        waits = np.array(self.waits or [0.0])
        cluster = {f"batches_{route}": sum(n for (_, way), n in self.routes.items() if way == route)
                   for route in ROUTES} | {"spans_hedged": self.hedged} if self.routes else {}
        return Stats({
            "batches": self.batches,
            "samples": self.samples,
            "samples_per_s": self.samples / elapsed if elapsed else 0.0,
            "wait_mean_ms": float(waits.mean() * 1e3),
            "wait_p95_ms": float(np.percentile(waits, 95) * 1e3),
            "wait_fraction": float(waits.sum() / elapsed) if elapsed else 0.0,
            "ready_mean": float(np.mean(self.ready)) if self.ready else 0.0,
            **(self._made_here() if self.making else {}),
            **({"damaged_chunks": self.damaged} if self.damaged else {}),
            **cluster,
        })
