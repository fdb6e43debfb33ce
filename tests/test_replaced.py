"""A reader sees the store it opened, or a `StoreChangedError` naming it: never another store's bytes under
the metadata it holds, whatever replaced the store (an overwrite, a copy in place, a file-by-file copy as
rsync makes, a move), on every path (the batch iterator, the dask view, verify, DataLoader workers, Dask
workers). A store that grows (a Writer's append, which replaces its last shard) stays readable."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from support.optional import need

import outcore
from outcore.testing import write_image_folder

verify_module = importlib.import_module("outcore.cli.verify")  # the module, not the function it exports
N = 1950  # not a whole number of chunks: the last chunk and shard are partial, as an append finds them


def arrays(sign: int, n: int = N) -> dict[str, np.ndarray]:
    """Store A holds 0, 1, 2, ...; store B the same numbers negated: any sample of B read as A's is seen."""
    index = np.arange(n)
    return {"x": sign * np.repeat(index[:, None], 4, axis=1).astype(np.float32), "y": sign * index}


def overwrite(target: Path, other: Path) -> None:
    outcore.from_arrays(arrays(-1), target, chunk_size=50, overwrite=True, progress=False)


def copy_in_place(target: Path, other: Path) -> None:
    subprocess.run(["cp", "-r", f"{other}/.", f"{target}/"], check=True)


def copy_file_by_file(target: Path, other: Path) -> None:
    """As rsync does: each file copied to a temporary name beside its target, then renamed over it."""
    for source in sorted(other.rglob("*")):
        if source.is_file():
            path = target / source.relative_to(other)
            temporary = path.with_name(f".{path.name}.tmp")
            shutil.copyfile(source, temporary)
            os.replace(temporary, path)


def move(target: Path, other: Path) -> None:
    os.rename(target, target.with_name("old.zarr"))
    shutil.copytree(other, target.with_name("other-copy.zarr"))
    os.rename(target.with_name("other-copy.zarr"), target)


REPLACEMENTS = [overwrite, copy_in_place, copy_file_by_file, move]


@pytest.fixture
def stores(tmp_path):
    """Store A at ``a.zarr`` (opened by the tests) and store B, of the same shape, beside it."""
    other = tmp_path / "b.zarr"
    outcore.from_arrays(arrays(-1), other, chunk_size=50, progress=False)
    outcore.from_arrays(arrays(1), tmp_path / "a.zarr", chunk_size=50, progress=False)
    return tmp_path / "a.zarr", other


@pytest.mark.parametrize("replace", REPLACEMENTS, ids=lambda f: f.__name__)
def test_an_iterator_of_a_replaced_store_stops_with_store_changed(stores, replace):
    target, other = stores
    batches = iter(outcore.open_dataset(target).batches(50, seed=0, prefetch=1, buffer_chunks=2))
    seen = [next(batches)["y"] for _ in range(3)]
    replace(target, other)
    with pytest.raises(outcore.StoreChangedError, match=rf"{target}: shard file .* Open the dataset again"):
        seen += [batch["y"] for batch in batches]
    assert (np.concatenate(seen) >= 0).all()  # every batch before the error is store A's


@pytest.mark.parametrize("replace", REPLACEMENTS, ids=lambda f: f.__name__)
def test_a_dask_view_of_a_replaced_store_raises_store_changed(stores, replace):
    target, other = stores
    view = outcore.open_dataset(target)["y"]
    assert sorted(view.compute().tolist()) == list(range(N))
    replace(target, other)
    with pytest.raises(outcore.StoreChangedError):
        view.sum().compute()


def test_verify_of_a_store_replaced_while_it_runs_raises_store_changed(stores, monkeypatch):
    target, other = stores
    check_chunk, replacing = verify_module._check_chunk, threading.Lock()

    def replacing_after_the_first(*args):
        with replacing:  # verify checks chunks on several threads: the first to come replaces the store
            if not (target / "replaced").exists():
                copy_file_by_file(target, other)
                (target / "replaced").touch()
        return check_chunk(*args)

    monkeypatch.setattr(verify_module, "_check_chunk", replacing_after_the_first)
    with pytest.raises(outcore.StoreChangedError, match=str(target)):
        verify_module.verify(target, progress=False)


def test_a_zip_store_replaced_under_a_reader_is_still_read_as_opened(tmp_path):
    """A zip store is read through the file it opened: the new zip at its path is not mixed in."""
    target = tmp_path / "a.zarr.zip"
    outcore.from_arrays(arrays(1), target, chunk_size=50, progress=False)
    ds = outcore.open_dataset(target)
    batches = iter(ds.batches(50, seed=0, prefetch=1, buffer_chunks=2))
    seen = [next(batches)["y"] for _ in range(3)]
    outcore.from_arrays(arrays(-1), target, chunk_size=50, overwrite=True, progress=False)
    seen += [batch["y"] for batch in batches]
    assert sorted(np.concatenate(seen).tolist()) == list(range(N))
    with pytest.raises(outcore.StoreChangedError, match="the store there now is another one"):
        ds.opener()  # a worker opening it now, with the settings it was opened with


