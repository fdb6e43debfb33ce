"""Splits in one call: a folder, CSV or DataFrame of images cut into train/val/test stores (one per split)
and a small index, ``splits.json``, that `outcore.open_dataset` reads (``split="val"``).

A file's split comes from a hash of its name (its path relative to the folder or CSV) and the seed, not
from its position in the listing: a file keeps its split whatever other files are added or removed,
so a grown folder split again never moves a validation picture into training. Each file draws
``u`` uniform in [0, 1) from the hash and goes to the first split whose cumulative fraction exceeds
``u``: every class gets the fractions up to sampling noise (about ``sqrt(f (1 - f) / n)`` for ``n``
pictures of a class), and the index records each split's count per class. The splits may instead be
the source's own (``split="folders"``: ``train/``, ``val/``, ... sub-folders of class folders; or a
CSV column, ``split_column=``). Every split's store has the same class list, so a label means the same
class in each.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import numpy as np

from ..dataset import Dataset, open_dataset
from ..errors import OptionError, SourceError, StorageError
from ..storage import is_url
from ..storage.splits import INDEX_FORMAT, SPLITS_INDEX, read_index
from .from_records import record_source
from .images import ingest_table, missing_files_error
from .options import IngestKeywords, IngestOptions
from .placement import placed
from .records import recognise
from .sources import SourceTable, scan_image_folder, table_from_dataframe

if TYPE_CHECKING:
    import pandas as pd

FOLDERS = "folders"


def parse_split(text: str) -> dict[str, float] | str:
    """``"train=0.8,val=0.1,test=0.1"`` as fractions by split, or ``"folders"``.

    >>> parse_split("train=0.8,val=0.2")
    {'train': 0.8, 'val': 0.2}
    """
    if text == FOLDERS:
        return FOLDERS
    fractions: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        try:
            fractions[name.strip()] = float(value)
        except ValueError:
            raise OptionError(f"split {part!r} is not NAME=FRACTION (e.g. train=0.8,val=0.1,test=0.1), "
                              f"nor {FOLDERS!r}") from None
    return check_fractions(fractions)


def check_fractions(fractions: Mapping[str, float]) -> dict[str, float]:
    """Fractions of at least two named splits, each above 0, that add up to 1 (`OptionError` otherwise)."""
    fractions = {str(name): float(value) for name, value in fractions.items()}
    bad = [name for name in fractions if not name or name in {".", ".."} or "/" in name or os.sep in name]
    if bad or len(fractions) < 2:
        raise OptionError(f"splits need two or more names usable as file names; got {list(fractions)}")
    if any(not 0 < value <= 1 for value in fractions.values()) or abs(sum(fractions.values()) - 1) > 1e-6:
        raise OptionError(f"split fractions must each be in (0, 1] and add up to 1; got {fractions}")
    return fractions


def hash_uniform(names: Sequence[str], seed: int) -> np.ndarray:
    """A number in [0, 1) per name, from a hash of the seed and the name only.

    >>> bool(hash_uniform(["cat/1.jpg"], 0)[0] == hash_uniform(["dog/2.jpg", "cat/1.jpg"], 0)[1])
    True
    """
    values = [int.from_bytes(hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest(), "little")
              for name in names]
    return (np.array(values, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def split_by_hash(names: Sequence[str], fractions: Mapping[str, float], seed: int) -> dict[str, np.ndarray]:
    """The rows of each split: row ``i`` goes to the first split whose cumulative fraction exceeds its hash's
    ``u``; disjoint, covering every row, and the same for a name whatever the other names."""
    edges = np.cumsum(list(fractions.values()))
    edges[-1] = 1.0
    which = np.searchsorted(edges, hash_uniform(names, seed), side="right")
    return {name: np.flatnonzero(which == i) for i, name in enumerate(fractions)}


def table_rows(table: SourceTable, rows: np.ndarray, description: str) -> SourceTable:
    """The rows ``rows`` of ``table`` (class lists kept whole, so labels keep their meaning), with their label maps,
    instances and sizes."""
    return replace(table, paths=[table.paths[i] for i in rows], names=[table.names[i] for i in rows],
                   labels={name: values[rows] for name, values in table.labels.items()}, missing=[],
                   description=description, stats=None if table.stats is None else table.stats[rows],
                   layers={name: ([sources[i] for i in rows], dtype)
                               for name, (sources, dtype) in table.layers.items()},
                   instances={name: values.take(rows) for name, values in table.instances.items()},
                   sizes=None if table.sizes is None else table.sizes[rows])


def _folder_splits(root: Path) -> dict[str, SourceTable]:
    """``root/<split>/<class>/<image>``: each split's table, with the classes of all splits."""
    if not root.is_dir():
        raise SourceError(f"image folder {str(root)!r} does not exist or is not a folder")
    folders = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if len(folders) < 2:
        raise SourceError(f"split='folders' needs two or more split folders in {str(root)!r} (train/, val/, ...); "
                          f"found {folders}: pass fractions (train=0.8,val=0.2) to cut the folder instead")
    tables = {name: scan_image_folder(root / name) for name in folders}
    if any("labels" not in table.classes for table in tables.values()):
        raise SourceError(f"the split folders of {str(root)!r} must each hold class folders (<split>/<class>/<image>)")
    classes = tuple(sorted({c for table in tables.values() for c in table.classes["labels"]}))
    index = {name: i for i, name in enumerate(classes)}
    relabelled = {}
    for name, table in tables.items():
        mapping = np.array([index[c] for c in table.classes["labels"]], dtype=np.int64)
        relabelled[name] = replace(table, names=[f"{name}/{n}" for n in table.names],
                                   labels={"labels": mapping[table.labels["labels"]]}, classes={"labels": classes})
    return relabelled


