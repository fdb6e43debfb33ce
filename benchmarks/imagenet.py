"""The ImageNet-style workload: full-size JPEGs of varying size, read with RandomResizedCrop(224) and a
horizontal flip (train), or resized to 256 and centre-cropped to 224 (validation), batches of 256.

    python benchmarks/imagenet.py [--images 20000] [--workdir bench-data/imagenet] [--skip-validation]
                                  [--only "own sizes,max_side,Pillow,DALI"]

Writes (once, kept in ``--workdir``) an ImageNet-like folder: ``--images`` JPEGs in 6 class folders,
crops of the photographs scikit-image and scikit-learn ship, short side 300-500 px, aspect 3:4 to 16:9
(a quarter of them portrait), quality 85-95. Then measures one shuffled epoch of each loader, each in a
fresh process, and prints images/s, the ratio to the row's own ceiling (named in the row), the loader
process's peak RSS and whether the epoch held every image exactly once (checked from the indices it
delivered; "-" where a loader cannot say which images it delivered):

- the ceilings: a tight loop on every core this process may use (one process per core, no loader, no
  batching) that reads each file, decodes it with libjpeg-turbo, cuts the box and resizes it to 224, the
  way a loader row does: at full size (Pillow resize: the Pillow DataLoader's ceiling), at the smallest
  DCT scale of 1/8, 1/4, 1/2 and 1 that keeps the box at least 224 (Pillow resize: the ceiling of outcore
  without its C extension and of Pillow's ``draft()``), and, where outcore's C extension is built,
  decoding only the box's rows and columns (the ceiling of outcore's fused path and of DALI's
  ``image_random_crop``), over the folder's files and over each encoded store's files; for validation the
  same loops cut the central box of ``Resize(256)`` + ``CenterCrop(224)``;
- outcore, the ImageNet way: an encoded store of the files as they are (``shape=None``: each picture at
  its own size), read with ``Compose([RandomResizedCrop(224), RandomFlip()])``: the box is drawn from
  each picture's stored size and cut while decoding (DCT-scaled; only the box's rows and columns with the
  C extension, and again with ``OUTCORE_NATIVE=0``, without it); the same store with ``max_side=512``
  (pictures larger re-encoded once at ingest, quality 90), with its own ceiling (the same loop on its
  files);
- outcore with one size chosen at ingest: an encoded store decoded at 256x256 (resize "crop": short side
  256, centre), and a pixel store at 256x256, then the same transform on the 256 picture (not the same
  augmentation: the box is drawn from the 256 picture, not from the original);
- a torchvision-ImageFolder-style DataLoader (Pillow; a worker per core), the box drawn from the original
  as torchvision draws it; the same with Pillow's ``draft()`` (JPEG DCT scaling in Pillow).

- NVIDIA DALI's CPU pipeline when it is installed (``pip install nvidia-dali-cuda120``): its file
  reader (a shuffle buffer of 1,024, not a full shuffle), ``decoders.image_random_crop`` (decodes the
  crop's region), resize, flip; a thread per core.

Validation: the stores of pictures at their own size with ``CenterCrop(224, resize=256)`` (torchvision's
``Resize(256)`` + ``CenterCrop(224)`` as one resize of the central box, cut while decoding), the 256x256
stores with ``CenterCrop(224)`` (their 256 resize-crop is ``Resize(256)`` + ``CenterCrop(256)``), the
Pillow DataLoader with Resize(256) + CenterCrop(224), and DALI's decode, resize and crop. FFCV does not build here (its sdist needs OpenCV and libjpeg-turbo
headers).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import simplejpeg
from PIL import Image

import outcore
from outcore.imaging import center_crop_box, native, random_resized_crop_box
from outcore.imaging.decode import dct_scale
from outcore.imaging.synthetic import SAMPLE_PHOTOS, sample_photo
from outcore.storage import read_files
from outcore.threads import available_cpus
from outcore.transforms import CenterCrop, Compose, RandomFlip, RandomResizedCrop

BATCH, SIZE, SCALE, RATIO = 256, 224, (0.08, 1.0), (3 / 4, 4 / 3)
MAX_SIDE = 512
STORES = {"own": {"shape": None, "images": "encoded"},
          f"own-{MAX_SIDE}": {"shape": None, "images": "encoded", "max_side": MAX_SIDE},
          "encoded-256": {"shape": (256, 256, 3), "images": "encoded"},
          "pixels-256": {"shape": (256, 256, 3), "images": "pixels"}}
FALLBACK = f"{native.ENVIRONMENT}=0"  # a loader measured with this in its name runs without the C extension
CORES = available_cpus()
HOW = {"full": "full decode + crop + resize", "scaled": "DCT-scaled decode + crop + resize",
       "cropped": "cropped decode + resize (C extension)"}
SOURCES = {"files": "the files", f"own-{MAX_SIDE}": f"the max_side={MAX_SIDE} files", "encoded-256": "the @256 files"}


def ceiling_name(source: str, how: str, train: bool) -> str:
    """The row of the ceiling: ``how`` (`HOW`) over ``source``'s files (`SOURCES`), train or validation box."""
    return f"ceiling{'' if train else ' (validation box)'}: {HOW[how]}, {SOURCES[source]}, {CORES} processes"


