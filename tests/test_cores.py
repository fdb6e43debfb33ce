"""One process, every core: a batch's samples copied, cut and mirrored by runs (C where built, numpy else: the same
bytes), crops opening a transform done as pixel batches are made (the same pixels as after), no Python call per
sample in making a batch, runs shared by the pool's threads without ever waiting on themselves, and a pool that
keeps busy only the threads that run well, and batches handed to their consumer in order, a bounded number waiting."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.calls import python_calls

import outcore
from outcore.imaging import center_crop_box, native
from outcore.imaging.windows import copy_samples, gather_ragged
from outcore.iterate import batch as batch_module
from outcore.iterate import gather, native_run, readers
from outcore.iterate.batch import Recipe, WholePictures, make_batch, steps, transform_generator
from outcore.iterate.readers import chunk_readers
from outcore.iterate.targets import Targets
from outcore.measure import gil_free_clock, thread_free_seconds
from outcore.storage.chunk_reads import set_engine_turns
from outcore.testing import write_image_folder
from outcore.threads import for_each_run, gauge, shared_pool, submit, wait_all
from outcore.threads.handoff import Handoff
from outcore.threads.pool import Gauge, Pool, Runs
from outcore.threads.task import Task
from outcore.transforms import (
    BrightnessContrast,
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
)

DTYPES = ("uint8", "uint16", "float32")


def _reference(picture: np.ndarray, top: int, left: int, size: tuple[int, int], flip: tuple[bool, bool]) -> np.ndarray:
    """The window of ``size`` at (top, left) of ``picture``, zeros outside it, mirrored: the rule, spelled out."""
    out = np.zeros((*size, *picture.shape[2:]), picture.dtype)
    for y in range(size[0]):
        for x in range(size[1]):
            if 0 <= top + y < picture.shape[0] and 0 <= left + x < picture.shape[1]:
                out[y, x] = picture[top + y, left + x]
    return out[:: -1 if flip[1] else 1, :: -1 if flip[0] else 1]


@pytest.fixture(params=["C", "numpy"])
def backend(request, monkeypatch):
    if request.param == "C":
        if native.windows is None:
            pytest.skip(f"outcore's _windows extension is not in use here: {native.copies()}")
    else:
        monkeypatch.setattr(native, "windows", None)
    return request.param


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # no state
@given(data=st.data(), dtype=st.sampled_from(DTYPES), channels=st.sampled_from([(), (1,), (3,), (4,)]),
       picture=st.tuples(st.integers(1, 9), st.integers(1, 23)), window=st.tuples(st.integers(1, 9), st.integers(1, 23)))
def test_windows_are_the_zero_padded_pictures_cut_and_mirrored(backend, data, dtype, channels, picture, window):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    chunks = [rng.integers(0, 200, (3, *picture, *channels)).astype(dtype) for _ in range(2)]
    count = data.draw(st.integers(1, 6))
    which, local = rng.integers(0, 2, count), rng.integers(0, 3, count)
    rows = rng.permutation(count)
    tops = rng.integers(-window[0] - 1, picture[0] + 2, count)
    lefts = rng.integers(-window[1] - 1, picture[1] + 2, count)
    flips = rng.integers(0, 2, (count, 2)).astype(np.uint8)
    out = np.full((count, *window, *channels), 77, dtype)
    copy_samples(chunks, which, local, out, rows, tops, lefts, flips)
    for k in range(count):
        expected = _reference(chunks[which[k]][local[k]], tops[k], lefts[k], window, tuple(flips[k].astype(bool)))
        np.testing.assert_array_equal(out[rows[k]], expected)
    boxes = np.zeros((count, 4))  # the same windows as a batch holds them: each out row's box and mirrors
    boxes[rows, 0], boxes[rows, 1], boxes[rows, 2:] = tops, lefts, window
    mirrors = np.empty_like(flips)
    mirrors[rows] = flips
    again = np.full_like(out, 77)
    copy_samples(chunks, which, local, again, rows, flips=mirrors, boxes=boxes)
    np.testing.assert_array_equal(again, out)


@pytest.mark.parametrize("shape", [(), (5,), (4, 3, 2)])
def test_whole_samples_of_any_shape_are_copied_to_their_rows(backend, shape, rng):
    chunks = [rng.normal(size=(4, *shape)), rng.normal(size=(2, *shape))]
    which, local, rows = np.array([1, 0, 0, 1]), np.array([1, 3, 0, 0]), np.array([2, 0, 3, 1])
    out = np.zeros((4, *shape))
    copy_samples(chunks, which, local, out, rows)
    for k in range(4):
        np.testing.assert_array_equal(out[rows[k]], chunks[which[k]][local[k]])


@pytest.mark.parametrize("sample_bytes", [4095, 4096, 4097, 4160, 48 * 1024 + 13])
@pytest.mark.parametrize("shift", [0, 1, 7, 15])
def test_large_samples_are_copied_whole_wherever_their_bytes_begin(backend, sample_bytes, shift, rng):
    # samples of STREAM_BYTES (4096) or more are written past the caches, whole cache lines from a 64-byte boundary
    # of their row: rows and chunks that begin anywhere, and sizes around that one, are copied byte for byte
    space = rng.integers(0, 256, 3 * sample_bytes * 4 + 64, dtype=np.uint8)
    chunks = [space[shift : shift + 3 * sample_bytes].reshape(3, sample_bytes),
              space[5 * sample_bytes + 3 : 8 * sample_bytes + 3].reshape(3, sample_bytes)]
    target = np.full(4 * sample_bytes + 32, 9, np.uint8)
    out = target[shift + 1 : shift + 1 + 4 * sample_bytes].reshape(4, sample_bytes)
    which, local, rows = np.array([1, 0, 0, 1]), np.array([2, 0, 1, 0]), np.array([3, 0, 2, 1])
    copy_samples(chunks, which, local, out, rows)
    for k in range(4):
        np.testing.assert_array_equal(out[rows[k]], chunks[which[k]][local[k]])
    assert (target[: shift + 1] == 9).all() and (target[shift + 1 + 4 * sample_bytes :] == 9).all()  # nothing past


def test_a_box_that_is_no_window_of_whole_pixels_of_out_s_size_is_refused(backend, rng):
    chunks = [rng.integers(0, 9, (2, 4, 4, 3), dtype=np.uint8)]
    out, one = np.zeros((2, 4, 4, 3), np.uint8), np.array([0])
    for box in ([0.5, 0, 4, 4], [0, 0, 3, 4], [np.nan, 0, 4, 4]):  # a fraction dropped, another size: never silently
        with pytest.raises(ValueError, match=r"out row 0's box .* no window of whole pixels of out's 4x4"):
            copy_samples(chunks, one, one, out, one, boxes=np.array([box, [0, 0, 4, 4]]))
    assert not out.any()


def test_a_copy_out_of_bounds_or_of_another_shape_is_refused_before_any_byte_moves(rng):
    if native.windows is None:
        pytest.skip(f"outcore's _windows extension is not in use here: {native.copies()}")
    chunks = [rng.integers(0, 9, (2, 4, 4, 3), dtype=np.uint8)]
    out = np.zeros((2, 4, 4, 3), np.uint8)
    one = np.array([0])
    with pytest.raises(IndexError, match="sample 2 of chunk 0"):
        copy_samples(chunks, one, np.array([2]), out, one)
    with pytest.raises(IndexError, match="into row 5"):
        copy_samples(chunks, one, one, out, np.array([5]))
    with pytest.raises(ValueError, match="one format"):
        copy_samples(chunks, one, one, out.astype(np.uint16), one)
    with pytest.raises(ValueError, match="boxes float64"):  # a box for each row of out, not each copy
        copy_samples(chunks, one, one, out, one, boxes=np.zeros((1, 4)))
    with pytest.raises(ValueError, match="not both"):
        native.windows.copy(chunks, one, one, out, one, one, one, boxes=np.zeros((2, 4)))

    with pytest.raises(ValueError, match="one format"):
        copy_samples(chunks, one, one, np.zeros((2, 4, 4, 4), np.uint8), one, one, one)
    assert not out.any()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """512 photos of 32x32 in two chunks of 256, as pixels and as JPEG files."""
    root = tmp_path_factory.mktemp("cores")
    write_image_folder(root / "src", 256, classes=("a", "b"), size=(32, 32), kind="photos", seed=0)
    return {kind: outcore.ingest_images(root / "src", root / f"{kind}.zarr", shape=(32, 32, 3), images=kind,
                                        chunk_size=256, progress=False) for kind in ("pixels", "encoded")}


def _chunk(ds):
    """Chunk 0 of the images and labels, as a batch is made from it."""
    return {0: {name: reader.read(0) for name, reader in chunk_readers(ds, ["images", "labels"]).items()}}


def _batch(ds, transform, count, fuse=True, data=None, pieces=1):
    """The first ``count`` samples of chunk 0 as one batch of ``pieces`` pieces, made by `make_batch` on this
    thread."""
    recipe = Recipe.of(["images", "labels"], (), ["images"] if fuse else [], transform,
                       pixel_sizes={"images": (32, 32)} if fuse else None)
    draws = tuple((count // pieces + (k < count % pieces), (1, 2, 3, 4 + k)) for k in range(pieces))
    return make_batch(recipe, np.arange(count), ds.chunk_size, np.zeros(count, np.int64), data or _chunk(ds), draws)


@pytest.mark.parametrize("transform", [
    Compose([RandomCrop(24, padding=5), RandomFlip(vertical=True)]), RandomCrop(32, padding=4),
    Compose([RandomResizedCrop(20), RandomFlip(), Normalize(0.5, 0.25)]), CenterCrop(20),
    Compose([CenterCrop(24, resize=28), RandomFlip(p=1.0)])], ids=["crop+flip", "pad", "rrc", "centre", "resize"])
def test_a_crop_opening_the_transform_of_pixels_is_cut_as_the_batch_is_made_with_the_same_pixels(photos, transform):
    fused, after = _batch(photos["pixels"], transform, 200), _batch(photos["pixels"], transform, 200, fuse=False)
    assert Recipe.of(["images"], (), ["images"], transform).crop is not None
    assert fused["images"].dtype == after["images"].dtype
    np.testing.assert_array_equal(fused["images"], after["images"])
    np.testing.assert_array_equal(fused["labels"], after["labels"])


class OwnFlip(RandomFlip):
    """A user's flip class made from `RandomFlip`: run as the transform it is, never fused."""


