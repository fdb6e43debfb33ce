"""Shuffle on write: the stored order is the seeded permutation, the task graph grows linearly with the
source's blocks, and an on-disk source larger than the memory available ingests in flat memory."""

from __future__ import annotations

import json
import subprocess
import sys

import dask.array as da
import h5py
import numpy as np
import pytest
import zarr
from dask.callbacks import Callback
from support.cgroups import throttled

import outcore
import outcore.format.layout
from outcore.ingest.permute import write_order


def _source(kind, values, path):
    if kind == "numpy":
        return values
    if kind == "dask":
        return da.from_array(values, chunks=(37, *values.shape[1:]))
    if kind == "zarr":
        array = zarr.create_array(path / "src.zarr", shape=values.shape, dtype=values.dtype,
                                  chunks=(50, *values.shape[1:]))
        array[:] = values
        return array
    file = h5py.File(path / "src.h5", "w")
    return file.create_dataset("x", data=values, chunks=(25, *values.shape[1:]))


@pytest.mark.parametrize("kind", ["numpy", "dask", "zarr", "h5py"])
def test_the_store_holds_the_source_in_the_seeded_order(kind, tmp_path, rng):
    images = rng.integers(0, 256, (1000, 4, 4, 3), dtype=np.uint8)
    labels = np.arange(1000) % 7
    ds = outcore.from_arrays({"images": _source(kind, images, tmp_path), "labels": labels}, tmp_path / "s.zarr",
                             chunk_size=16, seed=3, progress=False)
    order = write_order(1000, shuffle=True, seed=3)
    np.testing.assert_array_equal(ds["source_index"].compute(), order)
    np.testing.assert_array_equal(ds["images"].compute(), images[order])
    np.testing.assert_array_equal(ds["labels"].compute(), labels[order])
    assert not any(p.name.endswith(".permute") for p in tmp_path.iterdir())  # the scratch folder is gone
    quality = outcore.shuffle_quality(ds, batch_size=64)
    assert quality.ratio < 1.2  # as well mixed as a full random permutation


class _Counted(Exception):
    """Raised once the ingest's task graph has been counted, before any task runs."""

    def __init__(self, tasks: int, writes: int) -> None:
        super().__init__(tasks, writes)
        self.tasks, self.writes = tasks, writes


class _CountTasks(Callback):
    def _start(self, dsk) -> None:
        raise _Counted(len(dsk), sum("write_shard" in str(key) for key in dsk))


def tasks_of_a_shuffled_ingest(blocks: int, root, block: int = 512) -> int:
    """Tasks of ``from_arrays`` shuffling an on-disk zarr array of ``blocks`` blocks into as many shards."""
    source = zarr.create_array(root / f"src-{blocks}.zarr", shape=(blocks * block, 8), dtype="uint8",
                               chunks=(block, 8))
    with _CountTasks(), pytest.raises(_Counted) as counted:
        outcore.from_arrays({"x": source}, root / f"s-{blocks}.zarr", chunk_size=8, progress=False)
    assert counted.value.writes == blocks  # one shard file written per source block
    assert not (root / f"s-{blocks}.zarr").exists()
    return counted.value.tasks


def test_the_task_graph_grows_linearly_with_the_source_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(outcore.format.layout, "TARGET_SHARD_BYTES", 4096)  # shards of 512 samples of 8 bytes
    per_block = {blocks: tasks_of_a_shuffled_ingest(blocks, tmp_path) / blocks for blocks in (16, 64, 256)}
    assert per_block[256] <= per_block[16] * 1.05, per_block  # constant per block (a global x[order] made 375 at 256)
    assert per_block[256] < 10, per_block  # two fields: x and source_index


