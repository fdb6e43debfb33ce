"""PyTorch: `loader`, a ``DataLoader`` of outcore batches (`OutcoreLoader`) over `TorchBatches`.

`OutcoreLoader` counts epochs and the steps delivered (each batch says its step), so its ``state_dict``
is the global position in the epoch: the first step not delivered (and, with ``in_order=False``, the
later ones already delivered). Each worker's position follows from it, so the state loads with any
number of workers, and on any number of ranks with the same global batch size. A ``collate_fn`` gets
each outcore batch (a `TorchBatch`), as a DataLoader with ``batch_size=None`` gives it each item.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Unpack

import numpy as np

from ..errors import OptionError
from ..iterate.options import DECODES, check_state
from ..iterate.shared import Mailbox, SharedBatch, Slot, join_parts
from ..iterate.stats import LoaderStats, Stats
from ..storage import RemoteStore, Store
from ..storage.remote import FORKED_AFTER_USE
from .forkserver import importing, preload_forkserver
from .keywords import TorchKeywords, split_torch_keywords
from .torch_batches import PART_FILE, TorchBatch, TorchBatches, as_tensor, pinned_empty
from .torch_decode import DeviceDecoder, device_decoder
from .torch_device import to_device
from .torch_module import DataLoader, pin_memory, torch
from .torch_pinned import PinnedParts

__all__ = ["OutcoreLoader", "TorchBatch", "TorchBatches", "loader", "to_device"]

pinned_parts = PinnedParts(pinned_empty)  # the parts of batches the DataLoader's pin thread gathers in pinned memory


class Delivered(NamedTuple):
    """What a worker hands the loader: the collated ``value``, its ``step`` and ``size``; for a part of a batch
    (`TorchBatches.split_batches`), its ``part``, ``samples``, its first row in the batch (``offset``) and the
    mailbox ``folder`` of the batch's files, and ``value`` the part's fields, collated once the parts are
    `joined`."""

    value: Any
    step: int
    size: int
    part: int | None = None
    samples: Any = None
    offset: int = 0
    folder: str | None = None

    def pin_memory(self) -> Delivered:
        """Run by the DataLoader's pin thread (``pin_memory=True``) on each item: a whole batch's value pinned as
        the DataLoader pins it; a part's rows copied from the batch's files into the batch's pinned memory
        (`outcore.adapters.torch_pinned`), there and then, not on the training loop's thread once every part
        has come."""
        if self.part is None:
            return self._replace(value=pin_memory(self.value))
        if not self.size or self.folder is None:
            return self
        return self._replace(value=pinned_parts.copy(self.value, self.folder, self.offset, self.size))


class Collate:
    """The DataLoader's ``collate_fn``: the user's (default: tensors kept as they are) on each `TorchBatch`,
    wrapped with where the batch comes from; a part of a batch passes as it is, to be joined and collated
    by the loader (`joined`). Pickles with the user's function (spawn, forkserver)."""

    def __init__(self, function: Callable[[TorchBatch], Any] | None) -> None:
        self.function = function

    def __call__(self, batch: TorchBatch) -> Delivered:
        if batch.part is not None:
            return Delivered(SharedBatch(dict(batch), batch.no_room), batch.index, len(batch.samples), batch.part,
                             batch.samples, batch.offset, batch.folder)
        return Delivered(self.collated(batch), batch.index, next(iter(batch.values())).shape[0])

    def collated(self, batch: TorchBatch) -> Any:
        """The user's ``collate_fn`` of ``batch``; without one, ``batch`` itself: its values are tensors already, or
        text (numpy strings), which the DataLoader's ``default_convert`` leaves as they are (it would only copy the
        mapping)."""
        return batch if self.function is None else self.function(batch)


