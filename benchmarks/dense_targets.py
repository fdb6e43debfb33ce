"""Detection and segmentation batches: a crop and flip applied to pictures, instance maps, boxes and keypoints.

    python benchmarks/dense_targets.py [--images 1024] [--batch 64] [--repeats 5] [--workdir bench-data/dense]

Makes (once, in ``--workdir``) a COCO-like set from the packaged sample photographs: ``--images`` 320x240 JPEG
crops, each with 0-8 instances (a box, a polygon inside it, 4 keypoints), a COCO annotation file, and the
instance maps as PNGs; ingests it with `outcore.ingest_coco` (encoded, at the pictures' size). Then every case
makes batches of ``--batch`` 224x224 ``RandomResizedCrop`` + horizontal flip of picture, instance map, boxes (with
their labels, dropped when cut away) and keypoints, from the JPEG files, flat out:

- **outcore**: ``ds.batches(..., transform=Compose([RandomResizedCrop(224, targets=...), RandomFlip(targets=...)]))``
  on the process's threads (crop while decoding; maps, boxes and keypoints moved by runs of the batch);
- **albumentations** (where installed): its ``RandomResizedCrop`` and ``HorizontalFlip`` with ``bbox_params`` and
  ``keypoint_params``, per sample, in a PyTorch ``DataLoader`` with a worker per core (Pillow decodes the JPEG and
  the PNG map): how people do it today;
- **torchvision v2** (where installed): its ``RandomResizedCrop`` and ``RandomHorizontalFlip`` on ``tv_tensors``
  (``Image``, ``Mask``, ``BoundingBoxes``, and ``KeyPoints`` where this torchvision has them), per sample, in the
  same ``DataLoader``;
- **per-sample Pillow**: the same by hand, per sample (Pillow's bilinear picture and nearest map, numpy boxes):
  what torchvision's detection references do on the CPU, in the same ``DataLoader``;
- **outcore, own sizes**: the set ingested with ``shape=None`` (pictures as files at their own size, instance maps
  as raster fields cut by the crop's boxes as the batch is made).

DALI needs CUDA and is not installed: the table says so, as it says which other library is missing. Rates are
medians of ``--repeats`` rounds that run every case in turn (`outcore.measure.interleaved`); the
ratio column divides by outcore's. Each case also makes one batch with its transform alone (decoded inputs, one
thread) to separate the geometric work from decoding: ``transform only`` is samples/s of that work on one core.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from pathlib import Path

import numpy as np
from common import print_table
from PIL import Image

import outcore
from outcore.imaging.synthetic import write_image_folder
from outcore.measure import interleaved
from outcore.transforms import Compose, RandomFlip, RandomResizedCrop, Targets

SIZE = (240, 320)
OUT = 224
POINTS = 4  # left eye, right eye, left hand, right hand
PAIRS = ((0, 1), (2, 3))
TARGETS = Targets(label_maps=("masks",), boxes="boxes", keypoints="keypoints", instances=("labels",), flip_pairs=PAIRS)


def make_set(workdir: Path, images: int) -> Path:
    """The pictures, their COCO annotation file and their instance maps as PNGs (kept for later runs)."""
    annotations = workdir / "instances.json"
    if annotations.exists() and len(json.loads(annotations.read_text())["images"]) == images:
        return annotations
    files = write_image_folder(workdir / "photos", images, classes=("all",), size=SIZE, kind="photos", seed=0)
    rng = np.random.default_rng(0)
    entries, found = [], []
    (workdir / "maps").mkdir(parents=True, exist_ok=True)
    for number, path in enumerate(sorted(files)):
        ids = np.zeros(SIZE, np.uint16)
        for k in range(int(rng.integers(0, 9))):
            x0, y0 = rng.uniform(0, SIZE[1] - 40), rng.uniform(0, SIZE[0] - 40)
            w, h = rng.uniform(16, SIZE[1] - x0), rng.uniform(16, SIZE[0] - y0)
            polygon = [x0, y0, x0 + w, y0 + h * 0.3, x0 + w * 0.6, y0 + h, x0, y0 + h * 0.8]
            points = [[x0 + w * rng.random(), y0 + h * rng.random(), 2] for _ in range(POINTS)]
            found.append({"id": len(found) + 1, "image_id": number, "category_id": int(rng.integers(1, 4)),
                          "bbox": [x0, y0, w, h], "iscrowd": 0, "area": w * h, "segmentation": [polygon],
                          "keypoints": [value for point in points for value in point]})
            drawn = outcore.imaging.Drawing("", SIZE, ((k + 1, [polygon]),)).draw()  # as ingest draws it
            ids = np.where(drawn > 0, drawn, ids)
        Image.fromarray(ids).save(workdir / "maps" / f"{number:06}.png")
        entries.append({"id": number, "file_name": str(path.relative_to(workdir)), "height": SIZE[0],
                        "width": SIZE[1]})
    categories = [{"id": i, "name": name, "keypoints": ["left_eye", "right_eye", "left_hand", "right_hand"]}
                  for i, name in ((1, "person"), (2, "dog"), (3, "cat"))]
    annotations.write_text(json.dumps({"images": entries, "annotations": found, "categories": categories}))
    return annotations


class PerSample:
    """A map-style dataset of the set as people write one: each sample decoded from its files, its targets
    transformed one by one, by albumentations (``library``) or by hand with Pillow."""

    def __init__(self, workdir: Path, annotations: Path, library: str) -> None:
        document = json.loads(annotations.read_text())
        self.workdir, self.images = workdir, document["images"]
        self.instances: list[list[dict]] = [[] for _ in self.images]
        for annotation in document["annotations"]:
            self.instances[annotation["image_id"]].append(annotation)
        self.library = library  # a key of LIBRARIES

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.transform(self.load(index), index)

    def load(self, index: int) -> tuple[np.ndarray, ...]:
        """Sample ``index`` decoded: picture, instance map, boxes, keypoints, labels."""
        with Image.open(self.workdir / self.images[index]["file_name"]) as image:
            pixels = np.asarray(image.convert("RGB"))
        with Image.open(self.workdir / "maps" / f"{index:06}.png") as image:
            ids = np.asarray(image)
        found = self.instances[index]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in found)], np.float32).reshape(-1, 4)
        points = np.array([a["keypoints"] for a in found], np.float32).reshape(-1, POINTS, 3)
        labels = np.array([a["category_id"] for a in found], np.int64)
        return pixels, ids, boxes, points, labels

    def transform(self, loaded: tuple[np.ndarray, ...], seed: int) -> dict[str, np.ndarray]:
        """The crop and flip of a decoded sample and its targets."""
        return LIBRARIES[self.library][1](*loaded, np.random.default_rng(seed))


_PIPELINES: dict[str, object] = {}  # each library's, made once per process


def _albumentations(pixels, ids, boxes, points, labels, rng) -> dict[str, np.ndarray]:
    import albumentations as A

    if "albumentations" not in _PIPELINES:
        _PIPELINES["albumentations"] = A.Compose(
            [A.RandomResizedCrop((OUT, OUT)), A.HorizontalFlip()],
            bbox_params=A.BboxParams("pascal_voc", label_fields=["labels"], min_area=0),
            keypoint_params=A.KeypointParams("xy", remove_invisible=False), seed=int(rng.integers(2**31)))
    made = _PIPELINES["albumentations"](image=pixels, mask=ids, bboxes=boxes, labels=labels, keypoints=points[..., :2].reshape(-1, 2))
    return {"images": made["image"], "masks": made["mask"], "boxes": np.asarray(made["bboxes"], np.float32),
            "keypoints": np.asarray(made["keypoints"], np.float32)}


def _torchvision(pixels, ids, boxes, points, labels, rng) -> dict[str, np.ndarray]:
    """torchvision v2 on tv_tensors; the boxes a crop leaves empty are dropped after it (SanitizeBoundingBoxes would
    index the instance map as if it held a mask per box)."""
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    if "torchvision" not in _PIPELINES:
        _PIPELINES["torchvision"] = v2.Compose([v2.RandomResizedCrop((OUT, OUT), antialias=True),
                                                v2.RandomHorizontalFlip()])
    torch.manual_seed(int(rng.integers(2**31)))
    canvas = pixels.shape[:2]
    sample = {"image": tv_tensors.Image(torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))),
              "masks": tv_tensors.Mask(torch.from_numpy(ids.astype(np.uint8))),  # ids of at most 8 instances
              "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=canvas)}
    if hasattr(tv_tensors, "KeyPoints"):
        sample["keypoints"] = tv_tensors.KeyPoints(torch.from_numpy(points[..., :2].reshape(-1, 2)), canvas_size=canvas)
    made = _PIPELINES["torchvision"](sample)
    moved = made["boxes"].numpy()
    keep = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
    spots = made["keypoints"].numpy().reshape(-1, POINTS, 2) if "keypoints" in made else points[..., :2]
    return {"images": made["image"].numpy().transpose(1, 2, 0), "masks": made["masks"].numpy(), "boxes": moved[keep],
            "labels": labels[keep], "keypoints": spots[keep]}


def _by_hand(pixels, ids, boxes, points, labels, rng) -> dict[str, np.ndarray]:
    from outcore.imaging import random_resized_crop_box

    top, left, height, width = random_resized_crop_box(*SIZE, (0.08, 1.0), (3 / 4, 4 / 3), rng)
    region = (left, top, left + width, top + height)
    picture = Image.fromarray(pixels).resize((OUT, OUT), Image.Resampling.BILINEAR, box=region)
    mask = Image.fromarray(ids).resize((OUT, OUT), Image.Resampling.NEAREST, box=region)
    scale = np.array([OUT / width, OUT / height] * 2, np.float32)
    moved = np.clip((boxes - [left, top, left, top]) * scale, 0, OUT)
    keep = (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
    spots = (points[..., :2] - [left, top]) * scale[:2]
    if rng.random() < 0.5:
        picture, mask = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT), mask.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        moved[:, [0, 2]] = OUT - moved[:, [2, 0]]
        spots[..., 0] = OUT - spots[..., 0]
        spots = spots[:, [1, 0, 3, 2]]
    return {"images": np.asarray(picture), "masks": np.asarray(mask), "boxes": moved[keep], "labels": labels[keep],
            "keypoints": spots[keep]}


LIBRARIES = {  # the per-sample cases: their module (None: none needed) and their transform of one sample
    "albumentations": ("albumentations", _albumentations),
    "torchvision v2": ("torchvision.transforms.v2", _torchvision),
    "per-sample Pillow": (None, _by_hand),
}


def _collate(samples: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Pictures and maps stacked, boxes and keypoints as lists (what detection models take)."""
    return {"images": np.stack([s["images"] for s in samples]), "masks": np.stack([s["masks"] for s in samples]),
            "boxes": [s["boxes"] for s in samples], "keypoints": [s["keypoints"] for s in samples]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/dense"))
    args = parser.parse_args()
    annotations = make_set(args.workdir, args.images)
    store = args.workdir / "coco.zarr"
    ds = outcore.ingest_coco(annotations, store, root=args.workdir, shape=(*SIZE, 3), images="encoded",
                             progress=False)
    cores = len(os.sched_getaffinity(0))
    transform = Compose([RandomResizedCrop(OUT, targets=TARGETS), RandomFlip(targets=TARGETS)])
    fields = ["images", "masks", "boxes", "labels", "keypoints"]
    epoch = [0]

    def outcore_epoch() -> int:
        epoch[0] += 1
        done = 0
        for batch in ds.batches(args.batch, seed=epoch[0], transform=transform, fields=fields, drop_last=True):
            done += len(batch["images"])
        return done

    own = outcore.ingest_coco(annotations, args.workdir / "coco-own.zarr", root=args.workdir, shape=None,
                              progress=False)  # the maps at the pictures' own size: raster fields

    def own_epoch() -> int:
        epoch[0] += 1
        return sum(len(batch["images"]) for batch in own.batches(args.batch, seed=epoch[0], transform=transform,
                                                                 fields=fields, drop_last=True))

    cases = {"outcore (threads)": outcore_epoch, "outcore, own sizes (threads)": own_epoch}
    libraries = installed()
    import torch.utils.data

    for library in libraries:
        loader = torch.utils.data.DataLoader(PerSample(args.workdir, annotations, library), args.batch, shuffle=True,
                                             num_workers=cores, collate_fn=_collate, drop_last=True,
                                             persistent_workers=True)

        def loader_epoch(loader=loader) -> int:
            return sum(len(batch["images"]) for batch in loader)

        cases[f"{library}, DataLoader"] = loader_epoch
    rates = interleaved(cases, args.repeats)
    print(f"\n{args.images} pictures of {SIZE[1]}x{SIZE[0]} (0-8 instances each), batches of {args.batch} "
          f"{OUT}x{OUT}, {cores} cores; DALI: not installed (it needs CUDA)")
    print_table(["case", "samples/s"], list(rates.items()), {"/ outcore": rates["outcore (threads)"]})
    print("per core: " + ", ".join(f"{name} {rate / cores:.0f}" for name, rate in rates.items()))
    _transform_only(ds, transform, fields, args.batch, annotations, args.workdir, libraries)


def installed() -> list[str]:
    """The per-sample cases whose library imports here (`LIBRARIES`); the others are said to be left out."""
    found = []
    for name, (module, _) in LIBRARIES.items():
        try:
            if module is not None:
                importlib.import_module(module)
            found.append(name)
        except ImportError:
            print(f"{name} is not installed ({module} does not import): its case is left out")
    return found


def _transform_only(ds, transform, fields, batch_size, annotations, workdir, libraries: list[str]) -> None:
    """Samples/s of the geometric work alone on one thread: a decoded batch (outcore) or its samples one by one."""
    outcore.set_threads(1)
    decoded = next(iter(ds.batches(batch_size, shuffle=False, fields=fields)))

    def timed(work, rounds: int = 5) -> float:
        began = time.perf_counter()
        for round_ in range(rounds):
            work(round_)
        return rounds * batch_size / (time.perf_counter() - began)

    rows = [("outcore transform, one thread", timed(lambda r: transform(decoded, np.random.default_rng(r))))]
    for name in libraries:
        one = PerSample(workdir, annotations, name)
        loaded = [one.load(i) for i in range(batch_size)]
        rows.append((f"{name}, one thread", timed(lambda r, one=one, loaded=loaded: [
            one.transform(sample, r * batch_size + i) for i, sample in enumerate(loaded)])))
    outcore.set_threads(None)
    print()
    print_table(["transform only (decoded inputs)", "samples/s"], rows, {"/ outcore": rows[0][1]})


if __name__ == "__main__":
    main()
