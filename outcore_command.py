"""The ``outcore`` console script: at any instant from its first line, Ctrl-C ends it with one line and exit
status 130, never a traceback. (Before that line, while the interpreter starts and imports this module, Ctrl-C
is CPython's own: it ends the process, with a traceback once CPython has installed its handler, a few
milliseconds of a command that takes seconds.)

It lives outside the ``outcore`` package because it must run before ``import outcore`` (NumPy, Dask,
Zarr: a second or more on a loaded machine), which a Ctrl-C would otherwise break off with a traceback.
The first Ctrl-C raises ``KeyboardInterrupt`` as usual: the command stops, cleans up and says so in one
line (`outcore.cli.main`), or, while outcore is still being imported, this script does; then the process
ends at once, without the interpreter's shutdown (which would report, as tracebacks, the tasks the
Ctrl-C cut short in Zarr's event loop). A Ctrl-C after that (a second one while the first is handled,
or one while the interpreter shuts down) exits at once, with 130 and nothing more said. A Ctrl-C that
lands where Python only reports exceptions (a weakref callback, such as those of the import system's
module locks, or a ``__del__``) would be lost there: it is delivered again, 10 ms later (and one lost so while
this module was imported, before `main` could take Ctrl-C, stops `main` at once). One that lands where
code replaces it with an error of its own (NumPy's C extension, imported, reports the ``KeyboardInterrupt`` of
its own imports as an ``ImportError``) is still that Ctrl-C: one line and 130, not that error's traceback. One
that comes as `main` is called, which Python takes as `main` starts, before its first line, escapes it: it is
still the command's (`_escaped_main`).

The cleanup a first Ctrl-C starts has `CLEANUP_SECONDS` to end (`_watch_the_cleanup`): a ``KeyboardInterrupt`` that
Python raises inside a ``with`` statement's ``__enter__``, once it has taken its lock (a ``threading.Condition``'s,
a ``concurrent.futures.Future``'s), leaves that lock taken for ever, and the thread that next takes it, one the
cleanup may wait for, waits for ever too (an ingest's scheduler, which takes such locks at every task, runs on a
thread of its own for that reason: `outcore.ingest.scheduler`). Past that time the command says so in its one line
and ends, with 130; what it left is a killed run's, which the next run of the same command takes over.
"""

from __future__ import annotations

import sys


class _LostWhileImported:
    """``sys.unraisablehook`` from this module's first line: a Ctrl-C that comes as this module's own imports end
    (Python's default handler still in place) raises its ``KeyboardInterrupt`` in the import system's module-lock
    callbacks, where Python only reports it; it is noted here, and `main` stops at once instead of running the
    command to its end."""

    def __init__(self, report: Callable[[sys.UnraisableHookArgs], object]) -> None:
        self.report, self.lost = report, False

    def __call__(self, unraisable: sys.UnraisableHookArgs) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.lost = True
        else:
            self.report(unraisable)


_IMPORTING = sys.unraisablehook = _LostWhileImported(sys.unraisablehook)

# Each import below may take a module lock: after the hook, so that a Ctrl-C in one's callback is not lost.
import _thread
import gc
import os
import signal
import time
from collections.abc import Callable
from types import CodeType, FrameType, TracebackType

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped
REDELIVERY_SECONDS = 0.01
CLEANUP_SECONDS = 30.0  # the longest the first Ctrl-C's cleanup may take before the process ends without it
_ending = False  # main has left the block that takes the first Ctrl-C's KeyboardInterrupt: the next one ends it
_watched = False  # the first Ctrl-C's cleanup is timed (`_watch_the_cleanup`)


