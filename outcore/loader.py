"""`BatchIterator`: batches in a chunk-aware shuffled order, read ahead by background threads.

One producer thread walks the epoch plan (`outcore.shuffle`): it keeps chunk reads running ahead
on a small thread pool (`outcore.chunks` decodes outside the GIL), assembles each batch from the
loaded chunks, applies the transform, and hands finished batches to the consumer through a queue of
``prefetch`` batches. Chunks are dropped as soon as their last sample is emitted, so memory is
bounded by about ``buffer_chunks + 2 + batch_size / chunk_size + READ_AHEAD`` chunks plus
``prefetch`` batches, whatever the store's size. With a Dask client, the same plan runs as tasks on
the cluster's workers instead (`outcore.cluster`).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .encoded import EncodedChunk
from .schema import decode_text
from .shuffle import Consumer, EpochPlan, batch_count, epoch_plan

if TYPE_CHECKING:
    from .dataset import Dataset

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]
READ_AHEAD = 2  # chunks read beyond those the next batch needs
READ_THREADS = 2


class BatchIterator:
    """Iterate ``dataset`` in batches: dicts of numpy arrays, one per field, samples on axis 0.

    Every epoch yields each of this consumer's samples exactly once, in an order that depends only
    on ``(seed, epoch, rank, world_size, worker, num_workers)``. A full pass moves to the next epoch;
    `set_epoch` chooses one. `state_dict` after k batches, loaded into a new iterator (in any
    process), continues with exactly the batches an uninterrupted run would have produced.

    With ``client`` (a ``distributed.Client``) the cluster's workers read, decode and augment the
    batches (`outcore.cluster`); they are identical to those of the local threads.

    >>> it = ds.batches(batch_size=256, shuffle=True, seed=0)  # doctest: +SKIP
    >>> for batch in it:  # doctest: +SKIP
    ...     train_step(batch["images"], batch["labels"])
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        fields: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        buffer_chunks: int = 8,
        prefetch: int = 2,
        transform: Transform | None = None,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        drop_last: bool = False,
        client: Any = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch} must be at least 1")
        if buffer_chunks < 0:
            raise ValueError(f"buffer_chunks={buffer_chunks} must be 0 or more")
        self.dataset = dataset
        self.fields = tuple(fields) if fields is not None else dataset.fields
        unknown = [f for f in self.fields if f not in dataset]
        if unknown:
            raise KeyError(f"no field(s) {unknown} in {dataset.location}; fields: {list(dataset.fields)}")
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.buffer_chunks, self.prefetch, self.transform, self.drop_last = buffer_chunks, prefetch, transform, drop_last
        self.consumer = Consumer(rank, world_size, worker, num_workers)
        self.client = client
        self.epoch = 0
        self.batches_done = 0  # batches of the current epoch already handed out
        self._readers = {name: dataset.chunk_reader(name) for name in self.fields}
        self._text_fields = {name for name in self.fields if dataset.attrs.fields[name].is_text}
        self._active: Run | None = None
        self._stats = LoaderStats()
        self._random_access = _ChunkCache(buffer_chunks + 2 + -(-batch_size // dataset.chunk_size))
        self._stream = _Stream()

    # -- epochs and resumption ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next iteration."""
        self.epoch, self.batches_done = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """Where this iterator stands: a few integers, JSON-serialisable."""
        return {"epoch": self.epoch, "batches_done": self.batches_done, **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the store and settings must match those it was taken with."""
        mismatched = {k: (state.get(k), v) for k, v in self._settings().items() if state.get(k) != v}
        if mismatched:
            raise ValueError(f"state does not match this iterator (saved, current): {mismatched}")
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])

    def _settings(self) -> dict[str, Any]:
        return {
            "num_samples": len(self.dataset), "chunk_size": self.dataset.chunk_size, "batch_size": self.batch_size,
            "shuffle": self.shuffle, "seed": self.seed, "buffer_chunks": self.buffer_chunks,
            "drop_last": self.drop_last, "rank": self.consumer.rank, "world_size": self.consumer.world_size,
            "worker": self.consumer.worker, "num_workers": self.consumer.num_workers,
        }

    # -- the plan ------------------------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This consumer's samples of ``epoch`` (default: the current one) in emission order."""
        return epoch_plan(
            len(self.dataset), self.dataset.chunk_size, shuffle=self.shuffle, seed=self.seed,
            epoch=self.epoch if epoch is None else epoch, buffer_chunks=self.buffer_chunks, consumer=self.consumer,
        )

    def __len__(self) -> int:
        """Batches per epoch for this consumer."""
        return batch_count(len(self.dataset), self.consumer, self.batch_size, self.drop_last)

    # -- iteration -------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        self.close()
        plan, total = self.plan(), len(self)
        if self.batches_done >= total:  # a finished epoch: move on
            self.set_epoch(self.epoch + 1)
            plan = self.plan()
        if self.client is not None:
            from .cluster import ClusterRun

            run: Run = ClusterRun(self, plan, self.epoch, self.batches_done, total)
        else:
            run = _LocalRun(self, plan, self.epoch, self.batches_done, total)
        self._active = run
        try:
            for batch in run:
                self.batches_done += 1
                yield batch
            self.set_epoch(self.epoch + 1)
        finally:
            run.close()
            if self._active is run:
                self._active = None

    def batch(self, index: int) -> Batch:
        """Batch ``index`` of the current epoch, read on demand: for frameworks that ask for batches
        by index, in any order and from several threads (Keras). Recently used chunks are cached, so
        requests in roughly increasing order read each chunk once. Same batches as iterating. With a
        ``client``, batches come from a cluster run started at the requested batch, so requests should
        come in about increasing order (as Keras makes them).
        """
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is not in [0, {len(self)})")
        epoch = self.epoch
        if self.client is not None:
            return self._stream.get(self, epoch, index)
        plan = self._random_access.plan(self, epoch)
        samples = plan.samples[index * self.batch_size : (index + 1) * self.batch_size]
        chunk_size = self.dataset.chunk_size
        data = {int(c): self._random_access.chunk(self, int(c)) for c in np.unique(samples // chunk_size)}
        batch = assemble(samples, chunk_size, data, self.fields, new_array)
        return apply_transform(self.transform, batch, self.rng_key(epoch, index))

    def stats(self) -> dict[str, float]:
        """Is the consumer waiting for data? Figures since the iterator was made (or `reset_stats`).

        ``wait_mean_ms`` / ``wait_p95_ms``: time the consumer spent blocked on each batch (near 0 when
        the loader keeps ahead); ``ready_mean``: batches already waiting when one was asked for (near
        ``prefetch`` when the loader keeps ahead); ``wait_fraction``: waiting time / elapsed time.

        >>> it.stats()  # doctest: +SKIP
        {'batches': 171, 'samples': 44000, 'samples_per_s': 30510.2, 'wait_mean_ms': 0.4, ...}
        """
        return self._stats.summary()

    def reset_stats(self) -> None:
        self._stats = LoaderStats()

    def close(self) -> None:
        """Stop the background threads of an unfinished iteration (also done on ``break``)."""
        if self._active is not None:
            self._active.close()
            self._active = None
        self._stream.close()

    def rng_key(self, epoch: int, index: int) -> list[int]:
        """The seed of batch ``index``'s augmentation generator: the same wherever the batch is made."""
        return [self.seed, epoch, self.consumer.index, index]


class _ChunkCache:
    """The epoch plan and the most recently used chunks, for `BatchIterator.batch`; thread-safe."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        self.plans: dict[int, EpochPlan] = {}
        self.chunks: OrderedDict[int, Batch] = OrderedDict()

    def plan(self, owner: BatchIterator, epoch: int) -> EpochPlan:
        with self.lock:
            if epoch not in self.plans:
                self.plans = {epoch: owner.plan(epoch)}
            return self.plans[epoch]

    def chunk(self, owner: BatchIterator, chunk: int) -> Batch:
        with self.lock:
            if chunk in self.chunks:
                self.chunks.move_to_end(chunk)
                return self.chunks[chunk]
        values = {name: as_consumed(reader.read(chunk), name in owner._text_fields)
                  for name, reader in owner._readers.items()}
        with self.lock:
            self.chunks[chunk] = values
            while len(self.chunks) > self.capacity:
                self.chunks.popitem(last=False)
        return values


class _Stream:
    """`BatchIterator.batch` with a client: batches of a cluster run, for requests in about increasing
    order from several threads. A request behind the run, or far ahead of it, restarts it there."""

    SKIP_AHEAD = 8  # batches a run may make unasked before a restart is cheaper

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.run: Run | None = None
        self.batches: Iterator[Batch] = iter(())
        self.epoch, self.next = -1, 0
        self.ready: dict[int, Batch] = {}  # made before they were asked for

    def get(self, owner: BatchIterator, epoch: int, index: int) -> Batch:
        from .cluster import ClusterRun

        with self.lock:
            if epoch == self.epoch and index in self.ready:
                return self.ready.pop(index)
            if self.run is None or epoch != self.epoch or not self.next <= index <= self.next + self.SKIP_AHEAD:
                self.close()
                self.run = ClusterRun(owner, owner.plan(epoch), epoch, index, len(owner))
                self.batches, self.epoch, self.next = iter(self.run), epoch, index
            while True:
                batch, made = next(self.batches), self.next
                self.next += 1
                if made == index:
                    return batch
                self.ready[made] = batch

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
        self.run, self.ready = None, {}


class LoaderStats:
    """Per-batch waits of the consumer, kept as a bounded window of the most recent batches."""

    WINDOW = 10_000

    def __init__(self) -> None:
        self.waits: deque[float] = deque(maxlen=self.WINDOW)
        self.ready: deque[int] = deque(maxlen=self.WINDOW)
        self.batches = self.samples = 0
        self.started: float | None = None

    def record(self, wait: float, ready: int, samples: int) -> None:
        if self.started is None:
            self.started = time.perf_counter() - wait
        self.batches += 1
        self.samples += samples
        self.waits.append(wait)
        self.ready.append(ready)

    def summary(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started if self.started is not None else 0.0
        waits = np.array(self.waits or [0.0])
        return {
            "batches": self.batches,
            "samples": self.samples,
            "samples_per_s": self.samples / elapsed if elapsed else 0.0,
            "wait_mean_ms": float(waits.mean() * 1e3),
            "wait_p95_ms": float(np.percentile(waits, 95) * 1e3),
            "wait_fraction": float(waits.sum() / elapsed) if elapsed else 0.0,
            "ready_mean": float(np.mean(self.ready)) if self.ready else 0.0,
        }


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class Run:
    """One pass over an epoch's batches: a producer thread that makes them (`_produce_batches`, by
    a subclass) and a queue of ``prefetch`` finished batches that the consumer takes them from."""

    def __init__(self, owner: BatchIterator, plan: EpochPlan, epoch: int, first_batch: int, total: int) -> None:
        self.owner, self.plan, self.epoch = owner, plan, epoch
        self.first_batch, self.total = first_batch, total
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=owner.prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._produce, name="outcore-batches", daemon=True)
        self.thread.start()

    def __iter__(self) -> Iterator[Batch]:
        stats = self.owner._stats
        while True:
            began = time.perf_counter()
            ready = self.queue.qsize()
            item = self.queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            stats.record(time.perf_counter() - began, ready, len(next(iter(item.values()))))
            yield item

    def close(self) -> None:
        self.stop.set()
        while self.thread.is_alive():
            try:  # unblock a producer waiting for room in the queue
                self.queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._release()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
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


class _LocalRun(Run):
    """Batches made in this process: chunk reads on a small thread pool, assembly on the producer thread."""

    def __init__(self, owner: BatchIterator, plan: EpochPlan, epoch: int, first_batch: int, total: int) -> None:
        self.spare: dict[str, list[np.ndarray]] = {name: [] for name in owner.fields}  # recycled chunk buffers
        self.batch_buffers: dict[str, list[np.ndarray]] = {name: [] for name in owner.fields}
        self.pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="outcore-read")
        super().__init__(owner, plan, epoch, first_batch, total)

    def _release(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _produce_batches(self) -> None:
        owner, plan = self.owner, self.plan
        chunk_size, batch_size = owner.dataset.chunk_size, owner.batch_size
        slot = {int(c): j for j, c in enumerate(plan.chunks)}  # chunk id -> position in the read order
        loaded: dict[int, Future[tuple[Batch, Batch]]] = {}
        next_read = 0
        for index in range(self.first_batch, self.total):
            if self.stop.is_set():
                return
            samples = plan.samples[index * batch_size : (index + 1) * batch_size]
            chunks = samples // chunk_size
            needed = max(slot[int(c)] for c in np.unique(chunks))
            while next_read < len(plan.chunks) and next_read <= needed + READ_AHEAD:
                loaded[next_read] = self.pool.submit(self._read, int(plan.chunks[next_read]))
                next_read += 1
            data = {int(c): loaded[slot[int(c)]].result()[0] for c in np.unique(chunks)}
            batch = assemble(samples, chunk_size, data, owner.fields, self._batch_buffer)
            for j in [j for j in loaded if plan.last_use[j] < (index + 1) * batch_size]:
                for name, buffer in loaded.pop(j).result()[1].items():  # every sample of it has been emitted
                    self.spare[name].append(buffer)
            if not self._put(apply_transform(owner.transform, batch, owner.rng_key(self.epoch, index))):
                return

    def _read(self, chunk: int) -> tuple[Batch, Batch]:
        """Read a chunk of every field into recycled buffers: ``(values, buffers to recycle)``."""
        values, buffers = {}, {}
        for name, reader in self.owner._readers.items():
            spare = self.spare[name]
            buffer = spare.pop() if spare else reader.empty()
            chunk_values = reader.read(chunk, out=buffer)
            values[name] = as_consumed(chunk_values, name in self.owner._text_fields)
            if name in self.owner._text_fields:
                spare.append(buffer)  # decoding copied the values: the buffer is free again
            else:
                buffers[name] = buffer
        return values, buffers

    def _batch_buffer(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array for the next batch: one the consumer no longer references, or a new one.

        A batch array is reused only when nothing but this pool refers to it (no variable, list, view or
        tensor of the consumer's), so handing out batches never overwrites data still in use, and a
        steady loop allocates nothing.
        """
        pool = self.batch_buffers[name]
        for buffer in pool:
            # references: the pool's list, the loop variable and getrefcount's own argument
            if sys.getrefcount(buffer) == 3 and buffer.shape == shape and buffer.dtype == dtype:
                return buffer
        buffer = np.empty(shape, dtype=dtype)
        if len(pool) < self.owner.prefetch + 3:
            pool.append(buffer)
        return buffer


def as_consumed(values: np.ndarray, text: bool) -> np.ndarray:
    """A chunk's values as the consumer sees them: text fields as strings."""
    return decode_text(values) if text else values


def apply_transform(transform: Transform | None, batch: Batch, rng_key: list[int]) -> Batch:
    """``transform(batch, rng)`` with the generator seeded by `BatchIterator.rng_key`."""
    return batch if transform is None else transform(batch, np.random.default_rng(rng_key))


def new_array(_: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


def assemble(
    samples: np.ndarray, chunk_size: int, data: dict[int, Batch], fields: Sequence[str],
    allocate: Callable[[str, tuple[int, ...], np.dtype], np.ndarray],
) -> Batch:
    """Copy each sample once, straight from its chunk into the new batch (no temporaries)."""
    chunks = samples // chunk_size
    local = (samples - chunks * chunk_size).tolist()
    batch = {}
    for name in fields:
        first = next(iter(data.values()))[name]
        out = allocate(name, (len(samples), *first.shape[1:]), first.dtype)
        if out.ndim == 1:  # scalars per sample: one vectorized gather per chunk is cheaper
            for chunk, values in data.items():
                where = chunks == chunk
                out[where] = values[name][samples[where] - chunk * chunk_size]
        elif isinstance(first, EncodedChunk):  # decoded straight into the batch
            for i, (chunk, index) in enumerate(zip(chunks.tolist(), local, strict=True)):
                data[chunk][name].decode_sample(index, out[i])
        else:
            sources = [data[c][name] for c in chunks.tolist()]
            for i, (source, index) in enumerate(zip(sources, local, strict=True)):
                out[i] = source[index]
        batch[name] = out
    return batch
