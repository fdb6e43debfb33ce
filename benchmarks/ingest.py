"""How fast does a folder of JPEGs become a store, next to how fast the JPEGs merely decode?

    python benchmarks/ingest.py [--images 10000] [--size 128] [--repeats 3] [--workdir bench-data]

Writes ``--images`` photo crops as quality-90 JPEGs (kept in ``--workdir`` for later runs), then
measures, in one run, with medians over ``--repeats``:

- decode alone, one core: outcore's decoder (libjpeg-turbo via simplejpeg, what the ingest runs),
  Pillow ``Image.open(...).load()`` and ``imageio.v3.imread``;
- ``outcore.ingest_images`` with the local default (threads, one per core);
- ``outcore.ingest_images`` on a ``distributed.LocalCluster`` of 2 single-threaded worker processes.

The table gives images/s and each ingest as a fraction of the one-core decode rate (and of two cores).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from common import prepare, print_table, timed
from PIL import Image

import outcore
from outcore.imaging import load_image


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

    def decode_pillow() -> None:
        for path in files:
            with Image.open(path) as image:
                image.load()

    def decode_outcore() -> None:
        for path in files:
            load_image(str(path), shape, None, np.dtype("uint8"))

    def decode_imageio() -> None:
        for path in files:
            iio.imread(path)

    def ingest(client: object = None) -> None:
        outcore.ingest_images(workdir / f"jpeg-{args.size}", workdir / "ingest.zarr", shape=shape, overwrite=True,
                              client=client, progress=False)

    rows = [
        ("decode only, outcore (libjpeg-turbo), 1 core", timed(decode_outcore, count, args.repeats)),
        ("decode only, Pillow, 1 core", timed(decode_pillow, count, args.repeats)),
        ("decode only, imageio.v3.imread, 1 core", timed(decode_imageio, count, args.repeats)),
        (f"outcore ingest, local threads ({os.cpu_count()})", timed(ingest, count, args.repeats)),
    ]
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        rows.append(("outcore ingest, LocalCluster 2 processes", timed(lambda: ingest(client), count, args.repeats)))
    jpeg_mib = sum(p.stat().st_size for p in files) / 2**20
    store_mib = sum(p.stat().st_size for p in (workdir / "ingest.zarr").rglob("*") if p.is_file()) / 2**20
    decode = rows[0][1]
    print(f"\n{count} JPEGs of {args.size}x{args.size} ({jpeg_mib:.0f} MiB) -> store of {store_mib:.0f} MiB "
          f"({store_mib / jpeg_mib:.1f}x the JPEGs); medians of {args.repeats} runs\n")
    print_table(("what", "images/s"), rows, {"vs 1-core decode": decode, "vs 2-core decode": 2 * decode})


if __name__ == "__main__":
    main()
