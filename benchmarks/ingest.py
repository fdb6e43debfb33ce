"""How fast does a folder of JPEGs become a store, next to how fast the JPEGs merely decode?

    python benchmarks/ingest.py [--images 10000] [--size 128] [--repeats 3] [--workdir bench-data]

Writes ``--images`` photo crops as quality-90 JPEGs (kept in ``--workdir`` for later runs), then
measures, in one run, with medians over ``--repeats`` rounds that take every row in turn:

- decode alone, one core: outcore's decoder (libjpeg-turbo via simplejpeg, what the ingest runs),
  Pillow ``Image.open(...).load()`` and ``imageio.v3.imread``;
- outcore's decoder on every core this process may use (N processes, each reading and decoding its share
  of the files; the pool started before the clock): the ceiling of an ingest;
- ``outcore.ingest_images`` with the local default (threads, one per core);
- ``outcore.ingest_images`` on a ``distributed.LocalCluster`` of N single-threaded worker processes.

The table gives images/s and each row as a fraction of the one-core and of the N-core decode rates.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from common import local_cluster, prepare, print_table
from PIL import Image

import outcore
from outcore.imaging import load_image
from outcore.measure import interleaved
from outcore.threads import available_cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    files = prepare(workdir / f"jpeg-{args.size}", args.images, args.size)
    count, shape = len(files), (args.size, args.size, 3)

    def decode_pillow() -> int:
        for path in files:
            with Image.open(path) as image:
                image.load()
        return count

    def decode_outcore() -> int:
        return decode_files([str(path) for path in files], shape)

    def decode_imageio() -> int:
        for path in files:
            iio.imread(path)
        return count

    def ingest(client: object = None) -> int:
        outcore.ingest_images(workdir / f"jpeg-{args.size}", workdir / "ingest.zarr", shape=shape, overwrite=True,
                              client=client, progress=False)
        return count

    cores = available_cpus()
    parts = [([str(path) for path in files[i::cores]], shape) for i in range(cores)]
    with ProcessPoolExecutor(cores) as pool, local_cluster(cores) as (_, client):
        list(pool.map(_started, range(cores)))  # every process up before the clock starts
        rows = list(interleaved({
            "decode only, outcore (libjpeg-turbo), 1 core": decode_outcore,
            "decode only, Pillow, 1 core": decode_pillow,
            "decode only, imageio.v3.imread, 1 core": decode_imageio,
            f"decode only, outcore, {cores} cores ({cores} processes)": lambda: sum(pool.map(_decode_part, parts)),
            f"outcore ingest, local threads ({cores})": ingest,
            f"outcore ingest, LocalCluster {cores} processes": lambda: ingest(client),
        }, args.repeats).items())
    jpeg_mib = sum(p.stat().st_size for p in files) / 2**20
    store_mib = sum(p.stat().st_size for p in (workdir / "ingest.zarr").rglob("*") if p.is_file()) / 2**20
    print(f"\n{count} JPEGs of {args.size}x{args.size} ({jpeg_mib:.0f} MiB) -> store of {store_mib:.0f} MiB "
          f"({store_mib / jpeg_mib:.1f}x the JPEGs); {cores} cores; medians of {args.repeats} rounds\n")
    print_table(("what", "images/s"), rows, {"vs 1-core decode": rows[0][1], f"vs {cores}-core decode": rows[3][1]})


def decode_files(paths: list[str], shape: tuple[int, int, int]) -> int:
    """Read and decode each file with outcore's decoder (what the ingest runs); how many."""
    for path in paths:
        load_image(path, shape, None, np.dtype("uint8"))
    return len(paths)


def _decode_part(part: tuple[list[str], tuple[int, int, int]]) -> int:
    return decode_files(*part)


def _started(_: int) -> int:
    return 0


if __name__ == "__main__":
    main()
