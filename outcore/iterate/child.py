"""A loader process (`outcore.iterate.process`) started as a Python of its own that imports outcore, not the
training script: `Child`.

multiprocessing's spawn and forkserver start a process that imports the script's main module again (as
``__mp_main__``), with everything it imports (torch, TensorFlow: seconds, and hundreds of megabytes a process),
and runs whatever the script does outside an ``if __name__ == "__main__":`` guard. A loader process needs none
of it: what it makes is said by the options it is sent, pickled by cloudpickle (`outcore.iterate.process.pickled`:
a transform defined in the script goes by value). So a `Child` is a new interpreter (``sys.executable``, or what
`multiprocessing.set_executable` set; fork and exec: nothing of the consumer's threads or CUDA state is copied)
told the consumer's ``sys.path``, working directory and ``sys.argv`` (multiprocessing's preparation data, less
how to import the script), which imports outcore and serves.

>>> mine, theirs = pipe()  # doctest: +SKIP
>>> board, shared = board_file()  # doctest: +SKIP
>>> child = Child(mine, theirs, shared, preparation(folder=mailbox_folder, shares=1))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import socket
import subprocess
import tempfile
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Any

MAIN_KEYS = ("init_main_from_path", "init_main_from_name")  # preparation data that would import the script
BOOT = """
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the consumer's to handle: it closes the process
from multiprocessing import connection, spawn
consumer, board = connection.Connection(int(sys.argv[1])), int(sys.argv[2])  # before sys.argv is the script's
prepared = consumer.recv()
spawn.prepare({key: value for key, value in prepared.items() if key != "outcore"})
from outcore.iterate.process import served
served(consumer, board, prepared)
"""


class Child:
    """The loader process: ``python -c BOOT`` given ``theirs`` (its end of the connection) and ``board`` (a file
    descriptor of the shared `board`), with the part of `multiprocessing.Process`'s interface the consumer uses
    (``pid``, `is_alive`, `join`, `exitcode`, `kill`). It is sent ``prepared`` (`preparation`) first."""

    def __init__(self, mine: Connection, theirs: int, board: int, prepared: dict[str, Any]) -> None:
        self.popen = subprocess.Popen([spawn.get_executable(), "-c", BOOT, str(theirs), str(board)],
                                      pass_fds=(theirs, board), stdin=subprocess.DEVNULL)
        self.pid = self.popen.pid
        try:
            mine.send(prepared)
        except OSError:
            pass  # it died at once: its run says how
        except BaseException:
            self.kill()
            self.join(None)
            raise

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: as long as it takes) for it to end."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    @property
    def exitcode(self) -> int | None:
        """Its exit code (minus the signal that killed it), or None while it runs."""
        return self.popen.poll()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()


def preparation(folder: str, shares: int) -> dict[str, Any]:
    """What the process is told first: multiprocessing's preparation data (``sys.path``, the working directory,
    ``sys.argv``; not how to import the script's main module), and the mailbox ``folder`` and ``shares`` it serves
    with."""
    prepared = spawn.get_preparation_data("outcore-batches")
    for key in MAIN_KEYS:
        prepared.pop(key, None)
    prepared["authkey"] = bytes(prepared["authkey"])  # sent as plain bytes (pickled, it refuses to be)
    prepared["outcore"] = (folder, shares)
    return prepared


def pipe() -> tuple[Connection, int]:
    """A connection to the process and the file descriptor of its end, to be handed to it (then closed here)."""
    mine, theirs = socket.socketpair()
    return Connection(mine.detach()), theirs.detach()


def board_file() -> tuple[Any, int]:
    """The shared `board` (-1: no batch taken yet) and a file descriptor of its memory for the process (to be
    closed here once it started)."""
    with tempfile.TemporaryFile() as file:  # no name: gone with its last descriptor and mapping
        os.ftruncate(file.fileno(), 8)
        descriptor = os.dup(file.fileno())
    board = shared_board(os.dup(descriptor))
    board.value = -1
    return board, descriptor


def shared_board(descriptor: int) -> Any:
    """The 8 bytes of a file's memory, shared with another process, as an int64 (its ``value``); ``descriptor`` is
    closed (the mapping stays)."""
    try:
        return ctypes.c_int64.from_buffer(mmap.mmap(descriptor, 8))
    finally:
        os.close(descriptor)
