"""DataLoader workers: taking turns at whole batches, or each making its part of every batch.

    python benchmarks/loader_workers.py [--samples 12000] [--size 96] [--batch 256] [--workers 2] [--epochs 3]

A pixel store of ``--samples`` photo crops of ``--size`` x ``--size`` (chunks of 64) is read for
``--epochs`` shuffled epochs (``RandomCrop`` and ``RandomFlip``) by ``ds.torch(--batch, ...)``:

- reader threads in the main process (``num_workers=0``, the default);
- ``--workers`` DataLoader workers taking turns at whole batches (worker ``w`` makes steps ``w, w + n, ...``),
  each batch sent to the main process by the DataLoader (what ``OUTCORE_SHARED_MEMORY=0`` chooses);
- ``--workers`` workers each making its part of every batch (its share of the rank's streams), written side
  by side into one file in shared memory that the loader maps.

It prints samples/s (the median epoch, the rows' epochs interleaved) with its ratio to the workers taking
turns, and chunk reads per epoch over the store's chunks (from the plans, which are pure: exact).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

import outcore
from outcore.imaging.synthetic import photo_crops
from outcore.iterate.plan import Consumer, EpochPlan
from outcore.iterate.schedule import schedule
from outcore.transforms import Compose, RandomCrop, RandomFlip

CHUNK = 64


def augment(batch: dict, rng: np.random.Generator) -> dict:  # module level: workers may receive it pickled
    size = batch["images"].shape[1] * 7 // 8
    return Compose([RandomCrop(size), RandomFlip()])(batch, rng)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=12_000)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/loader-workers"))
    args = parser.parse_args()
    ds = _store(args.workdir / f"photos-{args.samples}-{args.size}.zarr", args.samples, args.size)
    n = args.workers
    rows = {"reader threads (num_workers=0)": (0, "1"),
            f"{n} workers taking turns at batches": (n, "0"),
            f"{n} workers making a part of each batch": (n, "1")}
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for epoch in range(args.epochs):
        for name, (workers, shared) in rows.items():
            os.environ["OUTCORE_SHARED_MEMORY"] = shared
            rates[name].append(_epoch(ds, args.batch, workers, epoch))
    plan = ds.batches(args.batch, shuffle=True, seed=0).plan(0)
    chunks = -(-len(ds) // CHUNK)
    turns = sum(sum(len(step.load) for step in schedule(plan, Consumer(worker=w, num_workers=n).steps(plan.steps),
                                                          read_ahead=0)) for w in range(n))
    parts = sum(len(EpochPlan(len(ds), CHUNK, batch_size=args.batch, seed=0, part=(w, n)).chunks) for w in range(n))
    reads = {name: value / chunks for name, value in zip(rows, (len(plan.chunks), turns, parts), strict=True)}
    print(f"{args.samples:,} samples of {args.size}x{args.size}x3 in chunks of {CHUNK}, batch {args.batch}, "
          f"{os.cpu_count()} CPUs, median of {args.epochs} epochs")
    print("| loader | samples/s | vs workers taking turns | chunk reads / chunks |")
    print("| --- | ---: | ---: | ---: |")
    base = statistics.median(rates[f"{n} workers taking turns at batches"])
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {reads[name]:.2f} |")


def _store(path: Path, samples: int, size: int) -> outcore.Dataset:
    if not path.exists():
        print(f"writing {samples:,} photo crops to {path} …")
        images = np.stack(photo_crops(samples, (size, size), np.random.default_rng(0)))
        outcore.from_arrays({"images": images, "labels": np.arange(samples) % 10}, path, chunk_size=CHUNK,
                            progress=False)
    return outcore.open_dataset(path)


def _epoch(ds: outcore.Dataset, batch: int, workers: int, epoch: int) -> float:
    """Samples/s of epoch ``epoch`` read by a new loader with ``workers`` workers (their start included)."""
    context = {"multiprocessing_context": "fork", "prefetch_factor": 4} if workers else {}
    loader = ds.torch(batch, shuffle=True, seed=0, num_workers=workers, transform=augment, **context)
    loader.set_epoch(epoch)
    began, count = time.perf_counter(), 0
    for made in loader:
        count += len(made["labels"])
    return count / (time.perf_counter() - began)


if __name__ == "__main__":
    main()
