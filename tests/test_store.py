"""The store on disk (`outcore.format`, `outcore.storage`): layout, attributes, text, what plain zarr, dask
and xarray read, zip stores, damage named, checks on open."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.storage import ZipStore

import outcore
from outcore.errors import CorruptChunkError, NotAStoreError, UnsafeStoreError
from outcore.format import Compression, FieldInfo, Layout, StoreAttrs, decode_text, encode_text
from outcore.storage import RangeZipStore, read_samples
from outcore.testing import chunk_location, corrupt_chunk, make_store, replace_chunk, shard_key


@pytest.fixture
def store(tmp_path: Path, rng) -> tuple[Path, dict[str, np.ndarray]]:
    arrays = {
        "images": rng.integers(0, 256, (300, 8, 8, 3), dtype=np.uint8),
        "labels": rng.integers(0, 3, 300),
    }
    outcore.from_arrays(arrays, tmp_path / "s.zarr", classes={"labels": ["a", "b", "c"]}, chunk_size=32,
                        shuffle_on_write=False, progress=False)
    return tmp_path / "s.zarr", arrays


def test_compression_parse_and_errors():
    assert Compression.parse(None) == Compression("lz4", 5, "shuffle")
    assert Compression.parse("zstd:3:bitshuffle") == Compression("zstd", 3, "bitshuffle")
    assert str(Compression.parse("zstd")) == "zstd:5:shuffle"
    for bad, message in [("gzip", "gzip"), ("zstd:12", "between 0 and 9"), ("zstd:x", "not an integer"),
                         ("lz4:1:twist", "twist"), ("a:1:b:c", "CNAME")]:
        with pytest.raises(ValueError, match=message):
            Compression.parse(bad)


def test_layout_targets_chunk_and_shard_bytes():
    assert Layout.for_samples(128 * 128 * 3, 1_000_000) == Layout(128, 2048)  # 128 MiB shards
    assert Layout.for_samples(128 * 128 * 3, 10_000) == Layout(128, 1024)  # at least 8 shards
    assert Layout.for_samples(8, 1000) == Layout(1024, 1024)  # small samples: never beyond the data
    assert Layout.for_samples(10, 100, chunk_size=7) == Layout(7, 7)
    with pytest.raises(ValueError, match="positive"):
        Layout.for_samples(10, 100, chunk_size=0)


def test_small_fields_have_shards_of_their_own_size():
    """Labels, paths, byte ranges: about 8 MiB a shard file, 1,024 chunks at most, a multiple of the pictures'."""
    layout = Layout(128, 1024)
    assert layout.shard_size_for(128 * 128 * 3) == 1024  # the pictures' own
    assert layout.shard_size_for(8) == 128 * 1024  # labels: 1,024 chunks (1 MiB)
    assert layout.shard_size_for(256) == 32_768 and layout.shard_size_for(2048) == 4096  # paths; embeddings: 8 MiB
    assert Layout(7, 14).shard_size_for(8) == 7 * 1024


