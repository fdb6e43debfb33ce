"""Plain PNGs decoded by the C extension (`_png.h`) against Pillow's decoding of the same files: the same pixels in a
run's decodes and crops, the survey's check and `decode_image`, and every other PNG left to Pillow, which names what
is wrong with a damaged one.

The files are Pillow's own and PNGs written here chunk by chunk (`png_file`), so that every row filter, IDATs split
anywhere and the chunks Pillow ignores or refuses are all met.
"""

from __future__ import annotations

import io
import itertools
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

import outcore
from outcore.errors import ImageError
from outcore.format import ImageDecode
from outcore.format.encoded import pack_regions
from outcore.imaging import EncodedChunk, native
from outcore.imaging.decode import (
    crop_plain_jpegs,
    decode_image,
    decoded_size,
    plain_jpeg_files,
    plain_jpeg_sizes,
    png_header,
    stored_frame,
)
from outcore.imaging.label_maps import Paired, decode_label_map, label_map_dtype
from outcore.imaging.synthetic import sample_photo
from outcore.transforms import Compose, RandomCrop, RandomFlip, RandomResizedCrop

with_zlib = pytest.mark.skipif(not getattr(native.extension, "ZLIB", ""),
                               reason=f"the C extension is not here, or was built without zlib: {native.backend()}")


def chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    """A PNG chunk: its length, its type, its body and the CRC of type and body (or ``crc``)."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) if crc is None else crc)


ADAM7 = ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1))  # top,
# left, down, across: an interlaced PNG's passes


def png_file(pixels: np.ndarray, filters: list[int] | None = None, *, idat_size: int = 1 << 20,
             before: tuple[bytes, ...] = (), after: tuple[bytes, ...] = (), interlace: int = 0,
             palette: np.ndarray | None = None, bits: int = 8) -> bytes:
    """A PNG of ``pixels`` ((h, w) or (h, w, samples): grey, grey and alpha, RGB or RGBA; uint8, or uint16 for 16 bits
    a sample; with a ``palette`` ((n, 3) uint8), (h, w) indices into it; (h, w) of ``bits`` 1, 2 or 4, packed), each
    row filtered by its entry of ``filters`` (0-4; cycling through them all by default), with ``interlace`` 1 in
    Adam7's seven passes (each filtered as a picture of its own), its zlib stream in IDATs of ``idat_size`` bytes, the
    chunks ``before`` between IHDR and the IDATs and ``after`` between them and IEND."""
    height, width = pixels.shape[:2]
    samples = 1 if pixels.ndim == 2 else pixels.shape[2]
    wide = pixels.dtype == np.uint16
    passes = [pixels[top::down, left::across] for top, left, down, across in ADAM7] if interlace else [pixels]
    stream = zlib.compress(b"".join(_filtered(part, filters, bits) for part in passes if part.size), 6)
    colour = 3 if palette is not None else {1: 0, 2: 4, 3: 2, 4: 6}[samples]
    header = struct.pack(">IIBBBBB", width, height, 16 if wide else bits, colour, 0, 0, interlace)
    before = before if palette is None else (chunk(b"PLTE", palette.astype(np.uint8).tobytes()), *before)
    idats = [chunk(b"IDAT", stream[at : at + idat_size]) for at in range(0, len(stream), idat_size)]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + b"".join(before) + b"".join(idats) + b"".join(after)
            + chunk(b"IEND", b""))


def _filtered(pixels: np.ndarray, filters: list[int] | None, bits: int) -> bytes:
    """``pixels``' rows as a PNG's zlib stream holds them (`png_file`): packed, each its filter's byte and its bytes
    filtered."""
    height = pixels.shape[0]
    samples = 1 if pixels.ndim == 2 else pixels.shape[2]
    wide = pixels.dtype == np.uint16
    depth = samples * (2 if wide else 1)  # bytes a pixel, as the filters count them
    if bits < 8:  # each row's values packed from the high bits, the last byte's rest zeros
        rows = np.packbits(np.unpackbits(pixels.astype(np.uint8)[..., None], axis=-1)[..., 8 - bits:].reshape(height, -1),
                           axis=1).astype(np.int64)
    else:
        rows = np.frombuffer(pixels.astype(">u2" if wide else np.uint8).tobytes(), np.uint8)
        rows = rows.reshape(height, -1).astype(np.int64)
    filtered = bytearray()
    for y in range(height):
        kind = (filters or [0, 1, 2, 3, 4])[y % len(filters or [0, 1, 2, 3, 4])]
        row, above = rows[y], rows[y - 1] if y else np.zeros_like(rows[y])
        left = np.concatenate([np.zeros(depth, np.int64), row[:-depth]])
        corner = np.concatenate([np.zeros(depth, np.int64), above[:-depth]])
        if kind == 4:
            p = left + above - corner
            pa, pb, pc = abs(p - left), abs(p - above), abs(p - corner)
            predicted = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, above, corner))
        else:
            predicted = [np.zeros_like(row), left, above, (left + above) // 2][kind]
        filtered += bytes([kind]) + ((row - predicted) % 256).astype(np.uint8).tobytes()
    return bytes(filtered)


def pillow_png(pixels: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", **options)
    return buffer.getvalue()


def decoded_together(files: list[bytes], shape: tuple[int, ...]) -> tuple[np.ndarray, list[int]]:
    """The files decoded by one `decode_each` call into rows of ``shape`` (7s where a file was left), and the positions
    it left."""
    region, ranges = pack_regions(files, len(files), 1 << 22)
    out = np.full((len(files), *shape), 7, np.uint8)
    left = native.extension.decode_each([region], [ranges], np.zeros(len(files), np.int64), np.arange(len(files)),
                                        out, np.arange(len(files)))
    return out, list(left)


def photo(channels: int, size: tuple[int, int] = (37, 53), at: int = 0) -> np.ndarray:
    """A part of a photograph of ``size`` (h, w), from ``at`` pixels down and across: RGB, or grey for 1 channel."""
    pixels = np.ascontiguousarray(sample_photo("astronaut")[at : at + 4 * size[0] : 4, at : at + 4 * size[1] : 4])
    return pixels if channels == 3 else np.asarray(Image.fromarray(pixels).convert("L"))


@with_zlib
@pytest.mark.parametrize("channels", [3, 1])
def test_plain_pngs_are_pillow_s_pixels_whatever_their_filters_and_idats(channels):
    """Every row filter alone and mixed, IDATs of 1 byte to the whole stream, Pillow's own files (compressed or
    not, optimised): decoded together in C, the pixels Pillow gives, which are the pictures'."""
    pixels = photo(channels)
    files = [png_file(pixels, [kind]) for kind in range(5)]
    files += [png_file(pixels, idat_size=size) for size in (1, 7, 1000)]
    files += [pillow_png(pixels, compress_level=level, optimize=optimize) for level in (0, 6, 9)
              for optimize in (False, True)]
    shape = pixels.shape if channels == 3 else (*pixels.shape, 1)
    out, left = decoded_together(files, shape)
    assert left == []
    for k, data in enumerate(files):
        np.testing.assert_array_equal(out[k], decode_image(data, shape, "crop", np.dtype("uint8")), err_msg=str(k))
        np.testing.assert_array_equal(out[k].reshape(pixels.shape), pixels)


