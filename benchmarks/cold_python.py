"""Does a batch's Python run slower on a thread that has just copied megabytes?

    python benchmarks/cold_python.py [--epochs 12] [--workdir bench-data/cold-python]

Two tables, one thread (``outcore.set_threads(1)``):

- a batch's index work (``Rows.of`` of 512 rows, as a batch made of two is sorted by chunk), timed by the thread's
  own CPU clock, right after the same thread copied 1 to 64 MiB (as a pool thread decompresses and copies a
  batch's chunks before it takes up the Python that makes the next), or read a byte of each page of 256 MiB:
  microseconds, and the ratio to nothing done before;
- the CPU time of a pixel batch outside outcore's C calls (`outcore.measure.gil_free_clock`: an upper bound of its
  time holding the GIL) over two stores that differ only in their pictures' sizes, 16x16 and 128x128, with the same
  chunks (128 samples), batches (256, shuffled, images and labels) and so the same Python a batch: microseconds a
  batch (median of ``--epochs`` epochs), and the ratio to the 16x16 store's, whose copies fit in a core's caches.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import outcore
from outcore.iterate.gather import Rows
from outcore.measure import gil_free_clock

SIDES = (16, 128)
SAMPLES = 24_000
MIB = 1 << 20


def index_work_after(repeats: int = 200) -> list[tuple[str, float]]:
    """``(what the thread did before, µs of Rows.of)``, medians of ``repeats``: nothing, copies of 1 to 64 MiB, and a
    read of one byte a page of 256 MiB (the TLB's entries taken, few of the caches' lines)."""
    rng = np.random.default_rng(0)
    keys = np.sort(rng.integers(0, 8, 512))
    samples = keys * 128 + rng.integers(0, 128, 512)
    source = np.ones(256 * MIB, np.uint8)
    target = np.ones(64 * MIB, np.uint8)
    before: list[tuple[str, Callable[[], object]]] = [("nothing", lambda: None)]
    before += [(f"copied {mib} MiB", lambda mib=mib: np.copyto(target[: mib * MIB], source[: mib * MIB]))
               for mib in (1, 4, 16, 64)]
    before.append(("read a byte a page of 256 MiB", source[::4096].sum))
    timed = []
    for label, work in before:
        times = []
        for _ in range(repeats):
            work()
            began = time.thread_time()
            Rows.of(keys, samples, 128)
            times.append(time.thread_time() - began)
        timed.append((label, statistics.median(times) * 1e6))
    return timed


def store(workdir: Path, side: int) -> Path:
    """A pixel store of `SAMPLES` random ``side`` x ``side`` pictures in chunks of 128 (made once)."""
    location = workdir / f"pixels-{side}.zarr"
    if not location.exists():
        rng = np.random.default_rng(side)
        images = rng.integers(0, 256, (SAMPLES, side, side, 3), dtype=np.uint8)
        labels = rng.integers(0, 4, SAMPLES)
        shutil.rmtree(location, ignore_errors=True)
        outcore.from_arrays({"images": images, "labels": labels}, location, chunk_size=128,
                            roles={"images": "input", "labels": "target"}, progress=False)
    return location


def held_a_batch(location: Path, epochs: int) -> float:
    """µs a batch outside outcore's C calls, median of ``epochs`` epochs of one kept iterator."""
    batches = outcore.open_dataset(location).batches(256, shuffle=True, fields=["images", "labels"])
    for _ in batches:  # the first epoch opens the files and fills the buffers
        pass
    clock, held = gil_free_clock(), []
    for _ in range(epochs):
        cpu, free, count = time.process_time(), clock(), 0
        for _ in batches:
            count += 1
        held.append(((time.process_time() - cpu) - (clock() - free)) / count * 1e6)
    return statistics.median(held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/cold-python"))
    args = parser.parse_args()
    if gil_free_clock() is None:
        raise SystemExit("outcore's C extensions are not built here: nothing to time")
    outcore.set_threads(1)
    timed = index_work_after()
    width = max(len(label) for label, _ in timed)
    print("a batch's index work (Rows.of, 512 rows) on a thread that has just:")
    print(f"{'':{width}s} {'µs':>8s} {'x nothing':>10s}")
    for label, micros in timed:
        print(f"{label:{width}s} {micros:8.1f} {micros / timed[0][1]:10.2f}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    held = {side: held_a_batch(store(args.workdir, side), args.epochs) for side in SIDES}
    print("\nCPU time a batch outside outcore's C calls (one thread, ds.batches(256), images + labels, chunks of 128):")
    print(f"{'pictures':>10s} {'µs a batch':>11s} {'x 16x16':>8s}")
    for side in SIDES:
        print(f"{f'{side}x{side}':>10s} {held[side]:11.0f} {held[side] / held[SIDES[0]]:8.2f}")


if __name__ == "__main__":
    main()