def test_a_store_keeps_one_file_per_shard_of_pictures_and_one_per_small_field(tmp_path, rng):
    """Each task writes its shard of pictures, its small fields' samples into a scratch array; they are
    gathered into the small fields' files at the end: the same samples, far fewer files."""
    arrays = {"images": rng.integers(0, 256, (2400, 16, 16, 3), dtype=np.uint8),
              "labels": rng.integers(0, 10, 2400), "weight": rng.random(2400).astype(np.float32)}
    ds = outcore.from_arrays(arrays, tmp_path / "s.zarr", chunk_size=64, progress=False)
    files = [path.relative_to(ds.location).parts[0] for path in Path(ds.location).rglob("*")
             if path.is_file() and path.name != "zarr.json"]
    shard = ds.array("images").shards[0]
    assert shard < 2400 and files.count("images") == -(-2400 // shard)
    assert files.count("labels") == files.count("weight") == 1 and ds.array("labels").shards == (64 * 1024,)
    stored = {name: ds[name].compute() for name in arrays}
    source = {images.tobytes(): i for i, images in enumerate(arrays["images"])}
    order = np.array([source[images.tobytes()] for images in stored["images"]])  # shuffled on write
    assert sorted(order.tolist()) == list(range(2400))
    np.testing.assert_array_equal(stored["labels"], arrays["labels"][order])
    np.testing.assert_array_equal(stored["weight"], arrays["weight"][order])
    assert outcore.verify(ds.location, progress=False).ok
    assert not list(tmp_path.glob(".*"))  # the scratch went with the run


def test_attrs_round_trip_and_reject_newer_versions():
    points = FieldInfo("target", encoding="ragged", dtype="float32", sample_shape=(2, 3), points=("left", "right"))
    attrs = StoreAttrs(10, 4, {"x": FieldInfo("input"), "y": FieldInfo("target", ("a", "b")), "p": points}, True, 3,
                       {"s": 1})
    document = json.loads(json.dumps(attrs.to_dict()))
    assert StoreAttrs.from_dict(document, "here") == attrs
    document["fields"]["p"]["points"] = ["left"]  # one name for two points
    with pytest.raises(NotAStoreError, match="1 point names for rows of shape"):
        StoreAttrs.from_dict(document, "here")
    document["fields"]["p"]["points"] = ["left", 2]
    with pytest.raises(NotAStoreError, match="are not a list of names"):
        StoreAttrs.from_dict(document, "here")
    document["fields"]["p"]["points"] = ["left", "right"]
    with pytest.raises(NotAStoreError, match="format 2.*Upgrade"):
        StoreAttrs.from_dict({**document, "format_version": 2}, "here")
    with pytest.raises(NotAStoreError, match="malformed"):
        StoreAttrs.from_dict({"format_version": 1}, "here")


def test_text_round_trip_with_unicode():
    names = np.array(["a.jpg", "dossier/été.png", ""])
    encoded = encode_text(names)
    assert encoded.dtype == np.uint8 and encoded.shape == (3, len("dossier/été.png".encode()))
    np.testing.assert_array_equal(decode_text(encoded), names)


def test_format_on_disk(store):
    path, _ = store
    group = zarr.open_group(path, mode="r")
    meta = group["images"].metadata.to_dict()
    sharding = meta["codecs"][0]
    assert sharding["name"] == "sharding_indexed"
    inner = [codec["name"] for codec in sharding["configuration"]["codecs"]]
    assert inner == ["bytes", "blosc", "crc32c"]
    assert group["images"].chunks == (32, 8, 8, 3) and group["labels"].chunks == (32,)
    attrs = group.attrs["outcore"]
    assert attrs["format_version"] == 1 and attrs["num_samples"] == 300 and attrs["chunk_size"] == 32
    assert attrs["fields"]["labels"] == {"role": "target", "classes": ["a", "b", "c"], "dtype": "int64",
                                         "sample_shape": []}
    assert attrs["fields"]["images"] == {"role": "input", "dtype": "uint8", "sample_shape": [8, 8, 3]}
    assert set(attrs["provenance"]["versions"]) >= {"outcore", "zarr", "dask", "numpy"}


def test_plain_zarr_dask_and_xarray_read_the_store(store):
    path, arrays = store
    np.testing.assert_array_equal(zarr.open_group(path, mode="r")["images"][:], arrays["images"])
    np.testing.assert_array_equal(da.from_zarr(str(path), component="labels").compute(), arrays["labels"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no warning, named dimensions
        dataset = xr.open_zarr(path)
    assert dataset["images"].dims == ("sample", "height", "width", "channel")
    assert dataset["labels"].attrs == {"flag_values": [0, 1, 2], "flag_meanings": "a b c"}
    np.testing.assert_array_equal(dataset["labels"].values, arrays["labels"])


def test_a_zip_store_opens_in_plain_zarr_and_xarray_through_zipstore(tmp_path, rng):
    x = rng.integers(0, 256, (100, 4, 4), dtype=np.uint8)
    outcore.from_arrays({"x": x, "labels": np.arange(100) % 2}, tmp_path / "s.zarr.zip", progress=False,
                        shuffle_on_write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = xr.open_zarr(ZipStore(tmp_path / "s.zarr.zip", mode="r"))  # the README's one-liner
    assert dataset["x"].dims == ("sample", "height", "width")
    np.testing.assert_array_equal(dataset["x"].values, x)


def test_to_xarray_has_strings_decoded_images_and_class_names(tmp_path):
    paths = np.array(["cat/1.jpg", "dög/2.png", "owl/3.jpg"] * 10)
    ds = outcore.from_arrays({"images": np.zeros((30, 4, 4, 3), np.uint8), "masks": np.ones((30, 2, 2, 1), np.uint8),
                              "labels": np.arange(30) % 3, "path": paths}, tmp_path / "t.zarr",
                             classes={"labels": ["cat", "big dog", "owl"]}, progress=False)
    dataset = ds.to_xarray()
    assert dict(dataset.sizes) == {"sample": 30, "height": 4, "width": 4, "channel": 3, "masks_height": 2,
                                   "masks_width": 2, "masks_channel": 1}
    assert dataset["path"].dims == ("sample",) and dataset["path"].values.tolist() == ds["path"].compute().tolist()
    assert sorted(dataset["path"].values.tolist()) == sorted(paths.tolist())
    assert dataset["labels"].attrs == {"role": "target", "flag_values": [0, 1, 2], "flag_meanings": "cat big_dog owl"}


def test_a_writer_store_is_consolidated_as_it_grows(tmp_path):
    with outcore.Writer(tmp_path / "w.zarr", classes={"label": ["no", "yes"]}) as writer:
        writer.append({"label": np.array([0, 1, 1]), "score": np.array([0.5, 0.7, 0.9], np.float32)})
        writer.flush()
        assert xr.open_zarr(tmp_path / "w.zarr").sizes["sample"] == 3
        writer.append({"label": np.array([0]), "score": np.array([0.1], np.float32)})
    dataset = xr.open_zarr(tmp_path / "w.zarr")
    assert dataset.sizes["sample"] == 4 and dataset["label"].attrs["flag_meanings"] == "no yes"


def test_zip_store_reads_like_the_directory(tmp_path, rng):
    x = rng.integers(0, 256, (1000, 6, 6), dtype=np.uint8)
    outcore.from_arrays({"x": x}, tmp_path / "s.zarr.zip", chunk_size=64, shuffle_on_write=False, progress=False)
    assert (tmp_path / "s.zarr.zip").is_file()
    ds = outcore.open_dataset(tmp_path / "s.zarr.zip")
    np.testing.assert_array_equal(ds["x"].compute(), x)
    plain = zarr.open_group(ZipStore(tmp_path / "s.zarr.zip", mode="r"), mode="r")
    fast = zarr.open_group(RangeZipStore(tmp_path / "s.zarr.zip"), mode="r")
    for start in (0, 64, 960):
        np.testing.assert_array_equal(fast["x"][start : start + 64], plain["x"][start : start + 64])


def test_corrupt_chunk_is_named(store):
    path, _ = store
    corrupt_chunk(path, "images", 0)
    ds = outcore.open_dataset(path)
    np.testing.assert_array_equal(ds["labels"].compute().shape, (300,))  # other fields unaffected
    with pytest.raises(CorruptChunkError, match=r"field 'images', chunk 0 \(samples 0\.\.31, in file images/c/0/0/0/0\)"):
        ds["images"][:10].compute()
    ds["images"][32:64].compute()  # the next chunk of the same shard file is intact
    report = outcore.verify(path, progress=False)
    assert not report.ok and len(report.problems) == 1 and "chunk 0" in report.problems[0]


def test_damage_in_a_later_shard_names_that_shard_file(store):
    path, _ = store  # 10 shard files of one chunk each
    key = shard_key(path, "images", 5)
    corrupt_chunk(path, "images", 5)
    ds = outcore.open_dataset(path)
    with pytest.raises(CorruptChunkError, match=rf"chunk 5 \(samples 160\.\.191, in file {key}\)"):
        list(ds.batches(32, shuffle=False))
    report = outcore.verify(path, progress=False)
    assert not report.ok and len(report.problems) == 1 and key in report.problems[0]
    assert key == "images/c/5/0/0/0"


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_the_crc32c_check_alone_catches_damage_it_is_the_only_guard_for(tmp_path, compression):
    """A flipped byte of a chunk's stored checksum (its bytes intact: Blosc decodes them) and, uncompressed,
    of the chunk's bytes themselves (nothing else looks at them): the crc32c check refuses the chunk."""
    values = (np.arange(64 * 8, dtype=np.uint8).reshape(64, 8) % 251) + 1
    location = tmp_path / "c.zarr"
    outcore.from_arrays({"x": values}, location, chunk_size=16, compression=compression, shuffle_on_write=False,
                        progress=False)
    _, _, nbytes = chunk_location(location, "x", 2)
    for at in [nbytes - 1] + ([3] if compression == "none" else []):
        corrupt_chunk(location, "x", 2, at=at)
        reader = outcore.open_dataset(location).chunk_reader("x")
        with pytest.raises(CorruptChunkError, match=r"chunk 2 .*crc32c checksums differ"):
            reader.read(2)
        np.testing.assert_array_equal(reader.read(1), values[16:32])  # its neighbours are intact
        corrupt_chunk(location, "x", 2, at=at)  # flipped back
        np.testing.assert_array_equal(outcore.open_dataset(location).chunk_reader("x").read(2), values[32:48])


@pytest.mark.parametrize("damage", ["trailing bytes", "an overstated length"])
def test_a_blosc_frame_that_says_another_length_than_is_stored_is_corruption(tmp_path, damage):
    """numcodecs decodes a frame with trailing bytes as if it were whole (one whose header overstates its
    length it refuses, saying only "error -1"): the reader compares the frame's own length (its cbytes) with
    what is stored, and names the chunk either way."""
    from numcodecs import blosc

    values = np.repeat(np.arange(1, 9, dtype=np.uint8), 64).reshape(64, 8)  # compresses: room for more bytes
    location = tmp_path / "b.zarr"
    outcore.from_arrays({"x": values}, location, chunk_size=16, shuffle_on_write=False, progress=False)
    frame = bytearray(blosc.compress(values[16:32].tobytes(), b"lz4", 5))
    if damage == "trailing bytes":
        stored, said = bytes(frame) + b"trailing", len(frame)
    else:
        struct.pack_into("<I", frame, 12, len(frame) + 8)
        stored, said = bytes(frame), len(frame) + 8
    if damage == "trailing bytes":  # numcodecs alone takes it for the chunk
        assert np.frombuffer(blosc.decompress(stored), np.uint8).tobytes() == values[16:32].tobytes()
    replace_chunk(location, "x", 1, stored)
    with pytest.raises(CorruptChunkError, match=rf"chunk 1 .*says it has {said} bytes where {len(stored)} are"):
        outcore.open_dataset(location).chunk_reader("x").read(1)


def test_not_a_store_errors(tmp_path):
    with pytest.raises(NotAStoreError, match="does not exist"):
        outcore.open_dataset(tmp_path / "missing.zarr")
    zarr.open_group(tmp_path / "plain.zarr", mode="w").create_array("x", shape=(3,), dtype="int8")
    with pytest.raises(NotAStoreError, match="not an outcore store"):
        outcore.open_dataset(tmp_path / "plain.zarr")
    (tmp_path / "folder").mkdir()
    with pytest.raises(NotAStoreError, match="not a Zarr group"):
        outcore.open_dataset(tmp_path / "folder")


def test_pickle_codec_is_refused_before_any_read(store):
    path, _ = store
    meta_path = path / "labels" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["codecs"][0]["configuration"]["codecs"].insert(1, {"name": "numcodecs.pickle"})
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UnsafeStoreError, match="array 'labels' uses an object or pickle codec"):
        outcore.open_dataset(path)


def test_truncated_store_field_is_reported(store):
    path, _ = store
    group = zarr.open_group(path, mode="r+")
    group["labels"].resize((100,))
    with pytest.raises(NotAStoreError, match=r"array 'labels' .* holds fewer than the 300 it must"):
        outcore.open_dataset(path)


def test_text_and_html_repr(store):
    path, _ = store
    ds = outcore.open_dataset(path)
    text = repr(ds)
    assert text.splitlines()[0] == f"<outcore.Dataset '{path}': 300 samples in 10 chunks of 32>"
    assert "images  uint8  (300, 8, 8, 3)  input" in text and "classes: a, b, c" in text
    html = ds._repr_html_()
    for cell in ("images", "uint8", "300 × 8 × 8 × 3", "32", "blosc(lz4:5:shuffle)+crc32c", "56.2 KiB", "input",
                 "labels", "target", "3: a, b, c", "total"):  # at least what outcore info shows
        assert f"<td>{cell}</td>" in html, cell
    assert "<th>on disk</th>" in html and "<th>ratio</th>" in html and "<summary>provenance</summary>" in html


def test_progress_bars_in_a_notebook_without_ipywidgets_do_not_warn(monkeypatch):
    import sys
    import types

    from outcore.ingest import progress_bar

    kernel = types.SimpleNamespace(config={"IPKernelApp": {}})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: kernel))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no ipywidgets
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with progress_bar(3, "test", "items") as bar:
            bar.update(3)
    assert type(bar).__module__ == "tqdm.std"

def test_local_tasks_run_each_shared_block_once_and_only_those_asked_for():
    """The ingest's tasks share their arrays' graphs (`task_graph`): each block they need is computed once, and the
    blocks of tasks left out (a resumed ingest's finished shards) not at all."""
    import dask

    from outcore.ingest.scheduler import run_tasks

    made = []

    def block(start: int) -> np.ndarray:
        made.append(start)
        return np.arange(start, start + 4)

    pieces = [da.from_delayed(dask.delayed(block, pure=True)(start), (4,), dtype=np.int64) for start in range(0, 24, 4)]
    shards = list(da.concatenate(pieces).rechunk(8).to_delayed(optimize_graph=False).ravel())  # 3 shards of 2 blocks
    total = dask.delayed(lambda shard, also: int(shard.sum() + also.sum()), pure=False)
    tasks = [total(shards[0], shards[1]), total(shards[2], shards[0])]  # shard 0 asked for twice, shard 1 once
    assert run_tasks(tasks, [1, 1], progress=False, threads=2) == [sum(range(16)), sum(range(16, 24)) + sum(range(8))]
    assert sorted(made) == [0, 4, 8, 12, 16, 20]
    made.clear()
    assert run_tasks(tasks[1:], [1], progress=False, threads=2) == [sum(range(16, 24)) + sum(range(8))]
    assert sorted(made) == [0, 4, 16, 20]



def test_open_by_fsspec_url(store):
    path, arrays = store
    ds = outcore.open_dataset(f"file://{path}")
    assert ds.location == f"file://{path}"
    np.testing.assert_array_equal(ds["labels"].compute(), arrays["labels"])
    batch = next(iter(ds.batches(300, shuffle=False)))  # URLs are read through zarr, not the direct reader
    np.testing.assert_array_equal(batch["images"], arrays["images"])


def test_a_shard_replaced_by_a_folder_is_named(tmp_path):
    ds = make_store(tmp_path)
    shard = tmp_path / "s.zarr" / shard_key(ds.location, "images", 2)
    shard.unlink()
    shard.mkdir()
    with pytest.raises(CorruptChunkError, match=r"field 'images', chunk 2 .*a folder stands where the file should be"):
        outcore.open_dataset(ds.location)["images"].compute()
    with pytest.raises(outcore.StoreChangedError, match=r"images/c/2/0/0/0 is not the one it was when the store was "
                                                        "opened"):
        ds["images"].compute()  # opened before: its file was replaced since


def _edit_attrs(path, change):
    meta_path = path / "zarr.json"
    meta = json.loads(meta_path.read_text())
    change(meta["attributes"]["outcore"])
    meta_path.write_text(json.dumps(meta))


def _set(key, value):
    return lambda attrs: attrs.__setitem__(key, value)


def _set_field(field, key, value):
    return lambda attrs: attrs["fields"][field].__setitem__(key, value)


HOSTILE_ATTRS = [
    (_set("format_version", 0), "format_version 0 is not one outcore ever wrote"),
    (_set("format_version", "1"), "format_version '1' is not an integer"),
    (_set("num_samples", -5), "num_samples -5 is not an integer in 0.."),
    (_set("num_samples", 1999.7), "num_samples 1999.7 is not an integer"),
    (_set("num_samples", True), "num_samples True is not an integer"),
    (_set("chunk_size", 0), "chunk_size 0 is not an integer in 1.."),
    (_set("fields", {}), "fields {} are not a non-empty object"),
    (_set("fields", ["images"]), "are not a non-empty object of field names"),
    (_set("seed", "zero"), "seed 'zero' is not an integer"),
    (_set("shuffled_on_write", "yes"), "shuffled_on_write 'yes' is not true or false"),
    (_set_field("labels", "role", "boss"), "role 'boss' is not one of"),
    (_set_field("labels", "classes", "abc"), "classes 'abc' are not a list of names"),
    (_set_field("images", "encoding", "base64"), "encoding 'base64' is not one of"),
    (_set("num_samples", 2_000_000_000), "array 'images' .* holds fewer than the 2,000,000,000"),
]


@pytest.mark.parametrize(("change", "message"), HOSTILE_ATTRS, ids=[m.split()[0] + str(i) for i, (_, m) in
                                                                      enumerate(HOSTILE_ATTRS)])
def test_hostile_attributes_are_refused_naming_what_is_wrong(store, change, message):
    path, _ = store
    _edit_attrs(path, change)
    with pytest.raises(NotAStoreError, match=message):
        outcore.open_dataset(path)


def test_arrays_that_disagree_with_the_attributes_are_refused(store):
    path, _ = store
    group = zarr.open_group(path, mode="r+")
    group["labels"].resize((2_000_000_000,))  # consistent sizes, claiming far more than the store holds
    _edit_attrs(path, _set("num_samples", 2_000_000_000))
    group["images"].resize((2_000_000_000, 8, 8, 3))
    with pytest.raises(NotAStoreError, match=r"the shard file images/c/\d+/0/0/0 holding its last sample is missing"):
        outcore.open_dataset(path)


def test_labels_retyped_to_floats_are_refused(tmp_path):
    ds = outcore.from_arrays({"labels": np.arange(10)}, tmp_path / "f.zarr", classes={"labels": list("abcdefghij")},
                             progress=False)
    group = zarr.open_group(tmp_path / "f.zarr", mode="r+")
    values = group["labels"][:]
    del group["labels"]
    group.create_array("labels", data=values.astype("float64"), chunks=(ds.chunk_size,))
    with pytest.raises(NotAStoreError, match="field 'labels' holds float64 but was written as int64"):
        outcore.open_dataset(tmp_path / "f.zarr")
    attrs = group.attrs["outcore"]
    del attrs["fields"]["labels"]["dtype"]  # a store written before dtypes were recorded: its classes still say
    group.attrs["outcore"] = attrs
    with pytest.raises(NotAStoreError, match="has class names but holds float64"):
        outcore.open_dataset(tmp_path / "f.zarr")


def test_an_unsafe_codec_on_an_encoded_fields_ranges_is_refused(image_folder, tmp_path):
    outcore.ingest_images(image_folder, tmp_path / "e.zarr", shape=(16, 16, 3), images="encoded", progress=False)
    meta_path = tmp_path / "e.zarr" / "images_ranges" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["data_type"] = "string"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UnsafeStoreError, match="array 'images_ranges' uses an object or pickle codec"):
        outcore.open_dataset(tmp_path / "e.zarr")



