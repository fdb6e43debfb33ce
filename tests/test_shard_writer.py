"""The direct shard writer writes the very files Zarr writes (any codec, dtype, row shape, byte order, in runs of
whole shard files) and leaves other rows, layouts and read-only stores to Zarr; the small fields' rows an ingest's
tasks save apart read back exactly, and rows never saved, or files not of whole rows, are refused by name."""

from __future__ import annotations

import filecmp
import itertools
import json
import math
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from numcodecs import blosc

import outcore
from outcore.errors import StorageError
from outcore.format import Compression, Layout, raw_above
from outcore.imaging.synthetic import write_image_folder
from outcore.storage import SmallColumn, SmallRows, copy_rows, create_field, writable, write_rows
from outcore.storage.shard_writer import StoreArrays, _direct_codecs
from outcore.testing import chunk_location
from outcore.testing.strategies import compressions, field_arrays

MEMCPYED = 0x02  # a Blosc frame's flag: its bytes copied as they are (level 0)


def _files(root: str) -> dict[str, Path]:
    return {os.path.relpath(os.path.join(folder, name), root): Path(folder, name)
            for folder, _, names in os.walk(root) for name in names}


def _same_files(one: str, other: str) -> bool:
    """Whether the direct writer's files under ``one`` are those zarr wrote under ``other``: the same bytes, but for
    shard files whose chunks a fast codec shrinks too little, which it writes in raw frames (`raw_above`)."""
    mine, theirs = _files(one), _files(other)
    return mine.keys() == theirs.keys() and all(filecmp.cmp(mine[k], theirs[k], shallow=False) or
                                                _same_chunks(mine[k], theirs[k]) for k in mine)


def _same_chunks(mine: Path, theirs: Path) -> bool:
    """Whether shard file ``mine`` holds the chunks of ``theirs``, each in the same Blosc frame, or in a raw one
    (level 0) where theirs is a fast codec's frame of more than `raw_above` bytes."""
    if "c" not in mine.parts:
        return False
    metadata = json.loads(Path(*mine.parts[: mine.parts.index("c")], "zarr.json").read_text())
    sharding = metadata["codecs"][0]["configuration"]
    inner = sharding["chunk_shape"]
    blosc_codec = next((codec["configuration"] for codec in sharding["codecs"] if codec["name"] == "blosc"), None)
    count = metadata["chunk_grid"]["configuration"]["chunk_shape"][0] // inner[0]
    nbytes = math.prod(inner) * np.dtype(metadata["data_type"]).itemsize
    pairs = list(zip(_frames(mine, count), _frames(theirs, count), strict=True))
    return blosc_codec is not None and all(
        ours == zarrs or (ours[2] & MEMCPYED and len(zarrs) > raw_above(blosc_codec["cname"], nbytes)
                          and blosc.decompress(ours) == blosc.decompress(zarrs))
        for ours, zarrs in pairs)


def _frame(location: Path, field: str, chunk: int) -> bytes:
    """Chunk ``chunk`` of ``field``'s Blosc frame as stored, its checksum left out."""
    path, offset, nbytes = chunk_location(location, field, chunk)
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read(nbytes - 4)


def _frames(shard: Path, count: int) -> list[bytes]:
    """The frames of the ``count`` chunks of a shard file (its index at its end), checksums left out."""
    data = shard.read_bytes()
    index = np.frombuffer(data[-4 - 16 * count : -4], "<u8").reshape(count, 2)
    return [data[offset : offset + length - 4] for offset, length in index.tolist() if offset != 2**64 - 1]


@pytest.mark.slow
@pytest.mark.portable
@settings(max_examples=120, deadline=None)
@given(values=field_arrays(), compression=compressions(), chunk_size=st.integers(1, 64),
       chunks_per_shard=st.sampled_from([1, 2, 8]), pieces=st.integers(1, 3))
