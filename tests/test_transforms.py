"""RandomResizedCrop and CenterCrop: torchvision's box rule, exact pixels, determinism, every dtype; RandomCrop and
RandomFlip: the pixels of padding and slicing each image."""

from __future__ import annotations

import dataclasses
import functools
import math
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from support.optional import need

import outcore
from outcore.imaging import center_crop_box, random_resized_crop_box, within
from outcore.iterate.batch import Recipe
from outcore.testing import write_image_folder
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
    Targets,
)

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


@settings(max_examples=300, deadline=None)
@given(height=st.integers(1, 600), width=st.integers(1, 600), seed=st.integers(0, 2**32 - 1))
def test_boxes_lie_inside_and_follow_scale_and_ratio_unless_they_fall_back(height, width, seed):
    top, left, box_height, box_width = random_resized_crop_box(height, width, SCALE, RATIO, np.random.default_rng(seed))
    assert 0 <= top and top + box_height <= height and 0 <= left and left + box_width <= width
    assert box_height > 0 and box_width > 0
    central = (top, left) == ((height - box_height) // 2, (width - box_width) // 2)
    if not central:  # a drawn box: its area and aspect within the ranges (up to the rounding to pixels)
        area = box_height * box_width / (height * width)
        assert SCALE[0] - 0.02 <= area <= SCALE[1] + 0.02 or min(box_height, box_width) < 20
        aspect = box_width / box_height
        assert RATIO[0] * 0.9 <= aspect <= RATIO[1] * 1.1 or min(box_height, box_width) < 20


@settings(max_examples=500, deadline=None)
@given(height=st.integers(100, 2000), width=st.integers(100, 2000), size=st.tuples(st.integers(1, 100), st.integers(1, 100)),
       more=st.integers(0, 60))
def test_central_boxes_after_a_resize_lie_within_the_picture(height, width, size, more):
    """Their edges are computed in floating point (511.00000000000006 of a 511-pixel side): a fused crop
    must take them for boxes inside the picture, not for `RandomCrop` windows past its edges."""
    box = center_crop_box(height, width, size, resize=max(size) + more)
    assert within(box, (height, width)), box
    assert -1e-9 < box[0] and box[0] + box[2] < height + 1e-9


@settings(max_examples=200, deadline=None)
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 12), st.integers(1, 12)), channels=st.sampled_from([(), (1,), (3,), (4,)]),
       dtype=st.sampled_from(["uint8", "uint16", "float32"]), padding=st.integers(0, 6), crop=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1))
def test_random_crop_is_a_window_of_the_zero_padded_image(shape, channels, dtype, padding, crop, seed):
    images = np.random.default_rng(seed).integers(1, 200, (*shape, *channels)).astype(dtype)
    height, width = min(crop, shape[1] + 2 * padding), min(crop + 1, shape[2] + 2 * padding)
    cropped = RandomCrop((height, width), padding=padding)({"images": images}, np.random.default_rng(seed))["images"]
    rng = np.random.default_rng(seed)  # the same draws, by the definition: pad, then cut
    padded = np.pad(images, [(0, 0), (padding, padding), (padding, padding)] + [(0, 0)] * len(channels))
    tops = rng.integers(0, padded.shape[1] - height + 1, size=len(images))
    lefts = rng.integers(0, padded.shape[2] - width + 1, size=len(images))
    expected = np.stack([padded[i, t : t + height, x : x + width] for i, (t, x) in enumerate(zip(tops, lefts))])
    assert cropped.dtype == images.dtype and cropped.flags.c_contiguous
    np.testing.assert_array_equal(cropped, expected)