def joined(parts: list[Delivered], epoch: int, mailbox: Mailbox | None, channels_first: bool) -> TorchBatch:
    """The `TorchBatch` that the workers' ``parts`` of one batch make, in the order of their parts
    (`outcore.iterate.shared.join_parts`: mapped from shared memory where the workers wrote it).

    >>> part = lambda p, x: Delivered(SharedBatch({"x": np.array(x)}), 0, len(x), p, np.array(x))
    >>> batch = joined([part(1, [3]), part(0, [1, 2])], epoch=0, mailbox=None, channels_first=False)
    >>> batch["x"].tolist(), batch.samples.tolist(), batch.index
    ([1, 2, 3], [1, 2, 3], 0)
    """
    parts = sorted((part for part in parts if part.size), key=lambda part: part.part)
    sizes = [part.size for part in parts]
    pinned, rest = pinned_parts.take([part.value for part in parts], sizes)  # the fields the pin thread gathered
    values = {**join_parts(rest, sizes, mailbox), **pinned}
    return TorchBatch({name: as_tensor(values[name], channels_first) for name in parts[0].value.fields}, epoch,
                      None, parts[0].step, np.concatenate([part.samples for part in parts]))


class OutcoreLoader(DataLoader):
    """A DataLoader over `TorchBatches` that counts epochs (the next pass is the next epoch) and can
    resume mid-epoch: `state_dict` after k batches, `load_state_dict` in a new loader (with any number of
    workers, on any number of ranks with the same global batch size), and iteration continues with
    exactly the global steps the interrupted run would have made, in the same order."""

    dataset: TorchBatches

    def __init__(self, batches: TorchBatches, *, collate_fn: Callable[[TorchBatch], Any] | None = None,
                 decoder: DeviceDecoder | None = None, **dataloader_options: Any) -> None:
        # with a decoder, batches come with their pictures' files, decoded (then collated) here, on its device
        self._decoder, self._then = decoder, collate_fn if decoder is not None else None
        super().__init__(batches, batch_size=None, collate_fn=Collate(None if decoder is not None else collate_fn),
                         **dataloader_options)
        batches.loader_passes = 0  # from now on it is read in this loader's passes only
        # made in this process (no workers), batches are made in pinned memory: the DataLoader pins them as they are
        batches.pinned = self.pin_memory and not self.num_workers and batches.options.client is None and \
            torch.cuda.is_available()
        self._stats = LoaderStats()
        self.made_here = 0  # batches made in this process while the workers' forkserver imported
        self._mailbox: Mailbox | None = None  # where workers making parts of each batch write them (`_slot`)
        self._no_mailbox = False
        self._pinned_parts = pinned_parts  # kept: a pass left unfinished at exit ends after the module's globals

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        batches = self.dataset
        batches.resolve_rank()  # before the workers start: they receive it
        if batches.step >= len(batches):  # the last pass stopped at its last batch (Lightning stops at len())
            batches.set_epoch(batches.epoch + 1)
        if self.num_workers:  # before the workers start: they receive it
            batches.split_batches(self._slot())
        batches.passes += 1
        batches.publish()  # for workers that persist across epochs
        step, ahead = batches.step, set(batches.skip)  # the first step not delivered, those delivered after it
        batches.loader_passes += 1  # before the workers start: they receive it
        batches_of = self._delivered()
        try:
            asked = time.perf_counter()
            for delivered in batches_of:
                self._stats.record(time.perf_counter() - asked, 0, delivered.size)
                ahead.add(delivered.step)
                while step in ahead:
                    ahead.remove(step)
                    step += 1
                batches.resume(batches.epoch, step, ahead)
                yield delivered.value if self._decoder is None else self._decoded(delivered.value)
                asked = time.perf_counter()
        finally:
            batches.loader_passes -= 1
            batches_of.close()  # its DataLoader iterator goes, and with it workers that do not persist
            self._remove_parts(None)
        batches.set_epoch(batches.epoch + 1)

    def _decoded(self, batch: TorchBatch) -> Any:
        """``batch``'s pictures decoded on the decoder's device, then the user's ``collate_fn``."""
        decoded = self._decoder(batch)
        return decoded if self._then is None else self._then(decoded)

    def _delivered(self) -> Iterator[Delivered]:
        """The pass's batches: without workers, made here (`_here`); with workers, made here while the forkserver
        they would come from still imports torch and outcore (`outcore.adapters.forkserver`: a second or more),
        each the batch its worker would make, then the workers', from the first step not delivered (the loop
        moves ``step`` on as it hands each out), unless none is left."""
        batches = self.dataset
        if not self.num_workers:  # the DataLoader's iterator made for its checks, warnings and seed; left unread
            yield from self._here(pinning=super().__iter__()._pin_memory, until_workers_start=False)
            return
        if self._workers_would_wait():
            yield from self._here(pinning=self.pin_memory and torch.cuda.is_available(), until_workers_start=True)
            if batches.step >= len(batches) and not batches.skip:
                return  # every batch made here: the workers start with a later pass
            batches.publish()  # persistent workers start from here
        delivered = self._whole(super().__iter__())
        try:
            yield from delivered
        finally:
            delivered.close()

    def _here(self, pinning: bool, until_workers_start: bool) -> Iterator[Delivered]:
        """Batches made in this process, as a DataLoader without workers delivers them (collated, then pinned with
        ``pinning``), without its per-batch machinery on the training loop's thread (its fetcher, its profiler's
        record); with ``until_workers_start``, only while the workers' forkserver imports, each counted in
        `made_here`."""
        made = iter(self.dataset)
        try:
            for batch in made:
                if until_workers_start:  # (an attribute set on a DataLoader runs its Python `__setattr__`)
                    self.made_here += 1
                delivered = self.collate_fn(batch)
                yield delivered.pin_memory() if pinning else delivered
                if until_workers_start and not importing():
                    break
        finally:
            made.close()

    def _workers_would_wait(self) -> bool:
        """Whether this pass's workers are still to be forked by a forkserver still importing."""
        alive = self.persistent_workers and self._iterator is not None
        return bool(self.num_workers) and start_method(self.multiprocessing_context) == "forkserver" and not alive \
            and importing()

    def _whole(self, delivered: Iterator[Delivered]) -> Iterator[Delivered]:
        """The DataLoader's items as whole batches: the parts of a batch are joined once all
        have come (`joined`), and collated; at the first, the files earlier passes' workers left are removed."""
        batches, parts, first = self.dataset, {}, True
        for item in delivered:
            if item.part is None:
                yield item
                continue
            if first:
                self._remove_parts(batches.passes)
                first = False
            parts.setdefault(item.step, []).append(item)
            if len(parts[item.step]) == batches.parts:
                batch = joined(parts.pop(item.step), batches.epoch, self._mailbox, batches.channels_first)
                yield Delivered(self.collate_fn.collated(self._pinned(batch)), batch.index, len(batch.samples))

    def _remove_parts(self, current: int | None) -> None:
        """Remove the files of batches that passes other than ``current`` made and never delivered (a pass
        stopped early; workers still writing when it stopped)."""
        if self._mailbox is None:
            return
        self._pinned_parts.drop(str(self._mailbox.folder), None if current is None else f"{PART_FILE}{current}-")
        for left in self._mailbox.folder.glob(f"{PART_FILE}*"):
            if current is None or not left.name.startswith(f"{PART_FILE}{current}-"):
                left.unlink(missing_ok=True)

    def _slot(self) -> Slot | None:
        """Where the workers write the parts of this pass's batches: a folder in shared memory made for the
        loader's life (None without one: the workers then take turns at whole batches)."""
        if self._mailbox is None and not self._no_mailbox:
            self._mailbox = Mailbox.open()
            self._no_mailbox = self._mailbox is None
            if self._mailbox is not None:
                weakref.finalize(self, self._mailbox.close)
        return None if self._mailbox is None else self._mailbox.slot

    def _pinned(self, batch: TorchBatch) -> TorchBatch:
        """``batch`` in pinned memory when the loader pins (a DataLoader pins what its workers send, and the
        parts' batches are mapped here)."""
        if not (self.pin_memory and torch.cuda.is_available()):
            return batch
        values = {name: value.pin_memory() if isinstance(value, torch.Tensor) else value for name, value in batch.items()}
        return TorchBatch(values, batch.epoch, batch.worker, batch.index, batch.samples)

    def __len__(self) -> int:
        """The rank's batches per epoch (workers making parts of each deliver more items to the DataLoader)."""
        return len(self.dataset)

    def stats(self) -> dict[str, float]:
        """How long the training loop waited for each batch: see `BatchIterator.stats` (``ready_mean``
        is not known through a DataLoader and reads 0); with workers, ``batches_before_workers``: those made
        in this process while the workers' forkserver was still importing."""
        extra = {"batches_before_workers": self.made_here} if self.num_workers else {}
        return Stats({**self._stats.summary(), **extra})

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: the first step not delivered, the later ones delivered (``skip``: only with
        ``in_order=False``) and the settings that fix the order. The same on every rank, JSON-serialisable."""
        batches = self.dataset
        return {**self._settings(), "epoch": batches.epoch, "step": batches.step, "skip": list(batches.skip)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, saved by any rank of a run with the same global batch size and order
        settings (any number of ranks and workers that divides its streams; left out, ``streams`` are the
        state's: `BatchOptions.resuming`)."""
        batches = self.dataset
        batches.resolve_rank()
        batches.options = batches.options.resuming(state)
        state = {"chunk_size": batches.chunk_size, **state}  # a state saved before 0.1.0 does not record it
        check_state(state, self._settings(), "loader")
        self.dataset.resume(state["epoch"], state["step"], state.get("skip", ()))

    def _settings(self) -> dict[str, Any]:
        batches = self.dataset
        batches.resolve_rank()
        return {**batches.options.plan_settings(), "num_samples": batches.store_samples,
                "chunk_size": batches.chunk_size}


