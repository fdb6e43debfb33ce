"""`Task`: the result of work given to the pool, made of one C lock.

A `concurrent.futures.Future` keeps its state behind a `threading.Condition`, which is Python code: starting,
ending and waiting for one runs a few dozen lines holding the GIL, and the pool starts and ends several a
batch (its reads, the batch, the helpers of its runs). A `Task` is a lock held from its making until its work
has ended, released once then: ending it is one C call, and so is waiting for it (outside the GIL). Who runs
it, the pool's thread or `cancel`, is decided by taking its one claim (a list's `pop`, one C call).

>>> task = Task()
>>> task.claim(), task.done()
(True, False)
>>> task.set_result(42)
>>> task.result(timeout=1), task.cancel()
(42, False)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Task(Generic[T]):
    """What `concurrent.futures.Future` offers the pool's callers (`result`, `done`, `cancel`, `cancelled`, and
    `wait`): the thread that runs the work first takes its `claim`, then ends it with
    `set_result` or `set_exception`; `cancel` takes the claim instead, when no thread has."""

    __slots__ = ("_cancelled", "_claim", "_ended", "_error", "_finished", "_value")

    def __init__(self) -> None:
        self._ended = threading.Lock()  # held until the work has ended (or the task was cancelled)
        self._ended.acquire()
        self._claim = [None]  # popped once: by the thread that runs the work, or by `cancel`
        self._finished = False
        self._cancelled = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def claim(self) -> bool:
        """Whether the caller is the one to run the work (False: it was cancelled)."""
        try:
            self._claim.pop()
        except IndexError:
            return False
        return True

    def set_result(self, value: T) -> None:
        self._value = value
        self._end()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._end()

    def _end(self) -> None:
        self._finished = True
        self._ended.release()

    def run(self, work: Callable[..., T], *args: Any) -> None:
        """``work(*args)`` here, the task ended with its result or its failure, unless its claim was taken (cancelled,
        or run by another thread)."""
        if self.claim():
            try:
                self.set_result(work(*args))
            except BaseException as error:  # noqa: BLE001 - raised by whoever takes the result
                self.set_exception(error)

    def cancel(self) -> bool:
        """Cancel the work if no thread has claimed it: True then (and when it was cancelled before)."""
        if not self.claim():
            return self._cancelled
        self._cancelled = True
        self._error = CancelledError()
        self._end()
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        """Whether the work has ended (or was cancelled): `result` returns at once."""
        return self._finished

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the work has ended, at most ``timeout`` seconds (None: as long as it takes): whether it has."""
        if self._finished:  # ended already (set before the lock is released): no lock taken
            return True
        if not self._ended.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._ended.release()  # for whoever waits next
        return True

    def result(self, timeout: float | None = None) -> T:
        """The work's result once it has ended, or its failure raised (`CancelledError` when cancelled);
        `TimeoutError` after ``timeout``."""
        if not self.wait(timeout):
            raise TimeoutError(f"the task did not end within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