@pytest.mark.parametrize("transform", [
    RandomFlip(), Compose([RandomFlip(vertical=True, p=0.7), Normalize(0.5, 0.25)]),
    Compose([RandomFlip(), RandomCrop(24, padding=2), Normalize(0.5, 0.25)])], ids=["flip", "flip+norm", "flip+more"])
def test_a_flip_opening_the_transform_of_pixels_mirrors_them_as_they_are_copied_with_the_same_pixels(photos,
                                                                                                    transform):
    # the pictures mirrored as they are copied out of their chunks (WholePictures), with the flip's own draws a piece:
    # the generator of each piece goes on to the steps after it as when the flip runs by itself
    recipe = Recipe.of(["images"], (), ["images"], transform, pixel_sizes={"images": (32, 32)})
    assert recipe.crop is not None and recipe.flip == steps(transform)[0]
    fused, after = _batch(photos["pixels"], transform, 200, pieces=3), _batch(photos["pixels"], transform, 200,
                                                                                fuse=False, pieces=3)
    np.testing.assert_array_equal(fused["images"], after["images"])
    np.testing.assert_array_equal(fused["labels"], after["labels"])
    assert not Recipe.of(["images"], (), ["images"], OwnFlip(), pixel_sizes={"images": (32, 32)}).crop
    assert not Recipe.of(["images"], (), ["images"], RandomFlip(targets=Targets(boxes=("boxes",))),
                         pixel_sizes={"images": (32, 32)}).crop