def test_damaged_metadata_and_zip_files_are_one_clear_error(store, tmp_path):
    path, _ = store
    (path / "labels" / "zarr.json").write_text("{not json")
    with pytest.raises(NotAStoreError, match="its metadata cannot be read .*JSONDecodeError.*restore it"):
        outcore.open_dataset(path)
    outcore.from_arrays({"x": np.arange(100)}, tmp_path / "z.zarr.zip", progress=False)
    with open(tmp_path / "z.zarr.zip", "r+b") as file:
        file.truncate(100)
    with pytest.raises(NotAStoreError, match="is not a readable zip file .*truncated or damaged"):
        outcore.open_dataset(tmp_path / "z.zarr.zip")


def test_a_store_location_below_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(outcore.StorageError, match="a file stands where a folder of the location should be"):
        outcore.from_arrays({"x": np.arange(10)}, tmp_path / "afile" / "s.zarr", progress=False)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 255, 256 * 4 * 4 - 1, 256 * 4 * 4 + 16])
def test_a_blosc_frame_of_another_length_is_corruption_everywhere(tmp_path, length):
    """A frame with valid checksums that decompresses to fewer (or more) bytes than its chunk read as zeros,
    then as the previous chunk's values (reused buffers), and verify said OK."""
    from numcodecs import blosc

    values = np.arange(1024 * 4 * 4, dtype=np.uint8).reshape(1024, 4, 4) + 1  # no zeros: zeros would show
    ds = outcore.from_arrays({"x": values}, tmp_path / "f.zarr", chunk_size=256, shuffle_on_write=False,
                             compression="zstd", progress=False)
    replace_chunk(tmp_path / "f.zarr", "x", 2, blosc.compress(bytes(length), b"zstd", 5))
    ds = outcore.open_dataset(tmp_path / "f.zarr")
    named = r"field 'x', chunk 2 \(samples 512..767"
    with pytest.raises(CorruptChunkError, match=named):
        list(ds.batches(256, shuffle=False))
    with pytest.raises(CorruptChunkError, match=named):
        list(ds.batches(100, seed=1))  # shuffled: other chunks first, into the buffers chunk 2 would reuse
    with pytest.raises(CorruptChunkError, match=named):
        ds["x"].compute()
    report = outcore.verify(tmp_path / "f.zarr")
    assert not report.ok and "chunk 2" in str(report)


