"""Shuffled iteration: outcore against the ways people read training data today, in one run.

    python benchmarks/iterate.py [--samples 44000] [--size 128] [--workdir bench-data] [--skip-large]

Builds (once, kept in ``--workdir``) a store of ``--samples`` photo crops (128x128x3 uint8, 2.2 GB
decoded) with random labels, the same pictures in an HDF5 file (raw, and gzip-compressed) and as a
JPEG folder, then
measures with batch 256 on a warm cache (medians of ``--repeats`` rounds that take every row in turn;
each row's rate is its samples over the time from its call to its last batch, start-up included):

- plain zarr sequential read, one chunk per call; outcore's shuffled epoch; the decompression ceiling
  (on as many threads as outcore reads with);
- dask fancy indexing of a random permutation per batch; h5py per-sample random reads in a torch
  DataLoader (one worker per core); a torch ImageFolder-style JPEG DataLoader (one worker per core):
  these on a limited number of batches, being slow;
- peak RSS of a fresh process iterating one epoch, for this store and one 4x larger;
- shuffle quality on label stores of the same layout: shuffled on write, and class-sorted, for
  several ``buffer_chunks``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
from common import JpegFolder

import outcore
from outcore.imaging.synthetic import photo_crops
from outcore.measure import decompress_all, interleaved, sequential_zarr, shuffled_epoch
from outcore.threads import available_cpus, thread_count

BATCH = 256
CLASSES = 10


def photo_array(samples: int, size: int, block: int = 1024) -> da.Array:
    """A lazy array of photo crops, generated block by block (never all in memory)."""
    def make(block_info=None):
        (start, stop), = [block_info[None]["array-location"][0]]
        return np.stack(photo_crops(stop - start, (size, size), np.random.default_rng([7, start])))
    chunks = (tuple(min(block, samples - s) for s in range(0, samples, block)), (size,), (size,), (3,))
    return da.map_blocks(make, chunks=chunks, dtype=np.uint8, meta=np.empty((0, 0, 0, 0), np.uint8))


def build(workdir: Path, samples: int, size: int, repeat: int = 1) -> Path:
    store = workdir / f"photos-{samples * repeat}-{size}.zarr"
    if not store.exists():
        images = photo_array(samples, size)
        if repeat > 1:
            images = da.concatenate([images] * repeat)
        labels = np.random.default_rng(1).integers(0, CLASSES, len(images))
        print(f"building {store} …", flush=True)
        outcore.from_arrays({"images": images, "labels": labels}, store, shuffle_on_write=False)
    return store


def build_h5_and_jpegs(ds: outcore.Dataset, workdir: Path) -> tuple[Path, Path]:
    import h5py
    import imageio.v3 as iio

    h5, jpegs = workdir / f"{Path(ds.location).stem}.h5", workdir / f"{Path(ds.location).stem}-jpeg"
    if not h5.exists():
        print(f"writing {h5} and {jpegs} …", flush=True)
        jpegs.mkdir(exist_ok=True)
        with h5py.File(h5, "w") as f:
            images = f.create_dataset("images", shape=ds["images"].shape, dtype="uint8")  # contiguous, raw
            gzipped = f.create_dataset("images_gzip", shape=ds["images"].shape, dtype="uint8",
                                       chunks=(8, *ds["images"].shape[1:]), compression="gzip")
            labels = f.create_dataset("labels", data=ds["labels"].compute())
            for start in range(0, len(ds), ds.chunk_size):
                chunk = ds["images"][start : start + ds.chunk_size].compute()
                images[start : start + len(chunk)] = chunk
                gzipped[start : start + len(chunk)] = chunk
                for offset, picture in enumerate(chunk):
                    label = labels[start + offset]
                    (jpegs / str(label)).mkdir(exist_ok=True)
                    iio.imwrite(jpegs / str(label) / f"{start + offset:06d}.jpg", picture, quality=90)
    return h5, jpegs


def first_batches(iterator, count: int) -> int:
    """Samples in the first ``count`` batches of ``(images, labels)`` batches."""
    return sum(len(batch[1]) for batch in itertools.islice(iterator, count))


def dask_fancy_indexing(ds: outcore.Dataset, count: int) -> int:
    images, labels = da.from_zarr(ds.array("images")), da.from_zarr(ds.array("labels"))
    order = np.random.default_rng(0).permutation(len(ds))

    def batches():
        for start in range(0, len(ds), BATCH):
            index = order[start : start + BATCH]
            yield da.compute(images[index], labels[index])

    return first_batches(batches(), count)


def torch_loader(dataset, count: int) -> int:
    """Samples of the first ``count`` shuffled batches of a DataLoader with a worker per core."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=available_cpus(),
                                         generator=torch.Generator().manual_seed(0))
    return first_batches(loader, count)