RSS_SCRIPT = """
import json, sys
import h5py
import outcore.format.layout
outcore.format.layout.TARGET_SHARD_BYTES = 4 * 2**20  # the 128 MiB cap, scaled down with the data
import outcore
from outcore.testing import write_h5_images

path, store, samples = sys.argv[1], sys.argv[2], int(sys.argv[3])
write_h5_images(path, samples)

def rss(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

with h5py.File(path, "r") as f:  # warm up: imports, thread pools and allocator arenas are not the data's
    outcore.from_arrays({"images": f["images"][:200]}, store + ".warm", chunk_size=64, progress=False)
import dask.array  # an array on disk goes through dask (`as_dask`), one in memory does not: imported where used
open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
before = rss("VmRSS")
with h5py.File(path, "r") as f:
    ds = outcore.from_arrays({"images": f["images"], "labels": f["labels"]}, store, chunk_size=64, progress=False)
shards = ds.array("images").shape[0] // ds.array("images").shards[0]
print(json.dumps({"bytes": samples * 64 * 64 * 3, "extra": rss("VmHWM") - before, "shards": shards}))
"""


def _ingest_in_a_new_process(tmp_path, samples):
    result = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tmp_path / f"{samples}.h5"),
                             str(tmp_path / f"{samples}.zarr"), str(samples)],
                            capture_output=True, text=True, timeout=600, check=True)
    return json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.portable
def test_an_h5py_file_3x_larger_than_its_memory_ingests_in_flat_memory(tmp_path):
    small, large = _ingest_in_a_new_process(tmp_path, 6_000), _ingest_in_a_new_process(tmp_path, 24_000)
    assert large["bytes"] == 4 * small["bytes"] and large["shards"] >= 4 * small["shards"] // 2
    assert large["extra"] < large["bytes"] / 3, (small, large)  # the file is more than 3x what it took
    assert large["extra"] < 1.5 * small["extra"] + 16 * 2**20, (small, large)  # flat in the file's size
    ds = outcore.open_dataset(tmp_path / "24000.zarr")
    with h5py.File(tmp_path / "24000.h5") as f:
        order = ds["source_index"][:300].compute()
        np.testing.assert_array_equal(ds["images"][:300].compute(), f["images"][np.sort(order)][np.argsort(np.argsort(order))])


MiB = 1 << 20
MAPPED_CHILD = """
import json, sys
import numpy as np
import outcore
source = np.load(sys.argv[1], mmap_mode="r")
ds = outcore.from_arrays({"x": source}, sys.argv[2], shuffle_on_write=sys.argv[3] == "1", progress=False)
order = ds["source_index"].compute() if "source_index" in ds.fields else np.arange(len(ds))
print(json.dumps({"samples": len(ds), "order": order.tolist(), "rows": ds["x"][:, :8].compute().tolist()}))
"""


@pytest.mark.slow
@pytest.mark.portable
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_memory_mapped_array_larger_than_the_memory_is_ingested_in_it(tmp_path, shuffle):
    """A NumPy file mapped into memory, twice as large as the child's memory limit (page cache included), is
    ingested: its blocks are read as the writes run, never copied whole (dask's ``from_array`` copied it, and
    the child was killed), in the stored order the seed says."""
    rows, row_bytes = 8192, 64 * 1024
    path = tmp_path / "x.npy"
    mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, row_bytes))
    for start in range(0, rows, 1024):  # each row's first 8 bytes its number, the rest a pattern
        block = np.broadcast_to(np.arange(row_bytes, dtype=np.uint8), (1024, row_bytes)).copy()
        block[:, :8] = np.arange(start, start + 1024, dtype="<u8").view(np.uint8).reshape(1024, 8)
        mapped[start : start + 1024] = block
    mapped.flush()
    del mapped
    with throttled(tmp_path, bandwidth=10**10, requests=10**6, memory=384 * MiB) as cgroup:
        out = json.loads(cgroup.run(MAPPED_CHILD, str(path), str(tmp_path / "x.zarr"), str(int(shuffle))))
    order = write_order(rows, shuffle=shuffle, seed=0)
    assert out["samples"] == rows and out["order"] == order.tolist()
    stored = np.array(out["rows"], dtype=np.uint8).view("<u8")[:, 0]
    np.testing.assert_array_equal(stored, order)