# each loader: (source, how) of its own ceiling (the tight loop doing its work on its files), or None
BEST = "cropped" if native.extension is not None else "scaled"
PILLOW_TRAIN = f"Pillow DataLoader, {CORES} workers, RRC + flip"
PILLOW_VAL = f"Pillow DataLoader, {CORES} workers, Resize(256) + CenterCrop"
TRAIN_LOADERS = {
    "outcore encoded, own sizes, RRC fused + flip": ("files", BEST),
    f"outcore encoded, own sizes, RRC fused + flip, {FALLBACK}": ("files", "scaled"),
    f"outcore encoded, max_side={MAX_SIDE}, RRC fused + flip": (f"own-{MAX_SIDE}", BEST),
    "outcore encoded store @256 + RRC + flip": ("encoded-256", BEST),
    "outcore pixel store @256 + RRC + flip": None,
    PILLOW_TRAIN: ("files", "full"),
    f"Pillow DataLoader + draft(), {CORES} workers, RRC + flip": ("files", "scaled"),
}
VAL_LOADERS = {
    "outcore encoded, own sizes, CenterCrop(224, resize=256) fused": ("files", BEST),
    f"outcore encoded, own sizes, CenterCrop(224, resize=256) fused, {FALLBACK}": ("files", "scaled"),
    f"outcore encoded, max_side={MAX_SIDE}, CenterCrop(224, resize=256) fused": (f"own-{MAX_SIDE}", BEST),
    "outcore encoded store @256 + CenterCrop": ("encoded-256", BEST),
    "outcore pixel store @256 + CenterCrop": None,
    PILLOW_VAL: ("files", "full"),
}
DALI_TRAIN = f"DALI CPU pipeline, {CORES} threads, RRC + flip"
DALI_VAL = f"DALI CPU pipeline, {CORES} threads, Resize(256) + CenterCrop"
DALI_CEILINGS = {DALI_TRAIN: ("files", "cropped"),  # image_random_crop decodes the crop's region
                 DALI_VAL: ("files", "full")}  # its validation decodes whole pictures


# -- the data ------------------------------------------------------------------------------------------

def write_folder(root: Path, images: int) -> list[Path]:
    files = sorted(root.rglob("*.jpg")) if root.exists() else []
    if len(files) == images:
        return files
    print(f"writing {images} ImageNet-like JPEGs to {root} …", flush=True)
    with ProcessPoolExecutor(CORES) as pool:
        list(pool.map(_write_part, [(root, part, images) for part in range(CORES)]))
    return sorted(root.rglob("*.jpg"))


def _write_part(job: tuple[Path, int, int]) -> None:
    root, part, images = job
    photos = [sample_photo(name) for name in SAMPLE_PHOTOS]
    for index in range(part, images, CORES):
        rng = np.random.default_rng(index)
        label = index % len(SAMPLE_PHOTOS)
        short, aspect = int(rng.integers(300, 501)), rng.uniform(4 / 3, 16 / 9)
        height, width = (short, round(short * aspect)) if rng.random() < 0.75 else (round(short * aspect), short)
        photo = photos[label]
        crop_h = int(min(photo.shape[0], photo.shape[1] * height / width) * rng.uniform(0.5, 1.0))
        crop_w = round(crop_h * width / height)
        top = int(rng.integers(0, photo.shape[0] - crop_h + 1))
        left = int(rng.integers(0, photo.shape[1] - crop_w + 1))
        picture = Image.fromarray(photo[top : top + crop_h, left : left + crop_w]).resize((width, height),
                                                                                         Image.Resampling.BICUBIC)
        folder = root / SAMPLE_PHOTOS[label]
        folder.mkdir(parents=True, exist_ok=True)
        picture.save(folder / f"{index:07d}.jpg", quality=int(rng.integers(85, 96)))


