"""The direct chunk reader returns exactly what Zarr reads, and names corrupt chunks."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import outcore
from outcore.storage import ShardReader
from outcore.errors import CorruptChunkError


@pytest.fixture(params=["s.zarr", "s.zarr.zip"])
def store(request, tmp_path, rng):
    arrays = {
        "images": rng.integers(0, 256, (300, 5, 4, 3), dtype=np.uint8),
        "labels": rng.integers(-5, 5, 300),
        "score": rng.normal(size=(300, 2)).astype(np.float32),
        "name": np.array([f"sample-{i}" for i in range(300)]),
    }
    path = tmp_path / request.param
    outcore.from_arrays(arrays, path, chunk_size=32, shuffle_on_write=False, progress=False)
    return path, arrays


def test_direct_reads_equal_zarr_reads(store):
    path, _ = store
    ds = outcore.open_dataset(path)
    for name in ds.fields:
        reader = ShardReader(ds.array(name), name, ds.location, len(ds))
        assert reader.direct
        for chunk in range(ds.num_chunks):
            expected = ds.array(name)[chunk * 32 : (chunk + 1) * 32]
            np.testing.assert_array_equal(reader.read(chunk), expected)
            np.testing.assert_array_equal(reader.read(chunk, out=reader.empty()), expected)


def test_uncompressed_store(tmp_path, rng):
    x = rng.integers(0, 1000, (100, 3))
    ds = outcore.from_arrays({"x": x}, tmp_path / "n.zarr", compression="none", chunk_size=16,
                             shuffle_on_write=False, progress=False)
    reader = ShardReader(ds.array("x"), "x", ds.location, len(ds))
    assert reader.direct
    np.testing.assert_array_equal(np.concatenate([reader.read(c) for c in range(ds.num_chunks)]), x)


def test_other_layouts_fall_back_to_zarr(tmp_path, rng):
    array = zarr.create_array(tmp_path / "plain.zarr", shape=(50, 2), dtype="int32", chunks=(8, 2))
    array[:] = np.arange(100).reshape(50, 2)
    reader = ShardReader(array, "plain", "plain.zarr", 50)
    assert not reader.direct
    np.testing.assert_array_equal(reader.read(6), np.arange(96, 100).reshape(2, 2))


def test_flipped_bits_name_the_chunk(tmp_path, rng):
    ds = outcore.from_arrays({"x": rng.integers(0, 256, (2048, 16), dtype=np.uint8)}, tmp_path / "c.zarr",
                             chunk_size=32, shuffle_on_write=False, progress=False)
    shard = tmp_path / "c.zarr" / "x" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-(16 * 8 + 4) : -4]), dtype="<u8").reshape(-1, 2)
    data[int(index[3, 0]) + 10] ^= 0x01  # inside chunk 3
    shard.write_bytes(bytes(data))
    assert ds.array("x").shards[0] == 8 * 32  # eight chunks per shard file
    reader = ShardReader(ds.array("x"), "x", ds.location, len(ds))
    reader.read(2)
    with pytest.raises(CorruptChunkError, match=r"field 'x', chunk 3 \(samples 96\.\.127, in file x/c/0/0\).*crc32c"):
        reader.read(3)
    data[-2] ^= 0x01  # the shard index's own checksum
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError, match="shard index fails its checksum"):
        ShardReader(ds.array("x"), "x", ds.location, len(ds)).read(0)
