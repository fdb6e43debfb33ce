"""Store factories: the same samples as a directory store, a single-file zip store or an fsspec URL."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import Dataset, open_dataset
from ..ingest import from_arrays

STORE_KINDS = ("directory", "zip", "url")


def sample_arrays(num_samples: int = 300, seed: int = 0) -> dict[str, np.ndarray]:
    """Fields of every kind a store holds: images (uint8, 8x8x3), labels (int64, 3 classes), a float
    score pair, a text name and an ``id`` equal to the sample's index.

    >>> {name: a.shape for name, a in sample_arrays(10).items()}["images"]
    (10, 8, 8, 3)
    """
    rng = np.random.default_rng(seed)
    return {
        "images": rng.integers(0, 256, (num_samples, 8, 8, 3), dtype=np.uint8),
        "labels": rng.integers(0, 3, num_samples),
        "score": rng.normal(size=(num_samples, 2)).astype(np.float32),
        "name": np.array([f"sample-{i}" for i in range(num_samples)]),
        "id": np.arange(num_samples),
    }


def make_store(
    root: str | Path, arrays: Mapping[str, Any] | None = None, *, kind: str = "directory", name: str = "s",
    chunk_size: int = 32, shuffle_on_write: bool = False, **options: Any,
) -> Dataset:
    """Write ``arrays`` (default: `sample_arrays`) under ``root`` as a store of ``kind`` and open it.

    ``kind`` is ``"directory"`` (``root/<name>.zarr``), ``"zip"`` (``root/<name>.zarr.zip``) or ``"url"``
    (the directory store opened as ``file://...``). Other ``options`` go to `outcore.from_arrays`.
    """
    if kind not in STORE_KINDS:
        raise ValueError(f"kind={kind!r} is not one of {STORE_KINDS}")
    path = Path(root) / (f"{name}.zarr.zip" if kind == "zip" else f"{name}.zarr")
    from_arrays(sample_arrays() if arrays is None else arrays, path, chunk_size=chunk_size,
                shuffle_on_write=shuffle_on_write, progress=False, **options)
    return open_dataset(f"file://{path.absolute()}" if kind == "url" else path)


def write_h5_images(path: str | Path, samples: int, shape: tuple[int, ...] = (64, 64, 3)) -> Path:
    """An HDF5 file of ``samples`` random uint8 images of ``shape`` (dataset ``images``, chunks of 64
    samples) and 10-class ``labels``, written 512 samples at a time: a source larger than memory."""
    import h5py  # an optional dependency (the h5 and dev extras)

    with h5py.File(path, "w") as file:
        images = file.create_dataset("images", shape=(samples, *shape), dtype="uint8", chunks=(64, *shape))
        for start in range(0, samples, 512):
            stop = min(samples, start + 512)
            images[start:stop] = np.random.default_rng(start).integers(0, 256, (stop - start, *shape), np.uint8)
        file.create_dataset("labels", data=np.arange(samples) % 10)
    return Path(path)

