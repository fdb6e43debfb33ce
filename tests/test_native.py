"""The C extension (outcore.imaging._jpeg) against what it replaces: the same pixels, value for value.

Cropped decoding is compared with decoding the whole file at the same DCT scale (simplejpeg) and cutting;
the resize with Pillow's antialiased bilinear filter, one axis at a time (columns, then rows). Both paths of
`decode_region` and `resize_edges` (extension, fallback) are run in one session, so CI tests both.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps, UnidentifiedImageError

from outcore.errors import ImageError, OptionError, OutcoreWarning, SampleDecodeError
from outcore.format import ImageDecode
from outcore.format.encoded import pack_regions
from outcore.imaging import EncodedChunk, cut_rows, native
from outcore.imaging.decode import (
    _exif_in_segments,
    _orientation,
    crop_plain_jpegs,
    cut_from_file,
    dct_scale,
    decode_image,
    decode_plain_jpegs,
    decode_region,
    decoded_size,
    fit_image_files,
    plain_jpeg_files,
    plain_jpeg_sizes,
    read_image_file,
    stored_frame,
    upright_size,
)
from outcore.imaging.resize import resize_edges
from outcore.imaging.synthetic import sample_photo

U8 = np.dtype("uint8")
built = pytest.mark.skipif(native.extension is None, reason=f"the C extension is not here: {native.backend()}")


def _jpeg(pixels: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90, **options)
    return buffer.getvalue()


def _photo(height: int, width: int) -> np.ndarray:
    return np.asarray(Image.fromarray(sample_photo("astronaut")).resize((width, height)))


FILES = {  # name: (bytes, channels)
    "4:2:0": (_jpeg(_photo(375, 500), subsampling=2), 3),
    "4:2:2": (_jpeg(_photo(301, 417), subsampling=1), 3),
    "4:4:4": (_jpeg(_photo(250, 333), subsampling=0), 3),
    "progressive": (_jpeg(_photo(333, 250), subsampling=2, progressive=True), 3),
    "restart markers": (_jpeg(_photo(257, 391), subsampling=2, restart_marker_blocks=3), 3),
    "greyscale": (_jpeg(np.asarray(Image.fromarray(_photo(211, 307)).convert("L"))), 1),
}


def _reference(data: bytes, channels: int, eighths: int, edges, size, flip) -> np.ndarray:
    """Decode all of the file at ``eighths``/8, then resize the box with Pillow, columns then rows."""
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    scaled = (math.ceil(height * eighths / 8), math.ceil(width * eighths / 8))
    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB" if channels == 3 else "GRAY", min_height=scaled[0],
                                    min_width=scaled[1])
    assert pixels.shape[:2] == scaled
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
    top, left, bottom, right = edges
    columns = image.resize((size[1], scaled[0]), Image.Resampling.BILINEAR, box=(left, 0, right, scaled[0]))
    rows = np.asarray(columns.resize(size[::-1], Image.Resampling.BILINEAR, box=(0, top, size[1], bottom)))
    rows = rows.reshape(*size, channels)
    return rows[::-1 if flip[1] else 1, ::-1 if flip[0] else 1]


def _boxes(height: int, width: int, rng: np.random.Generator):
    """Boxes at every edge and corner, the whole picture, single pixels and rows, and random ones (some
    with fractional edges), in the scaled picture's pixels."""
    yield 0, 0, height, width
    yield 0, 0, 1, 1
    yield height - 1, width - 1, height, width
    yield 0, width - 17, 23, width  # top right
    yield height - 19, 0, height, 31  # bottom left
    yield height // 2, 0, height // 2 + 1, width  # one row
    yield 0, width // 3, height, width // 3 + 1  # one column
    for _ in range(12):
        box_h, box_w = rng.uniform(1, height), rng.uniform(1, width)
        top, left = rng.uniform(0, height - box_h), rng.uniform(0, width - box_w)
        yield top, left, top + box_h, left + box_w


@built
@pytest.mark.parametrize("name", list(FILES))
def test_a_cropped_decode_gives_the_pixels_of_a_full_decode_then_cut(name):
    data, channels = FILES[name]
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    rng = np.random.default_rng(len(name))
    for eighths in range(1, 9):
        scaled = (math.ceil(height * eighths / 8), math.ceil(width * eighths / 8))
        for k, edges in enumerate(_boxes(*scaled, rng)):
            size = (int(rng.integers(1, 120)), int(rng.integers(1, 120))) if k % 3 else (7, 224)
            flip = (bool(k % 2), bool(k % 4 == 1))
            out = np.full((*size, channels), 7, np.uint8)
            native.extension.crop_resize(data, eighths, edges, out, *flip)
            expected = _reference(data, channels, eighths, edges, size, flip)
            assert np.array_equal(out, expected), (name, eighths, edges, size, flip)


@built
@pytest.mark.parametrize("name", list(FILES))
def test_a_box_of_whole_pixels_at_its_own_size_is_the_decoded_pixels_cut_and_mirrored(name):
    """A plain crop (a box of whole pixels resized to its own size: CenterCrop without resize on pictures
    kept at their size) is copied, not resampled: the same bytes as decoding the whole picture and cutting,
    flipped every way."""
    data, channels = FILES[name]
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    rng = np.random.default_rng(len(name))
    for eighths in (1, 2, 4, 8):
        scaled = (math.ceil(height * eighths / 8), math.ceil(width * eighths / 8))
        whole = simplejpeg.decode_jpeg(data, colorspace="RGB" if channels == 3 else "GRAY", min_height=scaled[0],
                                       min_width=scaled[1]).reshape(*scaled, channels)
        boxes = [(0, 0, *scaled), (0, 0, 1, 1), (scaled[0] - 5, scaled[1] - 3, scaled[0], scaled[1])]
        for _ in range(6):
            box_h, box_w = int(rng.integers(1, scaled[0] + 1)), int(rng.integers(1, scaled[1] + 1))
            top, left = int(rng.integers(0, scaled[0] - box_h + 1)), int(rng.integers(0, scaled[1] - box_w + 1))
            boxes.append((top, left, top + box_h, left + box_w))
        for top, left, bottom, right in boxes:
            for flip in ((False, False), (True, False), (False, True), (True, True)):
                out = np.full((bottom - top, right - left, channels), 7, np.uint8)
                native.extension.crop_resize(data, eighths, (top, left, bottom, right), out, *flip)
                expected = whole[top:bottom, left:right][::-1 if flip[1] else 1, ::-1 if flip[0] else 1]
                assert np.array_equal(out, expected), (name, eighths, (top, left, bottom, right), flip)


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def _tiff(big: bool, entries: list[tuple[int, int, int, int]], directory: int = 8) -> bytes:
    """An EXIF block's TIFF header and first directory at ``directory``: ``(tag, type, count, value)`` each."""
    order = "big" if big else "little"
    head = (b"MM\x00*" if big else b"II*\x00") + directory.to_bytes(4, order) + bytes(max(0, directory - 8))
    body = len(entries).to_bytes(2, order) + b"".join(
        tag.to_bytes(2, order) + kind.to_bytes(2, order) + count.to_bytes(4, order)
        + (value.to_bytes(2, order) + bytes(2) if kind == 3 else value.to_bytes(4, order))
        for tag, kind, count, value in entries)
    return head + body + bytes(4)


_ENTRIES = st.lists(st.tuples(st.sampled_from([0x0112, 0x010F, 0x0110, 0x0131]), st.sampled_from([3, 3, 3, 4]),
                              st.sampled_from([1, 1, 1, 2]), st.integers(0, 10)), max_size=4)
_SEGMENTS = st.lists(st.one_of(
    st.builds(lambda big, entries, directory, cut: _segment(0xE1, b"Exif\x00\x00" + _tiff(big, entries, directory)[cut:]),
              st.booleans(), _ENTRIES, st.sampled_from([8, 8, 8, 12, 400]), st.sampled_from([0, 0, 0, 1, 8])),
    st.builds(lambda value: _segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x tiff:Orientation=\"%d\"/>" % value),
              st.integers(1, 8)),
    st.builds(_segment, st.sampled_from([0xE0, 0xE2, 0xFE]), st.sampled_from([b"JFIF\x00", b"", b"Exif\x00\x00MM"]))),
    max_size=4)


