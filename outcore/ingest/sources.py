"""List what to ingest: an image folder (class = sub-folder) or a table of paths and labels."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import SourceError
from ..imaging import IMAGE_EXTENSIONS


@dataclass(frozen=True)
class SourceTable:
    """Image files to ingest, in source order, with one array per label column.

    ``paths`` are absolute; ``names`` are what the store records (relative to the folder or CSV).
    ``classes`` maps a label field to its class names, for labels that were strings or folders.
    """

    paths: list[str]
    names: list[str]
    labels: dict[str, np.ndarray] = field(default_factory=dict)
    classes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    description: str = ""

    def __len__(self) -> int:
        return len(self.paths)


def scan_image_folder(root: str | os.PathLike, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> SourceTable:
    """List ``root/<class>/**/<image>`` (labels from the first-level folder) or ``root/*.<image>`` (no labels).

    >>> table = scan_image_folder("photos/train")  # doctest: +SKIP
    >>> table.classes["labels"]  # doctest: +SKIP
    ('cat', 'dog')
    """
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"image folder {str(root)!r} does not exist or is not a folder")
    suffixes = tuple(e.lower() for e in extensions)
    names = _image_names(root, suffixes)
    if not names:
        raise SourceError(
            f"no image files ({', '.join(sorted(suffixes))}) found under {str(root)!r}; "
            "expected ROOT/<class>/<image> or ROOT/<image>"
        )
    loose = [n for n in names if "/" not in n]
    nested = len(names) - len(loose)
    if loose and nested:
        raise SourceError(
            f"{len(loose)} image(s) lie directly in {str(root)!r} (e.g. {loose[0]!r}) beside {nested} in class "
            "folders; move them into a class folder, or ingest a DataFrame of paths and labels instead"
        )
    description = f"image folder {root.absolute()}"
    paths = [os.path.join(root.absolute(), *n.split("/")) for n in names]
    if loose:
        return SourceTable(paths, names, description=description)
    class_of = [n.split("/", 1)[0] for n in names]
    classes = tuple(sorted(set(class_of)))
    index = {name: i for i, name in enumerate(classes)}
    labels = np.array([index[c] for c in class_of], dtype=np.int64)
    return SourceTable(paths, names, {"labels": labels}, {"labels": classes}, description=description)


def _image_names(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    """Sorted '/'-separated paths, relative to ``root``, of the image files below it (hidden ones skipped)."""
    names = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        prefix = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        names += [prefix + f for f in files if f.lower().endswith(suffixes) and not f.startswith(".")]
    return sorted(names)


def table_from_dataframe(
    frame: pd.DataFrame | str | os.PathLike,
    path_column: str = "path",
    label_columns: Sequence[str] = (),
    root: str | os.PathLike | None = None,
) -> SourceTable:
    """Read paths and labels from a DataFrame or a CSV file.

    Relative paths are resolved against ``root``, which defaults to the CSV's folder (or the current
    folder for a DataFrame). String labels become class indices (classes sorted); numbers stay numbers.
    Rows whose file does not exist are listed in ``missing``.

    >>> table_from_dataframe("labels.csv", "path", ["label"]).classes  # doctest: +SKIP
    {'label': ('cat', 'dog')}
    """
    if isinstance(frame, pd.DataFrame):
        where, base = "the DataFrame", Path(root or ".")
    else:
        csv = Path(frame)
        if not csv.is_file():
            raise SourceError(f"CSV file {str(csv)!r} does not exist")
        where, base = f"CSV {str(csv)!r}", Path(root) if root is not None else csv.parent
        frame = pd.read_csv(csv)
    if isinstance(label_columns, str):
        label_columns = [label_columns]
    absent = [c for c in [path_column, *label_columns] if c not in frame.columns]
    if absent:
        raise SourceError(f"column(s) {absent} not in {where}; it has {list(frame.columns)}")
    if len(frame) == 0:
        raise SourceError(f"{where} has no rows")
    if frame[path_column].isna().any():
        raise SourceError(f"{where}: column {path_column!r} is empty in rows {_rows(frame[path_column].isna())}")
    names = [str(p) for p in frame[path_column]]
    paths = [str((base / n).absolute()) for n in names]
    labels, classes = {}, {}
    for column in label_columns:
        values = frame[column]
        if values.isna().any():
            raise SourceError(f"{where}: label column {column!r} is empty in rows {_rows(values.isna())}")
        if pd.api.types.is_bool_dtype(values) or pd.api.types.is_integer_dtype(values):
            labels[column] = values.to_numpy(dtype=np.int64)
        elif pd.api.types.is_float_dtype(values):
            labels[column] = values.to_numpy(dtype=np.float32)
        else:
            codes, uniques = pd.factorize(values.astype(str), sort=True)
            labels[column] = codes.astype(np.int64)
            classes[column] = tuple(uniques)
    missing = [p for p in paths if not os.path.isfile(p)]
    return SourceTable(paths, names, labels, classes, missing, description=f"{where} (paths under {base.absolute()})")


def _rows(mask: pd.Series) -> str:
    rows = list(np.flatnonzero(mask.to_numpy()))
    return ", ".join(map(str, rows[:5])) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
