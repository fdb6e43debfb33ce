"""Reads through 2 MiB pages (`outcore.storage.huge_pages`): the bytes ``pread`` gives, from any offset and
length; a file that shrinks under its mapping is a short read, never a SIGBUS; a forked child reads its
own memory; the shard reader reads a store's large chunks this way."""

import json
import mmap
import multiprocessing
import os

import numpy as np
import pytest
from support.cgroups import throttled

import outcore
from outcore.storage import huge_pages, shard_reader
from outcore.storage.huge_pages import HUGE_PAGE, HugePageReads
from outcore.storage.page_cache import Memory

MiB = 2**20


def _read(reads: HugePageReads, offset: int, length: int) -> bytes:
    """As the shard reader reads: call again for the rest until all is read or the file ends."""
    buffer = memoryview(bytearray(length))
    count = 0
    while count < length and (got := reads.read_into(offset + count, buffer[count:])):
        count += got
    return bytes(buffer[:count])


@pytest.fixture
def spied(monkeypatch):
    """The reads of whole 2 MiB pages made (offset into the file, bytes), as `HugePageReads` copies them out."""
    copies = []
    preadv = os.preadv

    def spy(fd, buffers, offset):
        got = preadv(fd, buffers, offset)
        if fd == huge_pages._MEMORY.fd():
            copies.append(got)
        return got

    monkeypatch.setattr(huge_pages.os, "preadv", spy)
    return copies


def test_the_machines_that_test_outcore_read_large_ranges_in_huge_pages():
    """CI's and the developers' Linux has what it takes: else every other test here tests pread alone."""
    assert huge_pages.available()


def test_a_kernel_without_madv_populate_read_is_said_to_read_with_pread(monkeypatch):
    monkeypatch.setattr(huge_pages, "_POPULATE_READ", 9_999)  # an advice no kernel knows: as before Linux 5.14
    memory = huge_pages._Memory()
    assert memory.fd() is None and memory.refused