@settings(max_examples=100, deadline=None)
@given(shape=st.tuples(st.integers(1, 6), st.integers(1, 9), st.integers(1, 9)), channels=st.sampled_from([(), (1,), (3,), (2, 2)]),
       horizontal=st.booleans(), vertical=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_flip_mirrors_exactly_the_images_it_draws(shape, channels, horizontal, vertical, seed):
    images = np.random.default_rng(seed).integers(0, 255, (*shape, *channels)).astype(np.uint8)
    flip = RandomFlip(horizontal=horizontal, vertical=vertical)
    flipped = flip({"images": images}, np.random.default_rng(seed))["images"]
    draws = flip.draw(len(images), np.random.default_rng(seed))
    expected = [images[i, ::-1 if top_bottom else 1, ::-1 if left_right else 1] for i, (left_right, top_bottom) in enumerate(draws)]
    np.testing.assert_array_equal(flipped, np.stack(expected))


def test_the_fallback_is_the_largest_central_box_within_the_ratio():
    rng = np.random.default_rng(0)
    assert random_resized_crop_box(100, 400, (0.95, 1.0), RATIO, rng) == (0, 133, 100, 133)  # too wide
    assert random_resized_crop_box(400, 100, (0.95, 1.0), RATIO, rng) == (133, 0, 133, 100)  # too tall
    assert random_resized_crop_box(300, 300, (2.0, 3.0), RATIO, rng) == (0, 0, 300, 300)     # never fits


def _torchvision_box_shape(height: int, width: int, draw: random.Random) -> tuple[int, int]:
    """torchvision's ``RandomResizedCrop.get_params``, as its source writes it, with Python's random."""
    area, log_ratio = height * width, (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target_area = area * draw.uniform(*SCALE)
        aspect = math.exp(draw.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))  # noqa: RUF046 - as torchvision writes it
        h = int(round(math.sqrt(target_area / aspect)))  # noqa: RUF046
        if 0 < w <= width and 0 < h <= height:
            return h, w
    return height, width


@pytest.mark.parametrize(("height", "width"), [(480, 640), (500, 333), (224, 224)])
def test_box_shapes_are_distributed_as_torchvision_draws_them(height, width):
    rng, draw = np.random.default_rng(1), random.Random(2)
    ours = np.array([random_resized_crop_box(height, width, SCALE, RATIO, rng)[2:] for _ in range(20000)])
    theirs = np.array([_torchvision_box_shape(height, width, draw) for _ in range(20000)])
    area = [s[:, 0] * s[:, 1] / (height * width) for s in (ours, theirs)]
    aspect = [np.log(s[:, 1] / s[:, 0]) for s in (ours, theirs)]
    assert abs(area[0].mean() - area[1].mean()) < 0.01 and abs(area[0].std() - area[1].std()) < 0.01
    assert abs(aspect[0].mean() - aspect[1].mean()) < 0.01 and abs(aspect[0].std() - aspect[1].std()) < 0.01


def test_random_resized_crop_is_the_box_resized_and_deterministic_per_rng():
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (6, 60, 80, 3), dtype=np.uint8)
    batch = {"images": images, "labels": np.arange(6)}
    out = RandomResizedCrop(32)(batch, np.random.default_rng(9))
    assert out["images"].shape == (6, 32, 32, 3) and out["labels"] is batch["labels"]
    replay = np.random.default_rng(9)
    for image, cropped in zip(images, out["images"], strict=True):
        top, left, height, width = random_resized_crop_box(60, 80, SCALE, RATIO, replay)
        expected = Image.fromarray(image).resize((32, 32), Image.Resampling.BILINEAR,
                                                 box=(left, top, left + width, top + height))
        np.testing.assert_array_equal(cropped, np.asarray(expected))
    np.testing.assert_array_equal(RandomResizedCrop(32)(batch, np.random.default_rng(9))["images"], out["images"])
    assert not np.array_equal(RandomResizedCrop(32)(batch, np.random.default_rng(10))["images"], out["images"])


@pytest.mark.parametrize(("dtype", "shape"), [(np.uint8, (4, 40, 40)), (np.uint8, (4, 40, 40, 1)),
                                              (np.uint8, (4, 40, 40, 4)), (np.uint16, (4, 40, 40, 3)),
                                              (np.float32, (4, 40, 40, 3))])
def test_random_resized_crop_keeps_dtype_and_channels(dtype, shape):
    images = np.full(shape, 200, dtype)
    out = RandomResizedCrop((16, 24))({"images": images}, np.random.default_rng(0))["images"]
    assert out.dtype == dtype and out.shape == (4, 16, 24, *shape[3:])
    np.testing.assert_allclose(out, 200)  # a flat picture stays flat whatever the box


def test_center_crop_is_torchvision_s_central_window():
    images = np.arange(2 * 7 * 9 * 1).reshape(2, 7, 9, 1)
    out = CenterCrop((4, 4))({"images": images}, np.random.default_rng(0))["images"]
    top, left, _, _ = center_crop_box(7, 9, (4, 4))
    assert (top, left) == (2, 2)  # round(1.5) and round(2.5) go to the even neighbour, as in torchvision
    np.testing.assert_array_equal(out, images[:, 2:6, 2:6])
    with pytest.raises(outcore.OptionError, match="cannot cut a central 8x8 box from a 7x9 picture"):
        CenterCrop(8)({"images": images}, np.random.default_rng(0))


def test_imagenet_style_pipelines_run_in_the_iterator(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (64, 48, 64, 3), dtype=np.uint8)
    ds = outcore.from_arrays({"images": images, "labels": np.arange(64) % 4}, tmp_path / "s.zarr", chunk_size=16,
                             progress=False)
    train = Compose([RandomResizedCrop(32), RandomFlip(), Normalize(0.5, 0.25)])
    first = [b["images"] for b in ds.batches(16, seed=1, transform=train)]
    again = [b["images"] for b in ds.batches(16, seed=1, transform=train)]
    assert all(a.shape == (16, 32, 32, 3) and a.dtype == np.float32 for a in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))  # per (seed, epoch, batch)
    validation = next(iter(ds.batches(16, shuffle=False, transform=CenterCrop(40))))["images"]
    np.testing.assert_array_equal(validation, ds["images"][:16].compute()[:, 4:44, 12:52])


