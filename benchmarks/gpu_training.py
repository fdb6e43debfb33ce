"""Does a GPU training step wait for data? A real CNN on a CUDA GPU, fed by outcore and by a JPEG folder.

    python benchmarks/gpu_training.py [--samples 20000] [--steps 150] [--cluster-workers 0] [--workdir bench-data]
                                      [--imagenet FOLDER] [--device cuda] [--only TEXT,...] [--threads N]

Builds (once, in ``--workdir``) a store of ``--samples`` 128x128 photo crops with 10 labels and the same
pictures as a JPEG folder, then trains a small ResNet-style network (bf16 autocast, channels last) on
112x112 random crops with random flips, batch 256, for ``--steps`` steps after a warm-up, fed by:

- the same batch, already on the GPU (the ceiling: the GPU's own rate);
- the same batch in pinned memory, copied to the GPU by ``to_device`` at every step: what any feed through
  ``to_device`` can reach at most (its host-to-device copies and its Python on the loop's thread, no loader);
- ``ds.torch(256, pin_memory=True)`` + ``to_device`` (reader threads, ``num_workers=0``), with
  ``process=True`` (the batches made by a process of their own, copied into pinned memory as the loop takes
  them: `outcore.iterate.process`), with ``process=4`` (4 such processes, each making its part of every batch,
  each under a GIL of its own), and with 1, 2 and 4 DataLoader worker processes (each writing its part of every batch into shared memory, copied into
  pinned memory by the DataLoader's pin thread); the same on an encoded store of the JPEG folder (decoded, cut and flipped by
  outcore's threads: its defaults), and decoded, cut and flipped on the GPU (``decode="cuda"``: outcore's
  threads read the files, torchvision's nvJPEG decodes them);
- a JPEG-folder DataLoader (Pillow decode per sample, 8 worker processes), the usual baseline;
- with ``--cluster-workers n``: an encoded store of the JPEG folder, decoded, cropped and flipped by a
  ``LocalCluster`` of n single-threaded workers started with `outcore.WORKER_CONFIG` (``ds.torch(...,
  client=client)``), batches handed over through shared memory.

With Keras 3 installed, also ``model.fit`` (its torch backend: a small CNN of the same shape, bf16) on the same
batch already on the GPU (its ceiling), and on ``ds.keras`` with its defaults (on a GPU machine its batches are
made in pinned memory, which Keras copies to the GPU as it takes them) and with ``process=True``: samples/s
between the timed fit's first and last batches, after an untimed epoch (no "waiting" column: the wait is inside
Keras' loop).

With ``--imagenet FOLDER`` (ImageNet-like JPEGs of their own sizes, e.g. `benchmarks/imagenet.py`'s), also
ResNet-50 (torchvision's, bf16, channels last) on ``Compose([RandomResizedCrop(224), RandomFlip()])`` from an
encoded store of the folder's files at their own sizes: the same batch already on the GPU (its ceiling), and
``ds.torch`` with its defaults, with ``process=True`` and ``process=4``, with 4 DataLoader workers (on the H200, one process's fused RRC stopped at 4
threads while 16 processes made 2.7x as many) and with ``decode="cuda"``.

Each loader is made once and iterated epoch after epoch, as a training loop does (its DataLoader workers, where
it has them, kept across epochs, as the Pillow DataLoader's are), timed after a warm-up of `WARM_SECONDS` (a loader
process's start is not timed). Prints samples/s, the share of the step's time spent waiting for the next batch,
the ratio to the ceiling, the median and longest wait for a batch (an epoch's first, mostly: whether the
waits are the epochs' starts or every step's), and a step's time outside its wait (against the ceiling's: what
feeding costs the step itself, its Python and the GIL taken from the loop, its copies). ``--only`` keeps the feeds whose names hold one
of its comma-separated texts (the ceilings are always measured); ``--threads n`` sets outcore's threads
(`outcore.set_threads`) for its feeds. Needs a CUDA GPU (it says so and stops without one); ``--device cpu``
runs every row on the CPU, a few steps, to try the script itself.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from common import JpegFolder, local_cluster

import outcore
from outcore.imaging.synthetic import photo_crops
from outcore.transforms import Compose, RandomCrop, RandomFlip, RandomResizedCrop

BATCH, SIZE, CROP, CLASSES = 256, 128, 112, 10
AUGMENT = Compose([RandomCrop(CROP), RandomFlip()])
IMAGENET = Compose([RandomResizedCrop(224), RandomFlip()])
DEVICE = "cuda"  # --device
WARM_SECONDS = 3.0  # the least warm-up of each feed, untimed
CEILINGS = "the same batch"  # the feeds of one batch again and again: measured whatever --only says


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
    return model.to(DEVICE).to(memory_format=torch.channels_last)


def resnet50():
    import torch
    import torchvision

    return torchvision.models.resnet50(num_classes=CLASSES).to(DEVICE).to(memory_format=torch.channels_last)


def synchronize() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def train(batches, steps: int, make_model=network) -> tuple[float, float, float, float, float]:
    """Samples/s, the share of time spent waiting for batches, the median and longest wait for one, and a step's
    time outside its wait (seconds: against the ceiling's, what the feed costs the step itself: its Python on the
    loop's thread, the GIL it takes from the loop, its copies),
    over ``steps`` steps after a warm-up of 10 steps and `WARM_SECONDS` at least: a loader process's start (it
    imports the script's modules again) is not timed."""
    import torch

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=DEVICE).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=DEVICE).view(1, 3, 1, 1) * 255
    iterator = iter(batches)

    def one_step() -> tuple[float, int]:
        """The seconds waited for the batch, and its samples."""
        asked = time.perf_counter()
        images, labels = next(iterator)
        waited = time.perf_counter() - asked
        x = ((images.permute(0, 3, 1, 2).float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # the step is done before the next batch is asked for, as in a logged training loop
        return waited, len(labels)

    warming_until, warm = time.perf_counter() + WARM_SECONDS, 0
    while warm < 10 or time.perf_counter() < warming_until:
        one_step()
        warm += 1
    synchronize()
    began = time.perf_counter()
    waits, samples = zip(*(one_step() for _ in range(steps)), strict=True)
    synchronize()
    elapsed = time.perf_counter() - began
    return (sum(samples) / elapsed, sum(waits) / elapsed, float(np.median(waits)), max(waits),
            (elapsed - sum(waits)) / steps)


def epochs(loader, move=lambda batch: batch):
    """``loader``'s batches, each through ``move``, epoch after epoch: the same loader iterated again, as a
    training loop does."""
    while True:
        yield from (move(batch) for batch in loader)


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--cluster-workers", type=int, default=0, help="also feed from a LocalCluster of n workers")
    parser.add_argument("--imagenet", type=Path, help="a folder of JPEGs at their own sizes: ResNet-50 on RRC(224)")
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: try the script, no figures")
    parser.add_argument("--only", help="the feeds whose names contain one of these comma-separated texts (and the "
                                       "ceilings); a comma and a space are part of a text, as in the feeds' names")
    parser.add_argument("--threads", type=int, help="outcore.set_threads(n) before its feeds (default: its own)")
    args = parser.parse_args()
    import torch

    DEVICE = args.device
    if args.threads:
        outcore.set_threads(args.threads)
    chosen = re.split(r",(?! )", args.only) if args.only else [""]  # "JPEG store, its defaults" is one text
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure (--device cpu tries the script on the CPU)")
        return
    from outcore.adapters.torch import to_device

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ds, jpegs = build(workdir, args.samples)
    encoded = workdir / f"gpu-{args.samples}-encoded.zarr"
    jpeg_store = outcore.open_dataset(encoded) if encoded.exists() else outcore.ingest_images(
        jpegs, encoded, shape=(SIZE, SIZE, 3), images="encoded", progress=False)

    def on_device(loader):
        """(images, labels) of ``loader``'s batches on the device, epoch after epoch."""
        while True:
            yield from ((b["images"], b["labels"]) for b in to_device(loader, DEVICE))

    def resident(store, transform):
        """A batch of ``store`` already on the device, again and again: the ceiling."""
        first = next(iter(store.batches(BATCH, fields=["images", "labels"], transform=transform)))
        return epochs([(torch.from_numpy(first["images"]).to(DEVICE), torch.from_numpy(first["labels"]).to(DEVICE))])

    def copied_each_step(store, transform):
        """A batch of ``store`` in pinned memory, copied to the device by `to_device` at every step: the ceiling of
        any feed through it (its copies and its Python on the loop's thread), no loader."""
        first = next(iter(store.torch(BATCH, fields=["images", "labels"], transform=transform, pin_memory=True)))
        while True:
            yield from ((b["images"], b["labels"]) for b in to_device(epochs([first]), DEVICE))

    def outcore_feed(store, transform, **options):
        return lambda: on_device(store.torch(BATCH, shuffle=True, fields=["images", "labels"], transform=transform,
                                             pin_memory=True, **options))

    jpeg_loader = torch.utils.data.DataLoader(JpegFolder(jpegs, crop=CROP), batch_size=BATCH, shuffle=True,
                                              num_workers=8, pin_memory=DEVICE == "cuda", persistent_workers=True)
    feeds = {
        "the same batch, already on the GPU (ceiling)": lambda: resident(ds, AUGMENT),
        "the same batch, pinned, copied by to_device each step": lambda: copied_each_step(ds, AUGMENT),
        "outcore ds.torch, pixels, its defaults (threads)": outcore_feed(ds, AUGMENT),
        "outcore ds.torch, pixels, a process of its own": outcore_feed(ds, AUGMENT, process=True),
        "outcore ds.torch, pixels, 4 processes of its own": outcore_feed(ds, AUGMENT, process=4),
        "outcore ds.torch, pixels, 1 DataLoader worker": outcore_feed(ds, AUGMENT, num_workers=1,
                                                                      persistent_workers=True),
        "outcore ds.torch, pixels, 2 DataLoader workers": outcore_feed(ds, AUGMENT, num_workers=2,
                                                                       persistent_workers=True),
        "outcore ds.torch, pixels, 4 DataLoader workers": outcore_feed(ds, AUGMENT, num_workers=4,
                                                                       persistent_workers=True),
        "outcore ds.torch, JPEG store, its defaults": outcore_feed(jpeg_store, AUGMENT),
        "outcore ds.torch, JPEG store, a process of its own": outcore_feed(jpeg_store, AUGMENT, process=True),
        "outcore ds.torch, JPEG store, 4 processes of its own": outcore_feed(jpeg_store, AUGMENT, process=4),
        "outcore ds.torch, JPEG store, decoded on the GPU": outcore_feed(jpeg_store, AUGMENT, decode=DEVICE),
        "JPEG folder, Pillow, DataLoader, 8 workers": lambda: epochs(
            jpeg_loader, lambda pair: (pair[0].to(DEVICE, non_blocking=True), pair[1].to(DEVICE, non_blocking=True))),
    }
    with contextlib.ExitStack() as opened:
        if args.cluster_workers:
            import dask

            opened.enter_context(dask.config.set(outcore.WORKER_CONFIG))
            _, client = opened.enter_context(local_cluster(args.cluster_workers))
            feeds[f"outcore ds.torch, JPEG store, LocalCluster of {args.cluster_workers} workers"] = outcore_feed(
                jpeg_store, AUGMENT, client=client)
        table("a small ResNet", f"{len(ds):,} samples of {SIZE}x{SIZE}, random {CROP}x{CROP} crops + flips",
              only(feeds, chosen), args.steps, network)
    keras_table(ds, args.steps, chosen)
    if args.imagenet and not args.imagenet.is_dir():
        print(f"\nno folder {args.imagenet}: no ResNet-50 rows (benchmarks/imagenet.py writes one)")
    elif args.imagenet:
        own = workdir / "gpu-imagenet-own-sizes.zarr"
        own_sizes = outcore.open_dataset(own) if own.exists() else outcore.ingest_images(
            args.imagenet, own, shape=None, images="encoded", progress=False)
        feeds = {
            "the same batch, already on the GPU (ceiling)": lambda: resident(own_sizes, IMAGENET),
            "the same batch, pinned, copied by to_device each step": lambda: copied_each_step(own_sizes, IMAGENET),
            "outcore ds.torch, JPEGs at their sizes, its defaults": outcore_feed(own_sizes, IMAGENET),
            "outcore ds.torch, JPEGs at their sizes, a process of its own": outcore_feed(own_sizes, IMAGENET,
                                                                                        process=True),
            "outcore ds.torch, JPEGs at their sizes, 4 processes of its own": outcore_feed(own_sizes, IMAGENET,
                                                                                           process=4),
            "outcore ds.torch, JPEGs at their sizes, 4 DataLoader workers": outcore_feed(
                own_sizes, IMAGENET, num_workers=4, persistent_workers=True),
            "outcore ds.torch, JPEGs at their sizes, decoded on the GPU": outcore_feed(own_sizes, IMAGENET,
                                                                                      decode=DEVICE),
        }
        table("ResNet-50", f"{len(own_sizes):,} JPEGs at their own sizes, RandomResizedCrop(224) + flip",
              only(feeds, chosen), args.steps, resnet50)


def keras_table(ds: outcore.Dataset, steps: int, chosen: list[str]) -> None:
    """Keras' ``model.fit`` (torch backend) of a small CNN fed the same batch on the device (the ceiling) and by
    ``ds.keras``: samples/s and the ratio to the ceiling (`fit_rate`)."""
    os.environ["KERAS_BACKEND"] = "torch"  # before Keras is first imported
    try:
        import keras
    except ImportError:
        print("\nno Keras here: no Keras rows (pip install keras)")
        return
    if keras.backend.backend() != "torch":
        print(f"\nKeras was imported with its {keras.backend.backend()} backend: no Keras rows")
        return
    import torch

    keras.mixed_precision.set_global_policy("mixed_bfloat16")

    def same_batch():
        """The same batch on the device, again and again (an endless generator: no length)."""
        first = next(iter(ds.batches(BATCH, fields=["images", "labels"], transform=AUGMENT)))
        pair = (torch.from_numpy(first["images"]).to(DEVICE), torch.from_numpy(first["labels"]).to(DEVICE))
        while True:
            yield pair

    def outcore_keras(**options):
        return lambda: ds.keras(BATCH, x="images", y="labels", transform=AUGMENT, shuffle=True, **options)

    feeds = {
        "the same batch, already on the GPU (ceiling)": same_batch,
        "outcore ds.keras, pixels, its defaults (threads)": outcore_keras(),
        "outcore ds.keras, pixels, a process of its own": outcore_keras(process=True),
    }
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU (a try of the script: no figures)"
    print(f"\nKeras {keras.__version__} (torch backend), model.fit of a small CNN on {where}, random {CROP}x{CROP} "
          f"crops + flips, batch {BATCH}, bf16, {steps} steps\n")
    print(f"{'fed by':56s} {'samples/s':>10s} {'of ceiling':>11s}", flush=True)
    ceiling = None
    for name, made in only(feeds, chosen).items():
        try:
            rate = fit_rate(keras, made, steps)
        except Exception as error:  # noqa: BLE001 - one feed's failure is that row's result, the others still run
            traceback.print_exc()
            print(f"{name:56s} failed: {type(error).__name__}: {error}", flush=True)
            continue
        ceiling = ceiling or rate
        print(f"{name:56s} {rate:10.0f} {rate / ceiling:11.2f}", flush=True)


def keras_network(keras):
    """The small ResNet's shape in Keras (channels last, uint8 in), compiled."""
    layers = keras.layers
    inputs = keras.Input((CROP, CROP, 3), dtype="uint8")
    x = layers.Rescaling(1 / 255)(inputs)
    for width in (64, 128, 256, 512):
        for stride in (2, 1):
            x = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
            x = layers.ReLU()(layers.BatchNormalization()(x))
    outputs = layers.Dense(CLASSES, dtype="float32")(layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit_rate(keras, make: Callable[[], object], steps: int) -> float:
    """Samples/s of ``model.fit`` on what ``make()`` gives, over ``steps`` batches at least, between the first and
    the last batch's end, after `WARM_SECONDS` (a loader process's start) and an untimed epoch (of 20 batches, for
    data without a length: an endless generator)."""
    model, data = keras_network(keras), make()
    time.sleep(WARM_SECONDS)
    ends: list[float] = []
    timing = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    endless = not hasattr(data, "__len__")
    model.fit(data, epochs=1, steps_per_epoch=20 if endless else None, shuffle=not endless, verbose=0)
    if endless:
        model.fit(data, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0, callbacks=[timing])
    else:
        model.fit(data, epochs=math.ceil(steps / len(data)), verbose=0, callbacks=[timing])
    synchronize()
    return (len(ends) - 1) * BATCH / (ends[-1] - ends[0])


def only(feeds: dict[str, Callable[[], Iterator]], chosen: list[str]) -> dict[str, Callable[[], Iterator]]:
    """The ceilings (the feeds of the same batch again and again) and the feeds whose names contain one of the
    ``chosen`` texts."""
    return {name: feed for name, feed in feeds.items()
            if name.startswith(CEILINGS) or any(text in name for text in chosen)}


def table(model: str, data: str, feeds: dict[str, Callable[[], Iterator]], steps: int, make_model) -> None:
    """``make_model`` trained on each feed: samples/s, the share of the time waiting and the ratio to the first
    feed's rate (the ceiling), each row printed once it is measured (a run cut short keeps the rows it has; a feed
    that fails prints its error in its row). The first feed is trained on once before, untimed: on the H200 the
    first row measured ran 0.85 of the second, the same batch copied at every step besides."""
    import torch

    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU (a try of the script: no figures)"
    print(f"\n{model} on {where}, {data}, batch {BATCH}, bf16, {steps} steps\n")
    print(f"{'fed by':56s} {'samples/s':>10s} {'waiting':>8s} {'of ceiling':>11s} {'a wait, ms':>11s} "
          f"{'longest':>8s} {'a step, ms':>11s}", flush=True)
    train(next(iter(feeds.values()))(), steps, make_model)  # untimed: the GPU's first work (clocks, cuDNN's choices)
    ceiling = None
    for name, feed in feeds.items():
        try:
            rate, waiting, median, longest, step = train(feed(), steps, make_model)
        except Exception as error:  # noqa: BLE001 - one feed's failure is that row's result, the others still run
            traceback.print_exc()
            print(f"{name:56s} failed: {type(error).__name__}: {error}", flush=True)
            continue
        ceiling = ceiling or rate
        print(f"{name:56s} {rate:10.0f} {waiting:8.1%} {rate / ceiling:11.2f} {median * 1e3:11.2f} "
              f"{longest * 1e3:8.1f} {step * 1e3:11.2f}", flush=True)


if __name__ == "__main__":
    main()