def build_stores(root: Path, workdir: Path) -> dict[str, tuple[float, int]]:
    """The stores (`STORES`), kept; returns the ingest rate and size on disk of those built now."""
    built = {}
    for name, options in STORES.items():
        location = workdir / f"{name}.zarr"
        if not location.exists():
            began = time.perf_counter()
            ds = outcore.ingest_images(root, location, **options)
            rate = len(ds) / (time.perf_counter() - began)
            built[name] = rate, sum(f.stat().st_size for f in location.rglob("*") if f.is_file())
    return built


# -- the ceilings --------------------------------------------------------------------------------------

def crop_file(data: bytes, how: str, seed: int, train: bool = True) -> np.ndarray:
    """One file through RandomResizedCrop(224) + flip (``train``), or through the central box of Resize(256)
    + CenterCrop(224): decoded at full size (``how="full"``), or at the smallest DCT scale of 1/8, 1/4, 1/2
    and 1 that keeps the box at least 224 on both sides (``"scaled"``), then resized with Pillow; or
    (``"cropped"``) only the box's rows and columns at that scale, resized, by the C extension."""
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    rng = np.random.default_rng(seed)
    if train:
        top, left, box_h, box_w = random_resized_crop_box(height, width, SCALE, RATIO, rng)
    else:
        top, left, box_h, box_w = center_crop_box(height, width, (SIZE, SIZE), resize=256)
    need = (math.ceil(height * SIZE / box_h), math.ceil(width * SIZE / box_w))
    eighths = 8 if how == "full" else dct_scale((height, width), need)
    scaled = (math.ceil(height * eighths / 8), math.ceil(width * eighths / 8))
    fy, fx = scaled[0] / height, scaled[1] / width
    flip = train and rng.random() < 0.5
    if how == "cropped":
        out = np.empty((SIZE, SIZE, 3), np.uint8)
        native.extension.crop_resize(data, eighths, (top * fy, left * fx, (top + box_h) * fy, (left + box_w) * fx),
                                     out, flip)
        return out
    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=scaled[0], min_width=scaled[1])
    region = (left * fx, top * fy, (left + box_w) * fx, (top + box_h) * fy)
    out = Image.fromarray(pixels).resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=region)
    return np.asarray(out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out)


def _crop_many(job: tuple[list[str] | tuple[str, int, int], str, bool]) -> int:
    """Files by path, or a store's files ``(location, start, stop)``, each read then cropped (`crop_file`)."""
    source, how, train = job
    if isinstance(source, tuple):  # read in blocks of BATCH files: one ranged read each
        ds, (start, stop) = outcore.open_dataset(source[0]), source[1:]
        files = (data for block in range(start, stop, BATCH)
                 for data in read_files(ds.array("images"), ds.array("images_ranges"), block, min(stop, block + BATCH)))
    else:
        files = (Path(path).read_bytes() for path in source)
    count = 0
    for seed, data in enumerate(files):
        crop_file(data, how, seed, train)
        count += 1
    return count


def ceiling(workdir: Path, files: list[Path], source: str, how: str, train: bool) -> tuple[int, float]:
    """`crop_file` over ``source``'s files ("files": the folder's; else the store of that name), one part
    per process, a process per core: (images, seconds), timed once every process has started."""
    if source == "files":
        jobs = [([str(f) for f in files[i::CORES]], how, train) for i in range(CORES)]
    else:
        location = workdir / f"{source}.zarr"
        bounds = np.linspace(0, len(outcore.open_dataset(location)), CORES + 1).astype(int)
        jobs = [((str(location), int(a), int(b)), how, train) for a, b in itertools.pairwise(bounds)]
    with ProcessPoolExecutor(CORES) as pool:
        list(pool.map(math.sqrt, range(CORES)))
        began = time.perf_counter()
        return sum(pool.map(_crop_many, jobs)), time.perf_counter() - began


# -- a torchvision-style DataLoader --------------------------------------------------------------------

