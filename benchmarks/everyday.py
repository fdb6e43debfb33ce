"""The everyday paths, measured: a big store's first batch, a Keras epoch, threads in a fused-crop epoch.

    python benchmarks/everyday.py [--workdir bench-data] [--only plan,keras,threads] [--rounds 3]

Each measurement runs in a fresh Python process (peak RSS is the process's own), ``--rounds`` times;
the tables give medians.

- **plan**: the first shuffled batch of a 100-million-sample int32 store (one field, chunks of 65,536):
  seconds from opening the store to holding the batch (imports not counted), and the process's peak
  RSS (with numpy, zarr and outcore imported in both), against opening the
  store and reading one chunk with plain zarr (the ceiling: nothing can be cheaper).
- **keras**: one ``model.fit`` epoch (``shuffle=True``, Keras' default) of a tiny model on 60,000
  32x32x3 samples against one epoch of ``ds.batches`` feeding the same model's ``train_on_batch`` —
  the same batches, the same steps — and against ``model.fit`` of a PyDataset holding those batches
  in memory (Keras' own ceiling: what its PyDataset path costs without any reading): samples/s, the
  ratios, and the bytes the process read (its ``rchar``) over the fields' bytes on disk.
- **threads**: the threads started, and the most alive at once, during a RandomResizedCrop(64) + flip
  epoch (32 batches) of 2,048 encoded JPEGs of their own sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

PLAN = """
import time, numpy as np, zarr, outcore
began = time.perf_counter()
if {ceiling}:
    zarr.open_group({path!r}, mode="r")["x"][:65536]
else:
    batch = next(iter(outcore.open_dataset({path!r}).batches(256, seed=1)))
    assert len(np.unique(batch["x"])) == 256
with open("/proc/self/status") as status:  # VmHWM: this program's peak (ru_maxrss keeps the parent's)
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
print(time.perf_counter() - began, peak / 1024)
"""

KERAS = """
import os, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras, numpy as np, outcore
ds = outcore.open_dataset({path!r})
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                          keras.layers.Conv2D(4, 3, strides=2, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy")
model.train_on_batch(np.zeros((2, 32, 32, 3), np.uint8), np.zeros(2))  # compiled before the clock starts

def read():
    with open("/proc/self/io") as counters:
        return int(dict(line.split(": ") for line in counters.read().splitlines())["rchar"])

class InMemory(keras.utils.PyDataset):  # Keras' own ceiling: the same batches, already in memory
    def __init__(self):
        super().__init__()
        self.batches = [(b["images"], b["labels"]) for b in ds.batches(256, seed=1, fields=["images", "labels"])]
    def __len__(self):
        return len(self.batches)
    def __getitem__(self, index):
        return self.batches[index]

data = InMemory() if {how!r} == "in memory" else None
began, before = time.perf_counter(), read()
if {how!r} == "fit":
    model.fit(ds.keras(256, x="images", y="labels", seed=1), epochs=1, verbose=0)
elif {how!r} == "in memory":
    model.fit(data, epochs=1, verbose=0)
else:
    for batch in ds.batches(256, seed=1, fields=["images", "labels"]):
        model.train_on_batch(batch["images"], batch["labels"])
print(len(ds) / (time.perf_counter() - began), read() - before)
"""

THREADS = """
import threading, numpy as np, outcore
from outcore.transforms import Compose, RandomFlip, RandomResizedCrop
started, most, start = [0], [0], threading.Thread.start

def counted(thread):  # every thread started, by anyone, and the most alive right after a start
    started[0] += 1
    start(thread)
    most[0] = max(most[0], threading.active_count())

threading.Thread.start = counted
ds = outcore.open_dataset({path!r})
for batch in ds.batches(64, seed=0, transform=Compose([RandomResizedCrop(64), RandomFlip()])):
    pass
print(most[0], started[0])
"""


def run(script: str, rounds: int) -> list[list[float]]:
    """The numbers ``script`` prints, per round, each round a fresh process."""
    results = []
    for _ in range(rounds):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=True, capture_output=True,
                              text=True)
        results.append([float(v) for v in done.stdout.split()])
    return results


def medians(results: list[list[float]]) -> list[float]:
    return [statistics.median(column) for column in zip(*results, strict=True)]


def plan(workdir: Path, rounds: int) -> None:
    import numpy as np

    import outcore

    path = workdir / "hundred-million.zarr"
    if not path.exists():
        print("writing a 100,000,000-sample int32 store …")
        outcore.from_arrays({"x": np.arange(100_000_000, dtype=np.int32)}, path, chunk_size=65536,
                            shuffle_on_write=False)
    ceiling = medians(run(PLAN.format(path=str(path), ceiling=True), rounds))
    first = medians(run(PLAN.format(path=str(path), ceiling=False), rounds))
    print("\nfirst shuffled batch of 100M int32 samples (fresh process)   seconds   peak RSS MiB")
    print(f"  plain zarr: open, read one chunk (the ceiling)              {ceiling[0]:7.2f}   {ceiling[1]:10.0f}")
    print(f"  outcore: open, ds.batches(256, seed=1), first batch         {first[0]:7.2f}   {first[1]:10.0f}")


def keras_epoch(workdir: Path, rounds: int) -> None:
    import numpy as np

    import outcore

    path = workdir / "keras-60k.zarr"
    if not path.exists():
        rng = np.random.default_rng(0)
        outcore.from_arrays({"images": rng.integers(0, 256, (60_000, 32, 32, 3), np.uint8),
                             "labels": rng.integers(0, 10, 60_000)}, path)
    stored = sum(f.stat().st_size for name in ("images", "labels") for f in (path / name / "c").rglob("*")
                 if f.is_file())
    plain, fit, ceiling = (medians(run(KERAS.format(path=str(path), how=how), rounds))
                           for how in ("batches", "fit", "in memory"))
    print(f"\none epoch, 60,000 32x32x3 samples, batch 256, {rounds} fresh processes each (medians)")
    print("                                              samples/s  vs ds.batches  vs Keras' ceiling  read / stored")
    for name, (rate, read) in (("ds.batches + train_on_batch", plain), ("model.fit(ds.keras()), shuffle=True", fit),
                               ("model.fit(in-memory PyDataset): the ceiling", ceiling)):
        print(f"  {name:43s} {rate:9.0f}  {rate / plain[0]:13.2f}  {rate / ceiling[0]:17.2f}  {read / stored:13.2f}")


def threads(workdir: Path, rounds: int) -> None:
    import outcore
    from outcore.testing import write_image_folder

    path = workdir / "own-sizes-2048.zarr"
    if not path.exists():
        write_image_folder(workdir / "own-sizes-2048", 512, classes=("a", "b", "c", "d"), size=(160, 120),
                           kind="photos", seed=0)
        outcore.ingest_images(workdir / "own-sizes-2048", path, shape=None, images="encoded")
    most, started = medians(run(THREADS.format(path=str(path)), rounds))
    print(f"\nthreads during a RandomResizedCrop(64) + flip epoch of 2,048 JPEGs ({len(os.sched_getaffinity(0))} "
          "CPUs available)")
    print(f"  threads started in the epoch {started:.0f}, most alive at once {most:.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("bench-data"))
    parser.add_argument("--only", default="plan,keras,threads")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        {"plan": plan, "keras": keras_epoch, "threads": threads}[name](args.workdir, args.rounds)
    print(json.dumps({"python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
