"""A loader process (`outcore.iterate.process`) started as a Python of its own that imports outcore, not the
training script: `Child`.

multiprocessing's spawn and forkserver start a process that imports the script's main module again (as
``__mp_main__``), with everything it imports (torch, TensorFlow: seconds, and hundreds of megabytes a process),
and runs whatever the script does outside an ``if __name__ == "__main__":`` guard. A loader process needs none
of it: what it makes is said by the options it is sent, whose transform pickles by its module's name. So a
`Child` is a new interpreter (``sys.executable``, or what `multiprocessing.set_executable` set; fork and exec:
nothing of the consumer's threads or CUDA state is copied) told the consumer's ``sys.path``, working directory
and ``sys.argv`` (multiprocessing's preparation data), which imports outcore and serves. Only when the options
name something of the script itself (a transform defined in it: its pickle names ``__main__``) does it import
the script as spawn does, whose work must then be under the guard: a script that starts a loader while being
imported so is refused there (multiprocessing's own check), and the consumer says to add the guard.

>>> mine, theirs = pipe()  # doctest: +SKIP
>>> board, shared = board_file()  # doctest: +SKIP
>>> child = Child(mine, theirs, shared, preparation(main=False, folder=mailbox_folder, shares=1))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import socket
import subprocess
import tempfile
from multiprocessing import process, spawn
from multiprocessing.connection import Connection
from typing import Any

MAIN_KEYS = ("init_main_from_path", "init_main_from_name")  # preparation data that imports the script
BOOT = """
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the consumer's to handle: it closes the process
from multiprocessing import connection, spawn
consumer, board = connection.Connection(int(sys.argv[1])), int(sys.argv[2])  # before sys.argv is the script's
prepared = consumer.recv()
spawn.prepare({key: value for key, value in prepared.items() if key not in ("init_main_from_path",
                                                                         "init_main_from_name", "outcore")})
from outcore.iterate.process import served
served(consumer, board, prepared)
"""


def needs_main(sent: bytes) -> bool:
    """Whether pickled ``sent`` names something of the script's main module (a transform defined there), which
    the loader process must then import to load it.

    >>> import pickle
    >>> needs_main(pickle.dumps(len)), needs_main(b"c__main__\\nplus_one\\n.")  # the script's plus_one, pickled
    (False, True)
    """
    return b"__main__" in sent


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


def preparation(main: bool, folder: str, shares: int) -> dict[str, Any]:
    """What the process is told first: multiprocessing's preparation data (``sys.path``, the working directory,
    ``sys.argv``; how to import the script's main module only where ``main``), and the mailbox ``folder`` and
    ``shares`` it serves with. Raised here, as multiprocessing raises it, while this process is itself a loader
    process importing a script that starts one outside its guard."""
    prepared = spawn.get_preparation_data("outcore-batches")
    if not main:
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


def import_main(prepared: dict[str, Any]) -> None:
    """In the process (`BOOT`, its preparation done but the script's main module): that module imported where the
    options need it, as spawn imports it (its guarded block not run)."""
    main = {key: prepared[key] for key in MAIN_KEYS if key in prepared}
    if main:
        process.current_process()._inheriting = True  # as spawn's: a loader started while importing is refused
        try:
            spawn.prepare(main)
        finally:
            del process.current_process()._inheriting
