"""Does a GPU training step wait for data? A real CNN on a CUDA GPU, fed by outcore and by a JPEG folder.

    python benchmarks/gpu_training.py [--samples 20000] [--steps 150] [--cluster-workers 0] [--workdir bench-data]

Builds (once, in ``--workdir``) a store of ``--samples`` 128x128 photo crops with 10 labels and the same
pictures as a JPEG folder, then trains a small ResNet-style network (bf16 autocast, channels last) on
112x112 random crops with random flips, batch 256, for ``--steps`` steps after a warm-up, fed by:

- the same batch, already on the GPU (the ceiling: the GPU's own rate);
- ``ds.torch(256, pin_memory=True)`` + ``to_device`` (reader threads, ``num_workers=0``), and with 4
  DataLoader worker processes;
- a JPEG-folder DataLoader (Pillow decode per sample, 8 worker processes), the usual baseline;
- with ``--cluster-workers n``: an encoded store of the JPEG folder, decoded, cropped and flipped by a
  ``LocalCluster`` of n single-threaded workers started with `outcore.WORKER_CONFIG` (``ds.torch(...,
  client=client)``), batches handed over through shared memory.

Each loader is made once and iterated epoch after epoch, as a training loop does (its DataLoader
workers, where it has them, kept across epochs, as the Pillow DataLoader's are). Prints samples/s, the
share of the step's time spent waiting for the next batch, and the ratio to the ceiling. Needs a CUDA
GPU (it says so and stops without one).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from common import JpegFolder

import outcore
from outcore.imaging.synthetic import photo_crops
from outcore.transforms import Compose, RandomCrop, RandomFlip

BATCH, SIZE, CROP, CLASSES = 256, 128, 112, 10
AUGMENT = Compose([RandomCrop(CROP), RandomFlip()])


def build(workdir: Path, samples: int) -> tuple[outcore.Dataset, Path]:
    import imageio.v3 as iio

    store, jpegs = workdir / f"gpu-{samples}.zarr", workdir / f"gpu-{samples}-jpeg"
    if not store.exists():
        print(f"building {store} and {jpegs} …", flush=True)
        rng = np.random.default_rng(0)
        images = np.stack(photo_crops(samples, (SIZE, SIZE), rng))
        labels = rng.integers(0, CLASSES, samples)
        outcore.from_arrays({"images": images, "labels": labels}, store, progress=False)
        for i, (picture, label) in enumerate(zip(images, labels, strict=True)):
            (jpegs / str(label)).mkdir(parents=True, exist_ok=True)
            iio.imwrite(jpegs / str(label) / f"{i:06d}.jpg", picture, quality=90)
    return outcore.open_dataset(store), jpegs


def network():
    import torch
    from torch import nn

    def stage(inputs: int, outputs: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(inputs, outputs, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(outputs),
                             nn.ReLU(inplace=True), nn.Conv2d(outputs, outputs, 3, padding=1, bias=False),
                             nn.BatchNorm2d(outputs), nn.ReLU(inplace=True))

    model = nn.Sequential(stage(3, 64), stage(64, 128), stage(128, 256), stage(256, 512),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, CLASSES))
    return model.cuda().to(memory_format=torch.channels_last)


def train(batches, steps: int) -> tuple[float, float]:
    """Samples/s and the share of time spent waiting for batches, over ``steps`` steps after 10 warm-up steps."""
    import torch

    model = network()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    iterator = iter(batches)
    waited = samples = 0.0
    for step in range(steps + 10):
        if step == 10:
            torch.cuda.synchronize()
            began, waited, samples = time.perf_counter(), 0.0, 0
        asked = time.perf_counter()
        images, labels = next(iterator)
        waited += time.perf_counter() - asked
        x = ((images.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # the step is done before the next batch is asked for, as in a logged training loop
        samples += len(labels)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - began
    return samples / elapsed, waited / elapsed


def epochs(loader, move=lambda batch: batch):
    """``loader``'s batches, each through ``move``, epoch after epoch: the same loader iterated again, as a
    training loop does."""
    while True:
        yield from (move(batch) for batch in loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--cluster-workers", type=int, default=0, help="also feed from a LocalCluster of n workers")
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return
    from outcore.adapters.torch import to_device

    workdir = Path(args.workdir)
    workdir.mkdir(exist_ok=True)
    ds, jpegs = build(workdir, args.samples)

    def on_gpu(loader):
        """(images, labels) of ``loader``'s batches on the GPU, epoch after epoch."""
        while True:
            yield from ((b["images"], b["labels"]) for b in to_device(loader, "cuda"))

    jpeg_loader = torch.utils.data.DataLoader(JpegFolder(jpegs, crop=CROP), batch_size=BATCH, shuffle=True,
                                              num_workers=8, pin_memory=True, persistent_workers=True)
    first = next(iter(ds.batches(BATCH, fields=["images", "labels"], transform=AUGMENT)))
    resident = (torch.from_numpy(first["images"]).cuda(), torch.from_numpy(first["labels"]).cuda())
    feeds = {
        "the same batch, already on the GPU (ceiling)": lambda: epochs([resident]),
        "outcore ds.torch, reader threads (num_workers=0)": lambda: on_gpu(ds.torch(
            BATCH, shuffle=True, fields=["images", "labels"], transform=AUGMENT, pin_memory=True)),
        "outcore ds.torch, 4 DataLoader workers": lambda: on_gpu(ds.torch(
            BATCH, shuffle=True, fields=["images", "labels"], transform=AUGMENT, pin_memory=True, num_workers=4,
            persistent_workers=True)),
        "JPEG folder, Pillow, DataLoader, 8 workers": lambda: epochs(
            jpeg_loader, lambda pair: (pair[0].cuda(non_blocking=True), pair[1].cuda(non_blocking=True))),
    }
    if args.cluster_workers:
        import dask
        from distributed import Client, LocalCluster

        encoded = workdir / f"gpu-{args.samples}-encoded.zarr"
        jpeg_store = outcore.open_dataset(encoded) if encoded.exists() else outcore.ingest_images(
            jpegs, encoded, shape=(SIZE, SIZE, 3), images="encoded", progress=False)
        with dask.config.set(outcore.WORKER_CONFIG):
            cluster = LocalCluster(n_workers=args.cluster_workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=":0")
        client = Client(cluster)
        feeds[f"outcore ds.torch, JPEG store, LocalCluster of {args.cluster_workers} workers"] = lambda: on_gpu(
            jpeg_store.torch(BATCH, shuffle=True, fields=["images", "labels"], transform=AUGMENT, pin_memory=True,
                             client=client))
    rows = [(name, *train(feed(), args.steps)) for name, feed in feeds.items()]
    ceiling = rows[0][1]
    print(f"\n{torch.cuda.get_device_name()}, {len(ds):,} samples of {SIZE}x{SIZE}, random {CROP}x{CROP} crops + flips, "
          f"batch {BATCH}, bf16, {args.steps} steps\n")
    print(f"{'fed by':52s} {'samples/s':>10s} {'waiting':>8s} {'of ceiling':>11s}")
    for name, rate, waiting in rows:
        print(f"{name:52s} {rate:10.0f} {waiting:8.1%} {rate / ceiling:11.2f}")


if __name__ == "__main__":
    main()
