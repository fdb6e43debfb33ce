"""This process's forkserver, made ready for DataLoader workers that read an object store: it imports
outcore's worker modules (torch with them) and the training script's main module once, before it forks
any worker (`outcore.adapters.forkserver_preload`), and says when it has done so (`importing`), so that
a loader can make a pass's first batches itself meanwhile instead of waiting
(`outcore.adapters.torch.OutcoreLoader`): a new process's first batch then comes as soon as from a
loader without workers, and its workers take over once the forkserver can fork them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import tempfile
import uuid
from multiprocessing import forkserver, spawn
from pathlib import Path

READY = "OUTCORE_FORKSERVER_READY"  # the file the forkserver makes once its preloads are imported
MAIN = "OUTCORE_FORKSERVER_MAIN"  # the script's main module, for the forkserver to import
WORKER_MODULES = ("outcore.adapters.torch", "outcore.storage.remote")  # what a worker reading an object store runs
LAST = "outcore.adapters.forkserver_preload"  # imported last: the main module, then the ready file

_ready: Path | None = None  # the file the forkserver this process started will make


def preload_forkserver() -> None:
    """Have this process's forkserver import outcore's worker modules (`WORKER_MODULES`, torch with them)
    when it starts, beside what it preloads already (``__main__``, or what the user set), so that each
    worker it forks has them, and start it now (nothing changes for a forkserver already running).

    >>> preload_forkserver()  # doctest: +SKIP
    """
    global _ready
    preloaded = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    wanted = [name for name in (*WORKER_MODULES, LAST) if name not in preloaded]
    forkserver.set_forkserver_preload([name for name in preloaded if name != LAST] + wanted)
    before = getattr(forkserver._forkserver, "_forkserver_pid", None)
    ready = Path(tempfile.gettempdir()) / f"outcore-forkserver-{os.getpid()}-{uuid.uuid4().hex[:8]}.ready"
    main = {key: value for key, value in spawn.get_preparation_data("outcore").items()
            if key in ("init_main_from_path", "init_main_from_name")} if "__main__" in preloaded else {}
    told = {READY: str(ready), **({MAIN: json.dumps(main)} if main else {})}
    os.environ.update(told)  # for the forkserver only: it is started (or not) right here
    try:
        forkserver.ensure_running()  # it imports them meanwhile (building a model, say)
    finally:
        for name in told:
            del os.environ[name]
    if getattr(forkserver._forkserver, "_forkserver_pid", None) != before:  # started now, by this call
        _ready = ready
        atexit.register(_forget, ready)


def importing() -> bool:
    """Whether the forkserver this process started is still importing its preloads (a worker asked of it
    now would wait for them); False for one that is ready, or that outcore did not start."""
    return _ready is not None and not _ready.exists()


def _forget(ready: Path) -> None:
    with contextlib.suppress(OSError):
        ready.unlink()
