"""What an ingest of pictures at their own size needs only once its survey is done (``dask.array``, with what it
imports: xarray, pandas and scipy where they are installed), imported on a thread of its own while the survey's
tasks run: `import_ahead`, called once they are made. The tasks run in C calls that release the GIL, so the import
(most of a second holding the GIL) runs beside them instead of before them: on a machine of many cores, time that
only one thread could use. Before that, the ingest's own thread runs Python (listing the files, the manifest, making
the tasks), which the import would slow down as much as it saves. The modules that need ``dask.array`` (and
``pandas``, which a folder's ingest does not) import it where they use it; such an import waits for the thread's,
and raises whatever it raised.

>>> import_ahead()
>>> import dask.array  # done, or waits until it is
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading

AHEAD = ("dask.array",)
EXIT_SECONDS = 5.0  # the longest an exit or a fork waits for the imports (an ingest that failed ends early)

_lock = threading.Lock()
_thread: threading.Thread | None = None


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


def _finish() -> None:
    """Let the imports end before the interpreter finalizes (a thread stopped inside an extension module's
    initialization could leave the process crashing at exit) and before the process forks (a child made while
    the thread held a module's import lock would wait for it forever, importing that module)."""
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join(EXIT_SECONDS)


atexit.register(_finish)
if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_finish)