@built
@settings(max_examples=400, deadline=None)
@given(segments=_SEGMENTS, fill=st.booleans())
def test_the_extension_reads_an_exif_orientation_as_pillow_does_or_leaves_it_to_pillow(segments, fill):
    """Photos with EXIF blocks (either byte order, the orientation tag or not, of other types, twice, blocks cut
    short or pointing past their end), XMP packets and other segments: `jpeg_orientation` says what `_orientation`
    reads with Pillow, or 0 (Pillow then reads it); 1 also where Pillow opens no EXIF."""
    photo = _jpeg(_photo(24, 16))
    data = photo[:2] + (b"\xff" if fill else b"") + b"".join(segments) + photo[2:]
    found = native.extension.jpeg_orientation(data)
    try:
        with warnings.catch_warnings(), Image.open(io.BytesIO(data)) as image:
            warnings.simplefilter("ignore")  # Pillow's of a tag of more values than it expects
            read = _orientation(image)
    except (TypeError, ValueError):  # a value of another type than Pillow's int
        read = None
    except UnidentifiedImageError:  # a JFIF segment too short for Pillow: decoding it says so
        return
    assert found == 0 or found == read, (found, read)
    if not _exif_in_segments(data) and not fill:
        assert found == 1


@built
def test_a_jpegs_exif_orientation_is_read_or_left_to_pillow_where_it_could_mislead():
    photo = _jpeg(_photo(24, 16))
    with_exif = {orientation: _exif_rotated(_photo(24, 16), orientation) for orientation in range(1, 9)}
    assert [native.extension.jpeg_orientation(data) for data in with_exif.values()] == list(range(1, 9))
    camera = Image.Exif()
    camera[0x010F] = "Maker"  # EXIF without an orientation: upright, unless an XMP packet may say otherwise
    untold = _jpeg(_photo(24, 16), exif=camera)
    xmp = _segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x tiff:Orientation=\"6\"/>")
    assert native.extension.jpeg_orientation(untold) == 1
    assert native.extension.jpeg_orientation(untold[:2] + xmp + untold[2:]) == 0
    twice = with_exif[1][:2] + _segment(0xE1, b"Exif\x00\x00" + _tiff(True, [(0x0112, 3, 1, 6)])) + with_exif[1][2:]
    assert native.extension.jpeg_orientation(twice) == 0  # Pillow joins two blocks
    assert native.extension.jpeg_orientation(photo) == 1
    assert native.extension.jpeg_orientation(b"\xff\xd8\xff\xdb\x00\x02\xff\xda") == 1  # the image data at the end
    assert [native.extension.jpeg_orientation(data) for data in (photo[:40], b"\x89PNG", b"")] == [0, 0, 0]


@built
def test_the_resize_is_pillows_antialiased_bilinear_one_axis_at_a_time():
    rng = np.random.default_rng(0)
    for trial in range(400):
        height, width = (int(v) for v in rng.integers(1, 200, 2))
        channels = (1, 3)[trial % 2]
        pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
        box_h, box_w = rng.uniform(0.5, height), rng.uniform(0.5, width)
        top, left = rng.uniform(0, height - box_h), rng.uniform(0, width - box_w)
        if trial % 4 == 0:
            top, left, box_h, box_w = int(top), int(left), max(1, int(box_h)), max(1, int(box_w))
        size = (int(rng.integers(1, 250)), int(rng.integers(1, 250)))
        image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels)
        columns = image.resize((size[1], height), Image.Resampling.BILINEAR, box=(left, 0, left + box_w, height))
        expected = np.asarray(columns.resize(size[::-1], Image.Resampling.BILINEAR,
                                             box=(0, top, size[1], top + box_h))).reshape(*size, channels)
        out = np.empty((*size, channels), np.uint8)
        native.extension.resize(pixels, (top, left, top + box_h, left + box_w), out)
        assert np.array_equal(out, expected), (pixels.shape, (top, left, box_h, box_w), size)


def _float_planes(pixels: np.ndarray, edges, size, flip) -> np.ndarray:
    """Pictures of more than 8 bits, or floats, as Pillow resizes a float32 picture (mode F), one axis at a time
    (columns, then rows), channel by channel; integers rounded half to even and held to their range; mirrored. A box
    of whole pixels at its own size is its samples as they are (float64 ones too)."""
    top, left, bottom, right = edges
    mirrored = (slice(None, None, -1 if flip[1] else 1), slice(None, None, -1 if flip[0] else 1))
    if (bottom - top, right - left) == tuple(size) and float(top).is_integer() and float(left).is_integer():
        return pixels[int(top) : int(bottom), int(left) : int(right)][mirrored]
    planes = []
    for channel in range(pixels.shape[2]):
        image = Image.fromarray(pixels[..., channel].astype(np.float32))
        columns = image.resize((size[1], image.height), Image.Resampling.BILINEAR, box=(left, 0, right, image.height))
        planes.append(np.asarray(columns.resize(size[::-1], Image.Resampling.BILINEAR, box=(0, top, size[1], bottom))))
    resized = np.stack(planes, axis=-1)
    if pixels.dtype.kind in "ui":
        info = np.iinfo(pixels.dtype)
        resized = np.clip(np.rint(resized), info.min, info.max)
    return resized.astype(pixels.dtype)[mirrored]


@built
@pytest.mark.parametrize("dtype", ["uint16", "int16", "float32", "float64"])
def test_pictures_of_more_bits_resize_as_pillow_s_float_pictures_one_axis_at_a_time(dtype):
    """In C, whatever the channels: each channel as a float32 picture, columns then rows, in Pillow's arithmetic
    (double sums of its exact weights, float32 between and after the passes), bit for bit; never the order Pillow's
    own two-axis resize may choose (rows first, where the height shrinks more, since Pillow 13)."""
    rng = np.random.default_rng(11)
    for trial in range(150):
        height, width = (int(v) for v in rng.integers(1, 90, 2))
        shape = (height, width, int(rng.integers(1, 5)))
        if dtype.startswith("float"):
            pixels = (rng.standard_normal(shape) * 300).astype(dtype)
        else:
            info = np.iinfo(dtype)
            pixels = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
        box_h, box_w = rng.uniform(0.5, height), rng.uniform(0.5, width)
        top, left = rng.uniform(0, height - box_h), rng.uniform(0, width - box_w)
        if trial % 4 == 0:
            top, left, box_h, box_w = int(top), int(left), max(1, int(box_h)), max(1, int(box_w))
        size = (int(rng.integers(1, 120)), int(rng.integers(1, 120)))
        if trial % 6 == 0:  # a plain crop: its samples as they are
            size = (int(box_h), int(box_w)) if trial % 4 == 0 else size
        flip = (bool(trial % 3 == 0), bool(trial % 5 == 0))
        edges = (top, left, top + box_h, left + box_w)
        out = np.empty((*size, shape[2]), dtype)
        native.extension.resize(pixels, edges, out, *flip)
        np.testing.assert_array_equal(out, _float_planes(pixels, edges, size, flip), err_msg=f"{shape} {edges} {size}")