class PillowFolder:
    """torchvision's ImageFolder with RandomResizedCrop + RandomHorizontalFlip (train) or Resize(256) +
    CenterCrop(224) (validation), done with Pillow as torchvision does; ``draft`` lets Pillow's JPEG
    decoder scale by 1/2..1/8 first."""

    def __init__(self, files: list[Path], train: bool, draft: bool = False) -> None:
        self.files, self.train, self.draft = files, train, draft
        self.classes = sorted({p.parent.name for p in files})

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(index)
        with Image.open(self.files[index]) as image:
            width, height = image.size
            if self.train:
                top, left, box_h, box_w = random_resized_crop_box(height, width, SCALE, RATIO, rng)
                if self.draft:
                    image.draft("RGB", (math.ceil(width * SIZE / box_w), math.ceil(height * SIZE / box_h)))
                fx, fy = image.size[0] / width, image.size[1] / height
                region = (left * fx, top * fy, (left + box_w) * fx, (top + box_h) * fy)
                out = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=region)
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else out
            else:  # torchvision's Resize(256): the shorter side to 256, the longer truncated
                scale = 256 / min(width, height)
                resized = image.convert("RGB").resize((int(width * scale), int(height * scale)),
                                                      Image.Resampling.BILINEAR)
                top, left, _, _ = center_crop_box(resized.size[1], resized.size[0], (SIZE, SIZE))
                out = resized.crop((left, top, left + SIZE, top + SIZE))
        return np.asarray(out), self.classes.index(self.files[index].parent.name), index


def pillow_epoch(files: list[Path], train: bool, draft: bool) -> tuple[int, int]:
    """(images delivered, distinct images among them) of one epoch of the Pillow DataLoader."""
    import torch

    loader = torch.utils.data.DataLoader(PillowFolder(files, train, draft), batch_size=BATCH, shuffle=True,
                                         num_workers=CORES, generator=torch.Generator().manual_seed(0))
    indices = np.concatenate([index.numpy() for _, _, index in loader])
    return len(indices), len(np.unique(indices))


def dali_epoch(root: Path, train: bool) -> tuple[int, None]:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=BATCH, num_threads=CORES, device_id=None, seed=0)
    def pipeline():
        files, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="reader")
        if train:
            images = fn.decoders.image_random_crop(files, device="cpu", output_type=types.RGB,
                                                   random_area=list(SCALE), random_aspect_ratio=list(RATIO),
                                                   num_attempts=10)
            images = fn.flip(fn.resize(images, resize_x=SIZE, resize_y=SIZE), horizontal=fn.random.coin_flip())
        else:
            images = fn.crop(fn.resize(fn.decoders.image(files, device="cpu", output_type=types.RGB),
                                       resize_shorter=256), crop=(SIZE, SIZE))
        return images, labels

    built = pipeline()
    built.build()
    total, count = built.epoch_size("reader"), 0
    while count < total:
        count += len(built.run()[0])
    return count, None  # which files it delivered is not known here (its reader wraps the last batch)


def outcore_epoch(location: Path, transform: object) -> tuple[int, int]:
    ds = outcore.open_dataset(location)
    seen = []
    for batch in ds.batches(BATCH, fields=["images", "labels", "source_index"], seed=0, transform=transform):
        seen.append(batch["source_index"])
    indices = np.concatenate(seen)
    return len(indices), len(np.unique(indices))


# -- one measurement per process -----------------------------------------------------------------------

def measure(name: str, workdir: Path, files: list[Path]) -> dict[str, float]:
    """One row, measured in this process: images/s, peak RSS and whether the epoch was exact (None: a
    ceiling, or a loader that does not say which images it delivered)."""
    train, val = Compose([RandomResizedCrop(SIZE), RandomFlip()]), CenterCrop(SIZE, resize=256)
    own, capped = workdir / "own.zarr", workdir / f"own-{MAX_SIDE}.zarr"
    ceilings = {ceiling_name(source, how, is_train): (source, how, is_train) for source in SOURCES for how in HOW
                for is_train in (True, False)}
    if name in ceilings:
        (samples, elapsed), unique = ceiling(workdir, files, *ceilings[name]), None
    else:
        names = [*TRAIN_LOADERS, *VAL_LOADERS]
        work = dict(zip(names, [
            lambda: outcore_epoch(own, train), lambda: outcore_epoch(own, train), lambda: outcore_epoch(capped, train),
            lambda: outcore_epoch(workdir / "encoded-256.zarr", train),
            lambda: outcore_epoch(workdir / "pixels-256.zarr", train),
            lambda: pillow_epoch(files, train=True, draft=False), lambda: pillow_epoch(files, train=True, draft=True),
            lambda: outcore_epoch(own, val), lambda: outcore_epoch(own, val), lambda: outcore_epoch(capped, val),
            lambda: outcore_epoch(workdir / "encoded-256.zarr", CenterCrop(SIZE)),
            lambda: outcore_epoch(workdir / "pixels-256.zarr", CenterCrop(SIZE)),
            lambda: pillow_epoch(files, train=False, draft=False),
        ], strict=True)) | {DALI_TRAIN: lambda: dali_epoch(workdir / "train", train=True),
                            DALI_VAL: lambda: dali_epoch(workdir / "train", train=False)}
        began = time.perf_counter()
        samples, unique = work[name]()
        elapsed = time.perf_counter() - began
    status = Path("/proc/self/status").read_text()
    return {"rate": samples / elapsed, "peak_mib": int(status.split("VmHWM:")[1].split()[0]) / 1024,
            "exact": None if unique is None else samples == unique == len(files)}


