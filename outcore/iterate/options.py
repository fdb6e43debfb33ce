"""The options of a batch iteration: one validated value, and the keywords users pass to make it."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, TypedDict

import numpy as np

from ..errors import OptionError
from .batch import Transform
from .plan import Consumer, EpochPlan, batches_in, check_streams, default_streams

DECODES = ("here", "later")  # where encoded pictures are decoded: as the batch is made, or by its consumer


class BatchKeywords(TypedDict, total=False):
    """The keywords of `Dataset.batches`, which the framework adapters take too.

    - ``fields``: the fields to read (default: all).
    - ``shuffle``: chunk-aware shuffling (default ``True``); ``False`` reads in storage order.
    - ``seed``: the seed of every epoch's order and of the transform's generators (default 0).
    - ``buffer_chunks``: how many chunks a global batch draws from, at least one per stream (default 8):
      more mixes better and holds more memory.
    - ``streams``: the canonical streams an epoch is made of (default: 8, or the least multiple of 8 and
      ``world_size``, `outcore.iterate.plan.default_streams`, so that any number of ranks runs): the batches
      of every global step are the same on any number of ranks dividing it (1, 2, 4, 8 by default), and a
      state saved on one resumes on another (left out, the state's streams are taken); a step draws on at
      least one chunk per stream, so more streams per rank hold more memory.
    - ``prefetch``: finished batches kept ready ahead of the consumer (default 2).
    - ``transform``: ``transform(batch, rng) -> batch`` run on each batch, ``rng`` seeded per batch.
    - ``rank``, ``world_size``: this process's share of each epoch (defaults 0 and 1).
    - ``drop_last``: leave out the short last global step (default ``False``: every rank gets
      ``ceil(N / world_size)`` samples, the short ones repeating one sample).
    - ``client``: a ``distributed.Client`` whose workers read, decode and augment (default: local threads).
    - ``indices``: iterate only these samples (store indices, each once; e.g. a k-fold's part), read chunk
      by chunk like the whole store, with every guarantee of it (`Subset`). Default: all.
    - ``skip_damaged``: how many damaged or unreadable chunks an epoch may leave out (default 0: the first
      is the error). Each one left out is an `OutcoreWarning` naming it, counted as ``damaged_chunks`` in
      ``stats()``; its samples are missing from their batches, every other sample comes exactly once.
      Reads in this process (threads, DataLoader workers) only: on a Dask cluster it stays 0.
    - ``decode``: ``"here"`` (default): encoded pictures are decoded (and cut by the transform's opening crop)
      as the batch is made; ``"later"``: the batches hold their files undecoded, for a decoder elsewhere (a
      GPU's: ``ds.torch(decode="cuda")``, `outcore.adapters.torch_decode`): each encoded field ``F`` as its
      files' bytes back to back with ``F_offsets``, and ``F_boxes``, ``F_flips``, ``F_sizes``
      (`outcore.format.undecoded_names`): the box of each picture to resize to the crop's size (the whole
      picture where no crop opens the transform), its mirrors and its picture's size.
    - ``process``: make the batches in a process of their own (default ``False``: in this one), whose threads
      read, decode and augment under a GIL of their own, handed over through shared memory
      (`outcore.iterate.process`): for a consumer that holds this process's GIL much of the time (a training
      loop launching a GPU's kernels from Python). The same batches; the transform must pickle. A number
      ``n`` makes them in ``n`` processes, each making its part of every batch (its share of the rank's
      streams, at its rows of the batch's files) on its share of the CPUs: for more cores than one
      process's GIL keeps busy (at most the rank's streams).
    """

    fields: Sequence[str] | None
    shuffle: bool
    seed: int
    buffer_chunks: int
    prefetch: int
    transform: Transform | None
    rank: int
    world_size: int
    streams: int | None
    drop_last: bool
    client: Any
    indices: Sequence[int] | np.ndarray | None
    skip_damaged: int
    decode: str
    process: bool | int


class Subset:
    """The samples an iteration is restricted to (``indices=``): store indices, each once, in any order
    (an epoch is made of them as a set: in store order without ``shuffle``). ``digest`` identifies them in
    a saved state (a state of another subset does not load). With ``repeats`` (a mixture's sources), an
    index may come several times: the sample is then read that many times an epoch (its chunk once).

    >>> Subset([7, 2, 5]).indices.tolist(), len(Subset(range(10)))
    ([2, 5, 7], 10)
    >>> Subset([1, 1])
    Traceback (most recent call last):
    ...
    outcore.errors.OptionError: indices= holds sample 1 more than once: give each sample once
    """

    def __init__(self, indices: Sequence[int] | np.ndarray, *, repeats: bool = False) -> None:
        values = np.asarray(indices)
        if values.ndim != 1 or not (values.dtype.kind in "iu" or values.size == 0):
            raise OptionError(f"indices= must be a 1-D sequence of sample indices (integers); got an array of "
                              f"dtype {values.dtype} and shape {values.shape}")
        ordered = np.sort(values.astype(np.int64))
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(repeated) and not repeats:
            raise OptionError(f"indices= holds sample {int(repeated[0])} more than once: give each sample once")
        if not len(ordered):
            raise OptionError("indices= is empty: an epoch of no samples (check how the subset was made)")
        ordered.setflags(write=False)
        self.indices = ordered
        self.digest = hashlib.sha1(ordered.tobytes()).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.indices)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Subset) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Subset({len(self)} samples, digest {self.digest})"

    def check(self, num_samples: int) -> None:
        """An index outside the store is an `OptionError` naming it."""
        if len(self) and (self.indices[0] < 0 or self.indices[-1] >= num_samples):
            bad = int(self.indices[0] if self.indices[0] < 0 else self.indices[-1])
            raise OptionError(f"indices= holds sample {bad}, outside the store's {num_samples:,} samples "
                              f"[0, {num_samples})")


@dataclass(frozen=True)
class BatchOptions:
    """The validated options of a batch iteration (see `BatchKeywords` for their meaning).

    >>> BatchOptions(256, seed=3).plan_settings()["seed"]
    3
    """

    batch_size: int
    fields: tuple[str, ...] | None = None
    shuffle: bool = True
    seed: int = 0
    buffer_chunks: int = 8
    prefetch: int = 2
    transform: Transform | None = None
    rank: int = 0
    world_size: int = 1
    streams: int | None = None  # as given: `canonical_streams` is what an epoch is made of
    drop_last: bool = False
    client: Any = None
    indices: Subset | None = None
    skip_damaged: int = 0
    decode: str = "here"
    process: bool | int = False

    def __post_init__(self) -> None:
        if self.decode not in DECODES:
            raise OptionError(f"decode={self.decode!r}: say 'here' (the batches' pictures decoded as they are made) "
                              "or 'later' (their files left encoded, for a decoder elsewhere)")
        if self.batch_size < 1:
            raise OptionError(f"batch_size={self.batch_size} must be at least 1")
        if self.prefetch < 1:
            raise OptionError(f"prefetch={self.prefetch} must be at least 1")
        if self.buffer_chunks < 0:
            raise OptionError(f"buffer_chunks={self.buffer_chunks} must be 0 or more")
        if not isinstance(self.skip_damaged, int) or self.skip_damaged < 0:
            raise OptionError(f"skip_damaged={self.skip_damaged!r} must be a number of chunks, 0 or more")
        if self.skip_damaged and self.client is not None:
            raise OptionError("skip_damaged= leaves out damaged chunks read in this process; a Dask cluster's "
                              "workers read them: leave skip_damaged= out with client=")
        if not isinstance(self.process, int) or self.process < 0:
            raise OptionError(f"process={self.process!r}: say True (a process of their own making the batches), a "
                              "number of processes, or False")
        if self.processes > 1 and self.skip_damaged:
            raise OptionError(f"skip_damaged= counts the chunks an epoch leaves out, and process={self.process} "
                              "processes would each count their own: use process=True with skip_damaged=")
        if self.process and self.client is not None:
            raise OptionError("process=True makes the batches in a process of this machine; with client=, the "
                              "cluster's workers make them: leave one of them out")
        Consumer(self.rank, self.world_size)  # checks the rank
        if self.shuffle and self.streams is not None:  # without, each rank reads its part of the store in order
            check_streams(self.streams, self.world_size)
        streams = self.canonical_streams // self.world_size
        if self.processes > streams and not self.shuffle:
            raise OptionError(f"process={self.process} splits each batch among processes by the rank's streams, and "
                              "without shuffle a rank reads its part of the store as one: use process=True")
        if self.processes > streams:
            raise OptionError(f"process={self.process} splits each batch among processes by the rank's streams, and "
                              f"it has {streams}: use process={streams} or fewer, or streams="
                              f"{self.processes * self.world_size} (more streams hold more chunks in memory)")
        if isinstance(self.fields, str):
            raise TypeError(f"fields={self.fields!r} must be a list of field names, not one string")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))
        if self.indices is not None and not isinstance(self.indices, Subset):
            object.__setattr__(self, "indices", Subset(self.indices))

    @property
    def processes(self) -> int:
        """How many processes of their own make the batches (``process``): 0 where this one does.

        >>> BatchOptions(8).processes, BatchOptions(8, process=True).processes, BatchOptions(8, process=3).processes
        (0, 1, 3)
        """
        return int(self.process)

    @classmethod
    def of(cls, batch_size: int, keywords: BatchKeywords) -> BatchOptions:
        """Options from `BatchKeywords`; an unknown keyword is a ``TypeError`` that lists the known ones, and
        ``streams`` without ``shuffle`` (where it would change nothing) an `OptionError`."""
        known = set(BatchKeywords.__optional_keys__)
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(f"unknown batch option(s) {unknown}; the options are {sorted(known)}")
        if "streams" in keywords and not keywords.get("shuffle", True):
            raise OptionError(
                f"streams={keywords['streams']} orders shuffled epochs; with shuffle=False each rank reads its part "
                "of the store in storage order, whatever streams says: leave streams= out"
            )
        return cls(batch_size, **keywords)

    def num_samples(self, store_samples: int) -> int:
        """The samples of an epoch of a store of ``store_samples``: all, or the subset's (checked against it)."""
        if self.indices is None:
            return store_samples
        self.indices.check(store_samples)
        return len(self.indices)

    @property
    def canonical_streams(self) -> int:
        """The streams each epoch is made of: ``streams`` as given, else the default for ``world_size``
        (`outcore.iterate.plan.default_streams`); one per rank without ``shuffle``.

        >>> BatchOptions(32, world_size=6).canonical_streams, BatchOptions(32, world_size=6, streams=12).canonical_streams
        (24, 12)
        """
        if not self.shuffle:
            return self.world_size
        return default_streams(self.world_size) if self.streams is None else self.streams

    def resuming(self, state: dict[str, Any]) -> BatchOptions:
        """These options, made to continue ``state``: with ``streams`` left out, the streams the state's order
        was made of, where this world size can share them (the default differs between world sizes); a
        state whose streams it cannot share is an `OptionError` saying what to pass from the first run on.

        >>> BatchOptions(32, world_size=2).resuming({"streams": 24}).canonical_streams
        24
        >>> BatchOptions(32, world_size=16).resuming({"streams": 8})
        Traceback (most recent call last):
        ...
        outcore.errors.OptionError: the state was saved from an epoch order of 8 streams, which world_size=16 ...
        """
        saved = state.get("streams")
        if not self.shuffle or saved is None or saved == self.canonical_streams:
            return self
        if self.streams is None and saved % self.world_size == 0:
            return dataclasses.replace(self, streams=saved)
        if saved % self.world_size:
            how = f"which world_size={self.world_size} cannot share"
        else:
            how = f"not the streams={self.streams} asked for"
        hint = math.lcm(saved, self.world_size)
        raise OptionError(
            f"the state was saved from an epoch order of {saved} streams, {how}: a resume continues the saved "
            "order, on a number of ranks that divides its streams. To resume on other world sizes, pass streams= "
            f"a multiple of every world size you will run on (e.g. streams={hint}) from the first run on (it "
            f"changes the order), or resume on a world size dividing {saved}"
        )

    @property
    def global_batch_size(self) -> int:
        """The samples of a global step: ``batch_size`` on each of ``world_size`` ranks."""
        return self.batch_size * self.world_size

    def steps(self, num_samples: int) -> int:
        """Global steps (each rank's batches) of an epoch of ``num_samples``: the same on every rank.

        >>> BatchOptions(100, world_size=3).steps(1000), BatchOptions(100, world_size=3, drop_last=True).steps(1000)
        (4, 3)
        """
        return batches_in(num_samples, self.global_batch_size, self.drop_last)

    def plan(self, num_samples: int, chunk_size: int, epoch: int, part: tuple[int, int] = (0, 1)) -> EpochPlan:
        """This rank's `EpochPlan` of ``epoch`` of a store of ``num_samples`` in chunks of ``chunk_size`` (with
        ``part``, that part of each batch)."""
        return EpochPlan(
            num_samples, chunk_size, batch_size=self.batch_size, shuffle=self.shuffle, seed=self.seed, epoch=epoch,
            buffer_chunks=self.buffer_chunks, rank=self.rank, world_size=self.world_size, drop_last=self.drop_last,
            streams=self.canonical_streams, indices=None if self.indices is None else self.indices.indices, part=part,
        )

    def plan_settings(self) -> dict[str, Any]:
        """The options that decide each epoch's global steps: a resumed iteration must use the same (on any
        number of ranks: the global batch size, not each rank's, must match)."""
        kept = ("shuffle", "seed", "buffer_chunks", "drop_last")
        subset = None if self.indices is None else {"samples": len(self.indices), "digest": self.indices.digest}
        return {"global_batch_size": self.global_batch_size, "streams": self.canonical_streams,
                **{f.name: getattr(self, f.name) for f in fields(self) if f.name in kept}, "indices": subset}


def check_state(state: dict[str, Any], settings: dict[str, Any], what: str) -> None:
    """Refuse a saved ``state`` whose settings differ from ``settings`` (those that fix the order), naming them.

    >>> check_state({"seed": 1}, {"seed": 2}, "iterator")
    Traceback (most recent call last):
    ...
    outcore.errors.OptionError: state does not match this iterator (saved, current): {'seed': (1, 2)}
    """
    mismatched = {k: (state.get(k), v) for k, v in settings.items() if state.get(k) != v}
    if mismatched:
        raise OptionError(f"state does not match this {what} (saved, current): {mismatched}")