@pytest.mark.parametrize("in_c", [True, False])
@pytest.mark.parametrize(("channels", "mean", "std"), [(3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                                                       (3, 0.5, 0.25), (3, 0.5, (0.2, 0.3, 0.4)), (1, 0.1, 0.3),
                                                       (4, (0.1, 0.2, 0.3, 0.4), 0.5), (2, (0.3, 0.6), (0.1, 0.2))])
def test_normalize_gives_uint8_pictures_the_floats_of_its_arithmetic(in_c, channels, mean, std, monkeypatch):
    # a run's pixels through each channel's table of the 256 values' floats: in C (RGB, one column, any other count),
    # or numpy's, a channel at a time; the floats of (x * scale - mean) / std in float32, bit for bit
    from outcore.imaging import native

    if in_c and getattr(native.windows, "lookup", None) is None:
        pytest.skip(f"outcore's _windows extension is not in use here: {native.copies()}")
    if not in_c:
        monkeypatch.setattr(native, "windows", None)
    images = np.random.default_rng(channels).integers(0, 256, (70, 9, 11, channels), dtype=np.uint8)
    images[0, 0, 0] = 0
    images[0, 0, 1] = 255
    out = Normalize(mean, std)({"images": images}, None)["images"]
    expected = (images.astype(np.float32) * np.float32(1 / 255) - np.asarray(mean, np.float32)) / np.asarray(std,
                                                                                                           np.float32)
    assert out.dtype == np.float32 and out.shape == images.shape
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    cut = images[:, :, ::2]  # a view of every other column: numpy's lookup, the same floats
    again = Normalize(mean, std)({"images": cut}, None)["images"]
    np.testing.assert_array_equal(again.view(np.uint32), expected[:, :, ::2].view(np.uint32))


@pytest.mark.parametrize("in_c", [True, False])
def test_a_table_whose_columns_are_not_the_pictures_channels_is_refused(in_c, monkeypatch):
    # each column is a channel's: a table of 2 columns for RGB pixels would map them by the wrong column, silently
    from outcore.imaging import native, table_lookup

    if not in_c:
        monkeypatch.setattr(native, "windows", None)
    values, out = np.zeros((4, 2, 2, 3), np.uint8), np.empty((4, 2, 2, 3), np.float32)
    for table, wrong in ((np.zeros((256, 2)), out), (np.zeros((255, 3)), out), (np.zeros((256, 3)), out[:2])):
        with pytest.raises(ValueError, match=r"table_lookup: a table of \(256, 1\) or \(256, 3\)"):
            table_lookup(values, table, wrong)


def _without_c(monkeypatch) -> None:
    from outcore.imaging import native

    monkeypatch.setattr(native, "windows", None)


def _floats(count: int) -> np.ndarray:
    """float32 values across float16's range and past it, with its edge cases: ties, subnormals, infinities."""
    values = np.random.default_rng(3).standard_normal(count).astype(np.float32) * np.float32(3e3)
    edges = [np.inf, -np.inf, 65504.0, 65519.99, 65520.0, -65520.0, 1e-8, 6e-5, 5.96e-8, 2.98e-8, 2.9802326e-8, -0.0,
             1e-45, 1.00048828125, 1.00146484375, 2049.0, 2051.0]  # the ties round to even
    values[: len(edges)] = edges
    return values.reshape(-1, 4, 3)


@pytest.mark.parametrize("in_c", [True, False])
def test_to_half_rounds_as_numpy_does(in_c, monkeypatch):
    from outcore.imaging import to_half

    if not in_c:
        _without_c(monkeypatch)
    values = _floats(3000)
    out = np.empty(values.shape, np.float16)
    to_half(values, out)
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    nan = np.array([np.nan, -np.nan], np.float32)
    halves = np.empty(2, np.float16)
    to_half(nan, halves)
    assert np.isnan(halves).all()
    with pytest.raises(ValueError, match="to_half: float32 values and a float16 out of their shape"):
        to_half(values.astype(np.float64), out)


@pytest.mark.parametrize("in_c", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "float32", "int32", "int16", "uint16"])
def test_table_lookup_maps_through_tables_of_2_and_4_byte_items(in_c, dtype, monkeypatch):
    from outcore.imaging import table_lookup

    if not in_c:
        _without_c(monkeypatch)
    values = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    table = (np.arange(256)[:, None] * [1, -3, 7] + [0, 5, -9]).astype(dtype)
    out = np.empty(values.shape, dtype)
    table_lookup(values, table, out)
    expected = np.stack([table[values[..., c], c] for c in range(3)], axis=-1)
    np.testing.assert_array_equal(out, expected)
    table_lookup(values[:0], table, out[:0])  # no values: nothing done


