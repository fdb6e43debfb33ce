"""Spans made again elsewhere when they are late (hedged), so that a worker that vanishes stalls an epoch for
seconds, not for Dask's timeouts.

A machine whose link is cut, or that freezes, neither answers nor closes its connections: Dask notices
only after its connect timeout (30 s: the consumer waits that long for a span's batches that worker
holds) or the scheduler's worker TTL (minutes, for the spans it runs); tests/test_hosts.py cuts a link
between emulated hosts (`outcore.testing.hosts`) mid-epoch.

So the consumer waits for a span at most `late` seconds: `SPAN_HEDGE_FACTOR` times the median time
of the iterator's recent spans from submission to their batches (`SPAN_HEDGE_SECONDS` at least,
`FIRST_SECONDS` before any was timed). A span still awaited then, whose worker is known (the one running
it, or holding its batches), is submitted again to the other workers, and that worker becomes a
**suspect** for the run: the spans it runs or holds are made again at once, without waiting, and no lane
is pinned to it any more. Whichever copy's batches come first are used: the copies make the same
batches, pixel for pixel (a span is a pure function of its steps). A span that is merely queued (every
worker busy) is not hedged: that would only add work. A failure is raised only when no copy is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures import Future as Fetch
from functools import partial
from typing import Any

from ..threads import on_own_thread
from .stats import LoaderStats, SpanClock

SPAN_HEDGE_SECONDS = 2.0  # a span is never hedged sooner
SPAN_HEDGE_FACTOR = 4.0  # ... nor before this many times a recent span's time (its median)
FIRST_SECONDS = 10.0  # before any span was timed (the first spans also open the store on every worker)


def late(clock: SpanClock) -> float:
    """How long the consumer waits for a span before it is made again elsewhere.

    >>> clock = SpanClock()
    >>> late(clock), clock.record(0.2), clock.record(0.8), clock.record(1.0), late(clock)
    (10.0, None, None, None, 3.2)
    """
    median = clock.median()
    return FIRST_SECONDS if median is None else max(SPAN_HEDGE_SECONDS, SPAN_HEDGE_FACTOR * median)


class Hedges:
    """One cluster run's spans as their batches are taken (`result`): fetched on threads (a fetch from a
    vanished worker returns only after Dask's connect timeout), made again elsewhere when late, timed and
    counted in ``stats`` (`LoaderStats`). ``gather(future)`` takes a finished span's result; ``again(workers)``
    submits the span again, to those workers only."""

    def __init__(self, client: Any, stats: LoaderStats, gather: Callable[[Any], Any]) -> None:
        self.client, self.stats, self.gather = client, stats, gather
        self.suspects: set[str] = set()
        self.left: list[Any] = []  # copies that lost: cancelled with the run

    def result(self, future: Any, again: Callable[[Collection[str]], Any], stop: threading.Event, wake: float) -> Any:
        """The result of the span of ``future``, from whichever copy comes first; None once ``stop`` is set
        (looked at every ``wake`` seconds). A failure is raised once every copy has failed."""
        copies = {future.key: future}
        fetches = {future.key: self._fetch(future)}  # each copy's result, taken as soon as it is made
        suspect = bool(self.suspects) and self._runner(future) in self.suspects
        deadline = time.monotonic() + (0.0 if suspect else late(self.stats.spans))
        while True:
            for key, fetch in fetches.items():
                if fetch.done() and fetch.exception() is None:
                    self.left += [copy for other, copy in copies.items() if other != key]
                    return fetch.result()
            pending = [fetch for fetch in fetches.values() if not fetch.done()]
            if not pending:
                raise fetches[future.key].exception()
            wait(pending, timeout=max(0.0, min(wake, deadline - time.monotonic())), return_when=FIRST_COMPLETED)
            if stop.is_set():
                return None
            if time.monotonic() >= deadline:
                copy, deadline = self._hedge(future, again)
                if copy is not None:
                    copies[copy.key], fetches[copy.key] = copy, self._fetch(copy)

    def _hedge(self, future: Any, again: Callable[[Collection[str]], Any]) -> tuple[Any, float]:
        """``future``'s span made again on the workers but its own and the suspects, if it has a worker (else
        it is queued, not late): the copy (None if there is none) and the next deadline (none once hedged)."""
        worker = self._runner(future)
        if worker is None:
            return None, time.monotonic() + late(self.stats.spans)
        self.suspects.add(worker)
        others = [address for address in self.client.nthreads() if address not in self.suspects]
        if not others:
            return None, float("inf")
        self.stats.hedged += 1
        return again(others), float("inf")

    def _fetch(self, copy: Any) -> Fetch:
        """Take ``copy``'s result on a thread of its own (a fetch from a vanished worker ends only with Dask's
        connect timeout)."""
        return on_own_thread(partial(self.gather, copy), "outcore-gather")

    def _runner(self, future: Any) -> str | None:
        """The worker holding ``future``'s result, or else running it (None: still queued)."""
        if future.done():
            return self._holder(future)
        for worker, keys in self.client.processing().items():
            if future.key in keys:
                return worker
        return None

    def _holder(self, future: Any) -> str | None:
        holders = self.client.who_has(future).get(future.key) or ()
        return next(iter(holders), None)
