"""Label maps read from files: per-pixel ids (a palette or grey PNG, 16-bit for many ids) decoded without a
colour ever being made of them, and fitted to a store's shape by the pictures' ``resize`` policy, nearest-neighbour.

A label map belongs to one picture: it must be of the picture's size, and the picture must be stored upright (an
EXIF orientation turns the picture as it is decoded, never its map: refused rather than misplaced). Its ids are
kept exactly: a palette PNG's indices (Pascal VOC, with 255 as void), a grey PNG's values (Cityscapes' labelIds), a
16-bit PNG's (Cityscapes' instanceIds). A colour or JPEG map is refused: its colours are not ids, and JPEG blurs them.

>>> fit_label_map(np.array([[1, 2], [3, 4]], np.uint8), (4, 4), "fit", "m.png").tolist()
[[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]]
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..errors import ImageError, OptionError
from . import native
from .decode import decode_errors, png_header, png_ihdr
from .resize import ResizePolicy, cover_box, pad_placement
from .targets import cut_label_maps

LABEL_MAP_DTYPES = ("uint8", "uint16")
LOSSY = ("JPEG", "MPO", "WEBP")  # WebP may be lossless, but nothing in its header says so for sure
PNG_MODES = {  # (bits a sample, colour type) of a PNG -> the mode Pillow opens it in
    (1, 0): "1", (2, 0): "L", (4, 0): "L", (8, 0): "L", (16, 0): "I;16", (8, 2): "RGB", (16, 2): "RGB", (8, 4): "LA",
    (16, 4): "RGBA", (8, 6): "RGBA", (16, 6): "RGBA", **{(bits, 3): "P" for bits in (1, 2, 4, 8)}}
ID_PNGS = {**{(bits, kind): np.uint8 for bits in (1, 2, 4, 8) for kind in (0, 3)}, (16, 0): np.uint16}  # (bits,
# colour type) of a PNG of ids -> their dtype, as Pillow gives them (P, 1, L, I;16): decoded in C (`_decoded_ids`)
ID_MODES = {"P": np.uint8, "L": np.uint8, "1": np.uint8, "I;16": np.uint16, "I;16B": np.uint16, "I;16L": np.uint16,
            "I": np.uint16}


@dataclass(frozen=True)
class Renumbered:
    """A label map file whose ids are renumbered as it is read: id ``i`` becomes ``ids[i]`` (an instance map whose
    cut-away instances went at ingest: theirs become 0, the rest follow the kept instances' order)."""

    path: str
    ids: tuple[int, ...]

    def apply(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` renumbered; an `ImageError` for an id past the table."""
        if ids.size and int(ids.max()) >= len(self.ids):
            raise ImageError(self.path, f"the label map holds id {int(ids.max())}, which its annotations do not number")
        return np.asarray(self.ids, ids.dtype)[ids]


@dataclass(frozen=True)
class Paired:
    """A picture paired with another (its depth, a second view): a file of the same size, decoded to ``channels``
    of ``dtype`` and fitted as its picture is (bilinear, by the same box: `outcore.imaging.fit`)."""

    path: str
    channels: int
    dtype: str

    @classmethod
    def of(cls, path: str, data: bytes) -> Paired:
        """The file ``path`` (``data``, its bytes) as its own kind: 1 channel for a grey file, 4 with alpha, else 3;
        uint16 for a 16-bit (or 32-bit) grey file, else uint8. A PNG's kind is read from its header (`png_header`),
        other files' by Pillow."""
        header = png_header(data)
        mode = None if header is None else PNG_MODES.get(header[2:])
        if mode is None:
            with decode_errors(path), Image.open(io.BytesIO(data)) as image:
                mode = image.mode
        channels = 1 if mode in ("L", "1", "I", "I;16", "I;16B", "I;16L") else 4 if mode in ("RGBA", "LA", "PA") else 3
        return cls(path, channels, "uint16" if mode.startswith("I") else "uint8")

    def check_kind(self, data: bytes) -> None:
        """An `ImageError` naming the file when ``data`` (its bytes) is not of this kind: a column's paired pictures
        are all as its first file is, never converted to it (an 8-bit file among 16-bit ones, colours among grey)."""
        found = Paired.of(self.path, data)
        if (found.channels, found.dtype) != (self.channels, self.dtype):
            raise ImageError(self.path, f"a paired picture of {found.channels} channel(s) of {found.dtype}, where its "
                                        f"column's first file has {self.channels} of {self.dtype}: store every paired "
                                        "picture of a column as one kind")


def label_map_dtype(data: bytes, name: str) -> np.dtype:
    """The dtype a label map file's ids need: uint16 for a 16-bit or 32-bit grey file, else uint8.

    >>> label_map_dtype(open("2007_000032.png", "rb").read(), "2007_000032.png")  # doctest: +SKIP
    dtype('uint8')
    """
    header = png_header(data)
    if header is not None and header[2:] in ID_PNGS:
        return np.dtype(ID_PNGS[header[2:]])
    with _ids_image(data, name) as image:
        return np.dtype(ID_MODES[image.mode])


def decode_label_map(data: bytes, name: str, dtype: np.dtype) -> np.ndarray:
    """A label map file's ids, (height, width) of ``dtype``; an `ImageError` naming ``name`` for a file that
    is not a map of ids, or holds an id ``dtype`` cannot. A plain PNG of ids is decoded by the C extension
    (`_decoded_ids`), any other file by Pillow."""
    ids = _decoded_ids(data)
    if ids is None:
        with _ids_image(data, name) as image, decode_errors(name):
            ids = np.asarray(image)
    if ids.dtype == bool:
        ids = ids.astype(np.uint8)
    fits = np.can_cast(ids.dtype, dtype)  # every id of the file's kind fits: none to look for (two passes a map)
    if not fits and ids.size and (int(ids.max()) > np.iinfo(dtype).max or int(ids.min()) < 0):
        raise ImageError(name, f"the label map holds ids up to {int(ids.max())}, more than {np.dtype(dtype).name} "
                               "holds: pass mask_dtype='uint16'")
    return ids.astype(dtype, copy=False)


def _decoded_ids(data: bytes) -> np.ndarray | None:
    """The ids of a plain PNG of ids (a palette's indices, a grey file's values: `ID_PNGS`), decoded by
    the C extension outside the GIL (``decode_png``, built with zlib: its size and kind read from its IHDR,
    `png_ihdr`), as Pillow gives them; None for any other file, a damaged one, one of more pixels than Pillow
    opens (its error says so), or without the extension."""
    decode_png = getattr(native.extension, "decode_png", None)
    header = None if decode_png is None else png_ihdr(data)
    if header is None or header[2:] not in ID_PNGS:
        return None
    height, width = header[:2]
    if Image.MAX_IMAGE_PIXELS is not None and height * width > 2 * Image.MAX_IMAGE_PIXELS:
        return None
    ids = np.empty((height, width), ID_PNGS[header[2:]])
    return ids if decode_png(data, ids, True) else None


@contextmanager
def _ids_image(data: bytes, name: str) -> Iterator[Image.Image]:
    """The file opened by Pillow, checked to hold ids; an `ImageError` naming ``name`` if not."""
    with decode_errors(name), Image.open(io.BytesIO(data)) as image:
        if image.format in LOSSY:
            raise ImageError(name, f"a {image.format} label map: the format is lossy, so its ids are blurred into "
                                   "others; store label maps as PNG")
        if image.mode not in ID_MODES:
            raise ImageError(name, f"a label map of mode {image.mode!r} (colours): label maps are ids, one number a "
                                   "pixel (a palette or grey PNG); convert its colours to ids first")
        yield image


def check_placement(size: tuple[int, int], name: str, what: str, frame: tuple[tuple[int, int], int],
                    picture_name: str) -> None:
    """An `ImageError` naming ``name`` (a label map file, or a picture's annotations) when ``what`` (``"the label
    map is"``, ``"annotated as"``) places for a picture of ``size`` (height, width) cannot lie on the picture
    ``picture_name`` of ``frame`` (`outcore.imaging.decode.stored_frame`): another size, or the picture is stored
    turned or mirrored (EXIF), which decoding undoes for the picture alone."""
    stored, orientation = frame
    if orientation != 1:
        raise ImageError(name, f"its picture {picture_name} is stored turned or mirrored (EXIF orientation "
                               f"{orientation}): decoding turns the picture, not what lies on it; store it upright")
    if tuple(size) != stored:
        raise ImageError(name, f"{what} {size[0]}x{size[1]}, its picture {picture_name} is {stored[0]}x{stored[1]}: "
                               "targets must be of their picture's size")


def policy_crop(size: tuple[int, int], target: tuple[int, int], resize: ResizePolicy) -> tuple[float, float, float, float]:
    """The box ``(top, left, height, width)`` of a picture of ``size`` that the ``resize`` policy resizes to
    ``target`` (`outcore.imaging.fit`): all of it (``fit``), the centre that covers the target (``crop``), or, past
    its edges, the picture and the margins around it (``pad``). Label maps, boxes and keypoints move by it.

    >>> policy_crop((300, 400), (150, 150), "crop"), policy_crop((100, 200), (100, 100), "pad")
    ((0.0, 50.0, 300.0, 300.0), (-50.0, 0.0, 200.0, 200.0))
    """
    height, width = size
    if resize == "fit" or tuple(size) == tuple(target):
        return 0.0, 0.0, float(height), float(width)
    if resize == "crop":
        top, left, bottom, right = cover_box((height, width), target)
        return top, left, bottom - top, right - left
    if resize != "pad":
        raise OptionError(f"resize={resize!r} does not fit a {height}x{width} picture to {target[0]}x{target[1]}")
    scaled, (top, left) = pad_placement((height, width), target)
    sy, sx = scaled[0] / height, scaled[1] / width
    return -top / sy, -left / sx, target[0] / sy, target[1] / sx


def fit_label_map(ids: np.ndarray, size: tuple[int, int], resize: ResizePolicy, name: str) -> np.ndarray:
    """A label map (h, w[, c]) at ``size`` as the ``resize`` policy fits its picture (`outcore.imaging.fit`),
    nearest-neighbour: no id made or changed, 0 in a ``pad``'s margins."""
    height, width = ids.shape[:2]
    if (height, width) == tuple(size):
        return ids
    if resize is None:
        raise ImageError(name, f"label map is {height}x{width}, expected {size[0]}x{size[1]}; pass resize='crop' "
                               "(or resize='fit', resize='pad') to convert other sizes")
    crop = policy_crop((height, width), size, resize)
    return cut_label_maps(ids[None], np.array([crop]), size, np.zeros((1, 2), bool))[0]