@pytest.mark.parametrize("mean, std", [(0.5, 0.25), ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
def test_normalize_to_float16_rounds_the_float32_results(mean, std):
    images = np.random.default_rng(2).integers(0, 256, (6, 5, 4, 3), dtype=np.uint8)
    wide = Normalize(mean, std)({"images": images}, None)["images"]
    half = Normalize(mean, std, dtype="float16")({"images": images}, None)["images"]
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half.view(np.uint16), wide.astype(np.float16).view(np.uint16))
    floats = images.astype(np.float32) / 255  # another dtype: numpy's floats, rounded the same
    half = Normalize(mean, std, dtype="float16")({"images": floats}, None)["images"]
    wide = Normalize(mean, std)({"images": floats}, None)["images"]
    np.testing.assert_array_equal(half.view(np.uint16), wide.astype(np.float16).view(np.uint16))
    for wrong in ("int8", "floaty"):
        with pytest.raises(outcore.OptionError, match=rf"Normalize\(dtype='{wrong}'\): float32 or float16"):
            Normalize(dtype=wrong)


def test_normalize_then_a_cast_to_a_float_is_made_one_normalize_where_the_values_are_the_same():
    from outcore.iterate.batch import _split_tail

    images = np.random.default_rng(8).integers(0, 256, (300, 5, 4, 3), dtype=np.uint8)
    for tail, dtype in (([Normalize(0.4, 0.3), Cast("float16")], "float16"),
                        ([Normalize(0.4, 0.3), Cast("float32")], "float32"),
                        ([Normalize(0.4, 0.3, dtype="float16"), Cast("float16")], "float16")):
        made = _split_tail(Compose([RandomFlip(), *tail]))[1]
        assert made == Normalize(0.4, 0.3, dtype=dtype)
        steps = Compose(tail)({"images": images}, None)["images"]
        once = made({"images": images}, None)["images"]
        assert once.dtype == steps.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(once.view(f"u{once.itemsize}"), steps.view(f"u{steps.itemsize}"))
    for tail in ([Normalize(0.4, 0.3, dtype="float16"), Cast("float32")], [Normalize(0.4, 0.3), Cast("float16", "x")],
                 [Normalize(0.4, 0.3), Cast("int8")]):  # widened, another field's, not a float: left as they are
        assert _split_tail(Compose([RandomFlip(), *tail]))[1] == Compose(tail)


@pytest.mark.parametrize("in_c", [True, False])
@pytest.mark.parametrize("source, target", [("uint8", "float16"), ("uint8", "float32"), ("uint8", "int16"),
                                            ("float32", "float16"), ("float32", "uint8"), ("int64", "int32"),
                                            ("uint8", "uint8"), ("float64", "float32")])
def test_cast_gives_what_astype_gives(in_c, source, target, monkeypatch):
    if not in_c:
        _without_c(monkeypatch)
    outcore.set_threads(2)  # a batch of 600 pictures is cut into runs for the pool's threads
    try:
        rng = np.random.default_rng(4)
        if np.dtype(source).kind == "f":
            values = _floats(600 * 36).reshape(600, 4, 3, 3).astype(source)
        else:
            values = rng.integers(np.iinfo(source).min, np.iinfo(source).max, (600, 4, 3, 3), dtype=source,
                                  endpoint=True)
        with np.errstate(over="ignore", invalid="ignore"):
            expected = values.astype(target)
            out = Cast(target)({"images": values, "labels": np.arange(600)}, None)
    finally:
        outcore.set_threads(None)
    assert out["images"].dtype == np.dtype(target) and out["labels"] is not None
    np.testing.assert_array_equal(out["images"].view(f"u{np.dtype(target).itemsize}"),
                                  expected.view(f"u{np.dtype(target).itemsize}"))
    assert Cast("U3", field="names")({"names": np.array(["a", "bcde"])}, None)["names"].tolist() == ["a", "bcd"]


def _adjusted(images: np.ndarray, factors: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """BrightnessContrast's documented uint8 result, one picture at a time: float32 operations from the left, the mean
    exact."""
    out = np.empty_like(images)
    for i, image in enumerate(images):
        mean = np.float32(int(image.astype(np.int64).sum()) / image.size)
        values = image.astype(np.float32)
        out[i] = np.clip(((values - mean) * factors[i] + mean) + shifts[i], 0, 255).astype(np.uint8)
    return out


@pytest.mark.parametrize("in_c", [True, False])
@pytest.mark.parametrize("shape", [(40, 9, 7, 3), (3, 5, 5), (2, 1, 1, 1), (0, 4, 4, 3)])
def test_brightness_contrast_of_uint8_pictures_is_the_formula_in_c_and_numpy(in_c, shape, monkeypatch):
    from outcore.imaging import brightness_contrast

    if not in_c:
        _without_c(monkeypatch)
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, shape, dtype=np.uint8)
    factors = rng.uniform(0, 3, shape[0]).astype(np.float32)  # past both ends of the range: clipped
    shifts = rng.uniform(-1, 1, shape[0]).astype(np.float32) * 255
    out = np.empty_like(images)
    brightness_contrast(images, factors, shifts, out)
    np.testing.assert_array_equal(out, _adjusted(images, factors, shifts))
    with pytest.raises(ValueError, match="brightness_contrast: uint8 images"):
        brightness_contrast(images, factors[:-1] if len(factors) else np.zeros(1, np.float32), shifts, out)


def test_brightness_contrast_draws_as_before_and_runs_on_the_pool():
    images = np.random.default_rng(6).integers(0, 256, (700, 6, 6, 3), dtype=np.uint8)
    outcore.set_threads(2)
    try:
        out = BrightnessContrast(0.3, 0.4)({"images": images}, np.random.default_rng(7))["images"]
    finally:
        outcore.set_threads(None)
    rng = np.random.default_rng(7)  # each picture's factor, then each one's shift: the draws of earlier versions
    factors = rng.uniform(0.6, 1.4, size=(700, 1, 1, 1)).astype(np.float32).reshape(-1)
    shifts = rng.uniform(-0.3, 0.3, size=(700, 1, 1, 1)).astype(np.float32).reshape(-1) * 255.0
    np.testing.assert_array_equal(out, _adjusted(images, factors, shifts))
    assert BrightnessContrast()({"images": np.zeros((2, 3, 3), np.float64)}, rng)["images"].dtype == np.float32
    assert CenterCrop(2).boxes(np.empty((0, 2), np.int64), None).shape == (0, 4)
    floats = images.astype(np.float32) / 255
    got = BrightnessContrast(0.3, 0.4)({"images": floats}, np.random.default_rng(7))["images"]
    mean = floats.mean(axis=(1, 2, 3), keepdims=True, dtype=np.float64).astype(np.float32)
    expected = np.clip((floats - mean) * factors[:, None, None, None] + mean + shifts[:, None, None, None] / 255, 0, 1)
    np.testing.assert_array_equal(got, expected)


def test_a_transform_of_a_field_the_batches_leave_out_is_refused_when_the_loader_is_made(tmp_path):
    need("torch")
    ds = outcore.from_arrays({"images": np.zeros((16, 8, 8, 3), np.uint8), "labels": np.arange(16)},
                             tmp_path / "s.zarr", progress=False)
    train = Compose([RandomFlip(), Normalize(0.5, 0.25)])
    said = (r"the transform RandomFlip\(.*field='images'.*\) works on field 'images', which the batches do not hold "
            r"\(they hold \['labels'\]\): add 'images' to fields=")
    for make in (lambda: ds.batches(4, fields=["labels"], transform=train),
                 lambda: ds.torch(4, fields=["labels"], transform=train, num_workers=2)):  # not in a worker, later
        with pytest.raises(outcore.OptionError, match=said):
            make()
    assert len(next(iter(ds.batches(4, fields=["labels"], transform=Normalize(0, 1, field="labels"))))["labels"]) == 4


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """JPEGs (and PNGs) of several sizes, stored as pixels (``images``) and as files (``images_encoded``)."""
    root = tmp_path_factory.mktemp("fused")
    for extension, sizes in ((".jpg", ((60, 80), (90, 50), (48, 48))), (".png", ((70, 64),))):
        for k, size in enumerate(sizes):
            write_image_folder(root / "src", 8, classes=(f"c{extension[1:]}{k}",), size=size, kind="photos",
                               extension=extension, seed=k)
    return outcore.ingest_images(root / "src", root / "both.zarr", shape=(48, 48, 3), images="both", chunk_size=8,
                                 progress=False)


def _epoch(ds, field, transform):
    return [b[field] for b in ds.batches(8, fields=[field, "path"], seed=3, transform=transform)]


@pytest.mark.parametrize("crop", [RandomResizedCrop(32), RandomResizedCrop((24, 40), scale=(0.5, 1.0)),
                                  CenterCrop(40)])
def test_a_crop_opening_the_transform_is_done_while_decoding_with_the_same_boxes(both, crop):
    fused = _epoch(both, "images_encoded", dataclasses.replace(crop, field="images_encoded"))
    unfused = _epoch(both, "images", crop)  # the pixel field: decoded at ingest, then the box resized
    assert [f.shape for f in fused] == [u.shape for u in unfused]
    difference = np.abs(np.concatenate(fused).astype(int) - np.concatenate(unfused).astype(int))
    assert difference.mean() < 3 and np.percentile(difference, 99) < 40  # one resize from the file vs two


def test_the_rest_of_the_transform_follows_the_fused_crop(both):
    crop = RandomResizedCrop(32, field="images_encoded")
    alone = _epoch(both, "images_encoded", crop)
    flipped = _epoch(both, "images_encoded", Compose([crop, RandomFlip(p=1.0, field="images_encoded")]))
    for a, f in zip(alone, flipped, strict=True):
        np.testing.assert_array_equal(f, a[:, :, ::-1])
    again = _epoch(both, "images_encoded", Compose([crop, RandomFlip(p=1.0, field="images_encoded")]))
    assert all(np.array_equal(a, b) for a, b in zip(flipped, again, strict=True))


@pytest.mark.parametrize("flip", [None, RandomFlip(vertical=True)])
def test_pictures_the_fused_path_cannot_read_are_cropped_after_decoding_exactly(both, flip):
    """With a flip after the crop, mirrored while decoding: the same draws, the same pictures."""
    crop = RandomResizedCrop(32)

    def pipeline(field):
        steps = [dataclasses.replace(step, field=field) for step in (crop, flip) if step is not None]
        return Compose(steps) if len(steps) > 1 else steps[0]

    fused = both.batches(8, fields=["images_encoded", "path"], seed=3, transform=pipeline("images_encoded"))
    unfused = both.batches(8, fields=["images", "path"], seed=3, transform=pipeline("images"))
    for f, u in zip(fused, unfused, strict=True):
        png = np.char.endswith(f["path"], ".png")
        np.testing.assert_array_equal(f["images_encoded"][png], u["images"][png])  # PNGs: decode, then resize


def test_random_access_gives_the_fused_batches_of_the_iteration(both):
    transform = Compose([RandomResizedCrop(32, field="images_encoded"), RandomFlip(field="images_encoded")])
    it = both.batches(8, fields=["images_encoded"], seed=3, transform=transform)
    iterated = [b["images_encoded"] for b in it]
    it.set_epoch(0)  # a full pass moved it to the next epoch
    for index in (0, 3, len(iterated) - 1):
        np.testing.assert_array_equal(it.batch(index)["images_encoded"], iterated[index])


@pytest.mark.parametrize("flip", [None, RandomFlip(p=1.0)])
def test_a_centre_crop_of_files_of_the_store_shape_is_their_stored_pixels_exactly(both, flip):
    """48x48 JPEGs in a 48x48 store: the box is cut from the file's decoded pixels as they are, no resize."""

    def pipeline(field):
        crop = CenterCrop(40, field=field)
        return crop if flip is None else Compose([crop, dataclasses.replace(flip, field=field)])

    fused = both.batches(8, fields=["images_encoded", "path"], seed=3, transform=pipeline("images_encoded"))
    unfused = both.batches(8, fields=["images", "path"], seed=3, transform=pipeline("images"))
    compared = 0
    for f, u in zip(fused, unfused, strict=True):
        same_size = np.char.startswith(f["path"], "cjpg2/")
        np.testing.assert_array_equal(f["images_encoded"][same_size], u["images"][same_size])
        compared += int(same_size.sum())
    assert compared == 8


@pytest.mark.parametrize(("padding", "flip"), [(0, None), (0, RandomFlip(p=1.0)), (5, RandomFlip(vertical=True))])
def test_a_random_crop_is_cut_while_decoding_with_the_windows_of_the_pixel_store(both, padding, flip):
    """The same windows as on the stored pixels: exactly their pixels for files of the store's shape and
    PNGs, within a resize's difference for files decoded to it at a DCT scale."""

    def pipeline(field):
        crop = RandomCrop(40, padding=padding, field=field)
        return crop if flip is None else Compose([crop, dataclasses.replace(flip, field=field)])

    assert Recipe.of(["images_encoded"], (), {"images_encoded"}, pipeline("images_encoded")).crop == RandomCrop(
        40, padding=padding, field="images_encoded")
    fused = both.batches(8, fields=["images_encoded", "path"], seed=3, transform=pipeline("images_encoded"))
    unfused = both.batches(8, fields=["images", "path"], seed=3, transform=pipeline("images"))
    compared = 0
    for f, u in zip(fused, unfused, strict=True):
        exact = np.char.startswith(f["path"], "cjpg2/") | np.char.endswith(f["path"], ".png")
        np.testing.assert_array_equal(f["images_encoded"][exact], u["images"][exact])
        difference = np.abs(f["images_encoded"][~exact].astype(int) - u["images"][~exact].astype(int))
        assert difference.mean() < 3
        compared += int(exact.sum())
    assert compared == 16


@pytest.mark.parametrize(("crop", "flip"), [(RandomCrop(40, padding=3), None),
                                          (RandomCrop(40), RandomFlip(p=0.3, vertical=True)),
                                          (RandomCrop(40, padding=2), RandomFlip()),
                                          (RandomResizedCrop(32, scale=(0.3, 1.0)), RandomFlip()),
                                          (RandomResizedCrop((24, 40)), None),
                                          (ScaleJitter(40, scale=(0.3, 1.6)), RandomFlip()),
                                          (ScaleJitter((24, 40)), None)])
def test_a_batch_s_crops_and_flips_drawn_at_once_are_those_drawn_piece_by_piece(both, monkeypatch, crop, flip):
    """Where nothing after the crop and flip draws, `RandomCrop.boxes_of_pieces` (`RandomResizedCrop`'s,
    `ScaleJitter`'s) draws the boxes and mirrors of all a batch's pieces in one call (where the C extension is built):
    the batches are those of each piece's generator drawing them in turn, from a pixel field and while decoding an
    encoded one."""
    from outcore import seeds

    drawn_at_once = []
    kind = type(crop)
    original = kind.boxes_of_pieces

    def watched(self, *arguments):
        drawn = original(self, *arguments)
        drawn_at_once.append(drawn is not None)
        return drawn

    for field in ("images", "images_encoded"):
        moved = dataclasses.replace(crop, field=field)
        transform = moved if flip is None else Compose([moved, dataclasses.replace(flip, field=field)])
        monkeypatch.setattr(kind, "boxes_of_pieces", watched)
        at_once = _epoch(both, field, transform)
        monkeypatch.setattr(kind, "boxes_of_pieces", lambda self, *arguments: None)
        for a, b in zip(at_once, _epoch(both, field, transform), strict=True):
            np.testing.assert_array_equal(a, b)
    built = getattr(seeds._draws, "crops_and_flips", None) is not None
    assert drawn_at_once and all(drawn == built for drawn in drawn_at_once)


@pytest.fixture(scope="module", params=[((30, 30, 4), "uint8"), ((30, 30), "uint16")], ids=["rgba", "grey16"])
def translucent(tmp_path_factory, request):
    """PNGs of random RGBA (four channels kept), or 16-bit greyscale, stored as pixels and as files."""
    shape, dtype = request.param
    root = tmp_path_factory.mktemp("png")
    rng = np.random.default_rng(0)
    (root / "src" / "a").mkdir(parents=True)
    for i in range(12):
        Image.fromarray(rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype)).save(root / "src" / "a" / f"{i}.png")
    return outcore.ingest_images(root / "src", root / "both.zarr", shape=shape, dtype=dtype, images="both",
                                 chunk_size=4, progress=False)


