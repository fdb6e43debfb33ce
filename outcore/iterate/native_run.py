"""`NativeRun`: a run of plain batches made start to end by C threads that never hold the GIL.

A `LocalRun` makes each batch in tasks of the process's pool, planned and handed over by Python: a few hundred Python
calls a batch, one thread at a time whatever the cores (`benchmarks/python_calls.py`). Where nothing in a batch needs
Python (every field stored as it is batched or an encoded field of pictures of one size, or of their own sizes cut by
a box each, read from local shard files, and at most a box of each picture drawn for the whole run at once, mirrored or
not, then normalized: ``ds.batches(256, transform=Compose([RandomResizedCrop(224), RandomFlip(), Normalize(mean,
std)]))`` over a pixel store or a store of JPEGs), the whole run is handed to the C engine of
`outcore.storage.chunk_reads` at once. The run's thread plans it: the rows of its batches by chunk (`EpochPlan.span`,
each chunk read once, in the plan's order), the chunks each batch reads, each chunk's reads as its shard's index gives
them (`ShardReader.local_reads`), every box and mirror of the run drawn in one call as the pool's tasks draw them piece
by piece (from each picture's size, where they vary: their shapes' chunks read in one call, `ShardReader.read_many`).
The engine's threads (as many as the pool's; of all the process's engines, as many at work at once as the pool's
`Gauge` allows, which the clocks of their batches feed) read the chunks in the schedule's order (each checked and its
Blosc frame decoded, as `read_at_once` reads one), up to ``read_ahead`` chunks past the batches being made, copy each
batch's rows (or cut and mirror its pictures' windows, or resize their boxes; an encoded field's files decoded, or
only their boxes, by the code of `outcore.imaging.native` lent to them: `decode_each`'s, `crop_each`'s and
`resize_each`'s, the same pixels; then looked up in the `Normalize`'s table, as `table_lookup` looks them up) into
the arrays given to it a few batches ahead (`outcore.storage.blocks`, or the run's own memory: pinned, for
`ds.torch`), and give a chunk's buffer back once the last batch reading it is made. The consumer's thread takes each batch from the engine (woken when that batch is
made), and the same C call gives the batch a few on the arrays of one taken before that nothing refers to any more
(the iterator's sets of them, `ChunkBuffers.batch_sets`: never a batch the consumer holds, nor one a view, a
memoryview or a tensor of it refers to); new ones are made only where none is free (the first batches, batches held):
some fifteen Python calls a batch, on no other thread.

The batches are those a `LocalRun` makes, byte for byte (`tests/test_native_run.py`). A read the engine cannot
vouch for (a file damaged, unreadable, or replaced since its index was read) ends it: that batch and the rest are
made by a `LocalRun`, which reads the chunks again and names what is wrong. A file the decoder leaves (of another
size, to be resized; a PNG of other colours; a damaged one), or a box its resize leaves, is made by the consumer's
thread as a `LocalRun` makes it, which names what is wrong; a batch with more than `UNDONE_SHARE` of its rows so left
hands the rest of the run to a `LocalRun`, whose pool makes them on every thread. The run's plan is held as arrays, 8
bytes a sample (18 where windows are cut, 42 where boxes are resized, 50 where pictures of their own sizes are; kept
where rows may be left), made at its start in arrays of the run's samples (some 60 bytes a sample for a moment, where
a `LocalRun` plans a few batches at a time).

>>> run = native_run(work, stats, buffers)  # doctest: +SKIP
>>> run is None or isinstance(run, NativeRun)  # doctest: +SKIP
True
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import OutcoreError
from ..imaging import EncodedChunk, native, resize_part, table_lookup
from ..imaging.decode import MAX_PIXELS
from ..storage import ShardReader, blocks
from ..storage.chunk_reads import Engine, engine_clocks, set_engine_turns
from ..threads import Gauge, gauge, thread_count
from .batch import Batch, Recipe, batch_draws, plain
from .readers import EncodedChunks, sample_spec
from .runs import WAKE_SECONDS, ChunkBuffers, LocalRun, Run, Work, closed
from .stats import LoaderStats
from .transforms import Normalize

SPARE_SETS = 3  # sets of a batch's arrays kept to use again, for each batch made at once (those given ahead, those the
# consumer holds, and the next epoch's run's, started as this one drains)
RESIZED = {np.dtype(np.uint8): "B", np.dtype(np.uint16): "H", np.dtype(np.int16): "h", np.dtype(np.float32): "f",
           np.dtype(np.float64): "d"}  # the pictures whose boxes the engine resizes (as `resize_each` does), by dtype
UNDONE_SHARE = 1 / 16  # a batch with more of its files left by the engine's decoder than this (files of other sizes,
# to be resized; other formats) hands the rest of the run to a `LocalRun`, whose pool decodes them on every thread


class NativeRun(Run):
    """Batches ``work.batches`` made by a C engine that its thread plans first (`_engine`), each field's batch arrays of
    ``specs`` (name, a sample's shape, dtype and bytes); the rest by a `LocalRun` of ``buffers`` from the first batch
    whose chunks the engine could not vouch for (all of them where the run cannot be planned so: a shard index that
    cannot be read, say). ``chunks``: those the engine reads, each once, in the plan's order."""

    threads_here = True
    hands_over = False  # the consumer takes its batches from the engine: no thread of its own waits for a taker

    def __init__(self, work: Work, stats: LoaderStats, buffers: ChunkBuffers,
                 specs: list[tuple[str, tuple[int, ...], np.dtype, int]], decoded: str | None = None,
                 table: np.ndarray | None = None) -> None:
        self.buffers, self.specs, self.decoded = buffers, specs, decoded  # decoded: the encoded field, if any
        self.table = table  # the cut pictures' pixels' results, where they are normalized (`Normalize.table`)
        self.engine: Any = None  # made by the run's thread (`_engine`)
        self.chunks = np.empty(0, np.int64)
        self.bounds: list[int] = []  # each batch's rows, in all the run's
        self.lent: list[np.ndarray] = []  # the buffers lent to the engine, taken back once it is closed
        self.window = 0  # the batches the engine makes at once
        self.size = np.zeros(2, np.int64)  # the pictures' size, where they are cut: all one
        self.rest: LocalRun | None = None  # making the batches from the first the engine could not
        self.closing = threading.Lock()  # held to make the engine, or to close it
        self.planned = threading.Event()  # set once the run's thread has planned it (`_produce`)
        self.failure: BaseException | None = None  # what planning it raised, for the consumer
        self.rows = 0  # a whole batch's
        self.row_slot = self.row_local = np.empty(0, np.int32)  # each row's chunk (among `chunks`) and sample there,
        # kept where files are decoded: those the engine's decoder leaves are decoded here (`_decode_undone`)
        self.cuts: dict[str, np.ndarray] = {}  # the rows' boxes and mirrors, kept where the engine may leave some rows
        # (a decoded field's, boxes resized)
        # sets of a whole batch's arrays used again (`_arrays`): the iterator's, for plain arrays (not pinned ones)
        self.spares: list[tuple[np.ndarray, ...]] | None = None
        super().__init__(work, stats)

    def _produce(self) -> None:
        """On the run's thread: plan the run and give the engine its first batches' arrays, so that it makes them
        before the consumer asks (a run started ahead, `NextEpoch`); the consumer takes them (`__iter__`)."""
        began = time.perf_counter()
        try:
            if self._engine() is not None:
                spares = self.spares
                for k in range(min(len(self.work.batches), self.window)):  # sets the last run's batches came back to
                    if spares is None or not self.engine.give_spare(spares):
                        self.engine.give(self._arrays(k))
        except BaseException as error:  # noqa: BLE001 - raised by the consumer, which waits for the plan
            self.failure = error
        finally:
            self.stats.made(time.perf_counter() - began)  # its planning: the engine's threads make the batches
            self.planned.set()

    def __iter__(self) -> Iterator[Batch]:
        """The run's batches, each taken from the engine by the consumer's thread (waiting outside the GIL), which in
        the same call gives the batch `window` batches later a set of arrays that nothing refers to any more (a
        `spares` set), or new ones made here; from the first batch the engine could not make (or all of them, where
        the run could not be planned so), a `LocalRun`'s."""
        while not self.planned.wait(WAKE_SECONDS):
            if self.stop.is_set():
                raise closed(self.work, self.delivered)
        if self.failure is not None:
            raise self.failure
        engine, steps, spares, window = self.engine, self.work.batches, self.spares, self.window
        names = [name for name, _, _, _ in self.specs]
        last = len(steps)  # the batches the engine makes: fewer once its decoder leaves most of a batch's files
        while engine is not None and self.delivered < last:
            began, ready = time.perf_counter(), engine.made - self.delivered
            try:
                while (made := engine.take(WAKE_SECONDS, spares)) is None:
                    if self.stop.is_set():
                        raise closed(self.work, self.delivered)
                if isinstance(made, int):  # a slot's read was not vouched for: this batch and the rest by a LocalRun
                    break
                if (undone := engine.undone) is not None and self._decode_undone(made, undone):
                    last = self.delivered + 1  # most of its files left: the batches after it by a LocalRun
                if (clocks := engine_clocks(Gauge.INTERVAL)) is not None:
                    _gauged(clocks)
                if (given := engine.given) < min(len(steps), self.delivered + 1 + window):  # no spare set was free
                    engine.give(self._arrays(given))
                    given += 1
            except ValueError:  # the engine closed meanwhile (`close`, on another thread)
                if self.stop.is_set():
                    raise closed(self.work, self.delivered) from None
                raise
            if given == len(steps):
                self.under_way.set()  # every batch's arrays given: the next epoch's run may start (`NextEpoch`)
            self.delivered += 1
            rows = self.bounds[self.delivered] - self.bounds[self.delivered - 1]
            self.stats.record(time.perf_counter() - began, ready, rows)
            yield dict(zip(names, made, strict=True))
        if self.delivered < len(steps):
            yield from self._rest(steps[self.delivered :])

    def _decode_undone(self, made: Sequence[np.ndarray], undone: list[int]) -> bool:
        """Rows ``undone`` of the batch just taken (``made``), which the engine left (files of another size, kind or
        format, or damaged; boxes its resize leaves), made here as a `LocalRun` makes them (`RowDecodes`, `BoxCuts`,
        `resize_rows`), which names what is wrong: whether they were more than `UNDONE_SHARE` of it."""
        name = self.decoded or self.work.recipe.crop_field
        out = made[[name for name, _, _, _ in self.specs].index(name)]
        reader, first = self.buffers.readers[name], self.bounds[self.delivered]
        size = self.work.recipe.crop.output_size if self.cuts else None
        chunks: dict[int, EncodedChunk | np.ndarray] = {}
        for k in undone:
            r = first + k
            chunk, local = int(self.chunks[self.row_slot[r]]), int(self.row_local[r])
            if chunk not in chunks:
                chunks[chunk] = reader.read(chunk)
            row = out[k] if self.table is None else np.empty(out.shape[1:], np.uint8)  # normalized into out[k] then
            if not self.cuts:
                chunks[chunk].decode_sample(local, row)
            else:
                box, flips = tuple(self.cuts["windows"][r].tolist()), self.cuts["mirrors"][r].astype(bool).tolist()
                if self.decoded:
                    chunks[chunk].decode_region(local, box, size, row, (flips[0], flips[1]))
                else:
                    resize_part(chunks[chunk][local], box, size, row, (flips[0], flips[1]))
            if self.table is not None:
                table_lookup(row, self.table, out[k])
        return len(undone) > UNDONE_SHARE * len(out)

    def _rest(self, steps: Sequence[int]) -> Iterator[Batch]:
        """Batches ``steps`` made by a `LocalRun` (which names what it cannot read)."""
        self._close_engine()
        self.rest = rest = LocalRun(dataclasses.replace(self.work, batches=steps), self.stats, self.buffers)
        self.under_way.set()
        for batch in rest:
            self.delivered += 1
            yield batch

    def _engine(self) -> Any:
        """The engine making the run's batches, started (as the module docstring says), or None where a chunk's read
        cannot be planned so (its shard's index cannot be read, a chunk was never written) or the windows cannot be
        drawn in one call (no C extension)."""
        work = self.work
        plan, chunk_size, steps = work.plan, work.store.chunk_size, work.batches
        samples, slots, bounds = plan.span(steps[0], steps[-1] + 1)  # consecutive steps: a run's, or a loader's
        read = np.zeros(len(plan.chunks), bool)  # the slots the run reads, in the plan's order (a table: no sort of
        read[slots] = True  # the rows, which are many; the slots are few)
        slots_read = np.flatnonzero(read)
        unique, first, of_slot = np.unique(plan.chunks[slots_read], return_index=True, return_inverse=True)
        order = np.argsort(first)  # each chunk read once, where its first slot is (two streams may share one)
        place = np.empty(len(unique), np.int32)
        place[order] = np.arange(len(unique))
        at = np.empty(len(plan.chunks), np.int32)  # each slot's place among the chunks read
        at[slots_read] = place[of_slot]
        row_slot, chunks = at[slots], unique[order]
        row_local = (samples % chunk_size).astype(np.int32)  # each row's sample in its chunk
        del read, slots, samples
        readers = [self.buffers.readers[name] for name, _, _, _ in self.specs]
        row_bytes = np.array([nbytes for _, _, _, nbytes in self.specs] + [16], np.int64)  # a decoded field's ranges'
        decoded: dict[str, Any] = {}
        encoded: EncodedChunks | None = None
        if self.decoded is not None:  # its files' chunks read as a field's, their ranges as one more after the others
            at = [name for name, _, _, _ in self.specs].index(self.decoded)
            encoded = readers[at]
            readers[at:at + 1] = encoded.sources[:1]
            readers.append(encoded.sources[1])
            height, width, *channels = sample_spec(work.store, self.decoded)[0]
            channels = channels[0] if channels else 1
            height, width = height or 0, width or 0  # 0 x 0: of their own sizes, each row's box resized
            row_bytes[at] = (height * width or int(np.prod(work.recipe.crop.output_size))) * channels  # its pictures'
            decoded = {"decoded": (at, height, width, channels), "starts": chunks * encoded.decoded.bytes.capacity}
        else:
            row_bytes = row_bytes[:-1]
        files: list[tuple[bytes, Any]] = []  # every field's shard files: (path, the version whose index was read)
        asks = np.empty((len(chunks), len(readers), 4), np.int64)
        for f, reader in enumerate(readers):
            reads = reader.local_reads(chunks)
            if reads is None:
                return None
            asks[:, f] = reads[1]
            asks[:, f, 0] += len(files)
            files.extend(reads[0])
        stamps = np.array([stamp for _, stamp in files], np.int64).reshape(-1, 3)
        sizes = None  # each row's picture's size, where they are of their own sizes: their shapes read now
        if encoded is not None and decoded["decoded"][1] == 0:
            if (sizes := _own_sizes(encoded, chunks, row_slot, row_local)) is None:
                return None
            decoded["sizes"] = np.where(_left(sizes)[:, None], 0, sizes).astype(np.int32)
        bounds = np.asarray(bounds, np.int64)
        used = np.repeat(np.arange(len(bounds) - 1) * len(chunks), np.diff(bounds))  # each row's batch, then
        used += row_slot  # its slot: each batch's slots, each once, batch after batch
        used = np.unique(used)
        used_bounds = np.searchsorted(used // len(chunks), np.arange(len(bounds)))
        reach = np.maximum.accumulate(np.maximum.reduceat(row_slot, bounds[:-1])).astype(np.int64)
        recipe = work.recipe
        windows = {} if recipe.crop is None else self._windows(sizes)
        picture = None if windows is None or recipe.crop is None else self._picture(windows["windows"])
        if windows is None or picture == () or (picture and picture[-1] and self.decoded not in (None, recipe.crop_field)):
            return None  # boxes drawn some other way, not resized in C, or rows of two fields left: by the pool's tasks
        if decoded or (picture is not None and picture[-1]):  # files decoded, boxes resized: by _jpeg's code
            decoded["decoder"] = native.extension.picture_decoder
        if self.table is not None:
            decoded["table"] = self.table
        threads = thread_count()
        self.window = LocalRun.made_at_once(work, threads)  # as many as a local run makes
        set_engine_turns(gauge().limit)  # of its threads, as many at work at once as the pool's tasks
        chunk_bytes = np.array([reader.chunk_nbytes for reader in readers], np.int64)
        if picture is not None and not ("decoded" in decoded and decoded["decoded"][0] == picture[0]):
            row_bytes[picture[0]] = chunk_bytes[picture[0]] // chunk_size  # the cut field's rows: its stored pictures'
        with self.closing:
            if self.stop.is_set():
                return None
            self.lent = self.buffers.lend(int(chunk_bytes.sum()))
            self.engine = Engine(
                [path for path, _ in files], stamps, asks, row_bytes, chunk_bytes, bounds, row_slot, row_local, reach,
                used_bounds, used % len(chunks), threads, LocalRun.local_read_ahead(threads), self.window, self.lent,
                picture, **windows, **decoded)
        self.chunks, self.bounds, self.rows = chunks, bounds.tolist(), int(np.diff(bounds).max())
        if "decoder" in decoded:  # rows the engine may leave (of one field: the decoded one, or the one resized)
            self.row_slot, self.row_local = row_slot, row_local  # made again here (`_decode_undone`)
            left = decoded["decoded"][0] if "decoded" in decoded else picture[0]
            self.cuts = windows if picture is not None and picture[0] == left else {}
        if work.allocator is None and work.empty is plain:
            self.spares = self.buffers.batch_sets(tuple((shape, dtype, self.rows) for _, shape, dtype, _ in self.specs))
        return self.engine

    def _picture(self, boxes: np.ndarray) -> tuple[int, ...]:
        """How the engine cuts the crop's field by ``boxes`` (its rows'): ``(its number among the fields, its pictures'
        height, width and pixel's bytes, the output's height and width, its channels, and the struct letter of its
        samples where the boxes are resized, 0 where each is a window of whole pixels at the output's size within its
        picture, copied)``; ``()`` where they would be resized and the C extension does not resize such pictures."""
        crop, (height, width) = self.work.recipe.crop, self.size.tolist()  # 0 x 0: pictures of their own sizes
        (cut_height, cut_width), (_, _, channels), dtype = crop.output_size, *sample_spec(self.work.store, crop.field)
        copied = height > 0 and vars(type(crop)).get("windows", False) or bool(
            np.array_equal(boxes, np.round(boxes)) and (boxes[:, 2:] == (cut_height, cut_width)).all()
            and (boxes[:, :2] >= 0).all() and (boxes[:, 0] <= height - cut_height).all()
            and (boxes[:, 1] <= width - cut_width).all())
        kind = RESIZED.get(dtype, "")
        if not copied and (not kind or (kind == "B" and channels not in (1, 3))
                           or getattr(native.extension, "picture_decoder", None) is None):
            return ()
        names = [name for name, _, _, _ in self.specs]
        return (names.index(crop.field), height, width, channels * dtype.itemsize, cut_height, cut_width, channels,
                0 if copied else ord(kind))

    def _arrays(self, k: int) -> tuple[np.ndarray, ...]:
        """Batch ``k``'s arrays made anew, one a field (the windows' where pictures are cut): plain ones kept among the
        `spares` where they are a whole batch's (the oldest let go past `SPARE_SETS` a batch made at once)."""
        rows, work = self.bounds[k + 1] - self.bounds[k], self.work
        if self.spares is None:  # pinned memory (`ds.torch`), or the step's own (`Work.allocator`)
            empty = work.empty if work.allocator is None else work.allocator(work.batches[k])
            return tuple(empty((rows, *shape), dtype, field=name) for name, shape, dtype, _ in self.specs)
        arrays = tuple((np.empty if rows * nbytes < blocks.SMALLEST else blocks.empty)((rows, *shape), dtype)
                       for _, shape, dtype, nbytes in self.specs)  # small ones from the heap as they are
        if rows == self.rows:
            self.spares.append(arrays)
            del self.spares[: -SPARE_SETS * (self.window + 1)]
        return arrays

    def _windows(self, sizes: np.ndarray | None) -> dict[str, np.ndarray] | None:
        """The boxes (``windows``) and ``mirrors`` of the run's rows, batch after batch, each piece's drawn as its
        generator draws them where a batch is made by the pool's tasks (`Crop.boxes_of_pieces`, `make_batch`), all in
        one call, from the rows' pictures' ``sizes`` (none: all one, kept: `size`); None where they are not drawn so
        (no C extension, a flip of another kind, pictures too small or of several sizes for the crop)."""
        work, recipe = self.work, self.work.recipe
        seed, epoch, plan = work.options.seed, work.epoch, work.plan
        pieces = [piece for index in work.batches for piece in batch_draws(seed, epoch, index, plan.pieces(index))]
        if sizes is None:
            self.size = np.array(sample_spec(work.store, recipe.crop.field)[0][:2], np.int64)
            sizes = np.broadcast_to(self.size, (sum(count for count, _ in pieces), 2))
        drawn = recipe.crop.boxes_of_pieces(sizes, pieces, recipe.flip)
        return None if drawn is None else {"windows": drawn[0], "mirrors": drawn[1]}

    def _close_engine(self) -> None:
        """Stop the engine's threads, and take back the buffers lent to it."""
        with self.closing:
            if self.engine is not None:
                self.engine.close()
                self.buffers.take_back(self.lent, self.engine.most_held)
                self.lent = []

    def _release(self) -> None:
        self._close_engine()
        if self.rest is not None:
            self.rest.close()


def native_run(work: Work, stats: LoaderStats, buffers: ChunkBuffers) -> NativeRun | None:
    """A `NativeRun` of ``work`` where its batches need no Python (as the module docstring says), else None: made by a
    `LocalRun` then."""
    recipe, options, steps = work.recipe, work.options, work.batches
    if (Engine is None or (recipe.transform is not None and not _cut_only(recipe)) or recipe.text_fields
            or recipe.ragged_fields or recipe.later or options.skip_damaged
            or len(steps) < 2 or steps[-1] - steps[0] + 1 != len(steps) or steps[-1] >= work.plan.steps):
        return None
    if recipe.crop is not None and recipe.crop_field not in recipe.fields:
        return None
    specs, decoded = [], None
    for name in recipe.fields:
        reader = buffers.readers.get(name)
        shape, dtype = sample_spec(work.store, name)
        if isinstance(reader, EncodedChunks):
            cut = name == recipe.crop_field
            if decoded is not None or not _decodable(reader, shape, dtype, cut):
                return None
            decoded, shape = name, (*recipe.crop.output_size, shape[2]) if cut else shape
            specs.append((name, shape, dtype, int(np.prod(shape, dtype=np.int64))))
            continue
        if not isinstance(reader, ShardReader) or reader.chunk_nbytes != \
                int(np.prod(shape, dtype=np.int64)) * dtype.itemsize * work.store.chunk_size:
            return None  # not a stored field's rows as they are batched
        if name == recipe.crop_field:
            if len(shape) != 3:
                return None
            shape = (*recipe.crop.output_size, shape[2])
        specs.append((name, shape, dtype, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize))
    table = None
    if (normalize := _normalize(recipe)) is not None:  # the cut pictures' uint8 pixels looked up in its table
        at = recipe.fields.index(recipe.crop_field)
        name, shape, dtype, _ = specs[at]
        if dtype != np.uint8 or (table := normalize.table(shape[-1])) is None:
            return None
        specs[at] = (name, shape, table.dtype, int(np.prod(shape, dtype=np.int64)) * table.dtype.itemsize)
    return NativeRun(work, stats, buffers, specs, decoded, table)


def _decodable(reader: EncodedChunks, shape: tuple[int, ...], dtype: np.dtype, cut: bool) -> bool:
    """Whether the engine decodes the files ``reader`` reads (an encoded field of ``shape`` and ``dtype``; with ``cut``,
    the crop's boxes of them) as a `LocalRun` decodes them (`RowDecodes`, `BoxCuts`): 8-bit pictures, grey or RGB, of
    one size (of 3 dimensions where cut, fitted by a resize that `BoxCuts` cuts in C) or, where cut, of their own sizes
    (`own_sizes`), their chunks, their ranges' (and their shapes') read from local shard files, and the C extension's
    decoder lent."""
    sources, decode, chunk_size = reader.sources, reader.decoded.decode, reader.decoded.chunk_size
    if cut and (len(shape) != 3 or not (decode.variable or decode.resize in ("crop", "fit"))):
        return False
    return (getattr(native.extension, "picture_decoder", None) is not None and dtype == np.uint8
            and len(shape) in (2, 3) and (len(shape) == 2 or shape[2] in (1, 3))
            and (decode.variable or shape[0] * shape[1] <= MAX_PIXELS)
            and len(sources) == 2 + decode.variable and all(isinstance(source, ShardReader) for source in sources)
            and sources[1].chunk_nbytes == 16 * chunk_size
            and (not decode.variable or sources[2].chunk_nbytes == 12 * chunk_size))


def _gauged(clocks: tuple[float, float]) -> None:
    """The engines' batches' ``clocks`` (CPU and wall seconds) fed to the pool's `Gauge`, whose limit their threads
    keep to (`set_engine_turns`): fewer at work at once where they wait for cores that other work holds."""
    measured = gauge()
    limit = measured.limit
    measured.record(*clocks)
    if measured.limit != limit:
        set_engine_turns(measured.limit)


def _own_sizes(encoded: EncodedChunks, chunks: np.ndarray, row_slot: np.ndarray, row_local: np.ndarray
               ) -> np.ndarray | None:
    """The (height, width) of each row's picture (its chunk ``chunks[row_slot]``, sample ``row_local`` there) of the
    encoded field of pictures of their own sizes that ``encoded`` reads, as its shapes' chunks give them (read now,
    in one C call where they are local: 12 bytes a sample); None where one cannot be read, for a `LocalRun` to name
    at its batch."""
    try:
        shapes = encoded.sources[2].read_many(chunks.tolist())
    except OutcoreError:
        return None
    return shapes[row_slot, row_local, :2].astype(np.int64)


def _left(sizes: np.ndarray) -> np.ndarray:
    """Which of pictures of ``sizes`` the engine leaves to `decode_region` (as `crop_each` leaves them): of no pixels
    (a shape not recorded as it should be, which it names) or of more than `MAX_PIXELS`."""
    return (sizes < 1).any(axis=1) | (np.prod(sizes, axis=1) > MAX_PIXELS)


def _cut_only(recipe: Recipe) -> bool:
    """Whether the recipe's transform is a box of each picture drawn in one call for the run (`boxes_of_pieces`: a
    `RandomCrop`, padded or not, the whole picture, a `RandomResizedCrop`, a `CenterCrop`, a `ScaleJitter`) mirrored
    or not (a plain `RandomFlip`), moving no targets, then at most a `Normalize` of those pictures (`_normalize`), and
    nothing else: the engine cuts or resizes those, and looks their pixels up in the normalization's table."""
    crop = recipe.crop
    return (crop is not None and recipe.per_piece is None and (recipe.after is None or _normalize(recipe) is not None)
            and not recipe.later and getattr(crop, "targets", None) is None and hasattr(crop, "boxes_of_pieces"))


def _normalize(recipe: Recipe) -> Normalize | None:
    """The recipe's `Normalize` of the pictures it cuts, where it is all that comes after the crop and flip (its own
    class: a subclass may compute otherwise; a `Cast` after it made one with it, `Normalize.then`)."""
    after = recipe.after
    return after if type(after) is Normalize and after.field == recipe.crop_field else None

