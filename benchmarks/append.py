"""Append: adding new files to a store, against ingesting the grown folder again.

    python benchmarks/append.py [--files 10000] [--new 0.1] [--repeats 3] [--workdir bench-data]

A folder of ``--files`` 256x256 JPEG photo crops in 10 classes is ingested as 128x128x3 pixels and as
encoded files (decoded to 128x128x3 while reading); then ``--new`` times as many files are added (half of
them in a new class). Each repeat, interleaved, on a fresh copy of each store: the append (comparing the
folder with the store, decoding the new files into a part, splicing it after the store's samples) and
a full re-ingest of the grown folder (``overwrite=True``). Medians of ``--repeats``, 2 threads (the
machine's cores) for both. The ceiling of the ratio is about ``(1 + new) / new``: an append decodes
only the new files, plus the fixed costs of listing and comparing every file and rewriting the store's
last partial shard. Also printed: what recording each file's digest costs at ingest (BLAKE2b of every
file, timed alone, against the ingest's time).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from common import print_table

import outcore
from outcore.imaging.synthetic import write_image_folder
from outcore.ingest.decode_tasks import file_digest

SHAPE = (128, 128, 3)
CLASSES = tuple(f"class{i}" for i in range(10))


def _folder(workdir: Path, files: int, new: float) -> tuple[Path, list[Path]]:
    """The base folder (written once) and the new files to add to a copy of it."""
    base, extra = workdir / f"append-{files}", workdir / f"append-{files}-new-{new}"
    if not base.exists():
        print(f"writing {files} JPEGs to {base} …")
        write_image_folder(base, files // len(CLASSES), classes=CLASSES, size=(256, 256), kind="photos", seed=0)
    if not extra.exists():
        count = max(2, round(files * new))
        write_image_folder(extra, count // 2 // 5, classes=CLASSES[:5], size=(256, 256), kind="photos", seed=1)
        write_image_folder(extra, count // 2, classes=("class_new",), size=(256, 256), kind="photos", seed=2)
    return base, sorted(extra.rglob("*.jpg"))


def _grow(base: Path, added: list[Path], folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(base, folder)
    for file in added:
        target = folder / file.parent.name / f"new_{file.name}"
        target.parent.mkdir(exist_ok=True)
        shutil.copy(file, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--new", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    base, added = _folder(args.workdir, args.files, args.new)
    grown = args.workdir / "append-grown"
    _grow(base, added, grown)
    stores, ingest_seconds = {}, {}
    for images in ("pixels", "encoded"):
        stores[images] = args.workdir / f"append-base-{images}.zarr"
        began = time.perf_counter()
        outcore.ingest_images(base, stores[images], shape=SHAPE, images=images, overwrite=True, progress=False)
        ingest_seconds[images] = time.perf_counter() - began
    began = time.perf_counter()
    for file in base.rglob("*.jpg"):
        file_digest(file.read_bytes())
    digest_seconds = time.perf_counter() - began

    seconds: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):  # interleaved: drift hits every case alike
        for images, store in stores.items():
            copy = args.workdir / f"append-copy-{images}.zarr"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(store, copy)
            os.sync()  # the copy's writes are not left to slow the append down
            began = time.perf_counter()
            ds = outcore.ingest_images(grown, copy, shape=SHAPE, images=images, append=True, progress=False)
            seconds.setdefault((images, "append"), []).append(time.perf_counter() - began)
            assert len(ds) == args.files // len(CLASSES) * len(CLASSES) + len(added), len(ds)
            os.sync()
            began = time.perf_counter()
            again = outcore.ingest_images(grown, args.workdir / f"append-again-{images}.zarr", shape=SHAPE,
                                          images=images, overwrite=True, progress=False)
            seconds.setdefault((images, "re-ingest"), []).append(time.perf_counter() - began)
            assert len(again) == len(ds)
        print(f"repeat {repeat + 1}/{args.repeats} done")
    total = args.files // len(CLASSES) * len(CLASSES) + len(added)
    print(f"\n{args.files:,} 256x256 JPEGs + {len(added):,} new, ingested at 128x128x3; medians of {args.repeats}; "
          f"rate = samples of the grown store / seconds; the ceiling of 'vs re-ingest' is about "
          f"{(1 + args.new) / args.new:.0f}")
    for images in stores:
        rates = {case: total / statistics.median(seconds[(images, case)]) for case in ("re-ingest", "append")}
        print()
        print_table([f"{images}", "samples/s"], list(rates.items()), {"vs re-ingest": rates["re-ingest"]})
    print(f"\nBLAKE2b of the {args.files:,} files, alone: {digest_seconds:.2f} s, against an ingest of "
          f"{ingest_seconds['pixels']:.2f} s (pixels) / {ingest_seconds['encoded']:.2f} s (encoded) that "
          "includes it")


if __name__ == "__main__":
    main()
