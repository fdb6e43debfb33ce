"""Ctrl-C sent to the ``outcore`` command at any instant, and what it ended in (`outcome`): one line and status 130
once the command's module has Ctrl-C in hand; before that, in the interpreter's own start-up, what CPython does.
tests/test_staging.py sends it at chosen instants of an ingest, ``benchmarks/reliability.py`` at many random ones.

>>> process = start_command(["ingest", "photos", "t.zarr", "--no-progress"])  # doctest: +SKIP
>>> time.sleep(0.3)  # doctest: +SKIP
>>> process.send_signal(signal.SIGINT)  # doctest: +SKIP
>>> outcome(process.wait(), process.stderr.read())  # doctest: +SKIP
'one line, 130'
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

COMMAND = "import sys, outcore_command; sys.exit(outcore_command.main())"  # what the console script runs
PACKAGE = os.path.dirname(os.path.dirname(__file__)) + os.sep  # outcore's own files (a checkout's folder may be named so)
OUTCOMES = ("one line, 130", "ended by the signal", "the interpreter's start-up", "finished")
CHAINED = "During handling of the above exception, another exception occurred:"  # between a chain's tracebacks
ONE_LINE = re.compile(r"outcore( [a-z]+)?: interrupted( \(.+\))?")  # "outcore ingest: interrupted (the shards ...)"
MODULE_LOCK_CALLBACKS = tuple(f"Exception ignored in: <function {name}" for name in (  # the import system's weakref
    "_get_module_lock.<locals>.cb",  # callbacks of its module locks: Python 3.11's,
    "_WeakValueDictionary.__init__.<locals>.KeyedRef.remove"))  # and 3.12's on


@contextlib.contextmanager
def as_from_a_terminal() -> Iterator[None]:
    """Children started within it get Ctrl-C's default action, as from a terminal: a test runner may ignore SIGINT
    (a shell's background job does), which a child would inherit; a handled signal is reset to its default in the
    child, and an ignored one stays ignored (the command then leaves Ctrl-C alone, as a background job's must)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_command(args: Sequence[str], **popen: Any) -> subprocess.Popen:
    """The ``outcore`` command with ``args`` in a fresh process, as its console script runs it, started as from a
    terminal (`as_from_a_terminal`); its stderr a text pipe, for `outcome`."""
    with as_from_a_terminal():
        return subprocess.Popen([sys.executable, "-c", COMMAND, *args], stderr=subprocess.PIPE, text=True, **popen)


def outcome(returncode: int, err: str) -> str:
    """What a Ctrl-C made the command end in, one of `OUTCOMES`, or ``"wrong: ..."``:

    - ``"one line, 130"``: the command (or its module, while it imported outcore) took it, and said so in one line;
    - ``"ended by the signal"``: before Python takes Ctrl-C, or after it gives it back at its exit, silently; or
      CPython's traceback of it in the line that imports the command's module (`_before_the_command`);
    - ``"the interpreter's start-up"``: what CPython does there (`_in_the_interpreters_start_up`);
    - ``"finished"``: status 0, nothing said: the command ended before the Ctrl-C came (whoever sent it early and
      got this has found a Ctrl-C lost).

    >>> outcome(130, "outcore ingest: interrupted (the shards written so far are kept: ...)\\n")
    'one line, 130'
    >>> outcome(1, "Traceback (most recent call last):\\n  ...\\nImportError: ...\\n")
    'wrong: status 1, 3 line(s) on stderr'
    >>> cut = 'Traceback (most recent call last):\\n  File "<string>", line 1, in <module>\\n  File "/x/outcore_command.py"'
    >>> outcome(-2, cut + ', line 48, in <module>\\n  File "/x/outcore_command.py", line 38, in __init__\\nKeyboardInterrupt')
    'ended by the signal'
    >>> outcome(-2, cut + ', line 60, in main\\nKeyboardInterrupt')
    'wrong: status -2, 4 line(s) on stderr'
    """
    lines = err.strip().splitlines()
    if returncode == -signal.SIGINT and (not err or _before_the_command(err)):
        return "ended by the signal"
    if returncode in (0, 1) and err and _in_the_interpreters_start_up(returncode, err):
        return "the interpreter's start-up"
    if returncode == 0 and not err:
        return "finished"
    if returncode == 130 and len(lines) == 1 and ONE_LINE.fullmatch(lines[0]):
        return "one line, 130"
    return f"wrong: status {returncode}, {len(lines)} line(s) on stderr"


def _before_the_command(err: str) -> bool:
    """Whether ``err`` is CPython's traceback of a Ctrl-C it took while it imported the command's module (from its
    start-up until ``outcore_command.main`` installs its handler, Ctrl-C is the interpreter's own): a
    ``KeyboardInterrupt`` raised in the line that imports it (or as the interpreter begins it: "line 0"), in that
    module's own imports (the standard library's ``signal`` and ``collections.abc``) or in what its first lines run
    (the ``__init__`` of the hook they install), never in its ``main`` nor in outcore. Where it came as the import
    system handled an exception of its own (a path not in its cache yet), that exception's traceback comes first,
    of the import system's frames alone.

    >>> cut = 'Traceback (most recent call last):\\n  File "<string>", line 1, in <module>\\n  File "/x/outcore_command.py"'
    >>> _before_the_command(cut + ', line 58, in <module>\\n  File "<frozen importlib._bootstrap>"\\nKeyboardInterrupt')
    True
    >>> own = 'Traceback (most recent call last):\\n  File "<frozen importlib._bootstrap_external>"\\nKeyError: 1\\n\\n'
    >>> _before_the_command(own + CHAINED + "\\n\\n" + cut + ', line 58, in <module>\\nKeyboardInterrupt')
    True
    >>> _before_the_command(cut + ', line 60, in main\\nKeyboardInterrupt')
    False
    """
    *handled, err = err.split(CHAINED)
    if not all(_import_system_s_own(part) for part in handled):
        return False
    lines = err.strip().splitlines()
    frames = _frames(err)
    command = [frame for frame in frames if 'outcore_command.py"' in frame]
    return (lines[:1] == ["Traceback (most recent call last):"] and lines[-1] == "KeyboardInterrupt"
            and frames[:1] in (['File "<string>", line 0, in <module>'], ['File "<string>", line 1, in <module>'])
            and all(frame.endswith(("in <module>", "in __init__")) for frame in command)
            and not any(PACKAGE in frame for frame in frames))


def _import_system_s_own(err: str) -> bool:
    """Whether ``err`` is the traceback of an exception raised and handled by the import system alone: its frames all
    CPython's frozen import system's."""
    frames = _frames(err)
    return err.strip().splitlines()[:1] == ["Traceback (most recent call last):"] and bool(frames) and all(
        frame.startswith('File "<frozen importlib.') for frame in frames)


def _frames(err: str) -> list[str]:
    """The frame lines (``File "...", line n, in f``) of the tracebacks in ``err``, stripped."""
    return [line.strip() for line in err.splitlines() if line.lstrip().startswith("File ")]


def _in_the_interpreters_start_up(returncode: int, err: str) -> bool:
    """Whether ``returncode`` and ``err`` are CPython's for a Ctrl-C that came in its own start-up, before the
    command's module ran its first line, where nothing else can take Ctrl-C: its fatal error as it initialises
    (status 1: its standard streams, or its ``site`` module running the environment's ``.pth`` files; or, with
    no heading, a traceback of its frozen import system's frames alone, importing before any file's code ran), or a
    ``KeyboardInterrupt`` it reported and went past, the command then run to its end (status 0): raised in a module
    lock's callback ("Exception ignored in", `MODULE_LOCK_CALLBACKS`), or turned into another error by a ``.pth``
    file's line, which ``site`` skips ("Remainder of file ignored"). Never a frame of outcore's.

    >>> ignored = ("Exception ignored in: <function _WeakValueDictionary.__init__.<locals>.KeyedRef.remove at 0x7f>\\n"
    ...            'Traceback (most recent call last):\\n  File "<frozen importlib._bootstrap>", line 82, in remove\\n'
    ...            "KeyboardInterrupt: \\n")
    >>> _in_the_interpreters_start_up(0, ignored), _in_the_interpreters_start_up(0, ignored.replace(
    ...     "_WeakValueDictionary.__init__.<locals>.KeyedRef.remove", "_get_module_lock.<locals>.cb"))
    (True, True)
    """
    lines = [line.strip() for line in err.splitlines()]
    interrupted = any(line.split(":")[0] == "KeyboardInterrupt" for line in lines) and PACKAGE not in err
    if returncode == 1:
        return interrupted and (err.startswith("Fatal Python error: init_") or (
            err.startswith("Traceback (most recent call last):") and all(
                frame.startswith('File "<frozen ') for frame in _frames(err))))
    return returncode == 0 and interrupted and (
        err.startswith(MODULE_LOCK_CALLBACKS)
        or (err.startswith("Error processing line ") and "Remainder of file ignored" in lines))
