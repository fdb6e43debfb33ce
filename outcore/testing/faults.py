"""Disks that fail while they are read, for tests: a small C library, loaded with ``LD_PRELOAD`` into a
process, makes the opens or reads of chosen files fail as a bad sector (EIO), a file server that restarted
(ESTALE), a signal (EINTR) or a busy device (EAGAIN) makes them fail, a number of times or always, or
return short reads (`faults.c` says how). It is built here, with the system's C compiler, on first use.

>>> library = fault_library(tmp_path)  # doctest: +SKIP
>>> env = fault_environment(library, "images/c/0", errno.EIO, times=2)  # the first two reads fail  # doctest: +SKIP
>>> subprocess.run([sys.executable, "read.py"], env={**os.environ, **env})  # doctest: +SKIP
"""

from __future__ import annotations

import errno as errnos
import hashlib
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("faults.c")


def fault_library(directory: str | Path) -> Path | None:
    """The fault library, built into ``directory`` (once per version of its source); ``None`` where no C
    compiler is found or it does not build (not Linux, say)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = SOURCE.read_bytes()
    library = Path(directory) / f"outcore-faults-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not library.exists():
        built = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE), "-ldl"],
                               capture_output=True, check=False)
        if built.returncode != 0:
            return None
    return library


def fault_environment(library: Path, match: str, error: int = errnos.EIO, *, on: str = "read", times: int = -1,
                      short: bool = False) -> dict[str, str]:
    """The environment that makes a process's ``on`` calls ("read" or "open") of files whose path contains
    ``match`` fail with ``error``, ``times`` times (-1: always), or, with ``short``, read half of what they
    ask."""
    if on not in ("read", "open"):
        raise ValueError(f"on={on!r}: 'read' or 'open'")
    return {"LD_PRELOAD": str(library), "OUTCORE_FAULT_MATCH": match, "OUTCORE_FAULT_ERRNO": str(error),
            "OUTCORE_FAULT_ON": on, "OUTCORE_FAULT_TIMES": str(times), "OUTCORE_FAULT_SHORT": "1" if short else "0"}