@pytest.mark.parametrize("crop", [CenterCrop(20), RandomCrop(24, padding=3)])
def test_plain_crops_of_translucent_pictures_keep_their_colours(translucent, crop):
    """A box at its own size is the pixels as they are, for every kind of picture: Pillow's resize
    premultiplies alpha, which moved the colour of translucent pixels by up to 247 in a fused plain crop."""

    def pipeline(field):
        return Compose([dataclasses.replace(crop, field=field), RandomFlip(field=field)])

    fused = [b["images_encoded"] for b in translucent.batches(4, fields=["images_encoded"], seed=1,
                                                              transform=pipeline("images_encoded"))]
    unfused = [b["images"] for b in translucent.batches(4, fields=["images"], seed=1, transform=pipeline("images"))]
    assert fused[0].shape[1:3] == crop.output_size and fused[0].dtype == translucent["images"].dtype
    for f, u in zip(fused, unfused, strict=True):
        np.testing.assert_array_equal(f, u)


def _copied(batch, rng):
    """A user's step that draws (a label shift) and returns new arrays."""
    return {**batch, "images": batch["images"].copy(), "labels": batch["labels"] + int(rng.integers(0, 5))}


def _as_it_is(batch, rng):
    """A user's step that returns the batch it was given (views of the batch's arrays)."""
    return batch


