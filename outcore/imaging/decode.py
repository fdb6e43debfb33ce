"""Decode one image file (JPEG, PNG, WebP, ...) and fit it to the store's sample shape.

The rules, applied in this order:

1. Channels: the file is converted to the target's channel count by Pillow (palette, CMYK, grey+alpha, …
   all handled); alpha is dropped when the target has 1 or 3 channels. 16-bit greyscale keeps its depth.
2. Depth: 16-bit samples become 8-bit by rounding ``v * 255 / 65535``; 8-bit samples become 16-bit by ``v * 257``.
3. Size, by the ``resize`` policy (an image already of the target size is never touched):

   - ``None``: refuse any other size, naming the file.
   - ``"fit"``: resize to exactly (H, W); the aspect ratio is not kept.
   - ``"crop"``: keep the aspect ratio, resize to cover (H, W), then cut the centre.
   - ``"pad"``: keep the aspect ratio, resize to fit inside (H, W), then pad the borders with zeros.

   A JPEG larger than needed is first decoded at 1/2, 1/4 or 1/8 of its size (JPEG DCT scaling), never
   below what the policy needs, then resized as above.
"""

from __future__ import annotations

import io
import math
import re
import struct
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import simplejpeg
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from ..errors import ImageError, OptionError
from ..format import ImageDecode
from ..storage import read_file_at_once
from . import native
from .crops import Box, box_edges
from .resize import ResizePolicy, cover, cover_box, fit, resize_edges, written_into

IMAGE_DTYPES = (np.dtype("uint8"), np.dtype("uint16"))
MAX_PIXELS = 89_478_485  # Pillow's own limit for decompression bombs (about 9459 x 9459)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")

DCT_SCALES = (1, 2, 4, 8)  # the eighths a JPEG is decoded at: see `dct_scale`
_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
_HIGH_DEPTH_MODES = ("I;16", "I;16B", "I;16L", "I", "F")
# what Pillow raises for truncated, damaged or oversized files
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


def parse_image_shape(shape: Sequence[int | None] | str | None) -> tuple[int | None, ...]:
    """Validate a sample shape: ``(H, W)`` for greyscale or ``(H, W, C)`` with C in 1, 3, 4; a string
    separates the sizes with ``x`` or commas. ``None`` (or ``"any"``) keeps every picture at its own size
    with 3 channels (``"none"`` too, as the command line says it); ``(None, None, C)`` with C channels.

    >>> parse_image_shape("128x128x3"), parse_image_shape("32,32"), parse_image_shape(None)
    ((128, 128, 3), (32, 32), (None, None, 3))
    """
    given = shape
    if shape is None or (isinstance(shape, str) and shape.strip().lower() in ("any", "none")):
        return (None, None, 3)
    if isinstance(shape, str):
        try:
            shape = tuple(int(part) for part in re.split(r"[x,]", shape.lower().strip()))
        except ValueError:
            raise OptionError(f"shape={given!r} is not of the form HxW or HxWxC, e.g. 128x128x3, or any") from None
    shape = tuple(shape)
    try:
        if len(shape) == 3 and shape[:2] == (None, None):
            sizes = (int(shape[2]),)
        else:
            shape = sizes = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise OptionError(f"shape={given!r} is not sizes, or (None, None, C) for pictures at their own size") from None
    if len(shape) not in (2, 3) or any(s <= 0 for s in sizes):
        raise OptionError(f"shape={given!r} is not a height and width (and channels) of positive sizes")
    if len(shape) == 3 and shape[2] not in _PIL_MODES:
        raise OptionError(f"shape={given!r} has {shape[2]} channels; images have 1, 3 or 4")
    return (*shape[:2], int(shape[2])) if len(shape) == 3 else shape


def parse_image_dtype(dtype: np.typing.DTypeLike) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in IMAGE_DTYPES:
        raise OptionError(f"image dtype {dtype} is not supported; use uint8 or uint16")
    return dtype


def load_image(path: str, shape: tuple[int, ...], resize: ResizePolicy, dtype: np.dtype) -> np.ndarray:
    """Decode the file ``path`` to exactly ``shape`` and ``dtype``; raise `ImageError` if impossible.

    >>> load_image("cat.jpg", (64, 64, 3), "crop", np.dtype("uint8")).shape  # doctest: +SKIP
    (64, 64, 3)
    """
    return decode_image(read_image_file(path), shape, resize, dtype, path)


def read_image_file(path: str) -> bytes:
    """The bytes of an image file; a missing or unreadable file raises `ImageError` naming it."""
    if read_file_at_once is not None and (data := read_file_at_once(path)) is not None:  # one C call
        return data
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        raise ImageError(path, "file not found") from None
    except OSError as error:
        raise ImageError(path, f"cannot read the file ({error})") from None


