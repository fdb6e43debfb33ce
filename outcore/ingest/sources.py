"""List what to ingest: an image folder (class = sub-folder) or a table of paths and labels."""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionError, OutcoreWarning, SourceError
from ..format import Ragged
from ..imaging import IMAGE_EXTENSIONS, LABEL_MAP_DTYPES, Drawing, Paired, Renumbered, label_map_dtype
from ..storage.remote import is_object_url, redact
from .fields import missing_files, regular_files
from .records.locations import list_objects, read_file
from .records.reader import SampleReader

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class SourceTable:
    """Image files to ingest, in source order, with one array per label column.

    ``paths`` are absolute; ``names`` are what the store records (relative to the folder or CSV).
    ``classes`` maps a label field to its class names, for labels that were strings or folders.
    Samples of record files or object stores (`outcore.ingest.records`): ``paths`` are references that
    ``reader`` reads, ``stats`` their sizes and their files' modification times. ``layers`` holds, per field
    of what lies on the pictures, each picture's layer and the field's dtype: a label map (a file, `Renumbered`
    or not, or an instance map `Drawing`: `outcore.imaging.label_maps`) or a `Paired` picture; ``instances``, per ragged field, each picture's rows (boxes and keypoints in
    the stored pictures' pixels) and ``points`` the names of a keypoint field's points, and ``sizes`` each picture's
    annotated (height, width), checked as it is read.
    """

    paths: list[str]
    names: list[str]
    labels: dict[str, np.ndarray] = field(default_factory=dict)
    classes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    description: str = ""
    reader: SampleReader | None = None
    stats: np.ndarray | None = None
    layers: dict[str, tuple[list[str | Drawing | Renumbered | Paired], np.dtype]] = field(default_factory=dict)
    instances: dict[str, Ragged] = field(default_factory=dict)
    sizes: np.ndarray | None = None
    points: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def paired(self) -> list[str]:
        """The layers that are pictures paired with the pictures (depth, a second view), not label maps."""
        return [name for name, (sources, _) in self.layers.items() if sources and isinstance(sources[0], Paired)]


def scan_image_folder(root: str | os.PathLike, extensions: Sequence[str] = IMAGE_EXTENSIONS,
                      storage_options: Mapping[str, Any] | None = None) -> SourceTable:
    """List ``root/<class>/**/<image>`` (labels from the first-level folder) or ``root/*.<image>`` (no labels);
    ``root`` may be a folder in an object store (``s3://bucket/photos/train``, read with ``storage_options``
    or the standard environment).

    >>> table = scan_image_folder("photos/train")  # doctest: +SKIP
    >>> table.classes["labels"]  # doctest: +SKIP
    ('cat', 'dog')
    """
    suffixes = tuple(e.lower() for e in extensions)
    if is_object_url(str(root)):
        return _remote_image_folder(str(root), suffixes, storage_options)
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"image folder {str(root)!r} does not exist or is not a folder")
    names = _image_names(root, suffixes)
    description = f"image folder {root.absolute()}"
    base = os.path.join(str(root.absolute()), "")  # once, not a working directory read a file; ending in os.sep
    paths = [base + n for n in names] if os.sep == "/" else [base + n.replace("/", os.sep) for n in names]
    return _folder_table(str(root), names, paths, suffixes, description)


def _remote_image_folder(url: str, suffixes: tuple[str, ...], storage_options: Mapping[str, Any] | None) -> SourceTable:
    """An image folder in an object store: its objects listed (sizes and times with them), read where they are."""
    base = url.rstrip("/")
    found = list_objects(base, suffixes, storage_options)
    names = [found_url[len(base) + 1 :] for found_url, _, _ in found]
    table = _folder_table(redact(url), names, [u for u, _, _ in found], suffixes, f"image folder {redact(url)}")
    stats = np.array([f[1:] for f in found], dtype=np.int64).reshape(-1, 2)
    return replace(table, reader=SampleReader(storage_options), stats=stats)


def _folder_table(root: str, names: list[str], paths: list[str], suffixes: tuple[str, ...],
                  description: str) -> SourceTable:
    """The table of an image folder's files (``names`` relative to ``root``, ``paths`` what reads them)."""
    if not names:
        raise SourceError(
            f"no image files ({', '.join(sorted(suffixes))}) found under {root!r}; "
            "expected ROOT/<class>/<image> or ROOT/<image>"
        )
    loose = [n for n in names if "/" not in n]
    nested = len(names) - len(loose)
    if loose and nested:
        raise SourceError(
            f"{len(loose)} image(s) lie directly in {root!r} (e.g. {loose[0]!r}) beside {nested} in class "
            "folders; move them into a class folder, or ingest a DataFrame of paths and labels instead"
        )
    if loose:
        return SourceTable(paths, names, description=description)
    class_of = [n.split("/", 1)[0] for n in names]
    classes = tuple(sorted(set(class_of)))
    _refuse_splits_as_classes(root, classes)
    index = {name: i for i, name in enumerate(classes)}
    labels = np.array([index[c] for c in class_of], dtype=np.int64)
    return SourceTable(paths, names, {"labels": labels}, {"labels": classes}, description=description)


SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "eval"})


def _refuse_splits_as_classes(root: str, classes: Sequence[str]) -> None:
    """Class folders named like splits (``train``, ``val``) mean the folder above the splits was given:
    an error when two or more are, a warning for one."""
    splits = [name for name in classes if name.lower() in SPLIT_NAMES]
    if len(splits) >= 2:
        shown = " and ".join(f"{root.rstrip('/') + '/' + name!r} into {name}.zarr" for name in splits[:2])
        raise SourceError(
            f"the class folders of {root!r} are named like splits ({', '.join(splits)}): ingest each "
            f"split into a store of its own ({shown}), or all at once with ingest_splits({root!r}, "
            "folder, split='folders'); to use such names as classes, ingest a DataFrame of paths and labels"
        )
    if splits:
        warnings.warn(f"{root!r} has a class folder named like a split ({splits[0]!r}); if it is one, ingest "
                      "each split folder into a store of its own", OutcoreWarning, stacklevel=4)


def _image_names(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    """Sorted '/'-separated paths, relative to ``root``, of the image files below it (hidden ones skipped).

    Folder links are followed (a class folder is often a link to where the data lives); a link that
    leads back into a folder already walked is skipped with an `OutcoreWarning`, so a loop ends.
    """
    names, seen = [], set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        stat = os.stat(folder)
        if (stat.st_dev, stat.st_ino) in seen:
            warnings.warn(f"skipped {folder}: a folder link that leads back to a folder already walked",
                          OutcoreWarning, stacklevel=4)
            subfolders[:] = []
            continue
        seen.add((stat.st_dev, stat.st_ino))
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        prefix = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        names += [prefix + f for f in files if f.lower().endswith(suffixes) and not f.startswith(".")]
    return sorted(names)


LABEL_DTYPES = ("class", "int64", "float32")


def table_from_dataframe(
    frame: pd.DataFrame | str | os.PathLike,
    path_column: str = "path",
    label_columns: Sequence[str] = (),
    root: str | os.PathLike | None = None,
    label_dtype: str | Mapping[str, str] | None = None,
    read_elsewhere: Sequence[str] = (),
    storage_options: Mapping[str, Any] | None = None,
    mask_columns: Sequence[str] = (),
    mask_dtype: str | None = None,
    pair_columns: Sequence[str] = (),
) -> SourceTable:
    """Read paths and labels from a DataFrame or a CSV file (``read_elsewhere``: columns used otherwise,
    e.g. a split column, not warned about as left out); ``mask_columns`` hold the paths of each picture's label
    map files (one label map field per column, resolved as the pictures' paths are; a missing one is an error),
    of ids of ``mask_dtype`` (``"uint8"`` or ``"uint16"``; by default what the column's first file needs);
    ``pair_columns`` the paths of pictures paired with each (depth, a second view: channels and depth as the
    column's first file has them).

    Relative paths are resolved against ``root``, which defaults to the CSV's folder (or the current
    folder for a DataFrame). Rows whose file does not exist are listed in ``missing``. A label column
    of numbers stays numbers (``int64``, or ``float32`` when some are fractional); a column of text
    becomes class indices, classes sorted (numerically when every name is a number). A column that is
    numbers except for a few cells is an error naming those rows, never a silent switch to classes:
    ``label_dtype`` (``"class"``, ``"int64"`` or ``"float32"``, for all label columns or per column)
    says what to do instead. The CSV, ``root`` and the paths may be in an object store (``s3://...``,
    read with ``storage_options``): the files are then listed and read where they are.

    >>> table_from_dataframe("labels.csv", "path", ["label"]).classes  # doctest: +SKIP
    {'label': ('cat', 'dog')}
    """
    import pandas as pd  # here: an ingest of a folder needs none of it (`outcore.ingest.imports`)

    if isinstance(frame, pd.DataFrame):
        where, base = "the DataFrame", str(root or ".")
    else:
        csv = str(frame)
        if is_object_url(csv):
            where, base = f"CSV {redact(csv)!r}", str(root) if root is not None else csv.rpartition("/")[0]
            try:
                contents: Any = io.BytesIO(read_file(csv, storage_options))
            except SourceError:
                raise SourceError(f"CSV file {redact(csv)!r} does not exist") from None
        else:
            if not Path(csv).is_file():
                raise SourceError(f"CSV file {csv!r} does not exist")
            where, base = f"CSV {csv!r}", str(root) if root is not None else str(Path(csv).parent)
            contents = csv
        try:
            frame = pd.read_csv(contents)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
            said = " ".join(str(error).split())  # pandas' parser ends its message with a newline
            raise SourceError(f"{where} cannot be read as a table ({type(error).__name__}: {said}); "
                              "fix the file: a header line, then one line per image") from None
    label_columns = [label_columns] if isinstance(label_columns, str) else list(label_columns)
    mask_columns = [mask_columns] if isinstance(mask_columns, str) else list(mask_columns)
    pair_columns = [pair_columns] if isinstance(pair_columns, str) else list(pair_columns)
    layered = [*mask_columns, *pair_columns]
    both = sorted({c for c in layered if layered.count(c) > 1} | (set(label_columns) | {path_column}) & set(layered))
    if both:
        raise OptionError(f"column(s) {both} are named twice among paths, labels, label maps (mask_columns=) and "
                          "paired pictures (pair_columns=): a column is one of them")
    absent = [c for c in [path_column, *label_columns, *layered] if c not in frame.columns]
    if absent:
        raise SourceError(f"column(s) {absent} not in {where}; it has {list(frame.columns)}")
    if len(frame) == 0:
        raise SourceError(f"{where} has no rows")
    if frame[path_column].isna().any():
        raise SourceError(f"{where}: column {path_column!r} is empty in rows {_rows(frame[path_column].isna())}")
    unused = [str(c) for c in frame.columns if c not in (path_column, *label_columns, *layered, *read_elsewhere)]
    if unused:
        warnings.warn(f"{where}: column(s) {unused} are not ingested; name them in label_columns= to keep them",
                      OutcoreWarning, stacklevel=3)
    dtypes = _label_dtypes(label_dtype, label_columns)
    names = [str(p) for p in frame[path_column]]
    paths = _joined(base, names)
    labels, classes = {}, {}
    for column in label_columns:
        values = frame[column]
        if values.isna().any():
            raise SourceError(f"{where}: label column {column!r} is empty in rows {_rows(values.isna())}")
        labels[column], found = label_values(values, dtypes.get(column), f"{where}: label column {column!r}")
        if found is not None:
            classes[column] = found
    if mask_dtype not in (None, *LABEL_MAP_DTYPES):
        raise OptionError(f"mask_dtype={mask_dtype!r} is not one of {LABEL_MAP_DTYPES}")
    maps = {}
    for column in mask_columns:
        files = _label_map_paths(frame[column], base, f"{where}: mask column {column!r}")
        reader = SampleReader(storage_options)
        maps[column] = files, np.dtype(mask_dtype) if mask_dtype else label_map_dtype(reader.read(files[0]), files[0])
    for column in pair_columns:
        files = _label_map_paths(frame[column], base, f"{where}: pair column {column!r}")
        first = Paired.of(files[0], SampleReader(storage_options).read(files[0]))
        maps[column] = [replace(first, path=path) for path in files], np.dtype(first.dtype)
    shown_base = redact(base) if is_object_url(base) else str(Path(base).absolute())
    description = f"{where} (paths under {shown_base})"
    if any(is_object_url(p) for p in paths):
        return _remote_files(SourceTable(paths, names, labels, classes, description=description, layers=maps),
                             storage_options)
    return SourceTable(paths, names, labels, classes, missing_files(paths), description=description, layers=maps)


def _label_map_paths(cells: pd.Series, base: str, where: str) -> list[str]:
    """A mask (or pair) column's files, resolved under ``base``; an error names the rows that are empty or
    whose local file does not exist."""
    import pandas as pd

    if cells.isna().any():
        raise SourceError(f"{where} is empty in rows {_rows(cells.isna())}: every picture needs its own")
    paths = _joined(base, [str(cell) for cell in cells])
    absent = ~regular_files(paths)
    absent[absent] = [not is_object_url(paths[k]) for k in np.flatnonzero(absent).tolist()]  # a URL is not local
    absent = pd.Series(absent, index=cells.index)
    if absent.any():
        raise SourceError(f"{where}: the files of rows {_rows(absent)} do not exist (e.g. "
                          f"{paths[int(np.argmax(absent.to_numpy()))]!r}); correct the paths or root=")
    return paths


def _joined(base: str, names: Iterable[str]) -> list[str]:
    """A table's paths: a URL as it is, else under ``base`` (a folder, or an object store prefix), each as
    ``str((Path(base) / name).absolute())`` gives it. A name already in that form (relative, no empty or ``.`` part,
    no trailing slash) is joined to the folder's absolute path as text: pathlib's parse of each took 30 us a row
    (half a second for 6,000 rows of two path columns, on the one thread before the ingest starts).

    >>> _joined("/data", ["a/b.jpg", "./c.jpg", "s3://bucket/d.jpg"])
    ['/data/a/b.jpg', '/data/c.jpg', 's3://bucket/d.jpg']
    """
    if is_object_url(base):
        return [name if is_object_url(name) else f"{base.rstrip('/')}/{name.lstrip('/')}" for name in names]
    folder = Path(base).absolute()
    prefix = str(folder) if str(folder).endswith("/") else f"{folder}/"  # a root ("/", "//") ends with one
    return [name if is_object_url(name) else prefix + name if _plain(name) else str((folder / name).absolute())
            for name in names]


def _plain(name: str) -> bool:
    """Whether ``name`` is a relative path as pathlib writes it (on a system whose separator is ``/``)."""
    return (os.sep == "/" and name != "" and name[0] != "/" and name[-1] != "/" and "//" not in name
            and name != "." and not name.startswith("./") and "/./" not in name and not name.endswith("/."))


def _remote_files(table: SourceTable, storage_options: Mapping[str, Any] | None) -> SourceTable:
    """A table whose files are in an object store: listed under their common prefix (their sizes and times
    with them, those not there as ``missing``), read where they are."""
    prefix = os.path.commonprefix(table.paths).rpartition("/")[0]
    listed = {url: (size, modified) for url, size, modified in list_objects(prefix, ("",), storage_options)}
    missing = [p for p in table.paths if p not in listed]
    stats = np.array([listed.get(p, (0, 0)) for p in table.paths], dtype=np.int64).reshape(-1, 2)
    return replace(table, missing=missing, stats=stats, reader=SampleReader(storage_options))


def _label_dtypes(label_dtype: str | Mapping[str, str] | None, columns: Sequence[str]) -> dict[str, str]:
    chosen = {} if label_dtype is None else (
        dict.fromkeys(columns, label_dtype) if isinstance(label_dtype, str) else dict(label_dtype))
    for column, dtype in chosen.items():
        if dtype not in LABEL_DTYPES:
            raise OptionError(f"label_dtype {dtype!r} of {column!r} is not one of {LABEL_DTYPES}")
        if column not in columns:
            raise OptionError(f"label_dtype names {column!r}, which is not among the label columns {list(columns)}")
    return chosen


def label_values(values: pd.Series, dtype: str | None, where: str) -> tuple[np.ndarray, tuple[str, ...] | None]:
    """A label column as numbers, or as class indices with the class names (``None`` for numbers)."""
    import pandas as pd

    if dtype == "class" or (dtype is None and not _numeric_or_mostly(values)):
        text = values.astype(str)
        names = sorted(text.unique(), key=_class_order(text.unique()))
        return text.map({name: i for i, name in enumerate(names)}).to_numpy(dtype=np.int64), tuple(names)
    numbers = values.astype(np.int64) if pd.api.types.is_bool_dtype(values) else pd.to_numeric(values, errors="coerce")
    _refuse(values, numbers.isna().to_numpy(), f"{where} holds numbers except in", "class")
    if pd.api.types.is_integer_dtype(numbers) and dtype != "float32":
        return numbers.to_numpy(dtype=np.int64), None
    as_float = numbers.to_numpy(dtype=np.float64)
    if dtype == "float32" or (dtype is None and not (as_float == np.round(as_float)).all()):
        return as_float.astype(np.float32), None
    not_int64 = ~np.isfinite(as_float) | (as_float != np.round(as_float)) | (np.abs(as_float) >= 2.0**63)
    _refuse(values, not_int64, f"{where} holds values that are not int64 labels in", "float32")
    return as_float.astype(np.int64), None


def _refuse(values: pd.Series, bad: np.ndarray, what: str, instead: str) -> None:
    """Name the rows (counted from 0, after the header) whose cells do not fit, and what to do."""
    if bad.any():
        shown = ", ".join(f"row {row} ({values.iloc[row]!r})" for row in np.flatnonzero(bad)[:5])
        more = f" and {int(bad.sum()) - 5} more" if bad.sum() > 5 else ""
        raise SourceError(f"{what} {shown}{more}: correct those cells, or pass label_dtype={instead!r} "
                          "to say what the column holds")


def _numeric_or_mostly(values: pd.Series) -> bool:
    """Whether a column is numbers, or numbers in at least half of its cells (a stray cell is an error)."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
        return True
    parsed = pd.to_numeric(values, errors="coerce")
    return int(parsed.notna().sum()) * 2 >= len(values)


def _class_order(names: Sequence[str]) -> Any:
    """Sort class names as numbers when every one is a number ("2" before "10"), else as text."""
    try:
        numbers = {name: float(name) for name in names}
    except ValueError:
        return str
    return lambda name: (numbers[name], name)


def _rows(mask: pd.Series) -> str:
    rows = list(np.flatnonzero(mask.to_numpy()))
    return ", ".join(map(str, rows[:5])) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
