"""How far ahead of the reads to fetch from an object store: enough requests in flight to hide their
latency, sized from what this process measured, the way TCP's BBR sizes its window.

A request takes ``T`` seconds when nothing queues before it (the fastest recent one: latency plus its
own transfer), and the object store delivers at best ``B`` bytes/s (the highest recent rate). About
``B × T`` bytes in flight hide the latency. `Pace` asks for `GAIN` times that: a run held back by the
latency sees its rate grow with its depth, so the depth grows again (as in TCP's slow start, though
more gently: rates are measured over half a second) until the link or the consumer is the limit; then ``B`` stops growing and so does the depth. The depth
is bounded in slots (`MAX_AHEAD`) and in bytes (`BYTES_AHEAD` a process, shared among the DataLoader
workers of one loader: fetched bytes wait in memory until read). ``OUTCORE_IO_THREADS`` fixes the
number of requests in flight instead.

>>> pace = Pace()
>>> for i in range(16):  # 1 MB answers taking 50 ms each, 8 at a time: 160 MB/s
...     pace.took(0.05 * (i // 8), 0.05 * (i // 8 + 1), 1_000_000)
>>> pace.ahead(slot_bytes=1_000_000)
16
"""

from __future__ import annotations

import math
import threading
from collections import deque
from itertools import islice

START_AHEAD = 8  # slots fetched ahead before anything is measured
MIN_AHEAD = 2
MAX_AHEAD = 64  # slots fetched ahead at most
BYTES_AHEAD = 128 * 2**20  # bytes fetched ahead at most (they wait in memory until read)
GAIN = 2.0  # in flight: this many times the bytes the measured rate delivers in one request's time
SAMPLES = 8  # answers measured before the measurements are used
RATE_SECONDS = 0.5  # the shortest span over which a delivery rate is measured
RATE_MEMORY_SECONDS = 10.0  # how long a measured rate counts toward the best recent one
TIME_MEMORY_SECONDS = 30.0  # how long an answer's time counts toward the fastest recent one
ANSWERS = 4096  # answers remembered at most


class Pace:
    """The measured request time and delivery rate of one object store, in one process; `ahead` is how
    many slots (chunks of every field) to fetch ahead of the reads. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: deque[tuple[float, float, int]] = deque(maxlen=ANSWERS)  # (asked, answered, bytes)
        self._rates: deque[tuple[float, float]] = deque()  # (when, bytes/s over the span before it)

    def took(self, asked: float, answered: float, nbytes: int) -> None:
        """Record one answer of ``nbytes`` bytes, asked and answered at these `time.monotonic` times."""
        with self._lock:
            self._answers.append((asked, answered, nbytes))
            while self._answers[0][1] < answered - TIME_MEMORY_SECONDS:
                self._answers.popleft()
            if len(self._answers) >= SAMPLES:
                self._rates.append((answered, self._rate(answered)))
            while self._rates and self._rates[0][0] < answered - RATE_MEMORY_SECONDS:
                self._rates.popleft()

    def times(self, at_least: float = 0) -> list[float]:
        """The request times (seconds) of the last 64 answers of at least ``at_least`` bytes."""
        with self._lock:
            recent = [answered - asked for asked, answered, nbytes in self._answers if nbytes >= at_least]
        return recent[-64:]

    def measured(self, at_least: float = 0) -> tuple[float, float] | None:
        """``(request seconds, bytes/s)``: the fastest recent answer of at least ``at_least`` bytes (of any
        size when there is none yet) and the best recent delivery rate; None until `SAMPLES` answers."""
        with self._lock:
            if len(self._answers) < SAMPLES or not self._rates:
                return None
            times = [answered - asked for asked, answered, nbytes in self._answers if nbytes >= at_least]
            times = times or [answered - asked for asked, answered, _ in self._answers]
            return min(times), max(rate for _, rate in self._rates)

    def ahead(self, slot_bytes: float, budget: int = BYTES_AHEAD) -> int:
        """Slots to fetch ahead when each holds ``slot_bytes`` stored bytes: `GAIN` × rate × request time
        worth of them (the time of answers of at least a quarter of a slot), within `MIN_AHEAD` to
        `MAX_AHEAD` slots and ``budget`` bytes; `START_AHEAD` until measured."""
        slot_bytes = max(1.0, slot_bytes)
        most = max(MIN_AHEAD, min(MAX_AHEAD, int(budget // slot_bytes)))
        measured = self.measured(at_least=slot_bytes / 4)
        if measured is None:
            return min(START_AHEAD, most)
        seconds, rate = measured
        return max(MIN_AHEAD, min(most, math.ceil(GAIN * rate * seconds / slot_bytes)))

    def _rate(self, now: float) -> float:
        """Bytes answered per second over the last `RATE_SECONDS` (or four request times, when longer),
        counted from the first request asked within that span."""
        fastest = min(answered - asked for asked, answered, _ in islice(reversed(self._answers), 64))
        span = max(RATE_SECONDS, 4 * fastest)
        nbytes, began = 0, now
        for asked, answered, size in reversed(self._answers):
            if answered <= now - span:
                break
            nbytes, began = nbytes + size, min(began, asked)
        return nbytes / max(now - max(began, now - span), 1e-3)