@with_zlib
def test_chunks_pillow_passes_over_are_passed_over():
    """Text, gamma, colour profile, physical size, transparency and a private chunk, before or after the pixels, and
    bytes after IEND: the pixels decoded as Pillow decodes them, whatever those chunks say."""
    pixels = photo(3)
    extra = (chunk(b"tEXt", b"Comment\x00made here"), chunk(b"gAMA", struct.pack(">I", 45455)),
             chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1)), chunk(b"tRNS", struct.pack(">HHH", 1, 2, 3)),
             chunk(b"prVt", b"\x01\x02"), chunk(b"iCCP", b"none\x00\x00" + zlib.compress(b"not a profile")))
    files = [png_file(pixels, before=extra), png_file(pixels, after=extra), png_file(pixels) + b"trailing bytes"]
    out, left = decoded_together(files, pixels.shape)
    assert left == []
    for k, data in enumerate(files):
        np.testing.assert_array_equal(out[k], decode_image(data, pixels.shape, "crop", np.dtype("uint8")))


KINDS = {  # a plain PNG's samples a pixel and bits a sample -> the channels it is decoded to in C
    "grey": (1, 8, (1, 3)), "grey and alpha": (2, 8, (1, 3)), "rgb": (3, 8, (3,)), "rgba": (4, 8, (3, 4)),
    "16-bit grey": (1, 16, (1,)), "16-bit rgb": (3, 16, (3,)), "16-bit rgba": (4, 16, (3, 4)),
}


@with_zlib
@pytest.mark.parametrize("kind", list(KINDS))
def test_pngs_of_16_bits_and_with_alpha_are_pillow_s_pixels(kind, monkeypatch):
    """Each colour type and depth decoded in C, every row filter, to each number of channels Pillow converts it to
    without arithmetic: the pixels `decode_image` gives through Pillow (alpha dropped, 16-bit samples cut to their
    high byte for RGB, grey repeated for RGB; 16-bit grey kept in 16 bits, or rounded to 8 as a uint16 picture is),
    for uint8 and uint16 samples, at their own size and fitted; in a run's rows (`decode_each`) too."""
    samples, depth, channels = KINDS[kind]
    rng = np.random.default_rng(samples * depth)
    noise = rng.integers(0, 1 << depth, (19, 23, samples)).astype(np.uint16 if depth == 16 else np.uint8)
    smooth = np.dstack([photo(3, (19, 23), at=8 * k)[..., k % 3] for k in range(samples)]).astype(noise.dtype)
    pictures = [noise, smooth * (257 if depth == 16 else 1)]
    files = [png_file(picture[..., 0] if samples == 1 else picture, [kind_]) for picture in pictures
             for kind_ in range(5)] + [png_file(pictures[1], idat_size=9)]
    cases = [((None, None, c), None, dtype) for c in channels for dtype in ("uint8", "uint16")]
    cases += [((13, 17, c), "crop", dtype) for c in channels for dtype in ("uint8", "uint16")]
    from outcore.imaging import decode

    got = {}
    monkeypatch.setattr(decode, "_opened", lambda *arguments: pytest.fail("Pillow opened a plain PNG"))
    for k, data in enumerate(files):
        for shape, resize, dtype in cases:
            got[k, shape, dtype] = decode_image(data, shape, resize, np.dtype(dtype))
    for c in (c for c in channels if c != 4):  # a run's rows are of 1 or 3 channels
        out, left = decoded_together(files, (19, 23, c))
        assert left == []
        for k in range(len(files)):
            np.testing.assert_array_equal(out[k], got[k, (None, None, c), "uint8"])
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    for (k, shape, dtype), pixels in got.items():
        expected = decode_image(files[k], shape, "crop" if shape[0] else None, np.dtype(dtype))
        assert pixels.dtype == expected.dtype and pixels.shape == expected.shape
        np.testing.assert_array_equal(pixels, expected, err_msg=f"file {k}, {shape}, {dtype}")


