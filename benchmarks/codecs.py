"""Which Blosc settings should a pixel store use? Size on disk and read speed, side by side.

    python benchmarks/codecs.py [--images 4096] [--size 128] [--repeats 3]

Writes the same photo crops (scikit-learn's sample photographs, random scales and places) with each
codec, and the same pictures as a folder of quality-90 JPEGs for reference, then reads every chunk
back with one and with two threads. Prints one table; speeds are medians over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import imageio.v3 as iio
import numpy as np

import outcore
from outcore.imaging.synthetic import photo_crops

CODECS = [
    "lz4:5:bitshuffle", "lz4:5:shuffle", "lz4:5:noshuffle", "lz4hc:5:bitshuffle",
    "zstd:1:bitshuffle", "zstd:3:bitshuffle", "zstd:5:bitshuffle", "zstd:3:noshuffle", "none",
]


def read_rate(array, chunk_size: int, threads: int) -> float:
    """Samples per second reading every chunk into memory (each call decodes one chunk)."""
    starts = range(0, array.shape[0], chunk_size)
    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda start: array[start : start + chunk_size], starts):
            pass
    return array.shape[0] / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    images = np.stack(photo_crops(args.images, (args.size, args.size), np.random.default_rng(0)))
    raw = images.nbytes
    with tempfile.TemporaryDirectory(prefix="outcore-codecs-") as tmp:
        folder = Path(tmp) / "jpeg"
        folder.mkdir()
        for i, picture in enumerate(images):
            iio.imwrite(folder / f"{i}.jpg", picture, quality=90)
        jpeg_bytes = sum(p.stat().st_size for p in folder.iterdir())
        rows = []
        for codec in CODECS:
            store = Path(tmp) / f"{codec.replace(':', '_')}.zarr"
            began = time.perf_counter()
            ds = outcore.from_arrays({"images": images}, store, compression=codec, shuffle_on_write=False,
                                     progress=False)
            write_rate = len(images) / (time.perf_counter() - began)
            array = ds.array("images")
            stored = array.nbytes_stored()
            one = statistics.median(read_rate(array, ds.chunk_size, 1) for _ in range(args.repeats))
            two = statistics.median(read_rate(array, ds.chunk_size, 2) for _ in range(args.repeats))
            rows.append((codec, stored, write_rate, one, two))
    best_read = max(row[4] for row in rows)
    print(f"\n{args.images} photo crops {args.size}x{args.size}x3: {raw / 2**20:.0f} MiB decoded, "
          f"{jpeg_bytes / 2**20:.1f} MiB as quality-90 JPEGs ({raw / jpeg_bytes:.1f}x smaller)\n")
    header = f"{'codec':20s} {'MiB':>7s} {'ratio':>6s} {'vs JPEG':>8s} {'write/s':>8s} " \
             f"{'read/s 1T':>10s} {'read/s 2T':>10s} {'2T vs best':>10s}"
    print(header)
    print("-" * len(header))
    for codec, stored, write_rate, one, two in rows:
        print(f"{codec:20s} {stored / 2**20:7.1f} {raw / stored:6.2f} {stored / jpeg_bytes:7.2f}x "
              f"{write_rate:8.0f} {one:10.0f} {two:10.0f} {two / best_read:10.2f}")


if __name__ == "__main__":
    main()
