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
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np


def permuted(array: Any, order: np.ndarray, shard_size: int, scratch: Path) -> da.Array:
    """``array[order]`` as a dask array in blocks of ``shard_size`` samples, without the quadratic graph.

    ``array`` is numpy, dask, zarr or h5py with samples on axis 0; ``scratch`` is a folder for the
    external shuffle (created when needed).
    """
    num_samples = len(order)
    sample_shape, dtype = tuple(array.shape[1:]), np.dtype(array.dtype)
    starts = range(0, num_samples, shard_size)
    if isinstance(array, np.ndarray) and not isinstance(array, np.memmap):
        source = dask.delayed(array, name=f"outcore-source-{uuid.uuid4().hex}", traverse=False)
        take = dask.delayed(_take, pure=True)
        parts = [take(source, order[start : start + shard_size]) for start in starts]
    else:
        parts = _external(as_dask(array, shard_size), order, shard_size, scratch)
    return da.concatenate([
        da.from_delayed(part, (min(shard_size, num_samples - start), *sample_shape), dtype=dtype)
        for part, start in zip(parts, starts, strict=True)
    ])


def _take(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    return array[indices]


def _external(source: da.Array, order: np.ndarray, shard_size: int, scratch: Path) -> list[Any]:
    """The gather tasks of the two-pass shuffle, one per output shard (see the module docstring)."""
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
    gather = dask.delayed(_gather, pure=False)
    row = (tuple(source.shape[1:]), np.dtype(source.dtype))
    return [gather(barrier, shared_keys, folder, start, min(num_samples, start + shard_size), num_samples,
                   len(scattered), row)
            for start in range(0, num_samples, shard_size)]


def _scatter(block: np.ndarray, destination: np.ndarray, path: Path) -> None:
    """Write ``block``'s samples sorted by where they go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.ascontiguousarray(block[np.argsort(destination, kind="stable")]).tofile(path)


def _all_done(*_: None) -> None:
    return None


def _gather(
    _: None, keys: np.ndarray, folder: Path, start: int, stop: int, num_samples: int, num_blocks: int,
    row: tuple[tuple[int, ...], np.dtype],
) -> np.ndarray:
    """Output samples ``start .. stop - 1``: from each scratch file, the run of samples bound for them."""
    sample_shape, dtype = row
    out = np.empty((stop - start, *sample_shape), dtype=dtype)
    row_bytes = int(np.prod(sample_shape, dtype=np.int64)) * dtype.itemsize
    offsets = np.arange(num_blocks, dtype=np.int64) * num_samples
    firsts = np.searchsorted(keys, offsets + start)
    lasts = np.searchsorted(keys, offsets + stop)
    block_starts = np.searchsorted(keys, offsets)
    for b in np.flatnonzero(lasts > firsts).tolist():
        first, count = int(firsts[b] - block_starts[b]), int(lasts[b] - firsts[b])
        with open(folder / f"{b}.bin", "rb") as file:
            file.seek(first * row_bytes)
            values = np.fromfile(file, dtype=dtype, count=count * row_bytes // dtype.itemsize)
        out[keys[firsts[b] : lasts[b]] - offsets[b] - start] = values.reshape(count, *sample_shape)
    return out


def as_dask(array: Any, block_size: int) -> da.Array:
    """A lazy view of ``array`` in blocks of ``block_size`` samples; h5py datasets are read under a lock."""
    if isinstance(array, da.Array):
        lazy = array
    elif type(array).__module__.startswith("zarr"):
        lazy = da.from_zarr(array)
    else:
        lazy = da.from_array(array, chunks=(block_size, *array.shape[1:]),
                             lock=type(array).__module__.startswith("h5py"))
    return lazy.rechunk((block_size,) + (-1,) * (lazy.ndim - 1))


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
    return np.random.default_rng(seed).permutation(num_samples).astype(np.int64)