def decode_image(
    data: bytes, shape: tuple[int | None, ...], resize: ResizePolicy, dtype: np.dtype, name: str = "image",
    out: np.ndarray | None = None, max_pixels: int | None = MAX_PIXELS,
) -> np.ndarray:
    """Decode encoded image bytes (JPEG, PNG, WebP, ...) to exactly ``shape`` and ``dtype``, into
    ``out`` (a C-contiguous array of that shape and dtype) when given. A shape of ``(None, None, C)``
    keeps the picture's own (upright) size; ``out``, when given, must then be of that size.

    The same function decodes files at ingest and encoded fields at load time, so a pixel store and
    an encoded store of the same files give identical samples. ``name`` appears in errors. An image
    of more than ``max_pixels`` pixels (a decompression bomb, or a mistake) is an `ImageError` before
    it is decoded; ``None`` lifts the limit.

    >>> decode_image(open("cat.jpg", "rb").read(), (64, 64, 3), "crop", np.dtype("uint8")).shape  # doctest: +SKIP
    (64, 64, 3)
    """
    channels = shape[2] if len(shape) == 3 else 1
    if shape[0] is None:  # its own size
        pixels = _convert_depth(_decode(data, channels, None, None, name, None, max_pixels), dtype)
        _check_stored(pixels.shape[:2], None if out is None else out.shape[:2], name)
    else:
        in_place = out if out is not None and dtype == np.uint8 and out.flags.c_contiguous else None
        pixels = _decode(data, channels, shape[:2], resize, name, in_place, max_pixels, finish=dtype == np.uint8)
        if pixels is in_place:  # libjpeg-turbo (or the C extension) wrote the finished sample into ``out``
            return out
        pixels = fit(_convert_depth(pixels, dtype), shape[:2], resize, name).reshape(shape)
    if out is None:
        return pixels
    out[...] = pixels
    return out


def decoded_size(data: bytes, channels: int, dtype: np.dtype, name: str = "image",
                 max_pixels: int | None = MAX_PIXELS) -> tuple[int, int]:
    """The ``(height, width)`` ``data`` decodes to at its own size (`decode_image` with ``(None, None,
    channels)``), found by decoding all of it: a file that does not decode is an `ImageError` naming ``name``,
    as `decode_image` words it. A JPEG libjpeg-turbo decodes (`_decode_plain_jpeg`) is decoded at 1/8 of its size
    (upright, where its EXIF turns it): every coefficient is read and
    checked as at full size, only the inverse DCT is smaller, so a damaged file is refused alike (tested on
    thousands of damaged ones); any other file in full.

    >>> decoded_size(open("cat.jpg", "rb").read(), 3, np.dtype("uint8"))  # doctest: +SKIP
    (375, 500)
    """
    with decode_errors(name):
        checked = _decode_plain_jpeg(data, channels, (1, 1), "fit", None, name, max_pixels)
        if checked is not None:  # its header's size, upright
            return stored_frame(data, name, max_pixels)[0]
    return decode_image(data, (None, None, channels), None, dtype, name, max_pixels=max_pixels).shape[:2]


def plain_jpeg_sizes(files: Sequence[bytes], channels: int, max_pixels: int | None = MAX_PIXELS,
                     max_side: int | None = None, orientations: np.ndarray | None = None
                     ) -> tuple[np.ndarray, Sequence[int]]:
    """`decoded_size` of each of ``files`` that is a plain JPEG (YCbCr for 3 ``channels``, greyscale for 1, no
    EXIF orientation but 1: upright as stored) of at most ``max_pixels`` pixels and ``max_side`` a side, all at
    once in the C extension (`native`), outside the GIL: each decoded at 1/8 of its size as `decoded_size` decodes
    it. With ``orientations`` ((files,) uint8), JPEGs that EXIF turns or mirrors too, each file's orientation
    written there (`stored_frame`'s; 0 for those left). Returns ``(sizes, left)``: ``sizes`` (files, 2) the upright
    heights and widths, ``left`` the positions for `decoded_size`, or
    `shrink_image` past ``max_side`` (other files, damaged ones, those past the limits, whose errors it words;
    every one without the extension).

    >>> sizes, left = plain_jpeg_sizes([open("cat.jpg", "rb").read(), b"not a picture"], 3)  # doctest: +SKIP
    >>> sizes.tolist(), left  # doctest: +SKIP
    ([[375, 500], [0, 0]], [1])
    """
    sizes = np.zeros((len(files), 2), np.int64)
    check_each = getattr(native.extension, "check_each", None)  # None: not built (or built before it was)
    if check_each is None or channels not in (1, 3) or not files:
        return sizes, range(len(files))
    return sizes, check_each(files, channels, -1 if max_pixels is None else max_pixels,
                             -1 if max_side is None else max_side, sizes, orientations)


