"""Threads or loader processes, for this store on this machine: ``outcore bench``'s advice on ``process=``, timed.

One process's threads share its GIL: a batch whose CPU time holds it a share ``s`` of the time runs at most
``1 / (s + (1 - s) / n)`` times one core's rate on ``n`` cores (`outcore.measure.gil_bound`). Where that
bound leaves the cores idle (below `TARGET` of them), ``process=k`` (k loader processes, each making its part of
every batch with a GIL of its own, `outcore.iterate.process`) is timed against the threads for k = 2, 4, ... up
to the cores and the rank's streams, and the fastest is advised when it beats the threads by `GAIN` at least.
Where the bound already reaches the cores, processes would only add their hand-off: they are not timed.

>>> print(Loaders(16, 0.118, {0: 38_000.0, 2: 61_000.0, 4: 70_000.0}))
loaders: a batch's CPU time holds the GIL 11.8% of it here: one process's threads keep at most 5.8 of the 16 cores busy (0.36 of them)
loaders, timed (samples/s): threads 38,000; process=2 61,000 (1.61x); process=4 70,000 (1.84x)
choose: process=4, as in ds.batches(..., process=4) (also ds.torch, ds.keras, ds.tf)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..dataset import Dataset
from ..errors import OptionError
from ..iterate.plan import DEFAULT_STREAMS
from ..iterate.transforms import Transform
from ..measure import gil_bound, gil_free_clock

TARGET = 0.85  # the share of the cores one process's threads must be able to use for processes not to be timed
GAIN = 1.1  # how much faster than the threads processes must be timed to be advised (noise, and processes to keep)
WARM_SECONDS = 1.0  # epochs run before the timing: the processes start, the chunks come into the page cache


@dataclass(frozen=True)
class Loaders:
    """This process's GIL share (``held``: None where it is not timed, without outcore's C extensions), and the
    samples/s of shuffled epochs by loader processes (``rates``; 0: this process's threads), on ``cores``.
    ``skipped`` says why processes were not timed, where they could have been."""

    cores: int
    held: float | None
    rates: dict[int, float]
    skipped: str = ""

    @property
    def bound(self) -> float | None:
        """The most times one core's rate this process's threads reach on the cores (`gil_bound`)."""
        return None if self.held is None else gil_bound(self.held, self.cores)

    @property
    def choice(self) -> int:
        """The loader processes to use: the fastest count timed, where it beats the threads by `GAIN`; else 0.

        >>> Loaders(16, 0.1, {0: 100.0, 2: 105.0, 4: 150.0, 8: 140.0}).choice, Loaders(16, 0.1, {0: 100.0, 2: 105.0}).choice
        (4, 0)
        """
        fastest = max(self.rates, key=self.rates.__getitem__)
        return fastest if self.rates[fastest] >= GAIN * self.rates[0] else 0

    def __str__(self) -> str:
        lines, bound = [], self.bound
        if self.held is not None and bound is not None:
            lines.append(f"loaders: a batch's CPU time holds the GIL {self.held:.1%} of it here: one process's threads "
                         f"keep at most {bound:.1f} of the {self.cores} cores busy ({bound / self.cores:.2f} of them)")
        else:
            lines.append("loaders: the GIL share is not timed here (outcore's C extensions do not load); "
                         "outcore bench --processes 2,4 times loader processes against the threads")
        if self.skipped:
            lines.append(f"loaders: processes not timed: {self.skipped}")
        if len(self.rates) > 1:
            threads = self.rates[0]
            timed = "; ".join(f"process={count} {rate:,.0f} ({rate / threads:.2f}x)"
                              for count, rate in self.rates.items() if count)
            lines.append(f"loaders, timed (samples/s): threads {threads:,.0f}; {timed}")
            choice = self.choice
            if choice:
                lines.append(f"choose: process={choice}, as in ds.batches(..., process={choice}) (also ds.torch, "
                             "ds.keras, ds.tf)")
            else:
                lines.append(f"choose: this process's threads (no process= was {GAIN:.1f}x faster)")
        return "\n".join(lines)


def process_counts(cores: int, held: float | None, streams: int = DEFAULT_STREAMS) -> tuple[int, ...]:
    """The loader process counts to time: 2, 4, ... up to the cores and the rank's ``streams``, where the GIL
    share ``held`` keeps one process's threads below `TARGET` of the ``cores``; none where it does not, or
    where it is not known.

    >>> process_counts(16, 0.118), process_counts(2, 0.118), process_counts(64, 0.02), process_counts(16, None)
    ((2, 4, 8), (), (2, 4, 8), ())
    """
    if held is None or gil_bound(held, cores) >= TARGET * cores:
        return ()
    counts, count = [], 2
    while count <= min(cores, streams):
        counts.append(count)
        count *= 2
    return tuple(counts)


def fewer_from(held: float) -> int | None:
    """The fewest cores of which one process's threads, a share ``held`` of whose CPU time holds the GIL, can use
    less than `TARGET` (`gil_bound`); None for a share of 0 (any number).

    >>> fewer_from(0.123), fewer_from(0.05), fewer_from(0.01), fewer_from(0.0)
    (3, 5, 19, None)
    """
    return math.floor((1 / TARGET - 1 + held) / held) + 1 if held > 0 else None


def measure_loaders(ds: Dataset, fields: Sequence[str], sample: np.ndarray, batch_size: int,
                    transform: Transform | None, cores: int, seconds: float = 2.0,
                    counts: Sequence[int] | None = None) -> Loaders:
    """Time shuffled epochs of ``sample`` made by this process's threads (and their GIL share), then by each
    of ``counts`` loader processes (default: `process_counts`), each for ``seconds`` after `WARM_SECONDS`.
    Processes that cannot start here (no shared memory, a daemonic process) are said in `Loaders.skipped`.

    >>> print(measure_loaders(outcore.open_dataset("train.zarr"), ["images", "labels"], np.arange(4096), 256,
    ...                       None, cores=16))  # doctest: +SKIP
    loaders: a batch's CPU time holds the GIL 11.8% of it here: ...
    """
    threads, held = _timed(ds, fields, sample, batch_size, transform, seconds, False)
    counts = process_counts(cores, held) if counts is None else tuple(counts)
    rates, skipped = {0: threads}, ""
    if held is not None and not counts and cores > 1:
        fewer = fewer_from(held)
        skipped = f"one process's threads can use {TARGET:.0%} of these cores or more" + (
            f" (of {fewer} cores or more they could not: this command times process= there)" if fewer else "")
    for count in counts:
        try:
            rates[count] = _timed(ds, fields, sample, batch_size, transform, seconds, count)[0]
        except OptionError as error:
            skipped = str(error)
            break
    return Loaders(cores, held, rates, skipped)


def _timed(ds: Dataset, fields: Sequence[str], sample: np.ndarray, batch_size: int, transform: Transform | None,
           seconds: float, process: bool | int) -> tuple[float, float | None]:
    """Samples/s of shuffled epochs over ``seconds`` after the warm ones, and (made here) their GIL share."""
    batches = ds.batches(batch_size, fields=list(fields), indices=sample, transform=transform, seed=1,
                         process=process)

    def epoch() -> int:
        return sum(len(batch[fields[0]]) for batch in batches)

    try:
        began = time.perf_counter()
        while True:
            epoch()
            if time.perf_counter() - began >= WARM_SECONDS:
                break
        clock = None if process else gil_free_clock()
        cpu, began, done = time.process_time(), time.perf_counter(), 0
        while True:
            done += epoch()
            elapsed = time.perf_counter() - began
            if elapsed >= seconds:
                break
        held = None if clock is None else max(0.0, 1 - clock() / max(1e-9, time.process_time() - cpu))
        return done / elapsed, held
    finally:
        batches.close()
