"""Does the training step wait for data? A fixed-cost step fed four ways, side by side.

    python benchmarks/training.py [--step-ms 20] [--batches 150] [--repeats 3] [--workdir bench-data]

Uses the store and JPEG folder that benchmarks/iterate.py builds (44,000 photo crops, 128x128x3).
Each feeder hands ``--batches`` batches of 256 to a training step that costs ``--step-ms`` (a sleep,
standing for a GPU step that leaves the CPU free); the table gives the fraction of the run's time
spent waiting for the next batch, and samples/s (medians of ``--repeats`` rounds that take every row in
turn):

- in-memory numpy arrays, a random permutation per epoch, fancy indexing per batch (what
  ``model.fit(x, y, shuffle=True)`` does): the reference;
- outcore ``ds.batches`` and ``ds.torch(num_workers=0)`` (reader threads in this process), and
  ``ds.torch(num_workers=N)`` (a DataLoader worker process per core, each with its reader threads);
- a torch ImageFolder-style JPEG DataLoader with a worker per core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from common import JpegFolder
from iterate import BATCH, build, build_h5_and_jpegs

import outcore
from outcore.threads import available_cpus


def feed(batches, count: int, step_seconds: float) -> tuple[float, float]:
    """(waiting fraction, samples/s) of ``count`` steps fed by ``batches``, after one warm-up batch."""
    iterator = iter(batches)
    next(iterator)
    waited, samples, began = 0.0, 0, time.perf_counter()
    for _ in range(count):
        asked = time.perf_counter()
        batch = next(iterator)
        waited += time.perf_counter() - asked
        samples += len(batch[1] if isinstance(batch, (tuple, list)) else batch["labels"])
        time.sleep(step_seconds)  # the training step
    elapsed = time.perf_counter() - began
    return waited / elapsed, samples / elapsed


def numpy_batches(images: np.ndarray, labels: np.ndarray):
    rng = np.random.default_rng(0)
    while True:
        order = rng.permutation(len(labels))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            index = order[start : start + BATCH]
            yield images[index], labels[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=44_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    import torch

    workdir = Path(args.workdir)
    workdir.mkdir(exist_ok=True)
    ds = outcore.open_dataset(build(workdir, args.samples, args.size))
    _, jpegs = build_h5_and_jpegs(ds, workdir)
    step = args.step_ms / 1000
    images, labels = ds["images"].compute(), ds["labels"].compute()  # the in-memory reference: 2.2 GB
    cores, fields = available_cpus(), ["images", "labels"]
    feeders = {  # each makes a new feeder for a round
        "in-memory numpy arrays, fancy indexing per batch": lambda: numpy_batches(images, labels),
        "outcore ds.batches(256), threads": lambda: ds.batches(BATCH, fields=fields),
        "outcore ds.torch(256, num_workers=0): threads, tensors":
            lambda: ds.torch(BATCH, shuffle=True, num_workers=0, fields=fields),
        f"outcore ds.torch(256, num_workers={cores}): worker processes":
            lambda: ds.torch(BATCH, shuffle=True, num_workers=cores, fields=fields),
        f"JPEG folder, torch DataLoader, {cores} workers":
            lambda: torch.utils.data.DataLoader(JpegFolder(jpegs), batch_size=BATCH, shuffle=True, num_workers=cores),
    }
    rounds = {name: [] for name in feeders}
    for _ in range(args.repeats):
        for name, make in feeders.items():
            rounds[name].append(feed(make(), args.batches, step))
    ideal = BATCH / step
    print(f"\nstep of {args.step_ms:g} ms per batch of {BATCH} (at most {ideal:,.0f} samples/s), {args.batches} steps, "
          f"{len(ds):,} samples of {args.size}x{args.size}x3, {cores} cores; medians of {args.repeats} rounds\n")
    print(f"{'fed by':52s} {'waiting':>8s} {'samples/s':>10s} {'of ideal':>9s}")
    for name, measured in rounds.items():
        waiting, rate = (statistics.median(column) for column in zip(*measured, strict=True))
        print(f"{name:52s} {waiting:8.1%} {rate:10,.0f} {rate / ideal:9.1%}")


if __name__ == "__main__":
    main()
