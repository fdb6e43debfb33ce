"""A run of plain batches made start to end by the C engine (`outcore.iterate.native_run`): the batches the pool's tasks
make, byte for byte, for every plan, field and pixel (windows of whole pixels cut, boxes resized, flips mirrored, pixels
normalized alike), epochs started ahead and resumed; a damaged chunk or an unreadable shard index named by a local run
at its batch, the batches before it delivered; a closed run stopped at once; the engine refusing a plan that would read
out of bounds, and a file of another version; an encoded field's files decoded by the engine's threads (or the boxes of
pictures of their own sizes), those its decoder leaves (and boxes its resize leaves) made (or named) by Python as a
local run makes (or names) them; the engines of a process sharing its threads."""

from __future__ import annotations

import os
import time
import tracemalloc

import crc32c
import imageio.v3 as iio
import numpy as np
import pytest
import zarr
from support.pictures import write_mixed_pictures

import outcore
from outcore.errors import CorruptChunkError, OptionError, SampleDecodeError
from outcore.imaging import native as native_imaging
from outcore.iterate import iterator as iterator_module
from outcore.iterate import native_run, runs
from outcore.storage.chunk_reads import Engine
from outcore.testing import corrupt_chunk, write_image_folder
from outcore.transforms import (
    BrightnessContrast,
    Cast,
    CenterCrop,
    Compose,
    Normalize,
    RandomCrop,
    RandomFlip,
    RandomResizedCrop,
    ScaleJitter,
)

pytestmark = pytest.mark.skipif(Engine is None, reason="the C extension _chunks is not built here: no C runs")
needs_decoder = pytest.mark.skipif(getattr(native_imaging.extension, "picture_decoder", None) is None,
                                   reason="the C extension _jpeg is not built here: an encoded field's batches are "
                                          "made by local runs")
needs_c_resize = pytest.mark.skipif(getattr(native_imaging.extension, "picture_decoder", None) is None,
                                    reason="the C extension _jpeg is not built here: boxes resized by local runs")


@pytest.fixture
def store(tmp_path, rng):
    arrays = {"images": rng.integers(0, 256, (1000, 8, 8, 3), dtype=np.uint8), "labels": np.arange(1000) % 7,
              "id": np.arange(1000), "scores": rng.random((1000, 5), dtype=np.float32)}
    location = tmp_path / "s.zarr"
    return outcore.from_arrays(arrays, location, chunk_size=32, progress=False), location


def epoch(iterator, native: bool, monkeypatch) -> tuple[list[dict[str, np.ndarray]], set[str]]:
    """One epoch of ``iterator``'s batches (copied) and the kinds of run that made them: by C runs where they can be,
    or with ``native`` False by `LocalRun` only."""
    with monkeypatch.context() as patched:
        if not native:
            patched.setattr(iterator_module, "native_run", lambda *args: None)
        batches, kinds = [], set()
        for batch in iterator:
            kinds.add(type(iterator._active).__name__)
            batches.append({name: values.copy() for name, values in batch.items()})
    return batches, kinds


def both_ways(batches, monkeypatch, threads: int | None = None
              ) -> tuple[list[dict[str, np.ndarray]], set[str], list[dict[str, np.ndarray]]]:
    """An epoch of ``batches()`` made by C runs where they can be, and one by `LocalRun` only (`epoch`), on ``threads``
    threads (the default's without): ``(made, the kinds of run that made them, expected)``."""
    outcore.set_threads(threads)
    try:
        made, kinds = epoch(batches(), True, monkeypatch)
        expected, local_kinds = epoch(batches(), False, monkeypatch)
    finally:
        outcore.set_threads(None)
    assert local_kinds == {"LocalRun"}
    return made, kinds, expected


def assert_same(made: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]]) -> None:
    assert len(made) == len(expected)
    for batch, other in zip(made, expected, strict=True):
        assert batch.keys() == other.keys()
        for name in batch:
            assert batch[name].dtype == other[name].dtype and batch[name].shape == other[name].shape
            np.testing.assert_array_equal(batch[name], other[name])


@pytest.mark.parametrize("options", [
    {"shuffle": True, "seed": 3},
    {"shuffle": False},
    {"shuffle": True, "seed": 5, "rank": 1, "world_size": 3},
    {"shuffle": True, "seed": 1, "drop_last": True},
    {"shuffle": True, "seed": 2, "buffer_chunks": 1},
    {"shuffle": True, "seed": 4, "buffer_chunks": 12, "fields": ["scores", "id"]},
])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_c_run_makes_the_batches_a_local_run_makes(store, monkeypatch, options, threads):
    """Every field, every plan (shuffled or not, a rank's share, the last batch short or dropped, buffers of one chunk
    or many): the same batches, in the same order, on one thread or several."""
    ds, _ = store
    made, kinds, expected = both_ways(lambda: ds.batches(100, **options), monkeypatch, threads)
    assert kinds == {"NativeRun"}
    assert_same(made, expected)


