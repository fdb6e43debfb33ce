"""Ingest pictures: an image folder (class = sub-folder) or a table of image paths and labels."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from ..dataset import Dataset, open_dataset
from ..errors import ImageError, OptionError, SourceError
from ..format import (
    IMAGE_ENCODING,
    RAGGED_ENCODING,
    RANGES_SUFFIX,
    RASTER_ENCODING,
    SHAPES_SUFFIX,
    TEXT_ENCODING,
    WEIGHT_NAMES,
    Compression,
    FieldInfo,
    ImageDecode,
    Layout,
    encode_text,
)
from ..storage import check_target
from .append import append_table
from .arrays import SOURCE_INDEX_FIELD
from .build import BuildOptions, FieldSource, build_store, store_name
from .choice import ImagesChoice, choose_images
from .decode_tasks import file_array, first_errors, image_array, raster_array
from .fields import (
    ENCODED_FIELD,
    FILE_DIGEST_FIELD,
    FILE_STAT_FIELD,
    IMAGE_FIELD,
    PATH_FIELD,
    PATH_WIDTH,
    file_stats,
)
from .imports import after_imports
from .options import IngestKeywords, IngestOptions
from .permute import as_dask, write_order
from .records.reader import SampleReader
from .resume import images_chosen_before
from .sources import SourceTable, scan_image_folder, table_from_dataframe
from .survey import Survey, SurveyOptions, survey_images

if TYPE_CHECKING:
    import dask.array as da
    import pandas as pd


def ingest_images(
    source: str | os.PathLike,
    location: str | os.PathLike,
    *,
    append: bool = False,
    by_content: bool = False,
    **options: Unpack[IngestKeywords],
) -> Dataset:
    """Ingest a folder of images, labelled by sub-folder (``source/<class>/<image>``), into a new store
    at ``location``, with the ``options`` of `IngestKeywords` (``shape`` is required).

    The store gets fields ``images`` (N, H, W, C), ``labels`` (class indices; names in ``ds.classes``),
    ``path`` (each sample's file, relative to ``source``) and ``source_index`` (its position in the
    sorted file list). With ``shuffle_on_write`` (the default) samples are stored in a random order
    drawn from ``seed``. ``source`` may be a folder in an object store (``s3://bucket/photos/train``, read
    where it is, with ``storage_options``, which then serve both). A ``.zip`` location writes a single
    file; an object store URL (``s3://``, ``gs://``, ``az://``, reached with ``storage_options`` or the
    standard environment) gets each shard
    uploaded as it is written and the store published once complete (`outcore.storage.upload`). ``client`` (default: the active
    ``distributed.Client``, else local threads) runs the decoding and writing.

    ``images`` chooses how the pictures are stored: ``"pixels"`` (decoded, ready to read),
    ``"encoded"`` (the files' own bytes, several times smaller, decoded to ``shape`` while reading) or
    ``"both"`` (pixels in ``images``, the files in ``images_encoded``); ``None`` (the default) chooses
    for this machine (`outcore.ingest.choice`): pixels when the pixel store fits in the memory the page
    cache can give, else the faster kind as measured on the device under ``location`` and the cores
    (encoded pictures with ``shape=None`` or ``max_side``); the choice and why are printed (with
    ``progress``), and the provenance's recipe says it was chosen. An append stores what the store holds. Every file is decoded at ingest
    either way, so bad files are found now, not in the middle of training; an image of more than
    ``max_pixels`` pixels (a decompression bomb) counts as a bad file.

    Encoded pictures can keep their own sizes: ``shape=None`` (or ``(None, None, C)``) stores each one's
    shape beside its bytes, for crops drawn from the whole picture while reading (``RandomResizedCrop``,
    fused with decoding). ``max_side`` caps them: a picture whose longer side is larger is resized to
    it and re-encoded once, as a JPEG of ``quality`` (PNG for 4 channels); the others keep their bytes.

    The store appears at ``location`` only when complete (replacing an old one with ``overwrite`` in
    one step). An ingest that was killed or interrupted (Ctrl-C) keeps its finished shards beside the
    target: ``resume=True`` continues it — when the files, labels and settings are the same — and
    gives the store an uninterrupted run would have; otherwise the next ingest removes them, saying so.
    The same ingest run again (a notebook, a script) returns the store it finished, with a warning
    saying so; another ingest onto it is a `StoreExistsError` naming what differs (``overwrite=True``
    replaces it).

    ``append=True`` adds to the store (made by an earlier ingest, with the same settings) the files it
    does not hold yet, known by path, size and modification time (``by_content=True``: by their bytes,
    so a file renamed or only touched is not added again); new classes extend the class list, old
    numbers kept; the new part is shuffled within itself; readers see the old count or the new one
    (`outcore.ingest.append`). A stored file that changed is an error naming it.

    >>> ds = outcore.ingest_images("photos/train", "train.zarr", shape=(128, 128, 3))  # doctest: +SKIP
    >>> ds.classes  # doctest: +SKIP
    ['cat', 'dog']
    >>> imagenet = outcore.ingest_images("imagenet/train", "train.zarr", shape=None, images="encoded",
    ...                                  max_side=512)  # doctest: +SKIP
    """
    settings = IngestOptions.of(options)
    check_target(location)  # before any work: a URL outcore cannot write to is refused, never made a local folder
    table = scan_image_folder(source, storage_options=settings.storage_options)
    return ingest_or_append(table, location, settings, append, by_content)


def ingest_dataframe(
    frame: pd.DataFrame | str | os.PathLike,
    location: str | os.PathLike,
    *,
    path_column: str = "path",
    label_columns: Sequence[str] = (),
    label_dtype: str | Mapping[str, str] | None = None,
    root: str | os.PathLike | None = None,
    mask_columns: Sequence[str] = (),
    mask_dtype: str | None = None,
    pair_columns: Sequence[str] = (),
    append: bool = False,
    by_content: bool = False,
    **options: Unpack[IngestKeywords],
) -> Dataset:
    """Ingest the images listed in a DataFrame or CSV file, with one label field per ``label_columns`` and one
    label map field per ``mask_columns``.

    Relative paths are taken from ``root`` (default: the CSV's folder, or the current folder for a
    DataFrame). String labels are stored as class indices with their names (sorted, numerically when
    every name is a number); numbers as they are. A column of numbers with a few other cells is an error
    naming the rows; ``label_dtype`` (``"class"``, ``"int64"``, ``"float32"``, or a dict per column)
    says what a column holds instead of letting the cells decide.
    A mask column holds the path of each picture's label map: a PNG of ids at the picture's size (a palette PNG
    as Pascal VOC's, 255 its void; a grey one as Cityscapes' labelIds; 16-bit as its instanceIds), stored as a
    field of ``mask_dtype`` ids (``"uint8"``, ``"uint16"``; by default what the column's first file needs)
    fitted to ``shape`` as the pictures are, nearest-neighbour (no id is made or changed), or, with
    ``shape=None``, kept at its picture's own size (a raster field: `outcore.format.attrs`). A label map of
    another size than its picture, or of a picture stored turned (EXIF), is an error naming it; so is a colour
    or JPEG one. Transforms move the maps with the pictures when told (`outcore.transforms.Targets`). A pair
    column holds the path of a picture paired with each (its depth, a second view: of its size, fitted as it is,
    bilinear; its channels and depth those of the column's first file).
    Paths that do not exist are an error, or skipped and reported with ``on_error="skip"``. The other
    keywords are those of every ingest (`IngestKeywords`), and ``append``/``by_content`` as in `ingest_images`.

    >>> ds = outcore.ingest_dataframe("labels.csv", "train.zarr", path_column="path",
    ...                               label_columns=["label"], shape=(64, 64, 3))  # doctest: +SKIP
    """
    settings = IngestOptions.of(options)
    check_target(location)
    table = table_from_dataframe(frame, path_column, label_columns, root, label_dtype,
                                 storage_options=settings.storage_options, mask_columns=mask_columns,
                                 mask_dtype=mask_dtype, pair_columns=pair_columns)
    return ingest_or_append(table, location, settings, append, by_content)


def missing_files_error(table: SourceTable) -> SourceError:
    """The error for files a table lists that do not exist (with ``on_error="raise"``)."""
    shown = ", ".join(repr(p) for p in table.missing[:3])
    return SourceError(
        f"{len(table.missing)} of {len(table)} files listed in {table.description} do not exist "
        f"(e.g. {shown}); correct the paths or root=, or pass on_error='skip' to skip them"
    )


def ingest_or_append(table: SourceTable, location: str | os.PathLike, options: IngestOptions, append: bool,
                      by_content: bool, classes: Mapping[str, Sequence[str]] | None = None) -> Dataset:
    """Ingest ``table`` into a new store at ``location``, or with ``append`` add its new files to it; files the
    table lists that do not exist are an error (``on_error="raise"``) or skipped and reported."""
    if table.missing and options.on_error == "raise":
        raise missing_files_error(table)
    if append and table.layers:
        raise OptionError(f"append=True adds pictures without what lies on them; the columns {sorted(table.layers)} "
                          "are ingested into a new store")
    if append and table.reader is not None:
        raise OptionError(f"append=True adds the new files of a local image folder or CSV; {table.description} is "
                          "ingested into a new store")
    if append:
        return append_table(table, location, _ingest_table, options, by_content=by_content, classes=classes)
    if by_content:
        raise OptionError("by_content=True says how an append tells new files from stored ones: pass append=True")
    return _ingest_table(table, location, options)


def ingest_table(table: SourceTable, location: str | os.PathLike, options: IngestOptions, *, append: bool = False,
                 by_content: bool = False, classes: Mapping[str, Sequence[str]] | None = None) -> Dataset:
    """Ingest the files of ``table`` into a store at ``location`` with ``options``; with ``append``, add
    them to it, ending with the class lists ``classes`` when given (`outcore.ingest.append.append_table`)."""
    check_target(location)
    return ingest_or_append(table, location, options, append, by_content, classes)


def _ingest_table(table: SourceTable, location: str | os.PathLike, options: IngestOptions) -> Dataset:
    """Write the files of ``table`` into a new store at ``location`` (see `ingest_images`)."""
    shape, resize, dtype, images = options.shape, options.resize, options.dtype, options.images
    progress, storage_options = options.progress, options.storage_options
    _check_label_names(table)
    if table.layers and options.max_side is not None:
        raise OptionError(f"max_side= shrinks pictures without what lies on them ({sorted(table.layers)}): leave it "
                          "out (each is kept at its picture's own size), or pass shape= to fit both")
    if table.instances and options.max_side is not None:
        raise OptionError(f"max_side= shrinks pictures after their boxes and keypoints ({sorted(table.instances)}) "
                          "were placed: leave it out, or pass shape= to fit both")
    skip = options.on_error == "skip"
    order = write_order(len(table), options.shuffle_on_write, options.seed)
    paths = [table.paths[i] for i in order]
    stats = table.stats[order] if table.stats is not None else file_stats(paths)  # (N, 2): sizes, times
    layout = Layout.for_samples(_layout_sample_nbytes(shape, dtype, stats), len(table), options.chunk_size)
    reader = table.reader or SampleReader()
    chosen = None
    if images is None and not options.overwrite:  # the same ingest again returns its store: compare like with like
        images = images_chosen_before(location, storage_options)
    if images is None:
        chosen = ImagesChoice("encoded", "shape=None and max_side= store the pictures as files") if options.surveyed \
            else \
            choose_images(location, paths, stats[:, 0], math.prod(shape) * dtype.itemsize,
                          layout.chunk_size, {"shape": shape, "resize": resize, "dtype": dtype}, reader.read)
        images = chosen.images
        if progress:
            print(f"images={images!r}: {chosen.reason} (pass images= to choose)", file=sys.stderr)
    sizes = None if table.sizes is None else table.sizes[order]
    build = BuildOptions(layout, Compression.parse(options.compression), options.client, progress,
                         options.overwrite, storage_options)
    settings = {"shape": shape, "resize": resize, "dtype": dtype.str, "images": images, "max_side": options.max_side,
                "quality": options.quality, "layout": layout, "compression": str(build.compression),
                "shuffle_on_write": options.shuffle_on_write, "seed": options.seed, "on_error": options.on_error,
                "max_pixels": options.max_pixels}
    decode = ImageDecode(shape, dtype.name, None if shape[0] is None else resize)
    recipe = options.recipe(images)
    if chosen is not None:  # the reason, with the machine's figures of the moment, is said, not kept
        recipe["images_chosen"] = True
    run = {"shuffled_on_write": options.shuffle_on_write, "seed": options.seed if options.shuffle_on_write else None,
           "source": table.description, "manifest": _manifest(table, order, stats, settings),
           "resume": options.resume, "recipe": recipe}
    if options.surveyed:
        survey = SurveyOptions(decode.channels, dtype, options.max_side, options.quality, options.on_error,
                               options.max_pixels)

        def prepare(scratch: Path) -> tuple[dict[str, FieldSource], da.Array | None]:
            # made beside the survey's tasks, on the thread that imports dask.array while they run
            table_fields = after_imports(functools.partial(_table_fields, table, order, stats, layout.shard_size))
            found = survey_images(paths, survey, scratch, client=options.client, progress=progress,
                                  description=f"survey → {store_name(location)}", reader=reader)
            if sizes is not None and (found.shapes[:, :2] != sizes).any():
                wrong = int(np.argmax((found.shapes[:, :2] != sizes).any(axis=1)))
                raise ImageError(paths[wrong], f"annotated as {sizes[wrong, 0]}x{sizes[wrong, 1]}, the picture is "
                                               f"{found.shapes[wrong, 0]}x{found.shapes[wrong, 1]}: targets must be "
                                               "of their picture's size")
            files = FieldSource(file_array(found.paths, found.nbytes, layout.shard_size, reader),
                                FieldInfo("input", encoding=IMAGE_ENCODING, decode=decode), found.nbytes,
                                found.shapes if decode.variable else None)
            digests = FieldSource(as_dask(found.digests, layout.shard_size), FieldInfo("metadata"))
            rasters, errors = _raster_fields(table, order, found, layout.shard_size, options, reader)
            errors = first_errors(errors, as_dask(found.errors, layout.shard_size))
            fields = table_fields.result()
            return {IMAGE_FIELD: files, **fields, **rasters, FILE_DIGEST_FIELD: digests}, errors if skip else None

        build_store(location, prepare, build, **run)
        return open_dataset(location, storage_options=storage_options)
    # One task decodes a whole shard's images and the write task that needs them runs where they are:
    # decoded pixels (7x the JPEG bytes) never travel between workers.
    pixels, files, errors, digests, maps = image_array(
        paths, shape, resize=resize, dtype=dtype, block_size=layout.shard_size, on_error=options.on_error,
        keep={"pixels": ("pixels",), "encoded": ("files",), "both": ("pixels", "files")}[images],
        max_pixels=options.max_pixels, reader=reader,
        layers={name: ([files[i] for i in order], map_dtype) for name, (files, map_dtype) in table.layers.items()},
        sizes=sizes,
    )
    fields, images_fields = _table_fields(table, order, stats, layout.shard_size), {}
    if pixels is not None:
        images_fields[IMAGE_FIELD] = FieldSource(pixels, FieldInfo("input"))
    if files is not None:
        images_fields[ENCODED_FIELD if pixels is not None else IMAGE_FIELD] = FieldSource(
            files, FieldInfo("other" if pixels is not None else "input", encoding=IMAGE_ENCODING, decode=decode),
            nbytes=stats[:, 0].copy(),
        )
    # with on_error="raise" a bad file stops the ingest: no sample is left out, and each shard is final
    # (uploaded as soon as it is written, for an object store) instead of kept for compaction
    fields[FILE_DIGEST_FIELD] = FieldSource(digests, FieldInfo("metadata"))
    paired = table.paired
    fields.update({name: FieldSource(values, FieldInfo("input" if name in paired else "target"))
                   for name, values in maps.items()})
    build_store(location, {**images_fields, **fields}, build, errors=errors if skip else None, **run)
    return open_dataset(location, storage_options=storage_options)


def _raster_fields(table: SourceTable, order: np.ndarray, found: Survey, block_size: int, options: IngestOptions,
                   reader: SampleReader) -> tuple[dict[str, FieldSource], da.Array | None]:
    """The label maps and paired pictures of pictures kept at their own size, as raster fields (`raster_array`;
    ``found`` the survey of the pictures, in the stored order), and the errors of the layers that could not be
    loaded (None without layers)."""
    fields, errors, shapes = {}, None, found.shapes
    pixels = shapes[:, 0].astype(np.int64) * shapes[:, 1]
    frames = [((h, w), o) for (h, w, _), o in zip(shapes.tolist(), found.orientations.tolist(), strict=True)] \
        if table.layers else []
    for name, (sources, map_dtype) in table.layers.items():
        layers = [sources[i] for i in order]
        values, failed = raster_array(found.paths, frames, layers, map_dtype, block_size, on_error=options.on_error,
                                      max_pixels=options.max_pixels, reader=reader)
        paired = name in table.paired
        dtype, channels = (np.dtype(layers[0].dtype), (layers[0].channels,)) if paired else (map_dtype, ())
        info = FieldInfo("input" if paired else "target", encoding=RASTER_ENCODING, dtype=dtype.name,
                         sample_shape=channels)
        fields[name] = FieldSource(values, info, pixels, np.column_stack([shapes[:, :2], np.full(len(shapes),
                                                                           channels[0] if channels else 1)]))
        errors = first_errors(errors, failed)
    return fields, errors


def _check_label_names(table: SourceTable) -> None:
    """Label columns may not take the names of outcore's own fields or of their arrays."""
    reserved = {IMAGE_FIELD, ENCODED_FIELD, PATH_FIELD, SOURCE_INDEX_FIELD, FILE_STAT_FIELD, FILE_DIGEST_FIELD}
    clash = {name for name in [*table.labels, *table.layers, *table.instances]
             if {name, name.removesuffix(RANGES_SUFFIX), name.removesuffix(SHAPES_SUFFIX)} & reserved}
    if clash:
        raise SourceError(f"label column(s) {sorted(clash)} clash with outcore's own field names; rename them")


def _layout_sample_nbytes(shape: tuple[int | None, ...], dtype: np.dtype, stats: np.ndarray) -> int:
    """The sample size chunks are laid out for: about 8 MiB of decoded pixels per chunk, even when files
    are stored (the shuffle buffer holds them decoded); pictures kept at their own size are only ever
    cropped while decoding, so their chunks hold about 2 MiB of files."""
    if shape[0] is None:
        return 4 * int(stats[:, 0].sum()) // max(1, len(stats))
    return math.prod(shape) * dtype.itemsize


def _table_fields(table: SourceTable, order: np.ndarray, stats: np.ndarray,
                  block_size: int) -> dict[str, FieldSource]:
    """The fields beside the pictures, in the stored order: labels, ``path``, ``source_index`` and
    ``file_stat`` (what an append compares to find the files that are new)."""
    fields = {}
    for name, values in table.labels.items():
        role = "sample_weight" if name in WEIGHT_NAMES and name not in table.classes else "target"
        fields[name] = FieldSource(as_dask(values[order], block_size), FieldInfo(role, table.classes.get(name)))
    for name, rows in table.instances.items():  # in memory: boxes, their labels, keypoints
        fields[name] = FieldSource(rows.take(order), FieldInfo("target", table.classes.get(name), RAGGED_ENCODING,
                                                               dtype=rows.values.dtype.name, sample_shape=rows.row_shape,
                                                               points=table.points.get(name)))
    fields[PATH_FIELD] = FieldSource(
        as_dask(encode_text(np.array(table.names)[order], PATH_WIDTH), block_size),
        FieldInfo("metadata", encoding=TEXT_ENCODING),
    )
    fields[SOURCE_INDEX_FIELD] = FieldSource(as_dask(order, block_size), FieldInfo("metadata"))
    fields[FILE_STAT_FIELD] = FieldSource(as_dask(np.asarray(stats, dtype=np.int64).reshape(-1, 2), block_size),
                                          FieldInfo("metadata"))
    return fields


def _manifest(table: SourceTable, order: np.ndarray, stats: np.ndarray, settings: dict[str, Any]) -> dict[str, Any]:
    """What a run writes, from what: the files in the source's order with their sizes and modification
    times (``stats`` (N, 2) in the stored ``order``, which the seed setting makes), the labels
    and names, and every setting. A resumed run must match it exactly; the parts apart, so that a
    mismatch can say which differs (`outcore.ingest.resume.manifest_differences`)."""
    files = _files_json(table.paths, stats[np.argsort(order)])  # sample j's file is table.paths[j], stored at order's j
    labels = hashlib.sha256(json.dumps(table.names).encode())
    for name in sorted(table.labels):
        labels.update(name.encode() + np.ascontiguousarray(table.labels[name]).tobytes())
        labels.update(json.dumps(table.classes.get(name)).encode())
    for name in sorted(table.layers):  # which label map lies under each picture (their bytes: as the pictures')
        sources, map_dtype = table.layers[name]
        labels.update(json.dumps([name, map_dtype.str, [repr(sources[i]) for i in order]]).encode())
    for name in sorted(table.instances):
        rows = table.instances[name].take(order)
        labels.update(name.encode() + rows.values.tobytes() + rows.offsets.tobytes())
    return {"ingest": "images", "files": len(table),
            "fingerprint": hashlib.sha256(files.encode()).hexdigest(),
            "labels": labels.hexdigest(), "settings": {name: repr(value) for name, value in settings.items()}}


def _files_json(paths: Sequence[str], stats: np.ndarray) -> str:
    """``json.dumps([[j, paths[j], [size, time]], ...])`` of each file's (size, time) in ``stats``, written without a
    list a file: at 100,000 files the garbage collector's passes over those lists cost more than the writing.

    >>> _files_json(["a.jpg", "b.jpg"], np.array([[5, 7], [6, 8]]))
    '[[0, "a.jpg", [5, 7]], [1, "b.jpg", [6, 8]]]'
    """
    quote = json.encoder.encode_basestring_ascii  # what json.dumps quotes strings with
    files = zip(range(len(paths)), paths, stats[:, 0].tolist(), stats[:, 1].tolist(), strict=True)
    return "[" + ", ".join([f"[{j}, {quote(path)}, [{size}, {time}]]" for j, path, size, time in files]) + "]"