def _column_splits(table: SourceTable, source: pd.DataFrame | str | os.PathLike,
                   column: str) -> dict[str, SourceTable]:
    """The rows of each value of ``column``, in the rows' order."""
    import pandas as pd

    data = source if isinstance(source, pd.DataFrame) else pd.read_csv(source, usecols=lambda name: name == column)
    if column not in data.columns:
        raise SourceError(f"{table.description} has no split column {column!r}")
    if data[column].isna().any():
        empty = np.flatnonzero(data[column].isna().to_numpy())[:5].tolist()
        raise SourceError(f"{table.description}: split column {column!r} is empty in rows {empty}")
    values = data[column].astype(str).to_numpy()
    names = sorted(set(values.tolist()))
    check_fractions({name: 1 / len(names) for name in names})
    return {name: table_rows(table, np.flatnonzero(values == name), f"{table.description}, {column}={name}")
            for name in names}


def ingest_splits(
    source: str | os.PathLike | pd.DataFrame,
    folder: str | os.PathLike,
    *,
    split: Mapping[str, float] | str = FOLDERS,
    split_column: str | None = None,
    path_column: str = "path",
    label_columns: Sequence[str] = (),
    label_dtype: str | Mapping[str, str] | None = None,
    root: str | os.PathLike | None = None,
    zip: bool = False,
    seed: int = 0,
    append: bool = False,
    by_content: bool = False,
    format: Any = None,
    **options: Unpack[IngestKeywords],
) -> dict[str, Dataset]:
    """Ingest ``source`` into one store per split in ``folder`` (``<split>.zarr``, or ``<split>.zip`` with
    ``zip=True``) and an index, ``splits.json``; return the stores by split name.

    ``source`` is an image folder (``source/<class>/<image>``) or a CSV/DataFrame of paths and labels
    (``path_column``, ``label_columns``, ``label_dtype`` and ``root`` as in `ingest_dataframe`).
    ``split`` is fractions by name (``{"train": 0.8, "val": 0.1, "test": 0.1}``, or that as
    ``"train=0.8,val=0.1,test=0.1"``: each file's split drawn from a hash of its name and ``seed``, so it
    never changes when files are added; see the module), or ``"folders"``: the folder's own
    ``<split>/<class>/<image>`` layout. ``split_column`` takes each CSV row's split from that column
    instead. Every store gets the classes of all splits. ``seed`` also seeds each store's shuffle on
    write; the other keywords are those of every ingest (`IngestKeywords`; ``shape`` is required), for every split.
    Record files (TFRecord, WebDataset, LMDB, Parquet: recognised, or named with ``format``, see
    `ingest_records`) are cut by fractions, a record's split from a hash of its file and place.

    ``append=True`` adds the files the stores lack, each to its split (by the same rule, which must be
    the one ``splits.json`` records), and gives every store the same grown class list (`ingest_images`
    says how new files are told from stored ones, and ``by_content``).

    >>> stores = outcore.ingest_splits("photos", "photos-splits", split={"train": 0.8, "val": 0.2},
    ...                                shape=(128, 128, 3))  # doctest: +SKIP
    >>> val = outcore.open_dataset("photos-splits", split="val")  # doctest: +SKIP
    """
    if is_url(folder):
        raise OptionError(f"ingest_splits writes to a local folder; got {str(folder)!r}: ingest each split to "
                          "its URL with ingest_images or ingest_dataframe (one store each)")
    settings = IngestOptions.of({**options, "seed": seed})
    with ExitStack() as stack:  # record files: their unpacked pictures, until every split is written
        is_table = not isinstance(source, str | os.PathLike) or Path(source).suffix.lower() == ".csv"  # a DataFrame
        table = None
        if not is_table and (format is not None or recognise(source, settings.storage_options)):
            if split == FOLDERS or split_column is not None or append:
                raise OptionError("record files are cut into splits by fractions (split={'train': 0.9, 'val': 0.1}); "
                                  "split='folders', split_column= and append= are for image folders and CSVs")
            table = placed(stack.enter_context(record_source(source, format, settings, Path(folder).absolute())),
                           settings.shape, settings.resize)
        elif is_table:
            table = table_from_dataframe(source, path_column, label_columns, root, label_dtype,
                                         read_elsewhere=[split_column] if split_column else ())
            if table.missing and settings.on_error == "raise":
                raise missing_files_error(table)
        if split_column is not None:
            if table is None:
                raise OptionError(f"split_column= takes each row's split from a CSV or DataFrame; {str(source)!r} is a "
                                  "folder: use split='folders' or fractions")
            tables, rule = _column_splits(table, source, split_column), {"column": split_column}
        elif split == FOLDERS:
            if table is not None and is_table:
                raise OptionError("split='folders' splits a folder of <split>/<class>/<image>; for a CSV or DataFrame "
                                  "pass split_column= (its column of split names) or fractions")
            tables, rule = _folder_splits(Path(source)), {"folders": True}
        else:
            fractions = parse_split(split) if isinstance(split, str) else check_fractions(split)
            table = table if table is not None else scan_image_folder(source, storage_options=settings.storage_options)
            tables = {name: table_rows(table, rows, f"{table.description}, split {name}")
                      for name, rows in split_by_hash(table.names, fractions, seed).items()}
            rule = {"fractions": fractions, "seed": seed}
        empty = [name for name, part in tables.items() if not len(part)]
        if empty:
            raise SourceError(f"split(s) {empty} would be empty ({sum(map(len, tables.values()))} files in all): "
                              "give them larger fractions, or more files")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        suffix = ".zip" if zip else ".zarr"
        grow = {"append": True, "by_content": by_content, "classes": _grown_classes(folder, tables, rule)} \
            if append else {"by_content": by_content}
        stores: dict[str, Dataset] = {}
        for name, part in tables.items():
            try:
                stores[name] = ingest_table(part, folder / f"{name}{suffix}", settings, **grow)
            except StorageError as error:  # a full disk, say: the splits written are kept, and a resume keeps them
                if not stores or append:
                    raise
                raise StorageError(error.errno, f"{error.strerror}. The splits written before it are kept "
                                                f"({', '.join(stores)}): free some space, then run the same ingest "
                                                "with resume=True, which keeps them as they are and writes the "
                                                "others") from None
        _write_index(folder, stores, rule, suffix)
        return stores


