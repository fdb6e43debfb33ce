"""A disk that fills while a store is written, on a small tmpfs mounted for the test (root only): every
write path (a Writer, an append, splits, the node cache) gives one `StorageError` naming the store and
the free space, keeps what was committed before, and leaves nothing a rerun trips over."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.optional import need

import outcore
from outcore.ingest import append
from outcore.storage import ChunkCache
from outcore.storage.cache import FULL_SECONDS
from outcore.storage.small_rows import SmallColumn
from outcore.storage.staging import storage_error
from outcore.testing import write_image_folder


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs at ``tmp_path / "disk"``; ``fill(path)`` takes its free space but ``leave`` bytes."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root, which this test runs without")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Take the disk's free space but ``leave`` bytes, with one file; remove it to free the space."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free - leave
    with open(filler, "wb") as file:
        try:
            file.write(b"\0" * max(0, free))
        except OSError:
            pass
    return filler


def frames(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Samples that do not compress: 16 KiB each."""
    return {"x": np.random.default_rng(seed).integers(0, 256, (count, 16, 16, 64), dtype=np.uint8)}


def test_a_writer_that_fills_the_disk_keeps_what_it_published_and_goes_on_after(small_disk):
    location = small_disk / "w.zarr"
    written = frames(32)
    with outcore.Writer(location, chunk_size=64) as writer:
        writer.append(written)  # 512 KiB, in a shard that each flush replaces
    filler = fill(small_disk, leave=300_000)
    with pytest.raises(outcore.StorageError, match=rf"writing the store {location} failed: No space left on device; "
                                                   r"free some space there \(it has \d+ MiB free\).*It keeps the 32 "
                                                   r"samples published before.*append=True goes on"), \
            outcore.Writer(location, append=True) as writer:
        for i in range(20):
            writer.append(frames(64, seed=i + 1))
    ds = outcore.open_dataset(location)
    assert len(ds) == 32 and not outcore.verify(location, progress=False).problems
    np.testing.assert_array_equal(ds["x"].compute(), written["x"])
    filler.unlink()
    with outcore.Writer(location, append=True) as writer:
        writer.append(frames(64, seed=9))
    assert len(outcore.open_dataset(location)) == 96


def test_a_writer_that_cannot_write_its_first_shard_leaves_no_store(small_disk):
    location = small_disk / "w.zarr"
    filler = fill(small_disk, leave=100_000)
    with pytest.raises(outcore.StorageError, match=rf"No space left on device.*Nothing was left at {location}"), \
            outcore.Writer(location, chunk_size=64) as writer:
        writer.append(frames(64))
        writer.flush()
    assert not location.exists()
    filler.unlink()
    with outcore.Writer(location, chunk_size=64) as writer:  # the same Writer runs again, trips over nothing
        writer.append(frames(64))
    assert len(outcore.open_dataset(location)) == 64


def test_the_small_fields_rows_saved_on_a_full_disk_say_no_space_left(small_disk):
    """A task's rows of the small fields (`SmallColumn`) saved on a full disk: ENOSPC, whose advice
    `storage_error` gives (numpy's ``tofile`` said only "16384 requested and 0 written", without an errno)."""
    column = SmallColumn(str(small_disk), "paths", "<U64", ())
    fill(small_disk)
    with pytest.raises(OSError) as raised:
        column[0:1000] = np.full(1000, "x" * 64)
    assert raised.value.errno == errno.ENOSPC
    assert "No space left on device; free some space there" in str(storage_error(raised.value, small_disk / "s.zarr"))


def test_a_failure_without_an_errno_is_one_line_that_names_the_store(tmp_path):
    error = storage_error(OSError("16384 requested and 0 written"), tmp_path / "s.zarr")
    assert str(error).startswith(f"writing the store {tmp_path / 's.zarr'} failed: 16384 requested and 0 written; "
                                 "check the location and the disk")


@pytest.fixture
def photos(tmp_path):
    root = tmp_path / "photos"
    write_image_folder(root, 60, classes=("a", "b"), size=(48, 48), kind="photos", seed=1)
    return root


def test_an_append_that_fills_the_disk_keeps_the_store_as_it_was(small_disk, photos, tmp_path):
    location = small_disk / "i.zarr"
    ds = outcore.ingest_images(photos, location, shape=(40, 40, 3), chunk_size=16, progress=False)
    before = ds["images"].compute()
    for file in write_image_folder(tmp_path / "new", 400, classes=("a", "b"), size=(48, 48), kind="photos", seed=2):
        file.rename(photos / file.parent.name / f"new_{file.name}")
    with pytest.raises(outcore.StorageError, match=rf"writing the store {location} failed: No space left on device.*"
                                                   r"It keeps its 120 samples as they were.*run the same append"):
        outcore.ingest_images(photos, location, shape=(40, 40, 3), chunk_size=16, append=True, progress=False)
    assert sorted(path.name for path in small_disk.iterdir()) == [".i.zarr.writer-lock", "i.zarr"]
    again = outcore.open_dataset(location)
    assert len(again) == 120 and not outcore.verify(location, progress=False).problems
    np.testing.assert_array_equal(again["images"].compute(), before)


