"""``outcore demo``: the main job end to end on generated pictures, in a few seconds.

1. write train/val/test image folders (six classes of generated shapes, JPEG);
2. ingest each split into one single-file store (``train.zarr.zip`` …), in parallel, with progress;
3. print ``outcore info`` of the training store and verify every checksum;
4. train a nearest-centroid classifier on shuffled, augmented batches streamed from the training store
   (`Dataset.batches`), with bounded memory;
5. stream its test-set predictions into a new store with `Writer`, and report the test accuracy.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..dataset import Dataset, open_dataset
from ..imaging.synthetic import SHAPE_CLASSES, write_image_folder
from ..ingest import Writer, ingest_images
from ..iterate.transforms import RandomFlip
from .info import describe
from .verify import verify

SPLITS = {"train": 1.0, "val": 0.25, "test": 0.25}


def run_demo(workdir: str | Path, *, per_class: int = 400, size: int = 64, client: object = None,
             progress: bool = True) -> float:
    """Run the demo in ``workdir``; return the test accuracy (chance is 1/6)."""
    workdir = Path(workdir)
    started = time.perf_counter()
    for offset, (split, fraction) in enumerate(SPLITS.items()):
        folder = workdir / "images" / split
        if not folder.exists():
            count = max(1, int(per_class * fraction))
            write_image_folder(folder, count, classes=SHAPE_CLASSES, size=(size, size), seed=offset)
            print(f"wrote {count * len(SHAPE_CLASSES)} {size}x{size} JPEGs to {folder}")
        ingest_images(folder, workdir / f"{split}.zarr.zip", shape=(size, size, 3), overwrite=True,
                      client=client, progress=progress)
    train, test = open_dataset(workdir / "train.zarr.zip"), open_dataset(workdir / "test.zarr.zip")
    print("\n" + describe(train) + "\n")
    print(verify(train.location, progress=progress))
    centroids = _train_centroids(train)
    accuracy = _predict_to_store(test, centroids, workdir / "test-predictions.zarr")
    print(f"\nnearest-centroid test accuracy: {accuracy:.1%} (chance {1 / len(SHAPE_CLASSES):.1%}); "
          f"predictions in {workdir / 'test-predictions.zarr'}; demo took {time.perf_counter() - started:.1f} s")
    return accuracy


def _features(images: np.ndarray) -> np.ndarray:
    """8x8 average-pooled colour thumbnails, flattened: a crude but honest image descriptor."""
    n, height, width, channels = images.shape
    pooled = images[:, : height // 8 * 8, : width // 8 * 8].reshape(n, 8, height // 8, 8, width // 8, channels)
    return pooled.mean(axis=(2, 4), dtype=np.float32).reshape(n, -1)


def _train_centroids(ds: Dataset, epochs: int = 2) -> np.ndarray:
    sums = np.zeros((len(ds.classes), 8 * 8 * 3), dtype=np.float64)
    counts = np.zeros(len(ds.classes), dtype=np.int64)
    batches = ds.batches(128, fields=["images", "labels"], seed=0, transform=RandomFlip())
    for _ in range(epochs):  # each pass is a new epoch: another order, other flips
        for batch in batches:
            np.add.at(sums, batch["labels"], _features(batch["images"]))
            counts += np.bincount(batch["labels"], minlength=len(counts))
    return sums / np.maximum(counts, 1)[:, None]


def _predict_to_store(ds: Dataset, centroids: np.ndarray, location: Path) -> float:
    correct = 0
    with Writer(location, overwrite=True, roles={"predicted": "target"}, classes={"predicted": ds.classes}) as out:
        for start in range(0, len(ds), ds.chunk_size):
            window = slice(start, start + ds.chunk_size)
            features = _features(ds["images"][window].compute())
            distances = ((features[:, None, :] - centroids[None]) ** 2).sum(axis=-1)
            predicted = distances.argmin(axis=1)
            out.append({"predicted": predicted, "distance": distances.min(axis=1).astype(np.float32)})
            correct += int((predicted == ds["labels"][window].compute()).sum())
    return correct / len(ds)