def test_a_png_s_size_and_kind_are_read_from_its_header_as_pillow_opens_it(monkeypatch):
    """`png_header` (no Pillow): each colour type and depth's size, upright, and the kind of paired picture it makes
    (`Paired.of`), as Pillow opening the file says; a file with an orientation (or what Pillow takes for one) or an
    animation before its pixels, or that ends before them, left to Pillow."""
    from outcore.imaging import label_maps

    pixels = photo(3, (9, 13))
    files, kinds = {}, {}
    for name, (samples, depth, _) in KINDS.items():
        picture = pixels[..., :1] if samples < 3 else np.dstack([pixels, pixels[..., :1]])[..., :samples]
        picture = np.dstack([picture] * 2)[..., :samples] if samples == 2 else picture
        picture = picture.astype(np.uint16 if depth == 16 else np.uint8)
        data = png_file(picture[..., 0] if samples == 1 else picture)
        assert png_header(data) == (9, 13, depth, [0, 4, 2, 6][samples - 1]), name
        assert stored_frame(data) == ((9, 13), 1)
        files[name], kinds[name] = data, Paired.of("p.png", data)
    for bits in (1, 2, 4, 8):  # a palette's, and grey of fewer bits
        for name, palette in ((f"{bits}-bit palette", np.zeros((1 << bits, 3))), (f"{bits}-bit grey", None)):
            data = png_file(np.ones((9, 13), np.uint8), palette=palette, bits=bits)
            assert png_header(data) == (9, 13, bits, 0 if palette is None else 3), name
            files[name], kinds[name] = data, Paired.of("p.png", data)
    monkeypatch.setattr(label_maps, "png_header", lambda data: None)  # Pillow opens every file
    assert {name: Paired.of("p.png", data) for name, data in files.items()} == kinds
    turned = {"exif": png_file(pixels, before=(chunk(b"eXIf", _turned()),)),
              "exif text": png_file(pixels, before=(chunk(b"iTXt", b"exif\x00\x00\x00\x00\x00abc"),)),
              "animated": png_file(pixels, before=(chunk(b"acTL", struct.pack(">II", 1, 0)),)),
              "cut": png_file(pixels)[:37], "jpeg": b"\xff\xd8\xff\xe0" + bytes(40)}
    assert {name: png_header(data) for name, data in turned.items()} == dict.fromkeys(turned)
    assert stored_frame(pillow_png(pixels, exif=_turned())) == ((13, 9), 6)  # Pillow's, turned


def _pillow_palette(ids: np.ndarray, **options) -> bytes:
    """Pillow's palette PNG of ``ids`` (a palette of 256 random colours)."""
    return _pillow_colours(ids, np.random.default_rng(1).integers(0, 256, (256, 3)), **options)


@with_zlib
def test_label_maps_of_plain_pngs_are_decoded_in_c_as_pillow_gives_their_ids(monkeypatch):
    """A palette's indices (Pascal VOC), an 8-bit grey file's values (Cityscapes' labelIds), a 16-bit one's
    (instanceIds): decoded in C without Pillow, every row filter, Pillow's files too (a palette with transparency),
    the ids Pillow gives, of the dtype it gives; any other file, and a damaged one, left to Pillow, which words its
    error as before."""
    from outcore.imaging import label_maps

    rng = np.random.default_rng(4)
    ids8 = rng.integers(0, 22, (21, 27)).astype(np.uint8)
    ids8[3:9, 4:12] = 255  # void
    ids16 = (rng.integers(0, 40, (21, 27)) * 1000 + 7).astype(np.uint16)
    palette = rng.integers(0, 256, (256, 3))
    files = {f"palette {k}": png_file(ids8, [k], palette=palette) for k in range(5)}
    files |= {f"grey {k}": png_file(ids8, [k]) for k in range(5)} | {f"16-bit {k}": png_file(ids16, [k]) for k in range(5)}
    files |= {"pillow's palette": _pillow_palette(ids8), "with transparency": _pillow_palette(ids8, transparency=255),
              "pillow's 16-bit": pillow_png(ids16), "pillow's grey": pillow_png(ids8, optimize=True),
              "interlaced palette": png_file(ids8, interlace=1, palette=palette),
              "16-bit interlaced": png_file(ids16, interlace=1)}
    monkeypatch.setattr(label_maps, "_ids_image", lambda *arguments: pytest.fail("Pillow opened a plain PNG of ids"))
    got = {name: (label_map_dtype(data, name), decode_label_map(data, name, np.dtype("uint16"))) for name, data in
           files.items()}
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    for name, (dtype, ids) in got.items():
        assert dtype == label_map_dtype(files[name], name), name
        expected = decode_label_map(files[name], name, np.dtype("uint16"))
        np.testing.assert_array_equal(ids, expected, err_msg=name)
        np.testing.assert_array_equal(ids, ids16 if "16" in name else ids8, err_msg=name)
    monkeypatch.undo()
    truncated = files["palette 0"][:60]
    others = {"rgb": png_file(photo(3)), "truncated": truncated}
    assert [name for name, data in others.items() if label_maps._decoded_ids(data) is None] == list(others)
    for data, error in ((others["rgb"], "colours"), (truncated, "m.png: ")):
        with pytest.raises(ImageError, match=error):
            decode_label_map(data, "m.png", np.dtype("uint8"))