@pytest.mark.parametrize(("offset", "length"), [
    (0, 13 * MiB + 12_345),  # the whole file
    (1, 6 * MiB),  # a part before the first whole page, whole pages, a part after
    (HUGE_PAGE, 2 * HUGE_PAGE),  # whole pages only
    (HUGE_PAGE - 1, HUGE_PAGE + 2),  # one whole page and a byte either side
    (HUGE_PAGE - 1, HUGE_PAGE),  # no whole page inside
    (3, 100),
    (13 * MiB + 12_345 - 5 * MiB, 5 * MiB),  # up to the end
    (10 * MiB, 5 * MiB),  # beyond the end: what there is
])
def test_reads_are_the_bytes_pread_reads(tmp_path, spied, offset, length):
    data = np.random.default_rng(0).integers(0, 256, 13 * MiB + 12_345, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        with HugePageReads(fd, len(data)) as reads:
            assert _read(reads, offset, length) == os.pread(fd, length, offset) == data[offset : offset + length]
    finally:
        os.close(fd)
    whole = (min(offset + length, len(data)) // HUGE_PAGE - -(-offset // HUGE_PAGE)) * HUGE_PAGE
    assert sum(spied) == max(0, whole)


def test_a_file_that_shrinks_under_its_mapping_reads_short_without_a_sigbus(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * (32 * 4096))  # 8 MiB
    fd = os.open(path, os.O_RDONLY)
    try:
        with HugePageReads(fd, 8 * MiB) as reads:
            assert len(_read(reads, 0, HUGE_PAGE)) == HUGE_PAGE  # mapped, and its first page read
            os.truncate(path, 3 * MiB)
            assert _read(reads, HUGE_PAGE, 4 * MiB) == (bytes(range(256)) * 4096)[: MiB]
            assert _read(reads, 4 * MiB, 2 * MiB) == b""
    finally:
        os.close(fd)


def _read_own_memory(queue) -> None:
    mapping = mmap.mmap(-1, 4096)  # made after the fork: the parent has nothing at its address
    mapping.write(b"the child's own page")
    address = np.frombuffer(mapping, np.uint8).ctypes.data
    try:
        queue.put(os.pread(huge_pages._MEMORY.fd(), 20, address))
    except OSError as error:
        queue.put(repr(error))


def test_a_forked_child_reads_its_own_memory():
    assert huge_pages.available()  # the parent's /proc/self/mem is open now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_own_memory, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == b"the child's own page"
    child.join(timeout=60)


@pytest.mark.parametrize("room", [2**40, 2**20])
def test_the_shard_reader_reads_large_chunks_of_a_store_the_page_cache_cannot_hold_in_huge_pages(
        tmp_path, monkeypatch, spied, room):
    """From memory a pread costs less; from the device, whole 2 MiB pages are fewer requests."""
    monkeypatch.setattr(shard_reader, "memory", lambda: Memory(available=room, limit=None))
    images = np.random.default_rng(1).integers(0, 256, (1024, 64, 64, 3), dtype=np.uint8)  # no compression
    ds = outcore.from_arrays({"images": images, "labels": np.arange(1024)}, tmp_path / "t.zarr", chunk_size=512,
                             shuffle_on_write=False, progress=False)  # chunks of 6 MiB
    got = np.concatenate([batch["images"] for batch in ds.batches(256, shuffle=False)])
    np.testing.assert_array_equal(got, images)
    if room > images.nbytes:
        assert spied == []
    else:
        assert 2 * 2 * HUGE_PAGE <= sum(spied) <= images.nbytes  # at least 2 whole pages of each chunk


RANDOM_READS = """
import json, os, sys
from pathlib import Path
from outcore.storage.huge_pages import HugePageReads
path, blkio, disk = sys.argv[1:]

def counters():  # bytes and requests this cgroup read from the disk so far
    return [int(line.split()[2]) for name in ("blkio.throttle.io_service_bytes", "blkio.throttle.io_serviced")
            for line in (Path(blkio) / name).read_text().splitlines() if line.split()[:2] == [disk, "Read"]]

fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # as the shard reader opens a shard file
reads = HugePageReads(fd, os.fstat(fd).st_size)
buffer = memoryview(bytearray(6 * 2**20))
before = counters()
for offset in range(0, 80 * 2**20, 8 * 2**20):  # 10 reads of 3 whole 2 MiB pages, with gaps between them
    count = 0
    while count < len(buffer):
        count += reads.read_into(offset + count, buffer[count:])
print(json.dumps([after - earlier for after, earlier in zip(counters(), before)]))
"""


def test_the_device_is_asked_for_whole_2_mib_pages(tmp_path):
    """Ten cold reads of three whole 2 MiB pages each, counted by a cgroup's blkio: the bytes asked for
    and not one more, in a request per page at most (pread's 4 KiB pages take 512 KiB a request here, or
    more where memory happens to lie in one piece: what matters where a device caps its requests)."""
    path = tmp_path / "shard"
    path.write_bytes(os.urandom(96 * MiB))
    os.sync()
    with throttled(tmp_path, bandwidth=2 * 10**9, requests=100_000, memory=1024 * MiB) as cgroup:
        nbytes, requests = json.loads(cgroup.run(RANDOM_READS, str(path), str(cgroup.blkio), cgroup.disk))
    assert (nbytes, requests) == (60 * MiB, min(requests, 30)), (nbytes, requests)


def test_a_store_opened_once_finds_whether_the_page_cache_holds_it_once(tmp_path, monkeypatch):
    """Whether a store is read in huge pages is found by its first reader (`Pins.uncached`): iterators made each epoch
    do not read the machine's memory and cgroups again for each of their readers; a store opened anew finds it anew."""
    asked = []
    monkeypatch.setattr(shard_reader, "memory", lambda: asked.append(1) or Memory(available=1024, limit=None))
    images = np.random.default_rng(2).integers(0, 256, (64, 8, 8, 3), dtype=np.uint8)
    ds = outcore.from_arrays({"images": images, "labels": np.arange(64)}, tmp_path / "t.zarr", chunk_size=16,
                             shuffle_on_write=False, progress=False)
    for epoch in range(3):
        got = np.concatenate([batch["labels"] for batch in ds.batches(16, shuffle=True, seed=epoch)])
        assert sorted(got.tolist()) == list(range(64))
    assert len(asked) == 1 and ds.pins.uncached  # 1 KiB of room: the store's files are more than that
    again = outcore.open_dataset(tmp_path / "t.zarr")
    assert [len(batch["labels"]) for batch in again.batches(32, shuffle=False)] == [32, 32] and len(asked) == 2
