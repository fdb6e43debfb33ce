"""Stores written to an object store (a real S3 API: moto's server on loopback): uploaded as their shards
finish, published metadata-last, replaced without a reader ever mixing two stores, and killed uploads
removed or resumed by the next run."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from support.optional import need

import outcore
from outcore.errors import NotAStoreError, OptionError, OutcoreWarning, StoreChangedError, StoreExistsError
from outcore.format import layout as layout_module
from outcore.storage import upload as upload_module
from outcore.testing import write_image_folder
from outcore.testing.s3 import S3Server

pytestmark = pytest.mark.e2e  # starts an S3 server (moto): see conftest.py

need("obstore")
need("moto.server")


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        server.create_bucket("uploads")
        yield server


@pytest.fixture(autouse=True)
def staging(tmp_path, monkeypatch):
    """Each test builds its stores in a folder of its own."""
    folder = tmp_path / "staging"
    monkeypatch.setenv(upload_module.STAGING_ENVIRONMENT, str(folder))
    return folder


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("upload") / "photos"
    write_image_folder(root, 60, classes=("a", "b", "c"), size=(20, 20), seed=5)
    return root


def _objects(s3, prefix: str) -> dict[str, dict]:
    """Every object under ``prefix`` of the bucket: key -> its metadata (size, ...) and ``generation``."""
    import obstore
    from obstore.store import from_url

    bucket = from_url("s3://uploads", client_options={"allow_http": True}, **s3.options)
    found = {}
    for batch in obstore.list(bucket, prefix=prefix):
        for meta in batch:
            attributes = obstore.get(bucket, meta["path"]).attributes
            found[meta["path"]] = {**meta, "generation": attributes.get(upload_module.GENERATION)}
    return found


def _arrays(size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(size, 5, 5)).astype("f4"), "label": rng.integers(0, 9, size)}


def _same_store(first, second) -> None:
    assert first.array_names() == second.array_names() and len(first) == len(second)
    for name in first.array_names():
        np.testing.assert_array_equal(first.array(name)[:], second.array(name)[:], err_msg=name)


def _same_epoch(first, second) -> None:
    one, two = list(first.batches(64, seed=4)), list(second.batches(64, seed=4))
    assert len(one) == len(two) > 0
    for a, b in zip(one, two, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_from_arrays_to_s3_gives_the_local_store_and_leaves_nothing_behind(s3, tmp_path, staging):
    arrays = _arrays(3000, seed=0)
    remote = outcore.from_arrays(arrays, "s3://uploads/a/train.zarr", storage_options=s3.options, chunk_size=100,
                                 progress=False)
    local = outcore.from_arrays(arrays, tmp_path / "train.zarr", chunk_size=100, progress=False)
    assert remote.location == "s3://uploads/a/train.zarr"
    _same_store(remote, local)
    _same_epoch(remote, local)
    objects = _objects(s3, "a")
    assert all(key.startswith("a/train.zarr/") for key in objects)  # no staging prefix is left
    assert len({o["generation"] for o in objects.values()}) == 1 and None not in {o["generation"] for o in objects.values()}
    shards = [key for key in objects if "/c/" in key]
    assert len(shards) == -(-3000 // local.array("x").shards[0]) + 2  # x's, and one each for label, source_index
    assert [p for p in staging.rglob("*") if p.is_file()] == []  # the local copies went as they were uploaded
    with pytest.raises(StoreExistsError, match=r"s3://uploads/a/train.zarr already exists; pass overwrite=True"):
        outcore.from_arrays(arrays, "s3://uploads/a/train.zarr", storage_options=s3.options, progress=False)


def test_the_ingest_command_writes_images_to_s3_as_a_local_ingest_would(s3, photos, tmp_path):
    from outcore.cli import main

    flags = ["--shape", "16x16x3", "--images", "both", "--chunk-size", "8", "--no-progress"]
    options = [f"--storage-option={key}={value}" for key, value in s3.options.items()]
    assert main(["ingest", str(photos), "s3://uploads/cli/photos.zarr", *flags, *options]) == 0
    assert main(["ingest", str(photos), str(tmp_path / "photos.zarr"), *flags]) == 0
    remote = outcore.open_dataset("s3://uploads/cli/photos.zarr", storage_options=s3.options, cache_dir=False)
    local = outcore.open_dataset(tmp_path / "photos.zarr")
    _same_store(remote, local)
    _same_epoch(remote, local)
    assert main(["verify", "s3://uploads/cli/photos.zarr", *options, "--no-cache", "--no-progress"]) == 0


def test_a_failed_ingest_leaves_no_store_and_no_objects(s3):
    def explode(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 5:
            raise RuntimeError("source went away")
        return block

    x = da.from_array(np.arange(2000.0), chunks=100).map_blocks(explode, dtype="f8")
    with pytest.raises(RuntimeError, match="source went away"):
        outcore.from_arrays({"x": x}, "s3://uploads/failed.zarr", storage_options=s3.options, chunk_size=100,
                            shuffle_on_write=False, progress=False)
    with pytest.raises(NotAStoreError):
        outcore.open_dataset("s3://uploads/failed.zarr", storage_options=s3.options)
    assert not any("failed" in key for key in _objects(s3, ""))  # neither the store nor the run's staged shards


def test_an_overwrite_never_lets_a_reader_mix_the_two_stores(s3):
    url = "s3://uploads/over.zarr"
    old = _arrays(4000, seed=1)
    outcore.from_arrays(old, url, storage_options=s3.options, chunk_size=100, progress=False)
    reader = outcore.open_dataset(url, storage_options=s3.options, cache_dir=False)
    np.testing.assert_array_equal(reader["x"][:100].compute(), old["x"][reader["source_index"][:100].compute()])
    new = _arrays(1000, seed=2)
    outcore.from_arrays(new, url, storage_options=s3.options, chunk_size=100, overwrite=True, progress=False)
    with pytest.raises(StoreChangedError, match=r"s3://uploads/over.zarr/.* open the dataset again"):
        list(reader.batches(100, seed=3))  # shards it knew and shards it did not: all of another store
    reopened = outcore.open_dataset(url, storage_options=s3.options, cache_dir=False)
    assert len(reopened) == 1000
    np.testing.assert_array_equal(reopened["x"].compute(), new["x"][reopened["source_index"].compute()])
    objects = _objects(s3, "over.zarr")
    assert len({o["generation"] for o in objects.values()}) == 1  # the old store's extra shards were deleted


def test_a_publish_cut_short_leaves_readers_an_error_never_new_bytes(s3, monkeypatch):
    url = "s3://uploads/cut.zarr"
    old = _arrays(2000, seed=3)
    outcore.from_arrays(old, url, storage_options=s3.options, chunk_size=100, shuffle_on_write=False, progress=False)
    put = upload_module.Upload._put_file

    def lost_before_the_metadata(self, path, key):
        if key.endswith("zarr.json") and not key.startswith(self.staging):
            raise OSError("connection lost")
        put(self, path, key)

    monkeypatch.setattr(upload_module.Upload, "_put_file", lost_before_the_metadata)
    with pytest.raises(OSError, match="connection lost"):
        outcore.from_arrays(_arrays(2000, seed=4), url, storage_options=s3.options, chunk_size=100,
                            shuffle_on_write=False, overwrite=True, progress=False)
    monkeypatch.undo()
    reader = outcore.open_dataset(url, storage_options=s3.options, cache_dir=False)  # the old metadata
    with pytest.raises(StoreChangedError, match="another version of the store"):
        reader["x"][:100].compute()  # its shards were replaced: an error, not the new values
    outcore.from_arrays(old, url, storage_options=s3.options, chunk_size=100, shuffle_on_write=False,
                        overwrite=True, progress=False)  # the next run mends it
    np.testing.assert_array_equal(outcore.open_dataset(url, storage_options=s3.options)["x"].compute(), old["x"])


SLOW_INGEST = """
import sys, time
import outcore.ingest.build as build
from outcore.cli import main

