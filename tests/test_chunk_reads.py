"""A chunk of a local shard file read, checked and decoded in one C call (`outcore.storage.chunk_reads`), and a whole
file read in another: the same bytes as Python's calls read, the file's stamp with them, and nothing vouched for that
is not so: every failure is left to the shard reader (or Python's own calls), which name it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numcodecs import blosc

import outcore
from outcore.errors import CorruptChunkError, ImageError
from outcore.format import pack_regions
from outcore.imaging import read_image_file
from outcore.ingest import fields
from outcore.ingest.fields import file_stats, missing_files, regular_files
from outcore.iterate.readers import chunk_readers
from outcore.iterate.runs import ChunkBuffers
from outcore.storage import ShardReader, chunk_reads, page_cache, shard_reader
from outcore.storage.pins import stamp_of
from outcore.testing import chunk_location, corrupt_chunk, write_image_folder

needs_extension = pytest.mark.skipif(chunk_reads.read_at_once is None,
                                     reason=f"chunks are not read in C here: {chunk_reads.how()}")


@needs_extension
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), cut=st.integers(0, 5000))
def test_the_checksum_is_the_crc32c_package_s(data, cut):
    from outcore.storage import _chunks

    assert _chunks.crc32c(data) == crc32c.crc32c(data)
    assert _chunks.crc32c(data[cut:], _chunks.crc32c(data[:cut])) == crc32c.crc32c(data)  # continued


@needs_extension
@pytest.mark.parametrize("size", [12_287, 12_288, 12_289, 2 * 12_288 + 7, 100_003, 1 << 20])
def test_the_checksum_of_buffers_checked_in_three_lanes(size):
    """From 3 x 4 KiB on, three chains of the instruction check a buffer's lanes at once and their registers are
    carried over the lanes after them: every length around a round's end, and a checksum continued mid-lane."""
    from outcore.storage import _chunks

    data = np.random.default_rng(size).integers(0, 256, size, np.uint8).tobytes()
    assert _chunks.crc32c(data) == crc32c.crc32c(data)
    for cut in (1, 4096, 5000, size // 2, size - 1):
        assert _chunks.crc32c(data[cut:], _chunks.crc32c(data[:cut])) == crc32c.crc32c(data)


@pytest.mark.skipif(chunk_reads.encode_at_once is None, reason="chunks are not encoded in C here")
@pytest.mark.parametrize("dtype", ["u1", "<i8", "<f4"])
@pytest.mark.parametrize(("cname", "shuffle", "blocksize"), [("lz4", blosc.SHUFFLE, 0), ("zstd", blosc.BITSHUFFLE, 0),
                                                             ("lz4", blosc.NOSHUFFLE, 4096), ("blosclz", blosc.SHUFFLE, 0)])
def test_chunks_encoded_at_once_are_numcodecs_frames_and_their_checksums(dtype, cname, shuffle, blocksize):
    """Each chunk's bytes in a shard file written by one call: the Blosc frame numcodecs makes with the same settings
    (on this thread, which numcodecs compresses on with its threads, and on another, where it does not), then its
    crc32c, or numcodecs' raw frame (level 0) where that frame has more than ``raw_above`` bytes; Blosc refusing the
    settings is None, for the writer's Python path to raise its error."""
    rng = np.random.default_rng(len(dtype) + shuffle)
    chunks = np.concatenate([np.zeros(900), rng.integers(0, 40, 1800)]).astype(dtype)  # one that compresses well
    size = chunks.nbytes // 3
    out, index = np.empty(3 * (size + 20), np.uint8), np.zeros((3, 2), np.uint64)
    written = chunk_reads.encode_at_once(chunks, 3, chunks.itemsize, 5, shuffle, cname, blocksize, size + 16, out, index)
    frames = [blosc.compress(part, cname.encode(), 5, shuffle, blocksize) for part in np.split(chunks, 3)]
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(lambda: [blosc.compress(part, cname.encode(), 5, shuffle, blocksize)
                                    for part in np.split(chunks, 3)]).result() == frames
    expected = b"".join(frame + crc32c.crc32c(frame).to_bytes(4, "little") for frame in frames)
    assert written == len(expected) and out[:written].tobytes() == expected
    assert index.tolist() == [[0, len(frames[0]) + 4], [len(frames[0]) + 4, len(frames[1]) + 4],
                              [len(frames[0]) + len(frames[1]) + 8, len(frames[2]) + 4]]
    assert len(frames[0]) < size // 4  # the zeros compressed
    raw = [frames[0], *(blosc.compress(part, cname.encode(), 0, shuffle, blocksize) for part in np.split(chunks, 3)[1:])]
    assert all(len(frame) > len(frames[0]) for frame in frames[1:])  # their frames made again raw, not the zeros'
    written = chunk_reads.encode_at_once(chunks, 3, chunks.itemsize, 5, shuffle, cname, blocksize, len(frames[0]), out,
                                         index)
    assert out[:written].tobytes() == b"".join(frame + crc32c.crc32c(frame).to_bytes(4, "little") for frame in raw)
    assert [len(frame) for frame in raw[1:]] == [size + 16] * 2  # a raw frame: its header, then the bytes
    assert chunk_reads.encode_at_once(chunks, 3, chunks.itemsize, 10, shuffle, cname, blocksize, size + 16, out,
                                      index) is None


def _store(tmp_path, rng, compression):
    """A store of 2,000 samples in chunks of 32 by ``compression``; ``"raw"``: lz4, its chunks (all but the first
    few) shrinking too little to be kept compressed, in raw frames (`raw_above`)."""
    values = rng.integers(0, 2**31 if compression == "raw" else 1000, (2000, 5, 3)).astype(np.int32)
    values[:100] = 7  # chunks that compress well, and others not
    outcore.from_arrays({"x": values}, tmp_path / f"{compression}.zarr", chunk_size=32,
                        compression="lz4" if compression == "raw" else compression, shuffle_on_write=False,
                        progress=False)
    return tmp_path / f"{compression}.zarr", values


@needs_extension
@pytest.mark.parametrize("compression", ["lz4", "none", "raw"])
def test_a_chunk_read_at_once_is_its_samples_and_its_file_s_stamp(tmp_path, rng, compression):
    location, values = _store(tmp_path, rng, compression)
    for chunk in range(10):
        path, offset, nbytes = chunk_location(location, "x", chunk)
        if compression == "raw":  # a raw frame past the chunks of 7s (chunk 3 holds 4 of them): a header, the bytes
            assert (nbytes == 32 * 15 * 4 + 16 + 4) == (chunk >= 3)
        out = np.full((32, 5, 3), -1, np.int32)
        stamp = chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(nbytes), out, compression != "none")
        assert stamp == stamp_of(os.stat(path))
        kept = values[chunk * 32 : (chunk + 1) * 32]
        np.testing.assert_array_equal(out[: len(kept)], kept)