WINDOWS = [
    Compose([RandomCrop(6), RandomFlip()]),
    Compose([RandomCrop(6, padding=2), RandomFlip(vertical=True)]),  # past the pictures' edges: zeros there
    RandomCrop((10, 7), padding=3),  # taller than the pictures
    Compose([RandomCrop((5, 3)), RandomFlip(horizontal=True, vertical=True, p=0.7)]),
    RandomCrop(7),
    RandomFlip(vertical=True, horizontal=False),
]
RESIZED_CROPS = [
    RandomResizedCrop(5),
    Compose([RandomResizedCrop((6, 4), scale=(0.3, 1.0)), RandomFlip(horizontal=True, vertical=True)]),
    Compose([ScaleJitter(6, scale=(0.5, 1.5)), RandomFlip()]),  # boxes past the pictures' edges too: zeros there
    CenterCrop(6, resize=7),
    CenterCrop(5),  # a window of whole pixels in each: copied
    Compose([RandomResizedCrop(12), RandomFlip()]),  # larger than the pictures: each box resized up
]


@pytest.mark.parametrize("transform", [*WINDOWS, *(pytest.param(crop, marks=needs_c_resize) for crop in RESIZED_CROPS)])
@pytest.mark.parametrize("pictures", [(np.uint8, 3), (np.uint8, 1), (np.uint16, 3), (np.float32, 4), (np.int16, 2)])
def test_a_c_run_cuts_and_resizes_the_boxes_a_local_run_cuts(tmp_path, monkeypatch, transform, pictures):
    """A crop of whole pixels (a `RandomCrop`, padded or not, or the whole picture), or of boxes resized
    (`RandomResizedCrop`, `ScaleJitter`, `CenterCrop`: the C extension's resize), mirrored or not, of pictures of any
    pixel (1 to 16 bytes) and every kind the C extension resizes: each piece's boxes and mirrors drawn as a local run
    draws them, cut or resized alike, byte for byte, on the engine's threads."""
    dtype, channels = pictures
    values = np.random.default_rng(1).integers(0, 250, (300, 9, 8, channels)).astype(dtype)
    ds = outcore.from_arrays({"images": values, "labels": np.arange(300)}, tmp_path / "p.zarr", chunk_size=16,
                             progress=False)
    made, kinds, expected = both_ways(lambda: ds.batches(40, seed=6, transform=transform), monkeypatch)
    assert kinds == {"NativeRun"}
    assert_same(made, expected)


@needs_c_resize
def test_boxes_the_engine_s_resize_leaves_are_resized_by_python(tmp_path, monkeypatch):
    """Boxes past their pictures' edges by less than rounding, which single precision does not find inside: the
    engine's resize leaves them, and the consumer resizes them as a local run's `resize_rows` does."""
    values = np.random.default_rng(1).integers(0, 250, (200, 9, 8, 3)).astype(np.uint8)
    ds = outcore.from_arrays({"images": values}, tmp_path / "p.zarr", chunk_size=16, progress=False)
    drawn = RandomResizedCrop.boxes_of_pieces

    def past_the_edge(crop, sizes, pieces, flip):
        made = drawn(crop, sizes, pieces, flip)
        if made is not None:
            made[0][::20] = (0.0, 0.0, 9 + 8e-7, 8.0)  # 9.00000095 in single precision; 2 a batch
        return made

    monkeypatch.setattr(RandomResizedCrop, "boxes_of_pieces", past_the_edge)
    left = left_by_the_decoder(monkeypatch)
    transform = Compose([RandomResizedCrop(5), RandomFlip()])
    made, kinds = epoch(ds.batches(40, seed=6, transform=transform), True, monkeypatch)
    expected, _ = epoch(ds.batches(40, seed=6, transform=transform), False, monkeypatch)
    assert kinds == {"NativeRun"} and len(left) == 10
    assert_same(made, expected)


def test_boxes_of_pictures_the_c_extension_does_not_resize_are_made_by_a_local_run(tmp_path, monkeypatch):
    """RGBA pictures of 8 bits (resized premultiplied, as Pillow does, by resize.py) and int8 ones: a local run's."""
    for dtype, channels in [(np.uint8, 4), (np.int8, 3)]:
        values = np.random.default_rng(1).integers(0, 100, (100, 9, 8, channels)).astype(dtype)
        ds = outcore.from_arrays({"images": values}, tmp_path / f"{np.dtype(dtype)}.zarr", chunk_size=16,
                                 progress=False)
        transform = Compose([RandomResizedCrop(5), RandomFlip()])
        made, kinds = epoch(ds.batches(40, seed=6, transform=transform), True, monkeypatch)
        assert kinds == {"NativeRun"}  # its run falls back to a local run's batches, the same
        assert_same(made, epoch(ds.batches(40, seed=6, transform=transform), False, monkeypatch)[0])