@pytest.mark.parametrize("kind", ["pixels", "encoded"])
def test_batches_with_a_flip_mirrored_as_they_are_copied_are_those_of_the_flip_run_by_itself(photos, kind):
    # pixels mirrored as they are copied out of their chunks; JPEGs decoded to one size, as they are decoded
    pictures = photos[kind]
    assert readers.recipe(pictures, ["images"], RandomFlip()).crop == WholePictures("images", (32, 32))
    for transform, own in ((RandomFlip(), OwnFlip()), (Compose([RandomFlip(), Normalize(0.5, 0.2)]),
                                                         Compose([OwnFlip(), Normalize(0.5, 0.2)]))):
        fused = list(pictures.batches(64, seed=3, transform=transform))
        alone = list(pictures.batches(64, seed=3, transform=own))
        assert len(fused) == len(alone) == 8
        for made, expected in zip(fused, alone, strict=True):
            np.testing.assert_array_equal(made["images"], expected["images"])
            np.testing.assert_array_equal(made["labels"], expected["labels"])


class OwnBrightness(BrightnessContrast):
    """A user's class made from `BrightnessContrast`: run piece by piece, as the transform it is, never fused."""


@pytest.mark.parametrize("transform, own", [
    (BrightnessContrast(0.3, 0.3), OwnBrightness(0.3, 0.3)),
    (Compose([RandomCrop(24), RandomFlip(), BrightnessContrast(), Normalize(0.5, 0.2)]),
     Compose([RandomCrop(24), RandomFlip(), OwnBrightness(), Normalize(0.5, 0.2)])),
    (Compose([RandomFlip(), BrightnessContrast(0.1, 0.6), BrightnessContrast(0.4, 0.1)]),
     Compose([RandomFlip(), OwnBrightness(0.1, 0.6), OwnBrightness(0.4, 0.1)]))], ids=["alone", "crop+norm", "twice"])
def test_brightness_drawn_by_each_piece_is_applied_to_the_batch_at_once_with_the_pixels_of_each_piece_alone(
        photos, transform, own, monkeypatch):
    # each piece's generator draws its pictures' factors and shifts (after the crop's and flip's draws, before the next
    # step's), then the batch is adjusted at once: not cut into pieces and joined again
    cut = batch_module.piece
    for pieces in (1, 3):
        monkeypatch.setattr(batch_module, "piece", None)  # never cut into pieces
        fused = _batch(photos["pixels"], transform, 200, pieces=pieces)
        monkeypatch.setattr(batch_module, "piece", cut)
        alone = _batch(photos["pixels"], own, 200, pieces=pieces)
        np.testing.assert_array_equal(fused["images"], alone["images"])
        np.testing.assert_array_equal(fused["labels"], alone["labels"])
    batches = list(photos["pixels"].batches(64, seed=3, transform=transform))
    expected = list(photos["pixels"].batches(64, seed=3, transform=own))
    assert len(batches) == len(expected) == 8
    for made, wanted in zip(batches, expected, strict=True):
        np.testing.assert_array_equal(made["images"], wanted["images"])


class OwnCenter(CenterCrop):
    """A user's class made from `CenterCrop`: its boxes found piece by piece, its flip's drawn by a generator a piece."""


@pytest.mark.parametrize("transform, own", [
    (CenterCrop(20), OwnCenter(20)), (Compose([CenterCrop(24), RandomFlip(vertical=True)]),
                                      Compose([OwnCenter(24), RandomFlip(vertical=True)])),
    (Compose([CenterCrop(20, resize=26), RandomFlip(), Normalize(0.5, 0.2)]),
     Compose([OwnCenter(20, resize=26), RandomFlip(), Normalize(0.5, 0.2)]))], ids=["alone", "flip", "resize"])
def test_a_centre_crop_and_its_flip_drawn_for_all_pieces_at_once_cut_the_pixels_drawn_piece_by_piece(photos, transform,
                                                                                                      own):
    for pieces in (1, 3):
        fused = _batch(photos["pixels"], transform, 200, pieces=pieces)
        alone = _batch(photos["pixels"], own, 200, pieces=pieces)
        np.testing.assert_array_equal(fused["images"], alone["images"])
    sizes = np.array([[32, 40], [50, 20], [32, 40], [64, 64]])
    for crop in (CenterCrop(16), CenterCrop(16, resize=20)):
        expected = [center_crop_box(height, width, (16, 16), crop.resize) for height, width in sizes.tolist()]
        np.testing.assert_array_equal(crop.boxes(sizes, None), np.array(expected, np.float64))
    assert CenterCrop(48).boxes_of_pieces(sizes, ((4, (1, 2, 3, 4)),), None) is None  # too small: named piece by piece


class HalfPixelCrop(RandomCrop):
    """A user's crop class made from `RandomCrop` whose boxes start half a pixel in: not windows of whole pixels."""

    def boxes(self, sizes, rng):
        return super().boxes(sizes, rng).astype(np.float64) + [0.5, 0.5, 0, 0]


