"""Batches made by a process of their own (``process=True``): its threads read, decode and augment on every core
under a GIL of their own, while the consumer's process only takes each finished batch.

A training loop that launches a GPU's kernels from Python holds its process's GIL for most of each step. A
loader in that process (`outcore.iterate.runs.LocalRun`) needs the GIL too, a little for each batch it makes, and
each time it takes it, it waits for the loop and delays it: the loop's rate falls, however many cores decode.
With a `LoaderProcess`, that little is paid in another process. The consumer's process keeps no thread for it:
on the consumer's thread, each batch costs one small message received and its files mapped, the mappings kept
from the files' earlier batches (`outcore.iterate.shared.Mailbox`).

An iterator's loader process (`serve`) lives as long as the iterator, or until it has had no run open for
`IDLE_SECONDS` (`Idle`: an iterator kept after its training), and makes its runs one after the other (an
epoch each, or what is left of one): each run a `ProcessRun` here, a `LocalRun` there, whose batches are made
straight into files of the process's mailbox in shared memory (``/dev/shm``), the files of batches the consumer
has dropped used again. It sends a batch only when the consumer has taken one of the ``prefetch`` sent before
it, so memory is bounded as for a run in the consumer's process. Its warnings (a damaged chunk left out) are
raised again in the consumer's process; its errors are raised there with its traceback; a process that dies is
a `LoaderProcessError` naming its exit, and the next iteration starts another.

With ``process=n``, n such processes (`LoaderProcesses`) make each batch together: each its part, the samples
of its share of the rank's streams (`outcore.iterate.plan.EpochPlan`'s ``part``), written at its rows of the batch's
files in one mailbox, which the consumer maps once every part has come (`PartsRun`). Each reads only its own
streams' chunks and works under its own GIL on its share of the CPUs: more cores busy than the Python of one
process's batches lets its threads keep busy.

The process is a Python of its own (`outcore.iterate.child.Child`), never forked from the consumer, whose
threads and CUDA context a fork would copy mid-use. It imports outcore, never the script, which needs no
``if __name__ == "__main__":`` guard: the options go to it by cloudpickle (`pickled`), a transform the script
defines (a lambda too) by value. The batches are those of a run in the consumer's process, byte for byte.

>>> it = ds.batches(256, shuffle=True, process=True)  # doctest: +SKIP
>>> for batch in it:  # doctest: +SKIP
...     train_step(batch["images"], batch["labels"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from ..errors import IterationClosedError, LoaderProcessError, OptionError, OutcoreError
from ..storage import Store, blocks
from ..threads import share_cpus
from .batch import Batch, plain
from .child import Child, board_file, pipe, preparation, shared_board
from .options import BatchOptions
from .plan import EpochPlan
from .readers import chunk_readers, recipe
from .runs import EXIT_SECONDS, WAKE_SECONDS, ChunkBuffers, LocalRun, Run, Work, closed
from .shared import Arena, Mailbox, Part, SharedArray, SharedBatch, Slot, free_file, join_parts
from .stats import LoaderStats

IDLE_SECONDS = 60.0  # a loader's processes with no run open this long end; the next run starts them again
KEPT_SAMPLES = 8  # a run keeps the samples of its last batches handed out: a thread copying them runs ahead
CREDIT_SECONDS = 0.001  # how often a process ahead of its consumer by ``prefetch`` batches looks whether it took one
PART_FILES = "part-r"  # files of batches that processes write parts of: part-r<run>-e<epoch>-s<step>-<field>


@dataclass(frozen=True)
class Order:
    """What the process makes for a run: batches ``steps`` of ``epoch`` of the store ``opener`` opens, as
    ``options`` say; with a ``part`` ``(p, n)``, part ``p`` of each, at its rows of files ``<files>-s<step>-...``
    (`outcore.iterate.shared.Part`), which the other parts' processes write too."""

    opener: Callable[[], Store]
    options: BatchOptions
    epoch: int
    steps: Sequence[int]
    part: tuple[int, int] = (0, 1)
    files: str = ""


class RemoteTraceback(Exception):
    """The traceback of an error raised in the loader process (the cause of the error raised here)."""

    def __str__(self) -> str:
        return f"\n\nin the process making the batches:\n{self.args[0]}"


