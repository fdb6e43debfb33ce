"""Runs: one pass over some of an epoch's batches (its ``steps``), made by a producer thread and handed to
the consumer through a queue of ``prefetch`` batches. `LocalRun` makes them in this process; `ClusterRun`
(`outcore.iterate.cluster`) on a Dask cluster. Both follow the same schedule (`outcore.iterate.schedule`)
and make each batch with `outcore.iterate.batch.make_batch`: one path, whether the batches are iterated,
resumed or asked for one by one.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import queue
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import CorruptChunkError, IterationClosedError, OutcoreWarning, StorageError
from ..storage import ShardReader, Store
from ..threads import submit, thread_count
from ..threads.handoff import Handoff
from ..threads.task import Task
from .batch import Batch, Draws, Empty, Recipe, batch_draws, make_batch, plain
from .options import BatchOptions
from .plan import EpochPlan, next_use
from .readers import BatchReader, sample_bytes, sample_spec
from .schedule import BatchStep, schedule
from .stats import LoaderStats

Loaded = tuple[dict[str, Any], list[np.ndarray]]  # a chunk's values by field, and the buffers they are in (`ChunkBuffers`)
WAKE_SECONDS = 0.05  # how often a blocked consumer or producer looks whether its run was closed
EXIT_SECONDS = 2.0  # the longest the interpreter's exit waits for the producers to stop
UNTAKEN_SECONDS = 60.0  # a run started ahead (`NextEpoch`) of which no batch is taken lets go of it all then


@dataclass(frozen=True)
class Work:
    """What a run makes: the rank's batches ``steps`` (increasing) of ``plan``, epoch ``epoch``, as
    ``recipe`` says; ``allocator`` gives, for a step, what makes its batch's arrays (without, ``empty`` makes
    every batch's, whatever its step: `plain` memory, or pinned memory for a GPU)."""

    store: Store
    recipe: Recipe
    options: BatchOptions
    epoch: int
    plan: EpochPlan
    batches: Sequence[int]
    allocator: Callable[[int], Empty] | None = None
    empty: Empty = plain

    def steps(self, read_ahead: int, fetch_ahead: Callable[[], int] | None = None) -> Iterator[BatchStep]:
        return schedule(self.plan, self.batches, read_ahead=read_ahead, fetch_ahead=fetch_ahead,
                        fetch_grain=self.store.chunks_per_shard)

    def draws(self, step: BatchStep) -> Draws:
        """The pieces of ``step``'s batch and their augmentation generators' keys: the same wherever it is made."""
        return batch_draws(self.options.seed, self.epoch, step.index, step.pieces)


_producing: weakref.WeakSet[Run] = weakref.WeakSet()  # runs whose producer may still be running


