"""Shuffle on write from an on-disk source: outcore's two-pass shuffle against the global ``x[order]``
that outcore used before (and that dask users write), in one run.

    python benchmarks/shuffle_on_write.py [--samples 24000] [--workdir bench-data]

Prints (1) tasks per source block of the whole ingest graph, for 16, 64 and 256 source blocks
(counted before any task runs), and (2) for an HDF5 file of ``--samples`` 64x64x3 images, the time
and the extra peak memory (the process's VmHWM over its RSS before the ingest, after a warm-up) of
each way, each in a fresh process. Shards are scaled down to 4 MiB (from 128 MiB) so that the file
holds as many shards as a file 32x larger would at the default.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import dask.array as da
import zarr
from dask.callbacks import Callback

import outcore
import outcore.format.layout
from outcore.ingest.permute import write_order
from outcore.testing import write_h5_images


class _Counted(Exception):
    pass


class _Count(Callback):
    def _start(self, dsk) -> None:
        raise _Counted(len(dsk))


def tasks_per_block(blocks: int, workdir: Path, global_index: bool) -> float:
    """Tasks of the ingest graph per source block (one shard per source block)."""
    source = zarr.create_array(workdir / f"src-{blocks}.zarr", shape=(blocks * 512, 8), dtype="uint8",
                               chunks=(512, 8), overwrite=True)
    arrays = {"x": da.from_zarr(source)[write_order(blocks * 512, True, 0)]} if global_index else {"x": source}
    try:
        with _Count():
            outcore.from_arrays(arrays, workdir / f"s-{blocks}.zarr", chunk_size=8, shuffle_on_write=not global_index,
                                progress=False, overwrite=True)
    except _Counted as counted:
        return counted.args[0] / blocks
    raise AssertionError("the ingest ran no graph")


INGEST = """
import json, sys, time
import dask.array as da, h5py, numpy as np
import outcore.format.layout
outcore.format.layout.TARGET_SHARD_BYTES = 4 * 2**20
import outcore
from outcore.ingest.permute import write_order
from outcore.testing import write_h5_images
path, store, way = sys.argv[1], sys.argv[2], sys.argv[3]

def rss(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

def arrays(f, count):
    images, labels = f["images"], f["labels"]
    if way == "outcore":
        return {"images": images, "labels": labels[:count]}
    order = write_order(len(images), True, 0)
    return {"images": da.from_array(images, chunks=(256, 64, 64, 3), lock=True)[order], "labels": labels[:][order]}

with h5py.File(path, "r") as f:
    outcore.from_arrays({"images": f["images"][:200]}, store + ".warm", chunk_size=64, progress=False, overwrite=True)
    open("/proc/self/clear_refs", "w").write("5")
    before, began = rss("VmRSS"), time.perf_counter()
    outcore.from_arrays(arrays(f, len(f["images"])), store, chunk_size=64, shuffle_on_write=way == "outcore",
                        progress=False, overwrite=True)
    print(json.dumps({"seconds": time.perf_counter() - began, "extra": rss("VmHWM") - before}))
"""


def ingest(h5: Path, workdir: Path, way: str) -> dict[str, float]:
    result = subprocess.run([sys.executable, "-c", INGEST, str(h5), str(workdir / f"{way}.zarr"), way],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=24_000)
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    workdir = Path(args.workdir) / "shuffle-on-write"
    workdir.mkdir(parents=True, exist_ok=True)

    outcore.format.layout.TARGET_SHARD_BYTES = 4096  # shards of 512 samples of 8 bytes: one per source block
    print("tasks per source block of the whole ingest graph (one output shard per source block):\n")
    print(f"{'source blocks':>13s} {'global x[order]':>16s} {'outcore two-pass':>17s}")
    for blocks in (16, 64, 256):
        print(f"{blocks:13d} {tasks_per_block(blocks, workdir, True):16.1f} "
              f"{tasks_per_block(blocks, workdir, False):17.1f}")

    h5 = workdir / f"images-{args.samples}.h5"
    if not h5.exists():
        write_h5_images(h5, args.samples)
    size = args.samples * 64 * 64 * 3
    print(f"\nshuffle on write of {h5.name} ({size / 2**20:.0f} MiB of images, 4 MiB shards), fresh processes:\n")
    print(f"{'way':18s} {'seconds':>8s} {'extra peak MiB':>15s} {'file / extra':>13s}")
    for way in ("global x[order]", "outcore"):
        result = ingest(h5, workdir, way.split()[0])
        print(f"{way:18s} {result['seconds']:8.1f} {result['extra'] / 2**20:15.0f} {size / result['extra']:13.1f}")


if __name__ == "__main__":
    main()