@needs_extension
@pytest.mark.parametrize("compression", ["lz4", "none", "raw"])
@pytest.mark.parametrize("mapped", [True, False])
def test_what_a_read_at_once_cannot_vouch_for_is_none(tmp_path, rng, compression, mapped):
    """Files missing or not regular, ranges past a file's end or not a chunk's, an out of another size, a damaged
    chunk: None, read in place (its file mapped, its pages in memory) or by pread alike."""
    location, _ = _store(tmp_path, rng, compression)
    blosc = compression != "none"
    path, offset, nbytes = chunk_location(location, "x", 4)
    scratch, out = bytearray(nbytes + 64), np.empty((32, 5, 3), np.int32)
    read = chunk_reads.read_at_once
    was = chunk_reads.map_files(mapped) if chunk_reads.map_files is not None else None
    try:
        assert read(str(path), offset, nbytes, scratch, out, blosc) is not None
        assert read(str(path) + ".gone", offset, nbytes, scratch, out, blosc) is None  # missing
        assert read(str(path.parent), offset, nbytes, scratch, out, blosc) is None  # a folder
        assert read(str(path), os.stat(path).st_size - 8, nbytes, scratch, out, blosc) is None  # past the file's end
        assert read(str(path), offset, nbytes, scratch, np.empty((31, 5, 3), np.int32), blosc) is None  # another size
        assert read(str(path), offset + 1, nbytes, scratch, out, blosc) is None  # not the chunk's bytes: checksum
        corrupt_chunk(location, "x", 4)
        assert read(str(path), offset, nbytes, scratch, out, blosc) is None
    finally:
        if was is not None:
            chunk_reads.map_files(was)


@needs_extension
@pytest.mark.parametrize("mapped", [True, False])
def test_a_frame_of_a_raw_frame_s_size_that_is_not_raw_is_decompressed_as_any_other(tmp_path, rng, mapped):
    """A chunk of the size of a raw frame is read by pread straight into out; one whose header says it is compressed
    (Blosc keeps a compressed frame that fits) is put together again and decompressed: here, bytes no frame holds,
    which Blosc refuses (None). Its raw twin, checksum and all, is read."""
    location, values = _store(tmp_path, rng, "raw")
    path, offset, nbytes = chunk_location(location, "x", 4)
    frame = bytearray(Path(path).read_bytes()[offset : offset + nbytes - 4])
    assert frame[2] & 2 and len(frame) == 32 * 15 * 4 + 16  # raw: Blosc's memcpyed flag
    was = chunk_reads.map_files(mapped) if chunk_reads.map_files is not None else None
    try:
        for flags, expected in ((frame[2], values[128:160]), (frame[2] & ~2, None)):
            frame[2] = flags
            written = tmp_path / f"frame-{flags}"
            written.write_bytes(bytes(frame) + crc32c.crc32c(bytes(frame)).to_bytes(4, "little"))
            out = np.full((32, 5, 3), -1, np.int32)
            stamp = chunk_reads.read_at_once(str(written), 0, nbytes, bytearray(nbytes), out, True)
            assert (stamp is None) == (expected is None)
            if expected is not None:
                np.testing.assert_array_equal(out, expected)
    finally:
        if was is not None:
            chunk_reads.map_files(was)