class H5Samples:
    """What users write: one h5py read per sample, file opened lazily in each worker."""

    def __init__(self, path: Path, images: str = "images") -> None:
        self.path, self.images, self.file = path, images, None
        import h5py

        with h5py.File(path, "r") as f:
            self.length = len(f["labels"])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        import h5py

        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return self.file[self.images][index], self.file["labels"][index]


def peak_rss(store: Path) -> float:
    """MiB of peak resident memory of a fresh process that iterates one shuffled epoch.

    Read from the child's own VmHWM: ``ru_maxrss`` would report at least the parent's RSS, which Linux
    carries over the fork and exec that start the child.
    """
    code = ("import sys, outcore\n"
            "for _ in outcore.open_dataset(sys.argv[1]).batches(256): pass\n"
            "status = open('/proc/self/status').read()\n"
            "print(int(status.split('VmHWM:')[1].split()[0]) / 1024)")
    return float(subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True,
                                check=True).stdout)


def quality_table(samples: int, chunk_size: int, workdir: Path) -> list[str]:
    labels = np.repeat(np.arange(CLASSES), samples // CLASSES)
    rows = []
    for shuffled in (True, False):
        ds = outcore.from_arrays({"labels": labels}, workdir / f"labels-{shuffled}.zarr", chunk_size=chunk_size,
                                 shuffle_on_write=shuffled, overwrite=True, progress=False)
        for buffer_chunks in ((8,) if shuffled else (0, 8, 32, 128)):
            q = outcore.shuffle_quality(ds, batch_size=BATCH, buffer_chunks=buffer_chunks)
            kind = "shuffled on write" if shuffled else "class-sorted"
            rows.append(f"{kind:18s} buffer_chunks={buffer_chunks:<4d} TV {q.outcore:.4f}  "
                        f"full random {q.random:.4f}  ratio {q.ratio:5.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=44_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--skip-large", action="store_true", help="skip the 4x store (RSS flatness)")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(exist_ok=True)
    ds = outcore.open_dataset(build(workdir, args.samples, args.size))
    h5, jpegs = build_h5_and_jpegs(ds, workdir)

    fields, cores = ["images", "labels"], available_cpus()
    sequential_zarr(ds, fields)  # the page cache warmed: every row reads from memory
    rows = list(interleaved({
        "plain zarr, sequential, one chunk per call": lambda: sequential_zarr(ds, fields),
        f"outcore ds.batches({BATCH}), shuffled, defaults": lambda: shuffled_epoch(ds, fields, BATCH),
        f"decompression ceiling (every chunk, {thread_count()} threads)": lambda: decompress_all(ds, fields),
        "dask fancy indexing, random permutation per batch": lambda: dask_fancy_indexing(ds, 8),
        f"h5py per-sample reads, torch DataLoader, {cores} workers": lambda: torch_loader(H5Samples(h5), 20),
        "  the same, gzip-compressed HDF5, chunks of 8 samples": lambda: torch_loader(H5Samples(h5, "images_gzip"), 4),
        f"JPEG folder, torch DataLoader, {cores} workers": lambda: torch_loader(JpegFolder(jpegs), 30),
    }, args.repeats).items())
    decoded = ds["images"].nbytes / 1e9
    print(f"\n{len(ds):,} samples of {args.size}x{args.size}x3 uint8 ({decoded:.2f} GB decoded), batch {BATCH}, "
          f"{cores} cores, warm cache; medians of {args.repeats} rounds, each row in turn\n")
    outcore_rate = rows[1][1]
    print(f"{'what':56s} {'samples/s':>10s} {'vs plain zarr':>14s} {'outcore is':>11s}")
    for name, rate in rows:
        print(f"{name:56s} {rate:10.0f} {rate / rows[0][1]:14.2f} {outcore_rate / rate:10.1f}x")

    print("\npeak RSS of a process iterating one shuffled epoch (defaults):")
    sizes = [(ds, Path(ds.location))]
    if not args.skip_large:
        large = build(workdir, args.samples, args.size, repeat=4)
        sizes.append((outcore.open_dataset(large), large))
    for each, path in sizes:
        rss = statistics.median(peak_rss(path) for _ in range(args.repeats))
        print(f"  {len(each):>8,} samples ({each['images'].nbytes / 1e9:5.1f} GB decoded): {rss:6.0f} MiB")

    print("\nshuffle quality, batch 256, label stores with the same chunking:")
    for row in quality_table(args.samples, ds.chunk_size, workdir):
        print("  " + row)
    print(json.dumps({"rows": rows}), file=sys.stderr)


if __name__ == "__main__":
    main()
