"""What the benchmark scripts share: the generated JPEG folders, a JPEG-folder dataset, a LocalCluster
closed in order, and the printed table (timing in turns is `outcore.measure.interleaved`, which `outcore bench` uses too)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from outcore.imaging.synthetic import write_image_folder


def prepare(folder: Path, images: int, size: int) -> list[Path]:
    """``images`` photo crops of ``size`` x ``size`` as quality-90 JPEGs in ``folder`` (kept for later runs)."""
    files = sorted(folder.rglob("*.jpg")) if folder.exists() else []
    if len(files) != images:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"writing {images} {size}x{size} JPEGs to {folder} …")
        files = write_image_folder(folder, images // 4, classes=("a", "b", "c", "d"), size=(size, size),
                                   kind="photos", seed=0)
    return files


def print_table(columns: Sequence[str], rows: Sequence[tuple[str, float]], ratios: dict[str, float]) -> None:
    """One row per measurement: its rate, then the rate divided by each of ``ratios``' values."""
    width = max(len(name) for name, _ in rows)
    header = f"{columns[0]:{width}s} {columns[1]:>10s}" + "".join(f" {label:>17s}" for label in ratios)
    print(header)
    print("-" * len(header))
    for name, rate in rows:
        print(f"{name:{width}s} {rate:10.0f}" + "".join(f" {rate / base:17.2f}" for base in ratios.values()))


class JpegFolder:
    """torchvision's ImageFolder, without torchvision: decode one JPEG per sample with Pillow (labels from
    sub-folders, in sorted order); with ``crop``, a random ``crop`` x ``crop`` window and a random flip, seeded
    by the sample's index, as torchvision's RandomCrop and RandomHorizontalFlip would do per sample."""

    def __init__(self, root: Path, crop: int | None = None) -> None:
        self.files = sorted(root.rglob("*.jpg"))
        classes = sorted({p.parent.name for p in self.files})
        self.labels = [classes.index(p.parent.name) for p in self.files]
        self.crop = crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        with Image.open(self.files[index]) as image:
            pixels = np.asarray(image.convert("RGB"))
        if self.crop is None:
            return pixels, self.labels[index]
        rng = np.random.default_rng(index)
        top, left = rng.integers(0, np.array(pixels.shape[:2]) - self.crop + 1)
        window = pixels[top : top + self.crop, left : left + self.crop]
        return np.ascontiguousarray(window[:, ::-1] if rng.random() < 0.5 else window), self.labels[index]


@contextlib.contextmanager
def local_cluster(workers: int) -> Iterator[tuple[Any, Any]]:
    """A ``distributed.LocalCluster`` of ``workers`` single-threaded worker processes and a client of it,
    every worker in; closed workers first, then the scheduler (the other way round, a worker's heartbeat
    may find no scheduler, and print a traceback)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        try:
            with Client(cluster) as client:
                client.wait_for_workers(workers, timeout=120)
                yield cluster, client
        finally:
            cluster.scale(0)
            cluster.sync(cluster._correct_state)  # the workers closed, while their scheduler listens
