"""Delayed loaders: lazy, chunked Dask arrays of decoded images (and of their files' bytes), one
``dask.delayed`` task per block of samples."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dask
import numpy as np

from ..errors import ImageError, OptionError, SourceError
from ..imaging import (
    MAX_PIXELS,
    Drawing,
    Paired,
    Renumbered,
    ResizePolicy,
    check_placement,
    decode_image,
    decode_label_map,
    fit_image_files,
    fit_label_map,
    native,
    stored_frame,
    upright_size,
)
from ..storage import read_files_at_once
from .records.reader import SampleReader

if TYPE_CHECKING:
    import dask.array as da

BLOB_DTYPE = np.dtype(object)  # the bytes of one file per sample, between tasks (never stored as such)
ERROR_DTYPE = np.dtype("<U400")  # one message per sample; "" when the sample decoded
DIGEST_SIZE = 16  # bytes of a file's BLAKE2b digest (`file_digest`)
FILES = SampleReader()  # reads files by their paths


def file_digest(data: bytes) -> np.ndarray:
    """A file's content digest as stored in the ``file_digest`` field: BLAKE2b of 16 bytes, as ``uint8``.

    >>> file_digest(b"abc")[:4]
    array([207,  74, 183, 145], dtype=uint8)
    """
    return np.frombuffer(hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest(), dtype=np.uint8)


def path_block(paths: Sequence[str], start: int, stop: int) -> np.ndarray:
    """``paths[start:stop]`` as one array of ``str``, a task's argument: Dask walks a list item by item when it
    makes the task, on the one thread making them all, not an array. The task reads it back with ``.tolist()``.

    >>> path_block(["a.jpg", "b.jpg", "c.jpg"], 1, 3).tolist()
    ['b.jpg', 'c.jpg']
    """
    return np.array(paths[start:stop], dtype=str)


class Opaque:
    """A task's argument that Dask passes as it is, as `path_block` passes paths: a block's frames or layers (label map
    files, drawings, paired pictures) as a list would be walked item by item for collections and tokenized so, on
    the one thread making all the tasks (half an ingest's GIL, with a paired picture a sample). Its token is a digest
    of its pickled bytes, made once: all of its contents (a ``repr`` elides a large array's middle), never unpickled.

    >>> Opaque([((4, 6), 1)]).value
    [((4, 6), 1)]
    """

    __slots__ = ("_token", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._token = hashlib.blake2b(pickle.dumps(value, protocol=5), digest_size=16).hexdigest()

    def __dask_tokenize__(self) -> str:
        return self._token

    def __reduce__(self) -> tuple:
        return Opaque, (self.value,)


def image_array(
    paths: Sequence[str],
    shape: tuple[int, ...],
    *,
    resize: ResizePolicy,
    dtype: np.dtype,
    block_size: int,
    on_error: str = "raise",
    keep: tuple[str, ...] = ("pixels",),
    max_pixels: int | None = MAX_PIXELS,
    reader: SampleReader = FILES,
    layers: Mapping[str, tuple[Sequence[Layer], np.dtype]] | None = None,
    sizes: np.ndarray | None = None,
) -> tuple[da.Array | None, da.Array | None, da.Array, da.Array, dict[str, da.Array]]:
    """Return ``(pixels, files, errors, digests, maps)``: ``pixels[i]`` is ``paths[i]`` decoded and fitted to
    ``shape``, ``files[i]`` the file's bytes (an object array of ``bytes``), each ``None`` unless in
    ``keep``; ``digests[i]`` is the file's `file_digest` (zeros for a bad file); ``maps[name][i]`` is the label
    map or paired picture ``layers[name][0][i]`` of picture ``i`` (ids of ``layers[name][1]``, checked to lie under
    the picture, fitted to ``shape`` as it is: `outcore.imaging.label_maps`), decoded in the picture's task.

    Every file is decoded, whatever is kept, so a store of encoded files holds only files that decode.
    Each block of ``block_size`` samples is one task. Nothing is read until the arrays are computed.
    ``reader`` reads each path (a file's, or a record's of a record source, `outcore.ingest.records`).
    With ``on_error="raise"`` the first bad file stops the computation with an `ImageError` naming
    it; with ``"skip"`` a bad file gives zero pixels, empty bytes and its message in ``errors[i]``
    (``""`` for every good sample).

    >>> pixels, _, errors, _, _ = image_array(files, (64, 64, 3), resize="crop", dtype=np.dtype("uint8"),
    ...                                 block_size=256)  # doctest: +SKIP
    >>> pixels.chunks[0][:2]  # doctest: +SKIP
    (256, 256)
    """
    import dask.array as da  # here, not at the top: `outcore.ingest.imports`

    if on_error not in ("raise", "skip"):
        raise OptionError(f"on_error={on_error!r} is not 'raise' or 'skip'")
    layers = dict(layers or {})
    pixel_parts, file_parts, error_parts, digest_parts = [], [], [], []
    map_parts: dict[str, list[da.Array]] = {name: [] for name in layers}
    for start in range(0, len(paths), block_size):
        block_paths = path_block(paths, start, start + block_size)
        block_maps = {name: (list(files[start : start + block_size]), map_dtype)
                      for name, (files, map_dtype) in layers.items()}
        block_sizes = None if sizes is None else np.asarray(sizes[start : start + block_size])
        task = dask.delayed(_load_block, pure=True, nout=5)(block_paths, shape, resize, dtype, on_error, keep,
                                                            max_pixels, reader, block_maps, block_sizes)
        pixel_parts.append(da.from_delayed(task[0], (len(block_paths), *shape), dtype=dtype))
        file_parts.append(da.from_delayed(task[1], (len(block_paths),), dtype=BLOB_DTYPE))
        error_parts.append(da.from_delayed(task[2], (len(block_paths),), dtype=ERROR_DTYPE))
        digest_parts.append(da.from_delayed(task[3], (len(block_paths), DIGEST_SIZE), dtype=np.uint8))
        for name, (files, map_dtype) in layers.items():
            map_parts[name].append(da.from_delayed(task[4][name], (len(block_paths), *shape[:2], *_channels(files)),
                                                   dtype=map_dtype))
    return (
        da.concatenate(pixel_parts) if "pixels" in keep else None,
        da.concatenate(file_parts) if "files" in keep else None,
        da.concatenate(error_parts),
        da.concatenate(digest_parts),
        {name: da.concatenate(parts) for name, parts in map_parts.items()},
    )


def _load_block(
    block: np.ndarray, shape: tuple[int, ...], resize: ResizePolicy, dtype: np.dtype, on_error: str,
    keep: tuple[str, ...], max_pixels: int | None, reader: SampleReader,
    layers: Mapping[str, tuple[list[Layer], np.dtype]], sizes: np.ndarray | None,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    paths: list[str] = block.tolist()  # `path_block`
    pixels = np.zeros((len(paths), *shape), dtype=dtype) if "pixels" in keep else None
    files = np.full(len(paths), b"", dtype=BLOB_DTYPE) if "files" in keep else None
    errors = np.zeros(len(paths), dtype=ERROR_DTYPE)
    digests = np.zeros((len(paths), DIGEST_SIZE), dtype=np.uint8)
    maps = {name: np.zeros((len(paths), *shape[:2], *_channels(files)), map_dtype)
            for name, (files, map_dtype) in layers.items()}
    left = range(len(paths))
    if reader.paths_are_files() and pixels is not None and files is None and not layers and sizes is None and \
            dtype == np.uint8 and len(shape) == 3 and shape[2] in (1, 3):  # JPEGs and PNGs in one C call
        fitted = fit_image_files(paths, resize, pixels, digests, max_pixels)
        left = left if fitted is None else fitted
    for i in left:
        path = paths[i]
        try:
            data = reader.read(path)
            decode_image(data, shape, resize, dtype, path, out=pixels[i] if pixels is not None else None,
                         max_pixels=max_pixels)
            frame = stored_frame(data, path, None) if sizes is not None or layers else None  # one header read
            if sizes is not None:
                check_placement(tuple(sizes[i].tolist()), path, "annotated as", frame, path)
            for name, (sources, map_dtype) in layers.items():
                maps[name][i] = load_layer(sources[i], map_dtype, frame, path, reader, max_pixels, (shape, resize))
        except ImageError as error:
            if on_error == "raise":
                raise bad_file(error) from None
            errors[i] = str(error)[: ERROR_DTYPE.itemsize // 4]
            if pixels is not None:
                pixels[i] = 0  # a failed decode may have written part of the sample
            for values in maps.values():
                values[i] = 0
            continue
        digests[i] = file_digest(data)
        if files is not None:
            files[i] = data
    return pixels, files, errors, digests, maps


Layer = str | Drawing | Renumbered | Paired  # what lies on a picture: a label map (a file, drawn, renumbered), a picture


def load_layer(source: Layer, dtype: np.dtype, frame: tuple[tuple[int, int], int], picture: str, reader: SampleReader,
               max_pixels: int | None, fit: tuple[tuple[int, ...], ResizePolicy] | None = None) -> np.ndarray:
    """The label map (ids of ``dtype``) or paired picture ``source`` of the picture ``picture`` (of ``frame``,
    `outcore.imaging.stored_frame`), checked to lie under it (an `ImageError` naming the file), at the picture's own
    size, or fitted to ``fit``'s shape as its resize policy fits the picture (`outcore.imaging.label_maps`)."""
    if isinstance(source, Paired):  # a picture: fitted as its picture is, by the same box
        paired = reader.read(source.path)
        check_placement(upright_size(paired, source.path), source.path, "the paired picture is", frame, picture)
        source.check_kind(paired)
        shape = (None, None, source.channels) if fit is None else (*fit[0][:2], source.channels)
        return decode_image(paired, shape, None if fit is None else fit[1], np.dtype(source.dtype), source.path,
                            max_pixels=max_pixels)
    if isinstance(source, Drawing):
        ids, shown = source.draw(dtype), source.name
    else:
        shown = source.path if isinstance(source, Renumbered) else source
        ids = decode_label_map(reader.read(shown), shown, dtype)
        ids = source.apply(ids) if isinstance(source, Renumbered) else ids
    check_placement(ids.shape[:2], shown, "the label map is", frame, picture)
    return ids if fit is None else fit_label_map(ids, fit[0][:2], fit[1], shown)


def raster_array(paths: Sequence[str], frames: Sequence[tuple[tuple[int, int], int]], layers: Sequence[Layer],
                 dtype: np.dtype, block_size: int, *, on_error: str = "raise", max_pixels: int | None = MAX_PIXELS,
                 reader: SampleReader = FILES) -> tuple[da.Array, da.Array]:
    """``(rasters, errors)`` for pictures kept at their own size: ``rasters[i]`` is the label map or paired
    picture ``layers[i]`` of picture ``paths[i]`` of ``frames[i]`` (its upright size and EXIF orientation, as the
    survey found them: the picture is not read again) (`load_layer`), at the picture's size, its pixels as rows
    ((h x w,) or (h x w, channels): a raster field's, `outcore.format.attrs`), as an object array, one task per
    block; a picture the survey left out (``""``) has none. A layer that cannot be loaded raises its `ImageError`, or, with
    ``on_error="skip"``, gives no rows and its message in ``errors[i]`` (``""`` for every good one)."""
    import dask.array as da

    load = dask.delayed(_load_rasters, pure=True, nout=2)
    rasters, errors = [], []
    for start in range(0, len(paths), block_size):
        count = len(paths[start : start + block_size])
        task = load(path_block(paths, start, start + block_size), Opaque(list(frames[start : start + block_size])),
                    Opaque(list(layers[start : start + block_size])), dtype, on_error, max_pixels, reader)
        rasters.append(da.from_delayed(task[0], (count,), dtype=BLOB_DTYPE))
        errors.append(da.from_delayed(task[1], (count,), dtype=ERROR_DTYPE))
    return da.concatenate(rasters), da.concatenate(errors)


def _load_rasters(block: np.ndarray, framed: Opaque, layered: Opaque, dtype: np.dtype, on_error: str,
                  max_pixels: int | None, reader: SampleReader) -> tuple[np.ndarray, np.ndarray]:
    paths: list[str] = block.tolist()  # `path_block`
    frames: list[tuple[tuple[int, int], int]] = framed.value
    layers: list[Layer] = layered.value
    rasters, errors = np.empty(len(paths), BLOB_DTYPE), np.zeros(len(paths), ERROR_DTYPE)
    channels = _channels(layers)
    decoded = _layers_at_once(paths, frames, layers, dtype, reader)
    for i, out in decoded.items():
        rasters[i] = out.reshape(-1, *channels)
    for i, path in enumerate(paths):
        if i in decoded:
            continue
        rasters[i] = np.zeros((0, *channels), dtype if not channels else layers[i].dtype)
        if not path:
            continue
        try:
            rasters[i] = load_layer(layers[i], dtype, frames[i], path, reader, max_pixels).reshape(-1, *channels)
        except ImageError as error:
            if on_error == "raise":
                raise bad_file(error) from None
            errors[i] = str(error)[: ERROR_DTYPE.itemsize // 4]
    return rasters, errors


def _layers_at_once(paths: Sequence[str], frames: Sequence[tuple[tuple[int, int], int]], layers: Sequence[Layer],
                    dtype: np.dtype, reader: SampleReader) -> dict[int, np.ndarray]:
    """The label map files (ids of ``dtype``) or paired pictures of a block's pictures (local files, the pictures stored
    upright) that are plain PNGs of their picture's size (`outcore.imaging.decode.png_header`), read and decoded by one
    call of the C extension outside the GIL (``decode_png_files``): a map's ids as `decode_label_map` gives them, of
    ``dtype``'s depth; a paired picture of its column's kind (`Paired.check_kind`) as `decode_image` gives it; by
    position. The others are left to `load_layer`, which decodes them or words what is wrong (none at all without the
    extension, or from a reader of its own: `SampleReader.paths_are_files`)."""
    decode = getattr(native.extension, "decode_png_files", None)
    if decode is None or not reader.paths_are_files() or not layers:
        return {}
    paired = isinstance(layers[0], Paired)
    if not paired and dtype not in (np.uint8, np.uint16):
        return {}
    wanted = [i for i, (path, frame, layer) in enumerate(zip(paths, frames, layers, strict=True))
              if path and frame[1] == 1 and (isinstance(layer, Paired) if paired else type(layer) is str)]
    outs = [np.empty((*frames[i][0], layers[i].channels), layers[i].dtype) if paired else np.empty(frames[i][0], dtype)
            for i in wanted]
    left = set(decode([layers[i].path if paired else layers[i] for i in wanted], outs, not paired, paired))
    return {i: out for k, (i, out) in enumerate(zip(wanted, outs, strict=True)) if k not in left}


def _channels(layers: Sequence[Layer]) -> tuple[int, ...]:
    """The axes past a layer's height and width: its channels for paired pictures, none for label maps."""
    return (layers[0].channels,) if layers and isinstance(layers[0], Paired) else ()


def bad_file(error: ImageError) -> ImageError:
    """The error that stops an ingest at a bad file, saying what to do."""
    return ImageError(error.path, f"{error.reason}. Fix or remove the file, or pass on_error='skip' to skip it")


def first_errors(errors: da.Array | None, more: da.Array) -> da.Array:
    """Each sample's message in ``errors``, else in ``more`` (``""`` where neither has one: a good sample)."""
    import dask.array as da

    return more if errors is None else da.where(errors != "", errors, more)


def file_array(paths: Sequence[str], nbytes: np.ndarray, block_size: int, reader: SampleReader = FILES) -> da.Array:
    """``files[i]``: the bytes of ``paths[i]`` (``b""`` where the path is ``""``), read without decoding, one
    task per block; a file whose size is no longer ``nbytes[i]`` is a `SourceError` (it changed during
    the ingest)."""
    import dask.array as da

    read = dask.delayed(_read_block, pure=True)
    parts = [da.from_delayed(read(path_block(paths, start, start + block_size), nbytes[start : start + block_size], reader),
                             (len(paths[start : start + block_size]),), dtype=BLOB_DTYPE)
             for start in range(0, len(paths), block_size)]
    return da.concatenate(parts)


def _read_block(block: np.ndarray, nbytes: np.ndarray, reader: SampleReader) -> np.ndarray:
    paths: list[str] = block.tolist()  # `path_block`
    files = np.full(len(paths), b"", dtype=BLOB_DTYPE)
    at_once = read_files_at_once is not None and reader.paths_are_files()
    if at_once:
        files[:] = read_files_at_once(paths, np.asarray(nbytes, np.int64))  # None: left to the reader, which says why
    for i in np.flatnonzero(np.equal(files, None)) if at_once else range(len(paths)):
        path = paths[i]
        files[i] = b""
        if not path:
            continue
        try:
            files[i] = reader.read(path)
        except ImageError as error:
            raise SourceError(f"{path}: {error.reason} since the ingest began; run it again") from None
        if len(files[i]) != nbytes[i]:
            raise SourceError(f"{path} changed during the ingest ({nbytes[i]} bytes when it was decoded, "
                              f"{len(files[i])} now); run the ingest again")
    return files
