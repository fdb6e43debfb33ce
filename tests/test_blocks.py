"""Memory used again (`outcore.storage.blocks`): a block is made into a new array only once nothing refers to
the one made in it before (views, memoryviews, torch tensors), batches held are never written again while those
dropped give their memory to the next, as many are kept as were in use at once (at least `keep_bytes`, at most
`most_bytes`; a loader's batches come back to blocks enough for them all), sizes no longer asked for give way, and a
forked child makes its own."""

from __future__ import annotations

import gc
import multiprocessing

import numpy as np
import pytest

import outcore
from outcore.storage import blocks
from outcore.storage.blocks import ALIGN, LEAD, SMALLEST, Blocks

MIB = 1 << 20


def test_a_block_is_used_again_only_once_nothing_refers_to_its_array():
    kept = Blocks()
    first = kept.empty((2, MIB), np.uint8)
    address = first.ctypes.data
    holders = [first[1:], first.view(np.float32).reshape(-1, 4), memoryview(first), first.T]
    del first
    for holder in holders:  # each alone keeps the block
        others = [other for other in holders if other is not holder]
        holders = [holder]
        del others
        gc.collect()
        again = kept.empty((2, MIB), np.uint8)
        assert again.ctypes.data != address
        del again  # this one's block comes back: the next is made in it, never in the held one
    del holders, holder
    gc.collect()
    assert kept.empty((2 * MIB,), np.uint8).ctypes.data == address


def test_a_torch_tensor_of_an_array_keeps_its_block():
    torch = pytest.importorskip("torch")
    kept = Blocks()
    array = kept.empty((MIB,), np.uint8)
    array[:] = 7
    address, tensor = array.ctypes.data, torch.from_numpy(array)
    del array
    again = kept.empty((MIB,), np.uint8)
    again[:] = 0
    assert again.ctypes.data != address and int(tensor.sum()) == 7 * MIB


def test_arrays_start_16_bytes_past_a_multiple_of_32_and_are_any_dtype_and_shape():
    kept = Blocks()
    for shape, dtype in (((3, 5), np.float64), ((MIB,), np.int32), ((0, 4), np.uint8), ((2, MIB), "<U4")):
        array = kept.empty(shape, dtype)
        assert array.shape == shape and array.dtype == np.dtype(dtype) and array.flags.writeable
        assert array.ctypes.data % ALIGN == LEAD or array.size == 0  # numpy places an empty array itself
    assert blocks.empty((2,), object).tolist() == [None, None]  # arrays of objects as numpy makes them


def test_as_many_blocks_are_kept_as_were_in_use_at_once_at_least_keep_bytes_and_at_most_most_bytes():
    kept = Blocks(keep_bytes=3 * SMALLEST, most_bytes=6 * SMALLEST)
    arrays = [kept.empty((SMALLEST,), np.uint8) for _ in range(2)]
    del arrays
    gc.collect()
    assert len(kept.free) == 2 and kept.keeps() == 3 * SMALLEST  # fewer in use than keep_bytes
    arrays = [kept.empty((SMALLEST,), np.uint8) for _ in range(5)]  # 2 made again in those kept, 3 new
    del arrays
    gc.collect()
    assert len(kept.free) == 5 and kept.keeps() == 5 * SMALLEST  # all of those in use at once
    arrays = [kept.empty((SMALLEST,), np.uint8) for _ in range(9)]
    del arrays
    gc.collect()
    assert len(kept.free) == 6 and kept.keeps() == 6 * SMALLEST  # no more than most_bytes
    kept.let_go()
    assert kept.free == [] and kept.keeps() == 3 * SMALLEST


def test_blocks_of_a_size_no_longer_asked_for_give_way_to_new_ones_oldest_first():
    kept = Blocks(keep_bytes=4 * SMALLEST)
    arrays = [kept.empty((SMALLEST,), np.uint8) for _ in range(3)]
    addresses = [array.ctypes.data for array in arrays]
    while arrays:  # given back in turn: the first the oldest kept
        arrays.pop(0)
    gc.collect()
    other = kept.empty((2 * SMALLEST,), np.uint8)  # 3 + 2 blocks' bytes do not fit: the oldest goes
    assert [block.ctypes.data for block in kept.free] == addresses[1:] and other.nbytes == 2 * SMALLEST


def test_a_loader_s_batches_come_back_to_blocks_enough_for_them_all(tmp_path, monkeypatch):
    pictures = np.zeros((2048, 32, 64, 3), np.uint8)
    ds = outcore.from_arrays({"images": pictures, "labels": np.arange(2048)}, tmp_path / "s.zarr", chunk_size=128,
                             progress=False)
    monkeypatch.setattr(blocks, "BLOCKS", Blocks(keep_bytes=SMALLEST))  # kept by what was in use, no fixed amount
    made_in = blocks._aligned
    made = [0]

    def aligned(nbytes: int) -> np.ndarray:
        made[0] += nbytes >= SMALLEST
        return made_in(nbytes)

    monkeypatch.setattr(blocks, "_aligned", aligned)
    batches = ds.batches(256, shuffle=True)  # 1.5 MiB of pictures a batch, 8 an epoch
    by_epoch = []
    for _ in range(8):
        before = made[0]
        for batch in batches:
            del batch
        by_epoch.append(made[0] - before)
    # a new high of batches held at once, rarely (a busy machine's consumer late: Python 3.13's CI run once made 2 in
    # epoch 4); with no block kept (`Blocks(keep_bytes=0, most_bytes=0)`), epochs 4 to 7 made 15, 2 to 6 each
    assert by_epoch[0] > 0 and sum(by_epoch[4:]) <= 2, by_epoch


def test_batches_held_are_never_written_again_and_those_dropped_are_made_again_in_their_memory(tmp_path):
    pictures = np.random.default_rng(0).integers(0, 255, (1024, 32, 64, 3), np.uint8)
    ds = outcore.from_arrays({"images": pictures, "labels": np.arange(1024)}, tmp_path / "s.zarr", chunk_size=128,
                             progress=False)
    batches = ds.batches(256, shuffle=True, seed=3)  # 1.5 MiB of pictures a batch: made in blocks
    held, copies, addresses = [], [], set()
    for epoch in range(4):  # the first epoch's batches held (batches made together are views of one block), the others
        # dropped: an epoch's first batches are made as the epoch before drains, so the one after it makes its own again
        for batch in batches:
            assert np.array_equal(batch["images"], pictures[batch["labels"]])
            addresses.add(batch["images"].ctypes.data)
            if epoch == 0:
                held.append(batch)
                copies.append({name: values.copy() for name, values in batch.items()})
            del batch
    for batch, copy in zip(held, copies, strict=True):
        assert all(np.array_equal(batch[name], copy[name]) for name in copy)
    assert len(addresses) < 4 * len(batches)  # the dropped batches' memory made others


def _make_an_array(out: multiprocessing.Queue) -> None:
    out.put(blocks.empty((2, MIB), np.uint8).nbytes)


def test_a_forked_child_makes_arrays_while_a_parent_thread_held_the_lock():
    with blocks.BLOCKS.lock:  # held at the fork: the child's own blocks have their own lock
        context = multiprocessing.get_context("fork")
        out = context.Queue()
        child = context.Process(target=_make_an_array, args=(out,))
        child.start()
    child.join(30)
    assert child.exitcode == 0 and out.get(timeout=5) == 2 * MIB
