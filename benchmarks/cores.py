"""Does one outcore process use its cores? Thread scaling, and the share of the work done holding the GIL.

    python benchmarks/cores.py [--images 6000] [--threads 1,2] [--seconds 6] [--workdir bench-data/cores]
                               [--only scaling,apart,gil,releases,torch,feed,processes,parts] [--processes 1,2]
                               [--step-ms 5] [--held 0.5] [--feed-workers 0,torch,process,process2,2]
                               [--cases pixels,pixels-each,pixels+flip,pixels+crop,pixels+crop+norm,pixels+rrc,
                                        pixels+then-rrc,pixels+crop+bc,pixels+crop+half,pixels+crop+norm16,
                                        pixels+center,pixels+jitter,pixels16+rrc,encoded+flip,pixels+crop-torch,encoded,
                                        encoded+crop,encoded+jitter,encoded+crop-torch,png,png+crop,rrc,dense,dense-own,
                                        palette,depth16,dense-bc,depth-own,ingest,ingest-png,ingest-depth,
                                        ingest-masks,ingest-masks12,exif,exif+crop,ingest-exif,ingest-pixels,
                                        ingest-pixels-exif,ingest-pixels-own,ingest-pixels-png,grey,weighed]
                               [--torch-workers 0,2] [--as-cpus 16]

Builds (once, in ``--workdir``) a pixel store and an encoded store of the same ``--images`` 128x128 photo crops, an
ImageNet-like encoded store of JPEGs at their own size (a sixth as many; `imagenet.write_folder`) and a COCO-like
encoded store of 320x240 photos with instance maps, boxes and keypoints (as many; `dense_targets.make_set`; the
``dense`` case crops and flips all of them; ``dense-own`` the same stored at the pictures' own size, its maps raster
fields; ``dense-bc``: ``BrightnessContrast()`` first, as detection pipelines put their colours' jitter, so the crop
and flip after it are not fused with decoding; ``depth-own``: the JPEGs of ``encoded`` each with a 16-bit depth map
(its luminance times 257, a PNG) paired with it at its own size, a raster field, moved by ``RandomResizedCrop(112)``
+ flip), then, for each case (``ds.batches(256, shuffle=True)`` over the images and labels, flat out, no consumer
work, each pass over it the next epoch, as Keras and a DataLoader do; ``pixels-each``: ``ds.batches(...)`` made anew
each epoch, as a ``for epoch in range(n): for batch in ds.batches(...)`` loop does; ``pixels+flip``: a
``RandomFlip`` alone; ``pixels+crop+norm``: crop + flip then ``Normalize`` by ImageNet's means and deviations,
float32 batches; ``pixels+rrc``: ``RandomResizedCrop(112)`` + flip of the pixels; ``pixels+then-rrc``: the same
after a user's Python step (`users_step`), so not fused with the batch's making: on each piece of the batch;
``pixels+crop+bc``: crop + flip then ``BrightnessContrast()``; ``pixels+crop+half``: ``pixels+crop+norm`` then
``Cast("float16")``; ``pixels+crop+norm16``: the same by ``Normalize(..., dtype="float16")``; ``pixels+center``:
``CenterCrop(112)``; ``pixels+jitter``, ``encoded+jitter``: ``ScaleJitter(112, scale=(0.5, 1.5))`` + flip of the
pixels, of the JPEGs; ``pixels16+rrc``: ``pixels+rrc`` of the same photos in 16 bits (uint16, each level times 257,
as a 16-bit PNG of them holds them: a store written by ``outcore.from_arrays``); ``encoded+flip``: ``RandomFlip()`` alone of the JPEGs; ``pixels+crop-torch``,
``encoded+crop-torch``: the same through ``ds.torch(256)`` without DataLoader workers, its default, as a training
loop takes it, in tensors (with PyTorch installed); ``png``, ``png+crop``: ``encoded`` and ``encoded+crop`` of the same
photos written as PNG files; ``palette``: ``encoded`` of them as palette PNGs (Pillow's adaptive palette of 256
colours); ``depth16``: an encoded uint16 field of the 16-bit depth maps of ``depth-own`` (`depth_maps`) as they are,
its batches of 1 channel of uint16; ``ingest-png``: ``ingest`` of those PNG files; ``ingest``: ``outcore.ingest_images`` of the JPEGs at their own
sizes, ``shape=None, images="encoded"``, files/s; ``ingest-depth``: ``outcore.ingest_dataframe`` of the photos' JPEGs,
each with its 16-bit depth map (the ``depth-own`` store's files) paired, ``pair_columns=["depth"]``, pictures/s;
``ingest-masks``: the same with a palette PNG label map of each (`label_maps`), ``mask_columns=["mask"]``;
``ingest-masks12``: the same with label maps of 12 classes, 4-bit palette PNGs as Pillow saves them; ``exif``,
``exif+crop``: ``encoded`` and ``encoded+crop`` of the photos' JPEGs each with the EXIF block a camera or phone writes
(its make, model and orientation; the pixels as they were), a quarter of them saying 1 (upright, a camera's), the
others turned a quarter either way or upside down (6, 8, 3: a phone held so; stored turned, decoded upright, as
Pillow's ``exif_transpose``); ``ingest-exif``: ``ingest`` of those files (`exif_photos`); ``ingest-pixels``,
``ingest-pixels-exif``: ``ingest_images`` of the photos' JPEGs, of those with EXIF, into a pixel store,
``shape=(96, 96, 3)`` (each file decoded and cut to it, as ``resize="crop"`` does); ``ingest-pixels-png``: the PNGs
of ``png`` ingested so; ``ingest-pixels-own``: the ImageNet-like JPEGs of ``rrc`` ingested so, ``shape=(224, 224,
3)``; ``grey``: ``encoded`` of the
photos as greyscale JPEGs in a store of RGB pictures, as ImageNet and COCO hold some, each level repeated;
``weighed``: ``encoded`` of the photos' colour JPEGs in a store of grey pictures, ``shape=(128, 128, 1)``, each
weighed as Pillow's ``convert("L")`` weighs it):

- **scaling**: samples/s with ``outcore.set_threads(n)`` for each ``--threads`` (median of the epochs run in
  ``--seconds``), the ratio to ``n`` times the one-thread rate, and the GIL share timed: the share of the
  process's CPU time spent outside outcore's C calls that release the GIL (`outcore.measure.gil_free_clock`:
  each thread's own CPU clock read around those calls, so a thread waiting for a core counts in neither), an
  upper bound of the time holding the GIL, exact however busy the machine; with what it allows on 16 cores
  (not for ``ingest``, whose compression and digests run in other libraries' C, uncounted: ``-``); then, at the
  last thread count, that share by thread (each thread's own CPU clock): the consumer's, the pool's outside
  outcore's C calls (which run there) and the others' (the thread that plans each run's batches and hands them
  over), the three adding up to it;
  With ``--as-cpus n`` (the scaling and gil runs), the pool is made and gauged as on ``n`` CPUs: its limit of
  busy threads stays at its threads (on fewer cores the `Gauge` would see them wait for cores and lower it), so
  a batch is cut into as many runs and as many batches are made at once as there, and the GIL share counts the
  Python (and the GIL's hand-overs) that configuration makes; the rates then say nothing of ``n`` cores.
- **apart** (``--only ...,apart``): the ceiling of the scaling table. For each ``--threads`` n, n copies of the
  case side by side, each ``epochs`` on one thread in a process of its own, timed together (each copy's seconds
  begin once all have made their first epoch): what n cores give the one-thread work when nothing is shared but
  the machine (its caches, its memory's bandwidth, a core's second hardware thread, its clock under load). The
  ratio to n times one copy is the machine's own scaling; the scaling table's n threads as a share of the copies'
  rate is outcore's, the machine's part taken out (the issue's 0.85 of 16 x one thread is met when the machine
  gives that much to copies).
- **gil**: on these cores, where the work's time goes and how much of it holds the GIL: py-spy samples a
  process running the case at ``--gil-threads`` (default: one per core) twice, once every running thread (CPU time), once only the
  thread holding the GIL (``--gil``); each sample is put in the stage of its innermost outcore frame (read
  and decompress, JPEG decode, crop/resize, batch assembly, transforms, plan and schedule, threads and
  queues, the consumer). ``GIL share`` is GIL time over CPU time, per stage and in all; on ``n`` cores a
  share ``s`` allows at most ``1 / (s + (1 - s) / n)`` times one core's rate (the GIL's part runs one
  thread at a time), printed for 16 cores beside the scaling measured here; then the functions holding the GIL
  most (each sample put in its innermost outcore frame's function): where to look first.

- **releases** (asked for with ``--only ...,releases``): how often a batch gives up the GIL, and where. Each time a
  thread gives it up while another wants it, the other takes it: a hand-over (a wake, a switch) that costs more
  than a few microseconds of work, and more the more threads there are. ``perf`` counts the calls of CPython's
  ``PyEval_SaveThread`` (a uprobe) in a process running the case at ``--gil-threads`` for ``--seconds``, each put
  to the C function that gave the GIL up (numpy's, outcore's, a lock's or a queue's wait), per batch. Needs
  ``perf`` and root (uprobes).
- **processes** (asked for with ``--only ...,processes``): the same epochs made by loader processes
  (``ds.batches(256, shuffle=True, process=k)`` for each ``--processes`` k: one process making whole batches, or
  k making their parts of each, each on its share of the cores) against this process's threads on every core:
  samples/s, the ratio to the threads', and the consumer's CPU time a batch taking them (mapping, joining).
  Each process has a GIL of its own, so where one process's GIL share bounds its threads (16 cores), k processes
  have k such bounds, each for less Python (``parts``); on 2 cores it shows what they cost.
- **parts** (``--only ...,parts``): what a process of those needs of its GIL: the GIL-held time (timed, as in
  scaling) of part 0 of each batch out of k (for each ``--processes`` k), made in this process on one thread,
  against a whole batch's (medians of the epochs after the first, 3 at least): k processes' GILs allow up to
  that ratio's inverse times the batches a second one process's GIL allows.

- **feed** (asked for with ``--only ...,feed``): does a training loop in the loader's process wait? A stand-in
  for a training step that launches its kernels from Python: ``--step-ms`` of CPU a step in rounds of 50 us,
  ``--held`` of each round a Python loop (holding the GIL) and the rest a hash (a C call that releases it, as
  a kernel launch does), alone (its ceiling) and taking a batch of the case before each step (one iterator,
  epoch after epoch: ``ds.batches`` on outcore's default threads, or, for each ``--feed-workers`` count above 0,
  ``ds.torch`` with that many DataLoader workers, for ``torch``, ``ds.torch`` without workers, and for
  ``process``, ``ds.batches(process=True)``, made in a process of its own, ``processN`` by N): steps/s, the ratio to the ceiling,
  the share of the time waiting for a batch, the CPU time of the loop's own thread taking each batch (the
  hand-off: a DataLoader's items received, a batch's parts joined), and that of its process's other threads a
  batch (a loader's threads in its process: the work whose GIL it shares), and the median wait for an epoch's first
  batch (the feed begins at an epoch's start). Each time the step takes the GIL back it may wait for a
  loader thread's Python, and each time a loader thread wants it back it may wait for the step's: what this
  measures is how often and how long a batch needs the GIL while something else needs it too.

py-spy must be installed (``pip install py-spy``) and allowed to read the process (root, or
``kernel.yama.ptrace_scope=0``). On 2 cores, the scaling table stops at 2 threads: the GIL share is what
says how a 16-core machine will scale.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from dense_targets import TARGETS, make_set
from PIL import Image

import outcore
import outcore.threads
from outcore import measure
from outcore.imaging.synthetic import write_image_folder
from outcore.iterate.batch import plain
from outcore.measure import gil_bound, gil_free_clock
from outcore.storage import chunk_reads
from outcore.threads.pool import Gauge
from outcore.transforms import (
    BrightnessContrast,
    Cast,
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
    ScaleJitter,
    Targets,
)

BATCH = 256
AS_CPUS = 0  # --as-cpus: the pool made and gauged as on that many CPUs (0: these)
RATE = 250  # py-spy samples a second
FUNCTIONS = 8  # the functions holding the GIL most, printed per case
TAKEN = [0]  # batches taken by a process running a case (``--run``), for `releases`
RELEASERS = 12  # the C functions giving up the GIL most, printed per case
PERF_ATTEMPTS = 4  # perf's attempts at recording a running process (`perf_record`)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def users_step(batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A user's own Python step (it returns the batch as it is): opening a transform, it leaves outcore's crop after it
    to run on each piece of the batch, as the transform's step, not fused with the batch's making."""
    return batch