def plain_jpeg_files(paths: Sequence[str], channels: int, max_pixels: int | None = MAX_PIXELS,
                     max_side: int | None = None, digest_size: int = 16) -> PlainFiles | None:
    """`plain_jpeg_sizes` of the regular files at ``paths`` (JPEGs that EXIF turns or mirrors too), each read whole
    (as `read_image_file` reads it) and its
    BLAKE2b digest of ``digest_size`` bytes (``hashlib.blake2b(data, digest_size=...)``) taken in the same call of
    the C extension, which releases the GIL once for them all. A path holding ``"::"`` (a record's reference) or
    ``"://"`` (a URL) is not read. Returns `PlainFiles`, or ``None`` without the extension.

    >>> found = plain_jpeg_files(["cat.jpg", "notes.txt"], 3)  # doctest: +SKIP
    >>> found.sizes.tolist(), found.nbytes.tolist(), found.left  # doctest: +SKIP
    ([[375, 500], [0, 0]], [40240, 12], [1])
    """
    check_files = getattr(native.extension, "check_files", None)  # None: not built (or built before it was)
    if check_files is None or channels not in (1, 3):
        return None
    sizes, nbytes = np.zeros((len(paths), 2), np.int64), np.zeros(len(paths), np.int64)
    digests, orientations = np.zeros((len(paths), digest_size), np.uint8), np.zeros(len(paths), np.uint8)
    left = check_files(paths, channels, -1 if max_pixels is None else max_pixels, -1 if max_side is None else max_side,
                       sizes, nbytes, digests, orientations)
    return PlainFiles(sizes, nbytes, digests, left, orientations)


class PlainFiles(NamedTuple):
    """What `plain_jpeg_files` found: ``sizes`` (files, 2) the upright heights and widths of the JPEGs checked,
    ``nbytes`` each file's size and ``digests`` (files, digest size) its digest (0 for a file not read), ``left``
    the positions of the files not checked (not read, other files, damaged ones, past the limits) and
    ``orientations`` each file's EXIF orientation (`stored_frame`'s: 1 upright as stored; 0 for those left)."""

    sizes: np.ndarray
    nbytes: np.ndarray
    digests: np.ndarray
    left: list[int]
    orientations: np.ndarray


Positions = slice | np.ndarray  # the rows of a batch's arrays a call of a prepared C decode takes: a run, or some
PlainCall = Callable[[Positions], Sequence[int]]  # a prepared C decode: the positions (among those given) it left


def fit_image_files(paths: Sequence[str], resize: ResizePolicy, out: np.ndarray, digests: np.ndarray,
                    max_pixels: int | None = MAX_PIXELS) -> list[int] | None:
    """`decode_image` of the files at ``paths`` into ``out`` (files, height, width, 1 or 3; uint8) under ``resize``,
    the JPEGs (upright or turned by their EXIF) and plain PNGs among them read, decoded and fitted in one C call (the
    extension's ``fit_files``, the GIL released once for them all), the BLAKE2b digest of each of those, of
    ``digests``' width, into ``digests``: the positions left (other files, damaged ones, those past ``max_pixels``:
    `decode_image`'s to decode or to word what is wrong), or None without the extension (or for the ``pad`` policy).

    >>> out, digests = np.empty((2, 64, 64, 3), np.uint8), np.empty((2, 16), np.uint8)
    >>> fit_image_files(["cat.jpg", "notes.txt"], "crop", out, digests)  # doctest: +SKIP
    [1]
    """
    fit = getattr(native.extension, "fit_files", None)
    if fit is None or resize not in (None, "crop", "fit"):
        return None
    return fit(paths, resize, -1 if max_pixels is None else max_pixels, out, digests)


def decode_plain_jpegs(regions: Sequence[np.ndarray], ranges: Sequence[np.ndarray], which: np.ndarray,
                       samples: np.ndarray, out: np.ndarray, rows: np.ndarray) -> Sequence[int]:
    """Decode file ``samples[k]`` of chunk ``which[k]`` (file ``i`` of chunk ``c`` is ``regions[c][ranges[c][i,
    0]:ranges[c][i, 1]]``) into row ``rows[k]`` of ``out`` (``(n, height, width[, channels])``, uint8,
    C-contiguous) where `decode_image` would decode it straight into the row: plain JPEGs of exactly that size
    (YCbCr for RGB, greyscale for grey, no EXIF), the same pixels. All at once in the C extension (`native`),
    outside the GIL, without `decode_image`'s Python around each file. Returns the positions ``k`` it
    left, for `decode_image`: other files, damaged ones (whose errors `decode_image` words), and every one
    without the extension.

    >>> out = np.empty((2, 64, 64, 3), np.uint8)
    >>> left = decode_plain_jpegs([region], [ranges], np.zeros(2), np.array([0, 5]), out, np.array([0, 1]))  # doctest: +SKIP
    """
    decode = plain_jpeg_decodes(regions, ranges, which, samples, out, rows)
    return range(len(samples)) if decode is None else decode(slice(None))


def plain_jpeg_decodes(regions: Sequence[np.ndarray], ranges: Sequence[np.ndarray], which: np.ndarray,
                       samples: np.ndarray, out: np.ndarray, rows: np.ndarray) -> PlainCall | None:
    """`decode_plain_jpegs` made ready once for a batch's runs: its arrays as the C call takes them, so that a run
    (``positions``: a slice of them, or some of them) is the call alone; None without the extension, or for rows
    C does not decode into (every file then left)."""
    decode_each = getattr(native.extension, "decode_each", None)  # None: not built (or built before it was)
    pixels = _rows_for_c(out, wide=True)
    if decode_each is None or pixels is None or pixels.shape[1] * pixels.shape[2] > MAX_PIXELS:
        return None
    tables, which, samples, rows = [_int64(table) for table in ranges], _int64(which), _int64(samples), _int64(rows)
    return lambda positions: decode_each(regions, tables, which[positions], samples[positions], pixels, rows[positions])