write = build._write_shard
def slowly(*args):  # every shard takes a while, so the test can kill the run between two of them
    result = write(*args)
    time.sleep(1.0)
    return result
build._write_shard = slowly
sys.exit(main(sys.argv[1:]))
"""


def _killed_upload(s3, photos, url, staging) -> None:
    """A CLI ingest to ``url`` killed (SIGKILL) after its second shard was uploaded."""
    command = ["ingest", str(photos), url, "--shape", "16x16x3", "--chunk-size", "4", "--no-progress",
               *(f"--storage-option={key}={value}" for key, value in s3.options.items())]
    process = subprocess.Popen([sys.executable, "-c", SLOW_INGEST, *command])
    deadline = time.monotonic() + 120
    while len(list(staging.glob("*/.*.partial-*.run/done/shard-*.json"))) < 2:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.kill()
    process.wait()


def _ingest(s3, photos, url, **options):
    return outcore.ingest_images(photos, url, shape=(16, 16, 3), chunk_size=4, storage_options=s3.options,
                                 progress=False, **options)


def test_a_killed_upload_is_not_a_store_and_resume_continues_it(s3, photos, staging, tmp_path):
    _killed_upload(s3, photos, "s3://uploads/killed.zarr", staging)
    with pytest.raises(NotAStoreError):
        outcore.open_dataset("s3://uploads/killed.zarr", storage_options=s3.options)
    staged = _objects(s3, "")
    runs = {key.split("/")[0] for key in staged if key.startswith(".killed.zarr.partial-")}
    assert len(runs) == 1 and not any(key.startswith("killed.zarr/") for key in staged)
    resumed = _ingest(s3, photos, "s3://uploads/killed.zarr", resume=True)
    uninterrupted = outcore.ingest_images(photos, tmp_path / "u.zarr", shape=(16, 16, 3), chunk_size=4, progress=False)
    _same_store(resumed, uninterrupted)
    assert {o["generation"] for o in _objects(s3, "killed.zarr").values()} == {runs.pop().rpartition("-")[2]}
    assert not any(key.startswith(".killed.zarr") for key in _objects(s3, ""))
    assert [p for p in staging.rglob("*") if p.is_file()] == []


def test_the_next_run_removes_a_killed_upload_and_says_so(s3, photos, staging):
    _killed_upload(s3, photos, "s3://uploads/again.zarr", staging)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = _ingest(s3, photos, "s3://uploads/again.zarr")
    said = sorted(str(w.message) for w in caught if w.category is OutcoreWarning)
    assert len(said) == 2, said
    assert said[0].startswith("removed what an interrupted ingest of s3://uploads/again.zarr left behind")
    assert "; resume=True continues such a run" in said[0] and said[0].count("uploads/again.zarr") >= 1
    assert said[1].startswith("removed what an interrupted upload of s3://uploads/again.zarr left behind")
    assert len(ds) == 180 and not any(key.startswith(".again.zarr") for key in _objects(s3, ""))


def test_an_upload_of_another_machine_is_left_until_it_is_stale(s3, photos, monkeypatch):
    import obstore
    from obstore.store import from_url

    bucket = from_url("s3://uploads", client_options={"allow_http": True}, **s3.options)
    obstore.put(bucket, ".shared.zarr.partial-elsewhere/x/c/0", b"a shard of a run on another machine")
    with pytest.warns(OutcoreWarning, match=r"another ingest may be uploading s3://uploads/shared.zarr"):
        _ingest(s3, photos, "s3://uploads/shared.zarr")
    assert ".shared.zarr.partial-elsewhere/x/c/0" in _objects(s3, ".shared.zarr.partial-elsewhere")
    monkeypatch.setattr(upload_module, "STALE_SECONDS", 0)
    with pytest.warns(OutcoreWarning, match="removed what an interrupted upload"):
        _ingest(s3, photos, "s3://uploads/shared.zarr", overwrite=True)
    assert _objects(s3, ".shared.zarr.partial-elsewhere") == {}


@pytest.mark.parametrize(("location", "message"), [
    ("https://example.com/train.zarr", "an https:// location is read-only"),
    ("s3://uploads", r"name a store inside the bucket"),
    ("s3://uploads/train.zip", "outcore writes folder stores to object stores"),
    ("ftp://host/train.zarr", "outcore writes stores to local paths and to object stores"),
])
def test_locations_that_cannot_be_written_are_refused_before_any_work(location, message, tmp_path):
    with pytest.raises(OptionError, match=message):
        outcore.from_arrays({"x": np.arange(10)}, location, progress=False)
    assert not Path("ftp:").exists() and not Path("https:").exists()


def _rows(start: int, stop: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, stop)
    return {"v": np.repeat(ids[:, None], 3, axis=1).astype("f4"), "id": ids}


def test_a_writer_grows_a_store_in_s3_that_readers_read_up_to_its_count(s3, staging, monkeypatch):
    # shards of 8 chunks of 50 rows, not 1,024: each read below asks moto for a few chunks, not a thousand
    monkeypatch.setattr(layout_module, "MAX_CHUNKS_PER_SHARD", 8)
    url = "s3://uploads/grown.zarr"
    specs = {"v": ("float32", (3,)), "id": ("int64", ())}

    def read():
        ds = outcore.open_dataset(url, storage_options=s3.options, cache_dir=False)
        return ds["id"].compute() if len(ds) else np.array([], dtype="int64")

    with outcore.Writer(url, specs, storage_options=s3.options, chunk_size=50) as writer:
        shard = writer._shard_size
        assert len(read()) == 0  # an empty store is there from the start
        writer.append(_rows(0, shard + 10))
        np.testing.assert_array_equal(read(), np.arange(shard))  # the full shard is published, the rest waits
        kept = [p for p in staging.rglob("*") if p.is_file() and "/c/" in p.as_posix()]
        assert kept == []  # a full shard is in the object store only
        writer.flush()
        np.testing.assert_array_equal(read(), np.arange(shard + 10))
    with outcore.Writer(url, append=True, storage_options=s3.options) as writer:
        writer.append(_rows(shard + 10, 2 * shard + 5))
    np.testing.assert_array_equal(read(), np.arange(2 * shard + 5))
    ds = outcore.open_dataset(url, storage_options=s3.options, cache_dir=False)
    np.testing.assert_array_equal(ds["v"][:, 1].compute(), np.arange(2 * shard + 5))
    assert len({o["generation"] for o in _objects(s3, "grown.zarr").values()}) == 1  # appends keep the generation
    with pytest.raises(StoreExistsError, match=r"s3://uploads/grown.zarr already exists; pass append=True"):
        outcore.Writer(url, specs, storage_options=s3.options)
    with outcore.Writer(url, specs, storage_options=s3.options, overwrite=True) as writer:
        writer.append(_rows(100, 130))
    np.testing.assert_array_equal(read(), np.arange(100, 130))
    assert len({o["generation"] for o in _objects(s3, "grown.zarr").values()}) == 1  # nothing of the old store


def test_appending_to_a_store_whose_last_shard_is_gone_is_an_error_not_zeros(s3):
    import obstore
    from obstore.store import from_url

    url = "s3://uploads/holed.zarr"
    with outcore.Writer(url, {"v": ("float32", (3,)), "id": ("int64", ())}, storage_options=s3.options,
                        chunk_size=50) as writer:
        writer.append(_rows(0, writer._shard_size + 10))  # the last shard holds 10 published samples
    bucket = from_url("s3://uploads", client_options={"allow_http": True}, **s3.options)
    obstore.delete(bucket, "holed.zarr/id/c/1")
    with pytest.raises(outcore.CorruptChunkError, match=r"s3://uploads/holed.zarr/id/c/1 is missing, but the store"):
        outcore.Writer(url, append=True, storage_options=s3.options)