DEPTH = Targets(pictures=("depth",))  # depth-own's paired pictures
CASES = {  # name: (store, transform)
    "pixels": ("pixels", None),
    "pixels-each": ("pixels", None),  # ds.batches made anew each epoch
    "pixels+flip": ("pixels", RandomFlip()),
    "pixels+crop": ("pixels", Compose([RandomCrop(112), RandomFlip()])),
    "pixels+crop+norm": ("pixels", Compose([RandomCrop(112), RandomFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)])),
    "pixels+rrc": ("pixels", Compose([RandomResizedCrop(112), RandomFlip()])),
    "pixels+then-rrc": ("pixels", Compose([users_step, RandomResizedCrop(112), RandomFlip()])),
    "pixels+crop+bc": ("pixels", Compose([RandomCrop(112), RandomFlip(), BrightnessContrast()])),
    "pixels+crop+half": ("pixels", Compose([RandomCrop(112), RandomFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD),
                                            Cast("float16")])),
    "pixels+crop+norm16": ("pixels", Compose([RandomCrop(112), RandomFlip(),
                                              Normalize(IMAGENET_MEAN, IMAGENET_STD, dtype="float16")])),
    "pixels+crop-torch": ("pixels", Compose([RandomCrop(112), RandomFlip()])),
    "pixels+center": ("pixels", CenterCrop(112)),
    "pixels+jitter": ("pixels", Compose([ScaleJitter(112, scale=(0.5, 1.5)), RandomFlip()])),
    "pixels16+rrc": ("pixels16", Compose([RandomResizedCrop(112), RandomFlip()])),
    "encoded": ("encoded", None),
    "encoded+flip": ("encoded", RandomFlip()),
    "encoded+crop": ("encoded", Compose([RandomCrop(112), RandomFlip()])),
    "encoded+jitter": ("encoded", Compose([ScaleJitter(112, scale=(0.5, 1.5)), RandomFlip()])),
    "encoded+crop-torch": ("encoded", Compose([RandomCrop(112), RandomFlip()])),
    "png": ("png", None),
    "png+crop": ("png", Compose([RandomCrop(112), RandomFlip()])),
    "palette": ("palette", None),
    "depth16": ("depth16", None),
    "rrc": ("own-size", Compose([RandomResizedCrop(224), RandomFlip()])),
    "rrc+norm": ("own-size", Compose([RandomResizedCrop(224), RandomFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)])),
    "cifar": ("cifar", Compose([RandomCrop(32, padding=4), RandomFlip(), Normalize(CIFAR_MEAN, CIFAR_STD)])),
    "dense": ("coco", Compose([RandomResizedCrop(224, targets=TARGETS), RandomFlip(targets=TARGETS)])),
    "dense-own": ("coco-own", Compose([RandomResizedCrop(224, targets=TARGETS), RandomFlip(targets=TARGETS)])),
    "dense-bc": ("coco", Compose([BrightnessContrast(), RandomResizedCrop(224, targets=TARGETS),
                                  RandomFlip(targets=TARGETS)])),
    "depth-own": ("depth-own", Compose([RandomResizedCrop(112, targets=DEPTH), RandomFlip(targets=DEPTH)])),
    "ingest": ("own-size-jpegs", None),  # ingest_images of the JPEGs at their own sizes (shape=None, encoded)
    "ingest-png": ("photos-png", None),  # the same of the PNGs of the png store
    "ingest-depth": ("photos", None),  # ingest_dataframe of the photos' JPEGs, each with its depth map (`depth_maps`)
    "ingest-masks": ("photos", None),  # the same, each with its label map (`label_maps`)
    "ingest-masks12": ("photos", None),  # the same, label maps of 12 classes (4-bit palettes)
    "exif": ("exif", None),  # encoded, of the photos with a camera's or a phone's EXIF (`exif_photos`)
    "exif+crop": ("exif", Compose([RandomCrop(112), RandomFlip()])),
    "ingest-exif": ("photos-exif", None),  # ingest_images of those files
    "ingest-pixels": ("photos", None),  # ingest_images of the photos' JPEGs as pixels, cut to 96x96
    "ingest-pixels-exif": ("photos-exif", None),  # the same of the EXIF photos
    "ingest-pixels-own": ("own-size-jpegs", None),  # the ImageNet-like JPEGs as pixels, cut to 224x224
    "ingest-pixels-png": ("photos-png", None),  # the PNGs of png as pixels, cut to 96x96
    "grey": ("grey", None),  # encoded, greyscale JPEGs in a store of RGB pictures
    "weighed": ("weighed", None),  # encoded, the colour JPEGs in a store of grey pictures
}
NAME_WIDTH = max(map(len, CASES))  # of the tables' first column
DENSE_FIELDS = ["images", "masks", "boxes", "labels", "keypoints"]
FIELDS = {"dense": DENSE_FIELDS, "dense-own": DENSE_FIELDS, "dense-bc": DENSE_FIELDS,  # the others: images, labels
          "depth-own": ["images", "depth"], "depth16": ["images"]}
