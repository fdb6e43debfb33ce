"""The direct shard reader returns exactly what Zarr reads, whatever the codecs, dtypes, shapes and
byte orders, and names corrupt chunks."""

from __future__ import annotations

import tempfile
import threading
import time

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.codecs import BytesCodec

import outcore
from outcore.errors import CorruptChunkError
from outcore.format import Layout
from outcore.storage import ShardReader, create_field, writable
from outcore.testing import chunk_location, corrupt_chunk
from outcore.testing.strategies import compressions, field_arrays


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(values=field_arrays(), compression=compressions(), chunk_size=st.integers(1, 64),
       chunks_per_shard=st.sampled_from([1, 2, 8]), endian=st.sampled_from(["little", "big"]))
def test_direct_reads_equal_zarr_reads(values, compression, chunk_size, chunks_per_shard, endian):
    with tempfile.TemporaryDirectory() as root:
        group = zarr.open_group(root, mode="w")
        layout = Layout(chunk_size, chunk_size * chunks_per_shard)
        array = create_field(group, "x", values.dtype, values.shape[1:], len(values), layout, compression)
        if endian == "big":  # a layout outcore does not write: read through zarr itself
            array = group.create_array("x", shape=values.shape, dtype=values.dtype, chunks=array.chunks,
                                       shards=array.shards, compressors=compression.codecs(),
                                       serializer=BytesCodec(endian="big"), overwrite=True)
        writable(array)[:] = values  # every chunk written, as outcore does
        reader = ShardReader(array, "x", root, len(values))
        assert reader.direct == (endian == "little" or values.dtype.itemsize == 1)
        for chunk in range(-(-len(values) // chunk_size)):
            expected = values[chunk * chunk_size : (chunk + 1) * chunk_size]
            np.testing.assert_array_equal(reader.read(chunk), expected)
            np.testing.assert_array_equal(reader.read(chunk, out=reader.empty()), expected)


def test_other_layouts_fall_back_to_zarr(tmp_path):
    array = zarr.create_array(tmp_path / "plain.zarr", shape=(50, 2), dtype="int32", chunks=(8, 2))
    array[:] = np.arange(100).reshape(50, 2)
    reader = ShardReader(array, "plain", "plain.zarr", 50)
    assert not reader.direct
    np.testing.assert_array_equal(reader.read(6), np.arange(96, 100).reshape(2, 2))


def test_flipped_bits_name_the_chunk(tmp_path, rng):
    ds = outcore.from_arrays({"x": rng.integers(0, 256, (2048, 16), dtype=np.uint8)}, tmp_path / "c.zarr",
                             chunk_size=32, shuffle_on_write=False, progress=False)
    assert ds.array("x").shards[0] == 8 * 32  # eight chunks per shard file
    changed = corrupt_chunk(tmp_path / "c.zarr", "x", 3)
    assert changed == tmp_path / "c.zarr" / "x" / "c" / "0" / "0"
    reader = ds.shard_reader("x")
    reader.read(2)
    with pytest.raises(CorruptChunkError, match=r"field 'x', chunk 3 \(samples 96\.\.127, in file x/c/0/0\).*crc32c"):
        reader.read(3)
    data = bytearray(changed.read_bytes())
    data[-2] ^= 0x01  # the shard index's own checksum
    changed.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError, match="shard index fails its checksum"):
        outcore.open_dataset(ds.location).shard_reader("x").read(0)


def test_chunk_location_finds_the_chunk_bytes_in_zip_stores_too(tmp_path, rng):
    x = rng.integers(0, 256, (256, 4), dtype=np.uint8)
    for name in ("d.zarr", "z.zarr.zip"):
        outcore.from_arrays({"x": x}, tmp_path / name, chunk_size=32, compression="none", shuffle_on_write=False,
                            progress=False)
        path, offset, nbytes = chunk_location(tmp_path / name, "x", 5)
        with open(path, "rb") as file:
            file.seek(offset)
            stored = file.read(nbytes)
        assert stored[:-4] == x[160:192].tobytes()  # uncompressed: the samples, then their crc32c


@pytest.mark.parametrize("fails", [False, True])
def test_threads_that_need_a_shard_index_at_once_read_it_once(tmp_path, rng, monkeypatch, fails):
    """A read-ahead and a read needing a shard's index together: one reads it, the other waits and takes its
    index, or its error (an object store would be asked twice, or pay the failure's deadline twice)."""
    ds = outcore.from_arrays({"x": rng.integers(0, 256, (512, 4), dtype=np.uint8)}, tmp_path / "i.zarr",
                             chunk_size=32, shuffle_on_write=False, progress=False)
    reader = ds.shard_reader("x")
    original, entered, release, calls = reader._read_index_now, threading.Event(), threading.Event(), []

    def slow(shard, file):
        calls.append(shard)
        entered.set()
        assert release.wait(10)
        if fails:
            raise CorruptChunkError("the index, unreadable")
        return original(shard, file)

    monkeypatch.setattr(reader, "_read_index_now", slow)
    results = []

    def read(chunk):
        try:
            results.append(reader.read(chunk))
        except CorruptChunkError as error:
            results.append(error)

    first = threading.Thread(target=read, args=(0,))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=read, args=(1,))
    second.start()
    time.sleep(0.5)  # the second waits on the first's read of the index
    release.set()
    first.join(10), second.join(10)
    assert calls == [0] and len(results) == 2
    if fails:
        assert all(isinstance(result, CorruptChunkError) for result in results)
    else:
        assert sorted(result[0, 0] for result in results) == sorted(ds["x"][[0, 32], 0].compute())