def main() -> int:
    """Run the ``outcore`` command; return its exit status."""
    global _ending
    try:  # from the first line: a Ctrl-C before the handler is installed raises Python's KeyboardInterrupt
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started to ignore it (a shell's background job)
            sys.unraisablehook = _IMPORTING.report
            status = _run()
            _shut_down_quickly()
            return status
        signal.signal(signal.SIGINT, _first_interrupt)  # a Ctrl-C pending as it returns raises here: caught below
        sys.unraisablehook = _deliver_again(_IMPORTING.report)
        status = _said_interrupted() if _IMPORTING.lost else _run()
    except KeyboardInterrupt:  # before the command could take it: importing outcore, reading the arguments
        status = _said_interrupted()
    except Exception:
        if not _ctrl_c_taken():  # the error is the command's own
            raise
        status = _said_interrupted()  # the code the Ctrl-C broke off turned it into an error of its own
    finally:  # the interpreter shuts down next (threads joined): a first Ctrl-C there ends it at once
        _ending = True  # before any call, where a Ctrl-C's handler may run: outside the block above
    if status == INTERRUPTED:  # said and cleaned up: end now, before the shutdown reports work the Ctrl-C
        _exit_now(signal.SIGINT, None)  # cut short (zarr's pending reads: "Task exception was never retrieved")
    _shut_down_quickly()
    return status


def _ctrl_c_taken() -> bool:
    """Whether the first Ctrl-C came: its ``KeyboardInterrupt`` raised (`_first_interrupt`), wherever it went."""
    return signal.getsignal(signal.SIGINT) is _exit_now


def _said_interrupted() -> int:
    print("outcore: interrupted", file=sys.stderr)
    return INTERRUPTED


def _run() -> int:
    """Import outcore and run the command. What the imports made (NumPy's, Dask's, Zarr's and outcore's modules:
    about a hundred thousand objects) lives as long as the command, so it is frozen (`gc.freeze`): the garbage
    collector's full passes, each over every object, then pass over the command's own objects only (an ingest of
    100,000 files made two such passes of a tenth of a second each on its one thread, docs/benchmarks.md). The
    collector is off while they are made, as `gc.freeze`'s documentation advises before a fork: its passes there
    (about 170, over ever more objects) cost more than the few cycles they free, which are frozen with the rest.

    A Ctrl-C taken while outcore was imported, whose ``KeyboardInterrupt`` did not come out of the imports, was
    swallowed there: a C extension reports it as an ``ImportError`` (NumPy's, as it imports ``datetime``), and a
    module that falls back where another is missing takes that as missing. It stops the command before it runs."""
    gc.disable()
    try:
        from outcore.cli.main import main as run
    finally:
        gc.freeze()
        gc.enable()
    if _ctrl_c_taken():
        raise KeyboardInterrupt
    return run()


def _shut_down_quickly() -> None:
    """The interpreter's shutdown, once the command is done, would pass over every object of the modules it imported
    (NumPy, Dask, Zarr: over a hundred thousand) several times looking for reference cycles: a few tenths of a second
    at the end of every command, on one core (docs/benchmarks.md). What is garbage now is collected once, its
    finalizers run (a temporary folder in a cycle is removed), and what is still alive is frozen (`gc.freeze`):
    the shutdown frees it by reference counts, without those passes, and leaves its cycles to the process's end."""
    gc.collect()
    gc.freeze()


def _first_interrupt(signum: int, frame: FrameType | None) -> None:
    if _ending:  # nobody would catch its KeyboardInterrupt now
        _interrupted_at_exit(signum, frame)
    signal.signal(signal.SIGINT, _exit_now)  # its line is said by whoever catches the KeyboardInterrupt
    signal.setitimer(signal.ITIMER_REAL, 0)  # this one is delivered: not again
    _watch_the_cleanup()
    raise KeyboardInterrupt


def _watch_the_cleanup() -> None:
    """End the process `CLEANUP_SECONDS` from now, with the command's one line and 130, unless it has ended: a thread
    of ``_thread``'s own, which takes none of ``threading``'s locks (a Ctrl-C may have left one taken, in the middle
    of a thread's start), and writes with one system call, through no stream's lock."""
    global _watched
    if not _watched:  # once: a Ctrl-C delivered again (`_deliver_again`) is still the first
        _watched = True
        _thread.start_new_thread(_end_the_cleanup, (CLEANUP_SECONDS,))


def _end_the_cleanup(seconds: float) -> None:
    time.sleep(seconds)
    os.write(2, f"outcore: interrupted (its cleanup had not ended {seconds:g} s after Ctrl-C: ended without it; the "
                "same command takes over what it left)\n".encode())
    os._exit(INTERRUPTED)


def _deliver_again(report: Callable[[sys.UnraisableHookArgs], object]) -> Callable[[sys.UnraisableHookArgs], None]:
    """``sys.unraisablehook`` that delivers again the first Ctrl-C's ``KeyboardInterrupt`` where it was lost."""

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt) and _ctrl_c_taken():
            signal.signal(signal.SIGINT, _first_interrupt)  # still the first Ctrl-C, as far as the command knows
            signal.signal(signal.SIGALRM, _interrupt_again)
            signal.setitimer(signal.ITIMER_REAL, REDELIVERY_SECONDS)
        else:
            report(unraisable)

    return hook


def _interrupt_again(signum: int, frame: FrameType | None) -> None:
    signal.raise_signal(signal.SIGINT)


def _interrupted_at_exit(signum: int, frame: FrameType | None) -> None:
    _said_interrupted()
    _exit_now(signum, frame)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(INTERRUPTED)


def _escaped_main(report: Callable[..., object]) -> Callable[..., None]:
    """``sys.excepthook`` for a Ctrl-C that came as `main` was called: Python checks for signals as a function
    starts, before its first line, so that Python's own handler (still in place: `main` installs the command's
    in its ``try``) raised its ``KeyboardInterrupt`` out of `main` (seen once in CI). It is the command's all the
    same: one line and 130, not that traceback. Nothing else escapes `main` as a ``KeyboardInterrupt``: its
    ``try`` takes those raised in it, and its handler ends the process at once past it."""

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt) and main.__code__ in _codes(trace):
            _interrupted_at_exit(signal.SIGINT, None)
        report(kind, error, trace)

    return hook


def _codes(trace: TracebackType | None) -> list[CodeType]:
    """The code of each frame ``trace`` passes through, outermost first."""
    codes = []
    while trace is not None:
        codes.append(trace.tb_frame.f_code)
        trace = trace.tb_next
    return codes


sys.excepthook = _escaped_main(sys.excepthook)

if __name__ == "__main__":
    sys.exit(main())
