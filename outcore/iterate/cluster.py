"""Batches made on a Dask cluster: its workers read, decode, augment and assemble; the consumer only receives.

``ds.batches(..., client=client)`` cuts the rank's batches into **spans** of consecutive batches (up to
`SPAN_BYTES` of batches, at most `SPAN_SAMPLES` samples), one task each: the worker that runs it opens
the store itself (a path every worker sees, or an object-store URL, so the data is never sent from the
consumer), reads the chunks its batches draw on, following the batch schedule
(`outcore.iterate.schedule`), and makes them exactly as the local threads make batches (each piece's
transform generator seeded by ``(seed, epoch, step, stream)``): the batches are identical, pixel for
pixel.

From an object store, the batches are first cut into **lanes** (`Lanes`): one per worker thread of the
cluster, at most one per stream of the rank's epoch order. A lane makes its part of every batch: its
share of the rank's streams (`outcore.iterate.plan.part_streams`), so each stream's chunks are read by
one lane, in order, and its parts are cut into spans. A lane's spans go to one worker (where there are
as many lanes as threads), which keeps the chunks a span leaves for the lane's next span (`Carries`):
each chunk is asked for once an epoch. Cut into spans of whole batches, a chunk whose samples fall in
several spans (a stream's chunk feeds several batches) is read by each: several times the store per
epoch (`benchmarks/cluster.py` counts it). From a disk those reads come from the page
cache and lanes cost more than they save (`Lanes.count_for`). A span run elsewhere (its worker died,
or Dask moved it) reads what it needs itself.

Why spans: a Dask task costs its worker about 1-3 ms of event-loop work (messages, bookkeeping)
whatever it does, and a task that needs another task's result adds a transfer. A span is one task and
no transfer: that cost is spread over a thousand samples or more (`benchmarks/cluster.py` compares a
worker's time with what the decoding itself needs).

Delivery: a worker on the consumer's machine makes each batch (or part, straight into its rows) in the
batch's files in shared memory and sends only the files' names (`outcore.iterate.shared`); the consumer
maps them once every lane's part is there, without a copy or a socket. A worker elsewhere sends its parts
over Dask's sockets and the consumer joins them. Either way the batches are the same.

Twice as many spans as the cluster has worker threads stay submitted while the oldest (a span of every
lane) is handed over (spans finish out of order and only the oldest can be handed over), so every worker thread has a
span to make while finished ones wait: at most that many times `SPAN_BYTES` of batches (64 MiB: 128 MiB
a worker thread), and a span of every lane more, are held. Spans carry Dask priorities by
(epoch, step): a worker runs them in order. Several consumers (the ranks of a job, each with its own
``rank``) can share one cluster: each submits its own spans, of its own share of the epoch.

From an iterator's second epoch on, the next epoch's run starts once this one has submitted its last
span (`outcore.iterate.runs.NextEpoch`), so workers do not wait at epoch boundaries.

If a worker dies, Dask reruns its spans on the others: the epoch still yields every sample once, in
the planned order. If the whole cluster goes away, the consumer gets a `ClusterError`; the iterator's
`state_dict` then says how far it got, to resume elsewhere. A worker of another outcore version than
the consumer's makes no span: `make_span` raises a `ClusterError` naming both.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from functools import lru_cache, partial
from importlib.metadata import version
from typing import Any
from uuid import uuid4

import numpy as np

from ..errors import ClusterError, NotAStoreError
from ..storage import Store, is_object_url
from ..threads import available_cpus, cap_threads
from .batch import Batch, Draws, Recipe, make_batch, plain
from .direct import straight_from_workers
from .hedge import Hedges
from .mappings import PRUNE_SECONDS, kept_mappings
from .plan import EpochPlan
from .readers import chunk_readers, sample_bytes
from .runs import WAKE_SECONDS, ChunkBuffers, Run, Work
from .schedule import schedule
from .shared import Mailbox, Part, SharedArray, SharedBatch, Slot, batch_gone, join_parts
from .stats import LoaderStats

SPAN_BYTES = 64 << 20  # batch bytes per task (`span_batches`): Dask's per-task cost is a small part of the work
SPAN_SAMPLES = 16_384  # but no more samples: a span's steps (17 bytes a sample) travel with its task
CARRIES_PER_THREAD = 4  # chunks left for a lane's next span: at most this many lanes' worth per worker thread
PRUNING = "outcore-mappings"  # a worker's periodic callback: `_prune_mappings_on_this_worker`
VERSION = version("outcore")  # a worker makes spans only for a consumer of its own version (`make_span`)

WORKER_CONFIG: dict[str, object] = {
    "distributed.worker.profile.enabled": False,  # a sample of every thread's stack 100 times a second
    "distributed.admin.tick.interval": "1s",  # the event loop's lag measured 50 times a second
}
"""Dask settings for workers that read and decode for outcore: a worker's event loop wakes up for
Dask's statistical profiler every 10 ms and for its tick every 20 ms, whatever it does, and that CPU
time is taken from decoding (`benchmarks/cluster.py` compares both). The dashboard's profile page then stays empty, and an event loop blocked for more than
``distributed.admin.tick.limit`` (3 s) is still reported. Set them where the workers start:
``with dask.config.set(outcore.WORKER_CONFIG):`` around ``LocalCluster(...)`` (its workers inherit the
settings), or in their environment (`worker_environment`)."""


def worker_environment() -> dict[str, str]:
    """`WORKER_CONFIG` as environment variables, for workers started elsewhere (``dask worker``,
    dask-jobqueue's ``job_script_prologue``, dask-kubernetes' ``env=``).

    >>> worker_environment()["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"]
    'False'
    """
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
            for key, value in WORKER_CONFIG.items()}


@dataclass(frozen=True)
class StoreFields:
    """What a worker reads: ``fields`` of the store at ``location``, opened by ``opener`` (with the settings it
    was opened with); ``identity`` tells rewritten stores apart."""

    location: str
    fields: tuple[str, ...]
    identity: str
    opener: Callable[[], Store] = field(compare=False, repr=False)


@dataclass(frozen=True)
class SpanStep:
    """A lane's part of one batch: step ``index``, its ``samples``, the chunk each is read from and its pieces'
    draws (`outcore.iterate.batch.batch_draws`); the chunks no later part of the lane reads (``release``,
    freed once it is made); ``offset``: where the part starts in the batch of ``size`` samples."""

    index: int
    samples: np.ndarray
    chunks: np.ndarray
    draws: Draws
    release: tuple[int, ...]
    offset: int
    size: int


@dataclass(frozen=True)
class Span:
    """One task: lane ``lane``'s parts of consecutive batches of run ``run``, after the lane's span that ended
    with step ``follows`` (-1: none); ``parts`` when the batches are made of several lanes' parts (else
    each part is the batch)."""

    run: str
    lane: int
    follows: int
    steps: tuple[SpanStep, ...]
    parts: bool

    def carry(self, after: int) -> tuple[str, int, int]:
        """The key of the chunks the lane's span ending with step ``after`` left for the next one."""
        return self.run, self.lane, after

    def part(self, step: SpanStep) -> Part | None:
        return Part(f"{LANE_FILE}{self.run}-s{step.index}", step.offset, step.size) if self.parts else None