@atexit.register
def _stop_producers() -> None:
    """Stop every producer before the interpreter finalizes. A daemon thread still running then is ended
    where it next takes the GIL, which may be deep in a codec's or numpy's native code: glibc unwinds
    it, and a C++ frame on the way can abort the whole process (SIGABRT at exit, rarely). What they used is
    freed as `Run.close` frees it (the shared-memory folders of cluster runs)."""
    runs = [run for run in _producing if not run.stop.is_set()]  # the others were closed, or are being closed
    for run in runs:
        run.stop.set()
    deadline = time.monotonic() + EXIT_SECONDS
    for run in runs:
        run.thread.join(max(0.0, deadline - time.monotonic()))
    for run in runs:
        run._release()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class Run:
    """A producer thread that makes the batches (`_produce_batches`, by a subclass) and a queue of
    ``prefetch`` finished batches that the consumer takes them from. Closing the run stops the
    producer; a consumer waiting for a batch of a closed run gets `IterationClosedError` at once."""

    threads_here = False  # whether its batches are made on this process's threads (stopped before a fork, untaken)
    hands_over = True  # whether its thread hands each batch over (`_put`): it lets go of them when none is taken

    def __init__(self, work: Work, stats: LoaderStats) -> None:
        self.work, self.stats = work, stats
        self.queue = Handoff(work.options.prefetch)
        self.stop = threading.Event()
        self.under_way = threading.Event()  # set once all its batches are asked for (of the pool, or elsewhere)
        self.untaken: float | None = None  # a run started ahead: the seconds it waits for its first batch's taker
        self.claimed = threading.Lock()  # held to claim it (`claim`) or to let it go untaken
        self.delivered = 0
        self.thread = threading.Thread(target=self._produce, name="outcore-batches", daemon=True)
        _producing.add(self)
        self.thread.start()

    def __iter__(self) -> Iterator[Batch]:
        while True:
            began = time.perf_counter()
            ready = self.queue.qsize()
            item = self._take()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            self.delivered += 1
            self.stats.record(time.perf_counter() - began, ready, len(next(iter(item.values()))))
            yield item

    def _take(self) -> Any:
        while True:
            try:
                return self.queue.get(timeout=WAKE_SECONDS)
            except queue.Empty:
                if self.stop.is_set():
                    raise closed(self.work, self.delivered) from None

    def samples(self, step: int) -> np.ndarray:
        """The store's indices of the samples of batch ``step``, found in the spans the producer planned last."""
        return self.work.plan.step(step)[0]

    def close(self) -> None:
        """Stop the producer and free what it used. At interpreter exit the threads are frozen, not stopped
        (Python 3.13 finalizes an unfinished generator after that): nothing is waited for then. Closing a
        run that is closed, or being closed by another thread, returns at once."""
        if self.stop.is_set():
            return
        self.stop.set()
        self._stopped()

    def _stopped(self) -> None:
        """Wait for the producer, stopped, to end, and free what it made and used."""
        while self.thread.is_alive() and not sys.is_finalizing() and self.thread is not threading.current_thread():
            try:  # unblock a producer waiting for room in the queue
                self.queue.get(timeout=WAKE_SECONDS)
            except queue.Empty:
                pass
        with contextlib.suppress(queue.Empty):  # the batches it made that no one will take: their memory freed
            while self.queue.qsize():
                self.queue.get(timeout=0)
        self._release()

    def _stop_untaken(self, waited: float = float("inf")) -> bool:
        """Stop this run if it was started ahead and no one has taken it (and it has waited its `untaken` seconds,
        when ``waited`` says how long): whether it did. A claim after that fails."""
        with self.claimed:
            untaken = (self.untaken is not None and not self.delivered and not self.stop.is_set()
                       and waited >= self.untaken)
            if untaken:
                self.stop.set()
        return untaken

    def claim(self) -> bool:
        """Take this run started ahead for the consumer: whether it is still running (it closes itself after
        `untaken` seconds waiting with no batch taken, and no longer once claimed)."""
        with self.claimed:
            self.untaken = None
            return not self.stop.is_set()

    def _put(self, item: Any) -> bool:
        waited = 0.0
        while not self.stop.is_set():
            if self.queue.put(item, timeout=WAKE_SECONDS):
                return True
            waited += WAKE_SECONDS
            if self._stop_untaken(waited):  # started ahead and never taken from (an iterator kept, its training over)
                self._stopped()
        return False

    def _produce(self) -> None:
        try:
            self._produce_batches()
            self._put(_DONE)
        except BaseException as error:  # noqa: BLE001 - any failure must reach the consumer, which raises it
            self._put(_Failure(error))

    def _produce_batches(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the producer used, once it has stopped."""


def closed(work: Work, delivered: int) -> IterationClosedError:
    """The error of a consumer that waited for the batch after its ``delivered`` first of ``work`` when the run
    was closed."""
    return IterationClosedError(
        f"the iteration was closed (close(), or a new iter() of the same iterator) while batch "
        f"{work.batches[delivered]} of epoch {work.epoch} was awaited; iterate again to continue from there "
        "(state_dict() says where)"
    )


class NextEpoch:
    """The run of the next epoch, started while the run of this one drains: once its last batches are asked
    for (of the pool's threads, or a cluster's workers), threads and workers that finish theirs would wait for
    the consumer to start the next epoch, and the next epoch's first batch would wait for its first reads (with
    short epochs, a large share of each: a training step waits at every epoch's start). `handed` starts it
    then, its reads and batches queued behind this run's (for a while two runs' batches are held: twice a
    run's memory at most); `take` hands it to the next iteration if it is that epoch's, from its first batch,
    and closes it otherwise. Only from its owner's second epoch on: a single pass (a prediction) never makes
    batches it will not use. Closed with its owner.

    >>> ahead = NextEpoch()  # doctest: +SKIP
    >>> ahead.handed(run, last, lambda: iterator.run(epoch + 1, range(len(iterator))))  # doctest: +SKIP
    >>> ahead.take(epoch + 1, range(len(iterator))) or iterator.run(...)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._held: list[Run] = []
        self._lock = threading.Lock()  # held to take the run held, or to close it untaken (`_close_untaken`)
        self._timers: list[threading.Timer] = []  # the one closing a loader process's run if no one takes it
        self._epochs_done = 0  # epochs whose last batch was handed out
        weakref.finalize(self, _close_held, self._held, self._lock, self._timers)

    def handed(self, current: Run, last: bool, start: Callable[[], Run]) -> None:
        """A batch of ``current`` was handed out (``last``: its epoch's last; Keras and Lightning ask no
        further): from the second epoch on, start the next epoch's run with ``start()`` once ``current`` has
        all its batches under way, if none was started yet. A run that no one takes a batch of within
        `UNTAKEN_SECONDS` (an iterator kept after its last epoch: TensorFlow's generators keep theirs) lets go of
        what it made: one of this process's threads stops itself, one that loader processes make is closed by a
        timer (its processes may then end, idle); the next iteration then starts that epoch anew."""
        if self._epochs_done and not self._held and current.under_way.is_set() and not current.stop.is_set():
            run = start()
            run.untaken = UNTAKEN_SECONDS
            with self._lock:
                self._held.append(run)
            _started_ahead.add(run)
            if not isinstance(run, Run) or not run.hands_over:  # no thread of its own here waits for its taker
                timer = threading.Timer(UNTAKEN_SECONDS, _close_untaken, (self._held, self._lock, run))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()
        self._epochs_done += last

    def take(self, epoch: int, steps: Sequence[int]) -> Run | None:
        """The run started for ``epoch`` if it makes exactly ``steps`` and still runs; None (and that run closed)
        otherwise."""
        with self._lock:
            if not self._held:
                return None
            run = self._held.pop()
            _cancel(self._timers)
        if run.work.epoch == epoch and list(run.work.batches) == list(steps) and _claimed(run):
            return run
        run.close()
        return None

    def close(self) -> None:
        _close_held(self._held, self._lock, self._timers)


_started_ahead: weakref.WeakSet[Any] = weakref.WeakSet()  # runs `NextEpoch` started, claimed or not


def _close_untaken_before_fork() -> None:
    """A process forked (DataLoader workers, say) while a run started ahead works on this process's threads copies
    the locks they hold: the local runs no one has taken are stopped first (the epoch, when asked for, starts
    anew)."""
    for run in list(_started_ahead):
        if isinstance(run, Run) and run.threads_here and run._stop_untaken():
            run._stopped()


with contextlib.suppress(AttributeError):  # os.register_at_fork: POSIX only
    os.register_at_fork(before=_close_untaken_before_fork)


def _claimed(run: Any) -> bool:
    """Whether ``run``, started ahead, is taken for the consumer: a run of this process's threads is unless it let
    go of its batches first (`Run.claim`); one made elsewhere (a loader process's) unless it was closed."""
    return run.claim() if isinstance(run, Run) else not run.stop.is_set()


def _close_held(held: list[Run], lock: threading.Lock, timers: list[threading.Timer]) -> None:
    """Close the runs ``held`` ahead, and cancel the ``timers`` that would close them untaken."""
    with lock:
        runs = held[:]
        held.clear()
        _cancel(timers)
    for run in runs:
        run.close()


def _close_untaken(held: list[Run], lock: threading.Lock, run: Run) -> None:
    """Close ``run``, started ahead, if it is still ``held``: no one took it within `UNTAKEN_SECONDS`."""
    with lock:
        if not any(each is run for each in held):
            return
        held.remove(run)
    run.close()


def _cancel(timers: list[threading.Timer]) -> None:
    while timers:
        timers.pop().cancel()


class _Field(NamedTuple):
    """How a read task reads a field's chunk (`ChunkBuffers.read_many`): its ``reader``'s shard reads, which one C
    call may make with the other fields' (`ShardReader.read_vouched`), into buffers ``low:high`` of a chunk's, made
    into its value by ``value`` (None: a field of stored values, whose chunk is its one read's samples); where that
    call did not vouch for them, its reader reads the chunk into its own buffer, the first."""

    name: str
    reader: BatchReader
    low: int
    high: int
    value: Callable[[int, Sequence[np.ndarray]], Any] | None


class ChunkBuffers:
    """The buffers chunks of the fields ``readers`` read are read into: a chunk's (`take`) one for each shard read
    of its fields (a stored field's values; an encoded or ragged field's bytes, ranges and shapes), taken to read a
    chunk into and given back when the schedule releases that chunk. Batches never share memory with
    them. An iterator keeps its buffers as long as itself, for each run (an epoch, or what is left of one) to read
    into those the runs before freed: it holds as many as a run held at most."""

    def __init__(self, readers: dict[str, BatchReader]) -> None:
        self.readers = readers
        self.sources: list[ShardReader] = []  # the shard reads of a chunk, each making its buffer (`empty`)
        self.fields: list[_Field] = []
        for name, reader in readers.items():
            sources, value = ((reader,), None) if isinstance(reader, ShardReader) else (reader.sources, reader.of_parts)
            self.fields.append(_Field(name, reader, len(self.sources), len(self.sources) + len(sources), value))
            self.sources.extend(sources)
        self.free: list[list[np.ndarray]] = []
        self.blocks: list[np.ndarray] = []  # lent to C runs (`lend`) and taken back
        self.most_held = 0  # the most blocks a C run held
        self.sets: dict[Hashable, list[tuple[np.ndarray, ...]]] = {}  # C runs' batch arrays used again (`batch_sets`)
        self.lock = threading.Lock()

    def take(self, count: int) -> list[list[np.ndarray]]:
        """``count`` chunks' buffers: freed ones, the last freed first, then new ones."""
        with self.lock:
            free = self.free
            kept = min(count, len(free))
            taken = free[len(free) - kept :][::-1]
            del free[len(free) - kept :]
        return taken + [[source.empty() for source in self.sources] for _ in range(count - kept)]

    def give(self, *buffers: list[np.ndarray]) -> None:
        """Take back chunks' buffers (`take`'s), once no batch needs what was read into them."""
        with self.lock:
            self.free.extend(buffers)

    def let_go(self) -> None:
        """Keep no free buffer (the batches are made elsewhere from now on); new ones are made when needed."""
        with self.lock:
            self.free = []
            self.blocks, self.most_held, self.sets = [], 0, {}

    def lend(self, nbytes: int) -> list[np.ndarray]:
        """Blocks of ``nbytes`` for a C run's slots (`outcore.iterate.native_run`): as many as a run held at most
        (`take_back`), freed ones first (their pages faulted in once), none before the first run (which makes its
        own); `take_back` them once it has stopped."""
        with self.lock:
            count = self.most_held
            kept = [block for block in self.blocks if len(block) == nbytes]
            self.blocks = [block for block in self.blocks if len(block) != nbytes] + kept[count:]
        return kept[:count] + [np.empty(nbytes, np.uint8) for _ in range(count - len(kept))]

    def take_back(self, lent: list[np.ndarray], most_held: int) -> None:
        """Take back the blocks `lend` lent to a run that held ``most_held`` at most, once no thread reads or writes
        them: the next run is lent as many as a run held."""
        with self.lock:
            self.blocks.extend(lent)
            self.most_held = max(self.most_held, most_held)

    def batch_sets(self, kind: Hashable) -> list[tuple[np.ndarray, ...]]:
        """The sets of a batch's arrays of ``kind`` (each field's shape and dtype, a batch's rows) that C runs use again
        (`outcore.iterate.native_run`): a set nothing else refers to, nor to its arrays, is given to the next batch
        (never one held by the consumer, or a view of it). One list a kind, kept as long as the iterator."""
        with self.lock:
            return self.sets.setdefault(kind, [])

    def read(self, chunk: int) -> Loaded:
        """Chunk ``chunk`` of every field, read into buffers taken here: ``(values, buffers)`` (`read_many`); `give`
        the buffers back once no batch needs the values."""
        (got,) = self.read_many([chunk])
        if isinstance(got, Exception):
            raise got
        return got

    def read_many(self, chunks: Sequence[int]) -> list[Loaded | Exception]:
        """Chunks ``chunks`` of every field, each read into buffers taken here, the shard reads of them all in one C
        call where they can be (`ShardReader.read_vouched`: a stored field's, an encoded field's bytes, ranges and
        shapes, a ragged or raster field's rows, ranges and shapes), a chunk the call did not vouch for by each field's
        reader: for each chunk ``(values, buffers)``, or the error its read raised (a damaged chunk, named: the others
        are read all the same); `give` the buffers back once no batch needs the values."""
        taken = self.take(len(chunks))
        sources = self.sources
        vouched = ShardReader.read_vouched([(source, chunk, buffer) for chunk, buffers in zip(chunks, taken, strict=True)
                                            for source, buffer in zip(sources, buffers, strict=True)])
        width = len(sources)
        unread = {k // width for k, part in enumerate(vouched) if part is None}  # chunks with a read not vouched for
        read: list[Loaded | Exception] = []
        for k, (chunk, buffers) in enumerate(zip(chunks, taken, strict=True)):
            got = vouched[k * width : (k + 1) * width]
            try:
                read.append((self._values(chunk, got) if k not in unread else self._read_each(chunk, buffers, got),
                             buffers))
            except Exception as error:  # noqa: BLE001 - raised by whoever takes this chunk's values
                read.append(error)
        return read

    def _values(self, chunk: int, got: list[np.ndarray]) -> dict[str, Any]:
        """The chunk's values from its shard reads ``got``, all read."""
        return {name: got[low] if value is None else value(chunk, got[low:high])
                for name, _, low, high, value in self.fields}

    def _read_each(self, chunk: int, buffers: list[np.ndarray], got: list[np.ndarray | None]) -> dict[str, Any]:
        """The chunk's values where one of its shard reads was not vouched for (``got``: None): each field's made from
        its reads as read, or read by its reader into its own buffer where one was not."""
        return {name: reader.read(chunk, out=buffers[low]) if any(part is None for part in got[low:high])
                else got[low] if value is None else value(chunk, got[low:high])
                for name, reader, low, high, value in self.fields}


class Loading:
    """A chunk being read by a task that reads a few (`ChunkBuffers.read_many`): `result` is its ``(values,
    buffers)``, or raises what its read raised; `cancel` cancels the task (the other chunks' too)."""

    __slots__ = ("index", "task")

    def __init__(self, task: Task[list[Loaded | Exception]], index: int) -> None:
        self.task, self.index = task, index

    def result(self) -> Loaded:
        got = self.task.result()[self.index]
        if isinstance(got, Exception):
            raise got
        return got

    def cancel(self) -> bool:
        return self.task.cancel()


class LocalRun(Run):
    """Batches made in this process, on the process's thread pool (`outcore.threads`): chunk reads and
    decodes, and each batch (its samples gathered, decoded, cut and transformed by runs of samples on
    the pool's free threads: `outcore.threads.for_each_run`), up to `making` tasks at once, handed to
    the queue in order by the producer thread, which follows the schedule. Chunks are read into ``buffers``
    (its iterator's: an epoch reads into those the last freed). Reads run ``read_ahead``
    slots ahead of the batch being made: one per pool thread, so every thread has a chunk to read, from
    2 to `MAX_READ_AHEAD` (memory: each is a chunk held); local reads (decompression, mostly) count
    against the pool's limit of busy threads, an object store's (which wait on the network) do not. From an object store, reads run
    `REMOTE_READ_AHEAD` slots ahead (answers arrive out of order: a thread waiting on a late one leaves
    the later ones to the other threads), and the slots' stored
    bytes are fetched on the I/O threads further ahead still, as many slots as hide the measured latency
    (`outcore.storage.RemoteFiles.fetch_ahead`), so that requests are in flight while the CPU threads
    decode.

    A batch's task is asked for after the reads of the chunks it draws on, and takes their values itself: the
    producer never waits for a read (each wait is a hand-over between threads, tens of microseconds of CPU on
    either side). The pool starts tasks in the order asked (`outcore.threads.pool.Pool`), so a batch's task that
    finds a read not ended waits only for one under way on another thread; the pool runs no more tasks at once
    than run well (`outcore.threads.pool.Gauge`). The chunks a batch is the last to use are released once it is
    made and the chunks of the batch `making` tasks later are asked for (batches are handed over in order, in step
    with the schedule: the same chunks are read however fast each is made), so at most `making` tasks' batches
    more than one task's are held besides the queue's.

    Consecutive batches of a few megabytes are made ``together`` by one task (up to `MOST_TOGETHER` of them,
    about `TOGETHER_BYTES` in all, no more than the batches made at once) as one, then cut apart, where the
    recipe allows it (`Recipe.joinable`: each batch's rows the same either way) and the batches' memory is
    the same whatever their step (`Work.empty`): what a batch costs holding the GIL (its task, its samples' arrays and runs made ready, its draws'
    call) is then paid once for them all, and as many batches are held as when each is made alone. Each
    batch is a view of its part of the arrays made together, which stay in memory while any of them is held."""

    threads_here = True
    MAX_READ_AHEAD = 8
    READ_TOGETHER = 2  # chunks a read task reads, in one C call where it can: a batch's, mostly (its task's GIL
    # hand-overs paid once for them); no more, so that the many chunks of a run's first steps are read in parallel
    REMOTE_READ_AHEAD = 16  # answers come out of order: a thread waiting on a late one leaves later ones to others
    MAKING_BYTES = 256 << 20  # batches made at once hold at most about this much (two at least)
    TOGETHER_BYTES = 64 << 20  # batches made as one hold at most about this much
    MOST_TOGETHER = 4

    def __init__(self, work: Work, stats: LoaderStats, buffers: ChunkBuffers) -> None:
        self.buffers, self.readers = buffers, buffers.readers
        self.loading: dict[int, Loading] = {}  # by chunk
        self.values: dict[int, dict[str, Any] | None] = {}  # by chunk: its values once a batch took them (`_values`)
        self.chunk_of: list[int] = work.plan.chunks.tolist()  # each slot's chunk
        self.damaged: set[int] = set()  # chunks left out of this epoch (``skip_damaged``)
        self.finding = threading.Lock()  # held to find a chunk's values from its read (`_values`): by batches' tasks
        self.slots_held: dict[int, int] = {}  # chunk -> its slots loaded and not released (two streams may share it)
        self.made: deque[Task[list[Batch]]] = deque()  # batches being made or not yet handed over, in order
        self.remote = any(reader.remote for reader in self.readers.values())
        one_batch = len(work.batches) == 1
        threads = thread_count()
        self.read_ahead = 0 if one_batch else self.REMOTE_READ_AHEAD if self.remote else self.local_read_ahead(threads)
        batch_bytes = max(1, sample_bytes(work.store, work.recipe) * work.options.batch_size)
        making = self.made_at_once(work, threads)
        joinable = work.recipe.joinable and work.allocator is None and not work.options.skip_damaged
        self.together = max(1, min(making, self.MOST_TOGETHER, self.TOGETHER_BYTES // batch_bytes)) \
            if joinable and not one_batch else 1
        self.making = making // self.together  # tasks making them: as many batches held either way
        files = getattr(work.store.group.store, "files", None)  # an object store's (RemoteFiles)
        self.fetch_ahead = files.fetch_ahead if self.remote and files is not None and not one_batch else None
        self.next_use = None  # from an object store: when each chunk is read again, for the node's cache
        if self.remote:
            options = work.options
            self.next_use = next_use(work.store.num_chunks, shuffle=options.shuffle, seed=options.seed,
                                     epoch=work.epoch, consumers=work.plan.layout.streams)
        super().__init__(work, stats)

    @classmethod
    def local_read_ahead(cls, threads: int) -> int:
        """The slots read ahead from local files on ``threads`` threads: one a thread, from 2 to `MAX_READ_AHEAD`."""
        return min(cls.MAX_READ_AHEAD, max(2, threads))

    @classmethod
    def made_at_once(cls, work: Work, threads: int) -> int:
        """The batches of ``work`` made at once on ``threads`` threads: one a thread, two at least, about
        `MAKING_BYTES` in all."""
        batch_bytes = max(1, sample_bytes(work.store, work.recipe) * work.options.batch_size)
        return max(2, min(threads, cls.MAKING_BYTES // batch_bytes))

    def _release(self) -> None:
        for future in [*self.loading.values(), *self.made]:  # those not started yet
            future.cancel()
        self.loading.clear()
        self.values.clear()
        self.made.clear()  # batches made and not handed over: freed (those under way, once made)

    def _produce_batches(self) -> None:
        work = self.work
        made = self.made
        held: deque[tuple[list[BatchStep], Task[list[Batch]]]] = deque()  # steps whose chunks their batches may need
        together: list[BatchStep] = []  # the steps whose batches are made next, as one
        for step in work.steps(self.read_ahead, self.fetch_ahead):
            if self.stop.is_set() or not self._hand_over(made, wait=False):
                return
            fetch = step.fetch if self.fetch_ahead is not None else step.load if self.remote else ()
            if fetch:  # asked for now, chunks stored back to back in one request
                self._prefetch(list(dict.fromkeys(self.chunk_of[slot] for slot in fetch)))
            loads = [self.chunk_of[slot] for slot in step.load]
            self._load([chunk for chunk in dict.fromkeys(loads) if chunk not in self.loading])
            for chunk in loads:
                self.slots_held[chunk] = self.slots_held.get(chunk, 0) + 1
            together.append(step)
            if len(together) == self.together:
                self._start_making(together, held)
                together = []
        if together:
            self._start_making(together, held)
        self.under_way.set()  # every batch asked of the pool: the next epoch's run may start (`NextEpoch`)
        if self._hand_over(made, wait=True):  # each batch as soon as it is made, then the last ones' chunks
            while held:  # given back: their buffers for the next run
                self._release_steps(*held.popleft())

    def _start_making(self, steps: list[BatchStep], held: deque[tuple[list[BatchStep], Task[list[Batch]]]]) -> None:
        """Have the batches of ``steps`` made once the chunks they draw on are read, and release the chunks of the
        batches made `making` tasks before."""
        chunk_of = self.chunk_of
        used = [(slot, chunk_of[slot]) for slot in dict.fromkeys(itertools.chain.from_iterable(step.used for step in steps))]
        if self.work.options.skip_damaged:  # which chunks are left out is decided here, in the schedule's order, and
            for _, chunk in used:  # said on this thread (a loader process sends each run's thread's warnings with
                self._values(chunk)  # that run's batches); without, a damaged chunk is an error wherever it is met
        making = submit(self._make, steps, used)
        self.made.append(making)
        held.append((steps, making))
        if len(held) > self.making:  # in step with the schedule: the same reads however fast batches are made
            self._release_steps(*held.popleft())

    def _hand_over(self, made: deque[Task[list[Batch]]], wait: bool) -> bool:
        """Put the batches made, in order, in the queue (with ``wait``, every one, waiting for each): False when
        the run was closed meanwhile."""
        while made and (wait or made[0].done()):
            for batch in made.popleft().result():
                if not self._put(batch):
                    return False
        return True

    def _release_steps(self, steps: list[BatchStep], making: Task[list[Batch]]) -> None:
        """Release the chunks the batches of ``steps`` were the last to use, once they are made."""
        making.wait()
        held, freed = self.slots_held, []
        for slot in itertools.chain.from_iterable(step.release for step in steps):
            chunk = self.chunk_of[slot]
            held[chunk] -= 1
            if not held[chunk]:
                del held[chunk]
                self.values.pop(chunk, None)
                loaded = self.loading.pop(chunk)
                if chunk not in self.damaged:
                    freed.append(loaded.result()[1])
        if freed:
            self.buffers.give(*freed)

    def _data(self, used: list[tuple[int, int]]) -> dict[int, dict[str, Any]]:
        """The values of the chunks ``used`` (``(slot, chunk)`` each) by slot, once read (`_values`; not the damaged
        chunks left out): those found already taken without a call each."""
        data, values = {}, self.values
        for slot, chunk in used:
            found = values.get(chunk, self)  # a dict's read holds no lock
            if found is self:
                found = self._values(chunk)
            if found is not None:
                data[slot] = found
        return data

    def _values(self, chunk: int) -> dict[str, Any] | None:
        """The chunk's values once read, or None for a damaged chunk left out (``skip_damaged``: named in a
        warning, counted in the stats, up to that many an epoch); found once while it is held, by whichever batch's
        task asks first."""
        values = self.values.get(chunk, self)  # a dict's read holds no lock
        if values is not self:
            return values
        self.loading[chunk].task.wait()  # outside the lock: another chunk's values may be found meanwhile
        with self.finding:
            if chunk not in self.values:
                self.values[chunk] = self._found(chunk)
            return self.values[chunk]

    def _found(self, chunk: int) -> dict[str, Any] | None:
        """The chunk's values as its read gave them, or None for a damaged chunk left out (`_values`, holding
        `finding`)."""
        try:
            return self.loading[chunk].result()[0]
        except (CorruptChunkError, StorageError) as error:
            if chunk in self.damaged:
                return None
            if len(self.damaged) >= self.work.options.skip_damaged:
                raise
            self.damaged.add(chunk)
            self.stats.damaged += 1
            warnings.warn(f"left out chunk {chunk} of this epoch ({len(self.damaged)} of skip_damaged="
                          f"{self.work.options.skip_damaged}): {error}", OutcoreWarning, stacklevel=3)
            return None

    def _make(self, steps: list[BatchStep], used: list[tuple[int, int]]) -> list[Batch]:
        """The batches of ``steps`` from the values of the chunks they use (``(slot, chunk)`` each), once read: one
        alone, or several made as one and cut apart (`together`)."""
        data = self._data(used)
        began = time.perf_counter()
        try:
            if len(steps) == 1:
                return [self._made(steps[0], data)]
            draws = tuple([draw for step in steps for draw in self.work.draws(step)])  # each batch's pieces, in order
            batch = self._batch(np.concatenate([step.samples for step in steps]),
                                np.concatenate([step.slots for step in steps]), draws, self.work.empty, data)
            bounds = itertools.pairwise(itertools.accumulate((len(step.samples) for step in steps), initial=0))
            return [{name: values[low:high] for name, values in batch.items()} for low, high in bounds]
        finally:
            self.stats.made(time.perf_counter() - began)

    def _made(self, step: BatchStep, data: dict[int, dict[str, Any]]) -> Batch:
        """``step``'s batch: without the samples of the slots ``data`` lacks (damaged chunks left out), each
        augmentation piece then shorter by those."""
        work = self.work
        samples, slots, draws = step.samples, step.slots, work.draws(step)
        empty = work.empty if work.allocator is None else work.allocator(step.index)
        if len(data) < len(step.used):
            kept = np.isin(slots, list(data))
            bounds = np.cumsum([0, *(count for count, _ in draws)])
            draws = tuple((int(kept[low:high].sum()), key) for (_, key), low, high
                          in zip(draws, bounds[:-1], bounds[1:], strict=True) if kept[low:high].any())
            samples, slots = samples[kept], slots[kept]
            if not data:  # every sample of the batch was in damaged chunks: an empty batch, as it is
                return {name: np.empty((0, *shape), dtype) for name, (shape, dtype) in
                        ((name, sample_spec(work.store, name)) for name in work.recipe.fields)}
        return self._batch(samples, slots, draws, empty, data)

    def _batch(self, samples: np.ndarray, slots: np.ndarray, draws: Draws, empty: Empty,
               data: dict[int, dict[str, Any]]) -> Batch:
        """The batch of ``samples`` read from ``slots`` (their chunks' values in ``data``), augmented by ``draws``, its
        arrays made by ``empty``."""
        return make_batch(self.work.recipe, samples, self.work.store.chunk_size, slots, data, draws, empty,
                          self.stats.transformed)

    def _prefetch(self, chunks: list[int]) -> None:
        for reader in self.readers.values():
            reader.prefetch(chunks)

    def _load(self, chunks: list[int]) -> None:
        """Have ``chunks`` read, `READ_TOGETHER` a task (from an object store, one: answers come out of order)."""
        together = 1 if self.remote else self.READ_TOGETHER
        for first in range(0, len(chunks), together):
            some = chunks[first : first + together]
            task = submit(self._read, some, limited=not self.remote)
            for index, chunk in enumerate(some):
                self.loading[chunk] = Loading(task, index)

    def _read(self, chunks: list[int]) -> list[Loaded | Exception]:
        """Chunks ``chunks`` of every field, read into the run's buffers: each ``(values, buffers)``, or its read's
        error."""
        read = self.buffers.read_many(chunks)
        if self.next_use is not None:
            for chunk in chunks:
                for reader in self.readers.values():
                    reader.expect(chunk, float(self.next_use[chunk]))
        return read
