"""A record source as the table an image ingest writes from: one row per record, in the files' order,
with its reference, its name, its labels and class names, and what reads it."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import dask
import numpy as np

from ..errors import OutcoreWarning, SourceError
from ..format import Ragged
from ..storage.remote import is_object_url
from .records import RecordFormat
from .records.locations import common_root, shown
from .records.parts import SEPARATOR, PartScan
from .records.reader import SampleReader
from .records.tfrecord import CLASS_TEXT, INSTANCE_TEXT, INSTANCES, PICTURE_SIZE
from .scheduler import run_tasks
from .sources import SourceTable, label_values

MAX_SHOWN = 3


def record_table(format: RecordFormat, locations: Sequence[str], *, on_error: str, client: Any = None,
                 progress: bool = True, storage_options: Mapping[str, Any] | None = None, description: str = "",
                 unpack_into: str | None = None) -> SourceTable:
    """Scan the record files ``locations`` of ``format`` into a table: one task a file, on ``client``'s
    workers, else on threads for files in an object store and on one thread for files here (Python's
    parsing is then the work, and more threads only contend for the GIL).

    A damaged record (a bad checksum, a truncated file, a missing picture or label) is an error naming
    it, or with ``on_error="skip"`` a row whose reading fails, so that the ingest's report names it.
    Pictures of files that cannot be read at a place are unpacked into the folder ``unpack_into``
    (`outcore.ingest.records.spill`), which must outlive the ingest's reading.
    """
    scan = dask.delayed(_scan, pure=False)
    remote = any(is_object_url(location) for location in locations)  # else Python's parsing is the work: one thread
    scans: list[PartScan] = run_tasks([scan(format, location, storage_options, unpack_into) for location in locations],
                                      [1] * len(locations), client=client, progress=progress,
                                      description="scan records", unit="files", threads=None if remote else 1)
    root = common_root(locations)
    references = [part.reference(i) for part in scans for i in range(len(part))]
    if not references:
        raise SourceError(f"no records found in {description}")
    damaged = [(f"{part.location}{SEPARATOR}{part.whats[i]}", part.damage[i])
               for part in scans for i in range(len(part)) if part.damage[i]]
    if damaged and on_error == "raise":
        shown_damage = "; ".join(f"{name}: {why}" for name, why in damaged[:MAX_SHOWN])
        raise SourceError(f"{len(damaged)} of {len(references)} records of {description} cannot be read ({shown_damage}"
                          f"{' ...' if len(damaged) > MAX_SHOWN else ''}); repair or remove them, or pass "
                          "on_error='skip' to skip them (the store's report names each)")
    names = [f"{shown(part.location, root)}{SEPARATOR}{what}" for part in scans for what in part.whats]
    labels, classes = _labels(scans, description)
    instances, sizes, named = _instances(scans)
    for note in sorted({note for part in scans for note in part.notes}):
        warnings.warn(f"{description}: {note}", OutcoreWarning, stacklevel=3)
    if not labels and not instances:
        warnings.warn(f"{description}: no labels found, so the store gets none; name them with label_keys= (LMDB: "
                      "label_pattern= or label_table=) if the records have them", OutcoreWarning, stacklevel=3)
    stats = np.array([(max(0, span[1]), part.version[1]) for part in scans for span in part.spans],
                     dtype=np.int64).reshape(-1, 2)
    reader = SampleReader(storage_options, format.picture_of(), unpack_into)
    return SourceTable(references, names, labels, {**classes, **named}, description=description, reader=reader,
                       stats=stats, instances=instances, sizes=sizes)


def _instances(scans: list[PartScan]) -> tuple[dict[str, Ragged], np.ndarray | None, dict[str, tuple[str, ...]]]:
    """Each record's per-instance lists as ragged fields (none for a damaged record), its picture's annotated
    size, and the labels' class names from the instances' class texts (the name of label ``k`` at ``k``)."""
    fields = list(dict.fromkeys(name for part in scans for name in part.labels if name.startswith(INSTANCES)))
    if not fields:
        return {}, None, {}
    instances = {}
    for field in fields:
        values = [value for part in scans for value in part.labels.get(field, [None] * len(part))]
        like = next(value for value in values if value is not None)
        instances[field.removeprefix(INSTANCES)] = Ragged.of(
            [value if value is not None else like[:0] for value in values], like.dtype, like.shape[1:])
    sizes = np.array([size or (0, 0) for part in scans for size in part.labels.get(PICTURE_SIZE, [None] * len(part))],
                     np.int64).reshape(-1, 2)
    named: dict[str, tuple[str, ...]] = {}
    if "labels" in instances and any(INSTANCE_TEXT in part.labels for part in scans):
        texts = [text for part in scans for found in part.labels.get(INSTANCE_TEXT, [None] * len(part))
                 for text in (found or [])]
        values = instances["labels"].values
        if len(texts) == len(values):
            names = _named_classes(values, texts, np.ones(len(values), bool))
            if names is not None:
                named["labels"] = names
    return instances, sizes, named


def _scan(format: RecordFormat, location: str, storage_options: Mapping[str, Any] | None,
          unpack_into: str | None) -> PartScan:
    return format.scan(location, storage_options, unpack_into)


def _labels(scans: list[PartScan], description: str) -> tuple[dict[str, np.ndarray], dict[str, tuple[str, ...]]]:
    """One array per label field (damaged rows get the first good row's value: they are skipped), with
    class names: given by the files (``ClassLabel``, a class text feature), or made from text labels."""
    import pandas as pd

    fields = list(dict.fromkeys(name for part in scans for name in part.labels
                                if not name.startswith("\x00")))  # the class texts and instances are apart
    good = np.array([not damage for part in scans for damage in part.damage], dtype=bool)
    labels, classes = {}, {}
    for field in fields:
        values = [value for part in scans for value in part.labels.get(field, [None] * len(part))]
        absent = [i for i, value in enumerate(values) if value is None and good[i]]
        if absent:
            where = [(part, i) for part in scans for i in range(len(part))]
            shown_rows = ", ".join(f"{where[i][0].location}{SEPARATOR}{where[i][0].whats[where[i][1]]}"
                                   for i in absent[:MAX_SHOWN])
            raise SourceError(f"{len(absent)} records of {description} have no {field!r} label (e.g. {shown_rows}), "
                              "which others have; name the label keys every record has with label_keys=")
        fill = next((value for value, ok in zip(values, good, strict=True) if ok), 0)
        column = pd.Series([value if ok else fill for value, ok in zip(values, good, strict=True)])
        given = next((part.classes[field] for part in scans if field in part.classes), None)
        if given is not None:
            labels[field], classes[field] = column.to_numpy(dtype=np.int64), given
            continue
        labels[field], found = label_values(column, None, f"{description}: label {field!r}")
        if found is not None:
            classes[field] = found
        elif field == fields[0] and any(CLASS_TEXT in part.labels for part in scans):
            named = _named_classes(labels[field], [t for part in scans for t in part.labels.get(CLASS_TEXT, [])],
                                   good)
            if named is not None:
                classes[field] = named
    return labels, classes


def _named_classes(values: np.ndarray, texts: list[str | None], good: np.ndarray) -> tuple[str, ...] | None:
    """Class names for integer labels from a text beside each (ImageNet's ``image/class/text``): the
    name of label ``k`` at position ``k`` (``""`` for a label no record has); None when a label has two
    names, or labels are negative or fractional."""
    if values.dtype.kind != "i" or len(texts) != len(values) or (values[good] < 0).any():
        return None
    names: dict[int, str] = {}
    for value, text, ok in zip(values.tolist(), texts, good.tolist(), strict=True):
        if ok and text is not None and names.setdefault(value, text) != text:
            return None
    if not names:
        return None
    return tuple(names.get(k, "") for k in range(max(names) + 1))