def loader(store: Store, batch_size: int, *, channels_first: bool = False,
           **options: Unpack[TorchKeywords]) -> OutcoreLoader:
    """A DataLoader of batches of ``store``, read by ``num_workers`` worker processes (default 0).

    The batch options are those of `Dataset.batches`, but ``shuffle`` is off unless asked for, as in a
    DataLoader: pass ``shuffle=True`` to train. Without it, and with ``num_workers=0``, batches come in
    store order, so predictions line up with the store's labels and paths; with workers, use each batch's
    ``samples``. ``rank``/``world_size`` default to ``torch.distributed``'s when each iteration starts (so
    the loader may be built before ``init_process_group``). A ``collate_fn`` gets each batch (a
    `TorchBatch`) and returns what the loop receives. Every other keyword goes to the DataLoader as it is
    (``num_workers``, ``pin_memory``, ``multiprocessing_context``, ``prefetch_factor``,
    ``persistent_workers``: workers kept across epochs follow each epoch and resume, and keep the store
    open, ...). Batches are made by outcore, so the DataLoader's own batching is off.

    Workers: where the rank has a stream for each (``streams / world_size`` of them, 8 by default on one
    rank) and the machine has shared memory (``/dev/shm``), each worker makes **its part of every batch**
    (the samples of its streams, read from its streams' chunks only), written straight into the batch's
    memory beside the other workers' parts, and the loader maps the batch (with ``pin_memory``, the
    DataLoader's pin thread copies each part into the batch's pinned memory as it comes: `Delivered.pin_memory`):
    no chunk is read twice, no batch is copied between processes, and ``collate_fn`` runs on the whole batch
    in this process.
    Elsewhere the workers take turns at whole batches, which the DataLoader sends over (each worker then
    reads the chunks its batches draw on: 1.4-3x the rank's share between them). ``num_workers=0`` is the
    default: outcore already reads and decodes on a pool of threads; workers help where per-batch Python
    work in the transform holds the GIL. Workers may start by fork, spawn or forkserver; with spawn and
    forkserver, the transform must pickle (defined at module level). Workers reading an object store start
    by forkserver unless told spawn (its client cannot run after a fork), with torch, outcore and the
    script's main module imported once in the forkserver (`outcore.adapters.forkserver`); while it still
    imports them (a second or so after the loader is made), the loader makes the first batches itself, the
    same batches, and the workers go on from there; they persist across epochs unless told
    ``persistent_workers=False``.

    ``decode="cuda"`` (any torch device) decodes the encoded pictures on that device, in this process: the
    readers (threads or workers) hand over their files and the boxes the transform's opening crop drew, and
    `outcore.adapters.torch_decode` decodes the plain JPEGs with torchvision's nvJPEG, cuts, resizes and mirrors
    them there; the batch's picture fields are tensors on the device, the others stay on the host (then
    ``collate_fn`` runs, here). For the case where the CPUs cannot decode as fast as the GPU trains.

    >>> for batch in ds.torch(batch_size=256, shuffle=True, num_workers=2):  # doctest: +SKIP
    ...     loss = model(batch["images"].float()).mean()
    """
    batch_keywords, dataloader_options = split_torch_keywords(options)
    batch_keywords.setdefault("shuffle", False)
    decoder = None
    if batch_keywords.get("decode", "here") not in DECODES:  # a device: the files are decoded there, in this process
        decoder = device_decoder(store, batch_keywords.get("fields"), batch_keywords.get("transform"),
                                 batch_keywords["decode"], channels_first)
        batch_keywords["decode"] = "later"
    num_workers = int(dataloader_options.get("num_workers", 0))
    if num_workers > 0 and isinstance(store.group.store, RemoteStore):
        _start_without_fork(dataloader_options)
    batches = TorchBatches(store, batch_size, num_workers=num_workers, channels_first=channels_first,
                           **batch_keywords)
    context = dataloader_options.get("multiprocessing_context")
    if num_workers > 0:
        _check_picklable(batches, dataloader_options.get("collate_fn"), context)
        if dataloader_options.get("persistent_workers"):
            batches.persist(context)
    return OutcoreLoader(batches, decoder=decoder, **dataloader_options)


