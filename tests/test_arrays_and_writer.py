"""`outcore.from_arrays` from numpy, dask, zarr and h5py, and `outcore.Writer`: a store grown batch by batch,
readable while it grows, reopened and appended to; casts that would change values refused."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import dask.array as da
import h5py
import numpy as np
import pytest
import zarr
from support.rules import write_order

import outcore
from outcore.cli import describe
from outcore.errors import SourceError, StoreExistsError
from outcore.ingest.writer import cast_values
from outcore.storage.groups import shard_path


@pytest.fixture
def arrays(rng):
    return {"images": rng.integers(0, 256, (1000, 4, 4, 3), dtype=np.uint8), "labels": rng.integers(0, 10, 1000)}


def _check_shuffled(ds, arrays, seed=0):
    order = write_order(len(ds), seed)  # the documented rule, not outcore's own
    np.testing.assert_array_equal(ds["source_index"].compute(), order)
    for name, values in arrays.items():
        np.testing.assert_array_equal(ds[name].compute(), np.asarray(values)[order])


def test_from_numpy(arrays, tmp_path):
    ds = outcore.from_arrays(arrays, tmp_path / "a.zarr", chunk_size=64, progress=False)
    _check_shuffled(ds, arrays)
    assert ds.roles == {"images": "input", "labels": "target", "source_index": "metadata"}
    assert ds.chunk_size == 64 and ds["images"].chunks[0][:2] == (64, 64)


def test_from_dask_and_zarr(arrays, tmp_path):
    lazy = {name: da.from_array(values, chunks=130) for name, values in arrays.items()}
    _check_shuffled(outcore.from_arrays(lazy, tmp_path / "d.zarr", seed=3, progress=False), arrays, seed=3)
    z = zarr.open_array(tmp_path / "plain.zarr", mode="w", shape=(1000, 4, 4, 3), dtype="uint8", chunks=(100, 4, 4, 3))
    z[:] = arrays["images"]
    ds = outcore.from_arrays({"images": z}, tmp_path / "z.zarr", shuffle_on_write=False, progress=False)
    np.testing.assert_array_equal(ds["images"].compute(), arrays["images"])
    assert "source_index" not in ds


def test_from_h5py(arrays, tmp_path):
    with h5py.File(tmp_path / "data.h5", "w") as f:
        for name, values in arrays.items():
            f.create_dataset(name, data=values, chunks=True)
    with h5py.File(tmp_path / "data.h5", "r") as f:
        ds = outcore.from_arrays({"images": f["images"], "labels": f["labels"]}, tmp_path / "h.zarr", progress=False)
    _check_shuffled(ds, arrays)


def test_from_arrays_errors(arrays, tmp_path):
    with pytest.raises(SourceError, match="same number of samples"):
        outcore.from_arrays({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "x.zarr")
    with pytest.raises(SourceError, match="dtype object"):
        outcore.from_arrays({"a": np.array([{}, []], dtype=object)}, tmp_path / "x.zarr")
    with pytest.raises(SourceError, match=r"\['nope'\]"):
        outcore.from_arrays(arrays, tmp_path / "x.zarr", roles={"nope": "input"})
    outcore.from_arrays(arrays, tmp_path / "x.zarr", progress=False)
    with pytest.raises(StoreExistsError):
        outcore.from_arrays(arrays, tmp_path / "x.zarr")


def test_writer_uneven_batches_then_reopen_and_append(tmp_path, rng):
    batches = [rng.normal(size=(n, 3)).astype(np.float32) for n in (1, 17, 5, 300, 2, 64)]
    with outcore.Writer(tmp_path / "p.zarr", specs={"emb": ("float32", (3,)), "id": ("int64", ())},
                        chunk_size=16) as writer:
        start = 0
        for batch in batches[:4]:
            writer.append({"emb": batch, "id": np.arange(start, start + len(batch))})
            start += len(batch)
        assert len(writer) == 323
    ds = outcore.open_dataset(tmp_path / "p.zarr")
    assert len(ds) == 323 and ds.chunk_size == 16
    with outcore.Writer(tmp_path / "p.zarr", append=True) as writer:
        for batch in batches[4:]:
            writer.append({"emb": batch, "id": np.arange(start, start + len(batch))})
            start += len(batch)
    ds = outcore.open_dataset(tmp_path / "p.zarr")
    np.testing.assert_array_equal(ds["emb"].compute(), np.concatenate(batches))
    np.testing.assert_array_equal(ds["id"].compute(), np.arange(389))
    assert outcore.verify(tmp_path / "p.zarr", progress=False).ok


def test_writer_is_readable_while_it_grows_and_infers_fields(tmp_path):
    writer = outcore.Writer(tmp_path / "g.zarr", chunk_size=4)
    writer.append({"x": np.arange(10, dtype=np.int32)})
    shard = writer._shard_size
    writer.append({"x": np.arange(10, shard + 3, dtype=np.int32)})
    assert len(outcore.open_dataset(tmp_path / "g.zarr")) == shard  # one whole shard written so far
    writer.append({"x": np.arange(shard + 3, 3 * shard + 5, dtype=np.int32)})
    assert len(outcore.open_dataset(tmp_path / "g.zarr")) == 3 * shard  # each shard written once it is whole
    writer.close()
    ds = outcore.open_dataset(tmp_path / "g.zarr")
    np.testing.assert_array_equal(ds["x"].compute(), np.arange(3 * shard + 5))
    with pytest.raises(ValueError, match="closed"):
        writer.append({"x": np.arange(2, dtype=np.int32)})


def test_writer_errors(tmp_path):
    with outcore.Writer(tmp_path / "w.zarr", specs={"x": ("float32", (2,))}) as writer:
        with pytest.raises(SourceError, match=r"fields \['y'\]"):
            writer.append({"y": np.zeros((1, 2))})
        with pytest.raises(SourceError, match=r"shape \(3,\), the store's \(2,\)"):
            writer.append({"x": np.zeros((1, 3))})
        with pytest.raises(SourceError, match="cannot store complex128"):
            writer.append({"x": np.zeros((1, 2), dtype=complex)})
    with pytest.raises(StoreExistsError, match="append=True"):
        outcore.Writer(tmp_path / "w.zarr")
    with pytest.raises(ValueError, match="directory stores"):
        outcore.Writer(tmp_path / "w.zarr.zip")


def test_a_cast_that_changes_values_is_refused_naming_field_and_dtypes(tmp_path):
    """int64 300 appended to an int8 field was stored as 44 (numpy's same_kind casting)."""
    with outcore.Writer(tmp_path / "c.zarr", specs={"label": ("int8", ()), "score": ("float32", ()),
                                                    "count": ("uint16", ())}) as writer:
        writer.append({"label": np.array([1, 2]), "score": np.array([0.1, 0.2]), "count": np.array([3, 4])})
        with pytest.raises(SourceError, match=r"field 'label': the int64 values 1\.\.300 do not fit its int8"):
            writer.append({"label": np.array([1, 300]), "score": np.zeros(2), "count": np.zeros(2, int)})
        with pytest.raises(SourceError, match=r"field 'count': the int64 values -1\.\.0 do not fit its uint16"):
            writer.append({"label": np.zeros(2, int), "score": np.zeros(2), "count": np.array([-1, 0])})
        with pytest.raises(SourceError, match=r"field 'score': some float64 values are beyond the range of its float32"):
            writer.append({"label": np.zeros(2, int), "score": np.array([1e300, 0]), "count": np.zeros(2, int)})
        with pytest.raises(SourceError, match=r"field 'label': cannot store float64 values in its int8 field"):
            writer.append({"label": np.array([1.5, 2]), "score": np.zeros(2), "count": np.zeros(2, int)})
    ds = outcore.open_dataset(tmp_path / "c.zarr")
    assert ds["label"].compute().tolist() == [1, 2] and ds["count"].compute().tolist() == [3, 4]
    np.testing.assert_allclose(ds["score"].compute(), [0.1, 0.2], rtol=1e-6)  # float64 rounded to float32: kept


def test_a_second_writer_is_refused_while_the_first_holds_the_store(tmp_path):
    import subprocess
    import sys

    first = outcore.Writer(tmp_path / "s.zarr", specs={"x": ("int32", ())})
    first.append({"x": np.arange(3)})
    with pytest.raises(outcore.StoreBusyError, match="another writer"):
        outcore.Writer(tmp_path / "s.zarr", append=True)
    with pytest.raises(outcore.StoreBusyError, match="another writer"):
        outcore.Writer(tmp_path / "s.zarr", overwrite=True)
    other = subprocess.run([sys.executable, "-c", "import outcore, sys; outcore.Writer(sys.argv[1], append=True)",
                            str(tmp_path / "s.zarr")], check=False, capture_output=True, text=True,
                           timeout=120)
    assert other.returncode != 0 and "StoreBusyError" in other.stderr  # another process: refused too
    first.close()
    with outcore.Writer(tmp_path / "s.zarr", append=True) as second:
        second.append({"x": np.arange(3, 5)})
    assert outcore.open_dataset(tmp_path / "s.zarr")["x"].compute().tolist() == [0, 1, 2, 3, 4]


def test_interrupted_writer_store_opens_with_recorded_samples(tmp_path):
    subprocess.run([sys.executable, "-c", DYING_WRITER, str(tmp_path / "c.zarr")], check=True, timeout=120)
    ds = outcore.open_dataset(tmp_path / "c.zarr")
    np.testing.assert_array_equal(ds["x"].compute(), np.arange(8))
    assert ds.unpublished() == 4 and "4 sample(s) written beyond the published count" in describe(ds)
    with outcore.Writer(tmp_path / "c.zarr", append=True):  # another Writer, closed without writing:
        pass
    ds = outcore.open_dataset(tmp_path / "c.zarr")  # what the dead one left is cut away, the mark cleared
    assert len(ds) == 8 and ds.unpublished() == 0 and not ds.attrs.growing


DYING_WRITER = """
import os, sys
import numpy as np, zarr
import outcore
writer = outcore.Writer(sys.argv[1], chunk_size=4)
writer.append({"x": np.arange(8)})
writer.flush()  # written and published
zarr.open_group(sys.argv[1], mode="r+")["x"].resize((12,))  # the next samples written, their count not yet
os._exit(0)  # the process dies there, its Writer never closed
"""


def test_a_count_that_disagrees_with_the_arrays_is_refused_naming_both(tmp_path):
    """A store whose recorded num_samples was edited (to 0, or to fewer than it holds) would hide samples
    and pass verify; one edited upwards would claim samples it does not hold."""
    outcore.from_arrays({"x": np.arange(2000), "y": np.arange(2000) % 7}, tmp_path / "s.zarr", chunk_size=64,
                        progress=False)
    with outcore.Writer(tmp_path / "w.zarr", chunk_size=4) as writer:
        writer.append({"x": np.arange(10)})
    attrs = zarr.open_group(tmp_path / "s.zarr", mode="r").attrs.asdict()["outcore"]
    for location, count in ((tmp_path / "s.zarr", 0), (tmp_path / "s.zarr", 1000), (tmp_path / "w.zarr", 4)):
        group = zarr.open_group(location, mode="r+")
        group.attrs["outcore"] = {**group.attrs.asdict()["outcore"], "num_samples": count}
        with pytest.raises(outcore.NotAStoreError, match=rf"its attributes say num_samples {count:,} .* holds "
                                                         r"[\d,]+ entries where that count needs"):
            outcore.open_dataset(location)
        report = outcore.verify(location, progress=False)  # a problem, not "OK"
        assert not report.ok and f"num_samples {count:,}" in str(report)
    group = zarr.open_group(tmp_path / "s.zarr", mode="r+")
    group.attrs["outcore"] = {**attrs, "num_samples": 3000}
    with pytest.raises(outcore.NotAStoreError, match=r"holds fewer than the 3,000 it must"):
        outcore.open_dataset(tmp_path / "s.zarr")


def test_an_open_reader_of_a_growing_store_reads_a_replaced_shard_right(tmp_path):
    """A Writer replaces its last shard file as it grows; a reader that read that shard's index before
    must read the new file right, not call the chunk corrupt."""
    writer = outcore.Writer(tmp_path / "g.zarr", chunk_size=16)
    writer.append({"x": np.arange(37)})
    writer.flush()
    reader = outcore.open_dataset(tmp_path / "g.zarr").shard_reader("x")
    assert reader.read(2).tolist() == [32, 33, 34, 35, 36]
    writer.append({"x": np.arange(37, 74)})
    writer.flush()
    assert reader.read(2).tolist() == [32, 33, 34, 35, 36]  # the reader's store still has 37 samples
    writer.close()


REPLACING = """
import os
import sys
import time

target, versions = sys.argv[1], [open(path, "rb").read() for path in sys.argv[2:]]
deadline = time.monotonic() + 60
for count in range(10_000_000):  # as a Writer replaces its last shard file, in one rename, at every flush
    if count % 100 == 0 and (os.path.exists(target + ".stop") or time.monotonic() > deadline):
        break
    with open(target + ".new", "wb") as file:
        file.write(versions[count % len(versions)])
    os.replace(target + ".new", target)
"""


@pytest.mark.slow
@pytest.mark.portable
def test_a_shard_file_replaced_again_and_again_is_never_called_corrupt(tmp_path):
    """A process replaces a shard file as fast as it can with its two versions (37 and 74 samples, the
    chunk of samples 32..47 different in each); readers reading its index and chunks meanwhile, each with
    its own index, must read the 37 samples right every time: the index and the size it is checked against
    come from one version of the file, and a chunk that fails on a newer version is read again."""
    with outcore.Writer(tmp_path / "g.zarr", chunk_size=16) as writer:
        writer.append({"x": np.arange(37)})
        writer.flush()
        ds = outcore.open_dataset(tmp_path / "g.zarr")
        shard = tmp_path / "g.zarr" / shard_path(ds.shard_reader("x").array, 0)
        (tmp_path / "short").write_bytes(shard.read_bytes())
        writer.append({"x": np.arange(37, 74)})
    replacer = subprocess.Popen([sys.executable, "-c", REPLACING, str(shard), str(tmp_path / "short"), str(shard)])
    problems, reads = [], [0]

    def read_in_a_loop():
        while replacer.poll() is None and reads[0] < 1_500:
            reader = ds.shard_reader("x")  # a new reader reads the shard's index anew
            try:
                values = [reader.read(chunk).tolist() for chunk in (2, 0, 2, 1, 2)]
            except outcore.CorruptChunkError as error:
                problems.append(str(error))
                continue
            if values != [list(range(32, 37)), list(range(16)), list(range(32, 37)), list(range(16, 32)),
                          list(range(32, 37))]:
                problems.append(f"wrong values {values}")
            reads[0] += 1

    readers = [threading.Thread(target=read_in_a_loop) for _ in range(2)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    Path(f"{shard}.stop").touch()
    assert replacer.wait(timeout=30) == 0
    assert problems[:3] == [] and reads[0] >= 1_000, f"{len(problems)} problems"


GROWING = """
import sys
import numpy as np
import outcore

with outcore.Writer(sys.argv[1], chunk_size=16) as writer:
    for start in range(0, int(sys.argv[2]), 37):  # batches that end anywhere in a chunk, each flushed
        rows = np.arange(start, start + 37)
        writer.append({"x": np.stack([rows, rows * 2], axis=1), "id": rows})
        writer.flush()
print(len(writer))
"""


@pytest.mark.slow
def test_readers_of_a_growing_store_see_a_consistent_prefix(tmp_path):
    """One Writer appends, flushing after every batch; four readers open and read the store in a loop:
    never a false corruption alarm, every read a prefix of the final store."""
    location = tmp_path / "growing.zarr"
    writer = subprocess.Popen([sys.executable, "-c", GROWING, str(location), "8000"], stdout=subprocess.PIPE,
                              text=True)
    reads, problems = [], []

    def read_in_a_loop():
        while writer.poll() is None:
            if not (location / "zarr.json").exists():
                continue
            try:
                ds = outcore.open_dataset(location)
            except outcore.NotAStoreError:
                continue  # the Writer has not yet written its attributes
            n, it = len(ds), ds.batches(64, seed=len(reads))
            for _ in range(3):  # an open store read again and again, as epochs are, while the Writer goes on
                try:
                    x, ids = ds["x"].compute(), np.concatenate([b["id"] for b in it] or [[]])
                except Exception as error:  # noqa: BLE001 - every failure is what this test looks for
                    problems.append(repr(error))
                    break
                ok = np.array_equal(x, np.stack([np.arange(n), np.arange(n) * 2], axis=1)) and \
                    np.array_equal(np.sort(ids), np.arange(n))
                reads.append(n) if ok else problems.append(f"not a prefix at {n}")

    readers = [threading.Thread(target=read_in_a_loop) for _ in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    out, _ = writer.communicate()
    assert writer.returncode == 0 and out.strip() == "8029"
    assert problems == []
    assert len(reads) >= 20 and len(set(reads)) >= 5  # many reads, of many different lengths


@pytest.mark.parametrize(("url", "why"), [
    ("memory://x.zarr", "outcore writes stores to local paths and to object stores"),
    ("ftp://host/x.zarr", "outcore writes stores to local paths and to object stores"),
    ("gs://bucket/x.zarr.zip", "outcore writes folder stores to object stores"),
])
def test_a_url_outcore_cannot_write_is_never_written_as_a_local_folder(tmp_path, monkeypatch, url, why):
    """Path("s3://bucket/x.zarr") is the local folder s3:/bucket/x.zarr: from_arrays once wrote one there.
    Object stores are written for real (tests/test_upload.py); other URLs are refused before any work."""
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    with pytest.raises(outcore.OptionError, match=why):
        outcore.from_arrays({"x": np.arange(10)}, url, progress=False)
    with pytest.raises(outcore.OptionError, match=why):
        outcore.ingest_images(tmp_path, url, shape=(8, 8, 3), progress=False)
    with pytest.raises(outcore.OptionError, match=why):
        outcore.ingest_dataframe(pd.DataFrame({"path": ["a.jpg"]}), url, shape=(8, 8, 3), progress=False)
    with pytest.raises(outcore.OptionError, match="Writer writes directory stores, locally or to object stores"):
        outcore.Writer(url)
    assert list(tmp_path.iterdir()) == []


def test_shards_of_zeros_are_written_without_touching_zarrs_global_config(tmp_path, monkeypatch):
    """Zarr skips chunks of fill values unless told otherwise; outcore told it through zarr's global config,
    which threads writing at once restore under each other's feet (measured: read back False inside the
    context 1 time in 80,000 with 4 threads), and a shard of zeros then went unwritten: a store outcore's
    reader called damaged. Each array is told now; the global config is never set."""

    def refused(*args, **kwargs):
        raise AssertionError("outcore set zarr's global config while writing")

    monkeypatch.setattr(zarr.config, "set", refused)
    ds = outcore.from_arrays({"x": np.zeros((64, 3), np.float32), "labels": np.zeros(64, np.int64)},
                             tmp_path / "zeros.zarr", chunk_size=4, progress=False)
    writer = outcore.Writer(tmp_path / "appended.zarr", chunk_size=4)
    writer.append({"x": np.zeros((40, 3), np.float32)})
    writer.close()
    for store in (ds, outcore.open_dataset(tmp_path / "appended.zarr")):
        assert sum(len(batch["x"]) for batch in store.batches(8)) == len(store)  # no shard reads as lost


def test_values_are_cast_into_a_field_only_where_every_value_survives():
    """Floats into a narrower float field (rounding, no overflow), integers into floats that hold them
    exactly; complex numbers into a real field, overflow and inexact integers are refused, naming the field."""
    np.testing.assert_array_equal(cast_values("score", np.array([1.5, -2.25]), np.dtype("float32")), [1.5, -2.25])
    np.testing.assert_array_equal(cast_values("score", np.array([3, 2**24]), np.dtype("float32")), [3, 2**24])
    np.testing.assert_array_equal(cast_values("label", np.array([3, 200]), np.dtype("uint8")), [3, 200])
    np.testing.assert_array_equal(cast_values("z", np.array([1 + 2j]), np.dtype("complex64")), [1 + 2j])
    with pytest.raises(SourceError, match=r"field 'score': cannot store complex128 values in its float32 field"):
        cast_values("score", np.array([1 + 2j]), np.dtype("float32"))
    with pytest.raises(SourceError, match=r"field 'score': some float64 values are beyond the range of its float32"):
        cast_values("score", np.array([1e40]), np.dtype("float32"))
    with pytest.raises(SourceError, match=r"field 'score': some int64 values cannot be held exactly by its float32"):
        cast_values("score", np.array([2**24 + 1]), np.dtype("float32"))
    with pytest.raises(SourceError, match=r"field 'label': the int64 values -1..3 do not fit its uint8 dtype"):
        cast_values("label", np.array([-1, 3]), np.dtype("uint8"))


def test_a_writer_sizes_chunks_and_shards_by_the_bytes_of_a_sample(tmp_path):
    """Chunks of the most samples (a power of two) within 8 MiB, shards within 128 MiB (format.md)."""
    with outcore.Writer(tmp_path / "l.zarr", specs={"x": ("float32", (64, 64, 3)), "y": ("int8", ())}) as writer:
        writer.append({"x": np.zeros((2, 64, 64, 3), np.float32), "y": np.zeros(2, np.int8)})
    array = outcore.open_dataset(tmp_path / "l.zarr").array("x")
    sample = 64 * 64 * 3 * 4 + 1
    chunk, shard = array.chunks[0], array.shards[0]
    assert chunk * sample <= 8 * 2**20 < 2 * chunk * sample
    assert shard * sample <= 128 * 2**20 < 2 * shard * sample


def test_a_writer_makes_each_shard_durable_before_it_publishes_the_count(tmp_path, monkeypatch):
    """fsync of the shard files, then the new sample count: a machine that loses power never shows
    samples whose bytes were not on the disk."""
    from outcore.ingest import writer as writer_module

    events = []
    monkeypatch.setattr(writer_module, "make_durable", lambda paths: events.append(("durable", len(paths))))
    saving = writer_module.Writer._save_attrs

    def save(self, attrs, written=()):
        events.append(("count", attrs.num_samples))
        saving(self, attrs, written)

    monkeypatch.setattr(writer_module.Writer, "_save_attrs", save)
    writer = outcore.Writer(tmp_path / "d.zarr", chunk_size=4)
    writer.append({"x": np.arange(10, dtype=np.int32)})
    shard = writer._shard_size
    writer.append({"x": np.arange(10, shard + 3, dtype=np.int32)})  # the first shard is whole: written
    writer.close()
    published = events.index(("count", shard))
    assert events[published - 1] == ("durable", 1)  # its one file made durable just before
