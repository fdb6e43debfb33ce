"""Shuffle on write, with a task graph linear in the number of blocks and memory bounded by a few blocks.

Indexing a dask array with a global permutation (``x[order]``) makes every output block depend on every
input block: 64 input blocks make 8,384 tasks, 256 make 125,658, and the scheduler may hold many blocks
at once. Instead, an on-disk source is shuffled externally, in two passes through a scratch folder:

1. *scatter*: each input block (read once, in order) is sorted by where its samples go and written to
   its own scratch file, so the samples bound for each output shard lie together, in output order;
2. *gather*: each output shard reads, from every scratch file, the run of samples bound for it.

One barrier task separates the passes, so the graph has about three tasks per block whatever the
number of blocks, and each task holds one block or one shard. The scratch folder needs as much disk
as the source's samples take in memory, beside the store; it is removed with the staging folder.
Arrays already in memory (numpy) skip the scratch: each shard takes its samples straight from them.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
from dask.delayed import Delayed

from ..seeds import Domain, permutation

if TYPE_CHECKING:
    import dask.array as da

_WRITE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Permuted:
    """``array[order]``, made shard by shard: `parts` are tasks that each compute to a `Part`, which the
    task writing the shard calls, so no shard waits in memory between two tasks.

    ``array`` is numpy, dask, zarr or h5py with samples on axis 0; ``scratch`` is a folder for the
    external shuffle (created when needed).
    """

    array: Any
    order: np.ndarray
    scratch: Path

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.order), *self.array.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def __len__(self) -> int:
        return len(self.order)

    def parts(self, shard_size: int) -> list[Delayed]:
        """One task per shard of ``shard_size`` samples, computing to the `Part` that makes the shard."""
        starts = range(0, len(self.order), shard_size)
        if isinstance(self.array, np.ndarray) and not isinstance(self.array, np.memmap):
            source = dask.delayed(self.array, name=f"outcore-source-{uuid.uuid4().hex}", traverse=False)
            take = dask.delayed(_Take, pure=True)
            return [take(source, self.order[start : start + shard_size]) for start in starts]
        return _external(as_dask(self.array, shard_size), self.order, shard_size, self.scratch)


class Part:
    """Makes one shard's samples when called (inside the task that writes the shard)."""

    def __call__(self) -> np.ndarray:
        raise NotImplementedError


class _Take(Part):
    def __init__(self, array: np.ndarray, indices: np.ndarray) -> None:
        self.array, self.indices = array, indices

    def __call__(self) -> np.ndarray:
        return self.array[self.indices]


def _external(source: da.Array, order: np.ndarray, shard_size: int, scratch: Path) -> list[Delayed]:
    """The gather parts of the two-pass shuffle, one per output shard (see the module docstring)."""
    num_samples, block_size = len(order), source.chunks[0][0]
    destination = np.empty(num_samples, dtype=np.int64)
    destination[order] = np.arange(num_samples)  # where each source sample goes
    folder = scratch / uuid.uuid4().hex
    scatter = dask.delayed(_scatter, pure=False)
    scattered = [
        scatter(block, destination[b * block_size : (b + 1) * block_size], folder / f"{b}.bin")
        for b, block in enumerate(source.to_delayed(optimize_graph=False).ravel())
    ]
    barrier = dask.delayed(_all_done, pure=False)(*scattered)
    # each input block's destinations, sorted, as one sorted array of keys block * N + destination
    keys = np.concatenate([np.sort(destination[start : start + block_size]) + b * num_samples
                           for b, start in enumerate(range(0, num_samples, block_size))])
    shared_keys = dask.delayed(keys, name=f"outcore-keys-{uuid.uuid4().hex}", traverse=False)
    gather = dask.delayed(_Gather, pure=False)
    row = (tuple(source.shape[1:]), np.dtype(source.dtype))
    return [gather(barrier, shared_keys, folder, (start, min(num_samples, start + shard_size)), num_samples,
                   len(scattered), row)
            for start in range(0, num_samples, shard_size)]


