"""Chunks that barely compress, stored raw: what it gives a pixel store's batches, and what it costs in bytes.

    python benchmarks/raw_frames.py [--images 6000] [--threads 1,2] [--repeats 3] [--epochs 6] [--workdir bench-data/raw-frames]

Writes (once, in ``--workdir``) the same ``--images`` 128x128 photo crops (`write_image_folder`'s photos) into
three pixel stores that differ only in how their chunks are framed:

- **lz4 frames**: every chunk in its lz4:5:shuffle frame, as outcore wrote them before (and as zarr writes them);
- **raw below 1/8** (outcore's default): a chunk lz4 shrinks by less than `outcore.format.compression.RAW_SAVING`
  stored in a raw Blosc frame (`outcore.format.raw_above`), the others as above;
- **none**: ``compression="none"``, no Blosc at all.

Then, for each ``--threads`` count, the samples/s of ``ds.batches(256, shuffle=True)`` over the images and labels,
flat out (the chunks in the page cache), and with a ``RandomCrop(112)`` + flip done as the batch is made: the
median of ``--epochs`` epochs one after the other in a process of its own (`rate`), the stores in turns,
``--repeats`` rounds (the median), each as a ratio to the lz4 frames; and each store's bytes on disk, as a ratio to
theirs. Where the disk is the limit, an epoch takes about that ratio's times as long.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import outcore
from outcore.format import compression
from outcore.imaging.synthetic import write_image_folder

BATCH = 256
STORES = {"lz4 frames": ("lz4", 0.0), "raw below 1/8": ("lz4", compression.RAW_SAVING), "none": ("none", 0.0)}


def stores(workdir: Path, images: int) -> dict[str, Path]:
    """The three stores of the same photos (`STORES`: each one's codec and the share a frame must save), built once."""
    photos = workdir / "photos"
    if not photos.exists():
        write_image_folder(photos, images // 4, classes=("a", "b", "c", "d"), size=(128, 128), kind="photos", seed=0)
    made = {}
    for name, (cname, saving) in STORES.items():
        made[name] = location = workdir / f"{name.replace(' ', '-').replace('/', '-')}.zarr"
        if not location.exists():
            compression.RAW_SAVING = saving  # read by `raw_above` as each shard is written
            try:
                outcore.ingest_images(photos, location, shape=(128, 128, 3), images="pixels", compression=cname,
                                      progress=False)
            except BaseException:
                shutil.rmtree(location, ignore_errors=True)
                raise
            finally:
                compression.RAW_SAVING = STORES["raw below 1/8"][1]
    return made


def stored_bytes(location: Path) -> int:
    return sum(path.stat().st_size for path in location.rglob("*") if path.is_file())


def rate(location: Path, threads: int, crop: bool, epochs: int) -> float:
    """The median samples/s of ``epochs`` epochs after the first (which reads the files into the page cache) of
    ``ds.batches(256, shuffle=True)``, one after the other as a training loop takes them (the next epoch's run
    starts as this one drains), in a process of its own: each measurement starts alike, whatever ran before."""
    script = ("import statistics, sys, time; import outcore; from outcore.transforms import Compose, RandomCrop, "
              "RandomFlip\n"
              f"outcore.set_threads({threads})\n"
              f"batches = outcore.open_dataset({str(location)!r}).batches({BATCH}, shuffle=True, "
              f"fields=['images', 'labels'], transform={'Compose([RandomCrop(112), RandomFlip()])' if crop else None})\n"
              "rates = []\n"
              f"for epoch in range({epochs + 1}):\n"
              "    began = time.perf_counter(); count = sum(len(batch['labels']) for batch in batches)\n"
              "    rates.append(count / (time.perf_counter() - began))\n"
              "print(statistics.median(rates[1:]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/raw-frames"))
    args = parser.parse_args()
    made = stores(args.workdir, args.images)
    sizes = {name: stored_bytes(location) for name, location in made.items()}
    cases = {"batches": False, "crop + flip": True}
    print(f"{args.images} photo crops of 128x128, batches of {BATCH}: samples/s (each the median of {args.epochs} "
          f"epochs in a process of its own; the median of {args.repeats} rounds in turns), and the ratio to lz4 frames")
    print(f"{'store':16s} {'bytes':>6s}" + "".join(f" {case:>20s}" for case in cases))
    for threads in [int(count) for count in args.threads.split(",")]:
        measured: dict[tuple[str, str], list[float]] = {(case, name): [] for case in cases for name in made}
        for _ in range(args.repeats):
            for case, crop in cases.items():
                for name, location in made.items():
                    measured[case, name].append(rate(location, threads, crop, args.epochs))
        medians = {key: statistics.median(rates) for key, rates in measured.items()}
        print(f"{threads} thread{'s' * (threads > 1)}:")
        for name in made:
            cells = "".join(f" {medians[case, name]:>12,.0f} {medians[case, name] / medians[case, 'lz4 frames']:>6.2f}x"
                            for case in cases)
            print(f"  {name:14s} {sizes[name] / sizes['lz4 frames']:>5.2f}x{cells}")


if __name__ == "__main__":
    main()
