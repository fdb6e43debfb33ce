"""Record sources (`outcore.ingest_records`): files written by each format's own library (TensorFlow,
webdataset, lmdb + protobuf, pyarrow, Hugging Face datasets), ingested as they are and compared sample by
sample with the same pictures ingested from a folder; damaged records named or skipped."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from support.optional import need

import outcore
from outcore.ingest.records import recognise
from outcore.testing import write_image_folder
from outcore.testing.records import (
    write_hf_dataset,
    write_hf_parquet_of_paths,
    write_lmdb,
    write_tfrecords,
    write_webdataset,
)

SHAPE = (24, 24, 3)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """36 JPEGs and 6 PNGs of different sizes in three classes, their class names, and the store an image
    folder ingest makes of them (the reference every record source must equal)."""
    root = tmp_path_factory.mktemp("records")
    files = write_image_folder(root / "folder", 12, classes=("cat", "dog", "owl"), size=(30, 40), seed=5)
    files += write_image_folder(root / "folder", 2, classes=("cat", "dog", "owl"), size=(28, 20), extension=".png",
                                seed=6)
    files = sorted(files)
    classes = [f.parent.name for f in files]
    reference = outcore.ingest_images(root / "folder", root / "folder.zarr", shape=SHAPE, progress=False)
    return root, files, classes, reference


def by_digest(ds: outcore.Dataset) -> dict[bytes, int]:
    return {bytes(d): i for i, d in enumerate(np.asarray(ds["file_digest"][:]))}


def class_names(ds: outcore.Dataset, field: str = "labels") -> list[str]:
    names = ds.classes if isinstance(ds.classes, list) else ds.classes[field]
    return [names[i] for i in np.asarray(ds[field][:])]


def assert_same_as_folder(ds: outcore.Dataset, reference: outcore.Dataset, names: list[str] | None = None) -> None:
    """Every sample of ``ds`` is one of the folder's files (by its bytes' digest), with the same pixels and
    the same class (``names``: the class of each sample of ``ds``, where the store has only numbers)."""
    mine, theirs = by_digest(ds), by_digest(reference)
    assert len(ds) == len(reference) and set(mine) == set(theirs)
    pixels, expected = np.asarray(ds["images"][:]), np.asarray(reference["images"][:])
    got_names, expected_names = names or class_names(ds), class_names(reference)
    for digest, i in mine.items():
        np.testing.assert_array_equal(pixels[i], expected[theirs[digest]])
        assert got_names[i] == expected_names[theirs[digest]]


def test_tfrecords_written_by_tensorflow_equal_the_folder(photos, tmp_path):
    need("tensorflow")
    _, files, classes, reference = photos
    write_tfrecords(files, classes, tmp_path / "plain", shards=3)
    write_tfrecords(files, classes, tmp_path / "gzip", shards=2, compression="GZIP")
    (tmp_path / "imagenet").mkdir()  # ImageNet's files have no suffix: train-00000-of-01024
    for path in (tmp_path / "plain").iterdir():
        (tmp_path / "imagenet" / path.stem).write_bytes(path.read_bytes())
    for source in (tmp_path / "plain", str(tmp_path / "gzip" / "*.gz"), tmp_path / "imagenet"):
        assert recognise(source) == "tfrecord"
        ds = outcore.ingest_records(source, tmp_path / "t.zarr", shape=SHAPE, overwrite=True, progress=False)
        assert_same_as_folder(ds, reference)
        assert ds.classes == ["cat", "dog", "owl"]  # from image/class/text
        paths = set(np.asarray(ds["path"][:]).tolist())
        suffix = {tmp_path / "plain": ".tfrecord", tmp_path / "imagenet": ""}.get(source, ".tfrecord.gz")
        assert f"train-00000-of-{2 if suffix == '.tfrecord.gz' else 3:05d}{suffix}::record 0" in paths


def test_tfrecord_reader_reads_what_tensorflow_reads(photos, tmp_path):
    tf = need("tensorflow")
    _, files, classes, _ = photos
    paths = write_tfrecords(files[:10], classes[:10], tmp_path, shards=1)
    table = outcore.ingest.record_table.record_table(outcore.TFRecord(), [str(p) for p in paths], on_error="raise",
                                                progress=False)
    theirs = [tf.io.parse_single_example(record, {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                                                  "image/class/label": tf.io.FixedLenFeature([], tf.int64)})
              for record in tf.data.TFRecordDataset([str(p) for p in paths])]
    assert [table.reader.read(ref) for ref in table.paths] == [t["image/encoded"].numpy() for t in theirs]
    assert table.labels["labels"].tolist() == [int(t["image/class/label"]) for t in theirs]


def damaged_copy(path: Path, offset: int, target: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


def test_damaged_tfrecord_is_named_or_skipped(photos, tmp_path):
    need("tensorflow")
    _, files, classes, _ = photos
    (path,) = write_tfrecords(files[:6], classes[:6], tmp_path / "good", shards=1)
    (tmp_path / "bad").mkdir()
    size = len(Path(files[0]).read_bytes())
    bad = damaged_copy(path, 12 + 100 + size // 2, tmp_path / "bad" / path.name)  # inside record 0's picture
    with pytest.raises(outcore.SourceError, match=r"record 0: its checksum is wrong.*on_error='skip'"):
        outcore.ingest_records(bad, tmp_path / "t.zarr", shape=SHAPE, progress=False)
    ds = outcore.ingest_records(bad, tmp_path / "t.zarr", shape=SHAPE, on_error="skip", progress=False)
    assert len(ds) == 5 and ds.attrs.skipped["count"] == 1
    report = (tmp_path / "t.zarr.skipped.txt").read_text()
    assert f"{bad.name}::record 0" in report and "checksum" in report
    truncated = tmp_path / "bad" / "short.tfrecord"
    truncated.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(outcore.SourceError, match=r"short.tfrecord::record 5: the file ends 10 bytes before"):
        outcore.ingest_records(truncated, tmp_path / "u.zarr", shape=SHAPE, progress=False)


def test_webdataset_shards_equal_the_folder(photos, tmp_path):
    need("webdataset")
    _, files, classes, reference = photos
    pattern = write_webdataset(files, classes, tmp_path / "wds", per_shard=16)
    assert pattern.endswith("shard-{000000..000002}.tar") and recognise(pattern) == "webdataset"
    ds = outcore.ingest_records(pattern, tmp_path / "w.zarr", shape=SHAPE, progress=False)
    assert_same_as_folder(ds, reference, names=[["cat", "dog", "owl"][i] for i in np.asarray(ds["labels"][:])])
    assert "shard-000000.tar::sample000000.jpg" in set(np.asarray(ds["path"][:]).tolist())
    named = outcore.ingest_records(tmp_path / "wds", tmp_path / "n.zarr", shape=SHAPE, progress=False,
                                   format=outcore.WebDataset(label_keys={"labels": "json.class"}))
    assert_same_as_folder(named, reference)
    compressed = tmp_path / "gz"
    compressed.mkdir()
    for shard in sorted((tmp_path / "wds").glob("*.tar")):
        (compressed / f"{shard.name}.gz").write_bytes(gzip.compress(shard.read_bytes()))
    ds = outcore.ingest_records(compressed, tmp_path / "g.zarr", shape=SHAPE, progress=False)
    assert_same_as_folder(ds, reference, names=[["cat", "dog", "owl"][i] for i in np.asarray(ds["labels"][:])])


def test_truncated_tar_is_named_or_skipped(photos, tmp_path):
    need("webdataset")
    _, files, classes, _ = photos
    write_webdataset(files[:10], classes[:10], tmp_path / "wds", per_shard=10)
    shard = tmp_path / "wds" / "shard-000000.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(outcore.SourceError, match=r"shard-000000.tar::.*truncated or damaged"):
        outcore.ingest_records(shard, tmp_path / "t.zarr", shape=SHAPE, progress=False)
    ds = outcore.ingest_records(shard, tmp_path / "t.zarr", shape=SHAPE, on_error="skip", progress=False)
    assert 0 < len(ds) < 10 and ds.attrs.skipped["count"] == 1
    assert "truncated" in (tmp_path / "t.zarr.skipped.txt").read_text()


def test_lmdb_of_files_datums_and_a_function(photos, tmp_path, capsys):
    need("lmdb")
    need("google.protobuf")
    _, files, classes, reference = photos
    files_env = write_lmdb(files, classes, tmp_path / "files.lmdb")
    assert recognise(files_env) == "lmdb"
    ds = outcore.ingest_records(files_env, tmp_path / "a.zarr", shape=SHAPE, progress=False,
                                format=outcore.LMDB(label_pattern=r"^(?P<labels>[^/]+)/"))
    assert_same_as_folder(ds, reference)
    assert "files.lmdb::key b'cat/000000'" in set(np.asarray(ds["path"][:]).tolist())
    datums = write_lmdb(files, classes, tmp_path / "datum.lmdb", values="datum")
    with pytest.warns(outcore.OutcoreWarning, match=r"datum.lmdb: its values were recognised as Caffe Datums"):
        ds = outcore.ingest_records(datums, tmp_path / "b.zarr", shape=SHAPE, progress=False)  # as Caffe wrote them
    assert_same_as_folder(ds, reference, names=[["cat", "dog", "owl"][i] for i in np.asarray(ds["labels"][:])])
    said = outcore.ingest_records(datums, tmp_path / "b2.zarr", shape=SHAPE, format=outcore.LMDB(values="datum"),
                                  progress=False)
    np.testing.assert_array_equal(np.asarray(said["images"][:]), np.asarray(ds["images"][:]))
    from outcore.cli import main

    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown as the command shows them, not raised
        assert main(["ingest", str(datums), str(tmp_path / "cli.zarr"), "--shape", "24x24x3", "--no-progress"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"outcore ingest: warning: lmdb {datums}: its values were recognised as Caffe Datums and read as such: their "
        + "pictures and labels"]
    assert_same_as_folder(outcore.open_dataset(tmp_path / "cli.zarr"), reference,
                          names=[["cat", "dog", "owl"][i] for i in np.asarray(ds["labels"][:])])

    def decode(key: bytes, value: bytes) -> tuple[bytes, dict[str, str]]:  # the user's own reading of a value
        return value, {"kind": key.decode().split("/")[0]}

    ds = outcore.ingest_records(files_env, tmp_path / "c.zarr", shape=SHAPE, format=outcore.LMDB(values=decode),
                                progress=False)
    assert_same_as_folder(ds, reference, names=class_names(ds, "kind"))


def test_lmdb_of_raw_caffe_datums_gives_their_pixels(photos, tmp_path):
    need("lmdb")
    need("google.protobuf")
    _, files, classes, _ = photos
    raw = write_lmdb(files, classes, tmp_path / "raw.lmdb", values="raw")
    with pytest.warns(outcore.OutcoreWarning, match=r"raw Datum pixels were read as BGR.*datum_channels='rgb'"):
        ds = outcore.ingest_records(raw, tmp_path / "r.zarr", shape=None, images="encoded", shuffle_on_write=False,
                                    progress=False)  # recognised as Datums from their bytes
    said = outcore.ingest_records(raw, tmp_path / "s.zarr", shape=None, images="encoded", shuffle_on_write=False,
                                  format=outcore.LMDB(values="datum", datum_channels="rgb"), progress=False)
    from PIL import Image

    for i in (0, 7, len(files) - 1):  # keys sort as the files do: <class>/<index>
        expected = np.asarray(Image.open(files[i]).convert("RGB"))  # stored BGR, read back RGB
        np.testing.assert_array_equal(np.asarray(ds["images"][i]), expected)
        np.testing.assert_array_equal(np.asarray(said["images"][i]), expected[..., ::-1])  # as the user said
    assert np.asarray(ds["labels"][:]).tolist() == [["cat", "dog", "owl"].index(c) for c in classes]


def test_lmdb_values_that_are_neither_pictures_nor_datums_are_named(photos, tmp_path):
    need("lmdb")
    import pickle

    import lmdb

    _, files, _, _ = photos
    environment = lmdb.open(str(tmp_path / "pickles.lmdb"), map_size=2**24)
    with environment.begin(write=True) as transaction:
        for i, file in enumerate(files[:4]):
            transaction.put(f"{i:04d}".encode(), pickle.dumps({"jpeg": Path(file).read_bytes(), "label": i}))
    environment.close()
    with pytest.raises(outcore.SourceError, match=r"pickles.lmdb: its values are neither pictures' files nor Caffe "
                                                  r"Datums \(key b'0000' holds a Python pickle \(protocol \d\)\); "
                                                  r"outcore never unpickles.*outcore.LMDB\(values=read\)"):
        outcore.ingest_records(tmp_path / "pickles.lmdb", tmp_path / "p.zarr", shape=SHAPE, progress=False)
    assert not (tmp_path / "p.zarr").exists()


def test_a_folder_of_images_and_record_files_is_not_guessed(photos, tmp_path):
    need("webdataset")
    _, files, classes, _ = photos
    mixed = tmp_path / "mixed"
    write_image_folder(mixed, 2, classes=("cat",), size=(8, 8))
    write_webdataset(files[:2], classes[:2], mixed / "cat", per_shard=2)  # a stray shard among the pictures
    with pytest.raises(outcore.SourceError, match=r"holds both image files .* and webdataset files: name the format"):
        recognise(mixed)
    ds = outcore.ingest_records(mixed, tmp_path / "w.zarr", format="webdataset", shape=SHAPE, progress=False)
    assert len(ds) == 2


def test_records_without_labels_are_ingested_with_a_warning(photos, tmp_path):
    pq = need("pyarrow.parquet")
    import pyarrow as pa

    _, files, _, _ = photos
    pq.write_table(pa.table({"image": [Path(f).read_bytes() for f in files[:4]]}), tmp_path / "p.parquet")
    with pytest.warns(outcore.OutcoreWarning, match=r"no labels found, so the store gets none; name them"):
        ds = outcore.ingest_records(tmp_path / "p.parquet", tmp_path / "p.zarr", shape=SHAPE, progress=False)
    assert list(ds.fields) == ["images", "path", "source_index", "file_stat", "file_digest"]


def test_hugging_face_dataset_and_its_parquet_equal_the_folder(photos, tmp_path):
    need("datasets")
    _, files, classes, reference = photos
    saved, parquet = write_hf_dataset(files, classes, tmp_path / "hf", parquet_shards=2)
    assert recognise(saved) == "parquet" and recognise(parquet) == "parquet"
    for source in (saved, parquet):
        ds = outcore.ingest_records(source, tmp_path / "h.zarr", shape=SHAPE, overwrite=True, progress=False)
        assert_same_as_folder(ds, reference)
        assert ds.classes == ["cat", "dog", "owl"]  # the ClassLabel's names
    kept = outcore.ingest_records(parquet, tmp_path / "k.zarr", shape=None, images="encoded", max_side=32,
                                  progress=False)
    sides = {np.asarray(kept["images"][i]).shape[:2] for i in range(len(kept))}
    assert len(kept) == len(files) and sides == {(24, 32), (28, 20)}  # 30x40 capped at 32, 28x20 as they were


def test_parquet_of_pictures_given_by_their_paths_reads_the_files(photos, tmp_path, monkeypatch):
    need("datasets")
    root, files, classes, reference = photos
    absolute = write_hf_parquet_of_paths([str(f) for f in files], classes, tmp_path / "absolute.parquet")
    monkeypatch.chdir(root)  # datasets sizes the files as it writes: relative paths from the working folder
    relative = [str(Path(f).relative_to(root)) for f in files]  # folder/cat/x.jpg
    beside = write_hf_parquet_of_paths(relative, classes, root / "beside.parquet")  # from the Parquet file's folder
    from_here = write_hf_parquet_of_paths(relative, classes, tmp_path / "from-here.parquet")  # from the working folder
    here = tmp_path / "here"
    (here / "cat").mkdir(parents=True)
    monkeypatch.chdir(here)
    for i, parquet in enumerate((absolute, beside)):
        ds = outcore.ingest_records(parquet, tmp_path / f"{i}.zarr", shape=SHAPE, progress=False)
        assert_same_as_folder(ds, reference)
    monkeypatch.chdir(root)
    assert_same_as_folder(outcore.ingest_records(from_here, tmp_path / "2.zarr", shape=SHAPE, progress=False),
                          reference)

    monkeypatch.chdir(here)
    gone, nowhere = tmp_path / "gone.jpg", here / "cat" / "nowhere.jpg"
    for made in (gone, nowhere):
        made.write_bytes(Path(files[0]).read_bytes())
    missing = write_hf_parquet_of_paths([*[str(f) for f in files[:3]], str(gone), "cat/nowhere.jpg"], classes[:5],
                                        tmp_path / "missing.parquet")
    gone.unlink()
    nowhere.unlink()
    with pytest.raises(outcore.SourceError, match=rf"2 of 5 records .*missing.parquet::row 3: its picture's bytes are "
                                                  rf"null and its path '{tmp_path}/gone.jpg' is not a file .*"
                                                  rf"missing.parquet::row 4: .*'cat/nowhere.jpg' is not a file \(looked "
                                                  rf"for {tmp_path}/cat/nowhere.jpg or {here}/cat/nowhere.jpg\)"):
        outcore.ingest_records(missing, tmp_path / "m.zarr", shape=SHAPE, progress=False)
    nowhere.write_bytes(Path(files[0]).read_bytes())
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "nowhere.jpg").write_bytes(Path(files[1]).read_bytes())
    with pytest.raises(outcore.SourceError, match=r"row 4: its picture's path 'cat/nowhere.jpg' names two files"):
        outcore.ingest_records(missing, tmp_path / "m.zarr", shape=SHAPE, progress=False)


def test_parquet_with_a_damaged_page_is_named_or_skipped(photos, tmp_path):
    pq = need("pyarrow.parquet")
    import pyarrow as pa

    _, files, classes, _ = photos
    table = pa.table({"img": [Path(f).read_bytes() for f in files[:12]], "label": classes[:12]})
    path = tmp_path / "p.parquet"
    pq.write_table(table, path, row_group_size=4, compression="snappy", write_page_checksum=True)
    metadata = pq.ParquetFile(path).metadata.row_group(1).column(0)
    bad = damaged_copy(path, metadata.data_page_offset + metadata.total_compressed_size // 2,
                       tmp_path / "bad.parquet")
    with pytest.raises(outcore.SourceError, match=r"4 of 12 records .*bad.parquet::row \d+: row group \d+ cannot be "
                                                  r"read \(.*CRC checksum"):
        outcore.ingest_records(bad, tmp_path / "t.zarr", shape=SHAPE, progress=False)
    ds = outcore.ingest_records(bad, tmp_path / "t.zarr", shape=SHAPE, on_error="skip", progress=False)
    assert len(ds) == 8 and ds.attrs.skipped["count"] == 4 and ds.classes == ["cat"]


@pytest.mark.slow
def test_command_line_recognises_each_format(photos, tmp_path):
    need("webdataset")
    _, files, classes, _ = photos
    pattern = write_webdataset(files, classes, tmp_path / "wds", per_shard=16)
    command = [sys.executable, "-m", "outcore.cli", "ingest"]
    done = subprocess.run([*command, pattern, str(tmp_path / "w.zarr"), "--shape", "24x24x3", "--no-progress"],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(outcore.open_dataset(tmp_path / "w.zarr")) == len(files)
    done = subprocess.run([*command, str(tmp_path / "none"), str(tmp_path / "x.zarr"), "--shape", "24x24x3",
                           "--format", "tfrecord"], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "none" in done.stderr


@pytest.fixture(scope="module")
def s3():
    need("obstore")
    need("moto.server")
    from outcore.testing.s3 import S3Server

    with S3Server() as server:
        server.create_bucket("data")
        yield server


@pytest.mark.e2e
def test_record_files_in_s3_are_read_where_they_are(photos, tmp_path, s3):
    need("tensorflow")
    need("webdataset")
    need("datasets")
    from outcore.testing.s3 import upload

    _, files, classes, reference = photos
    write_tfrecords(files, classes, tmp_path / "tfrecords", shards=3)
    write_webdataset(files, classes, tmp_path / "wds", per_shard=16)
    _, parquet = write_hf_dataset(files, classes, tmp_path / "hf", parquet_shards=2)
    (tmp_path / "hf" / "parquet").mkdir()
    for path in parquet:
        path.rename(tmp_path / "hf" / "parquet" / path.name)
    (tmp_path / "imagenet").mkdir()  # ImageNet's files have no suffix: train-00000-of-01024
    for path in (tmp_path / "tfrecords").iterdir():
        (tmp_path / "imagenet" / path.stem).write_bytes(path.read_bytes())
    for folder in ("tfrecords", "wds", "hf/parquet", "imagenet"):
        upload(tmp_path / folder, f"s3://data/{folder}", s3.options)
    sources = {"s3://data/tfrecords/": "tfrecord", "s3://data/wds/shard-{000000..000002}.tar": "webdataset",
               "s3://data/hf/parquet": "parquet", "s3://data/imagenet/": "tfrecord",
               "s3://data/imagenet/train-*-of-00003": "tfrecord"}
    for source, kind in sources.items():
        assert recognise(source, s3.options) == kind
        ds = outcore.ingest_records(source, tmp_path / "s.zarr", shape=SHAPE, storage_options=s3.options,
                                    overwrite=True, progress=False)
        names = class_names(ds) if ds.classes else [["cat", "dog", "owl"][i] for i in np.asarray(ds["labels"][:])]
        assert_same_as_folder(ds, reference, names=names)
    with pytest.raises(outcore.SourceError, match="no .* files found at 's3://data/nothing/'"):
        outcore.ingest_records("s3://data/nothing/", tmp_path / "n.zarr", format="tfrecord", shape=SHAPE,
                               storage_options=s3.options, progress=False)


@pytest.mark.e2e
def test_record_files_on_a_plain_http_server(photos, tmp_path):
    need("tensorflow")
    need("obstore")
    from outcore.testing.http import StaticServer

    _, files, classes, reference = photos
    write_tfrecords(files, classes, tmp_path / "tfrecords", shards=3)
    with StaticServer(tmp_path / "tfrecords") as server:
        source = f"{server.url}/train-{{00000..00002}}-of-00003.tfrecord"
        assert recognise(source) == "tfrecord"
        ds = outcore.ingest_records(source, tmp_path / "h.zarr", shape=SHAPE, progress=False)
    assert_same_as_folder(ds, reference)


@pytest.mark.e2e
def test_image_folder_in_s3_is_read_where_it_is(photos, tmp_path, s3):
    from outcore.testing.s3 import upload

    root, _, _, reference = photos
    upload(root / "folder", "s3://data/photos/train", s3.options)
    ds = outcore.ingest_images("s3://data/photos/train", tmp_path / "p.zarr", shape=SHAPE, storage_options=s3.options,
                               progress=False)
    assert_same_as_folder(ds, reference)
    assert sorted(np.asarray(ds["path"][:]).tolist()) == sorted(np.asarray(reference["path"][:]).tolist())
    done = subprocess.run([sys.executable, "-m", "outcore.cli", "ingest", "s3://data/photos/train",
                           str(tmp_path / "c.zarr"), "--shape", "24x24x3", "--no-progress"], check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **s3.environment})
    assert done.returncode == 0, done.stderr
    assert_same_as_folder(outcore.open_dataset(tmp_path / "c.zarr"), reference)
    with pytest.raises(outcore.SourceError, match=r"no image files .* found under 's3://data/photos/none'"):
        outcore.ingest_images("s3://data/photos/none", tmp_path / "n.zarr", shape=SHAPE, storage_options=s3.options,
                              progress=False)


@pytest.mark.e2e
def test_parquet_in_s3_reads_the_pictures_beside_it(photos, tmp_path, s3, monkeypatch):
    need("datasets")
    import shutil

    from outcore.testing.s3 import upload

    root, files, classes, reference = photos
    shutil.copytree(root / "folder", tmp_path / "up")
    monkeypatch.chdir(tmp_path / "up")
    write_hf_parquet_of_paths([str(Path(f).relative_to(root / "folder")) for f in files], classes,
                              tmp_path / "up" / "train.parquet")  # cat/x.jpg beside train.parquet
    upload(tmp_path / "up", "s3://data/hf", s3.options)
    monkeypatch.chdir(tmp_path)
    ds = outcore.ingest_records("s3://data/hf/train.parquet", tmp_path / "s.zarr", shape=SHAPE,
                                storage_options=s3.options, progress=False)
    assert_same_as_folder(ds, reference)


@pytest.mark.e2e
def test_a_killed_record_ingest_resumes_to_the_uninterrupted_store(photos, tmp_path):
    need("datasets")
    from test_staging import _ingest_command, _stop_part_way

    from outcore.cli import main

    _, files, classes, _ = photos
    write_hf_dataset(files, classes, tmp_path / "hf", parquet_shards=2)
    source, store, shape = str(tmp_path / "hf" / "*.parquet"), tmp_path / "t.zarr", ["--shape", "24x24x3"]
    _stop_part_way(source, store, shards=2, images=shape).wait()
    unpacked = list(tmp_path.glob(".outcore-unpacked-*/*.bin"))
    assert not store.exists() and len(unpacked) == 2  # the Parquet files' pictures, unpacked as they were scanned
    assert main(["ingest", *_ingest_command(source, store, "--resume", images=shape)]) == 0
    assert not list(tmp_path.glob(".outcore-unpacked-*"))  # the killed run's are removed, the resumed run's too
    resumed = outcore.open_dataset(store)
    assert main(["ingest", *_ingest_command(source, tmp_path / "u.zarr", images=shape)]) == 0
    uninterrupted = outcore.open_dataset(tmp_path / "u.zarr")
    assert without_times(resumed) == without_times(uninterrupted)
    for name in resumed.array_names():
        np.testing.assert_array_equal(resumed.array(name)[:], uninterrupted.array(name)[:], err_msg=name)


def without_times(ds: outcore.Dataset) -> dict:
    attrs = ds.attrs.to_dict()
    attrs["provenance"].pop("created")
    attrs.pop("generation")
    return attrs


def test_record_files_cut_into_splits(photos, tmp_path):
    need("tensorflow")
    _, files, classes, reference = photos
    write_tfrecords(files, classes, tmp_path / "tfrecords", shards=3)
    stores = outcore.ingest_splits(tmp_path / "tfrecords", tmp_path / "cut", split={"train": 0.75, "val": 0.25},
                                   shape=SHAPE, progress=False)
    paths = {name: set(np.asarray(ds["path"][:]).tolist()) for name, ds in stores.items()}
    assert not paths["train"] & paths["val"] and len(paths["train"] | paths["val"]) == len(files)
    theirs, pixels = by_digest(reference), np.asarray(reference["images"][:])
    for ds in stores.values():
        assert ds.classes == ["cat", "dog", "owl"]
        for digest, i in by_digest(ds).items():
            np.testing.assert_array_equal(np.asarray(ds["images"][i]), pixels[theirs[digest]])
    assert outcore.open_dataset(tmp_path / "cut", split="val").location == stores["val"].location


@pytest.mark.e2e
def test_csv_of_paths_in_s3_is_read_where_it_is(photos, tmp_path, s3):
    import pandas as pd

    from outcore.testing.s3 import upload

    root, files, classes, reference = photos
    upload(root / "folder", "s3://data/table/photos", s3.options)
    names = [f.relative_to(root / "folder").as_posix() for f in files]
    (tmp_path / "csv").mkdir()
    pd.DataFrame({"path": [f"photos/{n}" for n in names] + ["photos/cat/gone.jpg"], "label": classes + ["cat"]}) \
        .to_csv(tmp_path / "csv" / "labels.csv", index=False)
    upload(tmp_path / "csv", "s3://data/table", s3.options)
    with pytest.raises(outcore.SourceError, match=r"1 of 43 files listed in CSV 's3://data/table/labels.csv'.*gone.jpg"):
        outcore.ingest_dataframe("s3://data/table/labels.csv", tmp_path / "t.zarr", label_columns=["label"],
                                 shape=SHAPE, storage_options=s3.options, progress=False)
    ds = outcore.ingest_dataframe("s3://data/table/labels.csv", tmp_path / "t.zarr", label_columns=["label"],
                                  shape=SHAPE, storage_options=s3.options, on_error="skip", progress=False)
    assert ds.attrs.skipped["count"] == 1
    assert_same_as_folder(ds, reference, names=class_names(ds, "label"))


@pytest.mark.e2e
def test_record_sources_ingested_on_a_dask_cluster(photos, tmp_path):
    need("lmdb")
    need("datasets")
    import dask
    from distributed import Client, LocalCluster

    _, files, classes, reference = photos
    datums = write_lmdb(files, classes, tmp_path / "datum.lmdb", values="datum")
    saved, _ = write_hf_dataset(files, classes, tmp_path / "hf", parquet_shards=1)
    with dask.config.set(outcore.WORKER_CONFIG), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        lmdb_store = outcore.ingest_records(datums, tmp_path / "l.zarr", shape=SHAPE, client=client,
                                            format=outcore.LMDB(values="datum"), chunk_size=8, progress=False)
        hf_store = outcore.ingest_records(saved, tmp_path / "h.zarr", shape=SHAPE, client=client, chunk_size=8,
                                          progress=False)  # unpacked by a worker, read by both
        read_by = client.run(lambda: sorted(k[1] for k in outcore.ingest.records.locations._handles))
    assert_same_as_folder(lmdb_store, reference, names=[["cat", "dog", "owl"][i]
                                                        for i in np.asarray(lmdb_store["labels"][:])])
    assert_same_as_folder(hf_store, reference)
    assert all(any(what.startswith("lmdb ") for what in opened) for opened in read_by.values())


def test_a_missing_optional_library_is_named_with_its_extra(photos, tmp_path, monkeypatch):
    need("lmdb")
    need("datasets")
    _, files, classes, _ = photos
    environment = write_lmdb(files[:3], classes[:3], tmp_path / "few.lmdb")
    _, parquet = write_hf_dataset(files[:3], classes[:3], tmp_path / "hf", parquet_shards=1)
    monkeypatch.setitem(sys.modules, "lmdb", None)  # as if not installed: importing it fails
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(outcore.SourceError, match=r"needs lmdb: pip install 'outcore\[lmdb\]'"):
        outcore.ingest_records(environment, tmp_path / "l.zarr", shape=SHAPE, progress=False)
    with pytest.raises(outcore.SourceError, match=r"needs pyarrow: pip install 'outcore\[parquet\]'"):
        outcore.ingest_records(parquet, tmp_path / "p.zarr", shape=SHAPE, progress=False)
