"""Reads that fail at the system's level: which failures are worth another try, how many tries, and the
error that names what could not be read.

A bad sector fails a read with EIO; a file server that restarted leaves a stale handle (ESTALE); a
signal (EINTR) or a busy device (EAGAIN) fails a call that would succeed again. Each is tried again a
bounded number of times, a little later each time (`TRIES`, `PAUSES`: under a second in all), by
whoever can start the read again from the file's opening (`outcore.storage.shard_reader`, a stale
handle needs the file opened anew); one that still fails is a `StorageError` naming the store, field,
chunk and file, the system's reason and what to do. Nothing waits longer, and nothing is read as zeros.

>>> transient(OSError(errno.EIO, "Input/output error"))
True
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import OutcoreError, StorageError

T = TypeVar("T")

TRIES = 4
PAUSES = (0.02, 0.1, 0.5)  # seconds before the second, third and fourth try
_TRANSIENT = {errno.EIO, errno.ESTALE, errno.EINTR, errno.EAGAIN, errno.ETIMEDOUT, errno.ENOLCK}
_ADVICE = {
    errno.EIO: "the disk could not read it (a bad sector, a failing disk or a file server's error): check the "
               "disk (dmesg, smartctl) and restore the file from a copy, or re-create the store",
    errno.ESTALE: "the file server lost the file's handle (an NFS server restarted, or the file was replaced on "
                  "it): check the mount, then open the dataset again",
}


def transient(error: OSError) -> bool:
    """Whether ``error`` may not happen again on another try (see the module docstring)."""
    return error.errno in _TRANSIENT


def read_failure(where: str, what: str, error: OSError, tries: int) -> StorageError:
    """The error for ``what`` (field, chunk and file) of the store at ``where`` that still failed with
    ``error`` after ``tries`` tries."""
    name = errno.errorcode.get(error.errno or 0, "an error")
    advice = _ADVICE.get(error.errno, "check the file system it is on, and that the file can be read")
    times = f" {tries} times" if tries > 1 else ""
    return StorageError(f"{where}: {what} cannot be read: {error.strerror or error} ({name}){times}; {advice}")


def retried(call: Callable[[], T], where: str, what: str | Callable[[], str]) -> T:
    """``call()``, tried again while it fails with a system error that may pass; a `StorageError` naming
    ``what`` (or what ``what()`` says: words made only for an error) of the store at ``where`` when it still
    fails."""
    for attempt in range(TRIES):
        try:
            return call()
        except OSError as error:
            if isinstance(error, OutcoreError):  # named already (an object store's RemoteError, say)
                raise
            if not transient(error) or attempt == TRIES - 1:
                raise read_failure(where, what if isinstance(what, str) else what(), error, attempt + 1) from None
            time.sleep(PAUSES[attempt])
    raise AssertionError("unreachable")
