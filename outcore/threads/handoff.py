"""`Handoff`: a bounded queue between two threads made of C primitives only.

A batch handed from the thread that makes it to the one that trains on it goes through a bounded queue: the
maker waits while it is full, the consumer while it is empty. `queue.Queue` waits and wakes with
`threading.Condition`, which is Python code: every put and get runs a few dozen lines holding the GIL (and
its `notify` wakes the waiting thread while holding it). Here the items go through one `queue.SimpleQueue` and the
free places through another (both C: a put or get is one call, and a wait is spent outside the GIL).

>>> handoff = Handoff(1)
>>> handoff.put("batch", timeout=0.1), handoff.put("another", timeout=0.01)  # room for one
(True, False)
>>> handoff.get(timeout=0.1), handoff.qsize()
('batch', 0)
"""

from __future__ import annotations

import queue
from typing import Any


class Handoff:
    """Up to ``size`` items waiting, first in, first out: `put` waits for a free place, `get` for an item, each at
    most ``timeout`` seconds."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a handoff holds 1 item or more; got size={size}")
        self.items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.places: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token a free place
        for _ in range(size):
            self.places.put(None)

    def put(self, item: Any, timeout: float) -> bool:
        """Add ``item`` once a place is free: False, and nothing added, when none was within ``timeout``."""
        try:
            self.places.get(timeout=timeout)
        except queue.Empty:
            return False
        self.items.put(item)
        return True

    def get(self, timeout: float) -> Any:
        """The oldest item, once there is one; `queue.Empty` when none came within ``timeout``."""
        item = self.items.get(timeout=timeout)
        self.places.put(None)
        return item

    def qsize(self) -> int:
        """The items waiting (about: another thread may be adding or taking one)."""
        return self.items.qsize()