@built
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_infinities_and_nans_spread_as_in_pillow(dtype):
    """A float picture holding inf, -inf and NaN (a depth map's holes, an overflow): every tap Pillow sums is summed,
    those of weight 0 too (0 x inf is NaN), so the same pixels are NaN, inf or finite in C as in Pillow."""
    rng = np.random.default_rng(13)
    for trial in range(60):
        shape = (int(rng.integers(2, 40)), int(rng.integers(2, 40)), int(rng.integers(1, 4)))
        pixels = rng.standard_normal(shape).astype(dtype)
        holes = rng.random(shape[:2]) < 0.05
        pixels[holes] = rng.choice([np.inf, -np.inf, np.nan], int(holes.sum()))[:, None]
        box_h, box_w = rng.uniform(0.5, shape[0]), rng.uniform(0.5, shape[1])
        top, left = rng.uniform(0, shape[0] - box_h), rng.uniform(0, shape[1] - box_w)
        size = (int(rng.integers(1, 50)), int(rng.integers(1, 50)))
        if trial % 2:  # whole pixels, each made two or three (taps falling on a filter's ends: of weight 0)
            top, left, box_h, box_w = 0, 0, shape[0], shape[1]
            size = (shape[0] * (2 + trial % 4 // 2), shape[1] * 2)
        edges = (top, left, top + box_h, left + box_w)
        out = np.empty((*size, shape[2]), dtype)
        native.extension.resize(pixels, edges, out)
        np.testing.assert_array_equal(out, _float_planes(pixels, edges, size, (False, False)), err_msg=str(trial))


def test_integer_pictures_round_half_to_even_either_way(backend):
    """A sum halfway between two integers goes to the even one, as numpy's rint: 1.5 and 2.5 both to 2."""
    halves = {"uint16": ([[1, 2], [2, 3], [65534, 65535]], [2, 2, 65534]), "int16": ([[-3, -2], [-2, -1]], [-2, -2])}
    for dtype, (pairs, expected) in halves.items():
        for pair, value in zip(pairs, expected, strict=True):
            out = resize_edges(np.array(pair, dtype).reshape(1, 2, 1), (0, 0, 1, 2), (1, 1))
            assert out.dtype == dtype and out.item() == value, (dtype, pair)


@pytest.fixture(params=["extension", "fallback"])
def backend(request, monkeypatch):
    """Each test below runs with the C extension (where built) and with simplejpeg and Pillow."""
    if request.param == "extension" and native.extension is None:
        pytest.skip(f"the C extension is not here: {native.backend()}")
    if request.param == "fallback":
        monkeypatch.setattr(native, "extension", None)
    return request.param


def _exif_rotated(pixels: np.ndarray, orientation: int = 6) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation  # 6: rotated 90 degrees clockwise, 3: upside down
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90, exif=exif)
    return buffer.getvalue()


def _cmyk(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


OTHER_FILES = {"exif rotated": _exif_rotated(_photo(120, 160)), "cmyk": _cmyk(_photo(120, 160)),
               "png": _png(_photo(120, 160))}


def _regions(data: bytes, decode: ImageDecode) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    height, width = upright_size(data) if decode.variable else decode.shape[:2]
    results = []
    for k in range(20):
        box_h, box_w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        box = (int(rng.integers(0, height - box_h + 1)), int(rng.integers(0, width - box_w + 1)), box_h, box_w)
        out = np.zeros((24, 40, decode.channels), np.uint8)
        results.append(decode_region(data, decode, box, (24, 40), out, flip=(bool(k % 2), bool(k % 3 == 0))))
    return results


@pytest.mark.parametrize("name", ["4:2:0", "progressive", "greyscale", "exif rotated", "cmyk", "png"])
@pytest.mark.parametrize("decode", [ImageDecode((None, None, 3), "uint8", None), ImageDecode((64, 64, 3), "uint8", "crop"),
                                    ImageDecode((48, 80, 3), "uint8", "fit")], ids=["own size", "crop", "fit"])
def test_both_paths_give_the_same_regions(name, decode, monkeypatch):
    data = FILES[name][0] if name in FILES else OTHER_FILES[name]
    if name == "greyscale":
        decode = ImageDecode((*decode.shape[:2], 1), "uint8", decode.resize)
    if native.extension is None:
        pytest.skip(f"the C extension is not here: {native.backend()}")
    with_extension = _regions(data, decode)
    monkeypatch.setattr(native, "extension", None)
    without = _regions(data, decode)
    assert all(np.array_equal(a, b) for a, b in zip(with_extension, without, strict=True))


@pytest.mark.parametrize("name", ["4:2:0", "4:2:2", "progressive", "greyscale", "exif rotated", "cmyk", "png"])
@pytest.mark.parametrize("resize", ["crop", "fit", "pad"])
def test_both_paths_give_the_same_samples(name, resize, monkeypatch):
    """Whole samples (ingest, encoded fields read without a crop): with the extension, a plain JPEG under
    ``crop`` or ``fit`` is decoded only where the policy keeps it, and resized once, into ``out``."""
    data, channels = FILES[name] if name in FILES else (OTHER_FILES[name], 3)
    shapes = [(64, 64, channels), (37, 90, channels), (200, 150, channels)]
    if native.extension is None:
        pytest.skip(f"the C extension is not here: {native.backend()}")
    with_extension = [decode_image(data, shape, resize, np.dtype("uint8")) for shape in shapes]
    into = [decode_image(data, shape, resize, np.dtype("uint8"), out=np.empty(shape, np.uint8)) for shape in shapes]
    monkeypatch.setattr(native, "extension", None)
    without = [decode_image(data, shape, resize, np.dtype("uint8")) for shape in shapes]
    for a, b, c in zip(with_extension, into, without, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)


def _same_size_files(channels: int) -> dict[str, bytes]:
    """Files for a chunk of 96x128 samples: plain JPEGs of that size of every kind (decoded together in C),
    and others `decode_image` decodes (other sizes, colour spaces, formats, an EXIF orientation); a camera's EXIF
    saying the picture is upright is plain."""
    photo = _photo(96, 128) if channels == 3 else np.asarray(Image.fromarray(_photo(96, 128)).convert("L"))
    files = {"4:2:0": _jpeg(photo, subsampling=2), "other size": _jpeg(_photo(60, 90) if channels == 3 else photo[:60]),
             "png": _png(photo), "exif rotated": _exif_rotated(np.ascontiguousarray(photo.swapaxes(0, 1))),
             "exif upside down": _exif_rotated(photo, 3), "exif upright": _exif_rotated(photo, 1),
             **{f"exif {turn}": _exif_rotated(np.ascontiguousarray(photo.swapaxes(0, 1)) if turn >= 5 else photo, turn)
                for turn in (2, 4, 5, 7, 8)}}
    if channels == 3:
        files |= {"4:2:2": _jpeg(photo, subsampling=1), "4:4:4": _jpeg(photo, subsampling=0), "cmyk": _cmyk(photo),
                  "greyscale": _jpeg(np.asarray(Image.fromarray(photo).convert("L"))),
                  "progressive": _jpeg(photo, subsampling=2, progressive=True),
                  "restart markers": _jpeg(photo, subsampling=2, restart_marker_blocks=3)}
    else:
        files |= {"greyscale progressive": _jpeg(photo, progressive=True), "rgb": _jpeg(_photo(96, 128))}
    return files


PLAIN = {"4:2:0", "4:2:2", "4:4:4", "progressive", "restart markers", "greyscale progressive", "exif upright", "greyscale",
         *(("png",) if getattr(native.extension, "ZLIB", "") else ())}  # a plain PNG too, where built with zlib
TURNED = {"exif rotated", "exif upside down", *(f"exif {turn}" for turn in (2, 4, 5, 7, 8))}  # EXIF turns or
# mirrors them: decoded whole, turned upright, in C
WEIGHED = {"rgb"}  # colours asked for as grey: decoded whole in C, weighed as Pillow's convert("L") weighs them


@built
@pytest.mark.parametrize("channels", [3, 1])
def test_plain_jpegs_decoded_together_are_decode_images_samples(channels):
    """decode_each: each plain JPEG (and PNG, tests/test_png.py) of the rows' size decoded into its row (rows in any
    order), the same pixels as `decode_image`; every other file left, its row untouched."""
    files = _same_size_files(channels)
    names = [*files, *files]  # each file twice: samples are not rows
    region, ranges = pack_regions([files[name] for name in names], len(names), 1 << 20)
    samples = np.arange(len(names))[::-1].copy()
    rows = np.roll(np.arange(len(names)), 3)
    out = np.full((len(names), 96, 128, channels), 7, np.uint8)
    left = native.extension.decode_each([region], [ranges], np.zeros_like(samples), samples, out, rows)
    assert sorted(names[samples[k]] for k in left) == sorted(name for name in names if name not in PLAIN | TURNED | WEIGHED)
    for k, (sample, row) in enumerate(zip(samples, rows, strict=True)):
        expected = decode_image(files[names[sample]], (96, 128, channels), "crop", np.dtype("uint8"))
        if k in left:
            assert (out[row] == 7).all()
        else:
            np.testing.assert_array_equal(out[row], expected, err_msg=names[sample])


@pytest.mark.parametrize("channels", [3, 1])
def test_a_chunk_decodes_into_any_rows_as_decode_image_does(channels, backend):
    """EncodedChunk.decode_samples: the plain JPEGs together (with the extension), the others one by one; the
    same samples either way, grey ones into rows of one channel or none."""
    files = _same_size_files(channels)
    region, ranges = pack_regions(list(files.values()), len(files), 1 << 20)
    for shape in [(96, 128, channels)] + ([(96, 128)] if channels == 1 else []):
        chunk = EncodedChunk(region, ranges, ImageDecode(shape, "uint8", "crop"), ("s.zarr", "images", 2, 40))
        samples, rows = np.array([4, 0, 2, 1, 3]), np.array([1, 3, 0, 4, 2])
        out = np.zeros((5, *shape), np.uint8)
        chunk.decode_samples(samples, out, rows)
        for sample, row in zip(samples, rows, strict=True):
            expected = decode_image(list(files.values())[sample], shape, "crop", np.dtype("uint8"))
            np.testing.assert_array_equal(out[row], expected)


def test_a_damaged_file_among_plain_ones_is_named(backend):
    """A truncated JPEG, junk, a truncated PNG, one whose header's CRC is wrong (which Pillow will not open) and a
    byte range outside the chunk, between plain JPEGs and PNGs: the error names the sample and says what is wrong,
    as decoding it alone does."""
    good, png = _jpeg(_photo(96, 128)), _png(_photo(96, 128))
    wrong_crc = png[:30] + bytes([png[30] ^ 1]) + png[31:]  # IHDR's CRC: bytes 29-32
    blobs = [good, good[: len(good) // 2], png, b"\xff\xd8\xff" + bytes(300), png[: len(png) // 2], wrong_crc]
    region, ranges = pack_regions(blobs, 6, 1 << 20)
    chunk = EncodedChunk(region, ranges, ImageDecode((96, 128, 3), "uint8", "crop"), ("s.zarr", "images", 2, 40))
    out = np.empty((4, 96, 128, 3), np.uint8)
    for sample, reason in ((1, "cannot decode .ValueError: Premature end of JPEG file"), (3, "cannot decode"),
                           (4, "cannot decode .OSError: image file is truncated"),
                           (5, "not an image file Pillow can read")):
        with pytest.raises(SampleDecodeError, match=f"s.zarr: field 'images', sample {40 + sample} .chunk 2. cannot be "
                                                    f"decoded: {reason}"):
            chunk.decode_samples(np.array([0, sample, 2]), out, np.array([0, 1, 2]))
    outside = ranges.copy()
    outside[2] = (len(region) - 10, len(region) + 10)
    chunk = EncodedChunk(region, outside, ImageDecode((96, 128, 3), "uint8", "crop"), ("s.zarr", "images", 2, 40))
    with pytest.raises(SampleDecodeError, match="sample 42 .chunk 2. .*byte range .* outside the chunk"):
        chunk.decode_samples(np.array([0, 2]), out, np.array([0, 1]))


def test_what_decode_each_cannot_take_is_left_to_decode_image():
    """Other dtypes and layouts, and no extension at all: every position left, for `decode_image`."""
    region, ranges = pack_regions([_jpeg(_photo(8, 8))], 1, 4096)
    one = np.array([0])
    for out in (np.empty((1, 8, 8, 3), np.uint16), np.empty((1, 8, 16, 3), np.uint8)[:, :, ::2],
                np.empty((1, 8, 8, 4), np.uint8), np.empty((1, 64), np.uint8)):
        assert list(decode_plain_jpegs([region], [ranges], one * 0, one, out, one)) == [0]


@built
def test_check_files_reads_and_digests_each_file_as_hashlib_and_read_image_file_do(tmp_path):
    """`plain_jpeg_files`: each file read whole, its size and BLAKE2b digest (_blake2b.h, of every length around
    its 128-byte blocks, and 1 to 64 bytes of digest) those of `read_image_file` and hashlib; a plain JPEG's size
    that of its header; a missing file, a folder, a record's reference and a URL left unread, with zeros."""
    rng = np.random.default_rng(11)
    lengths = [0, 1, 2, 111, 112, 127, 128, 129, 255, 256, 257, 384, 385, 4096, 100_003]
    paths = []
    for n in lengths:
        paths.append(str(tmp_path / f"{n}.bin"))
        Path(paths[-1]).write_bytes(rng.bytes(n))
    photo = _jpeg(_photo(48, 80))
    (tmp_path / "photo.jpg").write_bytes(photo)
    unread = [str(tmp_path / "missing.jpg"), str(tmp_path), f"{tmp_path / 'photo.jpg'}::record 3 @0+10",
              "s3://bucket/photo.jpg"]
    paths += [str(tmp_path / "photo.jpg"), *unread]
    for digest_size in (16, 1, 64):
        found = plain_jpeg_files(paths, 3, digest_size=digest_size)
        for k, n in enumerate(lengths):
            data = read_image_file(paths[k])
            assert found.nbytes[k] == n == len(data)
            assert found.digests[k].tobytes() == hashlib.blake2b(data, digest_size=digest_size).digest(), n
        photo_at = len(lengths)
        assert found.sizes[photo_at].tolist() == [48, 80] and found.nbytes[photo_at] == len(photo)
        assert found.digests[photo_at].tobytes() == hashlib.blake2b(photo, digest_size=digest_size).digest()
        assert found.left == [*range(len(lengths)), *range(photo_at + 1, len(paths))]
        assert not found.nbytes[photo_at + 1 :].any() and not found.digests[photo_at + 1 :].any()
    assert plain_jpeg_files(paths[photo_at : photo_at + 1], 3, max_side=79).left == [0]  # past max_side: left
    with pytest.raises(ValueError, match="digests"):
        native.extension.check_files(paths, 3, -1, -1, np.zeros((len(paths), 2), np.int64),
                                     np.zeros(len(paths), np.int64), np.zeros((len(paths), 65), np.uint8))


@built
def test_fit_files_decodes_a_pixel_ingests_jpegs_and_pngs_as_decode_image_does(tmp_path):
    """`fit_image_files` (a pixel ingest's block): each JPEG, plain or turned by its EXIF, colour or grey (colour asked
    as grey too), and each plain PNG (built with zlib: RGB, RGBA, grey, a palette, interlaced), of any size, decoded and
    fitted to the rows under each policy (every DCT scale, upscaled too), the pixels `decode_image` gives and hashlib's
    digest; left for `decode_image` (which decodes them or says what is wrong): other files (CMYK), a colour PNG asked
    as grey, a 16-bit grey
    PNG (decoded to 16 bits then rounded, or by Pillow to RGB), a damaged file, one past max_pixels, one of another
    size without a policy, and paths not read (missing, a folder, a record's reference, a URL), their rows and digests
    as they were."""
    files, pngs = {}, hasattr(native.extension, "decode_png")  # built with zlib
    for (height, width), channels in [((301, 203), 3), ((96, 128), 1), ((40, 24), 3), ((7, 300), 3)]:
        for orientation, data in _turned_files(height, width, channels).items():
            files[f"{height}x{width} {channels} exif {orientation}"] = data
    photo = Image.fromarray(_photo(96, 128))
    for mode, options in [("RGB", {}), ("RGBA", {}), ("L", {}), ("P", {}), ("RGB", {"interlace": 1})]:
        buffer = io.BytesIO()
        (photo.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else photo.convert(mode)).save(
            buffer, format="PNG", **options)
        files[f"96x128 {1 if mode == 'L' else 3} png {mode} {options}"] = buffer.getvalue()
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(photo.convert("L")).astype(np.uint16) * 257).save(buffer, format="PNG")
    files["16-bit grey"] = buffer.getvalue()
    files["cmyk"], files["damaged"] = _cmyk(_photo(120, 160)), files["301x203 3 exif 1"][:3000]
    files["big"] = _jpeg(_photo(400, 400))
    for name, data in files.items():
        (tmp_path / f"{name}.jpg").write_bytes(data)
    unread = [str(tmp_path / "missing.jpg"), str(tmp_path), f"{tmp_path / 'png.jpg'}::record 3 @0+10", "s3://b/c.jpg"]
    paths = [str(tmp_path / f"{name}.jpg") for name in files] + unread
    for size, resize in [((96, 96), "crop"), ((64, 200), "fit"), ((13, 13), "crop"), ((640, 480), "crop"),
                         ((301, 203), None), ((128, 96), "fit")]:
        for channels in (3, 1):
            out = np.full((len(paths), *size, channels), 7, np.uint8)
            digests = np.full((len(paths), 16), 7, np.uint8)
            left = fit_image_files(paths, resize, out, digests, max_pixels=399 * 400)
            for k, (name, data) in enumerate(files.items()):
                kept = name not in ("cmyk", "damaged", "big", "16-bit grey") and (pngs or " png " not in name) and \
                    (resize is not None or name.startswith(f"{size[0]}x{size[1]}")) and \
                    (channels == 3 or " 1 " in name or " png " not in name)  # colour PNGs asked as grey: left
                assert (k not in left) == kept, (name, size, resize, channels)
                if kept:
                    expected = decode_image(data, (*size, channels), resize, U8)
                    np.testing.assert_array_equal(out[k], expected, err_msg=f"{name}: {size} {resize} {channels}")
                    assert digests[k].tobytes() == hashlib.blake2b(data, digest_size=16).digest()
            assert left[-len(unread):] == list(range(len(files), len(paths)))
            assert (out[len(files):] == 7).all() and (digests[len(files):] == 7).all()
    assert fit_image_files(paths, "pad", out, digests) is None  # the pad policy: decode_image's
    with pytest.raises(ValueError, match="policy='stretch'|policy=stretch"):
        native.extension.fit_files(paths, "stretch", -1, out, digests)
    with pytest.raises(ValueError, match="digests"):
        native.extension.fit_files(paths, "crop", -1, out, digests[:, :0])


@built
def test_the_survey_checks_jpegs_that_exif_turns_and_says_their_upright_size_and_orientation(tmp_path):
    """`plain_jpeg_files` and `plain_jpeg_sizes` (with ``orientations``) check the files of every EXIF orientation in
    C: each one's upright size and orientation as `stored_frame` reads them with Pillow; one cut short is left, for
    Pillow to say what is wrong; without ``orientations``, the turned ones are left, as before."""
    photo = _photo(48, 80)
    files = [_exif_rotated(photo, orientation) for orientation in range(1, 9)]
    files.append(files[5][: len(files[5]) // 2])  # orientation 6, cut short
    paths = [str(tmp_path / f"{k}.jpg") for k in range(len(files))]
    for path, data in zip(paths, files, strict=True):
        Path(path).write_bytes(data)
    found = plain_jpeg_files(paths, 3)
    turns = np.zeros(len(files), np.uint8)
    sizes, left = plain_jpeg_sizes(files, 3, orientations=turns)
    assert found.left == list(left) == [len(files) - 1]
    for k, data in enumerate(files[:-1]):
        upright, orientation = stored_frame(data)
        assert found.sizes[k].tolist() == sizes[k].tolist() == list(upright), k
        assert found.orientations[k] == turns[k] == orientation == k + 1
    assert found.orientations[-1] == turns[-1] == 0
    assert list(plain_jpeg_sizes(files, 3)[1]) == [*range(1, len(files))]  # without orientations: plain ones only


@built
@pytest.mark.parametrize(("arguments", "error", "message"), [
    ((np.array([0]), np.array([5]), np.array([0])), IndexError, "file 5 of chunk 0 or row 0 out of range"),
    ((np.array([0]), np.array([0]), np.array([2])), IndexError, "file 0 of chunk 0 or row 2 out of range"),
    ((np.array([1]), np.array([0]), np.array([0])), IndexError, "file 0 of chunk 1 or row 0 out of range"),
    ((np.array([0]), np.array([0], np.int32), np.array([0])), ValueError, "int64"),
])
def test_decode_each_refuses_samples_and_rows_it_has_not(arguments, error, message):
    region, ranges = pack_regions([_jpeg(_photo(8, 8))], 1, 4096)
    with pytest.raises(error, match=message):
        native.extension.decode_each([region], [ranges], *arguments[:2], np.empty((2, 8, 8, 3), np.uint8), *arguments[2:])


@pytest.mark.parametrize("resize", ["crop", "fit"])
def test_a_greyscale_jpeg_asked_in_colour_is_its_grey_repeated_as_pillow_converts_it(resize, backend):
    """A greyscale JPEG in a store of RGB pictures (ImageNet and COCO hold some): every path gives its grey levels in
    each channel (Pillow's ``convert("RGB")``), whole or cut, at any size, with the extension or without, and the C
    paths take it (the survey's check, a run's rows and boxes)."""
    grey = _jpeg(np.asarray(Image.fromarray(_photo(96, 128)).convert("L")))
    with Image.open(io.BytesIO(grey)) as image:
        assert np.array_equal(np.asarray(image.convert("RGB")), decode_image(grey, (None, None, 3), None, U8))
    for shape in [(96, 128), (64, 64), (37, 90), (200, 150)]:
        one = decode_image(grey, (*shape, 1), resize, U8)
        np.testing.assert_array_equal(decode_image(grey, (*shape, 3), resize, U8), np.repeat(one, 3, axis=2))
    for box, size in [((10.0, 20.0, 50.0, 70.0), (32, 32)), ((0.5, 3.25, 90.0, 100.5), (24, 40))]:
        for decode in (ImageDecode((96, 128, 3), "uint8", resize), ImageDecode((None, None, 3), "uint8", None)):
            one = ImageDecode((*decode.shape[:2], 1), "uint8", decode.resize)
            cut = decode_region(grey, decode, box, size, np.empty((*size, 3), np.uint8), flip=(True, False))
            alone = decode_region(grey, one, box, size, np.empty((*size, 1), np.uint8), flip=(True, False))
            np.testing.assert_array_equal(cut, np.repeat(alone, 3, axis=2))
    if backend == "extension":
        assert list(plain_jpeg_sizes([grey], 3)[1]) == []
        assert cut_from_file(grey, ImageDecode((96, 128, 3), "uint8", resize))


@built
@pytest.mark.parametrize("channels", [3, 1])
def test_decode_each_turns_and_mirrors_each_exif_orientation_as_pillow_does(channels):
    """Files stored turned or mirrored, each of the eight EXIF orientations, of a picture 96x128 upright (stored
    128x96 where the orientation transposes it): decoded in C into their rows, the pixels `decode_image` gives
    (Pillow's exif_transpose); a file whose upright size is not the rows' left."""
    photo = _photo(96, 128) if channels == 3 else np.asarray(Image.fromarray(_photo(96, 128)).convert("L"))
    files = [_exif_rotated(np.ascontiguousarray(photo.swapaxes(0, 1)) if orientation >= 5 else photo, orientation)
             for orientation in range(1, 9)]
    files.append(_exif_rotated(photo, 6))  # 128x96 upright: not the rows' size
    region, ranges = pack_regions(files, len(files), 1 << 20)
    samples = np.arange(len(files))
    out = np.full((len(files), 96, 128, channels), 7, np.uint8)
    left = native.extension.decode_each([region], [ranges], samples * 0, samples, out, samples[::-1].copy())
    assert left == [len(files) - 1]
    for orientation, data in enumerate(files[:-1], start=1):
        expected = _through_pillow(data, (96, 128, channels), "crop")
        np.testing.assert_array_equal(out[len(files) - orientation], expected, err_msg=f"orientation {orientation}")


def _through_pillow(data: bytes, shape: tuple, resize: str | None) -> np.ndarray:
    """`decode_image`'s pixels of ``data`` as Pillow gives them: the extension's decode of turned files hidden, Pillow
    opens a turned one (checked; a plain one is libjpeg-turbo's)."""
    opened = []
    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(native.extension, "decode_upright")
        patch.setattr(Image, "open", lambda *args, **kwargs: opened.append(1) or _open(*args, **kwargs))
        pixels = decode_image(data, shape, resize, U8)
    assert opened or stored_frame(data)[1] == 1
    return pixels


_open = Image.open


def _turned_files(height: int, width: int, channels: int) -> dict[int, bytes]:
    """A photo ``height`` x ``width`` upright in each of the eight EXIF orientations (stored transposed where the
    orientation transposes it), colour or grey."""
    photo = _photo(height, width) if channels == 3 else np.asarray(Image.fromarray(_photo(height, width)).convert("L"))
    return {orientation: _exif_rotated(np.ascontiguousarray(photo.swapaxes(0, 1)) if orientation >= 5 else photo,
                                       orientation) for orientation in range(1, 9)}


@built
@pytest.mark.parametrize("channels", [3, 1])
def test_decode_image_turns_each_exif_orientation_in_c_as_pillow_does(channels, monkeypatch):
    """A JPEG that its EXIF orientation turns or mirrors is decoded upright in C, whatever the policy and the size
    asked (every DCT scale Pillow's draft picks, its pad and crop), into the pixels Pillow gives, and Pillow never
    opens it: a greyscale one asked in colour too, and a colour one asked as grey (plain, orientation 1, too: weighed
    as ``convert("L")`` weighs it); its upright size read from its header alike."""
    asked = [((None, None), None), ((301, 203), "crop"), ((150, 100), "fit"), ((96, 96), "crop"), ((64, 40), "pad"),
             ((37, 29), "crop"), ((12, 90), "fit"), ((400, 400), "crop")]
    files = _turned_files(301, 203, channels)
    opened = []
    monkeypatch.setattr(Image, "open", lambda *args, **kwargs: opened.append(1) or _open(*args, **kwargs))
    for orientation, data in files.items():
        assert stored_frame(data) == ((301, 203), orientation)
        assert upright_size(data) == decoded_size(data, channels, U8) == decoded_size(data, 1, U8) == (301, 203)
        for wanted in (1, 3):  # a colour file asked for as grey too: weighed as Pillow's convert("L") weighs it
            for size, resize in asked:
                with monkeypatch.context() as patch:
                    patch.setattr(Image, "open", _open)
                    expected = _through_pillow(data, (*size, wanted), resize)
                np.testing.assert_array_equal(decode_image(data, (*size, wanted), resize, U8), expected,
                                              err_msg=f"orientation {orientation}, {size} {resize}, {wanted}")
    assert not opened


@built
def test_a_turned_jpeg_the_extension_does_not_decode_is_left_to_pillow():
    """decode_upright decodes only a file of its array's size that decodes cleanly, at a DCT scale: 0 for the
    others (a damaged file is then Pillow's to word, named), and a CMYK one (another colour space) goes to Pillow."""
    data = _turned_files(96, 64, 3)[6]
    out = np.empty((96, 64, 3), np.uint8)
    assert native.extension.decode_upright(data, 8, out) == 6
    assert native.extension.decode_upright(data, 8, np.empty((64, 96, 3), np.uint8)) == 0
    assert native.extension.decode_upright(data, 4, np.empty((48, 32, 3), np.uint8)) == 6
    assert native.extension.decode_upright(data[: len(data) // 2], 8, out) == 0
    with pytest.raises(ImageError, match="turned.jpg"):
        decode_image(data[: len(data) // 2], (32, 32, 3), "crop", U8, "turned.jpg")
    with pytest.raises(ValueError, match="eighths=0"):
        native.extension.decode_upright(data, 0, out)
    with pytest.raises(ValueError, match="out must be"):
        native.extension.decode_upright(data, 8, np.empty((96, 64, 2), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(_photo(64, 96)).convert("CMYK").save(buffer, format="JPEG", quality=90, exif=exif)
    cmyk = buffer.getvalue()
    assert native.extension.decode_upright(cmyk, 8, out) == 0
    with Image.open(io.BytesIO(cmyk)) as image:
        expected = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    np.testing.assert_array_equal(decode_image(cmyk, (None, None, 3), None, U8), expected)


@built
def test_decode_each_takes_the_files_of_several_chunks_in_one_call():
    """Row k's file is file samples[k] of chunk which[k]: each chunk's ranges index its own region."""
    files = _same_size_files(3)
    plain = [files[name] for name in sorted(PLAIN & set(files))]
    chunks = [pack_regions(plain[start:], len(plain) - start, 1 << 20) for start in (0, 1)]
    which, samples, rows = np.array([1, 0, 1, 0]), np.array([0, 0, 1, 1]), np.array([3, 2, 1, 0])
    out = np.zeros((4, 96, 128, 3), np.uint8)
    left = native.extension.decode_each([c[0] for c in chunks], [c[1] for c in chunks], which, samples, out, rows)
    assert left == []
    for chunk, sample, row in zip(which, samples, rows, strict=True):
        expected = decode_image(plain[chunk + sample], (96, 128, 3), "crop", np.dtype("uint8"))
        np.testing.assert_array_equal(out[row], expected)


def _boxes_in(pictures: list[tuple[int, int]], size: tuple[int, int], rng: np.random.Generator) -> list[tuple]:
    """A box in each picture, of every kind: whole pixels and fractions, small and large (every DCT scale),
    windows of ``size`` past the edges (RandomCrop's padding, cut at its own size), boxes larger than the picture
    (ScaleJitter's window of a picture scaled smaller than it), and boxes with nothing of the picture in them."""
    boxes = []
    for k, (height, width) in enumerate(pictures):
        box_h, box_w = rng.uniform(1, height), rng.uniform(1, width)
        box = (rng.uniform(0, height - box_h), rng.uniform(0, width - box_w), box_h, box_w)
        if k % 3 == 0:  # whole pixels, as RandomCrop's windows
            box = (int(box[0]), int(box[1]), max(1, int(box_h)), max(1, int(box_w)))
        if k % 7 == 0:
            box = (-3, width - size[1] + 4, *size)
        if k % 11 == 0:
            box = (-rng.uniform(0, 9), rng.uniform(-9, 2), height * rng.uniform(1.1, 3), width * rng.uniform(0.5, 3))
        if k % 13 == 0:
            box = (height + 0.5, 0, 10, 10)
        boxes.append(box)
    return boxes


@pytest.mark.parametrize("stored", ["fixed", "own size"])
@pytest.mark.parametrize("channels", [3, 1])
def test_boxes_of_a_chunk_cut_together_are_decode_regions_boxes(stored, channels, backend):
    """cut_rows: the boxes of plain JPEGs cut together in C (with the extension), past their edges too, the
    others one by one; each the pixels `decode_region` gives it alone, at every DCT scale, flipped or not."""
    files = _same_size_files(channels)
    blobs = list(files.values())
    region, ranges = pack_regions(blobs, len(blobs), 1 << 20)
    if stored == "fixed":
        decode, shapes = ImageDecode((96, 128, channels), "uint8", "crop"), None
    else:  # each file's own upright size, as ingest records it
        decode = ImageDecode((None, None, channels), "uint8", None)
        shapes = np.array([(*upright_size(blob), channels) for blob in blobs], np.int64)
    chunk = EncodedChunk(region, ranges, decode, ("s.zarr", "images", 0, 0), shapes)
    rng = np.random.default_rng(11)
    samples = rng.integers(0, len(blobs), 60)
    pictures = [chunk.sample_shape(int(i))[:2] for i in samples]
    flips = [(bool(k % 2), bool(k % 5 == 0)) for k in range(len(samples))]
    for size in ((24, 40), (96, 128), (7, 5)):
        boxes = _boxes_in(pictures, size, rng)
        rows = rng.permutation(len(samples))
        out = np.full((len(samples), *size, channels), 7, np.uint8)
        cut_rows([chunk], np.zeros_like(samples), samples, np.asarray(boxes, np.float64), np.array(pictures), size, out,
                 rows, np.array(flips, np.uint8))
        for k, sample in enumerate(samples):
            expected = chunk.decode_region(int(sample), boxes[k], size, np.full((*size, channels), 9, np.uint8), flips[k])
            np.testing.assert_array_equal(out[rows[k]], expected, err_msg=f"{list(files)[sample]}, box {boxes[k]}")


@built
def test_crop_each_leaves_what_decode_region_must_do_itself():
    """Other files, a file of another size than its sample's, a box past the edges by less than `ROUNDING` that
    single precision does not find inside, a picture over the pixel limit, a box of no pixels or not of numbers:
    left, their rows untouched. A box past the edges by more is cut (zeros there)."""
    files = _same_size_files(3)
    names = list(files)
    region, ranges = pack_regions(list(files.values()), len(files), 1 << 20)
    samples = np.arange(len(names))
    sizes = np.tile([96, 128], (len(names), 1))
    boxes = np.tile([8.0, 8.0, 64.0, 64.0], (len(names), 1))
    out = np.full((len(names), 32, 32, 3), 7, np.uint8)
    left = crop_plain_jpegs([region], [ranges], samples * 0, samples, sizes, boxes, out, samples,
                            np.zeros((len(names), 2), np.uint8))
    assert sorted(names[k] for k in left) == sorted(name for name in names if name not in PLAIN | TURNED | WEIGHED)
    assert all((out[k] == 7).all() for k in left) and not any((out[k] == 7).all() for k in samples if k not in left)
    plain = names.index("4:2:0")
    out[0] = 7
    for size, box, why in (((96, 127), (8, 8, 64, 64), "another size"), ((96, 128), (-1e-7, 8, 64, 64), "rounded off"),
                           ((9500, 9500), (8, 8, 64, 64), "over the pixel limit"), ((96, 128), (90, 8, 0, 64), "no rows"),
                           ((96, 128), (np.nan, 8, 64, 64), "not a number")):
        left = crop_plain_jpegs([region], [ranges], np.array([0]), np.array([plain]), np.array([size]),
                                np.array([box], np.float64), out, np.array([0]), np.zeros((1, 2), np.uint8))
        assert list(left) == [0] and (out[0] == 7).all(), why
    left = crop_plain_jpegs([region], [ranges], np.array([0]), np.array([plain]), np.array([(96, 128)]),
                            np.array([(40, 8, 64, 64)], np.float64), out, np.array([0]), np.zeros((1, 2), np.uint8))
    assert list(left) == [] and (out[0, 28:] == 0).all() and (out[0, :28] != 7).any()  # rows 96 on: zeros


def test_a_damaged_box_is_an_image_error_naming_the_file(backend):
    data = FILES["4:2:0"][0]
    truncated = data[: len(data) // 2]
    decode = ImageDecode((None, None, 3), "uint8", None)
    out = np.empty((32, 32, 3), np.uint8)
    with pytest.raises(ImageError, match="cat/broken.jpg.*cannot decode"):
        decode_region(truncated, decode, (300, 0, 75, 500), (32, 32), out, name="cat/broken.jpg")
    with pytest.raises(ImageError, match="cat/junk.jpg"):
        decode_region(b"\xff\xd8\xff" + bytes(500), decode, (0, 0, 10, 10), (32, 32), out, name="cat/junk.jpg")


@built
def test_only_the_rows_a_box_needs_are_decoded():
    """A file damaged below the box still gives the box, exact: its rows are never read (outcore verify,
    which decodes every file whole, finds the damage)."""
    data = FILES["4:2:0"][0]
    truncated = data[: int(len(data) * 0.6)]
    out = np.empty((32, 32, 3), np.uint8)
    native.extension.crop_resize(truncated, 8, (0, 0, 40, 500), out)
    np.testing.assert_array_equal(out, _reference(data, 3, 8, (0, 0, 40, 500), (32, 32), (False, False)))
    with pytest.raises(ValueError, match="Premature end"):
        native.extension.crop_resize(truncated, 8, (300, 0, 375, 500), out)


@built
@pytest.mark.parametrize(("arguments", "message"), [
    ((FILES["4:2:0"][0], 9, (0, 0, 10, 10), np.empty((4, 4, 3), np.uint8)), "scale=9"),
    ((FILES["4:2:0"][0], 8, (0, 0, 400, 10), np.empty((4, 4, 3), np.uint8)), "outside"),
    ((FILES["4:2:0"][0], 8, (0, 0, 10, 10), np.empty((4, 4, 3), np.float32)), "uint8"),
    ((FILES["4:2:0"][0], 8, (0, 0, 10, 10), np.empty((4, 4, 1), np.uint8)), "a colour JPEG asked for as grey"),
    ((_cmyk(_photo(16, 16)), 8, (0, 0, 10, 10), np.empty((4, 4, 1), np.uint8)), "not a greyscale or YCbCr JPEG"),
    ((_cmyk(_photo(16, 16)), 8, (0, 0, 10, 10), np.empty((4, 4, 3), np.uint8)), "not a YCbCr or greyscale JPEG"),
])
def test_wrong_arguments_are_value_errors(arguments, message):
    with pytest.raises(ValueError, match=message):
        native.extension.crop_resize(*arguments)


def test_resizes_give_the_same_pixels_either_way(backend):
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    out = resize_edges(pixels, (3.25, 1.5, 41.0, 66.75), (32, 24), flip=(True, False))
    image = Image.fromarray(pixels)
    columns = image.resize((24, 50), Image.Resampling.BILINEAR, box=(1.5, 0, 66.75, 50))
    expected = np.asarray(columns.resize((24, 32), Image.Resampling.BILINEAR, box=(0, 3.25, 24, 41.0)))[:, ::-1]
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(("dtype", "channels"), [("uint8", 3), ("uint8", 1), ("uint8", None), ("uint16", 4),
                                                 ("int16", None), ("float32", 3), ("float64", 2)])
def test_boxes_of_chunks_of_pixels_resized_together_are_resize_part_s(dtype, channels, backend, monkeypatch):
    """resize_rows: a run's boxes in one C call (with the extension; none left to Python), by resize's filter,
    mirrored, zeros past the pictures' edges; without it one by one: each `resize_part`'s pixels."""
    from outcore.imaging import resize, resize_part, resize_rows

    rng = np.random.default_rng(5)
    shape = (40, 50) if channels is None else (40, 50, channels)
    chunks = [rng.integers(0, 256, (3, *shape)).astype(dtype), rng.integers(0, 256, (2, *shape)).astype(dtype)]
    boxes = np.array([[3.25, 1.5, 30.0, 40.25], [0, 0, 40, 50], [8, 9, 12, 16], [-2, 0, 20, 20], [10, 40, 20, 20],
                      [0.5, 0.25, 39.5, 49.75], [-5.5, -3.25, 61.5, 80.0], [40, 0, 5, 5]])
    which, local = np.array([1, 0, 0, 1, 0, 1, 0, 1]), np.array([1, 2, 0, 0, 1, 1, 2, 0])
    rows = np.array([5, 0, 2, 1, 4, 3, 7, 6])
    flips = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 0], [1, 1], [0, 0]], np.uint8)
    out = np.full((8, 12, 16) if channels is None else (8, 12, 16, channels), 7, dtype)
    expected = np.full_like(out, 9)
    for k in range(8):
        resize_part(chunks[which[k]][local[k]], tuple(boxes[k]), (12, 16), expected[rows[k]],
                    tuple(flips[k].astype(bool).tolist()))
    if backend != "fallback":
        monkeypatch.setattr(resize, "resize_part", lambda *arguments: pytest.fail("a box left to Python"))
    resize_rows(chunks, which, local, boxes, out, rows, flips)
    np.testing.assert_array_equal(out, expected)
    assert (out[rows[7]] == 0).all() and (out[rows[6]] == 0).any() and (out[rows[6]] != 0).any()
    monkeypatch.undo()
    for box in ([-5, 0, 0, 20], [np.nan, 0, 20, 20]):  # not boxes: refused, named, not zeros
        with pytest.raises(OptionError, match="positive height"):
            resize_rows(chunks, which[:1], local[:1], np.array([box]), out, rows[:1], flips[:1])


@pytest.mark.parametrize(("dtype", "channels"), [("uint16", None), ("uint8", 3), ("float32", 2)])
def test_pictures_of_their_own_sizes_resized_together_are_resize_part_s(dtype, channels, backend, monkeypatch):
    """resize_spans: pictures of their own sizes one after the other in their chunks' values (a raster field's rows),
    a run's boxes in one C call (none left to Python with the extension), inside and past the edges, mirrored; each
    `resize_part`'s pixels either way. A picture past its chunk's end is an IndexError, not a read past it."""
    from outcore.imaging import resize, resize_part, resize_spans

    rng = np.random.default_rng(12)
    depth = () if channels is None else (channels,)
    shapes = [[(30, 40), (17, 23), (40, 12)], [(25, 25), (9, 31)]]
    chunks = [rng.integers(0, 250, (sum(h * w for h, w in pictures), *depth)).astype(dtype) for pictures in shapes]
    which = np.array([0, 0, 0, 1, 1, 0, 1])
    local = np.array([0, 1, 2, 0, 1, 1, 1])
    starts = np.array([sum(h * w for h, w in shapes[c][:i]) for c, i in zip(which, local, strict=True)])
    sizes = np.array([shapes[c][i] for c, i in zip(which, local, strict=True)])
    boxes = np.array([[3.25, 1.5, 20.0, 30.25], [0, 0, 17, 23], [-4, 2, 30, 8], [5, 5, 10, 10], [0.5, 0.5, 8.0, 30.0],
                      [-3.5, -2.25, 25.5, 30.0], [2, 40, 5, 5]])
    flips = rng.integers(0, 2, (7, 2)).astype(np.uint8)
    rows = np.array([6, 0, 3, 1, 5, 2, 4])
    out = np.full((7, 12, 16, *depth), 7, dtype)
    expected = np.full_like(out, 9)
    for k in range(7):
        picture = chunks[which[k]][starts[k] : starts[k] + sizes[k, 0] * sizes[k, 1]].reshape(*sizes[k], *depth)
        resize_part(picture, tuple(boxes[k]), (12, 16), expected[rows[k]], tuple(flips[k].astype(bool).tolist()))
    if backend != "fallback":
        monkeypatch.setattr(resize, "resize_part", lambda *arguments: pytest.fail("a box left to Python"))
    resize_spans(chunks, which, starts, sizes, boxes, out, rows, flips)
    np.testing.assert_array_equal(out, expected)
    assert (out[rows[6]] == 0).all()  # wholly past its picture's right edge
    if backend != "fallback":
        with pytest.raises(IndexError, match="out of range"):
            resize_spans(chunks, which[:1], starts[:1] + 1100, sizes[:1], boxes[:1], out, rows[:1], flips[:1])


def test_pictures_in_another_byte_order_are_resized_by_python_alike():
    """Big-endian samples are not the C call's: left to `resize_part`, which gives the native pictures' pixels."""
    from outcore.imaging import resize_rows

    pictures = (np.random.default_rng(6).random((2, 30, 40, 3)) * 60000).astype(np.uint16)
    boxes, flips = np.array([[2.5, 3.25, 20.0, 30.5], [-4, 1, 30, 30]]), np.array([[1, 0], [0, 1]], np.uint8)
    native_out, swapped_out = np.zeros((2, 12, 16, 3), np.uint16), np.zeros((2, 12, 16, 3), ">u2")
    for chunks, out in (([pictures], native_out), ([pictures.astype(">u2")], swapped_out)):
        resize_rows(chunks, np.zeros(2, np.int64), np.arange(2), boxes, out, np.arange(2), flips)
    np.testing.assert_array_equal(swapped_out, native_out)
    assert native_out.any()


def test_an_epoch_of_16_bit_pictures_is_the_same_without_the_extension(tmp_path, monkeypatch):
    """RandomResizedCrop and a flip of uint16 pictures through `ds.batches` (made with the batch: one C call a run
    with the extension), the same batches as Pillow's passes make without it."""
    import outcore
    from outcore.transforms import Compose, RandomFlip, RandomResizedCrop

    pictures = (np.random.default_rng(7).random((24, 30, 40, 3)) * 65535).astype(np.uint16)
    ds = outcore.from_arrays({"images": pictures, "labels": np.arange(24) % 3}, tmp_path / "deep.zarr", chunk_size=8,
                             progress=False)
    options = {"seed": 4, "transform": Compose([RandomResizedCrop((16, 20)), RandomFlip()])}
    made = [batch["images"] for batch in ds.batches(8, **options)]
    monkeypatch.setattr(native, "extension", None)
    again = [batch["images"] for batch in ds.batches(8, **options)]
    assert [batch.dtype for batch in made] == [np.uint16] * 3 and made[0].shape == (8, 16, 20, 3)
    for one, other in zip(made, again, strict=True):
        np.testing.assert_array_equal(one, other)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "float32"])
@pytest.mark.parametrize("channels", [3, None])
def test_a_batch_s_boxes_resized_on_the_pool_are_resize_part_s(dtype, channels, backend):
    """resize_boxes (a crop applied to a batch, not fused with its making): in runs on the pool, each a C call with
    the extension, one by one without; every picture's box, inside or past its edges, mirrored or not, as `resize_part`
    resizes it alone."""
    from outcore.imaging import resize_boxes, resize_part

    rng = np.random.default_rng(8)
    shape = (30, 40) if channels is None else (30, 40, channels)
    images = (rng.random((40, *shape)) * 250).astype(dtype)
    boxes = np.column_stack([rng.uniform(-12, 20, 40), rng.uniform(-12, 25, 40), rng.uniform(4, 50, 40),
                             rng.uniform(4, 60, 40)])
    boxes[::5] = np.round(boxes[::5])
    flips = rng.integers(0, 2, (40, 2)).astype(np.uint8)
    out = resize_boxes(images, boxes, (16, 20), flips)
    assert out.shape == (40, 16, 20, *shape[2:]) and out.dtype == images.dtype
    for k in range(40):
        expected = np.full((16, 20, *shape[2:]), 7, images.dtype)
        resize_part(images[k], tuple(boxes[k].tolist()), (16, 20), expected, tuple(flips[k].astype(bool).tolist()))
        np.testing.assert_array_equal(out[k], expected, err_msg=f"box {boxes[k]}")


@pytest.mark.parametrize(("size", "need", "eighths"), [
    ((375, 500), (47, 63), 1), ((375, 500), (48, 63), 2), ((375, 500), (94, 1), 2), ((375, 500), (95, 1), 4),
    ((375, 500), (188, 250), 4), ((375, 500), (189, 1), 8), ((375, 500), (375, 500), 8), ((7, 500), (1, 1), 8),
])
def test_dct_scales_are_the_fast_ones(size, need, eighths):
    assert dct_scale(size, need) == eighths


def _has_libjpeg_headers() -> bool:
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--exists", "libjpeg"], check=False)
        if found.returncode == 0:
            return True
    return any(Path(folder, "jpeglib.h").exists() for folder in ("/usr/include", "/usr/local/include"))


@pytest.mark.skipif(not _has_libjpeg_headers() or not shutil.which("cc") or os.environ.get(native.ENVIRONMENT) == "0",
                    reason="no libjpeg-turbo headers or no C compiler here (or OUTCORE_NATIVE=0): no extension")
def test_the_install_builds_the_extension_where_it_can():
    """Where libjpeg-turbo's headers and a compiler are, ``pip install`` builds the extension: a silently
    failed build would fall back to the slower path unnoticed."""
    assert native.extension is not None, native.backend()
    assert native.backend().startswith("C extension (libjpeg-turbo")


SETUP = Path(__file__).resolve().parent.parent / "setup.py"


def _setuptools_major() -> int:
    """The major version of the setuptools installed here (0 without one): pyproject.toml asks for 77+."""
    found = subprocess.run([sys.executable, "-c", "import setuptools; print(setuptools.__version__)"],
                           capture_output=True, text=True, check=False)
    return int(found.stdout.split(".")[0]) if found.returncode == 0 else 0


@pytest.mark.skipif(not SETUP.exists() or _setuptools_major() < 77,
                    reason="no setup.py here (not a source checkout), or no setuptools 77+ to build with")
def test_an_install_without_a_working_compiler_goes_on_without_the_extension(tmp_path):
    """A failed build of the extension is reported and skipped: the install itself succeeds."""
    built = subprocess.run(
        [sys.executable, str(SETUP), "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "temp")],
        cwd=SETUP.parent, env=_without_native_switch(CC="false"), capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    assert "outcore.imaging._jpeg was not built" in built.stderr
    assert not list((tmp_path / "lib").rglob("_jpeg*"))


def _without_native_switch(**settings: str) -> dict[str, str]:
    """This process's environment with ``settings``, less ``OUTCORE_NATIVE`` (which would skip the build)."""
    return {**{k: v for k, v in os.environ.items() if k != native.ENVIRONMENT}, **settings}


class _Unloadable:
    """A finder that makes the extension fail to load, as a build whose libjpeg has gone would."""

    def find_spec(self, name, path=None, target=None):
        if name == "outcore.imaging._jpeg":
            raise ImportError("libjpeg.so.62: cannot open shared object file")


def test_an_extension_that_cannot_load_is_a_named_warning(monkeypatch):
    monkeypatch.delenv(native.ENVIRONMENT, raising=False)
    monkeypatch.delitem(sys.modules, "outcore.imaging._jpeg", raising=False)
    monkeypatch.delattr(sys.modules["outcore.imaging"], "_jpeg", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Unloadable(), *sys.meta_path])
    try:
        with pytest.warns(OutcoreWarning, match="built but cannot load.*libjpeg.so.62.*reinstall"):
            importlib.reload(native)
        assert native.extension is None and "cannot load" in native.backend()
    finally:
        monkeypatch.undo()
        importlib.reload(native)


def test_an_extension_that_was_not_built_is_said_so_without_a_warning(monkeypatch):
    """A source tree used without building (no compiler, or not installed): "not built", what building
    needs, and no warning (before: "built but cannot load (cannot import name '_jpeg' ...)")."""
    real = importlib.util.find_spec
    monkeypatch.delenv(native.ENVIRONMENT, raising=False)
    monkeypatch.delitem(sys.modules, "outcore.imaging._jpeg", raising=False)
    monkeypatch.delattr(sys.modules["outcore.imaging"], "_jpeg", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, package=None: None if name == "outcore.imaging._jpeg" else real(name, package))
    try:
        importlib.reload(native)  # a warning would be an error here
        assert native.extension is None
        assert native.backend() == ("simplejpeg and Pillow (not built: building it needs libjpeg-turbo's headers and "
                                    "a C compiler at install (see setup.py))")
    finally:
        monkeypatch.undo()
        importlib.reload(native)