def crop_plain_jpegs(regions: Sequence[np.ndarray], ranges: Sequence[np.ndarray], which: np.ndarray,
                     samples: np.ndarray, sizes: np.ndarray, boxes: np.ndarray, out: np.ndarray, rows: np.ndarray,
                     flips: np.ndarray) -> Sequence[int]:
    """`decode_region` for many boxes of chunks' files at once, where it crops in C: box ``boxes[k]`` (top,
    left, height, width) of file ``samples[k]`` of chunk ``which[k]`` (as `decode_plain_jpegs`), a plain JPEG of
    ``sizes[k]`` (height, width) and the box in its own pixels, resized to the size of ``out``'s rows (uint8,
    C-contiguous) into ``out[rows[k]]``, mirrored as ``flips[k]`` (left-right, top-bottom) says; a box past the
    picture's edges is zeros there, as `EncodedChunk.decode_region` cuts it (`box_part`). The same pixels,
    without the Python a sample around each call.
    Returns the positions ``k`` it left, for `decode_region`: other files (of another size, colour space or
    format, with EXIF, more than `MAX_PIXELS`), damaged ones, and every one without the extension.

    >>> out = np.empty((1, 112, 112, 3), np.uint8)
    >>> left = crop_plain_jpegs([region], [ranges], np.zeros(1), np.array([3]), np.array([[128, 128]]),
    ...                         np.array([[0, 16, 112, 112]]), out, np.array([0]), np.array([[1, 0]]))  # doctest: +SKIP
    """
    crop = plain_jpeg_crops(regions, ranges, which, samples, sizes, boxes, out, rows, flips)
    return range(len(samples)) if crop is None else crop(slice(None))


def plain_jpeg_crops(regions: Sequence[np.ndarray], ranges: Sequence[np.ndarray], which: np.ndarray,
                     samples: np.ndarray, sizes: np.ndarray, boxes: np.ndarray, out: np.ndarray, rows: np.ndarray,
                     flips: np.ndarray) -> PlainCall | None:
    """`crop_plain_jpegs` made ready once for a batch's runs, as `plain_jpeg_decodes`; None without the extension."""
    crop_each = getattr(native.extension, "crop_each", None)  # None: not built (or built before it was)
    pixels = _rows_for_c(out)
    if crop_each is None or pixels is None:
        return None
    sizes = _int64(np.where((np.prod(sizes, axis=1) <= MAX_PIXELS)[:, None], sizes, 0))  # 0: left, for decode_region
    tables, which, samples, rows = [_int64(table) for table in ranges], _int64(which), _int64(samples), _int64(rows)
    boxes, flips = np.ascontiguousarray(boxes, np.float64), np.ascontiguousarray(flips, np.uint8)
    return lambda positions: crop_each(regions, tables, which[positions], samples[positions], pixels, rows[positions],
                                       sizes[positions], boxes[positions], flips[positions])


def _rows_for_c(out: np.ndarray, wide: bool = False) -> np.ndarray | None:
    """``out`` as the C extension's calls take a batch's rows, (n, height, width, 1 or 3) uint8 C-contiguous
    (a view), or with ``wide`` (`decode_each`: 16-bit grey PNGs) of 1 channel of uint16 too; None where it is not such
    an array."""
    if out.dtype not in ((np.uint8, np.uint16) if wide else (np.uint8,)) or not out.flags.c_contiguous or \
            out.ndim not in (3, 4):
        return None
    pixels = out.reshape(*out.shape[:3], -1)
    return pixels if pixels.shape[3] in ((1,) if out.dtype == np.uint16 else (1, 3)) else None


def _int64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, np.int64)


