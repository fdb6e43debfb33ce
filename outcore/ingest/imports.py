"""What an ingest of pictures at their own size needs only once its survey is done (``dask.array``, with what it
imports: xarray, pandas and scipy where they are installed), imported on a thread of its own while the survey's
tasks run: `import_ahead`, called once they are made. The tasks run in C calls that release the GIL, so the import
(most of a second holding the GIL) runs beside them instead of before them: on a machine of many cores, time that
only one thread could use. Before that, the ingest's own thread runs Python (listing the files, the manifest, making
the tasks), which the import would slow down as much as it saves. The modules that need ``dask.array`` (and
``pandas``, which a folder's ingest does not) import it where they use it; such an import waits for the thread's,
and raises whatever it raised.

Work that needs only those modules and what is known before the survey (the table's fields, as Dask arrays) is
given to `after_imports`: that thread runs it once the imports are done, beside the survey's tasks too, and whoever
asks for its result first runs it if the thread has not taken it by then (no thread was started, or it had ended).

>>> import_ahead()
>>> import dask.array  # done, or waits until it is
>>> after_imports(lambda: 6 * 7).result()
42
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ..threads.task import Task

T = TypeVar("T")

AHEAD = ("dask.array",)
EXIT_SECONDS = 5.0  # the longest an exit or a fork waits for the imports (an ingest that failed ends early)

_lock = threading.Lock()
_thread: threading.Thread | None = None


class Later(Generic[T]):
    """``work()``, run once: by the imports thread after its imports, or by the first `result` call."""

    def __init__(self, work: Callable[[], T]) -> None:
        self.work, self.task = work, Task[T]()

    def run(self) -> None:
        """Run the work here, unless another thread has taken it."""
        self.task.run(self.work)

    def result(self) -> T:
        """The work's result (or its failure raised): run here if no thread has taken it, else waited for."""
        with _lock:  # not left for a thread to take (nor held by the list, in a process that ingests again and again)
            if self in _later:
                _later.remove(self)
        self.run()
        return self.task.result()


_later: list[Later] = []  # given to the imports thread, not taken by it yet


def after_imports(work: Callable[[], T]) -> Later[T]:
    """``work()`` on the imports thread once `AHEAD` is imported (`import_ahead`), or by the first to ask for its
    result, whichever comes first."""
    later = Later(work)
    with _lock:
        _later.append(later)
    return later


def import_ahead() -> None:
    """Start importing `AHEAD` on a thread of its own, once a process; nothing if they are imported."""
    global _thread
    with _lock:
        if _thread is None and not all(name in sys.modules for name in AHEAD):
            _thread = threading.Thread(target=_import, name="outcore-imports", daemon=True)
            _thread.start()


def _import() -> None:
    for name in AHEAD:
        with contextlib.suppress(Exception):  # imported again where it is used, which raises the error there
            importlib.import_module(name)
    while True:  # then the work given to run after them (one asked for meanwhile runs where it was asked)
        with _lock:
            if not _later:
                return
            later = _later.pop(0)
        later.run()


def _finish() -> None:
    """Let the imports end before the interpreter finalizes (a thread stopped inside an extension module's
    initialization could leave the process crashing at exit) and before the process forks (a child made while
    the thread held a module's import lock would wait for it forever, importing that module)."""
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join(EXIT_SECONDS)


atexit.register(_finish)
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_finish)
