"""Decode on a Dask cluster: does reading an encoded (JPEG) store scale with workers?

    python benchmarks/cluster.py [--images 20000] [--size 128] [--large 2000] [--repeats 3] [--workers 1,2]
                                 [--workdir bench-data]

Writes ``--images`` photo crops as quality-90 JPEGs (kept in ``--workdir``), ingests them twice —
``images="encoded"`` (the JPEG bytes) and ``images="pixels"`` — and measures in one run, with medians
over ``--repeats`` full epochs (batch 256, shuffled, no transform):

- decoders on one core, over the stored bytes: outcore's (libjpeg-turbo through simplejpeg, which
  every path below uses), Pillow, and ``imageio.v3.imread``;
- an epoch of the encoded store with local threads, and on a ``distributed.LocalCluster`` of each of
  ``--workers`` single-threaded worker processes (``ds.batches(client=...)``);
- the same for the pixel store: what the cluster path costs when there is nothing to decode;
- ``--large`` JPEGs of twice the size decoded to the same shape: JPEG DCT scaling against a full decode
  followed by the same resize.

The cluster rows compare n workers with 1, and n workers with n times the one-core decode rate, twice:
batches *delivered* to this process, and batches *made only* (a transform keeps one sample of each,
so they are decoded and assembled in full on the workers but hardly travel). The gap between the two
is the cost of shipping pixels to the consumer, bounded by the last row: blank batches gathered.
"""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

import imageio.v3 as iio
import numpy as np
from common import prepare, print_table, timed
from distributed import Client, LocalCluster
from PIL import Image

import outcore
from outcore.imaging import decode_image
from outcore.storage import read_files

BATCH = 256


def store(source: Path, target: Path, shape: tuple[int, ...], images: str) -> outcore.Dataset:
    if target.exists():
        ds = outcore.open_dataset(target)
        if ds.attrs.provenance.get("source", "").endswith(str(source.absolute())) and ds["images"].shape[1:] == shape:
            return ds
    print(f"ingesting {source} -> {target} ({images}) …")
    return outcore.ingest_images(source, target, shape=shape, images=images, overwrite=True)


