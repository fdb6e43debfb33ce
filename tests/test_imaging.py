"""Decoding a file to a sample (`outcore.imaging`): the pixels imageio gives, channels and bit depths made to
the shape asked for, resizing like Pillow, a wrong size naming the file."""

from __future__ import annotations

import io
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from outcore.errors import ImageError
from outcore.imaging import (
    decode_image,
    decoded_size,
    load_image,
    native,
    parse_image_dtype,
    parse_image_shape,
    parse_resize,
    plain_jpeg_sizes,
    resize_taps,
    stored_frame,
)
from outcore.imaging.decode import _reduced_size
from outcore.imaging.resize import resize_edges
from outcore.imaging.synthetic import sample_photo

U8 = np.dtype("uint8")


def _write(path: Path, pixels: np.ndarray, **kwargs) -> Path:
    iio.imwrite(path, pixels, **kwargs)
    return path


@pytest.mark.parametrize("extension", [".jpg", ".png"])
def test_rgb_pixels_equal_imageio_decode(tmp_path, rng, extension):
    path = _write(tmp_path / f"a{extension}", rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    expected = iio.imread(path)
    np.testing.assert_array_equal(load_image(str(path), (20, 30, 3), None, U8), expected)


def test_greyscale_is_replicated_to_rgb_and_kept_as_one_channel(tmp_path, rng):
    grey = rng.integers(0, 256, (10, 12), dtype=np.uint8)
    path = _write(tmp_path / "g.png", grey)
    np.testing.assert_array_equal(load_image(str(path), (10, 12, 3), None, U8), np.repeat(grey[..., None], 3, 2))
    np.testing.assert_array_equal(load_image(str(path), (10, 12, 1), None, U8), grey[..., None])
    np.testing.assert_array_equal(load_image(str(path), (10, 12), None, U8), grey)


def test_rgba_alpha_is_dropped_or_kept(tmp_path, rng):
    rgba = rng.integers(0, 256, (8, 9, 4), dtype=np.uint8)
    path = _write(tmp_path / "a.png", rgba)
    np.testing.assert_array_equal(load_image(str(path), (8, 9, 3), None, U8), rgba[..., :3])
    np.testing.assert_array_equal(load_image(str(path), (8, 9, 4), None, U8), rgba)


def test_sixteen_bit_greyscale_keeps_depth_or_scales_to_eight_bits(tmp_path):
    deep = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000).astype(np.uint16)
    path = _write(tmp_path / "d.png", deep)
    np.testing.assert_array_equal(load_image(str(path), (8, 8), None, np.dtype("uint16")), deep)
    expected = np.rint(deep.astype(np.float64) * 255 / 65535).astype(np.uint8)
    np.testing.assert_array_equal(load_image(str(path), (8, 8), None, U8), expected)


def test_eight_bit_to_sixteen_bit_spans_the_range(tmp_path):
    path = _write(tmp_path / "e.png", np.array([[0, 255]], dtype=np.uint8))
    np.testing.assert_array_equal(load_image(str(path), (1, 2), None, np.dtype("uint16")), [[0, 65535]])