@needs_extension
@pytest.mark.parametrize("compression", ["none", "raw"])
@pytest.mark.parametrize("mapped", [True, False])
def test_a_large_chunk_is_read_whole_into_an_out_that_begins_anywhere(tmp_path, rng, compression, mapped):
    """Chunks checked and copied in blocks of 48 KiB, each written past the caches in whole cache lines of out
    (`_stream_copy.h`): a chunk of two blocks and part of a third, into outs beginning at any byte, is its samples,
    and nothing before or after out is written."""
    values = rng.integers(0, 256, (96, 3001), dtype=np.uint8)
    location = tmp_path / "large.zarr"
    outcore.from_arrays({"x": values}, location, chunk_size=32, compression="lz4" if compression == "raw" else "none",
                        shuffle_on_write=False, progress=False)
    path, offset, nbytes = chunk_location(location, "x", 1)
    assert nbytes == 32 * 3001 + (16 if compression == "raw" else 0) + 4  # raw: a header, the bytes, the checksum
    was = chunk_reads.map_files(mapped) if chunk_reads.map_files is not None else None
    try:
        for shift in (0, 1, 9, 15):
            space = np.full(32 * 3001 + 64, 7, np.uint8)
            out = space[shift : shift + 32 * 3001].reshape(32, 3001)
            for _ in range(2):  # the first read brings its pages in (pread), the second reads them in place if mapped
                stamp = chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(nbytes), out, compression == "raw")
                assert stamp == stamp_of(os.stat(path))
                np.testing.assert_array_equal(out, values[32:64])
            assert (space[:shift] == 7).all() and (space[shift + 32 * 3001 :] == 7).all()
    finally:
        if was is not None:
            chunk_reads.map_files(was)


@needs_extension
def test_the_reader_reads_at_once_once_it_knows_a_shard_s_index_and_names_what_fails(tmp_path, rng, monkeypatch):
    location, values = _store(tmp_path, rng, "zstd")
    reader = outcore.open_dataset(location).shard_reader("x")
    layout, calls = reader._layout, []

    def counted(*args):
        calls.append(args[1])  # the chunk's offset in its file
        return chunk_reads.read_at_once(*args)

    monkeypatch.setattr(layout, "read_at_once", counted)
    for chunk in range(10):
        np.testing.assert_array_equal(reader.read(chunk), values[chunk * 32 : (chunk + 1) * 32])
    # the first chunk read of each shard too, once Python's calls have read its index (a new reader each epoch)
    assert reader.array.shards[0] // 32 > 1 and calls == [chunk_location(location, "x", chunk)[1] for chunk in range(10)]
    corrupt_chunk(location, "x", 5)  # the file keeps its stamp: the call fails, the reader names the chunk
    with pytest.raises(CorruptChunkError, match=r"field 'x', chunk 5 \(samples 160\.\.191.*crc32c"):
        reader.read(5)


@needs_extension
@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_chunks_read_many_at_once_are_each_as_read_at_once(tmp_path, rng, compression):
    """One call reads several chunks through one scratch buffer: each the bytes and stamp one read gives, None for
    each it cannot vouch for, the others read all the same."""
    location, values = _store(tmp_path, rng, compression)
    blosc = compression != "none"
    requests = []
    for chunk in (0, 3, 4, 5):
        path, offset, nbytes = chunk_location(location, "x", chunk)
        requests.append((str(path), offset, nbytes, np.full((32, 5, 3), -1, np.int32), blosc))
    requests[1] = (requests[1][0] + ".gone", *requests[1][1:])  # missing
    requests[2] = (requests[2][0], requests[2][1] + 1, *requests[2][2:])  # not the chunk's bytes: its checksum
    stamps = chunk_reads.read_many_at_once(requests, bytearray(max(request[2] for request in requests)))
    assert stamps == [stamp_of(os.stat(requests[0][0])), None, None, stamp_of(os.stat(requests[3][0]))]
    for chunk, request in ((0, requests[0]), (5, requests[3])):
        np.testing.assert_array_equal(request[3], values[chunk * 32 : (chunk + 1) * 32])
    with pytest.raises(TypeError, match="read-write bytes-like"):  # a strided out: refused before anything is read
        chunk_reads.read_many_at_once([requests[0], (*requests[3][:3], requests[3][3][:, ::2], blosc)],
                                      bytearray(1 << 16))
    if blosc:  # a frame is read into the scratch buffer before it is decompressed
        with pytest.raises(ValueError, match="scratch"):
            chunk_reads.read_many_at_once(requests[:1], bytearray(4))