def keep_one(batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A transform that drops all but one sample: the batch is made in full, but hardly travels."""
    return {name: values[:1] for name, values in batch.items()}


def epoch_rate(ds: outcore.Dataset, repeats: int, client: Client | None = None, transform: object = None) -> float:
    """Median samples/s of full shuffled epochs (after one warm-up batch: imports, store opening)."""
    it = ds.batches(BATCH, fields=["images", "labels"], client=client, prefetch=4, transform=transform)
    next(iter(it))
    it.close()

    def epoch() -> None:
        for _ in it:
            pass

    return timed(epoch, len(ds), repeats)


def transfer_rate(client: Client, shape: tuple[int, ...], repeats: int) -> float:
    """Samples/s of blank batches made on the workers and gathered: what delivery to the consumer allows."""
    def gather() -> None:
        futures = [client.submit(np.full, (BATCH, *shape), 1, np.uint8, pure=False) for _ in range(40)]
        for future in futures:
            future.result()

    return timed(gather, 40 * BATCH, repeats)


def decoder_rates(blobs: list[bytes], shape: tuple[int, ...], repeats: int) -> list[tuple[str, float]]:
    def outcore_decoder() -> None:
        for blob in blobs:
            decode_image(blob, shape, "crop", np.dtype("uint8"))

    def pillow() -> None:
        for blob in blobs:
            with Image.open(io.BytesIO(blob)) as image:
                np.asarray(image.convert("RGB"))

    def imageio() -> None:
        for blob in blobs:
            iio.imread(blob)

    return [
        ("decode, outcore (libjpeg-turbo via simplejpeg), 1 core", timed(outcore_decoder, len(blobs), repeats)),
        ("decode, Pillow, 1 core", timed(pillow, len(blobs), repeats)),
        ("decode, imageio.v3.imread, 1 core", timed(imageio, len(blobs), repeats)),
    ]


def reduced_rates(blobs: list[bytes], shape: tuple[int, ...], repeats: int) -> list[tuple[str, float]]:
    def reduced() -> None:
        for blob in blobs:
            decode_image(blob, shape, "crop", np.dtype("uint8"))

    def full_then_resize() -> None:
        for blob in blobs:
            with Image.open(io.BytesIO(blob)) as image:
                image.convert("RGB").resize(shape[1::-1], Image.Resampling.BILINEAR)

    return [
        ("2x-size JPEG -> shape, DCT-scaled decode + resize", timed(reduced, len(blobs), repeats)),
        ("2x-size JPEG -> shape, full decode + resize (Pillow)", timed(full_then_resize, len(blobs), repeats)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--large", type=int, default=2000, help="JPEGs of 2x --size for the DCT-scaling rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="LocalCluster sizes, comma-separated (1 first)")
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]
    workdir = Path(args.workdir)
    shape = (args.size, args.size, 3)
    source = workdir / f"jpeg-{args.size}-{args.images}"
    files = prepare(source, args.images, args.size)
    encoded = store(source, workdir / f"encoded-{args.size}-{args.images}.zarr", shape, "encoded")
    pixels = store(source, workdir / f"pixels-{args.size}-{args.images}.zarr", shape, "pixels")
    large_source = workdir / f"jpeg-{2 * args.size}-{args.large}"
    large_files = prepare(large_source, args.large, 2 * args.size)

    blobs = read_files(encoded.array("images"), encoded.array("images_ranges"), 0, len(encoded))
    decoders = decoder_rates(blobs[: min(len(blobs), 5000)], shape, args.repeats)
    decode = decoders[0][1]
    large_blobs = [path.read_bytes() for path in large_files]
    reduced = reduced_rates(large_blobs, shape, args.repeats)
    rows = [*decoders, *reduced,
            ("encoded store, local threads", epoch_rate(encoded, args.repeats)),
            ("pixel store, local threads", epoch_rate(pixels, args.repeats))]
    delivered, made = {}, {}
    for workers in sizes:
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=":0") as cluster, Client(cluster) as client:
            delivered[workers] = epoch_rate(encoded, args.repeats, client)
            made[workers] = epoch_rate(encoded, args.repeats, client, keep_one)
            rows += [(f"encoded store, LocalCluster {workers} worker(s), delivered", delivered[workers]),
                     (f"encoded store, LocalCluster {workers} worker(s), made only", made[workers])]
            if workers == sizes[-1]:
                rows += [(f"pixel store, LocalCluster {workers} workers, delivered",
                          epoch_rate(pixels, args.repeats, client)),
                         (f"blank batches gathered from {workers} workers (delivery bound)",
                          transfer_rate(client, shape, args.repeats))]

    jpeg_mib = sum(p.stat().st_size for p in files) / 2**20
    print(f"\n{len(files)} JPEGs of {args.size}x{args.size} ({jpeg_mib:.0f} MiB): encoded store "
          f"{_mib(encoded.location):.0f} MiB, pixel store {_mib(pixels.location):.0f} MiB; {os.cpu_count()} cores; "
          f"batch {BATCH}; medians of {args.repeats} runs\n")
    print_table(("what", "samples/s"), rows, {"vs 1-core decode": decode})
    rate = dict(rows)
    print()
    scaling = [(f"{n} workers / 1 worker, {kind}", rates[n] / rates[sizes[0]])
               for n in sizes[1:] for kind, rates in (("delivered", delivered), ("made only", made))]
    efficiency = [(f"{n} workers {kind} / ({n} x 1-core decode)", rates[n] / (n * decode))
                  for n in sizes[1:] for kind, rates in (("delivered", delivered), ("made only", made))]
    for what, value in [
        *scaling,
        *efficiency,
        ("DCT-scaled / full decode, 2x-size JPEGs", reduced[0][1] / reduced[1][1]),
        ("libjpeg-turbo / Pillow decode", decode / decoders[1][1]),
        ("pixel store, cluster / local threads", rate[f"pixel store, LocalCluster {sizes[-1]} workers, delivered"]
         / rate["pixel store, local threads"]),
    ]:
        print(f"{what:60s} {value:5.2f}")


def _mib(location: str) -> float:
    return sum(p.stat().st_size for p in Path(location).rglob("*") if p.is_file()) / 2**20


if __name__ == "__main__":
    main()
