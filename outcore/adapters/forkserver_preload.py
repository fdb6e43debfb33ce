"""Imported last by a forkserver that `outcore.adapters.forkserver.preload_forkserver` started (the
variables it reads are set for that forkserver only; elsewhere this does nothing):

1. it imports the training script's main module, as the forkserver means to when told to preload
   ``__main__`` but does not (CPython 3.11-3.13 look for the script's path under a key that is never
   there): otherwise every worker imports it again, with everything it imports, before its first batch;
2. it makes the file named by ``OUTCORE_FORKSERVER_READY``, which tells the loader that workers can
   now be forked at once.
"""

from __future__ import annotations

import json
import os
from multiprocessing import process, spawn

_main = os.environ.get("OUTCORE_FORKSERVER_MAIN")
if _main:
    process.current_process()._inheriting = True  # as the forkserver does: the script's main block does not run
    try:
        spawn.prepare(json.loads(_main))  # {"init_main_from_path": ...} or {"init_main_from_name": ...}
    except Exception:  # noqa: BLE001, S110 - then each worker imports it itself, as it would have anyway
        pass
    finally:
        del process.current_process()._inheriting
_ready = os.environ.get("OUTCORE_FORKSERVER_READY")
if _ready:
    with open(_ready, "w"):
        pass