def test_fit_resizes_to_the_exact_shape_like_pillow(tmp_path, rng):
    pixels = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    path = _write(tmp_path / "a.png", pixels)
    expected = np.asarray(Image.fromarray(pixels).resize((16, 32), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(load_image(str(path), (32, 16, 3), "fit", U8), expected)


def test_crop_keeps_the_centre_and_pad_keeps_everything(tmp_path):
    # a 20x40 image: left half black, middle white band, right half black
    pixels = np.zeros((20, 40, 3), dtype=np.uint8)
    pixels[:, 15:25] = 255
    path = _write(tmp_path / "band.png", pixels)
    cropped = load_image(str(path), (20, 20, 3), "crop", U8)  # no scaling needed: the centre 20 columns
    np.testing.assert_array_equal(cropped, pixels[:, 10:30])
    padded = load_image(str(path), (40, 40, 3), "pad", U8)  # fits as 20x40 with 10 rows of zeros above/below
    assert padded.shape == (40, 40, 3)
    assert not padded[:10].any() and not padded[30:].any()
    np.testing.assert_array_equal(padded[10:30], pixels)


def test_wrong_size_without_resize_names_the_file(tmp_path, rng):
    path = _write(tmp_path / "big.png", rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
    with pytest.raises(ImageError, match=r"big\.png.*40x60, expected 32x32.*resize="):
        load_image(str(path), (32, 32, 3), None, U8)


def test_truncated_jpeg_and_non_image_name_the_file(tmp_path, rng):
    good = _write(tmp_path / "good.jpg", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(good.read_bytes()[:300])
    text = tmp_path / "notes.jpg"
    text.write_text("not a picture")
    with pytest.raises(ImageError, match="truncated.jpg: cannot decode"):
        load_image(str(truncated), (64, 64, 3), None, U8)
    with pytest.raises(ImageError, match="notes.jpg: not an image"):
        load_image(str(text), (64, 64, 3), None, U8)
    with pytest.raises(ImageError, match="gone.jpg: file not found"):
        load_image(str(tmp_path / "gone.jpg"), (64, 64, 3), None, U8)


def test_exif_orientation_is_applied(tmp_path, rng):
    pixels = rng.integers(0, 256, (10, 20, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = tmp_path / "rotated.png"
    image.save(path, exif=exif)
    assert load_image(str(path), (20, 10, 3), None, U8).shape == (20, 10, 3)


def _kinds_of_file(folder: Path, pixels: np.ndarray) -> dict[str, bytes]:
    """``pixels`` (h, w, 3) as each kind of file a header or a decoder may read otherwise: plain 4:2:0, 4:1:1, grey
    and progressive JPEGs, one turned by its EXIF orientation (6), and a PNG."""
    image = Image.fromarray(pixels)
    image.save(folder / "progressive.jpg", progressive=True)
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(folder / "turned.jpg", exif=exif)
    return {"plain.jpg": simplejpeg.encode_jpeg(pixels, colorsubsampling="420"),
            "411.jpg": simplejpeg.encode_jpeg(pixels, colorsubsampling="411"),
            "grey.jpg": simplejpeg.encode_jpeg(pixels[..., :1].copy(), colorspace="GRAY"),
            "picture.png": _write(folder / "picture.png", pixels).read_bytes(),
            "progressive.jpg": (folder / "progressive.jpg").read_bytes(),
            "turned.jpg": (folder / "turned.jpg").read_bytes()}


def test_a_files_upright_size_and_orientation_are_read_from_its_header_as_pillow_reads_them(tmp_path, rng):
    """Plain JPEGs' headers are read by libjpeg-turbo (no Pillow parse holding the GIL), the others by Pillow: the
    same sizes and orientations either way, the same refusals."""
    files = _kinds_of_file(tmp_path, rng.integers(0, 256, (30, 50, 3), dtype=np.uint8))
    for name, data in files.items():
        with Image.open(io.BytesIO(data)) as opened:
            orientation = int(opened.getexif().get(0x0112, 1))
            width, height = opened.size
        upright = (width, height) if orientation in (5, 6, 7, 8) else (height, width)
        assert stored_frame(data, name) == (upright, orientation), name
    with pytest.raises(ImageError, match="plain.jpg: 50x30 is 1,500 pixels"):
        stored_frame(files["plain.jpg"], "plain.jpg", max_pixels=1000)
    with pytest.raises(ImageError, match="damaged.jpg: "):
        stored_frame(b"\xff\xd8\xff\xe0 not a header", "damaged.jpg")


def test_a_picture_kept_at_its_size_is_decoded_at_an_eighth_refusing_what_a_full_decode_refuses(tmp_path):
    """The ingest's survey decodes each plain JPEG at 1/8 of its size (`decoded_size`; a block of them in one call
    of the C extension, `plain_jpeg_sizes`): the sizes `decode_image` gives at full size, and, of a thousand
    damaged photos (cut short, bits flipped, runs zeroed), exactly the ones a full decode refuses are refused
    (left by the C extension, for `decoded_size` to say why); other files are left to it too, but a plain PNG (decoded
    whole in the same call, where the extension has zlib: tests/test_png.py), a greyscale JPEG asked in colour (its
    levels repeated) and a colour one asked in grey (decoded as RGB: checked alike)."""
    rng = np.random.default_rng(7)
    photo = sample_photo("astronaut")[:300, :400]
    files = {**_kinds_of_file(tmp_path, photo), "tiny.jpg": simplejpeg.encode_jpeg(photo[:5, :7].copy())}
    tried: dict[int, list[tuple[bytes, tuple[int, int] | None]]] = {1: [], 3: []}  # (file, its size or refused)
    for name, data in files.items():
        for channels in (1, 3):
            full = decode_image(data, (None, None, channels), None, U8, name).shape[:2]
            assert decoded_size(data, channels, U8, name) == full, (name, channels)
            plain = name.endswith(".jpg") and name != "turned.jpg"  # a colour one asked for as grey too
            plain |= name == "picture.png" and channels == 3 and bool(getattr(native.extension, "ZLIB", ""))  # RGB
            tried[channels].append((data, full if plain else None))  # the others: left to decoded_size
    refused = 0
    for trial in range(1000):
        name = ("plain.jpg", "progressive.jpg", "grey.jpg")[trial % 3]
        damaged = bytearray(files[name])
        start = int(rng.integers(300, len(damaged) - 60))
        if trial % 4 == 0:
            damaged = damaged[:start]
        elif trial % 4 == 1:
            damaged[start] ^= 1 << int(rng.integers(0, 8))
        else:
            zeros = int(rng.integers(1, 50))
            damaged[start : start + zeros] = bytes(zeros)
        channels = 1 if name == "grey.jpg" else 3
        try:
            full = decode_image(bytes(damaged), (None, None, channels), None, U8, name).shape[:2]
        except ImageError:
            with pytest.raises(ImageError, match=f"^{name}: "):
                decoded_size(bytes(damaged), channels, U8, name)
            refused += 1
            tried[channels].append((bytes(damaged), None))
            continue
        assert decoded_size(bytes(damaged), channels, U8, name) == full, trial
        tried[channels].append((bytes(damaged), full))
    assert 200 < refused < 800
    for channels, cases in tried.items():
        sizes, left = plain_jpeg_sizes([data for data, _ in cases], channels)
        taken = {k for k, (_, full) in enumerate(cases) if full is not None} if native.extension else set()
        assert set(range(len(cases))) - set(left) == taken, channels
        assert all(tuple(sizes[k]) == cases[k][1] for k in taken)
    for max_side, left in ((400, [] if native.extension else [0]), (399, [0])):  # past max_side: left to shrink
        assert list(plain_jpeg_sizes([files["plain.jpg"]], 3, max_side=max_side)[1]) == left


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (parse_image_shape, "128x128x2", "2 channels"),
        (parse_image_shape, "12by12", "HxW"),
        (parse_image_shape, (0, 5), "positive"),
        (parse_resize, "stretch", "resize='stretch'"),
        (parse_image_dtype, "float32", "uint8 or uint16"),
    ],
)
def test_bad_options_are_named(parse, value, message):
    with pytest.raises(ValueError, match=message):
        parse(value)


def test_shape_strings_parse():
    assert parse_image_shape("64x32") == (64, 32)
    assert parse_image_shape([8, 8, 1]) == (8, 8, 1)


def _smooth(height: int, width: int) -> np.ndarray:
    """A smooth colour picture: JPEG keeps it well, so resized decodes can be compared closely."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (height + width)], -1).astype(np.uint8)


def test_libjpeg_turbo_path_gives_pillows_pixels(tmp_path):
    path = _write(tmp_path / "a.jpg", _smooth(48, 64), quality=90)
    expected = np.asarray(Image.open(path).convert("RGB"))
    np.testing.assert_array_equal(decode_image(path.read_bytes(), (48, 64, 3), None, U8), expected)
    assert np.array_equal(load_image(str(path), (48, 64, 3), None, U8), expected)


@pytest.mark.parametrize(("shape", "channels"), [((64, 64, 3), 3), ((64, 64, 3), 1), ((32, 48, 1), 1)])
def test_large_jpegs_are_decoded_reduced_and_stay_close_to_a_full_decode(tmp_path, shape, channels):
    # colour → RGB goes through libjpeg-turbo; greyscale → RGB and grey → grey through Pillow's draft mode
    source = _smooth(512, 768) if channels == 3 else _smooth(512, 768)[..., 0]
    path = _write(tmp_path / "big.jpg", source, quality=95)
    full = np.asarray(Image.open(path).convert("RGB" if shape[-1] == 3 else "L"))
    scale = max(shape[0] / 512, shape[1] / 768)
    resized = np.asarray(Image.fromarray(full).resize((round(768 * scale), round(512 * scale)),
                                                     Image.Resampling.BILINEAR))
    top, left = (resized.shape[0] - shape[0]) // 2, (resized.shape[1] - shape[1]) // 2
    expected = resized[top : top + shape[0], left : left + shape[1]].reshape(shape)
    decoded = decode_image(path.read_bytes(), shape, "crop", U8)
    assert decoded.shape == shape
    assert np.abs(decoded.astype(int) - expected).mean() < 2.0


@pytest.mark.parametrize(
    ("size", "target", "resize", "orientation", "reduced"),
    [
        ((512, 768), (64, 64), "crop", 1, (64, 96)),
        ((512, 768), (64, 64), "pad", 1, (43, 64)),
        ((512, 768), (64, 64), "fit", 1, (64, 64)),
        ((512, 768), (64, 64), None, 1, (512, 768)),
        ((768, 512), (32, 64), "crop", 6, (64, 43)),  # stored sideways: the target turns with it
    ],
)
def test_reduced_size_is_what_the_resize_policy_needs(size, target, resize, orientation, reduced):
    assert _reduced_size(size, target, resize, orientation) == reduced


def test_exif_rotated_jpeg_is_upright(tmp_path):
    pixels = _smooth(32, 48)
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6
    path = tmp_path / "rotated.jpg"
    image.save(path, exif=exif, quality=95)
    upright = decode_image(path.read_bytes(), (48, 32, 3), None, U8)
    assert np.abs(upright.astype(int) - np.rot90(pixels, -1)).mean() < 3.0


@pytest.mark.parametrize("shape", [(48, 64, 3), (24, 32, 3), (48, 64)])
def test_decoding_into_an_array_gives_the_same_pixels(tmp_path, shape):
    data = _write(tmp_path / "a.jpg", _smooth(48, 64), quality=90).read_bytes()
    out = np.full(shape, 7, dtype=np.uint8)
    assert decode_image(data, shape, "crop", U8, out=out) is out
    np.testing.assert_array_equal(out, decode_image(data, shape, "crop", U8))


def test_resize_taps_give_outcore_s_resize_to_the_byte():
    """The taps as two matrix products (columns, then rows, rounded half up between), for boxes of whole and of
    sub-pixel edges, shrinking and enlarging: `resize_edges`' pixels, those of the C extension or of Pillow."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        height, width = rng.integers(8, 200, size=2)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        top, left = rng.uniform(0, height - 2), rng.uniform(0, width - 2)
        box = [top, left, rng.uniform(1, height - top), rng.uniform(1, width - left)]
        if trial % 3 == 0:
            box = [float(max(1, int(edge))) if i >= 2 else float(int(edge)) for i, edge in enumerate(box)]
        size = tuple(int(side) for side in rng.integers(1, 120, size=2))
        expected = resize_edges(pixels, (box[0], box[1], box[0] + box[2], box[1] + box[3]), size)
        y0, rows, *down = (taps[0] for taps in resize_taps([box[0]], [box[0] + box[2]], [height], size[0]))
        x0, columns, *across = (taps[0] for taps in resize_taps([box[1]], [box[1] + box[3]], [width], size[1]))
        region = pixels[y0 : y0 + rows, x0 : x0 + columns].astype(np.float64)
        resized = _tapped(region.transpose(0, 2, 1), *across).transpose(0, 2, 1)  # columns first
        resized = _tapped(resized.transpose(1, 2, 0), *down).transpose(2, 0, 1)
        np.testing.assert_array_equal(resized.astype(np.uint8), expected, err_msg=f"box {box} to {size}")
        assert rows <= height - y0 and columns <= width - x0


def test_resize_taps_of_many_regions_at_once_are_each_region_s():
    """Regions of many widths resized to one size together: each region's first pixel, span and weighted taps are
    those it has alone (the others' wider filters only add taps of weight 0)."""
    rng = np.random.default_rng(1)
    starts = rng.uniform(0, 100, 60)
    ends = starts + np.concatenate([rng.uniform(1, 40, 30), rng.uniform(40, 400, 30)])  # enlarged and shrunk
    limits = np.ceil(ends).astype(np.int64) + rng.integers(0, 4, 60)
    first, span, columns, weights = resize_taps(starts, ends, limits, 37)
    for k in range(60):
        alone = resize_taps(starts[k : k + 1], ends[k : k + 1], limits[k : k + 1], 37)
        taps = alone[2].shape[2]
        assert (first[k], span[k]) == (alone[0][0], alone[1][0])
        np.testing.assert_array_equal(weights[k, :, :taps], alone[3][0])
        assert not weights[k, :, taps:].any()
        used = alone[3][0] > 0
        np.testing.assert_array_equal(columns[k, :, :taps][used], alone[2][0][used])


def _tapped(lines: np.ndarray, columns: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each line (the last axis) resized by the taps, rounded half up."""
    return np.clip(np.floor((lines[..., columns] * weights).sum(axis=-1) + 0.5), 0, 255)