def _smaller(batch, rng):
    """A user's step that cuts each piece's pictures to a size of its own: pieces no longer alike."""
    rows = int(rng.integers(40, 48))
    return {**batch, "images": np.ascontiguousarray(batch["images"][:, :rows])}


def _fewer(batch, rng):
    """A user's step that drops a piece's last sample."""
    return {name: values[: max(1, len(values) - 1)] for name, values in batch.items()}


@pytest.mark.parametrize("user", [_copied, _as_it_is, _smaller, _fewer])
@pytest.mark.parametrize("after", [
    [RandomCrop(40, padding=3), RandomFlip(vertical=True)],
    [RandomResizedCrop(32), RandomFlip()],
    [CenterCrop(30, resize=40), RandomFlip(), BrightnessContrast()],
    [CenterCrop(30)],
    [ScaleJitter(40, scale=(0.3, 1.6)), RandomFlip(), BrightnessContrast()],
    [RandomFlip(p=0.7), RandomResizedCrop((24, 40))],
    [RandomCrop(40), _as_it_is, RandomResizedCrop(24), RandomFlip()],
], ids=["crop+flip", "rrc+flip", "center-resize+flip+bc", "center", "jitter+flip+bc", "flip+rrc", "crop+user+rrc"])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_outcore_steps_after_a_users_step_cut_the_joined_pieces_as_each_piece_alone(user, after, dtype, monkeypatch):
    """After a user's step, outcore's crops, flips and `BrightnessContrast` draw each piece's numbers from its
    generator and apply them to the joined pieces at once (one crop call a batch): the batch is the one each piece
    transformed alone makes, joined; pieces a user's step leaves unlike go on piece by piece."""
    from outcore.iterate import batch as batches

    rng = np.random.default_rng(5)
    batch = {"images": rng.integers(0, 256, (20, 48, 48, 3)).astype(dtype), "labels": np.arange(20)}
    bounds = [0, 7, 8, 15, 20]
    keys = [(3, 1, 4, k) for k in range(4)]
    transform = Compose([user, *after])

    def generators():
        return [batches.transform_generator(key) for key in keys]

    expected = batches.join([transform(batches.piece(batch, low, high), rng) for low, high, rng in
                             zip(bounds[:-1], bounds[1:], generators(), strict=True)])
    calls = []
    for kind in {type(step) for step in after if hasattr(step, "cut_boxes")} | {batches.WholePictures}:
        monkeypatch.setattr(kind, "cut_boxes", lambda self, *arguments, cut=kind.cut_boxes: calls.append(1)
                            or cut(self, *arguments))
    got = batches._transformed(batch, transform, bounds, generators(), (), batches.plain)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    if user is _as_it_is:  # the pieces left as they were: their batch's arrays taken as they are, not joined again
        assert got["labels"] is batch["labels"]
    each, at_once = batches._split_joined(transform)
    crops = sum(hasattr(type(step), "cut_boxes") for step in batches.steps(each))  # cut piece by piece
    if user is _smaller and not crops:  # pieces of several sizes: each cut alone
        assert len(calls) == 4 * (crops + sum(hasattr(type(step), "cut_boxes") for step in at_once))
    else:  # the joined pieces cut once by each crop and its flip, or flip alone
        assert len(calls) == 4 * crops + sum(not hasattr(step, "sample_draws") for step, _ in batches._units(at_once))