def test_a_crop_is_copied_as_windows_unchecked_only_where_its_own_class_says_it_draws_them(photos):
    """`RandomCrop` says its boxes are windows of whole pixels (``windows``), so they are copied as they are,
    unchecked; a subclass drawing other boxes is not taken at its parent's word: its boxes are checked, found
    not whole, and resized out of their pictures."""
    assert vars(RandomCrop)["windows"] and "windows" not in vars(HalfPixelCrop)
    fused = _batch(photos["pixels"], Compose([HalfPixelCrop(24), RandomFlip()]), 64)
    rng = transform_generator((1, 2, 3, 4))  # the batch's one piece's: its crop's draws, then its flip's
    boxes = HalfPixelCrop(24).boxes(np.full((64, 2), 32), rng)
    pictures = _chunk(photos["pixels"])[0]["images"][:64]
    expected = gather.move_pictures(pictures, boxes, (24, 24), RandomFlip().draw(64, rng))
    np.testing.assert_array_equal(fused["images"], expected)
    windows = _batch(photos["pixels"], Compose([RandomCrop(24), RandomFlip()]), 64)
    assert not np.array_equal(fused["images"], windows["images"])  # the same draws, cut half a pixel further in


@pytest.mark.parametrize("kind", ["pixels", "encoded"])
@pytest.mark.parametrize("transform", [None, Compose([RandomCrop(24), RandomFlip(vertical=True)]),
                                       Compose([RandomCrop(24), RandomFlip(), Normalize(0.5, 0.2)])],
                         ids=["none", "crop", "normalize"])
def test_a_batch_is_made_without_a_python_call_per_sample(photos, kind, transform, monkeypatch):
    """(Windows past the edges of encoded pictures, `RandomCrop`'s padding, are cut one by one.)"""
    if native.windows is None or native.extension is None:
        pytest.skip(f"outcore's C extensions are not in use here: {native.copies()}; {native.backend()}")
    monkeypatch.setattr(Gauge, "INTERVAL", float("inf"))  # no run's CPU time read: its calls, every 20 ms, not a sample's
    outcore.set_threads(1)  # every run on this thread, where the calls are counted
    try:
        ds = photos[kind]
        data = _chunk(ds)
        # batches whose arrays are made alike (`blocks`: Normalize's float32 pictures from kept blocks, 1 MiB or more,
        # the others from the heap), each made once first, so that the second finds its memory as the first left it
        for count in (160, 256):
            _batch(ds, transform, count, data=data)
        few, many = (python_calls(lambda count=count: _batch(ds, transform, count, data=data)) for count in (160, 256))
    finally:
        outcore.set_threads(None)
    assert many <= few + 8, (few, many)  # 96 samples more, and a handful of calls more (numpy's, not per sample)


def test_a_batchs_labels_are_copied_in_one_call_whatever_the_runs_of_its_pictures(photos, monkeypatch):
    """A field whose batch holds a few bytes is copied once as the batch is made, not in each run; the batch is the
    same. A pool of its own: one whose gauge lowered its limit to 1 (a busy machine) makes a single run."""
    before = _batch(photos["pixels"], None, 256)
    calls = []
    monkeypatch.setattr(gather, "RUN_BYTES", 16 << 10)  # the pictures in runs of 5 samples or more, 4 a thread
    monkeypatch.setattr(gather, "copy_samples", lambda *args: calls.append(args[3].dtype) or copy_samples(*args))
    outcore.set_threads(2)
    try:
        after = _batch(photos["pixels"], None, 256)
    finally:
        outcore.set_threads(None)
    assert calls.count(np.dtype(np.uint8)) >= 4 and calls.count(np.dtype(np.int64)) == 1
    for name in ("images", "labels"):
        np.testing.assert_array_equal(after[name], before[name])


def test_a_batchs_pictures_are_copied_in_runs_of_run_bytes_at_least(monkeypatch, rng):
    """Each run takes the GIL back and hands work to a thread: 48 MiB of pictures (four batches made together) are
    copied in 3 runs of 16 MiB or more on a pool of 8 threads, not in runs of a few MiB; each row is its sample."""
    chunks = {slot: {"images": rng.integers(0, 255, (128, 128, 128, 3), dtype=np.uint8),
                     "labels": np.arange(slot * 128, slot * 128 + 128)} for slot in range(8)}
    keys = rng.permutation(np.repeat(np.arange(8), 128))
    samples = keys * 128 + rng.integers(0, 128, len(keys))
    recipe = Recipe.of(["images", "labels"], (), [], None)
    runs = []
    monkeypatch.setattr(gather, "copy_samples", lambda *args: runs.append((args[3].dtype, len(args[1])))
                        or copy_samples(*args))
    outcore.set_threads(8)  # a pool of its own, all 8 threads busy at most
    try:
        batch = make_batch(recipe, samples, 128, keys, chunks, ((len(keys), (1, 2, 3, 4)),))
    finally:
        outcore.set_threads(None)
    pictures = [count for dtype, count in runs if dtype == np.uint8]
    assert len(pictures) == 3 and min(pictures) >= gather.RUN_BYTES // (128 * 128 * 3), runs
    stored = np.stack([chunks[slot]["images"] for slot in range(8)])
    np.testing.assert_array_equal(batch["images"], stored[keys, samples % 128])
    np.testing.assert_array_equal(batch["labels"], samples)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # no state
@given(keys=st.one_of(st.lists(st.integers(0, 40), max_size=600), st.lists(st.integers(-2**63, 2**63 - 1), max_size=50)),
       chunk_size=st.integers(1, 300), data=st.data())
def test_a_batchs_rows_by_chunk_follow_the_rule_in_c_and_numpy(backend, keys, chunk_size, data):
    """`Rows.of`: the rows in a stable order of their chunks (in one C call that keeps the GIL, its counting sort;
    keys spread too far for it, and no extension: numpy's sort), each with its chunk's index and its sample's place
    in the chunk."""
    samples = data.draw(st.lists(st.integers(0, 10**9), min_size=len(keys), max_size=len(keys)))
    rows = gather.Rows.of(np.array(keys, np.int64), np.array(samples, np.int64), chunk_size)
    order = sorted(range(len(keys)), key=lambda k: keys[k])
    chunks = sorted(set(keys))
    assert rows.order.tolist() == order and rows.chunks.tolist() == chunks
    assert rows.which.tolist() == [chunks.index(keys[k]) for k in order]
    assert rows.local.tolist() == [samples[k] % chunk_size for k in order]
    assert {part.dtype for part in (rows.order, rows.chunks, rows.which, rows.local)} == {np.dtype(np.int64)}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # no state
