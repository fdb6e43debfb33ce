"""Encoded image fields: the files' own bytes in the store, decoded while reading."""

from __future__ import annotations

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import zarr

import outcore
from outcore import transforms
from outcore.cli import describe, main
from outcore.cli.bench import compare
from outcore.errors import SampleDecodeError, SourceError
from outcore.testing import write_image_folder
from outcore.threads import set_threads

SHAPE = (32, 32, 3)
AUGMENT = transforms.Compose([transforms.RandomCrop((24, 24)), transforms.RandomFlip(), transforms.BrightnessContrast()])


@pytest.fixture
def stores(image_folder, tmp_path):
    options = {"shape": SHAPE, "chunk_size": 4, "progress": False}
    pixels = outcore.ingest_images(image_folder, tmp_path / "pixels.zarr", **options)
    encoded = outcore.ingest_images(image_folder, tmp_path / "encoded.zarr", images="encoded", **options)
    return pixels, encoded


def test_encoded_store_reads_exactly_like_the_pixel_store(stores):
    pixels, encoded = stores
    assert encoded.fields == pixels.fields == ("images", "labels", "path", "source_index", "file_stat", "file_digest")
    assert encoded.attrs.fields["images"].is_image and encoded["images"].shape == (20, *SHAPE)
    np.testing.assert_array_equal(encoded["images"].compute(), pixels["images"].compute())
    np.testing.assert_array_equal(encoded["images"][5:11].compute(), pixels["images"][5:11].compute())
    options = {"shuffle": True, "seed": 3, "buffer_chunks": 2, "transform": AUGMENT}
    for a, b in zip(pixels.batches(6, **options), encoded.batches(6, **options), strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert encoded.batches(6).batch(2)["images"].shape == (6, *SHAPE)
    assert encoded.chunk_reader("images").direct  # outcore's own chunk reader, not zarr's


def test_batches_start_16_bytes_past_a_multiple_of_32_where_the_decoder_writes_plain_stores(stores):
    """libjpeg-turbo writes rows that start on a multiple of 32 bytes with non-temporal stores, 8 % slower per
    decoded sample (`outcore.imaging.LEAD`); numpy's arrays start there two times in three."""
    crop = transforms.Compose([transforms.RandomCrop((24, 24)), transforms.RandomFlip()])  # cut while decoding
    for transform in (None, crop):
        starts = {batch["images"].ctypes.data % 32 for batch in stores[1].batches(2, shuffle=True, transform=transform)}
        assert starts == {16}, transform
    assert stores[1].chunk_reader("images").empty().ctypes.data % 32 == 16  # whole chunks, for ds["images"]


def test_the_store_holds_the_files_bytes_readable_with_plain_zarr(stores, image_folder):
    _, encoded = stores
    group = zarr.open_group(encoded.location, mode="r")
    ranges = group["images_ranges"][:]
    for i, name in enumerate(encoded["path"].compute()):
        start, stop = ranges[i]
        stored = group["images"][start:stop].tobytes()
        assert stored == (image_folder / name).read_bytes(), name
        assert iio.imread(stored).shape[:2] == (32, 32)
    assert group["images"].dtype == np.uint8 and group["images"].chunks[0] * 5 == group["images"].shape[0]


def test_both_stores_pixels_and_files_and_info_shows_both_sizes(tmp_path):
    source = tmp_path / "photos"
    write_image_folder(source, 40, classes=("a", "b"), size=(64, 64), extension=".jpg", seed=4)
    ds = outcore.ingest_images(source, tmp_path / "both.zarr", shape=(64, 64, 3), images="both", progress=False)
    assert ds.fields[:2] == ("images", "images_encoded")
    assert ds.roles["images"] == "input" and ds.roles["images_encoded"] == "other"
    np.testing.assert_array_equal(ds["images_encoded"].compute(), ds["images"].compute())
    report = describe(ds)
    line = next(line for line in report.splitlines() if line.startswith("images_encoded"))
    assert "encoded images" in line and "80x64x64x3" in line
    decoded, on_disk = ds.array("images_encoded"), ds.array("images_encoded_ranges")
    files = sum(p.stat().st_size for p in source.rglob("*.jpg"))
    assert decoded.nbytes_stored() + on_disk.nbytes_stored() < 1.2 * files < ds.array("images").nbytes_stored()


def test_info_shows_the_samples_a_shard_file_of_an_encoded_field_holds(tmp_path):
    """An encoded field's shard column says how many samples each of its own shard files holds (those of its
    files' bytes), not those of its byte ranges' (a small field, in few large shards)."""
    source = tmp_path / "photos"
    write_image_folder(source, 40, classes=("a", "b"), size=(32, 32), extension=".jpg", seed=4)
    ds = outcore.ingest_images(source, tmp_path / "e.zarr", shape=(32, 32, 3), images="encoded", chunk_size=4,
                               progress=False)
    cells = next(line for line in describe(ds).splitlines() if line.startswith("images ")).split()
    chunk, shard = (int(cell) for cell in cells[cells.index("80x32x32x3") + 1 : cells.index("80x32x32x3") + 3])
    files = list((tmp_path / "e.zarr" / "images" / "c").iterdir())
    assert chunk == 4 and len(files) == 80 // shard > 1
    assert ds.array("images_ranges").shards[0] > shard


def test_large_files_are_decoded_reduced_to_the_store_shape(tmp_path):
    source = tmp_path / "big"
    write_image_folder(source, 6, classes=("a",), size=(256, 320), extension=".jpg", seed=5)
    options = {"shape": (48, 48, 3), "progress": False}
    pixels = outcore.ingest_images(source, tmp_path / "p.zarr", **options)
    encoded = outcore.ingest_images(source, tmp_path / "e.zarr", images="encoded", **options)
    np.testing.assert_array_equal(encoded["images"].compute(), pixels["images"].compute())


def test_zip_store_reads_and_verifies(stores, tmp_path, image_folder):
    pixels, _ = stores
    packed = outcore.ingest_images(image_folder, tmp_path / "encoded.zarr.zip", shape=SHAPE, images="encoded",
                                   chunk_size=4, progress=False)
    np.testing.assert_array_equal(packed["images"].compute(), pixels["images"].compute())
    assert outcore.verify(packed.location, progress=False).ok


def test_bad_bytes_name_the_sample_and_chunk(stores):
    _, encoded = stores
    group = zarr.open_group(encoded.location, mode="r+")
    start, stop = group["images_ranges"][9]
    group["images"][start + 2 : stop] = np.frombuffer(b"garbage!" * ((stop - start - 2) // 8 + 1), np.uint8)[
        : stop - start - 2]
    damaged = outcore.open_dataset(encoded.location)
    with pytest.raises(SampleDecodeError, match=r"field 'images', sample 9 \(chunk 2\) cannot be decoded.*verify"):
        list(damaged.batches(4, shuffle=False))
    report = outcore.verify(damaged.location, progress=False)
    assert not report.ok and len(report.problems) == 1 and "sample 9 (chunk 2)" in report.problems[0]
    with pytest.raises(SampleDecodeError, match="sample 9"):
        damaged["images"].compute()


def test_skipped_files_leave_a_compact_encoded_store(image_folder, tmp_path):
    (image_folder / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    ds = outcore.ingest_images(image_folder, tmp_path / "s.zarr", shape=SHAPE, images="encoded", chunk_size=4,
                               on_error="skip", progress=False)
    assert len(ds) == 20 and ds.attrs.skipped["count"] == 1
    group = zarr.open_group(ds.location, mode="r")
    for i, name in enumerate(ds["path"].compute()):
        start, stop = group["images_ranges"][i]
        assert group["images"][start:stop].tobytes() == (image_folder / name).read_bytes(), name
    assert outcore.verify(ds.location, progress=False).ok


def test_writer_refuses_to_append_to_an_encoded_store(stores):
    _, encoded = stores
    with pytest.raises(SourceError, match="encoded image or ragged field"):
        outcore.Writer(encoded.location, append=True)


def test_unknown_storage_choice_is_named(image_folder, tmp_path):
    with pytest.raises(ValueError, match="images='jpeg'"):
        outcore.ingest_images(image_folder, tmp_path / "x.zarr", shape=SHAPE, images="jpeg", progress=False)


def test_cli_ingests_encoded(image_folder, tmp_path, capsys):
    store = tmp_path / "cli.zarr"
    assert main(["ingest", str(image_folder), str(store), "--shape", "32x32x3", "--images", "encoded",
                 "--no-progress"]) == 0
    assert "uint8 (encoded images)" in capsys.readouterr().out
    assert main(["verify", str(store), "--no-progress"]) == 0


def test_bench_reads_encoded_fields_as_images_and_its_ceiling_uses_outcore_s_threads(stores):
    _, encoded = stores
    set_threads(3)
    try:
        rates = dict(compare(encoded, ["images", "labels"], batch_size=8, repeats=2))
    finally:
        set_threads(None)
    assert len(rates) == 3 and all(rate > 0 for rate in rates.values())
    assert "decompression ceiling (every chunk, 3 threads)" in rates


def test_encoded_store_reads_by_fsspec_url(stores):
    pixels, encoded = stores
    remote = outcore.open_dataset(Path(encoded.location).absolute().as_uri())
    np.testing.assert_array_equal(remote["images"].compute(), pixels["images"].compute())
    first = next(iter(remote.batches(8, shuffle=False)))
    np.testing.assert_array_equal(first["images"], pixels["images"][:8].compute())
