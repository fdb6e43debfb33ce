"""Ingest pictures from record files as they are: TFRecord, WebDataset tars, LMDB, Parquet and Hugging
Face datasets, on this machine or in an object store (`outcore.ingest.records`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Unpack

from ..dataset import Dataset
from ..errors import SourceError
from ..storage import check_target
from ..storage.remote import is_object_url, redact
from ..storage.upload import local_mirror
from .images import ingest_or_append
from .options import IngestKeywords, IngestOptions
from .placement import placed
from .record_table import record_table
from .records import name_of, parse_format, recognise, record_files
from .records.locations import common_root, file_version
from .records.spill import unpacking
from .sources import SourceTable


def ingest_records(
    source: str | os.PathLike | Sequence[str | os.PathLike],
    location: str | os.PathLike,
    *,
    format: Any = None,
    **options: Unpack[IngestKeywords],
) -> Dataset:
    """Ingest the pictures and labels of record files into a new store at ``location``, reading them
    where they are (no unpacking into files first).

    ``source`` is a file, a folder, a glob or brace pattern (``shards/train-{000000..000099}.tar``), a
    list of these, or the same in an object store (``s3://``, ``gs://``, ``az://``, ``https://``, read
    with ``storage_options`` or the standard environment). ``format`` is recognised from what ``source``
    holds, or named: ``"tfrecord"``, ``"webdataset"``, ``"lmdb"``, ``"parquet"`` (also Hugging Face
    datasets saved with ``save_to_disk``), or a format object saying which features, members or
    columns hold the picture and the labels (`outcore.TFRecord`, `outcore.WebDataset`, `outcore.LMDB`,
    `outcore.Parquet`).

    The store's fields are those of `ingest_images`: ``images``, the labels (with their class names:
    a ``ClassLabel``'s, ImageNet's class texts, or text labels made classes), ``path`` (each sample's
    file and record, e.g. ``train-00000.tfrecord::record 17``) and ``source_index``. A damaged record (a
    bad checksum, a truncated file, a picture that does not decode) is an error naming it, or with
    ``on_error="skip"`` left out and named in the report. The other keywords are those of
    every ingest (`IngestKeywords`). Boxes (``format=outcore.TFRecord.object_detection()``: TensorFlow's object
    detection records) are stored as ragged fields, fitted to ``shape=`` with their pictures (see `ingest_coco`).

    >>> ds = outcore.ingest_records("imagenet/train-*-of-01024", "train.zarr", shape=None, images="encoded",
    ...                             max_side=512)  # doctest: +SKIP
    >>> ds = outcore.ingest_records("s3://bucket/shards/", "train.zarr", shape=(128, 128, 3),
    ...                             format=outcore.WebDataset(label_keys={"labels": "json.label"}))  # doctest: +SKIP
    """
    settings = IngestOptions.of(options)
    check_target(location)
    with record_source(source, format, settings, beside(location)) as table:
        return ingest_or_append(placed(table, settings.shape, settings.resize), location, settings, append=False,
                                by_content=False)


def beside(location: str | os.PathLike) -> Path:
    """The local folder a store at ``location`` is staged in (for an object store: its local mirror's)."""
    return (local_mirror(str(location)) if is_object_url(str(location)) else Path(location).absolute()).parent


@contextmanager
def record_source(source: str | os.PathLike | Sequence[str | os.PathLike], format: Any, options: IngestOptions,
                  near: Path) -> Iterator[SourceTable]:
    """The table of the records of ``source`` (``format`` recognised when None), scanned with the ingest
    ``options`` ``on_error``, ``client``, ``progress`` and ``storage_options``. Pictures of files that
    cannot be read at a place are unpacked into a folder in ``near`` while the block runs."""
    storage_options = options.storage_options
    chosen = parse_format(format)
    if chosen is None:
        kind = recognise(source, storage_options)
        if kind is None:
            raise SourceError(f"{redact(str(source))} holds no record files (TFRecord, WebDataset tars, LMDB, Parquet, "
                              "Arrow); name the format with format=, or ingest an image folder with ingest_images")
        chosen = parse_format(kind)
    files = record_files(chosen, source, storage_options)
    description = f"{name_of(chosen)} " + (redact(files[0]) if len(files) == 1 else
                                           f"{redact(common_root(files))} ({len(files)} files)")
    packed = [location for location in files if chosen.unpacked(location, storage_options)]
    with ExitStack() as stack:
        folder = stack.enter_context(unpacking(near, sum(file_version(f, storage_options)[0] for f in packed),
                                               packed)) if packed else None
        yield record_table(chosen, files, on_error=options.on_error, client=options.client,
                           progress=options.progress, storage_options=storage_options,
                           description=description, unpack_into=folder)