class Idle:
    """Ends a loader's processes (``end``) once they have had no run open (``idle()``) for `IDLE_SECONDS`: an
    iterator kept after its training (TensorFlow's generators keep theirs) holds no process, nor its shared
    memory, for long. `lock` is held to order a run or start the processes: none is ordered as they end."""

    def __init__(self, idle: Callable[[], bool], end: Callable[[], None]) -> None:
        self.idle, self.end = idle, end
        self.lock = threading.RLock()
        self.timer: threading.Timer | None = None

    def begun(self) -> None:
        """No run is open now: the processes end in `IDLE_SECONDS` unless one is ordered meanwhile."""
        with self.lock:
            self.cancel()
            self.timer = threading.Timer(IDLE_SECONDS, self._ended)
            self.timer.daemon = True
            self.timer.start()

    def cancel(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def _ended(self) -> None:
        with self.lock:
            if self.timer is threading.current_thread() and self.idle():  # not cancelled, nor begun again since
                self.timer = None
                self.end()


class LoaderProcess:
    """An iterator's process of its own making its runs' batches (`serve`), started with the iterator (`start`:
    it imports outcore meanwhile, never the script: `outcore.iterate.child`) and again at
    the `run` after one that died or went idle (`Idle`), ended by `close` (or when the iterator goes, or at
    exit)."""

    def __init__(self, shares: int = 1, mailbox: Mailbox | None = None) -> None:
        self.shares = shares  # the processes making batches together, this one included: it takes its part of the CPUs
        self.given = mailbox  # the mailbox shared with those processes (`LoaderProcesses`); else one of its own
        self.process: Any = None
        self.connection: Any = None
        self.mailbox: Mailbox | None = None
        self.runs = itertools.count()
        self.heard = False  # a message came from the process now running
        self.poller: Any = None  # waits on the connection in one system call (the connection's poll takes several)
        self.board: Any = None  # the batches taken (`taken`): the run's number, then the count, in 64 bits
        self.started = False  # the process said it has started (its imports done): `ready`
        self.reading = threading.Condition()  # held to read the connection, or what was kept for a run (`receive`)
        self.listening = False  # a run's thread waits on the connection: the others wait for what it keeps for them
        self.open: set[int] = set()  # runs ordered, not closed nor all taken: their messages kept until taken
        self.later: dict[int, deque[tuple[Any, ...]]] = {}  # messages that came while another run's thread read
        self.idling = Idle(lambda: not self.open, lambda: self.close(keep_free=False))  # ends idle (own mailbox)
        self.closing = threading.Lock()
        self.telling = threading.Lock()  # held to write the board (`taken`): two runs' threads may take at once

    @classmethod
    def kept_by(cls, owner: object, options: BatchOptions) -> LoaderProcess:
        """A process started now for batches made as ``options`` say (refused now if they cannot reach it), ended
        when ``owner`` (an iterator, a DataLoader's dataset) goes, or at exit."""
        pickled(options)
        loader = cls()
        weakref.finalize(owner, loader.close)
        loader.start()
        return loader

    def run(self, work: Work, stats: LoaderStats) -> ProcessRun | CopyingRun:
        """A run of ``work`` made by the process (started now if none runs): taken on the consumer's thread, or by
        a thread that copies each batch into the consumer's memory of choice (``work.empty``)."""
        run = self.order(work, stats)
        return run if work.empty is plain else CopyingRun(run)

    def order(self, work: Work, stats: LoaderStats, part: tuple[int, int] = (0, 1), files: str = "") -> ProcessRun:
        """The process's run of ``work`` (with ``part``, that part of each batch, at its rows of ``files``:
        `Order`), ordered now."""
        refuse_workers(work)
        sent = pickled(Order(work.store.opener, dataclasses.replace(work.options, process=False), work.epoch,
                             list(work.batches), part, files))
        with self.idling.lock:
            if self.process is None:
                self.start()
            self.idling.cancel()
            run = ProcessRun(self, next(self.runs), work, stats)
            with self.reading:
                self.open.add(run.number)
            self._send(("run", run.number, sent))
        return run

    def start(self) -> None:
        """Start the process now (its imports, outcore's, overlap what the caller does next: building a model, say),
        ending the one before, if any."""
        self.close()
        self.mailbox = self.given or opened_mailbox()
        self.connection, theirs = pipe()
        self.poller = select.poll()
        self.poller.register(self.connection.fileno(), select.POLLIN)
        self.heard = self.started = False
        try:
            prepared = preparation(str(self.mailbox.slot.folder), self.shares)
            self.board, board = board_file()
            try:
                self.process = Child(self.connection, theirs, board, prepared)
            finally:
                os.close(board)
        except OSError as error:
            self.close()
            raise LoaderProcessError(f"could not start the process making the batches ({error}): leave process= "
                                     "out to make them in this process") from None
        finally:
            os.close(theirs)
        if self.given is None and not self.open:  # not a run's start: ends if none comes
            self.idling.begun()

    def ready(self) -> bool:
        """Whether the process has started (or ended: its run then says how), without waiting; one let go (it
        died) is started again."""
        with self.idling.lock:
            if self.process is None:
                self.start()
        with self.reading:
            if not self.started and self.poller.poll(0):
                try:
                    pickle.loads(self.connection.recv_bytes())  # its first message: "started"
                    self.heard = True
                except (EOFError, OSError):
                    pass  # it died: its run says how
                self.started = True
        return self.started

    def forget(self, number: int) -> None:
        """Run ``number`` is closed, or all its batches taken: what was kept for it is dropped; with no run open, a
        process of its own mailbox ends once `Idle`."""
        with self.reading:
            self.open.discard(number)
            for message in self.later.pop(number, ()):
                self._drop(message)
            idle = not self.open and self.process is not None and self.given is None
        if idle:
            self.idling.begun()

    def _send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # a process that died: the run's first receive says so
            self.connection.send(message)

    def taken(self, number: int, delivered: int) -> None:
        """Say that the consumer took ``delivered`` batches of run ``number``: the process may send as many more.
        Written into memory the process reads, not sent: a message would wake it, and a wake-up costs the
        sender more than the rest of a batch's hand-off. A run's count never replaces a later run's: the process
        sends a run's batches once it sent all of the run's before, and from then on reads the later run's count
        only (the next epoch's run, ordered ahead, may take its first batch on its thread before the thread of this
        one takes its last; the process would wait for that run's count, and its taker for the process)."""
        with self.telling:
            if number >= self.board.value >> 32:
                self.board.value = number << 32 | delivered

    def receive(self, run: ProcessRun) -> tuple[tuple[Any, ...], bool]:
        """The next message of the process for ``run``, and whether it had come when asked for. Several runs' threads
        may wait at once (a copying run's, and the next epoch's, started ahead): one at a time waits on the
        connection, keeps for the others what comes for them (those of runs still open; those of runs closed are
        dropped, their batches' files freed) and wakes them. The process's death, or the run closed meanwhile,
        raised."""
        first = True
        while True:
            with self.reading:
                kept = self.later.get(run.number)
                if kept:
                    return kept.popleft(), first
                if run.stop.is_set():
                    raise closed(run.work, run.delivered)
                if self.listening:  # another run's thread waits on the connection: it wakes this one
                    self.reading.wait(WAKE_SECONDS)
                    first = False
                    continue
                self.listening = True
            try:
                message = self._listen(0 if first else WAKE_SECONDS)  # the others may take what was kept meanwhile
            except (EOFError, OSError):
                if run.stop.is_set():
                    raise closed(run.work, run.delivered) from None
                raise self._died(run) from None
            finally:
                with self.reading:
                    self.listening = False
                    self.reading.notify_all()
            if message is None:
                first = False
                continue
            with self.reading:
                self.heard = True
                if message[1] == run.number:
                    return message, first
                if message[1] in self.open:
                    self.later.setdefault(message[1], deque()).append(message)
                    self.reading.notify_all()
                else:
                    self._drop(message)

    def _listen(self, timeout: float) -> tuple[Any, ...] | None:
        """The process's next message, waiting up to ``timeout`` seconds for it (None if none came); a closed
        connection raises `OSError`."""
        connection = self.connection
        if connection is None:
            raise OSError("the connection to the process making the batches was closed")
        if not self.poller.poll(timeout * 1e3):
            return None
        return pickle.loads(connection.recv_bytes())

    def _drop(self, message: tuple[Any, ...]) -> None:
        """A message of a run closed before it took it: its batch's files go back to the free ones."""
        if message[0] == "batch" and self.mailbox is not None:
            for value in unpacked(message[4]).fields.values():  # a part's files: the run's `PartsRun.close` goes
                if isinstance(value, SharedArray) and not value.name.startswith(PART_FILES):
                    free_file(self.mailbox.folder, value.name, value.file_size)

    def _died(self, run: ProcessRun) -> LoaderProcessError:
        """The error that says how the process ended; it is let go (the next run starts another)."""
        awaited = f"batch {run.work.batches[run.delivered]} of epoch {run.work.epoch} was awaited"
        process = self.process
        if process is None:  # let go already, by another run's thread that found it ended
            return LoaderProcessError(f"the process making the batches ended while {awaited}: iterate again to "
                                      "continue from there (state_dict() says where)")
        process.join(EXIT_SECONDS)
        code, pid, heard = process.exitcode, process.pid, self.heard
        self.close()
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        said = f"the process making the batches (pid {pid}) ended ({how}) while {awaited}"
        if code is not None and code > 0 and not heard:
            return LoaderProcessError(f"{said}, before its first batch: it could not start (its traceback is "
                                      "above); leave process= out to make the batches in this process")
        return LoaderProcessError(f"{said}: out of memory (see dmesg), or killed; iterate again to continue from "
                                  "there (state_dict() says where)")

    def close(self, keep_free: bool = True) -> None:
        """End the process (it stops at its next batch) and its mailbox (its free files kept for this process's
        next one, unless ``keep_free`` is False); batches the consumer holds stay good."""
        self.idling.cancel()
        with self.closing:  # taken by one thread (the consumer's, an idle timer's, a finalizer's) to end
            process, connection, mailbox = self.process, self.connection, self.mailbox
            self.process = self.connection = self.mailbox = None
            self.later.clear()
        if connection is not None:
            connection.close()
        if process is not None and process.pid is not None:  # started
            process.join(EXIT_SECONDS)
            if process.is_alive():
                process.kill()
                process.join(EXIT_SECONDS)
        if mailbox is not None and self.given is None:
            mailbox.close(keep_free)


class ProcessRun:
    """A run whose batches the loader process makes; the consumer takes them on its own thread. It has the
    interface of `outcore.iterate.runs.Run`: iterate it, `close` it, ask the `samples` of a step."""

    def __init__(self, loader: LoaderProcess, number: int, work: Work, stats: LoaderStats) -> None:
        self.loader, self.number, self.work, self.stats = loader, number, work, stats
        self.stop = threading.Event()
        self.under_way = threading.Event()  # its batches are all asked of the process as it is ordered: the next
        self.under_way.set()  # epoch's run may be ordered too (`NextEpoch`), which the process makes after this one
        self.delivered = 0
        self._handed = Handed(work.plan)
        self._damaged = 0  # chunks the process left out of this run (``skip_damaged``) so far

    def __iter__(self) -> Iterator[Batch]:
        began = time.perf_counter()
        for _, samples, made, ready in self.made():
            assert self.loader.mailbox is not None
            batch = copied(self.loader.mailbox.receive(made), self.work.empty)
            self.stats.record(time.perf_counter() - began, ready, len(samples))
            yield batch
            began = time.perf_counter()

    def made(self) -> Iterator[tuple[int, np.ndarray, SharedBatch, bool]]:
        """Each batch (or this process's part of it) as the process sent it: its step, its samples, where it
        waits and whether it had come when asked for; taken (the process may make another) once received."""
        while self.delivered < len(self.work.batches):
            (kind, _, *said), ready = self.loader.receive(self)
            if kind == "done":
                return
            if kind == "failed":
                error, trace = said
                raise error from RemoteTraceback(trace)
            step, samples, made, raised, damaged = said
            samples = np.frombuffer(samples, np.int64)
            for message, category in raised:
                warnings.warn(message, category, stacklevel=3)
            self.stats.damaged += damaged - self._damaged
            self._damaged = damaged
            self._handed.keep(step, samples)
            self.delivered += 1
            self.loader.taken(self.number, self.delivered)
            if self.delivered == len(self.work.batches):  # the last: the run holds the process no more
                self.loader.forget(self.number)
            yield step, samples, unpacked(made), ready

    def samples(self, step: int) -> np.ndarray:
        return self._handed.samples(step)

    def close(self) -> None:
        """Have the process stop this run (at its next batch); what it sent meanwhile is dropped."""
        if not self.stop.is_set():
            self.stop.set()
            if self.delivered < len(self.work.batches) and self.loader.connection is not None:
                self.loader._send(("stop", self.number))
            self.loader.forget(self.number)


class CopyingRun(Run):
    """A `ProcessRun` taken by a thread of this process, which copies each batch into the consumer's memory of
    choice (`Work.empty`: pinned memory, for a GPU) as it comes: a copy of megabytes, made outside the GIL but not on
    the consumer's thread, which takes the batches from the run's queue."""

    def __init__(self, made_there: ProcessRun) -> None:
        self.made_there = made_there
        super().__init__(made_there.work, made_there.stats)
        self.under_way = made_there.under_way
        made_there.stats = LoaderStats()  # the waits that count are the consumer's, on this run's queue

    def _produce_batches(self) -> None:
        for batch in self.made_there:
            if not self._put(batch):
                return

    def samples(self, step: int) -> np.ndarray:
        return self.made_there.samples(step)

    def close(self) -> None:
        self.made_there.close()  # its thread, waiting for the process, stops at once
        super().close()

    def _release(self) -> None:
        self.made_there.close()  # closed, or let go untaken (`NextEpoch`): the process stops making its batches


class StartingRun:
    """A run whose first batches are made here, by ``local`` (a `LocalRun` of the same work), while the loader
    process starts, and the rest there, from the first batch after the process `LoaderProcess.ready`: the first
    batch comes as soon as without a process of its own, and the process takes over once it can. This process then
    lets go of the memory it made those batches in (its chunk buffers, the batches made and not handed out, and the
    blocks `outcore.storage.blocks` kept for more): the processes make every batch from then on."""

    def __init__(self, loader: LoaderProcess, work: Work, stats: LoaderStats, local: Any) -> None:
        self.loader, self.work, self.stats, self.local = loader, work, stats, local
        self.current = local
        self.stop = local.stop
        self.under_way = threading.Event()  # never set: the process may take the rest over, which it is not asked
        self.delivered = 0  # by this run, here and there

    def __iter__(self) -> Iterator[Batch]:
        made = iter(self.local)
        for index in range(len(self.work.batches)):
            if self.loader.ready():
                made.close()  # its last batch let go
                self.local.close()  # and what it made, not handed out, freed
                self.local.buffers.let_go()  # the processes read the chunks from now on
                blocks.let_go()  # and make the batches: the memory kept here for them goes back
                self.current = self.loader.run(dataclasses.replace(self.work, batches=self.work.batches[index:]),
                                               self.stats)
                self.stop = self.current.stop
                for batch in self.current:
                    self.delivered += 1
                    yield batch
                return
            batch = next(made)
            self.delivered += 1
            yield batch

    def samples(self, step: int) -> np.ndarray:
        return self.current.samples(step)

    def close(self) -> None:
        self.local.close()
        self.current.close()


class LoaderProcesses:
    """The processes of ``process=n`` (`LoaderProcess` each, on its share of the CPUs) making every batch
    together: each its part (`PartsRun`), written into their one mailbox. Started with the iterator, ended by
    `close` (or when the iterator goes, or at exit); one that dies is started again at the next run."""

    def __init__(self, count: int) -> None:
        self.mailbox: Mailbox | None = None
        self.members = [LoaderProcess(count) for _ in range(count)]
        self.runs = itertools.count()
        self.open: set[int] = set()  # runs not closed nor all taken: their parts' files are left to them (`sweep`)
        self.idling = Idle(lambda: not self.open, lambda: self.close(keep_free=False))

    @classmethod
    def kept_by(cls, owner: object, options: BatchOptions) -> LoaderProcesses:
        """``options.processes`` processes started now (refused now if the options cannot reach them), ended
        when ``owner`` goes, or at exit."""
        pickled(options)
        loaders = cls(options.processes)
        weakref.finalize(owner, loaders.close)
        loaders.start()
        return loaders

    def start(self) -> None:
        """Start the processes now (their imports overlap what the caller does next), ending those before."""
        self.close()
        self.mailbox = opened_mailbox()
        for member in self.members:
            member.given = self.mailbox
            member.start()
        if not self.open:  # not a run's start: they end if none comes
            self.idling.begun()

    def ready(self) -> bool:
        """Whether every process has started (or ended: the run says how), without waiting."""
        with self.idling.lock:
            if self.mailbox is None:
                self.start()
        ready = [member.ready() for member in self.members]  # each one asked: one let go is started again
        return all(ready)

    def run(self, work: Work, stats: LoaderStats) -> PartsRun | CopyingRun:
        """A run of ``work`` whose batches the processes make together (started now if not running), taken on the
        consumer's thread, or by a thread that copies each into the consumer's memory of choice (``work.empty``)."""
        refuse_workers(work)
        with self.idling.lock:
            if self.mailbox is None:
                self.start()
            self.idling.cancel()
            count, number = len(self.members), next(self.runs)
            files = f"{PART_FILES}{number}-e{work.epoch}"
            ahead = dataclasses.replace(work, options=dataclasses.replace(  # the batches ahead: ``prefetch`` in all
                work.options, prefetch=-(-work.options.prefetch // count)))
            parts = [member.order(ahead, LoaderStats(), (index, count), files)
                     for index, member in enumerate(self.members)]
            run = PartsRun(self, number, work, stats, parts)
            self.open.add(number)
        return run if work.empty is plain else CopyingRun(run)

    def forget(self, number: int) -> None:
        """Run ``number`` is closed, or all its batches taken; with no run open, the processes end once `Idle`."""
        self.open.discard(number)
        if not self.open and self.mailbox is not None:
            self.idling.begun()

    def sweep(self, before: int) -> None:
        """Remove the files of runs before run ``before`` whose parts were written and never taken (the run was
        closed first). Their processes have left them (each makes its runs one after the other): no part is
        written there again, so none is made a free file that another batch could be written into meanwhile.
        A run still open keeps its files: its last batches may wait, their parts written, while the next run's
        first come (a copying run's thread, behind a slow consumer)."""
        if self.mailbox is None:
            return
        for path in self.mailbox.folder.glob(f"{PART_FILES}*"):
            number = path.name[len(PART_FILES) :].partition("-")[0]
            if number.isdigit() and int(number) < before and int(number) not in self.open:
                with contextlib.suppress(OSError):
                    path.unlink()

    def close(self, keep_free: bool = True) -> None:
        """End the processes and their mailbox (its free files kept for this process's next one, unless
        ``keep_free`` is False); batches the consumer holds stay good."""
        self.idling.cancel()
        for member in self.members:
            member.close()
        mailbox, self.mailbox = self.mailbox, None
        if mailbox is not None:
            mailbox.close(keep_free)


class PartsRun:
    """A run whose batches the processes of `LoaderProcesses` make together: the consumer takes each process's
    part of a batch (`ProcessRun.made`, in the order of their parts) and maps the batch from the files they wrote
    (`outcore.iterate.shared.join_parts`). The interface of `outcore.iterate.runs.Run`, as `ProcessRun`."""

    def __init__(self, loaders: LoaderProcesses, number: int, work: Work, stats: LoaderStats,
                 parts: list[ProcessRun]) -> None:
        self.loaders, self.number, self.work, self.stats, self.parts = loaders, number, work, stats, parts
        self.stop = threading.Event()
        self.under_way = threading.Event()  # set, as `ProcessRun`'s: its parts are all ordered
        self.under_way.set()
        self.delivered = 0
        self._handed = Handed(work.plan)

    def __iter__(self) -> Iterator[Batch]:
        made = [part.made() for part in self.parts]
        for step in self.work.batches:
            began = time.perf_counter()
            parts = [next(each, None) for each in made]
            if self.delivered == 0:
                self.loaders.sweep(self.number)  # each process has begun this run: the earlier ones are left
            if any(part is None or part[0] != step for part in parts):
                if self.stop.is_set():
                    raise closed(self.work, self.delivered)
                raise OutcoreError(f"the processes making batch {step} of epoch {self.work.epoch} sent "
                                   f"{[None if part is None else part[0] for part in parts]}: a fault in outcore, "
                                   "please report it; leave process= out meanwhile")
            sized = [(samples, shared) for _, samples, shared, _ in parts if len(samples)]
            samples = np.concatenate([samples for samples, _ in sized])
            batch = join_parts([shared for _, shared in sized], [len(samples) for samples, _ in sized],
                               self.loaders.mailbox)
            self._handed.keep(step, samples)
            self.delivered += 1
            self.stats.record(time.perf_counter() - began, all(part[3] for part in parts), len(samples))
            if self.delivered == len(self.work.batches):  # the last: the run holds the processes no more
                self.loaders.forget(self.number)
            yield copied(batch, self.work.empty)

    def samples(self, step: int) -> np.ndarray:
        return self._handed.samples(step)

    def close(self) -> None:
        """Have the processes stop this run (at their next batch); its files not taken go at the first batch of a run
        ordered after it."""
        if not self.stop.is_set():
            self.stop.set()
            self.loaders.forget(self.number)
            for part in self.parts:
                part.close()


def kept_loader(owner: object, options: BatchOptions) -> LoaderProcess | LoaderProcesses:
    """The process (``process=True``) or processes (``process=n``) making batches as ``options`` say, started
    now and ended when ``owner`` goes."""
    return (LoaderProcess if options.processes == 1 else LoaderProcesses).kept_by(owner, options)


def opened_mailbox() -> Mailbox:
    """A new mailbox for a loader's processes; none (no shared memory here) is an `OptionError` saying what to do."""
    if multiprocessing.current_process().daemon:
        raise OptionError("process=True starts a process, and this one (a DataLoader or Keras worker) is "
                          "daemonic and may not: leave process= out in workers")
    mailbox = Mailbox.open()
    if mailbox is None:
        raise OptionError("process=True hands batches over through shared memory (/dev/shm), and there is none "
                          "writable here (or OUTCORE_SHARED_MEMORY=0): leave process= out")
    return mailbox


def refuse_workers(work: Work) -> None:
    """A DataLoader worker's run (its parts of batches, ``work.allocator``) is not made by a loader process."""
    if work.allocator is not None:
        raise OptionError("process=True makes whole batches in its process: a DataLoader worker makes its parts "
                          "of batches itself (leave process= out there)")


class Handed:
    """The samples of a run's last batches handed out (`KEPT_SAMPLES` of them), by step: `samples` says those of
    any step of ``plan``, kept or planned again."""

    def __init__(self, plan: EpochPlan) -> None:
        self.plan = plan
        self.kept: dict[int, np.ndarray] = {}

    def keep(self, step: int, samples: np.ndarray) -> None:
        self.kept[step] = samples
        if len(self.kept) > KEPT_SAMPLES:
            del self.kept[next(iter(self.kept))]

    def samples(self, step: int) -> np.ndarray:
        """The store's indices of the samples of batch ``step``: one of the last handed out (or any, planned here)."""
        samples = self.kept.get(step)
        return samples if samples is not None else self.plan.step(step)[0]


def copied(batch: Batch, empty: Any) -> Batch:
    """``batch`` in the consumer's memory of choice (``empty``: pinned, for a GPU; its files go back), or as it is."""
    if empty is plain:
        return batch
    return {name: _copied(value, empty, name) for name, value in batch.items()}


def pickled(sent: Order | BatchOptions) -> bytes:
    """What goes to the process, pickled by cloudpickle: what a module defines goes by name (the process imports
    that module), a transform the script defines, a lambda or a local function by value, with what it refers to
    (the process never imports the script). Options that do not pickle (a transform holding a lock or an open
    file) are an `OptionError` saying what to do."""
    try:
        return cloudpickle.dumps(sent)
    except (pickle.PicklingError, AttributeError, TypeError, ValueError) as error:
        raise OptionError(f"process=True sends the options to the process making the batches, and they do not "
                          f"pickle ({type(error).__name__}: {error}): a transform must hold nothing that cannot go to "
                          "another process (a lock, an open file, a thread); make it where it runs, or leave "
                          "process= out") from None


def packed(made: SharedBatch) -> tuple[Any, ...]:
    """``made`` as plain values, which pickle and load several times faster than arrays and dataclasses: each
    field's name, then its file's name, dtype and shape, or the array's bytes, dtype and shape (the array itself
    where its dtype has objects or named fields).

    >>> made = SharedBatch({"x": SharedArray("f-0", "|u1", (2, 3)), "y": np.arange(2)})
    >>> back = unpacked(packed(made))
    >>> back.fields["x"] == made.fields["x"], back.fields["y"].tolist(), back.fields["y"].flags.writeable
    (True, [0, 1], True)
    """
    fields = tuple((name, value.name, value.dtype, value.shape) if isinstance(value, SharedArray)
                   else (name, None, value) if value.dtype.hasobject or value.dtype.names
                   else (name, value.tobytes(), value.dtype.str, value.shape) for name, value in made.fields.items())
    return fields, made.no_room


def unpacked(packed: tuple[Any, ...]) -> SharedBatch:
    """The `SharedBatch` that `packed` made plain (its small arrays new, writable)."""
    fields, no_room = packed
    batch: dict[str, SharedArray | np.ndarray] = {}
    for name, value, *rest in fields:
        if not rest:
            batch[name] = value
        elif isinstance(value, str):
            batch[name] = SharedArray(value, *rest)
        else:
            batch[name] = np.frombuffer(bytearray(value), rest[0]).reshape(rest[1])
    return SharedBatch(batch, no_room)


def _copied(value: np.ndarray, empty: Any, field: str) -> np.ndarray:
    copy = empty(value.shape, value.dtype, field)
    np.copyto(copy, value)
    return copy


class ConsumerGone(Exception):
    """The consumer closed its end of the connection (or its process ended): the loader process ends. Only the
    connection raises it, so an `OSError` of the work itself (a store's `StorageError`) goes to the consumer."""


class Inbox:
    """What the consumer has said to the process: runs to make, in order, and runs stopped; and, on its board,
    how many batches of a run it took."""

    def __init__(self, connection: Any, board: Any) -> None:
        self.connection, self.board = connection, board
        self.orders: deque[tuple[int, bytes]] = deque()
        self.stopped: set[int] = set()
        self.finished = -1  # the last run made: a stop of it, or of a run before it, is dropped

    def read(self, timeout: float = 0.0) -> None:
        """Take in what has come, waiting up to ``timeout`` seconds for it; a closed connection raises
        `ConsumerGone`."""
        try:
            ready = self.connection.poll(timeout)
            while ready:
                kind, number, *rest = pickle.loads(self.connection.recv_bytes())
                if kind == "run":
                    self.orders.append((number, rest[0]))
                elif number > self.finished:
                    self.stopped.add(number)
                ready = self.connection.poll()
        except (EOFError, OSError) as error:
            raise ConsumerGone from error

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the consumer; a closed connection raises `ConsumerGone`."""
        try:
            self.connection.send(message)
        except OSError as error:
            raise ConsumerGone from error

    def next_order(self) -> tuple[int, bytes]:
        while not self.orders:
            self.read(WAKE_SECONDS)
        return self.orders.popleft()

    def taken(self, number: int) -> int:
        """The batches of run ``number`` the consumer took."""
        value = self.board.value
        return value & 0xFFFFFFFF if value >> 32 == number else 0


def served(consumer: Any, board: int, prepared: dict[str, Any]) -> None:
    """A `Child`'s work (`outcore.iterate.child.BOOT`): `serve` with the mailbox folder and shares it was told,
    its board the memory of file descriptor ``board``."""
    folder, shares = prepared["outcore"]
    serve(consumer, folder, shared_board(board), shares)


def serve(connection: Any, folder: str, board: Any, shares: int = 1) -> None:
    """The loader process, one of ``shares`` making batches together (its part of the CPUs): each run the
    consumer orders, one after the other, made into the mailbox ``folder`` (`make`), until the consumer closes
    the connection; the consumer says on ``board`` what it took (`LoaderProcess.taken`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the consumer's to handle: it closes the process
    share_cpus(shares)
    raised = Raised()
    warnings.simplefilter("always")  # each one goes to the consumer, whose filters say which are shown
    warnings.showwarning = raised.show
    inbox, opened = Inbox(connection, board), Opened()
    with contextlib.suppress(ConsumerGone):  # the consumer closed the connection: the process ends
        inbox.send(("started", -1))
        begun = None  # the next run, begun as the one before drained
        while True:
            number, sent = inbox.next_order()
            begun = make(inbox, number, sent, Slot(folder), opened, raised, begun)


class Raised:
    """The warnings raised in the loader process (its `warnings.showwarning`), kept by the thread that raised them
    until sent with a batch (`take`): a run's producer thread's with that run's batches (the next run, begun
    ahead, leaves out a damaged chunk of its epoch while this one's batches are sent), any other thread's with
    the next batch sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_thread: dict[threading.Thread, list[tuple[str, type[Warning]]]] = {}

    def show(self, message: Warning | str, category: type[Warning], *_: Any) -> None:
        with self.lock:
            self.by_thread.setdefault(threading.current_thread(), []).append((str(message), category))

    def take(self, ahead: Making | None) -> list[tuple[str, type[Warning]]]:
        """The warnings raised since the last taken, but those of the run begun ``ahead`` (kept for its batches)."""
        with self.lock:
            kept = self.by_thread.pop(ahead.run.thread, None) if ahead is not None else None
            taken = [warning for raised in self.by_thread.values() for warning in raised]
            self.by_thread = {ahead.run.thread: kept} if ahead is not None and kept else {}
        return taken

    def drop(self, run: Making) -> None:
        """The warnings of ``run``'s producer thread not sent (it ended, or was stopped, unsent) are dropped."""
        with self.lock:
            self.by_thread.pop(run.run.thread, None)


class Opened:
    """The store the process opened last, and its fields' chunk readers and buffers: kept from one run to the next."""

    def __init__(self) -> None:
        self.key: bytes | None = None
        self.store: Store | None = None
        self.buffers: dict[tuple[str, ...], ChunkBuffers] = {}

    def open(self, opener: Callable[[], Store]) -> Store:
        """The store ``opener`` opens: the one opened last, if it was opened so."""
        key = pickle.dumps(opener)
        if key != self.key or self.store is None:
            self.key, self.store, self.buffers = key, opener(), {}
        return self.store

    def buffers_of(self, fields: Sequence[str]) -> ChunkBuffers:
        """The readers and buffers of ``fields`` of the store opened last."""
        names = tuple(fields)
        if names not in self.buffers:
            assert self.store is not None
            self.buffers[names] = ChunkBuffers(chunk_readers(self.store, names))
        return self.buffers[names]


@dataclass
class Making:
    """Run ``number`` of the process under way (`making`): its order, its plan, the `LocalRun` making its batches,
    and the arenas of those made and not sent."""

    number: int
    order: Order
    plan: EpochPlan
    run: LocalRun
    arenas: dict[int, Arena]

    def close(self) -> None:
        """Stop the run; the batches being made into their files are done before those are freed."""
        self.run.close()
        for task in list(self.run.made):
            task.wait()
        for arena in self.arenas.values():  # made and not sent
            arena.discard()


def making(number: int, order_sent: bytes, slot: Slot, opened: Opened) -> Making:
    """Run ``number`` begun: its order loaded, its store opened (the one opened last, if the same), its batches
    made into ``slot``'s files by a `LocalRun` on this process's threads."""
    order = _order(order_sent)
    options, parts = order.options, order.part[1] > 1
    store = opened.open(order.opener)
    made = recipe(store, options.fields or store.fields, options.transform, options.decode)
    plan = options.plan(len(store), store.chunk_size, order.epoch, order.part)
    arenas: dict[int, Arena] = {}

    def allocate(step: int) -> Any:
        part = Part(f"{order.files}-s{step}", *plan.placement(step)) if parts else None
        arenas[step] = arena = slot.arena(part)
        return arena.empty

    steps = plan.with_samples(order.steps) if parts else order.steps  # a part may have none at the last step
    work = Work(store, made, dataclasses.replace(options, prefetch=1), order.epoch, plan, steps, allocate)
    return Making(number, order, plan, LocalRun(work, LoaderStats(), opened.buffers_of(made.fields)), arenas)


def make(inbox: Inbox, number: int, order_sent: bytes, slot: Slot, opened: Opened, raised: Raised,
         begun: Making | None = None) -> Making | None:
    """Run ``number`` (``begun`` ahead, where it is that run): its batches made into ``slot``'s files, each sent
    (its step, samples, files, the warnings raised meanwhile and the chunks left out so far) once the consumer has
    taken one of the ``prefetch`` sent before; then ``done``, or its error (with the traceback). Stops early where
    the consumer stops the run. Once its batches are all under way, the next run the consumer ordered is begun
    (its first batches made as this one's last wait for the consumer) and returned, for the next call to go on
    with; None where none was ordered yet (or it could not begin: its own call says why)."""
    current = ahead = None
    try:
        current = begun if begun is not None and begun.number == number else making(number, order_sent, slot, opened)
        order, plan, run = current.order, current.plan, current.run
        options, parts = order.options, order.part[1] > 1
        batches = iter(run)
        for sent, step in enumerate(order.steps):
            batch = next(batches) if not parts or plan.pieces(step) else None
            inbox.read()
            if ahead is None and run.under_way.is_set() and inbox.orders:
                ahead = _ahead(inbox, slot, opened)
            while sent - inbox.taken(number) >= options.prefetch and number not in inbox.stopped:
                inbox.read(CREDIT_SECONDS)  # the consumer holds `prefetch` batches not taken: look again soon
            if number in inbox.stopped:
                return ahead
            samples = plan.step(step)[0].astype(np.int64, copy=False).tobytes()
            shared = SharedBatch({}) if batch is None else current.arenas.pop(step).publish(batch)
            inbox.send(("batch", number, step, samples, packed(shared), raised.take(ahead), run.stats.damaged))
        inbox.send(("done", number))
    except ConsumerGone:
        if ahead is not None:
            ahead.close()
        raise
    except IterationClosedError:
        return ahead
    except BaseException as error:  # noqa: BLE001 - every failure goes to the consumer, which raises it
        _send_failure(inbox, number, error)
    finally:
        inbox.finished = number
        inbox.stopped.discard(number)
        if current is not None:
            current.close()
            raised.drop(current)
        if begun is not None and begun is not current:  # begun for another run: never, the orders come in turn
            begun.close()
            raised.drop(begun)
    return ahead


def _ahead(inbox: Inbox, slot: Slot, opened: Opened) -> Making | None:
    """The next run ordered, begun now (None where it was stopped already, or fails to begin: its turn begins it
    again, and sends what that raises)."""
    number, sent = inbox.orders[0]
    if number in inbox.stopped:
        return None
    try:
        return making(number, sent, slot, opened)
    except Exception:  # noqa: BLE001 - said in its turn
        return None


def _order(sent: bytes) -> Order:
    """The order the consumer sent; one that does not load here (a module it names that this process cannot
    import) is an `OptionError` saying what to do."""
    try:
        return pickle.loads(sent)
    except Exception as error:  # noqa: BLE001 - whatever loading raises, the message says what to do
        raise OptionError(
            f"the process making the batches could not load the options ({type(error).__name__}: {error}): it "
            "imports the modules they name (the transform's) with the consumer's sys.path and working directory; "
            "make the module importable there, or leave process= out"
        ) from None


def _send_failure(inbox: Inbox, number: int, error: BaseException) -> None:
    """Send ``error`` and its traceback; an error that does not travel (it does not pickle and unpickle as
    it is) goes as an `OutcoreError` that names it."""
    trace = traceback.format_exc()
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - whatever stops it travelling, its name and message still do
        error = OutcoreError(f"{type(error).__name__}: {error}")
    inbox.send(("failed", number, error, trace))