def test_a_frame_that_is_not_blosc_is_corruption(tmp_path):
    outcore.from_arrays({"x": np.ones((512, 8), np.float32)}, tmp_path / "g.zarr", chunk_size=256, progress=False)
    replace_chunk(tmp_path / "g.zarr", "x", 1, b"not a blosc frame at all, but long enough")
    with pytest.raises(CorruptChunkError, match=r"chunk 1 .* is corrupt: "):
        list(outcore.open_dataset(tmp_path / "g.zarr").batches(256, shuffle=False))


def test_fuzzed_frame_lengths_are_all_refused_by_the_reader(tmp_path):
    """Every frame length from 0 to a chunk's bytes and beyond, checksums valid: the chunk reader (what the
    iterator, ds[field] and verify use) refuses each one but the chunk's own size."""
    from numcodecs import blosc

    values = (np.arange(64 * 8, dtype=np.uint8).reshape(64, 8) % 251) + 1
    outcore.from_arrays({"x": values}, tmp_path / "z.zarr", chunk_size=16, shuffle_on_write=False, progress=False)
    nbytes = 16 * 8
    for length in range(nbytes + 20):
        replace_chunk(tmp_path / "z.zarr", "x", 1, blosc.compress(bytes(length), b"lz4", 5))
        reader = outcore.open_dataset(tmp_path / "z.zarr").chunk_reader("x")
        if length == nbytes:
            assert (reader.read(1) == 0).all()  # the chunk's own size: a valid (all-zero) chunk
            continue
        with pytest.raises(CorruptChunkError, match=r"chunk 1 .*Blosc frame holds"):
            reader.read(1)