@given(counts=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), min_size=1, max_size=5),
       row_shape=st.sampled_from([(), (4,), (4, 3)]), dtype=st.sampled_from([np.uint8, np.float32, np.int64]),
       data=st.data())
def test_a_ragged_fields_rows_are_gathered_in_the_batchs_order_in_c_and_numpy(backend, counts, row_shape, dtype, data):
    """`gather_ragged`: each batch row gets exactly its sample's rows (any count, none too), back to back in the batch's
    order, whichever chunk holds it and wherever its rows lie there (the chunks' spans in any order, with gaps)."""
    values, ranges, samples = [], [], []
    for chunk, sizes in enumerate(counts):
        order = data.draw(st.permutations(range(len(sizes))))  # where each sample's rows lie in the chunk
        starts, at = [0] * len(sizes), 0
        for sample in order:
            at += data.draw(st.integers(0, 2))  # a gap, as a chunk's bytes past a shorter rewrite
            starts[sample], at = at, at + sizes[sample]
        values.append((np.arange(at * int(np.prod(row_shape)), dtype=np.int64) + 1000 * chunk)
                      .reshape(at, *row_shape).astype(dtype))
        ranges.append(np.array([[start, start + size] for start, size in zip(starts, sizes, strict=True)], np.int64)
                      .reshape(-1, 2))
        samples += [(chunk, sample) for sample in range(len(sizes))]
    taken = data.draw(st.lists(st.sampled_from(samples), min_size=1, max_size=12))
    rows = np.array(data.draw(st.permutations(range(len(taken)))), np.int64)
    which, local = np.array([c for c, _ in taken], np.int64), np.array([s for _, s in taken], np.int64)
    out, offsets = gather_ragged(values, ranges, which, local, rows)
    expected = [None] * len(taken)
    for (chunk, sample), row in zip(taken, rows.tolist(), strict=True):
        start, stop = ranges[chunk][sample]
        expected[row] = values[chunk][start:stop]
    assert offsets.tolist() == [0, *np.cumsum([len(rows_of) for rows_of in expected]).tolist()]
    assert out.dtype == dtype and out.shape[1:] == row_shape
    np.testing.assert_array_equal(out, np.concatenate(expected))


def test_a_ragged_gather_out_of_range_is_refused_naming_the_copy_before_any_row_moves():
    if getattr(native.windows, "ragged_rows", None) is None:
        pytest.skip(f"outcore's _windows extension is not in use here: {native.copies()}")
    values, ranges, one = [np.zeros((3, 4), np.float32)], [np.array([[0, 2], [2, 3]])], np.array([0])
    for which, local, rows, said in ((np.array([1]), one, one, "copy 0: sample 0 of chunk 1"),
                                     (one, np.array([2]), one, "copy 0: sample 2 of chunk 0"),
                                     (one, one, np.array([1]), "into row 1")):
        with pytest.raises(IndexError, match=said):
            native.windows.ragged_offsets(ranges, which, local, rows, np.zeros(2, np.int64))
    backwards = [np.array([[2, 1]])]
    with pytest.raises(IndexError, match="runs backwards"):
        native.windows.ragged_offsets(backwards, one, one, one, np.zeros(2, np.int64))
    out = np.full((1, 4), 7, np.float32)
    for spans, offsets, error in (([np.array([[2, 4]])], np.array([0, 2]), "does not fit"),  # past the chunk's rows
                                  (ranges, np.array([0, 1]), "does not fit"),  # two rows into one row's place
                                  (ranges, np.array([0, 2]), "does not fit")):  # past out
        with pytest.raises(IndexError, match=error):
            native.windows.ragged_rows(values, spans, one, one, one, offsets, out)
    with pytest.raises(ValueError, match="format and row shape"):
        native.windows.ragged_rows(values, ranges, one, one, one, np.array([0, 2]), np.zeros((2, 4), np.float64))
    with pytest.raises(ValueError, match="int64 \\(n, 2\\)"):
        native.windows.ragged_offsets([np.zeros((1, 3), np.int64)], one, one, one, np.zeros(2, np.int64))
    assert (out == 7).all()