def test_an_append_s_failure_without_an_errno_is_named_once_with_what_the_store_keeps(tmp_path, photos, monkeypatch):
    """A write that fails without an errno is one line already (`storage_error`): the append says what the store
    keeps after it, instead of wrapping it in a second 'writing the store ... failed'."""
    location = tmp_path / "i.zarr"
    outcore.ingest_images(photos, location, shape=(40, 40, 3), chunk_size=16, progress=False)
    part = tmp_path / ".i.zarr.append.zarr"

    def fails(*args, **kwargs):
        raise storage_error(OSError("16384 requested and 0 written"), part)

    monkeypatch.setattr(append, "_append", fails)
    with pytest.raises(outcore.StorageError) as raised:
        outcore.ingest_images(photos, location, shape=(40, 40, 3), chunk_size=16, append=True, progress=False)
    message = str(raised.value)
    assert message.startswith(f"writing the store {part} failed: 16384 requested and 0 written; ")
    assert message.count("failed") == 1 and "\n" not in message
    assert f"The store {location} keeps its 120 samples as they were" in message
    assert len(outcore.open_dataset(location)) == 120


def test_splits_that_fill_the_disk_keep_the_splits_written_and_a_resume_writes_the_rest(small_disk, photos):
    options = {"split": {"train": 0.5, "val": 0.5}, "shape": (40, 40, 3), "chunk_size": 16, "progress": False}
    filler = fill(small_disk, leave=700_000)  # room for one split's 60 pictures (280 KiB), not for two
    with pytest.raises(outcore.StorageError, match=r"No space left on device.*The splits written before it are kept "
                                                   r"\(train\).*resume=True"):
        outcore.ingest_splits(photos, small_disk / "splits", **options)
    kept = outcore.open_dataset(small_disk / "splits" / "train.zarr")
    assert sorted(path.name for path in (small_disk / "splits").iterdir()) == ["train.zarr", "train.zarr.skipped.txt"] \
        or sorted(path.name for path in (small_disk / "splits").iterdir()) == ["train.zarr"]
    filler.unlink()
    with pytest.warns(outcore.OutcoreWarning, match="already complete"):
        stores = outcore.ingest_splits(photos, small_disk / "splits", resume=True, **options)
    assert stores["train"].attrs.generation == kept.attrs.generation  # kept as it was
    assert len(stores["train"]) + len(stores["val"]) == 120


def test_the_node_cache_on_a_full_disk_returns_every_range_and_keeps_them_again_once_there_is_room(small_disk):
    cache = ChunkCache(small_disk / "cache", max_bytes=10**9)
    filler = fill(small_disk)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(20):
            value = bytes([i]) * 50_000
            assert bytes(cache.get_or_fetch(f"range-{i}", 50_000, lambda value=value: value)) == value
    assert len(caught) == 1 and "cannot keep what is fetched" in str(caught[0].message)
    filler.unlink()
    time.sleep(FULL_SECONDS)  # a full disk is looked at again after a moment, not at every read
    for i in range(20):
        value = bytes([i]) * 50_000
        assert bytes(cache.get_or_fetch(f"range-{i}", 50_000, lambda value=value: value)) == value
    assert cache.usage().entries == 20


@pytest.mark.e2e
def test_stores_bound_for_an_object_store_name_the_url_and_the_full_staging_folder(small_disk, monkeypatch):
    need("moto.server")
    need("obstore")
    from outcore.storage.upload import STAGING_ENVIRONMENT
    from outcore.testing.s3 import S3Server

    monkeypatch.setenv(STAGING_ENVIRONMENT, str(small_disk / "staging"))
    with S3Server() as server:
        server.create_bucket("bucket")
        with pytest.raises(outcore.StorageError, match=r"writing the store s3://bucket/a.zarr failed in its local "
                                                       rf"staging folder {small_disk}/staging/\w+: No space left on "
                                                       r"device.*\$OUTCORE_STAGING_DIR.*Nothing was left at "
                                                       r"s3://bucket/a.zarr"):
            outcore.from_arrays(frames(300), "s3://bucket/a.zarr", storage_options=server.options,
                                compression="none", progress=False)
        with pytest.raises(outcore.NotAStoreError):
            outcore.open_dataset("s3://bucket/a.zarr", storage_options=server.options, cache_dir=False)
        with pytest.raises(outcore.StorageError, match=r"s3://bucket/w.zarr failed in its local staging folder.*"
                                                       r"It keeps the 64 samples published before"), \
                outcore.Writer("s3://bucket/w.zarr", storage_options=server.options, chunk_size=64) as writer:
            writer.append(frames(64))
            writer.flush()
            for i in range(10):
                writer.append(frames(64, seed=i + 1))
        kept = outcore.open_dataset("s3://bucket/w.zarr", storage_options=server.options, cache_dir=False)
        np.testing.assert_array_equal(kept["x"].compute(), frames(64)["x"])