def test_a_damaged_chunk_read_through_zarr_is_named_by_its_number(tmp_path):
    """An array outside outcore's layout (here zstd chunks, unsharded) is read through zarr; its damaged
    chunk is named by number, samples and file all the same."""
    array = zarr.create_array(zarr.storage.LocalStore(tmp_path / "x"), shape=(64, 4), chunks=(8, 4), dtype="uint8")
    array[:] = np.arange(256, dtype=np.uint8).reshape(64, 4)
    (tmp_path / "x" / "c" / "5" / "0").write_bytes(b"not a zstd frame at all, but long enough")
    array = zarr.open_array(zarr.storage.LocalStore(tmp_path / "x"))
    np.testing.assert_array_equal(read_samples(array, (slice(32, 40),), "x", "here"), array[32:40])
    with pytest.raises(CorruptChunkError, match=r"here: field 'x', chunk 5 \(samples 40\.\.47, in file .*c/5/0\)"):
        read_samples(array, (slice(40, 48),), "x", "here")


def test_a_chunk_larger_than_its_codec_can_make_is_refused_by_the_shard_index(tmp_path):
    """The most a chunk can take: its raw bytes, Blosc's 16-byte header (incompressible data) and the
    crc32c. An index entry one byte larger is refused before the chunk is read, naming the bound."""
    values = np.random.default_rng(0).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8)  # incompressible
    outcore.from_arrays({"x": values}, tmp_path / "s.zarr", chunk_size=4, shuffle_on_write=False, progress=False)
    most = 4 * 8 * 8 * 3 + 16 + 4
    replace_chunk(tmp_path / "s.zarr", "x", 1, bytes(most - 4 + 1))
    with pytest.raises(CorruptChunkError, match=rf"chunk 1 .*chunk sizes outside 4\.\.{most} bytes"):
        list(outcore.open_dataset(tmp_path / "s.zarr").batches(4, shuffle=False))