def _scatter(block: np.ndarray, destination: np.ndarray, path: Path) -> None:
    """Write ``block``'s samples sorted by where they go, a few MiB at a time (no second copy of the block)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sorted_rows = np.argsort(destination, kind="stable")
    rows_per_write = max(1, _WRITE_BYTES // max(1, block[:1].nbytes))
    with open(path, "wb") as file:
        file.writelines(np.ascontiguousarray(block[sorted_rows[start : start + rows_per_write]]).data
                        for start in range(0, len(sorted_rows), rows_per_write))


def _all_done(*_: None) -> None:
    return None


class _Gather(Part):
    """Output samples ``start .. stop - 1``: from each scratch file, the run of samples bound for them."""

    def __init__(self, _: None, keys: np.ndarray, folder: Path, span: tuple[int, int], num_samples: int,
                 num_blocks: int, row: tuple[tuple[int, ...], np.dtype]) -> None:
        self.keys, self.folder, self.span, self.num_samples, self.num_blocks, self.row = (
            keys, folder, span, num_samples, num_blocks, row)

    def __call__(self) -> np.ndarray:
        (start, stop), (sample_shape, dtype), keys = self.span, self.row, self.keys
        out = np.empty((stop - start, *sample_shape), dtype=dtype)
        row_bytes = int(np.prod(sample_shape, dtype=np.int64)) * dtype.itemsize
        offsets = np.arange(self.num_blocks, dtype=np.int64) * self.num_samples
        firsts, lasts = np.searchsorted(keys, offsets + start), np.searchsorted(keys, offsets + stop)
        block_starts = np.searchsorted(keys, offsets)
        for b in np.flatnonzero(lasts > firsts).tolist():
            first, count = int(firsts[b] - block_starts[b]), int(lasts[b] - firsts[b])
            with open(self.folder / f"{b}.bin", "rb") as file:
                file.seek(first * row_bytes)
                values = np.fromfile(file, dtype=dtype, count=count * row_bytes // dtype.itemsize)
            out[keys[firsts[b] : lasts[b]] - offsets[b] - start] = values.reshape(count, *sample_shape)
        return out


def as_dask(array: Any, block_size: int) -> da.Array:
    """A lazy view of ``array`` in blocks of ``block_size`` samples; h5py datasets are read under a lock. A NumPy
    array's blocks are views of it (`_views`), a memory-mapped file's read as the tasks run.

    >>> lazy = as_dask(np.arange(5), 2)
    >>> lazy.chunks, int(lazy.sum())
    (((2, 2, 1),), 10)
    """
    import dask.array as da  # here, not at the top: `outcore.ingest.imports`

    if isinstance(array, np.ndarray):
        return _views(array, block_size)
    if isinstance(array, da.Array):
        lazy = array
    elif type(array).__module__.startswith("zarr"):
        lazy = da.from_zarr(array)
    else:
        lazy = da.from_array(array, chunks=(block_size, *array.shape[1:]),
                             lock=type(array).__module__.startswith("h5py"))
    return lazy.rechunk((block_size,) + (-1,) * (lazy.ndim - 1))


def _views(array: np.ndarray, block_size: int) -> da.Array:
    """``array`` as a dask array whose blocks of ``block_size`` samples are views of it. Dask's ``from_array``
    copies a NumPy array whole first (a memory-mapped file larger than the memory was read into it) and digests
    its bytes for a name: a copy and a pass over every byte, on one thread, for nothing an ingest needs."""
    import dask.array as da

    name = f"outcore-views-{uuid.uuid4().hex}"
    rest = (0,) * (array.ndim - 1)
    graph = {(name, i, *rest): array[start : start + block_size]
             for i, start in enumerate(range(0, max(1, len(array)), block_size))}
    chunks = (tuple(len(block) for block in graph.values()), *((length,) for length in array.shape[1:]))
    return da.Array(graph, name, chunks, meta=array[:0])


def scratch_bytes(array: Any) -> int:
    """Disk the external shuffle of ``array`` needs: its samples' bytes (0 for numpy arrays in memory)."""
    if isinstance(array, np.ndarray) and not isinstance(array, np.memmap):
        return 0
    return int(np.prod(array.shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize


def free_bytes(folder: Path) -> int:
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def write_order(num_samples: int, shuffle: bool, seed: int) -> np.ndarray:
    """The source sample stored at each position: a seeded permutation, or the source order.

    >>> write_order(5, shuffle=False, seed=0).tolist()
    [0, 1, 2, 3, 4]
    """
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return permutation(Domain.WRITE_ORDER, (seed,), num_samples)