@with_zlib
@pytest.mark.parametrize("bits", [1, 2, 4])
def test_label_maps_of_fewer_bits_are_decoded_in_c_as_pillow_gives_their_ids(bits, monkeypatch):
    """A palette of 2, 4 or 16 entries, which Pillow saves in 1, 2 or 4 bits (the mask of a few classes), and grey of
    1 bit (Pillow's mode 1: ids 0 and 1), 2 or 4 (its mode L: scaled to 0-255): decoded in C without Pillow, every row
    filter, rows that end inside a byte, the ids Pillow gives, of the dtype it gives."""
    from outcore.imaging import label_maps

    rng = np.random.default_rng(bits)
    ids = rng.integers(0, 1 << bits, (13, 21)).astype(np.uint8)
    palette = rng.integers(0, 256, (1 << bits, 3))
    files = {f"palette {k}": png_file(ids, [k], palette=palette, bits=bits) for k in range(5)}
    files |= {f"grey {k}": png_file(ids, [k], bits=bits) for k in range(5)}
    files["pillow's palette"] = _pillow_palette(ids, bits=bits)
    if bits == 1:
        files["pillow's mode 1"] = pillow_png(ids.astype(bool))
    assert {png_header(data)[2] for data in files.values()} == {bits}
    monkeypatch.setattr(label_maps, "_ids_image", lambda *arguments: pytest.fail("Pillow opened a plain PNG of ids"))
    got = {name: (label_map_dtype(data, name), decode_label_map(data, name, np.dtype("uint8"))) for name, data in
           files.items()}
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    scaled = ids * (1 if bits == 1 else 255 // ((1 << bits) - 1))  # Pillow's mode L of 2 or 4 bits
    for name, (dtype, decoded) in got.items():
        assert dtype == label_map_dtype(files[name], name) == np.uint8, name
        np.testing.assert_array_equal(decoded, decode_label_map(files[name], name, np.dtype("uint8")), err_msg=name)
        np.testing.assert_array_equal(decoded, scaled if name.startswith("grey") else ids, err_msg=name)


def _pillow_colours(indices: np.ndarray, palette: np.ndarray, **options) -> bytes:
    """Pillow's palette PNG of ``indices`` into ``palette`` ((n, 3))."""
    image = Image.fromarray(indices, mode="P")
    image.putpalette(palette.astype(np.uint8).tobytes())
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


@with_zlib
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_palettes_and_grey_of_fewer_bits_are_pillow_s_pixels(bits, monkeypatch):
    """A palette's colours of 1 to 8 bits (RGB; RGBA with its transparency, tRNS, of fewer entries than the palette or
    as many) and grey of 1, 2 or 4 bits (scaled to 0-255 as Pillow's modes 1 and L give it; repeated for RGB), every row
    filter, rows that end inside a byte, Pillow's own files: decoded in C without Pillow, the pixels `decode_image`
    gives through Pillow, at their own size and fitted, for uint8 and uint16 samples; in a run's rows (`decode_each`)
    too."""
    from outcore.imaging import decode

    rng = np.random.default_rng(bits)
    indices = rng.integers(0, 1 << bits, (19, 23)).astype(np.uint8)
    palette = rng.integers(0, 256, (1 << bits, 3))
    alpha = rng.integers(0, 256, 1 << bits).astype(np.uint8).tobytes()
    colours = [png_file(indices, [k], palette=palette, bits=bits) for k in range(5)]
    colours += [png_file(indices, palette=palette, bits=bits, before=(chunk(b"tRNS", alpha[: len(alpha) // 2 or 1]),)),
                png_file(indices, palette=palette, bits=bits, before=(chunk(b"tRNS", alpha),)),
                _pillow_colours(indices, palette, bits=bits), _pillow_colours(indices, palette, transparency=0)]
    greys = [png_file(indices, [k], bits=bits) for k in range(5)] if bits < 8 else []
    greys += [pillow_png(indices.astype(bool))] if bits == 1 else []
    files = [(data, (3, 4)) for data in colours] + [(data, (1, 3)) for data in greys]
    cases = [((size, size2, c), resize, dtype) for size, size2, resize in ((None, None, None), (13, 17, "crop"))
             for dtype in ("uint8", "uint16") for c in (1, 3, 4)]
    monkeypatch.setattr(decode, "_opened", lambda *arguments: pytest.fail("Pillow opened a plain PNG"))
    got = {(k, shape, dtype): decode_image(data, shape, resize, np.dtype(dtype)) for k, (data, channels) in
           enumerate(files) for shape, resize, dtype in cases if shape[2] in channels}
    for c in {1, 3} & {c for _, channels in files for c in channels}:  # a run's rows are of 1 or 3 channels
        some = [k for k, (_, channels) in enumerate(files) if c in channels]
        out, left = decoded_together([files[k][0] for k in some], (19, 23, c))
        assert left == []
        for row, k in enumerate(some):
            np.testing.assert_array_equal(out[row], got[k, (None, None, c), "uint8"], err_msg=str(k))
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    with warnings.catch_warnings():  # Pillow's, converting a palette whose transparency is in bytes to RGB
        warnings.simplefilter("ignore", UserWarning)
        for (k, shape, dtype), pixels in got.items():
            expected = decode_image(files[k][0], shape, "crop" if shape[0] else None, np.dtype(dtype))
            assert pixels.dtype == expected.dtype and pixels.shape == expected.shape
            np.testing.assert_array_equal(pixels, expected, err_msg=f"file {k}, {shape}, {dtype}")
    np.testing.assert_array_equal(got[0, (None, None, 3), "uint8"], palette[indices])


def _turned() -> bytes:
    """EXIF holding orientation 6 (stored turned a quarter)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return exif.tobytes()


@with_zlib
@pytest.mark.parametrize("size", [(37, 53), (1, 1), (1, 9), (9, 1), (3, 2), (8, 8), (17, 6)])
def test_interlaced_pngs_are_pillow_s_pixels(size, monkeypatch):
    """Adam7's seven passes, each filtered as a picture of its own (every filter), some empty in pictures smaller
    than 8 pixels a side: each kind decoded in C without Pillow (RGB, RGBA, grey, 16-bit grey, a palette's colours,
    grey of 1 bit), the pixels `decode_image` gives through Pillow, which are the pictures'; in a run's rows
    (`decode_each`) and boxes (`crop_each`) too; a label map's ids."""
    from outcore.imaging import decode

    rng = np.random.default_rng(size[0] * 100 + size[1])
    rgb = rng.integers(0, 256, (*size, 3)).astype(np.uint8)
    indices = rng.integers(0, 4, size).astype(np.uint8)
    palette = rng.integers(0, 256, (4, 3))
    kinds = {"rgb": (png_file(rgb, interlace=1), 3, rgb), "rgba": (png_file(np.dstack([rgb, rgb[..., :1]]), interlace=1),
                                                                    3, rgb),
             "grey": (png_file(rgb[..., 1], [4], interlace=1), 1, rgb[..., 1:2]),
             "16-bit grey": (png_file(rgb[..., 2].astype(np.uint16) * 257 + 1, [1], interlace=1), 1, None),
             "palette": (png_file(indices, [2], interlace=1, palette=palette), 3, palette[indices]),
             "1-bit grey": (png_file(indices % 2, [3], interlace=1, bits=1), 1, (indices % 2 * 255)[..., None])}
    monkeypatch.setattr(decode, "_opened", lambda *arguments: pytest.fail("Pillow opened a plain PNG"))
    got = {name: decode_image(data, (None, None, channels), None, np.dtype("uint8")) for name, (data, channels, _)
           in kinds.items()}
    deep = decode_image(kinds["16-bit grey"][0], (None, None, 1), None, np.dtype("uint16"))
    for channels in (1, 3):
        names = [name for name, (_, c, _) in kinds.items() if c == channels]
        out, left = decoded_together([kinds[name][0] for name in names], (*size, channels))
        assert left == []
        region, ranges = pack_regions([kinds[name][0] for name in names], len(names), 1 << 16)
        every, cut = np.arange(len(names)), np.zeros((len(names), *size, channels), np.uint8)
        assert list(crop_plain_jpegs([region], [ranges], np.zeros(len(names)), every, np.array([size] * len(names)),
                                     np.array([[0, 0, *size]] * len(names)), cut, every,
                                     np.zeros((len(names), 2), np.uint8))) == []  # boxes of the whole pictures
        for row, name in enumerate(names):
            np.testing.assert_array_equal(out[row], got[name], err_msg=name)
            np.testing.assert_array_equal(cut[row], got[name], err_msg=name)
    ids = decode_label_map(kinds["palette"][0], "m.png", np.dtype("uint8"))
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    for name, (data, channels, pixels) in kinds.items():
        np.testing.assert_array_equal(got[name], decode_image(data, (None, None, channels), None, np.dtype("uint8")),
                                      err_msg=name)
        if pixels is not None:
            np.testing.assert_array_equal(got[name], pixels, err_msg=name)
    np.testing.assert_array_equal(deep[..., 0], rgb[..., 2].astype(np.uint16) * 257 + 1)
    np.testing.assert_array_equal(ids, indices)


@with_zlib
def test_files_read_and_decoded_in_one_call_are_each_as_decoded_alone(tmp_path):
    """`decode_png_files`: files read whole and decoded into their arrays in one call, as `decode_png` decodes each
    (label maps' ids, or pixels); those it cannot decode left, by position: a missing file, a record's reference, a
    map of another size, colours as ids, 8-bit ids into 16-bit rows, a file that is not a PNG."""
    rng = np.random.default_rng(6)
    ids8, ids16 = rng.integers(0, 256, (9, 11)).astype(np.uint8), rng.integers(0, 65536, (9, 11)).astype(np.uint16)
    rgba = rng.integers(0, 256, (9, 11, 4)).astype(np.uint8)
    palette = rng.integers(0, 256, (256, 3))
    files = {"palette": png_file(ids8, palette=palette), "grey": png_file(ids8),
             "deep": png_file(ids16), "rgba": png_file(rgba), "jpeg": b"\xff\xd8\xff" + bytes(60)}
    for name, data in files.items():
        (tmp_path / f"{name}.png").write_bytes(data)
    path = {name: str(tmp_path / f"{name}.png") for name in files}
    asked = [(path["palette"], np.uint8, (9, 11)), (path["grey"], np.uint8, (9, 11)), (path["deep"], np.uint16, (9, 11)),
             (str(tmp_path / "gone.png"), np.uint8, (9, 11)), (path["palette"] + "::0", np.uint8, (9, 11)),
             (path["grey"], np.uint8, (9, 12)), (path["rgba"], np.uint8, (9, 11)), (path["grey"], np.uint16, (9, 11)),
             (path["jpeg"], np.uint8, (9, 11))]
    outs = [np.zeros(shape, dtype) for _, dtype, shape in asked]
    left = native.extension.decode_png_files([p for p, _, _ in asked], outs, True)
    assert list(left) == [3, 4, 5, 6, 7, 8]
    for k in (0, 1, 2):
        np.testing.assert_array_equal(outs[k], decode_label_map(files[("palette", "grey", "deep")[k]], "m", outs[k].dtype))
    pixels = [np.zeros((9, 11, 3), np.uint8), np.zeros((9, 11, 1), np.uint16), np.zeros((9, 11, 4), np.uint8)]
    assert list(native.extension.decode_png_files([path["rgba"], path["deep"], path["palette"]], pixels)) == []
    np.testing.assert_array_equal(pixels[0], rgba[..., :3])
    np.testing.assert_array_equal(pixels[1][..., 0], ids16)
    np.testing.assert_array_equal(pixels[2], np.dstack([palette[ids8], np.full(ids8.shape, 255)]))  # opaque: no tRNS
    kinds = [np.zeros((9, 11, 1), np.uint16), np.zeros((9, 11, 3), np.uint8), np.zeros((9, 11, 1), np.uint16),
             np.zeros((9, 11, 1), np.uint8), np.zeros((9, 11, 4), np.uint8), np.zeros((9, 11, 3), np.uint8),
             np.zeros((9, 11, 4), np.uint8), np.zeros((9, 11, 1), np.uint8)]
    left = native.extension.decode_png_files([path["deep"], path["rgba"], path["grey"], path["grey"], path["rgba"],
                                              path["palette"], path["palette"], path["palette"]],
                                             kinds, False, True)  # exact: only files of their rows' own kind
    assert list(left) == [1, 2, 6, 7]  # a palette's own kind: its colours, RGB (`Paired.of`)
    np.testing.assert_array_equal(kinds[0][..., 0], ids16)
    np.testing.assert_array_equal(kinds[3][..., 0], ids8)
    np.testing.assert_array_equal(kinds[4], rgba)
    np.testing.assert_array_equal(kinds[5], palette[ids8])
    with pytest.raises(ValueError, match="one out array a path"):
        native.extension.decode_png_files([path["grey"]], [])


@with_zlib
def test_every_other_png_is_left_to_pillow():
    """Other sizes, colour types and depths (16-bit grey, which Pillow converts to RGB its own way; colours into grey,
    its weighted sum), a palette that lacks an index used (Pillow's versions colour it differently) or is not one,
    an orientation (eXIf, or a text chunk keyed "exif", which Pillow takes for one; before or after the
    pixels), an animation, a chunk Pillow refuses (a wrong CRC before the pixels), a stream that ends or breaks before the last
    row, a row of an unknown filter: left, their rows untouched (a damaged one named as Pillow finds it:
    tests/test_native.py)."""
    pixels = photo(3)
    height, width = pixels.shape[:2]
    stream = png_file(pixels)
    animated = io.BytesIO()
    Image.fromarray(pixels).save(animated, format="PNG", save_all=True,
                                 append_images=[Image.fromarray(pixels[::-1].copy())])
    idat = stream.index(b"IDAT") - 4
    grey16 = photo(1).astype(np.uint16) * 257
    files = {
        "other size": png_file(pixels[:-1]),
        "index past its palette": png_file(np.full((height, width), 3, np.uint8), palette=np.zeros((3, 3))),
        "an empty palette": png_file(np.zeros((height, width), np.uint8), palette=np.zeros((0, 3))),
        "a PLTE of part of an entry": png_file(np.zeros((height, width), np.uint8), palette=np.zeros((2, 2))),
        "16-bit grey": _sixteen_bits(height, width),
        "16-bit grey and alpha": png_file(np.dstack([grey16, grey16])),
        "exif before": pillow_png(pixels, exif=_turned()),
        "exif after": png_file(pixels, after=(chunk(b"eXIf", _turned()),)),
        "exif text before": png_file(pixels, before=(chunk(b"tEXt", b"exif\x00" + _turned()),)),
        "exif text after": png_file(pixels, after=(chunk(b"zTXt", b"exif\x00\x00" + zlib.compress(b"x")),)),
        "animated": animated.getvalue(),
        "wrong crc": png_file(pixels, before=(chunk(b"tEXt", b"a\x00b", crc=12345),)),
        "truncated": stream[: len(stream) // 2],
        "stream cut": stream[:idat] + chunk(b"IDAT", zlib.compress(b"\x00" * 40)) + chunk(b"IEND", b""),
        "unknown filter": _unknown_filter(pixels),
        "no pixels": stream[:idat] + chunk(b"IEND", b""),
    }
    out, left = decoded_together(list(files.values()), pixels.shape)
    assert [list(files)[k] for k in left] == list(files)
    assert (out == 7).all()
    rgb = {"rgb": png_file(pixels), "rgba": png_file(np.dstack([pixels, pixels[..., :1]])),
           "16-bit grey and alpha": png_file(np.dstack([grey16, grey16])), "palette": _palette(pixels)}
    out, left = decoded_together(list(rgb.values()), (height, width, 1))  # no colours into grey: Pillow's weighted sum
    assert [list(rgb)[k] for k in left] == list(rgb)


def _palette(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert("P", palette=Image.Palette.ADAPTIVE).save(buffer, format="PNG")
    return buffer.getvalue()


def _sixteen_bits(height: int, width: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.arange(height * width, dtype=np.uint16).reshape(height, width)).save(buffer, format="PNG")
    return buffer.getvalue()


def _unknown_filter(pixels: np.ndarray) -> bytes:
    """A PNG whose second row says filter 5, which PNG does not have."""
    height, width = pixels.shape[:2]
    rows = b"".join(bytes([5 if y == 1 else 0]) + pixels[y].tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


@with_zlib
@pytest.mark.parametrize("channels", [3, 1])
def test_boxes_of_plain_pngs_are_cut_in_c_as_decode_region_cuts_them(channels, monkeypatch):
    """crop_each: a box of a plain PNG, inside it or past its edges, resized or of whole pixels at its own size,
    mirrored or not, in C (none left), the pixels `EncodedChunk.decode_region` gives without the extension."""
    pixels = photo(channels)
    files = [png_file(pixels, [k % 5]) for k in range(8)]
    region, ranges = pack_regions(files, len(files), 1 << 20)
    boxes = np.array([[3.25, 1.5, 30.0, 40.25], [0, 0, 37, 53], [8, 9, 20, 24], [-2, 0, 20, 20], [10, 40, 20, 20],
                      [0.5, 0.25, 36.5, 52.75], [-5.5, -3.25, 50.5, 70.0], [4, 6, 20, 24]])
    flips = np.array([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 0], [1, 1], [0, 0]], np.uint8)
    sizes = np.tile([37, 53], (8, 1))
    out = np.full((8, 20, 24, channels), 7, np.uint8)
    left = crop_plain_jpegs([region], [ranges], np.zeros(8, np.int64), np.arange(8), sizes, boxes, out, np.arange(8),
                            flips)
    assert list(left) == []
    monkeypatch.setattr(native, "extension", None)
    decode = ImageDecode((37, 53, channels), "uint8", "crop")
    chunk_ = EncodedChunk(region, ranges, decode, ("s.zarr", "images", 0, 0))
    for k in range(8):
        expected = np.full((20, 24, channels), 9, np.uint8)
        chunk_.decode_region(k, tuple(boxes[k].tolist()), (20, 24), expected, tuple(flips[k].astype(bool).tolist()))
        np.testing.assert_array_equal(out[k], expected, err_msg=f"box {boxes[k]}")


@pytest.mark.parametrize("channels", [3, 1])
def test_an_epoch_of_a_png_store_is_the_same_without_the_extension(tmp_path, monkeypatch, channels):
    """A folder of PNGs ingested as they are (``images="encoded"``): its batches, decoded (and cropped) in C, are those
    Pillow decodes, with and without crops made with the batch."""
    folder = tmp_path / "pngs"
    for k in range(30):
        (folder / "ab"[k % 2]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo(channels, (24, 32), at=9 * k)).save(folder / "ab"[k % 2] / f"{k}.png")
    ds = outcore.ingest_images(folder, tmp_path / "pngs.zarr", shape=(24, 32, channels), images="encoded",
                               chunk_size=8, progress=False)
    transforms = [None, Compose([RandomResizedCrop((16, 20)), RandomFlip()]), Compose([RandomCrop(20), RandomFlip()])]
    made = [[batch["images"] for batch in ds.batches(8, seed=2, transform=transform)] for transform in transforms]
    monkeypatch.setattr(native, "extension", None)
    again = [[batch["images"] for batch in ds.batches(8, seed=2, transform=transform)] for transform in transforms]
    assert [epoch[0].shape for epoch in made] == [(8, 24, 32, channels), (8, 16, 20, channels), (8, 20, 20, channels)]
    for one, other in zip(itertools.chain(*made), itertools.chain(*again), strict=True):
        np.testing.assert_array_equal(one, other)


class _Counted:
    """The C extension, each `decode_each` call's rows' dtype and files left noted in ``calls``."""

    def __init__(self, extension: object, calls: list) -> None:
        self.extension, self.calls = extension, calls

    def __getattr__(self, name: str) -> object:
        return getattr(self.extension, name)

    def decode_each(self, regions, ranges, which, samples, out, rows):
        left = self.extension.decode_each(regions, ranges, which, samples, out, rows)
        self.calls.append((out.dtype, len(samples), len(left)))
        return left


@with_zlib
def test_an_epoch_of_16_bit_grey_pngs_is_decoded_into_uint16_rows_in_c(tmp_path, monkeypatch):
    """A folder of 16-bit grey PNGs (depth maps) ingested as they are into a uint16 field: a batch's files decoded into
    its uint16 rows by the run's C calls (`decode_each`), the 8-bit ones among them left to `decode_image` (scaled by
    257), the batches those Pillow decodes."""
    folder = tmp_path / "depth"
    rng = np.random.default_rng(3)
    for k in range(30):
        (folder / "ab"[k % 2]).mkdir(parents=True, exist_ok=True)
        depth = rng.integers(0, 65536, (24, 32)).astype(np.uint16) if k % 10 else rng.integers(0, 256, (24, 32))
        Image.fromarray(depth.astype(np.uint16 if k % 10 else np.uint8)).save(folder / "ab"[k % 2] / f"{k}.png")
    ds = outcore.ingest_images(folder, tmp_path / "depth.zarr", shape=(24, 32, 1), dtype="uint16", images="encoded",
                               chunk_size=8, progress=False)
    calls = []
    monkeypatch.setattr(native, "extension", _Counted(native.extension, calls))
    made = [batch["images"] for batch in ds.batches(8, seed=2)]
    assert {dtype for dtype, _, _ in calls} == {np.dtype("uint16")}
    assert sum(count for _, count, _ in calls) == 30 and sum(left for _, _, left in calls) == 3  # the 8-bit files
    monkeypatch.setattr(native, "extension", None)
    again = [batch["images"] for batch in ds.batches(8, seed=2)]
    assert made[0].dtype == np.uint16 and made[0].shape == (8, 24, 32, 1)
    for one, other in zip(made, again, strict=True):
        np.testing.assert_array_equal(one, other)


@with_zlib
def test_the_survey_checks_plain_pngs_in_c_refusing_what_pillow_refuses(tmp_path):
    """`plain_jpeg_sizes` (a block of the survey's files) and `plain_jpeg_files` (files read from their paths, and
    digested): a plain PNG decoded whole in C, its size the one Pillow's full decode gives; a damaged one, one past
    the limits and any other PNG left, for `decoded_size` to decode or word the error."""
    pixels = photo(3)
    good = png_file(pixels)
    idat = good.index(b"IDAT") - 4
    files = {"plain": good, "pillow's": pillow_png(pixels, optimize=True), "grey": png_file(photo(1)),
             "truncated": good[: len(good) // 2], "wrong crc": png_file(pixels, before=(chunk(b"tEXt", b"a", crc=9),)),
             "broken stream": good[:idat] + chunk(b"IDAT", b"\x78\x9c" + bytes(40)) + chunk(b"IEND", b""),
             "rgba": pillow_png(np.dstack([pixels, pixels[..., :1]])), "palette": _palette(pixels),
             "interlaced": png_file(pixels, interlace=1), "exif": pillow_png(pixels, exif=_turned())}
    sizes, left = plain_jpeg_sizes(list(files.values()), 3)
    assert [list(files)[k] for k in left] == ["truncated", "wrong crc", "broken stream", "exif"]
    for k in (0, 1, 2, 6, 7, 8):
        full = decode_image(list(files.values())[k], (None, None, 3), None, np.dtype("uint8"))
        assert tuple(sizes[k]) == full.shape[:2]
    for name in ("truncated", "wrong crc", "broken stream"):
        with pytest.raises(ImageError, match=f"^{name}: "):
            decoded_size(files[name], 3, np.dtype("uint8"), name)
    assert list(plain_jpeg_sizes([good], 3, max_pixels=37 * 53 - 1)[1]) == [0]
    assert list(plain_jpeg_sizes([good], 3, max_side=52)[1]) == [0]
    assert list(plain_jpeg_sizes([good], 3, max_side=53)[1]) == []
    paths = []
    for name, data in files.items():
        (tmp_path / f"{name}.png").write_bytes(data)
        paths.append(str(tmp_path / f"{name}.png"))
    found = plain_jpeg_files(paths, 3)
    assert found.left == list(left) and (found.sizes == sizes).all()
    assert found.nbytes.tolist() == [len(data) for data in files.values()]


def test_decode_image_decodes_a_plain_png_without_pillow_where_it_can(monkeypatch):
    """`decode_image` of a plain PNG: with the extension (and zlib), in C, Pillow not called, into the sample at the
    field's size, at its own size, or fitted to another; the pixels Pillow gives. Other PNGs through Pillow."""
    from outcore.imaging import decode

    pixels = photo(3)
    cases = [((37, 53, 3), "crop"), ((None, None, 3), None), ((20, 30, 3), "fit"), ((37, 53), "crop")]
    data = png_file(pixels)
    grey = png_file(photo(1))
    expected = [decode_image(data if len(shape) == 3 else grey, shape, resize, np.dtype("uint8"))
                for shape, resize in cases]
    if getattr(native.extension, "ZLIB", ""):
        monkeypatch.setattr(decode, "_opened", lambda *arguments: pytest.fail("Pillow opened a plain PNG"))
    for (shape, resize), wanted in zip(cases, expected, strict=True):
        got = decode_image(data if len(shape) == 3 else grey, shape, resize, np.dtype("uint8"))
        np.testing.assert_array_equal(got, wanted)
    monkeypatch.undo()
    monkeypatch.setattr(native, "extension", None)
    for (shape, resize), wanted in zip(cases, expected, strict=True):
        np.testing.assert_array_equal(decode_image(data if len(shape) == 3 else grey, shape, resize,
                                                   np.dtype("uint8")), wanted)