def test_direct_writes_are_zarrs_files(values, compression, chunk_size, chunks_per_shard, pieces):
    values = values[:chunk_size * 24]  # at most 24 chunks: an example's time is its files', and stays short
    with tempfile.TemporaryDirectory() as by_zarr, tempfile.TemporaryDirectory() as direct:
        layout = Layout(chunk_size, chunk_size * chunks_per_shard)
        arrays = [create_field(zarr.open_group(root, mode="w"), "x", values.dtype, values.shape[1:], len(values),
                               layout, compression) for root in (by_zarr, direct)]
        writable(arrays[0])[:] = values
        assert _direct_codecs(arrays[1], 0, len(values), values) is not None
        shard = layout.shard_size
        bounds = np.linspace(0, -(-len(values) // shard), pieces + 1).astype(int) * shard
        for start, stop in itertools.pairwise(bounds):  # in runs of whole shard files
            write_rows(arrays[1], int(start), values[start:stop])
        assert _same_files(by_zarr, direct)
        np.testing.assert_array_equal(arrays[1][:], values)


@pytest.mark.parametrize("kind", [{"shape": None, "images": "encoded"}, {"shape": (24, 24, 3), "images": "pixels"}])
def test_an_ingest_writes_the_store_zarr_would(tmp_path, monkeypatch, kind):
    write_image_folder(tmp_path / "photos", 45, size=(40, 32), kind="photos")
    options = {"progress": False, "seed": 3, "chunk_size": 8, **kind}
    outcore.ingest_images(tmp_path / "photos", tmp_path / "direct.zarr", **options)
    monkeypatch.setattr("outcore.storage.shard_writer._direct_codecs", lambda *args: None)  # every row through zarr
    outcore.ingest_images(tmp_path / "photos", tmp_path / "zarr.zarr", **options)
    direct, by_zarr = _files(str(tmp_path / "direct.zarr")), _files(str(tmp_path / "zarr.zarr"))
    assert direct.keys() == by_zarr.keys() and len(direct) > 10
    different = [name for name in direct if not filecmp.cmp(direct[name], by_zarr[name], shallow=False)]
    assert [name for name in different if not _same_chunks(direct[name], by_zarr[name])] == ["zarr.json"]  # the
    # group's (when each was made, and its generation); shard files differ only by chunks stored raw
    made = [zarr.open_group(tmp_path / name, mode="r").attrs.asdict() for name in ("direct.zarr", "zarr.zarr")]
    for attrs in made:
        attrs["outcore"]["provenance"].pop("created")
        attrs["outcore"].pop("generation")
    assert made[0] == made[1]


@pytest.mark.parametrize("in_c", [True, False])
def test_chunks_a_fast_codec_barely_shrinks_are_stored_raw(tmp_path, monkeypatch, in_c):
    """lz4 (and blosclz) keep a chunk's frame only where it saves 1/8 of its bytes, else the chunk is stored in a raw
    frame (level 0: decoding it is a copy), by the C extension and numcodecs alike; zstd keeps every byte it saves;
    zarr reads both back."""
    if not in_c:
        monkeypatch.setattr("outcore.storage.shard_writer.encode_at_once", None)
    rng = np.random.default_rng(0)
    values = rng.integers(0, 256, (64, 1000), dtype=np.uint8)
    values[:32, :40] = 0  # chunks 0 and 1 (16 rows each) shrink by about 4 %
    values[32:, :500] = 0  # chunks 2 and 3 by about half
    for cname, raw in (("lz4", [True, True, False, False]), ("zstd", [False] * 4)):
        group = zarr.open_group(tmp_path / f"{cname}-{in_c}.zarr", mode="w")
        array = create_field(group, "x", np.uint8, (1000,), 64, Layout(16, 64), Compression(cname))
        write_rows(array, 0, values)
        frames = [_frame(tmp_path / f"{cname}-{in_c}.zarr", "x", chunk) for chunk in range(4)]
        assert [bool(frame[2] & MEMCPYED) for frame in frames] == raw
        assert all(len(frame) < 16_000 for frame, stored in zip(frames, raw, strict=True) if not stored)
        np.testing.assert_array_equal(zarr.open_group(tmp_path / f"{cname}-{in_c}.zarr", mode="r")["x"][:], values)


def test_an_encoded_field_s_files_keep_every_byte_lz4_saves_where_pixels_are_stored_raw(tmp_path):
    """Photos' pixels barely compress: stored raw. Their JPEGs' bytes (headers alike from file to file) lz4 shrinks by
    less than 1/8 too, but an encoded field's files keep every byte saved: reading them is little of decoding them."""
    write_image_folder(tmp_path / "photos", 24, size=(128, 128), kind="photos")
    options = {"progress": False, "chunk_size": 32, "shape": (128, 128, 3)}
    for images in ("pixels", "encoded"):
        outcore.ingest_images(tmp_path / "photos", tmp_path / f"{images}.zarr", images=images, **options)
    pixels, files = ([_frame(tmp_path / f"{images}.zarr", "images", chunk) for chunk in range(3)]
                     for images in ("pixels", "encoded"))
    assert [bool(frame[2] & MEMCPYED) for frame in pixels] == [True, True, False]  # the last, two thirds zeros, shrinks
    assert [bool(frame[2] & MEMCPYED) for frame in files] == [False] * 3
    nbytes = int.from_bytes(files[0][4:8], "little")  # the chunk's bytes, as Blosc's header says
    assert raw_above("lz4", nbytes) < len(files[0]) < nbytes  # kept, though it saves less than 1/8 (the last chunk's
    # files fill a third of its bytes: it saves more)


def test_rows_it_does_not_write_itself_go_to_zarr(tmp_path):
    values = np.arange(100, dtype=np.int64)
    group = zarr.open_group(tmp_path / "s.zarr", mode="w")
    array = create_field(group, "x", values.dtype, (), 100, Layout(4, 16), Compression())
    assert _direct_codecs(array, 0, 100, values) is not None
    for start, stop, rows in [(4, 20, values[4:20]),  # not from a shard's first row
                               (0, 20, values[:20]),  # not to a shard's end, nor the array's
                               (0, 16, values[:16].astype(np.int32)),  # another dtype: zarr casts
                               (0, 16, list(range(16)))]:  # not an array
        assert _direct_codecs(array, start, stop, rows) is None
        write_rows(array, start, rows)
        np.testing.assert_array_equal(array[start:stop], values[start:stop])
    plain = zarr.create_array(tmp_path / "plain.zarr", shape=(10,), chunks=(4,), dtype="i8")  # no shards
    write_rows(plain, 0, values[:10])
    assert _direct_codecs(plain, 0, 10, values[:10]) is None
    np.testing.assert_array_equal(plain[:], values[:10])
    read_only = zarr.open_group(tmp_path / "s.zarr", mode="r")["x"]
    assert _direct_codecs(read_only, 0, 16, values[:16]) is None
    with pytest.raises(Exception, match="read-only|read only"):
        write_rows(read_only, 0, values[:16])


def test_small_rows_read_back_across_files_and_refuse_rows_never_saved(tmp_path):
    group = zarr.open_group(tmp_path / "s.zarr", mode="w")
    layout = Layout(4, 8)
    create_field(group, "images", np.uint8, (16, 16), 40, layout, Compression())
    create_field(group, "labels", np.int64, (), 40, layout, Compression(), small=True)
    create_field(group, "boxes", np.float32, (4,), 40, layout, Compression(), small=True)
    small = SmallRows.of(group, tmp_path / "small", chunk_size=4, shard_size=8).make()
    assert sorted(small.names) == ["boxes", "labels"]
    labels, boxes = small.columns["labels"], small.columns["boxes"]
    values = np.arange(40) * 7
    for start in range(0, 40, 8):  # each task's rows: a file of its own, in any order
        labels[start : start + 8] = values[start : start + 8].astype(np.int32)  # saved as the field's dtype
    assert (tmp_path / "small" / "labels" / "8.rows").stat().st_size == 8 * 8  # saved as the field's int64
    np.testing.assert_array_equal(labels[5:29], values[5:29])
    target = group["labels"]
    copy_rows(target, [(labels, 0, 40)])
    np.testing.assert_array_equal(target[:], values)
    with pytest.raises(ValueError, match=r"field 'boxes': rows 0..7 .* shape \(8, 3\)"):
        boxes[0:8] = np.zeros((8, 3))
    boxes[0:8] = np.ones((8, 4))
    boxes[16:24] = np.ones((8, 4))  # rows 8..15: saved by no task
    with pytest.raises(StorageError, match=r"field 'boxes': rows from 8 on \(of 0..23\) were saved by no task"):
        boxes[0:24]


def test_a_file_of_other_rows_is_refused(tmp_path):
    column = SmallColumn(str(tmp_path), "boxes", "<f4", (4,))
    column[0:2] = np.ones((2, 4))
    (tmp_path / "2.rows").write_bytes(b"\x00" * 20)  # as if changed: not whole rows of 16 bytes
    np.testing.assert_array_equal(column[0:2], np.ones((2, 4)))
    with pytest.raises(StorageError, match=r"field 'boxes': .*2.rows holds 20 bytes, not whole rows of <f4 \(4,\)"):
        column[0:3]


def test_store_arrays_open_each_array_once_and_pickle_without_them(tmp_path, monkeypatch):
    """`StoreArrays`: the write tasks of an ingest share each array, opened once in a process (its metadata read
    and parsed once, its direct layout found once: `_direct_format`); a pickled copy (a Dask worker's) opens its
    own, and an array made anew where it was is another object, whose layout is found anew."""
    location = tmp_path / "s.zarr"
    create_field(zarr.open_group(location, mode="w"), "x", np.dtype("i8"), (), 8, Layout(2, 4), Compression())
    opened = []
    open_group = zarr.open_group
    monkeypatch.setattr(zarr, "open_group", lambda *args, **kwargs: opened.append(args) or open_group(*args, **kwargs))
    arrays = StoreArrays(str(location))
    first = arrays["x"]
    assert arrays["x"] is first and len(opened) == 1
    write_rows(first, 0, np.arange(8))
    copy = pickle.loads(pickle.dumps(arrays))
    assert copy["x"] is not first and copy["x"][:].tolist() == list(range(8)) and len(opened) == 2
    group = zarr.open_group(location, mode="r+")
    del group["x"]
    create_field(group, "x", np.dtype("i8"), (), 8, Layout(4, 8), Compression.parse("none"))
    again = StoreArrays(str(location))["x"]
    write_rows(again, 0, np.arange(8) * 3)
    assert [codec["name"] for codec in _direct_codecs(first, 0, 8, np.arange(8))] == ["bytes", "blosc", "crc32c"]
    assert [codec["name"] for codec in _direct_codecs(again, 0, 8, np.arange(8))] == ["bytes", "crc32c"]
    assert zarr.open_array(location / "x", mode="r")[:].tolist() == (np.arange(8) * 3).tolist()