@pytest.fixture(params=[3, 1], ids=["rgb", "grey"])
def photos(tmp_path, request):
    """An encoded store of 32x32 pictures (RGB, or grey): JPEGs, RGB and grey PNGs, an RGBA PNG, a grey JPEG, and one
    JPEG of another size (resized as it is decoded: a file the engine's decoder leaves)."""
    root = tmp_path / "photos"
    write_image_folder(root, 60, classes=("cat", "dog"), size=(32, 32), extension=".jpg", seed=1)
    write_image_folder(root, 10, classes=("dog", "owl"), size=(32, 32), extension=".png", seed=2)
    rng = np.random.default_rng(3)
    iio.imwrite(root / "owl" / "grey.png", rng.integers(0, 256, (32, 32), dtype=np.uint8))
    iio.imwrite(root / "cat" / "alpha.png", rng.integers(0, 256, (32, 32, 4), dtype=np.uint8))
    iio.imwrite(root / "cat" / "grey.jpg", rng.integers(0, 256, (32, 32), dtype=np.uint8))
    iio.imwrite(root / "cat" / "wide.jpg", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return outcore.ingest_images(root, tmp_path / "e.zarr", shape=(32, 32, request.param), chunk_size=8,
                                 images="encoded", progress=False)


def left_by_the_decoder(monkeypatch) -> list[int]:
    """The batch rows whose files the engine's decoder leaves to Python from now on, as they are decoded there."""
    left: list[int] = []
    decode = native_run.NativeRun._decode_undone

    def counted(run, made, undone):
        left.extend(undone)
        return decode(run, made, undone)

    monkeypatch.setattr(native_run.NativeRun, "_decode_undone", counted)
    return left




@needs_decoder
@pytest.mark.parametrize("transform", [None, RandomFlip(), Compose([RandomCrop(20), RandomFlip()]),
                                       RandomCrop((31, 9)), Compose([RandomCrop(32, padding=4), RandomFlip()]),
                                       Compose([RandomResizedCrop(20), RandomFlip()]), CenterCrop(24, resize=28)])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_c_run_decodes_the_files_a_local_run_decodes(photos, monkeypatch, transform, threads):
    """JPEGs and PNGs of every kind, whole or cut into windows, mirrored or not: the engine's threads decode them as a
    local run's tasks do, byte for byte; the files its decoder leaves (those `decode_each` leaves too: PNGs of colours
    converted as Pillow converts them) are decoded by Python."""
    left = left_by_the_decoder(monkeypatch)
    options = {"seed": 2, "fields": ["images", "labels"], "transform": transform}
    made, kinds, expected = both_ways(lambda: photos.batches(16, **options), monkeypatch, threads)
    assert kinds == {"NativeRun"}
    assert_same(made, expected)
    assert left


@pytest.fixture
def own_sizes(tmp_path):
    """An encoded store of pictures kept at their own sizes (37x90 to 120x70): JPEGs, a PNG, a grey JPEG and one that
    EXIF turns upright."""
    write_mixed_pictures(tmp_path / "mixed", per_class=12)
    return outcore.ingest_images(tmp_path / "mixed", tmp_path / "own.zarr", shape=None, images="encoded", chunk_size=4,
                                 progress=False)


@needs_decoder
@pytest.mark.parametrize("transform", [Compose([RandomResizedCrop(24), RandomFlip()]), RandomResizedCrop((150, 40)),
                                       CenterCrop(32, resize=40), Compose([ScaleJitter(48, (0.5, 1.5)), RandomFlip()])])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_c_run_cuts_the_boxes_of_pictures_of_their_own_sizes_as_a_local_run(own_sizes, monkeypatch, transform,
                                                                              threads):
    """Pictures of several sizes (each drawn its box by its own size, read from the field's shapes at the run's start):
    the engine's threads cut and resize their boxes (up or down, past their edges) as a local run's tasks do, byte for
    byte, the files its decoder leaves (the PNG, in C the pool's tasks leave it too) by Python."""
    left = left_by_the_decoder(monkeypatch)
    options = {"seed": 4, "fields": ["images", "labels"], "transform": transform}
    made, kinds, expected = both_ways(lambda: own_sizes.batches(5, **options), monkeypatch, threads)
    assert kinds == {"NativeRun"}
    assert_same(made, expected)
    assert len(left) <= 2  # the PNG at most (a ScaleJitter box may miss it)


M, S = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NORMALIZED = [
    Compose([RandomCrop(20), RandomFlip(), Normalize(M, S)]),
    Compose([RandomResizedCrop(24), RandomFlip(), Normalize(0.5, 0.25, dtype="float16")]),
    Compose([CenterCrop(24, resize=28), Normalize(M, S), Cast("float16")]),  # one step, `Normalize.then`
    Compose([ScaleJitter(28, (0.5, 1.5)), RandomFlip(), Normalize(0.2, (0.5, 0.4, 0.3), scale=0.01)]),
]


@needs_decoder
@pytest.mark.parametrize("transform", NORMALIZED)
@pytest.mark.parametrize("kind", ["pixels", "encoded", "own sizes"])
def test_a_c_run_normalizes_the_pictures_it_cuts_as_a_local_run(tmp_path, monkeypatch, transform, kind):
    """A `Normalize` after the crop and flip (a mean and std each one value or one a channel; float32 or float16): the
    engine's threads look each cut picture's pixels up in its table (`Normalize.table`), the same floats as a local
    run's, byte for byte; the files its decoder leaves are decoded, then looked up, by Python."""
    write_mixed_pictures(tmp_path / "mixed", per_class=12)
    options = {"shape": None if kind == "own sizes" else (40, 40, 3), "chunk_size": 4, "progress": False,
               "images": "pixels" if kind == "pixels" else "encoded"}
    ds = outcore.ingest_images(tmp_path / "mixed", tmp_path / "s.zarr", **options)
    made, kinds, expected = both_ways(lambda: ds.batches(5, seed=2, fields=["images", "labels"], transform=transform),
                                      monkeypatch)
    assert kinds == {"NativeRun"} and made[0]["images"].dtype in (np.float32, np.float16)
    assert_same(made, expected)


@needs_decoder
def test_a_random_crop_of_pictures_of_their_own_sizes_is_a_local_run_s(own_sizes, monkeypatch):
    """A `RandomCrop` of pictures of several sizes (its windows drawn piece by piece, each picture's checked): the run
    is made by a local run, which names the picture too small for it."""
    made, _, expected = both_ways(lambda: own_sizes.batches(5, seed=4, transform=RandomCrop(30), fields=["images"]),
                                  monkeypatch)
    assert_same(made, expected)
    with pytest.raises(OptionError, match=r"field 'images', sample \d+ \(chunk \d+\).*40"):
        epoch(own_sizes.batches(5, seed=4, transform=RandomCrop(40), fields=["images"]), True, monkeypatch)


@needs_decoder
def test_a_damaged_chunk_of_the_pictures_sizes_is_named_at_its_batch(own_sizes, monkeypatch):
    """The sizes of pictures of their own sizes are read at the run's start: one chunk of them that fails its checksum
    leaves the run to a local run, which names it at the first batch that needs it, after the batches before it."""
    options = {"shuffle": False, "fields": ["images", "labels"],
               "transform": Compose([RandomResizedCrop(24), RandomFlip()])}
    expected, _ = epoch(own_sizes.batches(5, **options), False, monkeypatch)
    corrupt_chunk(own_sizes.location, "images_shapes", 3)  # samples 12..15: batch 2 (10..14) is the first to need it
    iterator, delivered = own_sizes.batches(5, **options), []
    with pytest.raises(CorruptChunkError, match=r"field 'images_shapes', chunk 3 \(samples 12..15"):
        for batch in iterator:
            assert type(iterator._active).__name__ == "NativeRun"
            delivered.append({name: values.copy() for name, values in batch.items()})
    assert_same(delivered, expected[:2])


@needs_decoder
def test_files_smaller_than_their_pictures_are_decoded_by_a_c_run(tmp_path, monkeypatch):
    """JPEGs of one colour, a chunk of them fewer bytes than one decoded picture: decoded by the engine's threads as
    a local run decodes them."""
    for label in ("a", "b"):
        (tmp_path / "plain" / label).mkdir(parents=True)
        for k in range(6):
            iio.imwrite(tmp_path / "plain" / label / f"{k}.jpg", np.full((64, 64, 3), 40 * k, np.uint8))
    ds = outcore.ingest_images(tmp_path / "plain", tmp_path / "e.zarr", shape=(64, 64, 3), chunk_size=2,
                               images="encoded", progress=False)
    assert int(np.diff(zarr.open_group(ds.location, mode="r")["images_ranges"][:2], axis=1).sum()) < 64 * 64 * 3
    made, kinds, expected = both_ways(lambda: ds.batches(4, seed=1, fields=["images", "labels"]), monkeypatch)
    assert kinds == {"NativeRun"}
    assert_same(made, expected)


@needs_decoder
def test_a_run_whose_decoder_leaves_most_files_hands_the_rest_to_a_local_run(tmp_path, monkeypatch):
    """Files all of another size than the store's (each resized as it is decoded): the first batch's are decoded by
    Python, the rest of the run made by a local run, whose pool decodes them on every thread: the same batches."""
    write_image_folder(tmp_path / "big", 40, classes=("a",), size=(40, 48), extension=".jpg", seed=5)
    ds = outcore.ingest_images(tmp_path / "big", tmp_path / "e.zarr", shape=(32, 32, 3), chunk_size=8,
                               images="encoded", progress=False)
    left, handed = left_by_the_decoder(monkeypatch), []
    rest = native_run.NativeRun._rest
    monkeypatch.setattr(native_run.NativeRun, "_rest", lambda run, steps: handed.append(list(steps)) or rest(run, steps))
    made, kinds = epoch(ds.batches(16, shuffle=False, fields=["images", "labels"]), True, monkeypatch)
    assert kinds == {"NativeRun"} and left == list(range(16)) and handed == [[1, 2]]
    assert_same(made, epoch(ds.batches(16, shuffle=False, fields=["images", "labels"]), False, monkeypatch)[0])


@needs_decoder
@pytest.mark.parametrize("photos", [3], indirect=True)  # RGB: no batch before it with most of its files left
@pytest.mark.parametrize("transform", [None, RandomCrop(20)])
def test_a_damaged_file_is_named_at_its_batch_as_a_local_run_names_it(photos, monkeypatch, transform):
    """A file whose bytes were damaged (in a chunk whose checksum holds): the engine's decoder leaves it, and Python
    names the sample and its chunk, as a local run does, after the batches before it."""
    group = zarr.open_group(photos.location, mode="r+")
    start, stop = group["images_ranges"][41]
    group["images"][start + 2 : stop] = np.frombuffer(b"garbage!" * ((stop - start - 2) // 8 + 1), np.uint8)[
        : stop - start - 2]
    damaged = outcore.open_dataset(photos.location)
    options = {"shuffle": False, "fields": ["images", "labels"], "transform": transform}
    for native in (True, False):
        iterator, delivered = damaged.batches(16, **options), 0
        with (pytest.raises(SampleDecodeError, match=r"field 'images', sample 41 \(chunk 5\) cannot be decoded"),
              monkeypatch.context() as patched):
            if not native:
                patched.setattr(iterator_module, "native_run", lambda *args: None)
            for _ in iterator:
                assert type(iterator._active).__name__ == ("NativeRun" if native else "LocalRun")
                delivered += 1
        assert delivered == 2  # batches 0 and 1; sample 41 is in batch 2


class OwnNormalize(Normalize):
    """A `Normalize` of the user's own: it may compute otherwise."""


@pytest.mark.parametrize("transform", [Compose([RandomCrop(6), BrightnessContrast()]),
                                       Compose([RandomFlip(), RandomCrop(6)]), Compose([RandomCrop(6), OwnNormalize()]),
                                       Compose([RandomCrop(6), Normalize(np.zeros((6, 1, 3)), 0.5)])])
def test_other_transforms_are_made_by_a_local_run(store, monkeypatch, transform):
    """A step after the crop and flip other than a `Normalize` (or one of the user's own class, or whose mean is not
    one value nor one a channel), a flip before a crop: the pool's tasks make them."""
    ds, _ = store
    assert epoch(ds.batches(100, transform=transform, fields=["images", "id"]), True, monkeypatch)[1] == {"LocalRun"}


def test_a_torch_loader_without_workers_is_fed_by_c_runs(store, monkeypatch):
    """`ds.torch` without DataLoader workers: C runs, the tensors of local runs."""
    pytest.importorskip("torch")
    ds, _ = store
    made = []
    monkeypatch.setattr(native_run.NativeRun, "__init__", lambda run, *args, init=native_run.NativeRun.__init__:
                        made.append(run) or init(run, *args))

    def tensors(loader):
        return [{name: batch[name].numpy().copy() for name in ("images", "id")} for batch in loader]

    transform = Compose([RandomCrop(6), RandomFlip()])
    with_c = tensors(ds.torch(100, seed=3, transform=transform, fields=["images", "id"]))
    assert made
    monkeypatch.setattr(iterator_module, "native_run", lambda *args: None)
    assert_same(with_c, tensors(ds.torch(100, seed=3, transform=transform, fields=["images", "id"])))


def test_a_c_run_makes_its_batches_in_the_memory_it_is_given(store, monkeypatch):
    """A run's `empty` (pinned memory, `ds.torch` with a GPU) makes every batch's arrays, each field's, as for a local
    run."""
    ds, _ = store
    iterator = ds.batches(100, seed=8, fields=["images", "id"])
    asked = []

    def empty(shape, dtype, field=""):
        asked.append(field)
        return np.full(shape, 77, dtype)

    run = iterator.run(0, range(len(iterator)), empty=empty)
    try:
        assert isinstance(run, native_run.NativeRun)
        made = [{name: values.copy() for name, values in batch.items()} for batch in run]
    finally:
        run.close()
    assert asked == ["images", "id"] * len(iterator)
    assert_same(made, epoch(ds.batches(100, seed=8, fields=["images", "id"]), False, monkeypatch)[0])


def test_each_epoch_s_engine_reads_into_the_blocks_the_ones_before_gave_back(store, monkeypatch):
    """An iterator lends each run's engine the blocks the runs before gave back (as many as a run held), so that an
    epoch faults in few new pages: six epochs read into about two runs' blocks (the next epoch's run starts as one
    drains, each holding its own; a few more where a run held more than those before), not six."""
    ds, _ = store
    lent, lend = [], runs.ChunkBuffers.lend
    monkeypatch.setattr(runs.ChunkBuffers, "lend",
                        lambda buffers, nbytes: lent.append(lend(buffers, nbytes)) or lent[-1])
    iterator = ds.batches(64, seed=0, fields=["images", "id"])
    for _ in range(6):
        assert epoch(iterator, True, monkeypatch)[1] == {"NativeRun"}
    blocks = [{id(block) for block in run} for run in lent]  # kept by the iterator: an id is never another's
    most = iterator.buffers.most_held
    assert not blocks[0] and most > 0 and len(set().union(*blocks)) <= 2 * most + 4, ([len(run) for run in blocks], most)


def test_a_c_run_s_plan_takes_tens_of_bytes_a_sample(tmp_path):
    """The memory a C run holds besides its chunks and batches (each malloc'd or lent, as a local run's) is its plan:
    the rows by chunk, planned at the run's start in arrays of the run's samples, then kept by the engine (8 bytes a
    sample): an epoch's peak of traced memory grows by less than 80 bytes a sample more in the store."""
    chunk = np.random.default_rng(0).integers(0, 256, (32, 4, 4, 3), dtype=np.uint8)
    peaks = {}
    for chunks in (40, 640):
        ds = outcore.from_arrays({"images": np.concatenate([chunk] * chunks)}, tmp_path / f"{chunks}.zarr",
                                 chunk_size=32, progress=False)
        epochs = []
        for _ in range(4):
            tracemalloc.start()
            try:
                for _ in ds.batches(32, seed=0, buffer_chunks=4):
                    pass
                epochs.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
        peaks[chunks] = max(epochs[1:])
    assert peaks[640] - peaks[40] < 80 * 32 * 600, peaks


def test_epochs_resumed_and_started_ahead_are_the_same_batches(store, monkeypatch):
    """Epoch after epoch (the next epoch's C run started as this one drains), and an epoch resumed mid-way from a
    state: the batches of local runs."""
    ds, _ = store
    iterator, local = ds.batches(64, seed=9), ds.batches(64, seed=9)
    for _ in range(3):
        made, kinds = epoch(iterator, True, monkeypatch)
        assert kinds == {"NativeRun"}
        assert_same(made, epoch(local, False, monkeypatch)[0])
    for taken, _ in zip(range(5), iterator, strict=False):
        pass
    state = iterator.state_dict()
    iterator.close()
    resumed = ds.batches(64, seed=9)
    resumed.load_state_dict(state)
    local.load_state_dict(state)
    assert_same(epoch(resumed, True, monkeypatch)[0], epoch(local, False, monkeypatch)[0])


def test_what_needs_python_is_made_by_a_local_run(store, monkeypatch):
    """A transform of its own, a single batch: not a C run's (the same batch either way)."""
    ds, _ = store
    assert epoch(ds.batches(100, transform=lambda batch, rng: batch), True, monkeypatch)[1] == {"LocalRun"}
    iterator = ds.batches(100, seed=1)
    whole = epoch(ds.batches(100, seed=1), True, monkeypatch)[0]
    np.testing.assert_array_equal(iterator.batch(3)["id"], whole[3]["id"])


def test_a_damaged_chunk_is_named_at_its_batch_the_batches_before_it_delivered(store, monkeypatch):
    """The engine cannot vouch for a chunk whose checksum fails: that batch and the rest are made by a local run,
    which names the chunk, after every batch before it (the same ones)."""
    ds, location = store
    expected, _ = epoch(ds.batches(100, shuffle=False), False, monkeypatch)
    corrupt_chunk(location, "images", 12)  # samples 384..415: batch 3 (300..399) is the first to need it
    iterator = ds.batches(100, shuffle=False)
    delivered = []
    with pytest.raises(CorruptChunkError, match=r"field 'images', chunk 12 \(samples 384..415"):
        for batch in iterator:
            assert type(iterator._active).__name__ == "NativeRun"
            delivered.append({name: values.copy() for name, values in batch.items()})
    assert_same(delivered, expected[:3])


def test_a_run_whose_shard_index_cannot_be_read_is_made_by_a_local_run_which_names_it(store, monkeypatch):
    """The engine's reads are planned from the shards' indexes: one that fails its checksum leaves the whole run to
    a local run, which raises what it raises alone."""
    ds, location = store
    shard = next((location / "images" / "c").rglob("*"))
    while shard.is_dir():
        shard = next(shard.iterdir())
    status = shard.stat()
    with open(shard, "r+b") as file:  # in place, its time kept: a flipped bit, not another version of the file
        file.seek(-6, os.SEEK_END)  # in the index, before its checksum
        value = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([value[0] ^ 0xFF]))
    os.utime(shard, ns=(status.st_atime_ns, status.st_mtime_ns))
    errors = []
    for native in (True, False):
        with pytest.raises(CorruptChunkError) as raised:
            epoch(ds.batches(100, shuffle=False), native, monkeypatch)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and "shard index fails its checksum" in errors[0]


def test_a_run_closed_mid_epoch_stops_its_threads_and_the_next_iteration_goes_on(store, monkeypatch):
    """Breaking out of an epoch closes its C run (its threads stopped, its buffers back with the iterator); iterating
    again goes on from the next batch, as with local runs."""
    ds, _ = store
    iterator = ds.batches(50, seed=2)
    batches = iter(iterator)
    taken = [next(batches)["id"].copy()]
    run = iterator._active
    assert isinstance(run, native_run.NativeRun)
    batches.close()  # a training loop's break
    assert run.stop.is_set() and not run.thread.is_alive()
    assert iterator.buffers.most_held > 0  # the next run is lent as many blocks as this one held
    taken += [batch["id"].copy() for batch in iterator]
    local = ds.batches(50, seed=2)
    assert_same([{"id": ids} for ids in taken], [{"id": batch["id"]} for batch in epoch(local, False, monkeypatch)[0]])


@needs_decoder
def test_the_engines_of_a_process_share_its_threads(tmp_path):
    """Each epoch's run started ahead of the last one's end, and two loaders iterated at once: their engines together
    keep as many threads busy as `set_threads` says (each thread's CPU time counted: one core's worth of it, not one
    an engine)."""
    write_image_folder(tmp_path / "photos", 100, classes=("a", "b"), size=(96, 96), kind="photos", seed=1)
    ds = outcore.ingest_images(tmp_path / "photos", tmp_path / "e.zarr", shape=(96, 96, 3), chunk_size=8,
                               images="encoded", progress=False)
    options = {"fields": ["images"], "transform": Compose([RandomResizedCrop(64), RandomFlip()])}
    outcore.set_threads(1)
    try:
        loaders, runs_seen = [ds.batches(40, seed=1, **options), ds.batches(40, seed=2, **options)], set()
        began, cpu = time.perf_counter(), time.process_time()
        for _ in range(8):  # epochs of 5 batches, each next one started ahead
            for pair in zip(*loaders, strict=True):
                runs_seen.update(type(loader._active).__name__ for loader in loaders)
                assert len(pair) == 2
        busy = (time.process_time() - cpu) / (time.perf_counter() - began)
    finally:
        outcore.set_threads(None)
    assert runs_seen == {"NativeRun"}
    assert busy < 1.4, f"{busy:.2f} cores busy on 1 thread"


def test_a_consumer_waiting_on_a_closed_run_is_told_at_once(store):
    """`close` from another thread while the run's thread waits in the engine: both return within a wake."""
    ds, _ = store
    iterator = ds.batches(50, seed=2, prefetch=1)
    batches = iter(iterator)
    next(batches)
    began = time.perf_counter()
    iterator.close()
    assert time.perf_counter() - began < 1.0


def test_the_engine_refuses_a_plan_that_would_read_out_of_bounds():
    """Every index the engine's threads will follow is checked as it is made: a wrong plan is a ValueError."""
    plan = {"paths": [b"/nonexistent"], "stamps": np.zeros((1, 3), np.int64),
            "asks": np.array([[[0, 0, 100, 0]]], np.int64), "row_bytes": np.array([4], np.int64),
            "chunk_bytes": np.array([16], np.int64), "bounds": np.array([0, 2], np.int64),
            "row_slot": np.array([0, 0], np.int32), "row_local": np.array([0, 3], np.int32),
            "reach": np.array([0], np.int64), "used_bounds": np.array([0, 1], np.int64),
            "used": np.array([0], np.int64), "threads": 1, "read_ahead": 0, "window": 1, "lent": []}
    Engine(**plan).close()
    cut = {"picture": (0, 2, 2, 1, 1, 1), "windows": np.array([[0, 0, 1, 1], [1, 1, 1, 1]], np.float64),
           "mirrors": np.zeros((2, 2), np.uint8)}  # each row's 2x2 picture of 1-byte pixels: windows of one pixel
    Engine(**plan, **cut).close()
    Engine(**plan, **cut, table=np.zeros((256, 1), np.float32)).close()  # the windows' pixels looked up: floats
    for table in [np.zeros((256, 1), np.float64), np.zeros((256, 2), np.float32), np.zeros((255, 1), np.float32)]:
        with pytest.raises(ValueError, match="Engine: a table"):  # items of 8 bytes, a column a channel too many, short
            Engine(**plan, **cut, table=table)
    with pytest.raises(ValueError, match="Engine: a table"):  # no pictures cut
        Engine(**plan, table=np.zeros((256, 1), np.float32))
    Engine(**{**plan, **cut, "windows": np.array([[0, 0, 1, 1], [1, -3, 1, 1]], np.float64)}).close()  # zeros there
    for name, wrong in [("windows", np.array([[0, 0, 1, 1], [1, 3e9, 1, 1]], np.float64)),  # past an int's reach
                        ("windows", np.array([[0, 0, 1, 1], [0.5, 0, 1, 1]], np.float64)),  # not whole pixels
                        ("windows", np.array([[0, 0, 1, 1], [0, 0, 2, 1]], np.float64)),  # not the windows' size
                        ("mirrors", np.zeros((1, 2), np.uint8)), ("picture", (0, 2, 3, 1, 1, 1))]:
        with pytest.raises(ValueError, match="Engine"):
            Engine(**plan, **{**cut, name: wrong})
    decoder = getattr(native_imaging.extension, "picture_decoder", None)
    if decoder is not None:  # files of 2x2 grey pictures in the chunk's 16 bytes, their ranges (4 samples) read after
        decoded = {**plan, "asks": np.array([[[0, 0, 100, 0], [0, 0, 100, 0]]], np.int64),
                   "row_bytes": np.array([4, 16], np.int64), "chunk_bytes": np.array([16, 64], np.int64),
                   "decoded": (0, 2, 2, 1), "starts": np.zeros(1, np.int64), "decoder": decoder}
        Engine(**decoded).close()
        resized = {**plan, **cut, "picture": (0, 2, 2, 1, 1, 1, 1, ord("B")), "decoder": decoder}
        Engine(**resized).close()
        own = {**decoded, **cut, "row_bytes": np.array([1, 16], np.int64), "decoded": (0, 0, 0, 1),
               "picture": (0, 0, 0, 1, 1, 1, 1, ord("B")), "sizes": np.full((2, 2), 2, np.int32)}  # each row's size
        Engine(**own).close()
        for made, name, wrong in [(decoded, "decoded", (0, 2, 3, 1)), (decoded, "decoded", (0, 2, 2, 2)),
                                  (decoded, "decoded", (1, 2, 2, 1)), (decoded, "starts", np.zeros(2, np.int64)),
                                  (decoded, "row_bytes", np.array([4, 8], np.int64)), (decoded, "decoder", None),
                                  (resized, "decoder", None), (resized, "picture", (0, 2, 2, 1, 1, 1, 1, ord("x"))),
                                  (resized, "picture", (0, 2, 2, 1, 1, 1, 2, ord("B"))),
                                  (own, "sizes", None), (decoded, "sizes", own["sizes"]),
                                  (own, "sizes", np.full((3, 2), 2, np.int32)), (own, "sizes", np.full((2, 2), 2)),
                                  (own, "sizes", np.array([[2, 2], [-1, 2]], np.int32)), (own, "picture", None),
                                  (own, "picture", (0, 0, 0, 1, 1, 1)),
                                  (own, "row_bytes", np.array([4, 16], np.int64))]:
            with pytest.raises(ValueError, match="Engine|starts"):
                Engine(**{**made, name: wrong})
        with pytest.raises(ValueError, match="PyCapsule"):  # another capsule: not the decoder's
            Engine(**{**decoded, "decoder": np.random.PCG64().capsule})
    for name, wrong in [("row_local", np.array([0, 4], np.int32)), ("row_slot", np.array([0, 1], np.int32)),
                        ("used", np.array([1], np.int64)), ("bounds", np.array([0, 3], np.int64)),
                        ("asks", np.array([[[1, 0, 100, 0]]], np.int64)), ("row_local", np.array([0, 3], np.int64)),
                        ("lent", [np.empty(8, np.uint8)])]:
        with pytest.raises(ValueError, match="Engine"):
            Engine(**{**plan, name: wrong})


def _one_chunk_plan(tmp_path, batches: int) -> dict:
    """An engine's plan of ``batches`` batches of one row each from one chunk of 4 samples of 4 bytes (0, 1, ..., 15),
    samples 3, 1, 2, ... in turn, its file's stamp right."""
    data = np.arange(16, dtype=np.uint8)
    path = tmp_path / "chunk"
    path.write_bytes(data.tobytes() + crc32c.crc32c(data.tobytes()).to_bytes(4, "little"))
    status = path.stat()
    return {"paths": [bytes(path)], "stamps": np.array([(status.st_ino, status.st_mtime_ns, status.st_size)], np.int64),
            "asks": np.array([[[0, 0, 20, 0]]], np.int64), "row_bytes": np.array([4], np.int64),
            "chunk_bytes": np.array([16], np.int64), "bounds": np.arange(batches + 1, dtype=np.int64),
            "row_slot": np.zeros(batches, np.int32), "row_local": np.array([3, 1, 2, 0] * batches, np.int32)[:batches],
            "reach": np.zeros(batches, np.int64), "used_bounds": np.arange(batches + 1, dtype=np.int64),
            "used": np.zeros(batches, np.int64), "threads": 2, "read_ahead": 0, "window": 1, "lent": []}


def _taken(engine: Engine, spares: list | None = None) -> object:
    got = None
    while got is None:
        got = engine.take(0.05, spares)
    return got


def test_a_read_the_engine_cannot_vouch_for_ends_its_batch(tmp_path):
    """A file that is not the version its index was read from (its stamp differs): the batch is not made, and take
    says which slot failed; where it is, take gives back the arrays given for the batch, made."""
    plan = _one_chunk_plan(tmp_path, 1)
    for moved, vouched in [(0, True), (1, False)]:
        engine = Engine(**{**plan, "stamps": plan["stamps"] + [0, moved, 0]})
        arrays = [np.zeros(4, np.uint8)]
        engine.give(arrays)
        got = _taken(engine)
        engine.close()
        if vouched:
            assert got is arrays and arrays[0].tolist() == [12, 13, 14, 15]
        else:
            assert type(got) is int and got == 0  # slot 0 failed
            assert arrays[0].tolist() == [0, 0, 0, 0]


@needs_c_resize
def test_a_box_the_engine_cannot_resize_is_left_undone_for_python(tmp_path):
    """A box of numbers that are not finite: the resize leaves it, and `undone` names its row in the batch taken (None
    where every row was made)."""
    plan = {**_one_chunk_plan(tmp_path, 2), "picture": (0, 2, 2, 1, 1, 1, 1, ord("B")),
            "windows": np.array([[0, 0, 2, 2], [np.nan, 0, 1, 1]], np.float64), "mirrors": np.zeros((2, 2), np.uint8),
            "decoder": native_imaging.extension.picture_decoder}
    engine = Engine(**plan)
    made = []
    for _ in range(2):
        engine.give([np.full(1, 99, np.uint8)])
        made.append((_taken(engine)[0].tolist(), engine.undone))
    engine.close()
    # row 0: sample 3's 2x2 picture (12, 13, 14, 15) resized to one pixel: their mean, rounded
    assert made == [([14], None), ([99], [0])]


def test_a_spare_set_is_given_only_when_nothing_refers_to_it_nor_to_its_arrays(tmp_path):
    """`take(timeout, spares)` (and `give_spare`) gives the next batch a set of arrays from ``spares`` that nothing else
    refers to: never one whose array (or a view of it) a consumer holds, nor one of another size; ``given`` says
    whether one was."""
    engine = Engine(**_one_chunk_plan(tmp_path, 3))
    first = (np.zeros(4, np.uint8),)
    engine.give(first)
    holder, viewed = np.zeros(4, np.uint8), np.zeros(4, np.uint8)
    view = viewed[1:]
    spares = [(np.zeros(4, np.uint8),), (holder,), (viewed,), (np.zeros(2, np.uint8),)]  # free; held; viewed; small
    del viewed
    free = id(spares[0])
    assert _taken(engine, spares) is first and engine.given == 2  # batch 1 given the free one, the only one that fits
    assert first[0].tolist() == [12, 13, 14, 15]
    got = _taken(engine, spares)
    assert id(got) == free and got[0].tolist() == [4, 5, 6, 7] and engine.given == 2  # none free now: the free is got
    assert engine.give_spare(spares) is False
    del got  # free again: `give_spare` gives it (as a run's first batches are given the sets the last run's came back to)
    assert engine.give_spare(spares) is True and engine.given == 3 and id(_taken(engine)) == free
    engine.close()
    assert holder.tolist() == [0, 0, 0, 0] and view.tolist() == [0, 0, 0] and spares[3][0].tolist() == [0, 0]