LANE_FILE = "lanes-"  # files of a batch that lanes write parts of: lanes-<run>-s<step>-<field>


def span_batches(part_size: int, sample_bytes: int, batches: int, threads: int) -> int:
    """How many batches a task makes parts of ``part_size`` samples of: as many as `SPAN_BYTES` holds, of at
    most `SPAN_SAMPLES` samples together, and no fewer than two tasks per worker thread of its lane when
    the run is short (so that every thread has work); at least one.

    Spans of 64 MiB rather than 32 halve the tasks (a Dask task costs its worker's event loop and the
    scheduler a few ms, whatever it does) and, from a disk, the chunks read by two spans, at twice the
    shared memory held; spans of 128 MiB were no faster, and small pictures get spans of 64 MiB too
    (`benchmarks/cluster.py --span-mib` measures it; docs/benchmarks.md).

    >>> span_batches(256, 128 * 128 * 3, 5000, 8), span_batches(64, 224 * 224 * 3, 5000, 8)
    (5, 6)
    >>> span_batches(256, 128 * 128 * 3, 20, 8), span_batches(256, 32 * 32 * 3, 5000, 8), span_batches(4096, 8, 5000, 8)
    (1, 64, 4)
    """
    by_bytes = SPAN_BYTES // max(1, part_size * sample_bytes)
    return max(1, min(math.ceil(SPAN_SAMPLES / part_size), by_bytes, batches // (2 * threads)))


class Lanes:
    """The run's batches cut into ``count`` lanes, each making its part of every batch: its share of the rank's
    streams (`outcore.iterate.plan.part_streams`), so that each stream's chunks are read by one lane,
    in order. One lane per worker thread, at most one per stream; a lane's spans go to one worker (where
    the chunks its previous span left wait), when there are as many lanes as threads (with more threads
    than streams, spans go wherever Dask sends them, and a chunk whose samples fall in two spans is read
    by both). Where the workers read a disk, one lane makes whole batches (`count_for`).
    """

    def __init__(self, work: Work, threads: dict[str, int], count: int) -> None:
        total = max(1, sum(threads.values()))
        self.count = count
        store, options = work.store, work.options
        self.plans = [work.plan] if self.count == 1 else [
            options.plan(len(store), store.chunk_size, work.epoch, (lane, self.count)) for lane in range(self.count)]
        seats = [address for address in sorted(threads) for _ in range(threads[address])]
        self.workers = [seats[lane] for lane in range(self.count)] if self.count == len(seats) else None
        self.span = span_batches(math.ceil(options.batch_size / self.count), sample_bytes(store, work.recipe),
                                 len(work.batches), math.ceil(total / self.count))
        self.schedules = [_lane_steps(work, plan) for plan in self.plans]
        self.next: list[SpanStep | None] = [next(steps, None) for steps in self.schedules]
        self.ended = [-1] * self.count  # each lane's last step submitted

    @staticmethod
    def count_for(location: str, streams: int, threads: int) -> int:
        """One lane per worker thread, at most one per stream, where the workers read an object store (each
        chunk asked for and paid once); one lane, spans of whole batches, from a disk, where a chunk read
        again comes from the page cache and lanes cost more than they save (their parts are small, and every
        batch waits for its slowest lane; `benchmarks/cluster.py`, docs/benchmarks.md).

        >>> [Lanes.count_for("s3://bucket/train.zarr", 8, threads) for threads in (4, 16)], Lanes.count_for("train.zarr", 8, 4)
        ([4, 8], 1)
        """
        return max(1, min(streams, threads)) if is_object_url(location) else 1

    def spans(self, run: str, last: int) -> list[Span]:
        """Each lane's next span: its parts of the batches up to step ``last`` not made yet (the lanes with
        samples in them)."""
        made = []
        for lane, steps in enumerate(self.schedules):
            parts = []
            while (step := self.next[lane]) is not None and step.index <= last:
                parts.append(step)
                self.next[lane] = next(steps, None)
            if parts:
                made.append(Span(run, lane, self.ended[lane], tuple(parts), self.count > 1))
                self.ended[lane] = parts[-1].index
        return made


def _lane_steps(work: Work, plan: EpochPlan) -> Iterator[SpanStep]:
    """The lane's parts of the run's batches, in order (those where it has samples), with the chunks each
    frees (a chunk is released when no slot of the lane that holds it is used again)."""
    held: set[int] = set()
    for step in schedule(plan, plan.with_samples(work.batches), read_ahead=0):
        held |= set(step.load)
        held -= set(step.release)
        still = {int(plan.chunks[slot]) for slot in held}
        release = tuple(sorted({int(plan.chunks[slot]) for slot in step.release} - still))
        yield SpanStep(step.index, step.samples, plan.chunks[step.slots], work.draws(step), release,
                       *plan.placement(step.index))


class ClusterRun(Run):
    """One pass over an epoch's batches, made by the workers of the options' ``client``."""

    def __init__(self, work: Work, stats: LoaderStats) -> None:
        from dask.base import tokenize  # here: local reads need no dask

        store = work.store
        self.client = work.options.client
        self.source = StoreFields(store.location, work.recipe.fields, tokenize(store.location, store.attrs.to_dict()),
                                  store.opener)
        self.name = f"{uuid4().hex[:8]}-e{work.epoch}"  # task keys: outcore-span-<name>-<first step>-<lane>
        self.mailbox = Mailbox.open()
        self.pending: deque[tuple[Sequence[int], list[tuple[Span, Any]]]] = deque()  # steps, each lane's span, future
        self.gathered = 0
        self.direct = False  # spans' results taken straight from the workers (`straight_from_workers`)
        self.lanes: Lanes | None = None
        self.hedges = Hedges(self.client, stats, self._gather)
        super().__init__(work, stats)

    def _produce_batches(self) -> None:
        try:
            self._submit_and_gather()
        except _cluster_lost() as error:
            raise self._lost(error) from error

    def _submit_and_gather(self) -> None:
        work = self.work
        threads = self.client.nthreads()
        self.direct = straight_from_workers(self.client, threads)
        total = max(1, sum(threads.values()))
        self.lanes = lanes = Lanes(work, threads, Lanes.count_for(work.store.location, len(work.plan.streams), total))
        in_flight = math.ceil(2 * total / lanes.count)  # spans of every lane
        for first in range(0, len(work.batches), lanes.span):
            if self.stop.is_set():
                return
            steps = work.batches[first : first + lanes.span]
            spans = lanes.spans(self.name, steps[-1])
            self.pending.append((steps, [(span, self._submit(span)) for span in spans]))
            if len(self.pending) > in_flight and not self._deliver():  # in_flight stay submitted meanwhile
                return
        self.under_way.set()
        while self.pending:
            if not self._deliver():
                return

    def _submit(self, span: Span, only: Collection[str] = ()) -> Any:
        """Submit ``span``: to its lane's worker where lanes are pinned (not to a suspect:
        `outcore.iterate.hedge`), or again, to the workers ``only``, when it was late."""
        slot = None if self.mailbox is None else self.mailbox.slot
        pinned, key = {}, f"outcore-span-{self.name}-{span.steps[0].index}-l{span.lane}"
        if only:
            pinned, key = {"workers": list(only), "allow_other_workers": False}, f"{key}-again"
        elif self.lanes is not None and self.lanes.workers is not None:
            worker = self.lanes.workers[span.lane]
            pinned = {} if worker in self.hedges.suspects else {"workers": [worker], "allow_other_workers": True}
        future = self.client.submit(make_span, self.source, self.work.recipe, self.work.store.chunk_size, span, slot,
                                    VERSION, key=key, priority=self._priority(span), **pinned)
        self.stats.spans.started(future)
        return future

    def _priority(self, span: Span) -> int:
        """Dask's priority of ``span`` (higher runs first): a worker runs a lane's spans in order, whatever was
        submitted since, so each takes the chunks the one before left (`Carries`); an epoch's before the next's."""
        return -(self.work.epoch * self.work.plan.steps + span.steps[0].index)

    def _deliver(self) -> bool:
        """Hand the oldest pending span's batches to the consumer once every lane has made its parts (a span
        late by far more than the others' made again elsewhere: `outcore.iterate.hedge`); False when the run
        was closed meanwhile (a closed run never waits on the cluster)."""
        steps, spans = self.pending[0]
        parts: dict[int, list[tuple[SpanStep, SharedBatch | Batch]]] = {step: [] for step in steps}
        for span, future in spans:  # lanes in order: their parts in the batch's order
            result = self.hedges.result(future, partial(self._submit, span), self.stop, WAKE_SECONDS)
            if result is None:
                return False
            worker, made = result
            if len(made) < len(span.steps):  # its worker found the run's folder gone while it was open
                assert self.mailbox is not None
                raise batch_gone(self.mailbox.folder, f"a worker stopped span {future.key} of the run, its folder gone")
            self.stats.delivered(worker, self._route(made), len(made))
            for step, part in zip(span.steps, made, strict=True):
                parts[step.index].append((step, part))
        self.pending.popleft()
        whole = not any(span.parts for span, _ in spans)  # one lane: its parts are the batches
        for step in steps:
            self.gathered += 1
            if not self._put(self._batch(parts[step], whole)):
                return False
        return True

    def _gather(self, future: Any) -> tuple[str, list[SharedBatch | Batch]]:
        return self.client.gather(future, direct=self.direct)

    def _route(self, made: list[SharedBatch | Batch]) -> str:
        """How a span's batches came: in shared memory (their large arrays), or over sockets."""
        shared = (isinstance(value, SharedArray) for batch in made if isinstance(batch, SharedBatch)
                  for value in batch.fields.values())
        if any(shared):
            return "shared_memory"
        return "straight" if self.direct else "through_scheduler"

    def _batch(self, parts: list[tuple[SpanStep, SharedBatch | Batch]], whole: bool) -> Batch:
        """The batch the lanes' ``parts`` make: mapped from shared memory where the workers wrote it."""
        if whole:
            made = parts[0][1]
            return self.mailbox.receive(made) if self.mailbox is not None else made
        return join_parts([made for _, made in parts], [len(step.samples) for step, _ in parts], self.mailbox)

    def _lost(self, error: BaseException) -> ClusterError:
        index = self.work.batches[self.gathered]
        return ClusterError(
            f"lost the Dask cluster while making batch {index} of epoch {self.work.epoch} "
            f"({type(error).__name__}: {error}). The batches before it were delivered, and the iterator's "
            "state_dict() says so: load it into a new iterator (with a new client, or none) to continue from "
            "there. A KilledWorker means a task's workers kept dying: give them more memory."
        )

    def _release(self) -> None:
        futures = [future for _, spans in self.pending for _, future in spans] + self.hedges.left
        self.pending.clear()
        self.hedges.left = []
        if futures and self.client.status == "running" and not sys.is_finalizing():
            self.client.cancel(futures)
        if self.mailbox is not None:
            self.mailbox.close()


def _cluster_lost() -> tuple[type[BaseException], ...]:
    """What a client raises when its cluster is gone, or keeps losing the workers that run a task."""
    from distributed import KilledWorker
    from distributed.client import ClosedClientError
    from distributed.comm import CommClosedError

    return (CancelledError, ClosedClientError, CommClosedError, KilledWorker, TimeoutError)


def make_span(source: StoreFields, recipe: Recipe, chunk_size: int, span: Span, slot: Slot | None,
              consumer_version: str) -> tuple[str, list[SharedBatch | Batch]]:
    """On a worker: this worker's address and the span's parts of batches (whole batches for a run of one
    lane), made as the local path makes them, on as many threads as the cluster gave the worker; into the
    consumer's shared memory when this worker sees it (`outcore.iterate.shared`). Each chunk is read once: those the lane's previous
    span left on this worker are taken from it, and those a later span of the lane reads again are left
    for it (a span run elsewhere reads them itself). A worker that sees the consumer's folder in shared
    memory stops once it goes (the run was closed: the rest of the span would go unused) and returns the
    batches made so far. A worker whose outcore is not the consumer's (``consumer_version``) makes
    nothing: a `ClusterError` says so (another version may make other pixels, or lay batches out
    otherwise in shared memory)."""
    if consumer_version != VERSION:
        raise ClusterError(
            f"Dask worker {_worker_address()} runs outcore {VERSION} and the process reading the batches "
            f"outcore {consumer_version}: batches are made only by the version that reads them. Install the "
            "same outcore on the workers and the consumer"
        )
    cap_threads(_worker_threads())
    if slot is not None:
        _prune_mappings_on_this_worker()
    buffers = _buffers(source)
    readers = buffers.readers
    loaded = _carries.take(span.carry(span.follows))
    if any(reader.remote for reader in readers.values()):  # the span's bytes asked for at once, in order
        first_use = dict.fromkeys(chunk for step in span.steps for chunk in step.chunks.tolist() if chunk not in loaded)
        for reader in readers.values():
            reader.prefetch(list(first_use))
    made: list[SharedBatch | Batch] = []
    seen = slot is not None and slot.seen()
    for step in span.steps:
        if made and seen and not slot.seen():  # the consumer closed the run: nobody would take the rest
            return _worker_address(), made
        missing = [chunk for chunk in np.unique(step.chunks).tolist() if chunk not in loaded]
        for chunk, read in zip(missing, buffers.read_many(missing), strict=True):  # in one C call where they can be
            if isinstance(read, Exception):
                raise read
            loaded[chunk] = read
        arena = slot.arena(span.part(step)) if slot is not None else None
        batch = make_batch(recipe, step.samples, chunk_size, step.chunks, {c: v for c, (v, _) in loaded.items()},
                           step.draws, plain if arena is None else arena.empty)
        made.append(batch if arena is None else arena.publish(batch))
        for chunk in step.release:
            if chunk in loaded:
                buffers.give(loaded.pop(chunk)[1])
    if loaded:
        _carries.put(span.carry(span.steps[-1].index), loaded, CARRIES_PER_THREAD * _worker_threads())
    return _worker_address(), made


class Carries:
    """The chunks spans leave on a worker for their lane's next span (`make_span`), by ``(run, lane, last step)``:
    at most ``most`` of them, the oldest dropped first (a run closed early leaves its lanes'), and a lane's
    older ones dropped when its next span takes its own (left by a span that ran out of turn)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: OrderedDict[tuple[str, int, int], dict[int, Any]] = OrderedDict()

    def take(self, key: tuple[str, int, int]) -> dict[int, Any]:
        with self.lock:
            for older in [k for k in self.kept if k[:2] == key[:2] and k[2] < key[2]]:
                del self.kept[older]
            return self.kept.pop(key, {})

    def put(self, key: tuple[str, int, int], loaded: dict[int, Any], most: int) -> None:
        with self.lock:
            self.kept[key] = loaded
            while len(self.kept) > most:
                self.kept.popitem(last=False)


_carries = Carries()  # this worker process's


@lru_cache(maxsize=8)
def _buffers(source: StoreFields) -> ChunkBuffers:
    """The worker's readers of a store's fields as the iterator reads them, opened once per worker process
    (shard indexes stay cached), and the chunk buffers its spans read into (each into those the spans before
    freed)."""
    try:
        store = source.opener()
    except NotAStoreError as error:
        raise NotAStoreError(
            f"Dask worker {_worker_address()} cannot open the store: {error}. Workers read the store "
            "themselves: put it where every worker sees it at the same path (a shared filesystem), or open "
            "it by URL (s3://…, gs://…)"
        ) from None
    return ChunkBuffers(chunk_readers(store, source.fields))


def _prune_mappings_on_this_worker() -> None:
    """Have this Dask worker let go of its mappings of the batch files removed (with their consumer's run
    folder, or as the consumer ended) every `PRUNE_SECONDS`, on its event loop (`outcore.iterate.mappings`):
    an idle worker's mappings would keep those files' memory until its next span."""
    from distributed import get_worker
    from tornado.ioloop import PeriodicCallback

    try:
        worker = get_worker()
    except ValueError:  # not in a worker
        return
    if PRUNING in worker.periodic_callbacks:
        return

    def start() -> None:  # on the worker's event loop; stopped with the worker's other periodic callbacks
        if PRUNING not in worker.periodic_callbacks:
            worker.periodic_callbacks[PRUNING] = PeriodicCallback(kept_mappings.prune, PRUNE_SECONDS * 1000)
            worker.periodic_callbacks[PRUNING].start()

    worker.loop.add_callback(start)


def _worker_threads() -> int:
    from distributed import get_worker

    try:
        return get_worker().state.nthreads
    except ValueError:  # not in a worker
        return available_cpus()


def _worker_address() -> str:
    from distributed import get_worker

    try:
        return get_worker().address
    except ValueError:
        return "(not in a worker)"