def in_a_fresh_process(name: str, args: argparse.Namespace) -> dict[str, float]:
    environment = dict(os.environ, **({native.ENVIRONMENT: "0"} if FALLBACK in name else {}))
    result = subprocess.run([sys.executable, __file__, "--workdir", str(args.workdir), "--images", str(args.images),
                             "--measure", name], capture_output=True, text=True, check=True, env=environment)
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_table(title: str, loaders: dict[str, tuple[str, str] | None], train: bool, args: argparse.Namespace,
              pillow: str, dali: str) -> None:
    """Each chosen loader and each ceiling its rows name, a fresh process each; the table: images/s, the
    ratio to the row's own ceiling, to the Pillow DataLoader and to DALI (when measured), peak RSS, exact."""
    own = {name: None if where is None else ceiling_name(*where, train) for name, where in loaders.items()}
    wanted = [name for name in own if chosen(name, args)]
    ceilings = sorted({own[name] for name in wanted if own[name]}, key=list(map(str, own.values())).index)
    rows = {name: in_a_fresh_process(name, args) for name in [*ceilings, *wanted]}
    width = max(len(name) for name in rows)
    print(f"\n{title}\n{'loader':{width}s} {'images/s':>9s} {'x its ceiling':>14s} {'x Pillow DL':>12s} "
          f"{'x DALI':>7s} {'peak RSS':>9s}  exact epoch")
    for name, row in rows.items():
        versus = [f"{row['rate'] / rows[other]['rate']:{w}.2f}" if other and other in rows and other != name
                  else f"{'-':>{w}s}" for other, w in ((own.get(name), 14), (pillow, 12), (dali, 7))]
        exact = "-" if row["exact"] is None else "yes" if row["exact"] else "NO"
        print(f"{name:{width}s} {row['rate']:9.0f} {' '.join(versus)} {row['peak_mib']:6.0f} MiB  {exact}")
    for name in rows:
        if own.get(name):
            print(f"  {name}: its ceiling is '{own[name]}'")


def chosen(name: str, args: argparse.Namespace) -> bool:
    """Whether ``--only`` asks for this loader and this machine can run it (the C extension's rows)."""
    wanted = [text for text in args.only.split(",") if text] if args.only else []
    return (not wanted or any(w in name for w in wanted)) and (native.extension is not None or FALLBACK not in name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/imagenet"))
    parser.add_argument("--skip-validation", action="store_true")
    parser.add_argument("--only", help="measure only the loaders whose names contain one of these comma-separated texts "
                        "(and their ceilings)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = args.workdir / "train"
    files = write_folder(root, args.images)
    if args.measure:
        print(json.dumps(measure(args.measure, args.workdir, files)))
        return
    sizes = [f.stat().st_size for f in files]
    print(f"{len(files)} JPEGs, {sum(sizes) / 2**30:.2f} GiB, mean {np.mean(sizes) / 1024:.0f} KiB; "
          f"{CORES} cores; JPEG boxes: {native.backend()}")
    for name, (rate, size) in build_stores(root, args.workdir).items():
        print(f"ingest {name}.zarr ({STORES[name]}): {rate:,.0f} images/s, {size / 2**30:.2f} GiB")
    try:
        import nvidia.dali  # noqa: F401 - measured when installed
        dali = DALI_CEILINGS
    except ImportError as error:
        print(f"NVIDIA DALI: not measured ({error}; pip install nvidia-dali-cuda120)")
        dali = {}
    run_table("train: RandomResizedCrop(224) + flip, batch 256, one shuffled epoch",
              TRAIN_LOADERS | {k: v for k, v in dali.items() if k == DALI_TRAIN}, True, args, PILLOW_TRAIN, DALI_TRAIN)
    if not args.skip_validation:
        run_table("validation: Resize(256) + CenterCrop(224), batch 256",
                  VAL_LOADERS | {k: v for k, v in dali.items() if k == DALI_VAL}, False, args, PILLOW_VAL, DALI_VAL)


if __name__ == "__main__":
    main()