@needs_extension
def test_a_read_task_s_chunks_are_read_in_one_call_and_one_that_fails_is_named(tmp_path, rng, monkeypatch):
    """A read task reads the stored values of its chunks' fields together (`ChunkBuffers.read_many`, by
    `ShardReader.read_vouched`), once their shards' indexes are known: the same samples, one C call for them all; a
    chunk that call cannot vouch for is read again by its reader, and one that fails is named in its place while the
    others are read."""
    values = rng.integers(0, 1000, (2000, 5, 3)).astype(np.int32)
    labels = np.arange(2000)
    location = tmp_path / "two.zarr"
    outcore.from_arrays({"x": values, "y": labels}, location, chunk_size=32, shuffle_on_write=False, progress=False)
    ds = outcore.open_dataset(location)
    buffers = ChunkBuffers({"x": ds.shard_reader("x"), "y": ds.shard_reader("y")})
    for reader in buffers.readers.values():  # every shard's index read
        for chunk in range(0, 10, reader.array.shards[0] // 32):
            reader.read(chunk)
    calls = []
    read_many = chunk_reads.read_many_at_once
    monkeypatch.setattr(shard_reader, "read_many_at_once",
                        lambda requests, scratch: calls.append(len(requests)) or read_many(requests, scratch))

    def same(got, chunk):
        assert list(got[0]) == ["x", "y"] and len(got[1]) == 2  # a buffer each
        np.testing.assert_array_equal(got[0]["x"], values[chunk * 32 : (chunk + 1) * 32])
        np.testing.assert_array_equal(got[0]["y"], labels[chunk * 32 : (chunk + 1) * 32])

    for first in range(0, 8, 2):
        for chunk, got in zip((first, first + 1), buffers.read_many([first, first + 1]), strict=True):
            same(got, chunk)
            buffers.give(got[1])
    assert calls == [4] * 4  # two fields of two chunks, one call a task
    corrupt_chunk(location, "y", 2)
    got = buffers.read_many([1, 2, 3])
    same(got[0], 1)
    same(got[2], 3)
    assert isinstance(got[1], CorruptChunkError) and re.search(r"field 'y', chunk 2 .*crc32c", str(got[1]))
    with pytest.raises(CorruptChunkError, match=r"field 'y', chunk 2 .*crc32c"):
        buffers.read(2)
    corrupt_chunk(location, "x", 5)  # the first field: the chunk after it is still read as its own
    got = buffers.read_many([5, 6])
    assert isinstance(got[0], CorruptChunkError) and re.search(r"field 'x', chunk 5 .*crc32c", str(got[0]))
    same(got[1], 6)


@needs_extension
def test_a_replaced_shard_file_s_chunks_are_read_anew_then_vouched_for_from_its_new_index(tmp_path):
    """A read task's C call reads each chunk as its shard's index, once read, says (`_ShardIndex.asks`). A Writer
    replaces its last shard file as it grows: the reads of that file's chunks no longer match its version, the call
    vouches for none of them, the reader reads them from the new file (and its index), and the call vouches for the
    reads of that index after that."""
    writer = outcore.Writer(tmp_path / "g.zarr", chunk_size=16)
    writer.append({"x": np.arange(37), "y": np.arange(37) * 2})
    writer.flush()
    ds = outcore.open_dataset(tmp_path / "g.zarr")
    readers = [ds.shard_reader("x"), ds.shard_reader("y")]

    def vouched():
        reads = [(reader, chunk, reader.empty()) for chunk in (0, 2) for reader in readers]
        got = ShardReader.read_vouched(reads)
        return [None if values is None else values.tolist() for values in got], reads

    assert vouched()[0] == [None] * 4  # no index read yet: each chunk is read by `read`
    for reader in readers:
        reader.read(0)
    expected = [list(range(16)), list(range(0, 32, 2)), list(range(32, 37)), list(range(64, 74, 2))]
    assert vouched()[0] == expected
    writer.append({"x": np.arange(37, 74), "y": np.arange(37, 74) * 2})
    writer.flush()  # its one shard file replaced, in one rename
    got, reads = vouched()
    assert got == [None] * 4
    assert [reader.read(chunk, out).tolist() for reader, chunk, out in reads] == expected  # the store's 37 samples
    assert vouched()[0] == expected
    writer.close()


@needs_extension
@pytest.mark.parametrize("own_sizes", [False, True])
def test_an_encoded_field_s_ranges_bytes_and_shapes_are_read_with_the_other_fields(tmp_path, own_sizes, monkeypatch):
    """A read task reads an encoded picture field's ranges, bytes and (pictures of their own sizes) shapes in the
    same C call as the other fields' values (`EncodedChunks.sources`): the chunks its reader reads, sample for sample;
    a damaged bytes chunk is named in its place while the others are read."""
    write_image_folder(tmp_path / "pictures", 24, classes=("a",), size=(40, 56), kind="photos", seed=0)
    write_image_folder(tmp_path / "pictures", 24, classes=("b",), size=(48, 36) if own_sizes else (40, 56),
                       kind="photos", seed=1)
    location = tmp_path / "encoded.zarr"
    ds = outcore.ingest_images(tmp_path / "pictures", location, shape=None if own_sizes else (40, 56, 3),
                               images="encoded", chunk_size=8, progress=False)
    readers = chunk_readers(ds, ["images", "labels"])
    expected = {chunk: (readers["images"].read(chunk), readers["labels"].read(chunk).copy()) for chunk in range(6)}
    buffers = ChunkBuffers(readers)  # every shard's index read above: the call vouches for every part
    calls, read_many = [], chunk_reads.read_many_at_once
    monkeypatch.setattr(shard_reader, "read_many_at_once",
                        lambda requests, scratch: calls.append(len(requests)) or read_many(requests, scratch))
    for first in (0, 2, 4):
        for chunk, (values, taken) in zip((first, first + 1), buffers.read_many([first, first + 1]), strict=True):
            images, labels = expected[chunk]
            assert len(values["images"]) == len(images) == 8
            for k in range(8):
                np.testing.assert_array_equal(values["images"][k], images[k])
            np.testing.assert_array_equal(values["labels"], labels)
            buffers.give(taken)
    assert calls == [2 * (4 if own_sizes else 3)] * 3  # bytes, ranges (shapes) and labels of two chunks
    corrupt_chunk(location, "images", 1)
    got = buffers.read_many([0, 1])
    assert isinstance(got[1], CorruptChunkError) and re.search(r"field 'images', chunk 1 .*crc32c", str(got[1]))
    np.testing.assert_array_equal(got[0][0]["images"][3], expected[0][0][3])


def test_an_iterator_made_each_epoch_reads_no_shard_index_again(tmp_path, rng, monkeypatch):
    """A store's readers share the shard indexes they read (`Store.shard_indexes`): the iterator of the next epoch,
    made anew, reads every chunk and no index; another store opened on the same files reads its own."""
    location, values = _store(tmp_path, rng, "lz4")
    read, original = [], shard_reader.ShardReader._read_index_now
    monkeypatch.setattr(shard_reader.ShardReader, "_read_index_now",
                        lambda self, shard, file: read.append((self.field, shard)) or original(self, shard, file))
    ds = outcore.open_dataset(location)
    shards = -(-ds.num_chunks * ds.chunk_size // ds.array("x").shards[0])

    def epoch(store):
        got = np.concatenate([batch["x"] for batch in store.batches(64, shuffle=True, fields=["x"])])
        np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(values, axis=0))

    epoch(ds)
    assert sorted(read) == [("x", shard) for shard in range(shards)]
    read.clear()
    epoch(ds)
    assert read == []
    epoch(outcore.open_dataset(location))
    assert len(read) == shards


@needs_extension
def test_readers_made_each_epoch_read_into_their_thread_s_one_buffer(tmp_path, rng):
    """An iterator made each epoch opens new readers: they read into the buffer the thread's earlier readers grew
    (a new one's pages are faulted in again), each reader's chunks still its own field's."""
    location, values = _store(tmp_path, rng, "zstd")
    ds = outcore.open_dataset(location)
    for epoch in range(2):
        reader = ds.shard_reader("x")
        for chunk in range(10):
            np.testing.assert_array_equal(reader.read(chunk), values[chunk * 32 : (chunk + 1) * 32])
        if epoch == 0:
            grown = shard_reader._SCRATCH.buffer
    assert shard_reader._SCRATCH.buffer is grown  # the second reader allocated none


def test_a_thread_s_read_buffer_grows_by_powers_of_two_as_chunks_grow_by_bytes():
    """Compressed chunks differ by a few bytes: a buffer grown to each new largest one would be allocated again
    and again (holding the GIL); grown to a power of two, it is allocated once for every size up to it."""
    def grow():
        buffer = shard_reader._scratch(1 << 20)
        assert len(buffer) == 1 << 20 and buffer.dtype == np.uint8 and buffer.flags.c_contiguous
        assert all(shard_reader._scratch(size) is buffer for size in range(1000, 1 << 20, 4099))
        assert len(shard_reader._scratch((1 << 20) + 1)) == 1 << 21

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: no buffer yet
        pool.submit(grow).result()


def test_outcore_native_0_reads_with_python_s_calls(tmp_path, rng):
    location, values = _store(tmp_path, rng, "zstd")
    code = ("import numpy, outcore; from outcore.storage import chunk_reads; print(chunk_reads.how()); "
            f"reader = outcore.open_dataset({str(location)!r}).shard_reader('x'); "
            "print(int(sum(reader.read(c).sum() for c in range(10))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "OUTCORE_NATIVE": "0"})
    how, total = done.stdout.split("\n")[:2]
    assert how == "Python's calls (turned off by OUTCORE_NATIVE=0)" or "not built" in how
    assert int(total) == int(values[:320].sum())


@needs_extension
@settings(max_examples=50, deadline=None)
@given(size=st.sampled_from([0, 1, 4095, 4096, 52_000, (1 << 20) + 3]), seed=st.integers(0, 2**32 - 1))
def test_a_file_read_at_once_is_its_bytes(tmp_path_factory, size, seed):
    path = tmp_path_factory.mktemp("files") / "picture.jpg"
    data = np.random.default_rng(seed).integers(0, 256, size, np.uint8).tobytes()
    path.write_bytes(data)
    assert chunk_reads.read_file_at_once(str(path)) == data
    assert chunk_reads.read_file_at_once(path) == data  # any path-like, as open() takes
    assert read_image_file(str(path)) == data


@needs_extension
def test_files_read_at_once_are_their_bytes_or_none_where_they_are_not_as_said(tmp_path):
    """`read_files_at_once`: each file of the size it was said to be is its bytes; one of another size (it changed),
    missing, a folder, a record's reference and a URL are None, for the caller's reader to read or name."""
    rng = np.random.default_rng(5)
    sizes = [0, 1, 4096, 52_000, (1 << 20) + 3]
    paths = []
    for size in sizes:
        paths.append(str(tmp_path / f"{size}.jpg"))
        Path(paths[-1]).write_bytes(rng.bytes(size))
    others = [(paths[3], 51_999), (paths[3], 52_001), (str(tmp_path / "missing.jpg"), 0), (str(tmp_path), 0),
              (f"{paths[3]}::record 1 @0+10", 52_000), ("s3://bucket/52000.jpg", 52_000)]
    files = chunk_reads.read_files_at_once([*paths, *(path for path, _ in others)],
                                           np.array([*sizes, *(size for _, size in others)], np.int64))
    assert files == [Path(path).read_bytes() for path in paths] + [None] * len(others)
    with pytest.raises(ValueError, match="int64"):
        chunk_reads.read_files_at_once(paths, np.array(sizes, np.int32))


@needs_extension
def test_files_stated_at_once_are_what_os_stat_says(tmp_path, monkeypatch):
    """`stat_files_at_once` and `file_stats` with and without it: each path's ``st_size`` and ``st_mtime_ns``
    (a file, an empty one, a folder, a link followed), (0, 0) for a path that cannot be stat'ed; with a third column its
    ``st_mode``, which `regular_files` reads as `os.path.isfile` says (a folder is not one)."""
    (tmp_path / "photo.jpg").write_bytes(b"x" * 5000)
    (tmp_path / "empty.jpg").write_bytes(b"")
    os.utime(tmp_path / "empty.jpg", ns=(1, 1_234_567_891_234_567_891))
    (tmp_path / "link.jpg").symlink_to(tmp_path / "photo.jpg")
    paths = [str(tmp_path / name) for name in ("photo.jpg", "empty.jpg", "link.jpg", "missing.jpg", "")] + [str(tmp_path)]
    said = [(os.stat(path).st_size, os.stat(path).st_mtime_ns) if os.path.exists(path) else (0, 0) for path in paths]
    out = np.full((len(paths), 2), -1, np.int64)
    chunk_reads.stat_files_at_once(paths, out)
    assert [tuple(row) for row in out.tolist()] == said and said[1] == (0, 1_234_567_891_234_567_891)
    assert [tuple(row) for row in file_stats(paths).tolist()] == said
    modes = np.full((len(paths), 3), -1, np.int64)  # a third column: each one's st_mode
    chunk_reads.stat_files_at_once(paths, modes)
    assert modes[:, :2].tolist() == out.tolist()
    assert modes[:, 2].tolist() == [os.stat(path).st_mode if os.path.exists(path) else 0 for path in paths]
    regular = [os.path.isfile(path) for path in paths]
    assert regular == [True, True, True, False, False, False]
    assert regular_files(paths).tolist() == regular and missing_files(paths) == paths[3:]
    monkeypatch.setattr(fields, "stat_files_at_once", None)
    assert [tuple(row) for row in file_stats(paths).tolist()] == said
    assert regular_files(paths).tolist() == regular and missing_files(paths) == paths[3:]
    with pytest.raises(ValueError, match="int64"):
        chunk_reads.stat_files_at_once(paths, np.zeros((len(paths), 2), np.int32))
    with pytest.raises(ValueError, match="int64"):
        chunk_reads.stat_files_at_once(paths, np.zeros((len(paths), 4), np.int64))


@needs_extension
def test_a_file_that_cannot_be_read_at_once_is_none_and_python_s_calls_name_it(tmp_path):
    for where in (tmp_path / "missing.jpg", tmp_path):
        assert chunk_reads.read_file_at_once(str(where)) is None
    with pytest.raises(ImageError, match="missing.jpg: file not found"):
        read_image_file(str(tmp_path / "missing.jpg"))
    with pytest.raises(ImageError, match="cannot read the file"):
        read_image_file(str(tmp_path))


needs_mappings = pytest.mark.skipif(chunk_reads.map_files is None, reason="files are not mapped here (Linux only)")


def _evict(path: Path) -> None:
    """Drop the file's pages from the page cache, written back first (`page_cache.evict` unmaps this process's
    mappings first: the kernel leaves mapped pages)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    page_cache.evict([path])


@needs_mappings
@pytest.mark.parametrize("compression", ["lz4", "none", "raw"])
def test_a_chunk_in_memory_is_read_in_place_through_its_file_s_mapping_one_that_is_not_by_pread(tmp_path, rng,
                                                                                                 compression):
    """A chunk whose pages are not in memory is read by pread (faults through a mapping would read it from the device
    a page at a time), which brings them in; from then on it is read in place through its file's mapping, until
    its pages are evicted again: the same samples and stamp either way, and with mappings turned off."""
    from outcore.storage import _chunks

    location, values = _store(tmp_path, rng, compression)
    path, offset, nbytes = chunk_location(location, "x", 3)
    _evict(path)

    def read() -> tuple[Any, int]:
        out, before = np.full((32, 5, 3), -1, np.int32), _chunks.mapped()[1]
        stamp = chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(nbytes), out, compression != "none")
        np.testing.assert_array_equal(out, values[96:128])
        return stamp, _chunks.mapped()[1] - before

    assert read() == (stamp_of(os.stat(path)), 0)  # by pread: its pages were not in memory
    assert read() == (stamp_of(os.stat(path)), 1)  # in place
    _evict(path)  # mapped pages: left in memory by the kernel, unless unmapped first
    assert read() == (stamp_of(os.stat(path)), 0)
    assert read() == (stamp_of(os.stat(path)), 1)
    was = chunk_reads.map_files(False)
    try:
        assert was is True and read() == (stamp_of(os.stat(path)), 0)
    finally:
        chunk_reads.map_files(was)
    assert read() == (stamp_of(os.stat(path)), 1)


@needs_mappings
def test_a_file_replaced_under_its_mapping_is_mapped_anew_and_read_as_it_is_now(tmp_path, rng):
    """A path's file replaced (a store rewritten: another inode) is read as it is now, through one new mapping in
    place of the old, which is unmapped (its space freed); a chunk changed in place keeping its stamp is refused."""
    from outcore.storage import _chunks

    first, _ = _store(tmp_path / "first", rng, "none")
    second, values = _store(tmp_path / "second", rng, "none")
    path, offset, nbytes = chunk_location(first, "x", 2)
    out = np.empty((32, 5, 3), np.int32)
    assert chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(0), out, False) is not None
    files, reads, _ = _chunks.mapped()
    os.replace(chunk_location(second, "x", 2)[0], path)
    assert chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(0), out, False) == stamp_of(os.stat(path))
    np.testing.assert_array_equal(out, values[64:96])
    assert _chunks.mapped()[:2] == (files, reads + 1)
    corrupt_chunk(first, "x", 2)
    assert chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(0), out, False) is None
    assert _chunks.mapped()[:2] == (files, reads + 2)


@needs_mappings
def test_files_past_what_is_mapped_at_most_are_read_by_pread_not_mapped_in_place_of_others(tmp_path, rng):
    """Mappings hold 64 GiB of files at most (their pages' tables cost a 512th of what is read): a file past that
    is read by pread every time, and no mapping is dropped for it. A sparse file of 65 GiB stands for it."""
    from outcore.storage import _chunks

    location, values = _store(tmp_path, rng, "none")
    path, offset, nbytes = chunk_location(location, "x", 1)
    large = tmp_path / "large"
    large.write_bytes(path.read_bytes())
    os.truncate(large, 65 << 30)
    out = np.empty((32, 5, 3), np.int32)
    for _ in range(2):
        files, reads, _ = _chunks.mapped()
        assert chunk_reads.read_at_once(str(large), offset, nbytes, bytearray(0), out, False) == stamp_of(os.stat(large))
        np.testing.assert_array_equal(out, values[32:64])
        assert _chunks.mapped()[:2] == (files, reads)


@needs_mappings
def test_a_store_written_over_lets_go_of_its_old_files_mappings(tmp_path, rng):
    """A store written over (``overwrite=True``) frees its old files' space at once: this process's mappings of them
    (chunks read in place) are unmapped before they are removed, not kept until a read finds them changed."""
    location, values = _store(tmp_path, rng, "none")
    path, offset, nbytes = chunk_location(location, "x", 1)
    out = np.empty((32, 5, 3), np.int32)
    for _ in range(2):  # the second in place, if the first found the pages out of memory
        chunk_reads.read_at_once(str(path), offset, nbytes, bytearray(0), out, False)

    inode = os.stat(path).st_ino

    def mapped() -> list[str]:  # this process's mappings of the file, whatever its name now
        with open("/proc/self/maps") as maps:
            return [line for line in maps if line.split()[4] == str(inode)]

    assert mapped()
    outcore.from_arrays({"x": values[::-1]}, location, chunk_size=32, compression="none", shuffle_on_write=False,
                        overwrite=True, progress=False)
    assert not mapped()
    np.testing.assert_array_equal(outcore.open_dataset(location).shard_reader("x").read(1), values[::-1][32:64])


_SHRINKING = """
import os, sys, threading, time
import numpy as np
from outcore.storage import _chunks, chunk_reads

path, offset, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
expected = np.load(sys.argv[4])
data, stop = open(path, "rb").read(), threading.Event()

def shrink_and_grow():
    fd = os.open(path, os.O_RDWR)
    while not stop.is_set():
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        time.sleep(0.001)
    os.close(fd)

threading.Thread(target=shrink_and_grow).start()
out, scratch, read, wrong, began = np.empty_like(expected), bytearray(nbytes), 0, 0, time.monotonic()
try:
    while _chunks.mapped()[2] < 3 and time.monotonic() - began < 30:
        out[:] = 0
        if chunk_reads.read_at_once(path, offset, nbytes, scratch, out, True) is not None:
            read, wrong = read + 1, wrong + (not np.array_equal(out, expected))
finally:
    stop.set()
print(read, wrong, _chunks.mapped()[2])
"""


@needs_mappings
def test_a_file_shrinking_as_its_chunk_is_read_in_place_fails_the_read_and_nothing_else(tmp_path, rng):
    """A file truncated in place while a chunk is read through its mapping (SIGBUS where its pages went) is a read
    that failed, for the shard reader to name: the process goes on, and every read that vouched is the chunk's
    samples. Another thread truncates and rewrites the file over and over until three reads met it."""
    values = rng.integers(0, 256, (256, 128, 128, 3), dtype=np.uint8)
    outcore.from_arrays({"x": values}, tmp_path / "s.zarr", chunk_size=256, shuffle_on_write=False, progress=False)
    path, offset, nbytes = chunk_location(tmp_path / "s.zarr", "x", 0)
    np.save(tmp_path / "values.npy", values)
    done = subprocess.run([sys.executable, "-c", _SHRINKING, str(path), str(offset), str(nbytes),
                           str(tmp_path / "values.npy")], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    _, wrong, cut_short = map(int, done.stdout.split())
    assert wrong == 0 and cut_short >= 3


def _rows(kind: str, count: int, seed: int) -> list[Any]:
    """``count`` samples of a field written by `write_encoded_shard`: files (bytes), flat uint8 label maps, or rows of
    four float32 (boxes)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 9, count)
    if kind == "files":
        return [rng.integers(0, 256, size, np.uint8).tobytes() for size in sizes]
    if kind == "maps":
        return [rng.integers(0, 21, size, np.uint8) for size in sizes]
    return [rng.random((size, 4)).astype(np.float32) for size in sizes]


@needs_extension
@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["files", "maps", "boxes"]), count=st.integers(1, 20), chunk_size=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_a_chunk_s_samples_are_joined_in_one_copy_as_python_joins_them(kind, count, chunk_size, seed):
    """`join_at_once` packs a chunk's files, label maps or ragged rows into its region as `pack_regions` does without
    it, byte for byte (the region's tail still zero)."""
    blobs = _rows(kind, count, seed)
    dtype, row_shape = (np.float32, (4,)) if kind == "boxes" else (np.uint8, ())
    capacity = max(1, sum(len(blob) for blob in blobs))
    joined = pack_regions(blobs, chunk_size, capacity, dtype, row_shape, join=chunk_reads.join_at_once)
    plain = pack_regions(blobs, chunk_size, capacity, dtype, row_shape)
    np.testing.assert_array_equal(joined[0], plain[0])
    np.testing.assert_array_equal(joined[1], plain[1])


@needs_extension
@pytest.mark.parametrize(("blobs", "why"), [
    ([np.ones((2, 4), np.float64)], "another dtype"),
    ([np.ones((4, 2), np.float32)], "rows of another shape"),
    ([np.ones((4, 8), np.float32)[:, ::2]], "not contiguous"),
    ([np.ones((1, 4), np.float32)], "too few rows"),
    ([np.ones((3, 4), np.float32)], "too many rows"),
    ([np.ones((2, 4), np.float32), "text"], "not a buffer"),
])
def test_a_join_that_cannot_copy_as_it_is_leaves_the_region_untouched(blobs, why):
    """Blobs that are not of the region's dtype and rows, contiguous and filling it exactly are refused (False), the
    region untouched, for `pack_regions` to join its own way; `pack_regions` then casts as before."""
    region = np.full((2, 4), 7, np.float32)
    assert chunk_reads.join_at_once(blobs, region) is False, why
    assert (region == 7).all()
    with pytest.raises(BufferError):  # the region must be writable
        chunk_reads.join_at_once([b"ab"], b"xy")
    cast = [np.arange(8, dtype=np.int64).reshape(2, 4)]  # int64 rows in a float32 field: cast by pack_regions
    regions, _ = pack_regions(cast, 1, 2, np.float32, (4,), join=chunk_reads.join_at_once)
    np.testing.assert_array_equal(regions, cast[0].astype(np.float32))