@pytest.mark.parametrize("after", [
    [ScaleJitter(40, scale=(0.3, 1.6)), RandomFlip()],
    [RandomResizedCrop(32), RandomFlip(vertical=True)],
    [RandomCrop(40, padding=5)],
    [BrightnessContrast(), RandomFlip(), CenterCrop(30, resize=40)],
], ids=["jitter+flip", "rrc+flip", "padded-crop", "bc+flip+center"])
@pytest.mark.parametrize("user", [_copied, _as_it_is])
def test_targets_after_a_users_step_move_on_the_joined_pieces_as_on_each_piece(after, user):
    """Label maps, paired pictures and boxes (rows of each picture's instances, its offsets) moved by the crops and
    flips after a user's step, applied to the joined pieces: the batch each piece moved alone makes, joined."""
    from outcore.iterate import batch as batches

    rng = np.random.default_rng(8)
    counts = rng.integers(0, 4, 20)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    corners = rng.uniform(0, 30, (offsets[-1], 2))
    batch = {"images": rng.integers(0, 256, (20, 48, 48, 3), dtype=np.uint8), "labels": np.arange(20),
             "masks": rng.integers(0, 5, (20, 48, 48), dtype=np.uint8),
             "depth": rng.integers(0, 256, (20, 48, 48, 1), dtype=np.uint8),
             "boxes": np.concatenate([corners, corners + rng.uniform(2, 18, corners.shape)], axis=1),
             "boxes_offsets": offsets, "box_labels": rng.integers(0, 9, offsets[-1]), "box_labels_offsets": offsets}
    targets = Targets(label_maps=("masks",), pictures=("depth",), boxes="boxes", instances=("box_labels",))
    steps = [dataclasses.replace(step, targets=targets) if hasattr(step, "targets") else step for step in after]
    transform = Compose([user, *steps])
    bounds, keys = [0, 6, 13, 20], [(2, 0, 5, k) for k in range(3)]
    generators = [batches.transform_generator(key) for key in keys]
    ragged = ("boxes", "box_labels")
    expected = batches.join([transform(batches.piece(batch, low, high, ragged), rng) for low, high, rng in
                             zip(bounds[:-1], bounds[1:], generators, strict=True)], ragged_fields=ragged)
    generators = [batches.transform_generator(key) for key in keys]
    got = batches._transformed(batch, transform, bounds, generators, ragged, batches.plain)
    assert batches._split_joined(transform)[0] is user and got.keys() == expected.keys() >= {"boxes_kept"}
    for name in expected:  # the boxes moved by a crop and its flip at once: rounded once, not twice (float32)
        compare = np.testing.assert_array_equal if name != "boxes" else functools.partial(
            np.testing.assert_allclose, rtol=0, atol=1e-5)
        compare(got[name], expected[name], err_msg=name)