def decode_region(
    data: bytes, decode: ImageDecode, box: Box, size: tuple[int, int], out: np.ndarray, name: str = "image",
    stored: tuple[int, int] | None = None, flip: tuple[bool, bool] = (False, False),
) -> np.ndarray:
    """``box`` of the sample ``decode_image(data, decode.shape, ...)`` would give, resized to ``size``
    (bilinear, antialiased), into ``out`` — read from the file itself: the box is mapped back to the
    file's pixels through the ``crop`` or ``fit`` resize (or taken as it is, for pictures kept at their
    own size), and a plain JPEG is decoded at the smallest DCT scale (`dct_scale`) that keeps the box at
    least ``size`` (one resize instead of two, less to decode); with the C extension (`native`), only the
    rows and columns of the file that the box needs are decoded, and the box is resized straight into
    ``out``, with the same pixels. Other images, policies and dtypes decode the sample and resize the
    box, which gives the same result. ``stored`` is the size a picture kept at its own size
    was recorded with at ingest: a file of another size is an `ImageError`. ``flip`` mirrors the result
    left-right, top-bottom.
    """
    with decode_errors(name):
        region = _file_region(data, decode, box)
    if region is None:
        sample = decode_image(data, decode.shape, decode.resize, np.dtype(decode.dtype), name)
        _check_stored(sample.shape[:2], stored, name)
        return resize_edges(sample.reshape(*sample.shape[:2], -1), box_edges(box), size, out, flip)
    (height, width), (y0, x0, y1, x1), colorspace = region
    _check_stored((height, width), stored, name)
    need = (min(height, math.ceil(height * size[0] / (y1 - y0))), min(width, math.ceil(width * size[1] / (x1 - x0))))
    eighths = dct_scale((height, width), need)
    scaled = (math.ceil(height * eighths / 8), math.ceil(width * eighths / 8))
    fy, fx = scaled[0] / height, scaled[1] / width
    edges = (y0 * fy, x0 * fx, y1 * fy, x1 * fx)
    if native.extension is None:
        with decode_errors(name):
            pixels = simplejpeg.decode_jpeg(data, colorspace=colorspace, min_height=scaled[0], min_width=scaled[1])
        return resize_edges(pixels, edges, size, out, flip)
    with decode_errors(name), written_into(out, (*size, 3 if colorspace == "RGB" else 1)) as target:
        native.extension.crop_resize(data, eighths, edges, target, *flip)  # only the box's rows and columns
    return out


def cut_from_file(data: bytes, decode: ImageDecode) -> bool:
    """Whether `decode_region` cuts a box of this file from the file's own pixels (a plain 8-bit JPEG of the
    field's colour space, kept at its size or under the ``crop`` or ``fit`` policy: one resize), rather than
    from the sample `decode_image` fits to the field's shape (two).

    >>> cut_from_file(b"\\x89PNG", ImageDecode((32, 32, 3)))
    False
    """
    return _file_region(data, decode, (0.0, 0.0, 1.0, 1.0)) is not None


def dct_scale(size: tuple[int, int], need: tuple[int, int]) -> int:
    """The scale, in eighths, at which a JPEG of ``size`` (h, w) is decoded to be at least ``need``: the
    smallest of 1/8, 1/4, 1/2 and 1 that is enough. libjpeg-turbo's IDCTs at 3/8, 5/8, 3/4 and 7/8 are
    plain C: a 500x375 photo takes 1.3-2x as long to decode at those scales as at full size (SIMD).

    >>> dct_scale((375, 500), (90, 100)), dct_scale((375, 500), (200, 100)), dct_scale((6, 6), (1, 1))
    (2, 8, 8)
    """
    if min(size) < 8:  # a tiny picture: every scale would give it the same size
        return 8
    (height, width), (least_height, least_width) = size, need
    for eighths in DCT_SCALES:  # plain arithmetic: called once a sample
        if -(-height * eighths // 8) >= least_height and -(-width * eighths // 8) >= least_width:
            return eighths
    return 8


@contextmanager
def decode_errors(name: str) -> Iterator[None]:
    """What the decoders raise for a damaged or unreadable file, as an `ImageError` naming ``name``."""
    try:
        yield
    except ImageError:  # already says what is wrong with the file
        raise
    except UnidentifiedImageError:
        raise ImageError(name, "not an image file Pillow can read") from None
    except _DECODE_ERRORS as error:
        raise ImageError(name, f"cannot decode ({type(error).__name__}: {error})") from None


@contextmanager
def _opened(data: bytes, name: str, max_pixels: int | None) -> Iterator[Image.Image]:
    """The file opened by Pillow (header read, pixels not yet), refused past ``max_pixels``; what Pillow
    raises while it is used is an `ImageError` naming ``name``."""
    with decode_errors(name):
        with warnings.catch_warnings():  # the size is checked here, against the caller's limit
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data))
        with opened as image:
            _check_size(image.size[1], image.size[0], max_pixels, name)
            yield image


def upright_size(data: bytes, name: str = "image", max_pixels: int | None = MAX_PIXELS) -> tuple[int, int]:
    """The ``(height, width)`` a file decodes to (after its EXIF orientation), read from its header; a file
    that is not a picture, or of more than ``max_pixels`` pixels, is an `ImageError` naming ``name``.

    >>> upright_size(open("portrait.jpg", "rb").read())  # doctest: +SKIP
    (640, 480)
    """
    return stored_frame(data, name, max_pixels)[0]


def stored_frame(data: bytes, name: str = "image", max_pixels: int | None = MAX_PIXELS) -> tuple[tuple[int, int], int]:
    """A file's upright ``(height, width)`` (`upright_size`) and EXIF orientation (1: stored upright; 2-8: mirrored or
    turned, as decoding undoes), from one read of its header: a JPEG's by libjpeg-turbo where its orientation is known
    without Pillow (`known_orientation`), a PNG's by `png_header`, any other file's by Pillow (whose parse of a JPEG's
    segments holds the GIL: 19 us a file)."""
    if bytes(data[:3]) == b"\xff\xd8\xff" and (orientation := known_orientation(data)):
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        except _DECODE_ERRORS:
            pass  # Pillow reads it, or says what is wrong with it
        else:
            _check_size(height, width, max_pixels, name)
            return ((width, height) if orientation in (5, 6, 7, 8) else (height, width)), orientation
    if (header := png_header(data)) is not None:  # upright as stored: no orientation before its pixels
        _check_size(*header[:2], max_pixels, name)
        return header[:2], 1
    with _opened(data, name, max_pixels) as image:
        width, height = image.size
        orientation = int(image.getexif().get(ExifTags.Base.Orientation, 1)) if image.format == "TIFF" \
            else _orientation(image)
    return ((width, height) if orientation in (5, 6, 7, 8) else (height, width)), orientation