def test_a_worker_opening_a_replaced_store_raises_store_changed(stores):
    target, other = stores
    ds = outcore.open_dataset(target)
    ds.opener()  # the same store: opens
    overwrite(target, other)
    with pytest.raises(outcore.StoreChangedError, match=rf"{target} was replaced after it was opened"):
        ds.opener()


def test_a_store_a_writer_grows_stays_readable_by_its_readers(tmp_path):
    """A Writer's append replaces the shard holding the store's last samples (its partial last chunk
    rewritten): readers opened before read the old samples from it, and so do the workers they start."""
    target = tmp_path / "a.zarr"
    with outcore.Writer(target, chunk_size=50) as writer:
        writer.append(arrays(1))
    ds = outcore.open_dataset(target)
    last_shard, before = target / "y" / "c" / "0", os.stat(target / "y" / "c" / "0").st_ino
    batches = iter(ds.batches(50, shuffle=False, prefetch=1, buffer_chunks=2))
    seen = [next(batches)["y"] for _ in range(3)]
    with outcore.Writer(target, append=True) as writer:
        writer.append({name: -values[:70] for name, values in arrays(1).items()})
    assert os.stat(last_shard).st_ino != before  # the growing shard was replaced under the reader
    seen += [batch["y"] for batch in batches]
    assert np.concatenate(seen).tolist() == list(range(N))
    assert ds["y"].compute().tolist() == list(range(N))
    assert ds.opener()["y"][:N].compute().tolist() == list(range(N))  # a worker opening it: the same bytes
    assert len(outcore.open_dataset(target)) == N + 70


@pytest.mark.parametrize("images", ["pixels", "both"])
def test_an_image_store_appended_to_stays_readable_by_its_readers(tmp_path, images):
    photos, target = tmp_path / "photos", tmp_path / "a.zarr"
    write_image_folder(photos, 15, classes=("cat", "dog"), size=(24, 24), seed=1)
    ds = outcore.ingest_images(photos, target, shape=(24, 24, 3), chunk_size=4, images=images, progress=False)
    before = {name: ds[name].compute() for name in ds.fields}
    for file in write_image_folder(tmp_path / "new", 3, classes=("cat", "owl"), size=(24, 24), seed=2):
        (photos / file.parent.name).mkdir(exist_ok=True)
        file.rename(photos / file.parent.name / f"new_{file.name}")
    grown = outcore.ingest_images(photos, target, shape=(24, 24, 3), chunk_size=4, images=images, append=True,
                                  progress=False)
    assert len(grown) == 36 and len(ds) == 30
    for name in ds.fields:
        np.testing.assert_array_equal(ds[name].compute(), before[name])
        np.testing.assert_array_equal(ds.opener()[name][:30].compute(), before[name])


def test_a_growing_shard_that_is_another_stores_is_refused(tmp_path):
    """The shard a growing store replaces must keep the chunks it held: one of a store with the same
    generation but other bytes (a copy of another store's file) is refused."""
    target, other = tmp_path / "a.zarr", tmp_path / "b.zarr"
    for path, sign in ((target, 1), (other, -1)):
        with outcore.Writer(path, chunk_size=50) as writer:
            writer.append(arrays(sign))
    ds = outcore.open_dataset(target)
    assert ds["y"][:5].compute().tolist() == list(range(5))
    for name in ("x/c/0/0", "y/c/0"):
        copy = target / f"{name}.tmp"
        shutil.copyfile(other / name, copy)
        os.replace(copy, target / name)
    with pytest.raises(outcore.StoreChangedError, match="its chunks are not the ones it held"):
        ds["y"].compute()


@pytest.mark.parametrize("start", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_started_after_a_replacement_raise_store_changed(stores, start):
    need("torch")
    target, other = stores
    loader = outcore.open_dataset(target).torch(batch_size=50, num_workers=1, multiprocessing_context=start)
    overwrite(target, other)
    batches = iter(loader)
    try:
        with pytest.raises(outcore.StoreChangedError, match=rf"{target} was replaced after it was opened"):
            next(batches)
    finally:
        batches.close()  # the worker shuts down now, not at garbage collection (one: none is still starting)


@pytest.mark.e2e
def test_dask_workers_reading_a_replaced_store_raise_store_changed(stores):
    from dask.distributed import Client, LocalCluster

    target, other = stores
    ds = outcore.open_dataset(target)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert ds["y"].sum().compute() == N * (N - 1) // 2  # the workers read store A
        overwrite(target, other)
        with pytest.raises(outcore.StoreChangedError, match=str(target)):
            list(ds.batches(50, seed=0, client=client))
        with pytest.raises(outcore.StoreChangedError, match=str(target)):
            (ds["y"] + 1).sum().compute()