def test_a_copy_of_a_few_bytes_keeps_the_gil_and_a_large_one_lets_it_go():
    """Letting the GIL go and taking it back costs more than copying a batch's labels: the C extension copies fewer
    than 64 KiB holding it (counted by `gil_free_clock` only where it lets it go)."""
    if native.windows is None or gil_free_clock() is None:
        pytest.skip(f"the copies' C extension is not here ({native.copies()}): nothing to count")
    clock = gil_free_clock()
    labels, pictures = np.arange(4096, dtype=np.int64), np.zeros((64, 128, 128, 3), np.uint8)
    for source, copied in ((labels[:8000 // 8], False), (pictures, True)):
        every = np.arange(len(source))
        out = np.empty_like(source)
        before = clock()
        for _ in range(20_000 if not copied else 20):
            copy_samples([source], np.zeros(len(source), np.int64), every, out, every[::-1])
        assert (clock() > before) == copied and (out == source[::-1]).all()


def test_the_time_outside_the_gil_is_told_by_thread():
    """`thread_free_seconds` is the calling thread's part of `gil_free_clock`'s count: a copy that lets the GIL go
    counts there on the thread that made it, and not on another (`cores.py` takes a C run's waits out of its
    consumer's share so)."""
    if native.windows is None or gil_free_clock() is None:
        pytest.skip(f"the copies' C extension is not here ({native.copies()}): nothing to count")
    clock = gil_free_clock()
    pictures = np.zeros((64, 128, 128, 3), np.uint8)
    every, out = np.arange(len(pictures)), np.empty_like(pictures)

    def copies() -> None:
        for _ in range(20):
            copy_samples([pictures], np.zeros(len(pictures), np.int64), every, out, every)

    here, counted = thread_free_seconds(), clock()
    elsewhere = threading.Thread(target=copies)
    elsewhere.start()
    elsewhere.join()
    assert thread_free_seconds() == here and clock() > counted
    copies()
    assert thread_free_seconds() > here


def test_runs_cover_every_item_once_from_pool_threads_busy_or_free():
    """Batches made on the pool's threads share their runs with the free ones: a call made from every pool
    thread at once (none free) still finishes, on its own thread."""
    outcore.set_threads(3)
    try:
        seen, lock = [], threading.Lock()

        def batch(index: int) -> None:
            def run(start: int, stop: int) -> None:
                with lock:
                    seen.extend((index, i) for i in range(start, stop))

            for_each_run(run, 100)

        wait_all([submit(batch, index) for index in range(6)])
        assert sorted(seen) == [(index, i) for index in range(6) for i in range(100)]
    finally:
        outcore.set_threads(None)


def test_the_first_failure_of_a_run_is_raised_and_no_run_starts_after_it():
    outcore.set_threads(2)
    try:
        started = []

        def run(start: int, stop: int) -> None:
            started.append(start)
            if start == 0:
                raise KeyError("run 0")

        with pytest.raises(KeyError, match="run 0"):
            for_each_run(run, 8, least=1)
        assert 0 in started and len(started) < 8
    finally:
        outcore.set_threads(None)


def test_the_pool_runs_at_most_its_limit_at_once_in_order_and_hands_tasks_to_the_last_idle_thread():
    pool = Pool(4, "test-pool")
    pool.gauge.limit = 2
    try:
        running, most, order, lock = [0], [0], [], threading.Lock()
        gates = [threading.Event() for _ in range(6)]

        def task(index: int) -> str:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(index)
            gates[index].wait(10)
            with lock:
                running[0] -= 1
            return threading.current_thread().name

        futures = [pool.submit(task, index) for index in range(6)]
        time.sleep(0.2)
        assert running[0] == 2 and len(pool.waiting[True]) == 4 and order == [0, 1]  # two run, four wait
        for index in range(4):  # one task ends at a time: the thread it frees takes the oldest waiting
            gates[index].set()
            deadline = time.monotonic() + 10
            while len(order) < index + 3 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert order == list(range(index + 3))
        for gate in gates:
            gate.set()
        names = {future.result(10) for future in futures}
        assert most[0] == 2 and len(names) == 2  # in order, on two threads only
        one = [pool.submit(threading.current_thread).result(10).name for _ in range(5)]
        assert len(set(one)) == 1  # one after the other: the thread that went idle last, every time
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(10)
    finally:
        pool.shutdown()


def test_the_pools_threads_are_no_daemons_even_when_a_daemon_thread_starts_them():
    """The interpreter's exit waits for them (once the pool is shut down, each ends after its task): a daemon
    thread still running a task then is ended where it next takes the GIL, which can abort the process."""
    pool = Pool(2, "test-daemons")
    try:
        daemons = []
        producer = threading.Thread(target=lambda: daemons.append(
            pool.submit(lambda: threading.current_thread().daemon).result(10)), daemon=True)  # as the batches' producer
        producer.start()
        producer.join(10)
        assert daemons == [False]
    finally:
        pool.shutdown()


def test_tasks_waiting_at_shutdown_are_cancelled_and_the_threads_end():
    pool = Pool(1, "test-shutdown")
    gate = threading.Event()
    first, second = pool.submit(gate.wait, 10), pool.submit(time.sleep, 0)
    pool.shutdown()
    gate.set()
    assert first.result(10) is True and second.cancelled()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(time.sleep, 0)
    deadline = time.monotonic() + 10
    while any(thread.name.startswith("test-shutdown") for thread in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_task_is_run_or_cancelled_once_and_its_waiters_get_its_result_or_failure():
    ran = Task()
    assert ran.claim() and not ran.claim() and not ran.cancel() and not ran.done()  # claimed: runs, never cancelled
    assert not ran.wait(0.01)
    with pytest.raises(TimeoutError):
        ran.result(timeout=0.01)
    got: list[object] = []
    waiters = [threading.Thread(target=lambda: got.append(ran.result(10))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    ran.set_result("made")
    for waiter in waiters:
        waiter.join(10)
    assert got == ["made"] * 3 and ran.done() and ran.result() == "made" and not ran.cancelled()
    failed = Task()
    assert failed.claim()
    failed.set_exception(KeyError("chunk 3"))
    with pytest.raises(KeyError, match="chunk 3"):
        failed.result(0)
    cancelled = Task()
    assert cancelled.cancel() and cancelled.cancel() and cancelled.cancelled() and cancelled.done()
    assert not cancelled.claim()  # the pool's thread skips it
    with pytest.raises(CancelledError):
        cancelled.result(0)


def test_a_run_made_while_every_thread_is_busy_is_done_alone_without_waiting_for_them():
    """A `for_each_run` called while every pool thread is held does its runs alone and returns: it never waits
    for a thread to go free, and queues nothing behind the held ones."""
    outcore.set_threads(2)
    try:
        gate = threading.Event()
        busy = [submit(gate.wait, 10) for _ in range(2)]  # both threads held
        time.sleep(0.1)
        seen = []
        for_each_run(lambda start, stop: seen.append((start, stop)), 8)
        assert sorted(i for start, stop in seen for i in range(start, stop)) == list(range(8))
        assert not gate.is_set() and len(seen) > 1  # done alone, in its runs, while the pool's threads were held
        assert not shared_pool().waiting[True] and not shared_pool().shared  # nothing left behind for them
        gate.set()
        wait_all(busy)
    finally:
        outcore.set_threads(None)


def test_threads_that_go_free_join_a_run_started_while_they_were_busy(monkeypatch):
    """A batch's runs begun while every thread was busy (another batch, a read) are joined by each thread as it
    goes free, not left to the batch's own thread: on 16 cores, batches made one after another otherwise ran
    on one thread each, and no more than 4 threads' worth of work was done whatever their number."""
    monkeypatch.setattr(outcore.threads, "available_cpus", lambda: 2)  # two may be busy, whatever this machine has
    outcore.set_threads(2)
    try:
        gate, joined = threading.Event(), threading.Event()
        busy = [submit(gate.wait, 10) for _ in range(2)]  # both threads held as the call begins
        time.sleep(0.1)
        caller, threads = threading.current_thread(), []

        def run(start: int, stop: int) -> None:
            threads.append(threading.current_thread())
            if threading.current_thread() is not caller:
                joined.set()
            elif start == 0:
                gate.set()  # the pool's threads go free while this run goes on
                assert joined.wait(10), "no thread that went free joined the runs left"

        for_each_run(run, 8)
        wait_all(busy)
        assert len(threads) == 8 and any(thread is not caller for thread in threads)
    finally:
        outcore.set_threads(None)


def test_calls_under_way_together_make_the_runs_of_one(monkeypatch):
    """``k`` calls sharing the pool make ``ceil(limit / k)`` threads' worth of runs each, not each a whole pool's: on
    16 cores the batches made at once each cut into 64 runs took and gave back the GIL four times as often."""
    monkeypatch.setattr(outcore.threads, "available_cpus", lambda: 4)  # four may be busy, whatever this machine has
    outcore.set_threads(4)
    try:
        gate, started = threading.Event(), threading.Semaphore(0)

        def held(start: int, stop: int) -> None:
            started.release()
            gate.wait(10)

        alone: list[tuple[int, int]] = []
        for_each_run(lambda start, stop: alone.append((start, stop)), 64)
        assert len(alone) == outcore.threads.BLOCKS_PER_THREAD * 4  # one call: the whole pool's runs
        callers = [threading.Thread(target=for_each_run, args=(held, 64)) for _ in range(2)]
        for caller in callers:  # two calls under way, their runs held: every pool thread and both callers busy
            caller.start()
            assert started.acquire(timeout=10)
        for _ in range(4):
            assert started.acquire(timeout=10)
        assert len(shared_pool().shared) == 2
        third: list[tuple[int, int]] = []
        for_each_run(lambda start, stop: third.append((start, stop)), 64)  # done alone, every thread held
        assert len(third) == outcore.threads.BLOCKS_PER_THREAD * 2  # ceil(4 / 3) threads' worth
        assert sorted(i for start, stop in third for i in range(start, stop)) == list(range(64))
        gate.set()
        for caller in callers:
            caller.join(10)
        assert not any(caller.is_alive() for caller in callers) and not shared_pool().shared
    finally:
        gate.set()
        outcore.set_threads(None)


def test_shared_runs_are_joined_within_the_gauges_limit_oldest_first():
    """Threads join shared runs no more than the gauge's limit allows at once (the caller, not a pool thread,
    besides), and threads that go free join the oldest call's runs before a newer one's."""
    pool = Pool(4, "test-share")
    pool.gauge.limit = 2
    try:
        running, most, order, older_left, lock = [0], [0], [], [], threading.Lock()
        gate = threading.Event()

        def work(name: str):
            def run(start: int, stop: int) -> None:
                with lock:
                    running[0] += 1
                    most[0] = max(most[0], running[0])
                    order.append(name)
                    if name == "newer":
                        older_left.append(older.left())
                gate.wait(10)
                with lock:
                    running[0] -= 1

            return run

        held = [pool.submit(gate.wait, 10) for _ in range(2)]  # the limit taken: a call shared now gets no helper
        older, newer = Runs(work("older"), 8, 8, pool.gauge), Runs(work("newer"), 8, 8, pool.gauge)
        pool.share(older, 7)
        pool.share(newer, 7)
        time.sleep(0.1)
        assert order == []
        gate.set()  # the two threads go free: each joins the older runs, then the newer
        wait_all(held)
        older.wait()  # every run taken by the pool's threads: the caller waits for them
        newer.wait()
        assert most[0] <= 2 and sorted(order) == ["newer"] * 8 + ["older"] * 8
        assert older_left == [False] * 8  # no newer run began while older ones were left to take
        assert not pool.shared
        gate.clear()
        order.clear()
        most[0] = 0
        third = Runs(work("third"), 8, 8, pool.gauge)
        pool.share(third, 7)  # threads idle: as many start as the limit allows
        time.sleep(0.1)
        assert running[0] == 2 and order == ["third"] * 2
        gate.set()
        third.take()
        pool.unshare(third)
        third.wait()
        assert most[0] <= 3 and len(order) == 8  # the two, and the caller
    finally:
        pool.shutdown()


def test_the_gauge_lowers_the_limit_to_the_threads_that_ran_and_raises_it_slowly():
    gauge = Gauge(16)
    judge = lambda share: [gauge.record(share, 1.0) for _ in range(Gauge.EVERY)]
    judge(0.2)  # the mean share: (1 + 0.2) / 2
    assert gauge.limit == round(16 * 0.6 / Gauge.TARGET)  # 11: the threads' worth that ran
    judge(0.95)  # the judgement right after a change is skipped
    assert gauge.limit == 11
    judge(0.95)  # (0.85 + 0.95) / 2: not yet above HIGH
    judge(0.95)
    assert gauge.limit == 12  # one more, after one good judgement
    judge(0.3), judge(0.3)  # worse at once (once the rise settled): back down; the next rise waits twice as long
    assert gauge.limit == round(12 * (0.925 + 0.3) / 2 / Gauge.TARGET) == 9 and gauge.patience == 2
    judge(0.95), judge(0.95), judge(0.95)  # skipped, then the mean climbs past HIGH: one judgement above it
    assert gauge.limit == 9
    judge(0.95)  # two in a row
    assert gauge.limit == 10
    for _ in range(6):  # a rise undone again and again: the next waits at most MOST_PATIENCE judgements
        for _ in range(gauge.patience + 3):
            judge(0.95)
        judge(0.2), judge(0.2)
    assert gauge.patience == Gauge.MOST_PATIENCE


def test_threads_that_share_their_cores_with_other_work_are_not_all_kept_busy(photos):
    """As many busy processes as this one may use CPUs: decoding, the pool's threads wait for cores half the
    time, and it soon keeps fewer of them busy (never more than the CPUs, in any case)."""
    cpus = outcore.available_cpus()
    outcore.set_threads(4 * cpus)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        assert gauge().limit == cpus  # four times the CPUs' threads, as many busy at most as CPUs
        # a step after the crop other than Normalize: the pool's tasks make the batches, whose gauge is watched
        it = photos["encoded"].batches(64, fields=["images"],
                                       transform=Compose([RandomCrop(24), BrightnessContrast(), Normalize(0.5, 0.2)]))
        for _ in range(200):  # the gauge measures a run every 20 ms and judges 8 at a time: a few seconds
            for _ in it:
                pass
            if gauge().limit < cpus:
                break
        assert gauge().limit < cpus, (gauge().limit, gauge().last)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        outcore.set_threads(None)


@pytest.mark.skipif(native_run.Engine is None or native_run.engine_clocks is None,
                    reason="the C extension _chunks is not built here: no C runs")
def test_an_engine_s_batches_feed_the_pool_s_gauge_whose_limit_its_threads_keep(photos, monkeypatch):
    """The engines sum the CPU and wall time of the batches they make (in C); a C run feeds them to the pool's gauge:
    batches that waited for cores three quarters of their time lower its limit, and the engines' threads keep to it
    (`set_engine_turns`), as the pool's tasks do. (On this VM, processes keeping every core busy do not lower it: the
    engine's threads, asleep between batches, are given the cores as they wake; a thread waiting on the GIL is what
    lowers the pool's.)"""
    cpus = outcore.available_cpus()
    if cpus < 2:
        pytest.skip("one CPU: the limit cannot fall")
    outcore.set_threads(4 * cpus)
    turns = []
    monkeypatch.setattr(native_run, "set_engine_turns", lambda limit: turns.append(limit) or set_engine_turns(limit))
    options = {"fields": ["images"], "transform": Compose([RandomCrop(24), RandomFlip()])}
    try:
        clocks = native_run.engine_clocks
        clocks(0.0)  # counted from now
        with monkeypatch.context() as patched:
            patched.setattr(native_run, "engine_clocks", lambda least: None)
            it, kinds, count = photos["encoded"].batches(64, **options), set(), 0
            for batch in it:
                kinds.add(type(it._active))
                count += len(batch["images"])
            assert count == 512 and kinds == {native_run.NativeRun}
        cpu, wall = clocks(0.0)
        assert 0 < cpu <= wall + 0.02  # the thread clocks tick in steps of a few ms
        monkeypatch.setattr(native_run, "engine_clocks", lambda least: (0.25, 1.0))
        for _ in range(Gauge.EVERY * 4):  # a judgement every 8 batches (the one after a change skipped)
            for _ in it:
                pass
            if gauge().limit < cpus:
                break
        assert gauge().limit < cpus and turns[0] == cpus and turns[-1] == gauge().limit, (turns, gauge().last)
    finally:
        outcore.set_threads(None)


def test_the_cpu_time_of_outcores_c_calls_outside_the_gil_is_counted_and_nothing_else():
    """`gil_free_clock` counts the thread CPU time of the extensions' calls that release the GIL: a copy's, not
    Python's; without the extensions (``OUTCORE_NATIVE=0``) there is no clock."""
    off = subprocess.run([sys.executable, "-c", "from outcore.measure import gil_free_clock; print(gil_free_clock())"],
                         env={**os.environ, "OUTCORE_NATIVE": "0"}, capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "None"
    if native.windows is None:
        pytest.skip(f"the copies' C extension is not here ({native.copies()}): nothing to count")
    clock = gil_free_clock()
    source = np.random.default_rng(0).integers(0, 255, (2048, 64, 64, 3), np.uint8)
    every = np.arange(len(source))
    out = np.empty_like(source)
    cpu = time.process_time()
    for _ in range(10):
        copy_samples([source], np.zeros(len(source), np.int64), every, out, every[::-1])
    used, copied = time.process_time() - cpu, clock()
    assert (out == source[::-1]).all() and 0 < copied <= used + 0.02  # the clocks tick in steps of about 10 ms
    before = clock()
    assert sum(range(3_000_000)) and clock() == before  # Python's work holds the GIL: not counted


def test_a_handoff_keeps_order_holds_at_most_its_size_and_wakes_a_waiting_taker():
    handoff = Handoff(2)
    assert handoff.put(0, timeout=0.1) and handoff.put(1, timeout=0.1)
    began = time.monotonic()
    assert not handoff.put(2, timeout=0.05)  # full: nothing added, after the timeout
    assert time.monotonic() - began >= 0.04 and handoff.qsize() == 2
    assert [handoff.get(timeout=0.1), handoff.get(timeout=0.1)] == [0, 1]
    with pytest.raises(queue.Empty):
        handoff.get(timeout=0.01)
    taken: list[int] = []
    taker = threading.Thread(target=lambda: taken.extend(handoff.get(timeout=10) for _ in range(5)))
    taker.start()
    for item in range(5):  # more than its size: each put waits for the taker to free a place
        assert handoff.put(item, timeout=10)
    taker.join(10)
    assert taken == list(range(5)) and handoff.qsize() == 0
    with pytest.raises(ValueError, match="size=0"):  # never an unbounded queue by mistake
        Handoff(0)