NEW_EACH_EPOCH = {"pixels-each"}
THROUGH_TORCH = {"pixels+crop-torch", "encoded+crop-torch"}  # ds.torch without DataLoader workers
# The stage of a py-spy frame: the first of these found in its file's path, innermost frame first.
STAGES = (
    ("ingest: survey, write", ("outcore/ingest/",)),
    ("read + decompress", ("outcore/storage/",)),
    ("copies, windows", ("outcore/imaging/windows.py",)),
    ("targets", ("outcore/imaging/targets.py", "outcore/iterate/targets.py")),
    ("JPEG decode", ("outcore/imaging/decode.py", "outcore/imaging/encoded.py")),
    ("crop, resize", ("outcore/imaging/",)),
    ("transforms", ("outcore/iterate/transforms.py",)),
    ("batch assembly", ("outcore/iterate/batch.py", "outcore/iterate/gather.py")),
    ("plan + schedule", ("outcore/iterate/plan.py", "outcore/iterate/stream.py", "outcore/iterate/schedule.py")),
    ("threads + queues", ("outcore/iterate/runs.py", "outcore/iterate/iterator.py", "outcore/threads/",
                          "concurrent/futures", "threading.py", "queue.py", "dask/")),
    ("consumer", ("cores.py",)),
)


def stores(workdir: Path, images: int, needed: set[str]) -> dict[str, Path]:
    """The stores (and folders) named in ``needed``, each built once."""
    from imagenet import write_folder

    photos, own_size, pngs = workdir / "photos", workdir / "own-size-jpegs", workdir / "photos-png"
    needed = needed | ({"pixels"} if "pixels16" in needed else set())  # made from the pixel store
    palettes, turned, greys = workdir / "photos-palette", workdir / "photos-exif", workdir / "photos-grey"
    for folder, extension, stores_of_it in ((photos, ".jpg", {"pixels", "encoded", "depth-own", "photos", "palette",
                                                               "depth16", "exif", "photos-exif", "grey", "weighed"}),
                                            (pngs, ".png", {"png", "photos-png"})):
        if not folder.exists() and needed & stores_of_it:
            write_image_folder(folder, images // 4, classes=("a", "b", "c", "d"), size=(128, 128), kind="photos",
                               extension=extension, seed=0)
    for name, folder, suffix, made_of in (("palette", palettes, ".png",
                                           lambda image: image.convert("P", palette=Image.Palette.ADAPTIVE)),
                                          ("grey", greys, ".jpg", lambda image: image.convert("L"))):
        if name in needed and not folder.exists():
            for path in sorted(photos.rglob("*.jpg")):
                (folder / path.parent.name).mkdir(parents=True, exist_ok=True)
                with Image.open(path) as image:
                    made_of(image).save(folder / path.parent.name / f"{path.stem}{suffix}")
    if needed & {"exif", "photos-exif"}:
        exif_photos(photos, turned)
    if needed & {"own-size", "own-size-jpegs"}:
        write_folder(own_size, max(BATCH * 4, images // 6))
    made = {"own-size-jpegs": own_size, "photos-png": pngs, "photos": photos, "coco": workdir / "coco.zarr",
            "coco-own": workdir / "coco-own.zarr", "photos-exif": turned}
    for name, shape in (("coco", (240, 320, 3)), ("coco-own", None)):  # maps fitted, or rasters at the pictures' size
        if name in needed and not made[name].exists():
            annotations = make_set(workdir / "dense", images // 6)
            outcore.ingest_coco(annotations, made[name], root=workdir / "dense", shape=shape, images="encoded",
                                progress=False)
    for name, source, options in (("pixels", photos, {"shape": (128, 128, 3), "images": "pixels"}),
                                  ("encoded", photos, {"shape": (128, 128, 3), "images": "encoded"}),
                                  ("png", pngs, {"shape": (128, 128, 3), "images": "encoded"}),
                                  ("palette", palettes, {"shape": (128, 128, 3), "images": "encoded"}),
                                  ("exif", turned, {"shape": (128, 128, 3), "images": "encoded"}),
                                  ("grey", greys, {"shape": (128, 128, 3), "images": "encoded"}),
                                  ("weighed", photos, {"shape": (128, 128, 1), "images": "encoded"}),
                                  ("own-size", own_size, {"shape": None, "images": "encoded"})):
        made[name] = location = workdir / f"{name}.zarr"
        if name in needed and not location.exists():
            outcore.ingest_images(source, location, progress=False, **options)
    made["depth-own"] = location = workdir / "depth-own.zarr"
    if "depth-own" in needed and not location.exists():
        outcore.ingest_dataframe(depth_maps(photos, workdir / "depth"), location, root=workdir, pair_columns=["depth"],
                                 shape=None, images="encoded", progress=False)
    made["depth16"] = location = workdir / "depth16.zarr"
    if "depth16" in needed and not location.exists():  # the depth maps as they are, in a uint16 field
        depth_maps(photos, workdir / "depth")
        outcore.ingest_images(workdir / "depth", location, shape=(128, 128, 1), dtype="uint16", images="encoded",
                              progress=False)
    made["cifar"] = location = workdir / "cifar.zarr"
    if "cifar" in needed and not location.exists():  # CIFAR's shapes: 50,000 pictures of 32x32 (random pixels)
        rng = np.random.default_rng(0)
        outcore.from_arrays({"images": rng.integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8),
                             "labels": rng.integers(0, 10, 50_000)}, location, progress=False)
    made["pixels16"] = location = workdir / "pixels16.zarr"
    if "pixels16" in needed and not location.exists():  # the pixel store's photos in 16 bits: each level x 257
        pixels = outcore.open_dataset(made["pixels"])
        outcore.from_arrays({"images": np.asarray(pixels["images"][:]).astype(np.uint16) * 257,
                             "labels": np.asarray(pixels["labels"][:])}, location, progress=False)
    return made


def exif_photos(photos: Path, folder: Path) -> None:
    """Copies of ``photos``' JPEGs in ``folder`` (once), each with an EXIF block inserted as a camera or phone writes one
    (make, model, orientation; the pixels as they were): orientation 1, 6, 8, 3 in turn (upright, turned a quarter
    clockwise or counter-clockwise, upside down: a phone held so), so every square photo decodes to its size."""
    if folder.exists():
        return
    for k, path in enumerate(sorted(photos.rglob("*.jpg"))):
        exif = Image.Exif()
        exif[0x010F], exif[0x0110], exif[0x0112] = "outcore", "benchmark", (1, 6, 8, 3)[k % 4]
        block = exif.tobytes()  # "Exif\0\0" and the TIFF header and directory: an APP1 segment's body
        data = path.read_bytes()
        target = folder / path.relative_to(photos)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data[:2] + b"\xff\xe1" + (len(block) + 2).to_bytes(2, "big") + block + data[2:])


def depth_maps(photos: Path, folder: Path) -> object:
    """A DataFrame of ``photos``' JPEGs (``path``, relative to their folder's parent) and, in ``depth``, a 16-bit PNG
    of each (its luminance times 257, as a depth camera's map of the scene), written once into ``folder``."""
    return _layers(photos, folder, "depth", lambda grey: Image.fromarray(grey.astype(np.uint16) * 257))


def label_maps(photos: Path, folder: Path, classes: int = 21) -> object:
    """`depth_maps`, the column ``mask`` holding a label map of each photo: a palette PNG of ``classes`` classes (its
    luminance in as many bands) and 255 (void) on a border 4 pixels wide, as Pascal VOC's; of 16 classes or fewer, no
    void and a palette of as many colours, which Pillow saves in fewer bits (1, 2 or 4)."""
    few = classes <= 16

    def mask(grey: np.ndarray) -> Image.Image:
        ids = (grey.astype(np.uint16) * classes // 256).astype(np.uint8)
        if not few:
            ids[:4], ids[-4:], ids[:, :4], ids[:, -4:] = 255, 255, 255, 255
        image = Image.fromarray(ids, mode="P")
        image.putpalette(np.random.default_rng(0).integers(0, 256, 3 * classes if few else 768, dtype=np.uint8).tolist())
        return image

    return _layers(photos, folder, "mask", mask)


def _layers(photos: Path, folder: Path, column: str, made: Callable[[np.ndarray], Image.Image]) -> object:
    """A DataFrame of ``photos``' JPEGs (``path``, relative to their folder's parent) and, in ``column``, a PNG of each
    made by ``made`` of its luminance, written once into ``folder``."""
    import pandas as pd

    entries = []
    for k, path in enumerate(sorted(photos.rglob("*.jpg"))):
        layer = folder / f"{k}.png"
        if not layer.exists():
            folder.mkdir(parents=True, exist_ok=True)
            made(np.asarray(Image.open(path).convert("L"))).save(layer)
        entries.append({"path": str(path.relative_to(folder.parent)), column: str(layer.relative_to(folder.parent))})
    return pd.DataFrame(entries)


def epochs(location: Path, case: str, threads: int, seconds: float, ready: bool = False,
           processes: int = 0, gate: bool = False) -> tuple[float, float | None, dict[str, float] | None]:
    """The median samples/s of the epochs run in ``seconds`` (at least 2; the first is not counted), the GIL
    share timed over them (None without outcore's C extensions) and its parts by thread (`held_by_thread`); with
    ``ready``, says so on stdout after the first (for the profiler) and runs until killed; with ``gate``, says
    so after the first and waits for a line on stdin before the ``seconds`` begin (`apart`); with ``processes``, the
    batches are made by that many loader processes (``process=``), and the by-thread parts are the consumer's CPU
    time a batch (``consumer_ms``). For ``ingest``, each epoch is an ingest of the folder ``location`` into a new
    store."""
    if AS_CPUS:
        as_cpus(AS_CPUS)
    outcore.set_threads(threads)
    if ready:  # py-spy takes a share of the cores while it samples: keep every thread busy, as unprofiled
        Gauge.LOW = 0.0
    if case.startswith("ingest"):
        return (*ingests(location, seconds, ready, gate, layers=case.removeprefix("ingest-")), None)
    ds = outcore.open_dataset(location)

    def made() -> Iterable[dict]:
        options = {"shuffle": True, "fields": FIELDS.get(case, ["images", "labels"]), "transform": CASES[case][1]}
        if processes:
            options["process"] = processes
        return ds.torch(BATCH, **options) if case in THROUGH_TORCH else ds.batches(BATCH, **options)

    batches = made()
    if ready:  # `releases` asks how many batches were taken so far (SIGUSR1): a line on stdout
        signal.signal(signal.SIGUSR1, lambda *_: print(f"taken {TAKEN[0]}", flush=True))
    rates, began, epoch, taken = [], time.perf_counter(), 0, 0
    while ready or len(rates) < 2 or time.perf_counter() - began < seconds:
        start, count = time.perf_counter(), 0
        if case in NEW_EACH_EPOCH and epoch:
            batches = made()
            batches.set_epoch(epoch)
        for batch in batches:  # each pass the next epoch, as in training
            count += len(batch["images"])
            taken += 1
            TAKEN[0] += 1
        if epoch:
            rates.append(count / (time.perf_counter() - start))
        else:
            taken = 0
            if gate:  # the copies run side by side: each timed once all of them have made their first epoch
                print("ready", flush=True)
                sys.stdin.readline()
                began = time.perf_counter()
            free, cpu, clocks = gil_free_clock(), time.process_time(), thread_clocks()
            loaders = loader_seconds(batches)
            if ready:
                print("ready", flush=True)
        epoch += 1
    if processes:
        return float(np.median(rates)), None, {"consumer_ms": (time.process_time() - cpu) / taken * 1e3,
                                               "loaders_ms": (loader_seconds(batches) - loaders) / taken * 1e3}
    return float(np.median(rates)), held_share(free, cpu), held_by_thread(free, cpu, clocks)


def as_cpus(count: int) -> None:
    """Make and gauge outcore's pool as on ``count`` CPUs (``--as-cpus``): as many busy threads at most, a limit
    that never falls (it would here, where fewer cores make its threads wait)."""
    outcore.threads.available_cpus = lambda: count
    Gauge.LOW = 0.0


def loader_seconds(batches: object) -> float:
    """The CPU time the loader processes of ``batches`` (``process=``: a `BatchIterator`'s, or a torch loader's
    dataset's) have used so far; 0 without."""
    loader = getattr(getattr(batches, "dataset", batches), "_process", None)
    members = getattr(loader, "members", [loader] if loader is not None else [])
    return sum(cpu_seconds(member.process.pid) for member in members if member.process is not None)


def held_share(free: Callable[[], float] | None, cpu: float) -> float | None:
    """The share of the CPU time since ``cpu`` (`time.process_time`) not counted by ``free`` (`gil_free_clock`)."""
    used = time.process_time() - cpu
    return None if free is None or used <= 0 else max(0.0, 1 - free() / used)


def thread_clocks() -> dict[str, float]:
    """The CPU seconds so far of this thread (the consumer's) and its part in outcore's C calls outside the GIL (a C
    run's `take`), of the pool's threads (``outcore-pool-N``) and of the C runs' engines' threads
    (`outcore.iterate.native_run`: counted by the extension, as they come and go)."""
    pool = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("outcore-pool") and thread.ident is not None:
            with contextlib.suppress(OSError):  # it ended meanwhile
                pool += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    chunks = chunk_reads.extension()
    engines = chunks.engine_seconds() if chunks is not None and hasattr(chunks, "engine_seconds") else 0.0
    return {"consumer": time.thread_time(), "consumer_free": thread_free(), "pool": pool, "engines": engines}


def thread_free() -> float:
    """This thread's CPU seconds in outcore's C calls outside the GIL (`outcore.measure.thread_free_seconds`; 0 with
    an outcore that does not tell them: ``--against`` an older checkout, whose consumer calls none)."""
    told = getattr(measure, "thread_free_seconds", None)
    return 0.0 if told is None else told()


def held_by_thread(free: Callable[[], float] | None, cpu: float, clocks: dict[str, float]) -> dict[str, float] | None:
    """The GIL share timed since ``cpu`` (`held_share`) in its parts, each a share of the process's CPU time: the
    consumer's thread outside outcore's GIL-free C (it takes the batches: a C run's waits are such a call), the
    pool's threads outside those C calls (outcore's C calls run there, and on C runs' engines' threads, which never
    hold the GIL) and the others (the thread that plans a run's batches and hands them over, one a run, and any
    thread of another library). None where nothing is counted."""
    used, now = time.process_time() - cpu, thread_clocks()
    if free is None or used <= 0:
        return None
    consumer, consumer_free, pool, engines = (now[name] - clocks[name]
                                              for name in ("consumer", "consumer_free", "pool", "engines"))
    parts = {"consumer": consumer - consumer_free, "pool": max(0.0, pool - (free() - engines - consumer_free)),
             "others": max(0.0, used - consumer - pool - engines)}
    return {name: seconds / used for name, seconds in parts.items()}


def ingests(folder: Path, seconds: float, ready: bool, gate: bool = False,
            layers: str = "") -> tuple[float, float | None]:
    """`epochs` of ``outcore.ingest_images(folder, shape=None, images="encoded")`` (with ``layers`` ``"pixels"``,
    ``"pixels-exif"`` or ``"pixels-png"``, ``shape=(96, 96, 3), images="pixels"``: each file decoded and cut, ``"pixels-own"`` to
    ``(224, 224, 3)``; with ``"depth"``,
    ``"masks"`` or ``"masks12"``, of ``outcore.ingest_dataframe`` of the folder's JPEGs and their `depth_maps`,
    ``pair_columns``, or `label_maps` (of 12 classes), ``mask_columns``): files/s (pictures), and no GIL share: its compression and digests run outside
    the GIL in numcodecs' and hashlib's C, which `gil_free_clock` does not count, so the rest would be no bound of
    the time holding it (py-spy's ``gil`` rows measure ingest)."""
    pixels = layers.startswith("pixels")
    made = {"depth": (depth_maps, "depth", "pair_columns"), "masks": (label_maps, "masks", "mask_columns"),
            "masks12": (lambda photos, to: label_maps(photos, to, classes=12), "masks12", "mask_columns")}.get(layers)
    frame = made[0](folder, folder.parent / made[1]) if made else None
    with tempfile.TemporaryDirectory() as scratch:
        rates, began, runs = [], time.perf_counter(), 0
        while ready or len(rates) < 2 or time.perf_counter() - began < seconds:
            start = time.perf_counter()
            options = {"shape": ((224, 224, 3) if layers == "pixels-own" else (96, 96, 3)) if pixels else None, "images": "pixels" if pixels else "encoded",
                       "overwrite": True, "progress": False}
            if made:
                ds = outcore.ingest_dataframe(frame, Path(scratch) / "ingested.zarr", root=folder.parent,
                                              **{made[2]: [frame.columns[1]]}, **options)
            else:
                ds = outcore.ingest_images(folder, Path(scratch) / "ingested.zarr", **options)
            if runs:
                rates.append(len(ds) / (time.perf_counter() - start))
            elif ready or gate:
                print("ready", flush=True)
                if gate:
                    sys.stdin.readline()
                    began = time.perf_counter()
            runs += 1
    return float(np.median(rates)), None


def scaling(made: dict[str, Path], cases: list[str], threads: list[int], seconds: float) -> dict[str, dict[int, float]]:
    """The scaling table, each case's row printed once it is measured (a run cut short keeps the rows it has)."""
    pretend = f", the pool made and gauged as on {AS_CPUS} CPUs (--as-cpus: its rates say nothing)" if AS_CPUS else ""
    print(f"\nsamples/s of ds.batches({BATCH}, shuffle=True), images + labels (ingest: files/s), {os.cpu_count()} "
          f"cores here{pretend} (the ratio: to n x the 1-thread rate; GIL: the share of the CPU time outside outcore's "
          "C calls that release it, timed; 16 cores: the most times one core's rate that share allows there, at "
          f"{threads[-1]} threads)")
    print(f"{'case':{NAME_WIDTH}s}" + "".join(f" {f'{n} thread' + 's' * (n > 1):>11s} {'ratio':>6s} {'GIL':>6s}" for n in threads)
          + f" {'16 cores':>9s}", flush=True)
    rates: dict[str, dict[int, float]] = {}
    parts: dict[str, dict[str, float]] = {}
    for case in cases:
        measured = {n: in_a_process(made, case, n, seconds) for n in threads}
        rates[case] = {n: rate for n, (rate, _, _) in measured.items()}
        one = rates[case].get(1)
        cells = "".join(f" {rate:11.0f} {rate / (n * one) if one else float('nan'):6.2f} {percent(share):>6s}"
                        for n, (rate, share, _) in measured.items())
        _, last, by_thread = measured[threads[-1]]
        print(f"{case:{NAME_WIDTH}s}{cells} {'-' if last is None else f'{gil_bound(last, 16):.1f}x':>9s}", flush=True)
        if by_thread is not None:
            parts[case] = by_thread
    if parts:
        print(f"\nthe GIL share at {threads[-1]} thread{'s' * (threads[-1] > 1)} by thread, each a share of all the CPU time: the consumer's "
              "(taking the batches), the pool's outside outcore's C calls (reads, batches, their runs), and the "
              "others' (each run's thread planning its batches and handing them over)")
        print(f"{'case':{NAME_WIDTH}s} {'consumer':>9s} {'pool':>7s} {'others':>7s}")
        for case, by_thread in parts.items():
            print(f"{case:{NAME_WIDTH}s} {by_thread['consumer']:9.1%} {by_thread['pool']:7.1%} {by_thread['others']:7.1%}")
    return rates


def apart(made: dict[str, Path], cases: list[str], counts: list[int], seconds: float,
          threads: dict[str, dict[int, float]]) -> None:
    """The apart table: for each count n, n copies of each case side by side, each in a process of its own on one
    thread (`side_by_side`), against n times one copy's rate, and the case's n threads (``threads``, the scaling
    table's rates, where it ran) against the copies."""
    print(f"\nsamples/s of n copies of each case side by side, each in a process of its own on one thread, {os.cpu_count()} "
          "cores here: what the machine gives n copies of the one-thread work that share nothing but its cores, "
          "caches and memory (the ratio: to n x one copy's rate; threads: n threads of one process, the scaling "
          "table's, as a share of the copies' rate)")
    print(f"{'case':{NAME_WIDTH}s}" + "".join(f" {f'{n} apart':>10s} {'ratio':>6s} {'threads':>8s}" for n in counts), flush=True)
    for case in cases:
        one = side_by_side(made, case, 1, seconds)
        row = f"{case:{NAME_WIDTH}s}"
        for n in counts:
            rate = one if n == 1 else side_by_side(made, case, n, seconds)
            of_threads = threads.get(case, {}).get(n)
            row += f" {rate:10.0f} {rate / (n * one):6.2f} {'-' if of_threads is None else f'{of_threads / rate:.2f}':>8s}"
        print(row, flush=True)


def side_by_side(made: dict[str, Path], case: str, count: int, seconds: float) -> float:
    """The samples/s of ``count`` copies of ``case``, each `epochs` on one thread in a process of its own, all timed
    together: each starts its ``seconds`` once every copy has made its first epoch (imports, reads, the page cache)."""
    command = [sys.executable, __file__, "--run", case, str(made[CASES[case][0]]), "1", str(seconds), "--gate"]
    copies = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    try:
        for copy in copies:
            assert copy.stdout is not None and copy.stdout.readline().strip() == "ready", f"a copy of {case} failed"
        for copy in copies:
            assert copy.stdin is not None
            copy.stdin.write("go\n")
            copy.stdin.flush()
        return sum(float(json.loads(copy.communicate()[0].strip().splitlines()[-1])["samples_s"]) for copy in copies)
    finally:
        for copy in copies:
            copy.kill()
            copy.wait()


def by_processes(made: dict[str, Path], cases: list[str], threads: int, counts: list[int], seconds: float) -> None:
    """The processes table: each case's epochs made here on ``threads`` threads, then by each count of loader
    processes, each measurement in a fresh process."""
    print(f"\nsamples/s of ds.batches({BATCH}, shuffle=True), images + labels, made in this process on {threads} threads "
          f"or by k loader processes (process=k), each on {threads}/k of them, {os.cpu_count()} cores here (the ratio: "
          "to this process's threads; consumer: its CPU time a batch taking them; loaders: the loader processes' CPU "
          "time a batch, all of them)")
    print(f"{'case':{NAME_WIDTH}s} {'here':>9s}" + "".join(f" {f'process={k}':>11s} {'ratio':>6s} {'consumer':>9s} {'loaders':>9s}"
                                                 for k in counts))
    for case in cases:
        here = in_a_process(made, case, threads, seconds)[0]
        row = f"{case:{NAME_WIDTH}s} {here:9.0f}"
        for k in counts:
            result = child("--run", case, made[CASES[case][0]], threads, seconds, "--run-processes", k)
            times = result["by_thread"]
            row += (f" {result['samples_s']:11.0f} {result['samples_s'] / here:6.2f} {times['consumer_ms']:6.2f} ms "
                    f"{times['loaders_ms']:6.2f} ms")
        print(row, flush=True)


def part_shares(made: dict[str, Path], cases: list[str], counts: list[int], seconds: float) -> None:
    """The parts table, each case in a fresh process (`held_by_part`)."""
    print("\nthe GIL-held time of part 0 of each batch out of k (process=k's part for one of its processes), made on "
          "one thread, against a whole batch's: ms a part, and the ratio")
    print(f"{'case':{NAME_WIDTH}s} {'whole':>9s}" + "".join(f" {f'part of {k}':>11s} {'ratio':>6s}" for k in counts if k > 1))
    for case in cases:
        held = child("--parts-run", case, made[CASES[case][0]], seconds, ",".join(map(str, counts)))
        whole = held["1"]
        print(f"{case:{NAME_WIDTH}s} {whole:6.3f} ms" + "".join(f" {held[str(k)]:8.3f} ms {held[str(k)] / whole:6.2f}"
                                                   for k in counts if k > 1), flush=True)


def held_by_part(location: Path, case: str, seconds: float, counts: list[int]) -> dict[str, float]:
    """For each k of ``counts`` (and 1, the whole), the median GIL-held ms of part 0 of a batch out of k, epoch after
    epoch on one thread for about ``seconds`` each (3 epochs at least, the first not counted)."""
    if gil_free_clock() is None:
        raise SystemExit("parts: the GIL-held time is timed by outcore's C extensions, which do not load here "
                         "(OUTCORE_NATIVE=0, or not built): build them (pip install -e .)")
    outcore.set_threads(1)
    ds = outcore.open_dataset(location)
    iterator = ds.batches(BATCH, shuffle=True, fields=FIELDS.get(case, ["images", "labels"]),
                          transform=CASES[case][1])
    held = {}
    for k in sorted({1, *counts}):
        times, began, epoch = [], time.perf_counter(), 0
        while epoch < 3 or time.perf_counter() - began < seconds:
            plan = iterator.plan(epoch, (0, k))
            run = iterator.run(epoch, plan.with_samples(range(len(iterator))), (0, k), lambda step: plain)
            clock, cpu = gil_free_clock(), time.process_time()
            parts = sum(1 for _ in run)
            run.close()
            if epoch:
                times.append((time.process_time() - cpu - clock()) / parts * 1e3)
            epoch += 1
        held[str(k)] = float(np.median(times))
    return held


def percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def child(*arguments: object, script: str = __file__) -> dict:
    """``script`` (this one: ``--run``, ``--torch-run``, ``--feed-run``) run in a fresh process with ``arguments``:
    the JSON object its last line prints."""
    done = subprocess.run([sys.executable, script, *map(str, arguments)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def in_a_process(made: dict[str, Path], case: str, threads: int,
                 seconds: float) -> tuple[float, float | None, dict[str, float] | None]:
    """`epochs` in a fresh process (each measurement starts with the same memory and threads)."""
    result = child("--run", case, made[CASES[case][0]], threads, seconds, "--as-cpus", AS_CPUS)
    return float(result["samples_s"]), result["gil_share"], result["by_thread"]


def profile(made: dict[str, Path], case: str, threads: int,
            seconds: float) -> tuple[Counter, Counter, float, Counter]:
    """(CPU samples, GIL samples) per stage of a process running ``case`` at ``threads`` threads, the CPU
    seconds it used while its GIL was sampled (from /proc: py-spy's samples of running threads are an estimate),
    and the GIL samples per function (`functions`)."""
    process = subprocess.Popen([sys.executable, __file__, "--run", case, str(made[CASES[case][0]]), str(threads),
                                str(seconds), "--ready", "--as-cpus", str(AS_CPUS)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        samples, used, held = [], 0.0, Counter()
        for gil in (False, True):
            out = Path(f"/tmp/outcore-cores-{os.getpid()}-{int(gil)}.txt")
            before = cpu_seconds(process.pid)
            subprocess.run(["py-spy", "record", "--pid", str(process.pid), "--duration", str(int(seconds)), "--rate",
                            str(RATE), "--nonblocking", "--format", "raw", "--output", str(out), *(["--gil"] * gil)],
                           check=True, capture_output=True)
            used = cpu_seconds(process.pid) - before
            raw = out.read_text()
            samples.append(stages(raw))
            held = functions(raw) if gil else held
            out.unlink()
        return samples[0], samples[1], used, held
    finally:
        process.kill()
        process.wait()


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` has used, all its threads, user and system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stacks(raw: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw output (``frame;frame;... count`` per line, outermost frame first): each stack's frames and count.
    Lines are split at newlines alone (a frame py-spy read while it changed may hold other line breaks), and a line
    not ending in a count is skipped."""
    for line in raw.split("\n"):
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            yield stack.split(";"), int(count)


def stages(raw: str) -> Counter:
    """py-spy's raw output counted per stage."""
    counted: Counter = Counter()
    for frames, count in stacks(raw):
        counted[stage(frames)] += count
    return counted


def functions(raw: str) -> Counter:
    """py-spy's raw output counted per function: the innermost outcore frame's (``name (file)``, any line), else
    the innermost frame's."""
    counted: Counter = Counter()
    for stack, count in stacks(raw):
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack]
        ours = [frame for frame in frames if "outcore/" in frame]
        counted[(ours or frames)[-1]] += count
    return counted


def stage(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, paths in STAGES:
            if any(path in frame for path in paths):
                return name
    return "other"


def gil(made: dict[str, Path], cases: list[str], threads: int, seconds: float,
        rates: dict[str, dict[int, float]]) -> None:
    if shutil.which("py-spy") is None:
        print("\npy-spy is not installed (pip install py-spy): no GIL shares")
        return
    print(f"\nwhere the time goes at {threads} threads: each stage's share of the CPU time (py-spy's samples of "
          "running threads), and its time holding the GIL as a share of all the CPU time (the GIL share)")
    for case in cases:
        cpu, held, used, holders = profile(made, case, threads, seconds)
        total_cpu, total_held = sum(cpu.values()), sum(held.values())
        share = total_held / RATE / used
        measured = (f"; measured here {rates[case][threads] / rates[case][1]:.2f}x at {threads} threads, "
                    f"{gil_bound(share, threads):.2f}x allowed" if {1, threads} <= set(rates.get(case, {})) else "")
        print(f"\n{case}: {used / seconds:.2f} cores busy, GIL share {share:.1%}: at most "
              f"{gil_bound(share, 16):.1f}x one core's rate on 16 cores{measured}")
        print(f"  {'stage':20s} {'CPU':>6s} {'GIL':>6s}")
        for name in sorted(set(cpu) | set(held), key=lambda name: -cpu[name]):
            print(f"  {name:20s} {cpu[name] / total_cpu:6.1%} {held[name] / RATE / used:6.1%}")
        print(f"  the functions holding the GIL most (share of the GIL samples, {total_held} in all):")
        for name, count in holders.most_common(FUNCTIONS):
            print(f"    {count / max(1, total_held):6.1%}  {name}")


def releases(made: dict[str, Path], cases: list[str], threads: int, seconds: float) -> None:
    """``--only releases``: per batch, the times each C function gave the GIL up (`module docstring`)."""
    event, added = release_probe()
    if event is None:
        print(f"\nno GIL releases counted: {added}")
        return
    pretend = f" as on {AS_CPUS} CPUs" if AS_CPUS else ""
    print(f"\nthe GIL given up, per batch, at {threads} threads{pretend} "
          f"(perf's count of PyEval_SaveThread calls, each put to the C function that made it; with numpy's, the "
          "call that led there)")
    try:
        for case in cases:
            counted, batches = count_releases(made, case, threads, seconds, event)
            total = sum(counted.values())
            print(f"\n{case}: {total / max(1, batches):.2f} a batch ({batches} batches)")
            for name, count in counted.most_common(RELEASERS):
                print(f"  {count / max(1, batches):6.2f}  {name}")
    finally:
        if added:
            subprocess.run(["perf", "probe", "-q", "-d", event], check=False, capture_output=True)


def release_probe() -> tuple[str | None, str | bool]:
    """The perf event of CPython's ``PyEval_SaveThread`` (a uprobe on the library holding it) and whether it was
    added here (to be deleted after), or None and why not."""
    if shutil.which("perf") is None:
        return None, "perf is not installed"
    library = Path(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or "")
    holder = str(library) if sysconfig.get_config_var("Py_ENABLE_SHARED") and library.is_file() else sys.executable
    added = subprocess.run(["perf", "probe", "-x", holder, "-a", "PyEval_SaveThread"], check=False, capture_output=True,
                           text=True)
    found = re.search(r"(\S+:PyEval_SaveThread)", added.stdout + added.stderr)
    if added.returncode == 0 and found:
        return found.group(1), True
    listed = subprocess.run(["perf", "probe", "-l"], check=False, capture_output=True, text=True).stdout
    found = re.search(r"(\S+:PyEval_SaveThread)", listed)  # added before
    return (found.group(1), False) if found else (None, f"perf probe failed: {added.stderr.strip()[-200:]}")


def count_releases(made: dict[str, Path], case: str, threads: int, seconds: float, event: str) -> tuple[Counter, int]:
    """The GIL releases of a process running ``case`` for ``seconds`` by the C function making each, and the batches
    it took meanwhile."""
    process = subprocess.Popen([sys.executable, __file__, "--run", case, str(made[CASES[case][0]]), str(threads),
                                str(seconds), "--ready", "--as-cpus", str(AS_CPUS)], stdout=subprocess.PIPE, text=True)
    out = Path(tempfile.gettempdir(), f"outcore-releases-{os.getpid()}.data")
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"

        def taken() -> int:
            process.send_signal(signal.SIGUSR1)
            return int(process.stdout.readline().split()[1])

        batches = perf_record(process.pid, out, seconds, ["-e", event, "--call-graph", "dwarf,16384"], taken)
        script = subprocess.run(["perf", "script", "-i", str(out)], check=True, capture_output=True, text=True).stdout
        return releasers(script), batches
    finally:
        process.kill()
        process.wait()
        out.unlink(missing_ok=True)


def perf_record(pid: int, out: Path, seconds: float, options: list[str], count: Callable[[], int] = lambda: 0) -> int:
    """``perf record`` of process ``pid`` for ``seconds`` into ``out``, with ``options``, tried up to `PERF_ATTEMPTS`
    times (perf fails now and then when a thread ends as it attaches): how much ``count()`` grew over the attempt
    that succeeded. A `RuntimeError` with perf's words where none did."""
    for _ in range(PERF_ATTEMPTS):
        before = count()
        recorded = subprocess.run(["perf", "record", "-q", *options, "-p", str(pid), "-o", str(out), "--", "sleep",
                                   str(seconds)], check=False, capture_output=True, text=True)
        if recorded.returncode == 0:
            return count() - before
    raise RuntimeError(f"perf record failed {PERF_ATTEMPTS} times (rc={recorded.returncode}): "
                       f"{recorded.stderr.strip()[-300:]}")


PLUMBING = ("_Py", "PyObject_", "PyNumber_", "object_vacall", "method_vectorcall", "cfunction", "do_call_core",
            "binary_op", "slot_tp", "gen_", "thread_run", "pythread", "start_thread", "clone", "[unknown]")


def releasers(script: str) -> Counter:
    """``perf script``'s call stacks of the GIL's releases counted by the C function that made each (the frame
    below PyEval_SaveThread), with the first caller that is not the interpreter's own plumbing for numpy's."""
    counted: Counter = Counter()
    for sample in script.split("\n\n"):
        frames = [line.split(None, 1)[1].split("+")[0].split(" (")[0] for line in sample.strip().splitlines()[1:]
                  if len(line.split(None, 1)) == 2]
        if len(frames) < 2:
            continue
        releaser = frames[1]
        callers = [frame for frame in frames[2:8] if not frame.startswith(PLUMBING) and frame != releaser]
        counted[f"{releaser} < {callers[0]}" if callers and "numpy" not in releaser else releaser] += 1
    return counted


def torch_workers(location: Path, workers: list[int], seconds: float) -> None:
    """``ds.torch`` over ``location`` with the crop + flip and each number of DataLoader workers (kept across
    epochs, as in training): the median samples/s of the epochs after the first, each in a fresh process."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("\nPyTorch is not installed: no ds.torch rows")
        return
    print(f"\nsamples/s of ds.torch({BATCH}, shuffle=True), pixels + crop + flip, {os.cpu_count()} cores here")
    for count in workers:
        rate = child("--torch-run", location, count, seconds)["samples_s"]
        print(f"  {count:2d} DataLoader workers: {rate:9.0f}")


def torch_epochs(location: Path, workers: int, seconds: float) -> float:
    loader = outcore.open_dataset(location).torch(BATCH, shuffle=True, fields=["images", "labels"],
                                                  transform=CASES["pixels+crop"][1], num_workers=workers,
                                                  persistent_workers=workers > 0)
    rates, began = [], time.perf_counter()
    while len(rates) < 3 or time.perf_counter() - began < seconds:
        start, count = time.perf_counter(), 0
        for batch in loader:
            count += len(batch["images"])
        rates.append(count / (time.perf_counter() - start))
    return float(np.median(rates[1:]))


def feed(made: dict[str, Path], cases: list[str], seconds: float, step_ms: float, held: float,
         workers: list[str]) -> None:
    """Does a training loop in the loader's process wait? Each case and number of DataLoader workers in a fresh
    process (`fed`)."""
    print(f"\na training loop's stand-in, {step_ms:g} ms of CPU a step in rounds of {ROUND_US} us, {held:.0%} of each "
          "holding the GIL (Python between kernel launches) and the rest in a C call that releases it (a launch), "
          f"fed by ds.batches({BATCH}, shuffle=True) on outcore's default threads (0 workers) or by ds.torch with "
          f"DataLoader workers (torch: without; process: ds.batches(process=True); processN: process=N), "
          f"{os.cpu_count()} cores here: its "
          "steps/s alone (the ceiling) and fed, the ratio, the share of the time it waits for a batch, its own thread's "
          "CPU time taking one (the hand-off), its process's other threads' CPU time a batch (others: a loader's "
          "in its process, whose GIL the loop shares), and the median wait for an epoch's first batch")
    print(f"{'case':{NAME_WIDTH}s} {'workers':>7s} {'alone':>8s} {'fed':>8s} {'ratio':>6s} {'waiting':>8s} {'hand-off':>9s} "
          f"{'others':>9s} {'epoch start':>11s}")
    for case in cases:
        for count in workers:
            result = child("--feed-run", case, made[CASES[case][0]], seconds, step_ms, held, count)
            print(f"{case:{NAME_WIDTH}s} {count:>7s} {result['alone']:8.1f} {result['fed']:8.1f} "
                  f"{result['fed'] / result['alone']:6.2f} {result['waiting']:8.1%} {result['handoff_ms']:6.2f} ms "
                  f"{result['others_ms']:6.2f} ms {result['epoch_start_ms']:8.2f} ms", flush=True)


ROUND_US = 50  # feed: a round of the stand-in step, about a kernel launch and the Python before it


def fed(location: Path, case: str, seconds: float, step_ms: float, held: float,
        workers: int | str) -> dict[str, float]:
    """Steps/s of the stand-in training step (`stand_in`) alone and taking a batch of ``case`` before each step (one
    iterator, epoch after epoch, as training does: ``ds.batches``, or ``ds.torch`` with ``workers`` DataLoader
    workers, ``"torch"``: without, ``"process"``: ``ds.batches(process=True)``, ``"processN"``: N of them), the share of the time it waited
    for one, its thread's CPU time a batch taking them, and the CPU time a batch of its process's other threads (a
    loader's in it)."""
    step = stand_in(step_ms, held)

    def steps_per_second(before_each: Callable[[], object]) -> tuple[float, list[float], float, float]:
        """Steps/s, each step's wait for its batch, and the CPU time a step of the loop's thread taking it and of
        its process's other threads."""
        waits, taking, began = [], 0.0, time.perf_counter()
        process_cpu, thread_cpu = time.process_time(), time.thread_time()
        while time.perf_counter() - began < seconds:
            asked, cpu = time.perf_counter(), time.thread_time()
            before_each()
            waits.append(time.perf_counter() - asked)
            taking += time.thread_time() - cpu
            step()
        elapsed, steps = time.perf_counter() - began, len(waits)
        others = (time.process_time() - process_cpu) - (time.thread_time() - thread_cpu)  # the process's other threads
        return steps / elapsed, waits, taking / steps, others / steps

    alone, _, _, _ = steps_per_second(lambda: None)
    ds = outcore.open_dataset(location)
    options = {"shuffle": True, "fields": FIELDS.get(case, ["images", "labels"]), "transform": CASES[case][1]}
    if workers == "torch":  # ds.torch without workers
        batches = ds.torch(BATCH, **options)
    elif isinstance(workers, str):  # ds.batches in a process of its own ("process"), or N ("processN")
        batches = ds.batches(BATCH, process=int(workers.removeprefix("process") or 1), **options)
    elif workers:
        batches = ds.torch(BATCH, num_workers=workers, persistent_workers=True, **options)
    else:
        batches = ds.batches(BATCH, **options)

    def forever() -> Iterator[dict[str, np.ndarray]]:
        while True:
            yield from batches

    taken = forever()
    for _ in range(len(batches)):  # a first epoch: the pipeline filled
        next(taken)
    rate, waits, handoff, others = steps_per_second(lambda: next(taken))
    return {"alone": alone, "fed": rate, "waiting": sum(waits) * rate / len(waits), "handoff_ms": handoff * 1e3,
            "others_ms": others * 1e3, "epoch_start_ms": float(np.median(waits[:: len(batches)])) * 1e3}


def stand_in(step_ms: float, held: float) -> Callable[[], None]:
    """A training step's stand-in: rounds of `ROUND_US`, ``held`` of each a Python loop (holding the GIL), the rest
    a hash of a buffer (hashlib releases the GIL for it), calibrated here with nothing else running."""
    data = bytes(1 << 16)

    def fastest(work: Callable[[int], None], count: int) -> float:
        timings = []
        for _ in range(5):
            began = time.perf_counter()
            work(count)
            timings.append(time.perf_counter() - began)
        return min(timings) / count

    def spin(count: int) -> None:
        total = 0
        for i in range(count):
            total += i

    def launch(size: int) -> None:
        hashlib.sha256(memoryview(data)[:size]).digest()

    spins = max(1, round(ROUND_US * 1e-6 * held / fastest(spin, 100_000)))
    size = min(len(data), max(4096, round(ROUND_US * 1e-6 * (1 - held) / fastest(launch, len(data)) * len(data))))
    rounds = max(1, round(step_ms * 1000 / ROUND_US))

    def step() -> None:
        for _ in range(rounds):
            spin(spins)
            launch(size)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--threads", default=f"1,{len(os.sched_getaffinity(0))}")
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/cores"))
    parser.add_argument("--only", default="scaling,gil,torch")
    has_torch = importlib.util.find_spec("torch") is not None
    parser.add_argument("--cases", default=",".join(case for case in CASES if has_torch or case not in THROUGH_TORCH))
    parser.add_argument("--torch-workers", default="0,2", help="DataLoader workers of the torch rows")
    parser.add_argument("--as-cpus", type=int, default=0,
                        help="scaling, gil: outcore's pool made and gauged as on this many CPUs (0: these)")
    parser.add_argument("--gil-threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="the threads of the GIL rows (default: the cores this process may use)")
    parser.add_argument("--run", nargs=4, metavar=("CASE", "STORE", "THREADS", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--ready", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-run", nargs=3, metavar=("STORE", "WORKERS", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--step-ms", type=float, default=5.0,
                        help="feed: the CPU time of a training step (a small ResNet's on an H200: 5 ms)")
    parser.add_argument("--held", type=float, default=0.5, help="feed: the share of it holding the GIL")
    parser.add_argument("--feed-workers", default="0",
                        help="feed: DataLoader workers of its rows (0: ds.batches; torch: ds.torch without workers; "
                        "process: ds.batches(process=True); processN: process=N)")
    parser.add_argument("--processes", default="1,2", help="processes: the loader processes of its columns")
    parser.add_argument("--run-processes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--parts-run", nargs=4, metavar=("CASE", "STORE", "SECONDS", "COUNTS"), help=argparse.SUPPRESS)
    parser.add_argument("--feed-run", nargs=6, metavar=("CASE", "STORE", "SECONDS", "STEP_MS", "HELD", "WORKERS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    global AS_CPUS
    AS_CPUS = args.as_cpus
    if args.torch_run:
        location, workers, seconds = args.torch_run
        print(json.dumps({"samples_s": torch_epochs(Path(location), int(workers), float(seconds))}))
        return
    if args.feed_run:
        case, location, seconds, step_ms, held, workers = args.feed_run
        feeder = workers if workers == "torch" or workers.startswith("process") else int(workers)
        print(json.dumps(fed(Path(location), case, float(seconds), float(step_ms), float(held), feeder)))
        return
    if args.parts_run:
        case, location, seconds, counts = args.parts_run
        print(json.dumps(held_by_part(Path(location), case, float(seconds), [int(k) for k in counts.split(",")])))
        return
    if args.run:
        case, location, threads, seconds = args.run
        rate, share, by_thread = epochs(Path(location), case, int(threads), float(seconds), ready=args.ready,
                                        processes=args.run_processes, gate=args.gate)
        print(json.dumps({"samples_s": rate, "gil_share": share, "by_thread": by_thread}))
        return
    args.workdir.mkdir(parents=True, exist_ok=True)
    cases, threads = args.cases.split(","), [int(n) for n in args.threads.split(",")]
    only = args.only.split(",")
    needed = {CASES[case][0] for case in cases} | ({"pixels"} if "torch" in only else set())
    made = stores(args.workdir, args.images, needed)
    rates = scaling(made, cases, threads, args.seconds) if "scaling" in only else {}
    if "apart" in only:
        apart(made, cases, threads, args.seconds, rates)
    if "gil" in only:
        gil(made, cases, args.gil_threads, args.seconds, rates)
    if "releases" in only:
        releases(made, cases, args.gil_threads, args.seconds)
    processes = [int(k) for k in args.processes.split(",")]
    if "processes" in only:
        by_processes(made, cases, threads[-1], processes, args.seconds)
    if "parts" in only:
        part_shares(made, cases, processes, args.seconds)
    if "feed" in only:
        feed(made, cases, args.seconds, args.step_ms, args.held, args.feed_workers.split(","))
    if "torch" in only:
        torch_workers(made["pixels"], [int(n) for n in args.torch_workers.split(",")], args.seconds)


if __name__ == "__main__":
    main()