def _check_stored(size: tuple[int, int], stored: tuple[int, int] | None, name: str) -> None:
    if stored is not None and tuple(size) != tuple(stored):
        raise ImageError(name, f"the file is {size[0]}x{size[1]}, its stored shape says {stored[0]}x{stored[1]}")


def _file_region(data: bytes, decode: ImageDecode, box: Box) -> tuple | None:
    """``((height, width), (y0, x0, y1, x1), colorspace)``: the file's size and ``box`` in its pixels,
    for a plain uint8 JPEG kept at its size or under the crop or fit policy; None where the fused path
    does not apply."""
    wanted = {3: (("YCbCr", "Gray"), "RGB"), 1: (("Gray",), "GRAY")}.get(decode.channels)
    plain_jpeg = data[:3] == b"\xff\xd8\xff" and wanted is not None
    if decode.dtype != "uint8" or not (decode.variable or decode.resize in ("crop", "fit")) or not plain_jpeg:
        return None
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    if colorspace not in wanted[0] or height * width > MAX_PIXELS:
        return None
    if not upright(data):
        return None
    y, x, box_h, box_w = box
    if decode.variable:
        return (height, width), (y, x, y + box_h, x + box_w), wanted[1]
    target_h, target_w = decode.shape[:2]
    if decode.resize == "fit":
        sy, sx, top, left = target_h / height, target_w / width, 0, 0
    else:  # as `fit` crops: scale to cover, then the centre
        sy, sx, top, left = cover((height, width), (target_h, target_w))
    region = ((y + top) / sy, (x + left) / sx, (y + top + box_h) / sy, (x + left + box_w) / sx)
    return (height, width), region, wanted[1]


def _decode(
    data: bytes, channels: int, target: tuple[int, int] | None, resize: ResizePolicy, name: str, out: np.ndarray | None,
    max_pixels: int | None, finish: bool = False,
) -> np.ndarray:
    """Decode the first frame, upright (EXIF orientation applied), as (h, w, channels).

    A JPEG larger than the target is decoded at a reduced size in the DCT domain (a scale of 1/2, 1/4
    or 1/8 that keeps it at least as large as `fit` needs), which is several times faster than a full
    decode. Plain YCbCr/greyscale JPEGs go through libjpeg-turbo via simplejpeg, faster than Pillow with
    identical pixels (benchmarks/cluster.py measures both); any
    other image through Pillow. Pillow is called directly: imageio's Pillow plugin runs the same
    decoder with about twice the per-file overhead. A plain JPEG of exactly the target size is decoded
    straight into ``out`` (and ``out`` returned) when given: one copy fewer. With ``finish`` (8-bit
    samples), a plain JPEG under the ``crop`` or ``fit`` policy is returned finished, at the target size
    (into ``out`` when given), where the C extension decodes only the part the policy keeps. A plain PNG is decoded
    by the C extension where it is built with zlib (`_decode_plain_png`), the pixels Pillow gives.
    """
    with decode_errors(name):
        fast = _decode_plain_jpeg(data, channels, target, resize, out, name, max_pixels, finish)
    if fast is None:
        fast = _decode_plain_png(data, channels, target, out, name, max_pixels)
    if fast is not None:
        return fast
    with _opened(data, name, max_pixels) as image:
        if image.format == "JPEG" and resize is not None:
            image.draft(image.mode, _reduced_size(image.size[::-1], target, resize, _orientation(image))[::-1])
        if "exif" in image.info or image.format == "TIFF":  # the only places an orientation lives
            image = ImageOps.exif_transpose(image)
        mode = image.mode if image.mode in _HIGH_DEPTH_MODES and channels == 1 else _PIL_MODES[channels]
        pixels = np.asarray(image if image.mode == mode else image.convert(mode))
    if pixels.dtype not in IMAGE_DTYPES:
        raise ImageError(name, f"{pixels.dtype} samples are not supported; images must be 8 or 16 bit")
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels)