def _grown_classes(folder: Path, tables: Mapping[str, SourceTable], rule: dict[str, Any]) -> dict[str, list[str]]:
    """For an append: each class field's list in every split's store, the stored list extended by the new
    classes of all splits (sorted), so that a label keeps one meaning across the splits."""
    if not (folder / SPLITS_INDEX).exists():
        return {name: list(classes) for name, classes in next(iter(tables.values())).classes.items()}
    recorded = read_index(folder)
    if recorded.get("rule") != json.loads(json.dumps(rule)):
        raise OptionError(f"{folder} was split by {recorded.get('rule')}, not {rule}: append with the same split "
                          "rule, so that every file keeps its split")
    stored = open_dataset(folder / recorded["splits"][next(iter(recorded["splits"]))]["store"])
    grown = {}
    for name, classes in next(iter(tables.values())).classes.items():
        old = list(stored.attrs.fields[name].classes or ())
        grown[name] = old + sorted(set(classes) - set(old))
    return grown


def _write_index(folder: Path, stores: Mapping[str, Dataset], rule: dict[str, Any], suffix: str) -> None:
    """``splits.json``: how the splits were made, and each one's store, count and count per class."""
    first = next(iter(stores.values()))
    target = next((field for field, info in first.attrs.fields.items()
                   if info.role == "target" and info.classes is not None), None)  # what `Dataset.classes` names
    classes = first.classes_of(target) if target is not None else []
    entries = {}
    for name, ds in stores.items():
        entry: dict[str, Any] = {"store": f"{name}{suffix}", "samples": len(ds)}
        if target is not None:  # a ragged field's (boxes' labels): its rows, every instance counted
            values = ds[target].compute()
            values = np.concatenate([*values, np.zeros(0, np.int64)]) if ds.info(target).is_ragged else values
            counts = np.bincount(np.asarray(values, np.int64), minlength=len(classes))
            entry["per_class"] = dict(zip(classes, counts.tolist(), strict=True))
        entries[name] = entry
    index = {"format": INDEX_FORMAT, "version": 1, "rule": rule, "class_field": target, "classes": classes,
             "splits": entries}
    temporary = folder / f".{SPLITS_INDEX}.tmp"
    temporary.write_text(json.dumps(index, indent=2) + "\n")
    temporary.replace(folder / SPLITS_INDEX)