def _start_without_fork(dataloader_options: dict[str, Any]) -> None:
    """Workers reading an object store start by forkserver (the default then) or spawn: obstore cannot run
    in a process forked after it was used (`outcore.storage.remote.FORKED_AFTER_USE`). Such a worker would
    import torch and outcore afresh: the forkserver imports them once, before it forks any
    (`outcore.adapters.forkserver`), and the workers persist across epochs unless told
    ``persistent_workers=False`` (their store, client and cache stay open, so a warm cache's epoch starts at
    once; `benchmarks/remote_workers.py` times both, docs/benchmarks.md)."""
    method = start_method(dataloader_options.setdefault("multiprocessing_context", "forkserver"))
    if method == "fork":
        raise OptionError(f"multiprocessing_context='fork' with a store in an object store: {FORKED_AFTER_USE}")
    if method == "forkserver":
        preload_forkserver()
    dataloader_options.setdefault("persistent_workers", True)


def start_method(context: Any) -> str:
    """How DataLoader workers given ``multiprocessing_context=context`` start: its name, the context's, or
    (None) this process's default."""
    if isinstance(context, str):
        return context
    return context.get_start_method() if context is not None else multiprocessing.get_start_method()


def _check_picklable(batches: TorchBatches, collate_fn: Any, context: Any) -> None:
    """Workers started by spawn or forkserver receive the dataset and the collate_fn pickled: say so now, not
    in a worker."""
    method = start_method(context)
    if method == "fork":
        return
    for what, value in (("the dataset (with its transform)", batches), ("the collate_fn", collate_fn)):
        try:
            pickle.dumps(value)
        except Exception as error:  # noqa: BLE001 - whatever pickle raises, the message below says what to do
            raise OptionError(
                f"DataLoader workers started by {method!r} receive {what} pickled, and it cannot be "
                f"({type(error).__name__}: {error}): define the transform and collate_fn at module level (not "
                "a lambda or a local function), or use multiprocessing_context='fork'"
            ) from None