def _noisy(batch, rng):
    """A user's step that draws from the piece's generator and makes new pictures."""
    return {**batch, "images": batch["images"] + rng.integers(0, 3, batch["images"].shape, dtype=np.uint8)}


@pytest.mark.parametrize("threads", [1, 3])
def test_an_epoch_with_steps_after_a_users_step_is_the_one_made_piece_by_piece(both, monkeypatch, threads):
    """Through `ds.batches`: the steps after a user's step applied to the joined pieces give the epoch they give
    applied to each piece (`on_joined` off), batch by batch, with several pieces a batch."""
    from outcore.iterate import batch as batches

    transform = Compose([_noisy, RandomResizedCrop(32, scale=(0.3, 1.0)), RandomFlip(), BrightnessContrast()])
    pieces = []
    original = batches._one_batch
    monkeypatch.setattr(batches, "_one_batch", lambda parts, *rest: pieces.append(len(parts)) or original(parts, *rest))
    outcore.set_threads(threads)
    try:
        joined = [b for b in both.batches(8, fields=["images", "labels"], seed=2, transform=transform)]
        monkeypatch.setattr(batches, "on_joined", lambda step: False)
        alone = [b for b in both.batches(8, fields=["images", "labels"], seed=2, transform=transform)]
    finally:
        outcore.set_threads(None)
    assert len(joined) == len(alone) == 4 and max(pieces) > 1
    for a, b in zip(joined, alone, strict=True):
        for name in ("images", "labels"):
            np.testing.assert_array_equal(a[name], b[name])


def test_a_picture_too_small_for_the_crop_is_named_in_whichever_piece_it_is(tmp_path):
    """Pictures at their own sizes, one too small for a `RandomCrop` that opens the transform: the error names that
    sample (its store, field, index and chunk), in any piece of the batch."""
    for i in range(12):
        size = (20, 30) if i == 9 else (50, 60)
        Image.fromarray(np.full((*size, 3), 10 * i, np.uint8)).save(tmp_path / f"{i:02d}.png")
    frame = pd.DataFrame({"path": [f"{i:02d}.png" for i in range(12)]})
    ds = outcore.ingest_dataframe(frame, tmp_path / "s.zarr", root=tmp_path, shape=None, images="encoded", chunk_size=4,
                                  shuffle_on_write=False, progress=False)
    with pytest.raises(outcore.OptionError, match=r"field 'images', sample 9 \(chunk 2\): RandomCrop cannot cut "
                                                  r"40x40 from an image of 20x30"):
        list(ds.batches(12, shuffle=False, transform=RandomCrop(40)))
