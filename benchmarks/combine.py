"""Subsets, splits and mixtures: a k-fold epoch's reads against the whole store, what a hash split gives each
class, and a 90/10 mixture's shares and rate against its sources alone.

    python benchmarks/combine.py [--samples 40000] [--folds 5] [--repeats 3] [--files 3000] [--workdir bench-data]

1. **Subsets** (``indices=``): a store of ``--samples`` 64x64x3 photo crops (chunks of about 8 MiB, shuffled on
   write) read in shuffled epochs of batch 256 on a warm page cache, medians of ``--repeats``, interleaved:
   the whole store; a k-fold training part (``(k-1)/k`` of the samples, fold 0 of ``KFold(--folds)``); its
   held-out part; a held-out part of whole chunks instead (every ``--folds``-th chunk: on a store
   shuffled on write, as random a fold as one of samples); a quick run on the first 1,000 indices. For each: samples/s, chunks read per epoch and
   the rate against the whole store's (a subset is read chunk by chunk: the ceiling is 1.00).
2. **Splits** (`outcore.ingest_splits`, ``train=0.8,val=0.1,test=0.1``, seed 0): ``--files`` JPEGs in 3
   classes cut by a hash of each path; each split's share of each class, against the fraction asked for.
3. **Mixtures** (`outcore.mix`, weights 0.9/0.1): the store above with one of a tenth of its size (other
   crops), and two stores of 128x128 JPEGs kept encoded (``--samples / 4`` and a tenth of that), batch
   256: samples/s of a mixture epoch against each source alone (medians of ``--repeats``, interleaved;
   the ceiling is the slower of the sources' rates), and the shares measured over an epoch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
from common import print_table

import outcore
from outcore.imaging.synthetic import photo_crops, write_image_folder

BATCH = 256
FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def _store(workdir: Path, samples: int, seed: int = 0) -> outcore.Dataset:
    location = workdir / f"subsets-{samples}-{seed}.zarr"
    if location.exists():
        return outcore.open_dataset(location)
    print(f"writing {samples} 64x64x3 photo crops to {location} …")
    images = np.stack(photo_crops(samples, (64, 64), np.random.default_rng(seed)))
    labels = np.random.default_rng(seed).integers(0, 10, samples)
    return outcore.from_arrays({"images": images, "labels": labels}, location, progress=False)


def _epoch(ds: outcore.Dataset, indices: np.ndarray | None, epoch: int) -> tuple[float, int, int]:
    """(seconds, samples, chunks read) of one shuffled epoch."""
    it = ds.batches(BATCH, indices=indices, seed=epoch, fields=["images", "labels"])
    reader, reads = it.readers["images"], []
    original = reader.read
    reader.read = lambda chunk, **keywords: reads.append(chunk) or original(chunk, **keywords)
    began, count = time.perf_counter(), 0
    for batch in it:
        count += len(batch["labels"])
    return time.perf_counter() - began, count, len(reads)


def subsets(workdir: Path, samples: int, folds: int, repeats: int) -> None:
    ds = _store(workdir, samples)
    held_out = np.arange(samples)[np.random.default_rng(0).permutation(samples) % folds == 0]
    cases = {
        "whole store": None,
        f"k-fold training part ({folds - 1}/{folds})": np.setdiff1d(np.arange(samples), held_out),
        f"k-fold held-out part (1/{folds})": held_out,
        f"held-out part of whole chunks (1/{folds})": np.flatnonzero(np.arange(samples) // ds.chunk_size % folds == 0),
        "quick run: first 1,000": np.arange(1000),
    }
    _epoch(ds, None, 0)  # the page cache warm
    rates: dict[str, list[float]] = {name: [] for name in cases}
    chunks: dict[str, int] = {}
    for repeat in range(repeats):  # interleaved: drift hits every case alike
        for name, indices in cases.items():
            seconds, count, reads = _epoch(ds, indices, repeat)
            rates[name].append(count / seconds)
            chunks[name] = reads
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n{samples} samples of 64x64x3 in {ds.num_chunks} chunks of {ds.chunk_size}; batch {BATCH}; "
          f"medians of {repeats} shuffled epochs\n")
    print_table(["subset", "samples/s"], list(medians.items()), {"vs whole store": medians["whole store"]})
    print("\nchunks read per epoch: " + ", ".join(f"{name} {count}" for name, count in chunks.items()))


def splits(workdir: Path, files: int) -> None:
    folder = workdir / f"split-photos-{files}"
    if len(list(folder.rglob("*.jpg"))) != files:
        shutil.rmtree(folder, ignore_errors=True)
        write_image_folder(folder, files // 3, classes=("a", "b", "c"), size=(16, 16), seed=0)
    out = workdir / f"split-stores-{files}"
    outcore.ingest_splits(folder, out, split=FRACTIONS, shape=(16, 16, 3), overwrite=True, progress=False)
    index = json.loads((out / "splits.json").read_text())
    per_class = files // 3
    print(f"\n{files} files in 3 classes of {per_class}, split {FRACTIONS} by a hash of each path (seed 0)\n")
    header = f"{'class':6s}" + "".join(f" {name:>14s}" for name in FRACTIONS)
    print(header + "\n" + "-" * len(header))
    for name in index["classes"]:
        shares = [index["splits"][split]["per_class"][name] / per_class for split in FRACTIONS]
        print(f"{name:6s}" + "".join(f" {share:14.3f}" for share in shares))
    noise = ", ".join(f"{name} ±{np.sqrt(f * (1 - f) / per_class):.3f}" for name, f in FRACTIONS.items())
    print(f"\none standard deviation of the share of a class of {per_class} ({noise})")


def _rate(iterator) -> tuple[float, dict[str, int]]:
    began, count = time.perf_counter(), 0
    for batch in iterator:
        count += len(batch["labels"])
    return count / (time.perf_counter() - began), count


def _encoded(workdir: Path, files: int, seed: int) -> outcore.Dataset:
    """``files`` 128x128 photo crops as JPEGs, in a store of their bytes (decoded while reading)."""
    location = workdir / f"encoded-{files}-{seed}.zarr"
    if location.exists():
        return outcore.open_dataset(location)
    folder = workdir / f"jpegs-{files}-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    print(f"writing {files} 128x128 JPEGs to {folder} …")
    write_image_folder(folder, files // 4, classes=("a", "b", "c", "d"), size=(128, 128), kind="photos", seed=seed)
    return outcore.ingest_images(folder, location, shape=(128, 128, 3), images="encoded", progress=False)


def mixtures(workdir: Path, samples: int, repeats: int) -> None:
    weights = {"base": 0.9, "curated": 0.1}
    pairs = {"64x64x3 pixels": (_store(workdir, samples), _store(workdir, samples // 10, seed=1)),
             "128x128 JPEGs, encoded": (_encoded(workdir, samples // 4, 0), _encoded(workdir, samples // 40, 1))}
    for kind, (base, curated) in pairs.items():
        mixture = outcore.mix({"base": base, "curated": curated}, weights=weights)
        cases = {"base alone": lambda e, ds=base: ds.batches(BATCH, seed=e, fields=["images", "labels"]),
                 "curated alone": lambda e, ds=curated: ds.batches(BATCH, seed=e, fields=["images", "labels"]),
                 "mixture 90/10": lambda e, ds=mixture: ds.batches(BATCH, seed=e, fields=["images", "labels"])}
        rates: dict[str, list[float]] = {name: [] for name in cases}
        for repeat in range(repeats):  # interleaved
            for name, make in cases.items():
                rates[name].append(_rate(make(repeat))[0])
        medians = {name: statistics.median(values) for name, values in rates.items()}
        print(f"\nmixture of {len(base):,} and {len(curated):,} samples ({kind}), weights {weights}, batch {BATCH}; "
              f"medians of {repeats} epochs\n")
        print_table(["read", "samples/s"], list(medians.items()),
                    {"vs base alone": medians["base alone"], "vs curated alone": medians["curated alone"]})
        it = mixture.batches(BATCH, seed=0, fields=["images", "labels"])
        for _ in it:
            pass
        stats = it.stats()
        total = stats["samples_base"] + stats["samples_curated"]
        print(f"\nover one epoch ({len(it)} batches): base {stats['samples_base']:,} "
              f"({stats['samples_base'] / total:.4f}), curated {stats['samples_curated']:,} "
              f"({stats['samples_curated'] / total:.4f}); per batch {mixture.layout(BATCH).per_batch.tolist()}; "
              f"curated samples repeated {stats['samples_curated'] / len(curated):.2f}x an epoch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    subsets(args.workdir, args.samples, args.folds, args.repeats)
    splits(args.workdir, args.files)
    mixtures(args.workdir, args.samples, args.repeats)


if __name__ == "__main__":
    main()