def _decode_plain_jpeg(
    data: bytes, channels: int, target: tuple[int, int] | None, resize: ResizePolicy, out: np.ndarray | None, name: str,
    max_pixels: int | None, finish: bool = False,
) -> np.ndarray | None:
    """A YCbCr JPEG as RGB, or a greyscale JPEG as grey or as RGB (each level repeated, as Pillow converts it), through
    libjpeg-turbo (one its EXIF orientation turns or mirrors, and a YCbCr one asked for as grey, by `_decode_whole_jpeg`,
    not finished); None for anything else."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    _check_size(height, width, max_pixels, name)
    wanted = {("YCbCr", 3): "RGB", ("Gray", 3): "RGB", ("Gray", 1): "GRAY"}.get((colorspace, channels))
    weighed = (colorspace, channels) == ("YCbCr", 1)  # colours asked for as grey: Pillow's path, in C
    if wanted is None and not weighed:
        return None
    if weighed or not upright(data):  # after the colour space: Pillow may be asked for the orientation
        return _decode_whole_jpeg(data, (height, width), channels, target, resize, weighed)
    if out is not None and (height, width) == target:
        simplejpeg.decode_jpeg(data, colorspace=wanted, buffer=out)
        return out
    eighths = dct_scale((height, width), _reduced_size((height, width), target, resize, 1))
    scaled = (math.ceil(height * eighths / 8), math.ceil(width * eighths / 8))
    if finish and native.extension is not None and resize in ("crop", "fit"):  # `fit` of the part kept, in C
        edges = cover_box(scaled, target) if resize == "crop" else (0, 0, *scaled)
        finished = out if out is not None else np.empty((*target, channels), np.uint8)
        native.extension.crop_resize(data, eighths, edges, finished.reshape(*target, channels))
        return finished
    return simplejpeg.decode_jpeg(data, colorspace=wanted, min_height=scaled[0], min_width=scaled[1])


def _decode_whole_jpeg(data: bytes, size: tuple[int, int], channels: int, target: tuple[int, int] | None,
                       resize: ResizePolicy, weighed: bool) -> np.ndarray | None:
    """A JPEG of ``size`` (stored) of a colour space `_decode_plain_jpeg` takes that its EXIF orientation turns or
    mirrors, or (``weighed``) a YCbCr one asked for as grey, decoded upright by the C extension at the DCT scale
    Pillow's ``draft`` picks for it in `_decode`: the pixels Pillow gives there (its decoder's settings,
    `exif_transpose`'s turn, ``convert("L")``'s weights), without its parse of the EXIF and its copies; None where the
    extension is not built, or cannot tell or decode the file (Pillow then reads it)."""
    decode = getattr(native.extension, "decode_upright", None)
    orientation = known_orientation(data) if decode is not None else 0
    if orientation == 0 or (orientation == 1 and not weighed):
        return None
    eighths = 8 if resize is None else draft_eighths(size, _reduced_size(size, target, resize, orientation))
    height, width = (-(-side * eighths // 8) for side in size)
    pixels = np.empty((width, height, channels) if orientation >= 5 else (height, width, channels), np.uint8)
    return pixels if decode(data, eighths, pixels) else None


def draft_eighths(size: tuple[int, int], need: tuple[int, int]) -> int:
    """The scale, in eighths, at which Pillow's ``JpegImageFile.draft`` decodes a JPEG of ``size`` (h, w) asked for
    at least ``need``: 1/s for the largest s of 8, 4 and 2 that each side holds its need s whole times (else whole).
    Pillow counts whole times where `dct_scale` rounds the scaled sides up: its scale can be the larger.

    >>> draft_eighths((375, 500), (90, 100)), draft_eighths((100, 100), (13, 13)), dct_scale((100, 100), (13, 13))
    (2, 2, 1)
    """
    times = min(size[0] // need[0], size[1] // need[1])
    for divisor in (8, 4, 2):
        if times >= divisor:
            return 8 // divisor
    return 8


PNG_START = b"\x89PNG\r\n\x1a\n"


def png_ihdr(data: bytes) -> tuple[int, int, int, int] | None:
    """``(height, width, bits a sample, colour type)`` from a PNG file's IHDR, read as it is (`png_header` reads what
    follows it too); None for a file that does not open as a PNG does.

    >>> png_ihdr(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(4) + b"IHDR" + (640).to_bytes(4, "big") + (480).to_bytes(4, "big")
    ...          + bytes([16, 0]) + bytes(7))
    (480, 640, 16, 0)
    """
    if not data.startswith(PNG_START) or data[12:16] != b"IHDR" or len(data) < 33:
        return None
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    return height, width, depth, colour


def png_header(data: bytes) -> tuple[int, int, int, int] | None:
    """``(height, width, bits a sample, colour type)`` of a PNG file, from its IHDR, where none of the chunks before its
    pixels may turn it or show another picture (what Pillow reads when it opens the file: an eXIf chunk, a text chunk
    keyed ``exif``, an animation's acTL; `_png.h` leaves those files to Pillow too); None for any other file, and for
    one that ends before its pixels (Pillow says what is wrong with those).

    >>> png_header(open("depth.png", "rb").read())  # doctest: +SKIP
    (480, 640, 16, 0)
    """
    header = png_ihdr(data)
    at = 8
    while header is not None and at + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        if kind == b"IDAT":
            return header
        if kind in (b"eXIf", b"acTL") or (kind in (b"tEXt", b"zTXt", b"iTXt") and data[at + 8 : at + 13] == b"exif\0"):
            return None
        at += 12 + length
    return None


def _decode_plain_png(data: bytes, channels: int, target: tuple[int, int] | None, out: np.ndarray | None, name: str,
                      max_pixels: int | None) -> np.ndarray | None:
    """A plain PNG decoded by the C extension outside the GIL (``decode_png``, built with zlib: `_png.h` says which
    PNGs are plain: grey, RGB, with or without alpha, a palette's colours; no orientation or animation) into
    the pixels Pillow gives for ``channels``: uint16 for a 16-bit greyscale file of 1 channel (Pillow's I;16), else
    uint8, into ``out`` where it is of the ``target`` size and of that type, else at its own size. None for any other
    file (and a damaged one), or without it."""
    decode_png = getattr(native.extension, "decode_png", None)  # None: not built, or built without zlib
    header = None if decode_png is None else png_ihdr(data)
    if header is None:
        return None
    height, width, depth, colour = header
    _check_size(height, width, max_pixels, name)
    dtype = np.uint16 if (depth, colour, channels) == (16, 0, 1) else np.uint8
    into = out is not None and (height, width) == target and out.dtype == dtype
    pixels = out if into else np.empty((height, width, channels), dtype)
    return pixels if decode_png(data, pixels.reshape(height, width, channels)) else None


def _check_size(height: int, width: int, max_pixels: int | None, name: str) -> None:
    if max_pixels is not None and height * width > max_pixels:
        raise ImageError(name, f"{width}x{height} is {height * width:,} pixels, more than the limit of {max_pixels:,} "
                               "(a decompression bomb, or a picture to shrink first; a larger max_pixels=N admits "
                               "it)")


def _reduced_size(
    size: tuple[int, int], target: tuple[int, int] | None, resize: ResizePolicy, orientation: int
) -> tuple[int, int]:
    """The smallest (h, w) a stored image of ``size`` may be decoded at for `fit` to reach ``target``."""
    height, width = size
    if resize is None:
        return size
    if orientation in (5, 6, 7, 8):  # stored sideways: the target applies to the transposed image
        target = target[::-1]
    if resize == "fit":
        return target
    scale = (max if resize == "crop" else min)(target[0] / height, target[1] / width)
    return math.ceil(height * scale), math.ceil(width * scale)


def plain_jpeg(data: bytes) -> bool:
    """Whether ``data`` opens as a JPEG and decodes upright as stored (`upright`: no EXIF orientation but 1): a file
    that any JPEG decoder (a GPU's too) decodes to the pixels `decode_image` gives.

    >>> plain_jpeg(b"\\xff\\xd8\\xff\\xdb\\x00\\x02\\xff\\xda"), plain_jpeg(b"\\x89PNG")
    (True, False)
    """
    return bytes(data[:3]) == b"\xff\xd8\xff" and upright(data)


def upright(data: bytes) -> bool:
    """Whether a JPEG decodes upright as stored: it holds no EXIF metadata, or EXIF whose orientation is 1 (what
    cameras write), as Pillow reads it (`_orientation`). Read from its header segments by the C extension where it is
    built (`jpeg_orientation`, about a microsecond); by Pillow where that cannot tell, or without it, where a Python walk
    of the segments finds EXIF. A file Pillow cannot open is not upright here: decoding it says what is wrong.

    >>> upright(b"\\xff\\xd8\\xff\\xdb\\x00\\x02\\xff\\xda")
    True
    """
    found = known_orientation(data)
    if found:
        return found == 1
    try:
        with Image.open(io.BytesIO(data)) as image:
            return _orientation(image) == 1
    except (OSError, ValueError, TypeError, SyntaxError, Image.DecompressionBombError):
        return False


def known_orientation(data: bytes) -> int:
    """A JPEG's EXIF orientation as Pillow reads it (1 upright as stored, 2-8 turned or mirrored), where it is known
    without Pillow: read by the C extension (`jpeg_orientation`); without it, 1 where the header holds no EXIF. 0 where
    only Pillow can tell (or ``data`` is no JPEG).

    >>> known_orientation(b"\\xff\\xd8\\xff\\xdb\\x00\\x02\\xff\\xda"), known_orientation(b"\\x89PNG")
    (1, 0)
    """
    read = getattr(native.extension, "jpeg_orientation", None)  # None: not built (or built before it was)
    if read is not None:
        return read(data)
    return int(bytes(data[:3]) == b"\xff\xd8\xff" and not _exif_in_segments(data))


def _exif_in_segments(data: bytes) -> bool:
    """Whether a JPEG's header segments hold EXIF metadata (where an orientation could be), walked in Python:
    `upright` without the C extension."""
    position = 2
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == 0xDA:  # start of the image data: no more metadata
            return False
        if marker == 0xE1 and data[position + 4 : position + 10] == b"Exif\x00\x00":
            return True
        position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return False


def _orientation(image: Image.Image) -> int:
    return int(image.getexif().get(ExifTags.Base.Orientation, 1)) if "exif" in image.info else 1


def _convert_depth(pixels: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if pixels.dtype == dtype:
        return pixels
    if dtype == np.uint8:  # from uint16
        return ((pixels.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)
    return pixels.astype(np.uint16) * 257
