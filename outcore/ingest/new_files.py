"""Which files of a source an append adds: those the store does not record, told by ``path`` and
``file_stat`` (size and modification time), or with ``by_content`` by ``file_digest``. A stored file
whose size, time or label changed is an error naming it: an append adds files, it never replaces one.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import zarr

from ..errors import OptionError, OutcoreWarning, SourceError
from ..format import StoreAttrs, decode_text
from ..imaging import read_image_file
from ..threads import for_each
from .decode_tasks import DIGEST_SIZE, file_digest
from .fields import FILE_DIGEST_FIELD, FILE_STAT_FIELD, PATH_FIELD, file_stats
from .sources import SourceTable
from .writer import cast_values

LABEL_ROLES = ("target", "sample_weight")
MAX_SHOWN = 3  # files named in a message


@dataclass(frozen=True)
class StoredFiles:
    """What a store records of its files: ``names`` (relative paths), ``stats`` (N, 2: size, mtime in ns),
    ``digests`` (N, 16, read only for ``by_content``) and each label field's values."""

    names: list[str]
    stats: np.ndarray
    digests: np.ndarray | None
    labels: dict[str, np.ndarray]


def label_fields(attrs: StoreAttrs) -> list[str]:
    """The fields of an image store that came from the source's labels (folders, or a table's columns)."""
    return [name for name, info in attrs.fields.items() if info.role in LABEL_ROLES]


def stored_files(group: zarr.Group, attrs: StoreAttrs, shown: str, by_content: bool) -> StoredFiles:
    count = attrs.num_samples
    if by_content and FILE_DIGEST_FIELD not in attrs.fields:
        raise OptionError(f"{shown} records no file digests: append without by_content=True")
    labels = {name: group[name][:count] for name in label_fields(attrs)}
    return StoredFiles(_stored_names(group[PATH_FIELD], count), group[FILE_STAT_FIELD][:count],
                       group[FILE_DIGEST_FIELD][:count] if by_content else None, labels)


def _stored_names(paths: zarr.Array, count: int, block: int = 65_536) -> list[str]:
    """The first ``count`` paths, decoded a block at a time: as one numpy array of fixed-width strings
    (4 bytes a character, 256 characters or more) a million paths would take a gigabyte."""
    names: list[str] = []
    for start in range(0, count, block):
        names += decode_text(paths[start : min(count, start + block)]).tolist()
    return names


def new_rows(table: SourceTable, stored: StoredFiles, labels: list[str], attrs: StoreAttrs, by_content: bool,
              shown: str) -> np.ndarray:
    """The rows of ``table`` to add; a stored file that changed, or whose label did, is a `SourceError`."""
    if sorted(table.labels) != sorted(labels):
        raise SourceError(f"the source has label field(s) {sorted(table.labels)}, {shown} has {sorted(labels)}: "
                          "append from a source of the same columns")
    where = {name: i for i, name in enumerate(stored.names)}
    known = np.array([where.get(name, -1) for name in table.names], dtype=np.int64)
    old = known >= 0
    now = file_stats(table.paths)
    changed = old & (now != stored.stats[np.maximum(known, 0)]).any(axis=1) if len(stored.names) else old
    new = ~old
    if by_content:
        hashed = np.flatnonzero(changed | new)
        seen = {digest.tobytes() for digest in stored.digests}
        for i, digest in zip(hashed, _digests([table.paths[i] for i in hashed]), strict=True):
            if old[i]:  # only its time changed, or its bytes too
                changed[i] = digest.tobytes() != stored.digests[known[i]].tobytes()
            else:  # a renamed or copied file is not added again, nor two copies of one new file
                new[i] = digest.tobytes() not in seen
                seen.add(digest.tobytes())
    if changed.any():
        rows = np.flatnonzero(changed)[:MAX_SHOWN]
        shown_files = ", ".join(f"{table.names[i]!r} ({_change(stored.stats[known[i]], now[i])})" for i in rows)
        advice = "" if by_content else ", or by_content=True when only their times changed"
        raise SourceError(f"{changed.sum()} file(s) of {shown} changed since they were ingested (e.g. {shown_files}); "
                          f"an append adds files, it does not replace them: ingest all again with overwrite=True{advice}")
    _check_labels(table, stored, known, attrs, shown)
    gone = len(stored.names) - len(set(known[old].tolist()))
    if gone:
        examples = sorted(set(stored.names) - {table.names[i] for i in np.flatnonzero(old)})[:MAX_SHOWN]
        warnings.warn(f"{gone} file(s) of {shown} are no longer in {table.description} (e.g. {examples}); "
                      "their samples stay in the store", OutcoreWarning, stacklevel=4)
    return np.flatnonzero(new)


def _change(before: np.ndarray, now: np.ndarray) -> str:
    """How a file's ``(size, mtime)`` changed, in words."""
    return f"{before[0]} → {now[0]} bytes" if before[0] != now[0] else "modified since"


def _digests(paths: list[str]) -> np.ndarray:
    """The files' `file_digest`, read and hashed on outcore's threads (hashing releases the GIL)."""
    digests = np.zeros((len(paths), DIGEST_SIZE), dtype=np.uint8)

    def digest(i: int) -> None:
        digests[i] = file_digest(read_image_file(paths[i]))

    for_each(digest, len(paths))
    return digests


def _check_labels(table: SourceTable, stored: StoredFiles, known: np.ndarray, attrs: StoreAttrs, shown: str) -> None:
    """A stored file's label in the source must be the one stored (a relabelled CSV is an error)."""
    rows = np.flatnonzero(known >= 0)
    for name, values in table.labels.items():
        stored_classes, source_classes = attrs.fields[name].classes, table.classes.get(name)
        if (stored_classes is None) != (source_classes is None):
            kind = "class names" if source_classes is not None else "numbers"
            raise SourceError(f"label field {name!r}: the source holds {kind}, {shown} does not; append from "
                              "a source whose labels are alike (label_dtype= says what a column holds)")
        before, after = stored.labels[name][known[rows]], values[rows]
        if stored_classes is not None:
            before, after = np.array(stored_classes)[before], np.array(source_classes)[after]
        differ = np.flatnonzero(before != after)
        if len(differ):
            j = differ[0]
            raise SourceError(f"label field {name!r}: {len(differ)} stored file(s) have another label in the source "
                              f"(e.g. {table.names[rows[j]]!r}: {before[j].item()!r} stored, {after[j].item()!r} now); "
                              "an append adds files, it does not relabel them: ingest all again with overwrite=True")


def grown_classes(attrs: StoreAttrs, table: SourceTable, new: np.ndarray,
                   classes: Mapping[str, Sequence[str]] | None, shown: str) -> dict[str, tuple[str, ...]]:
    """Each class field's list after the append: the old names in their order, then the new ones."""
    grown = {}
    for name, names in table.classes.items():
        old = attrs.fields[name].classes
        if classes is not None and name in classes:
            wanted = tuple(classes[name])
        else:
            added = sorted(set(np.array(names)[table.labels[name][new]].tolist()) - set(old)) if len(new) else []
            wanted = (*old, *added)
        if wanted[: len(old)] != old:
            raise OptionError(f"label field {name!r}: the classes {list(wanted)} do not start with those of "
                              f"{shown} ({list(old)}); an append keeps the old numbers")
        grown[name] = wanted
    return grown


def check_fits(group: zarr.Group, table: SourceTable, new: np.ndarray, attrs: StoreAttrs, labels: list[str],
                shown: str) -> None:
    """Refuse, before decoding anything, new paths longer than the store's path field holds and
    numeric labels its fields cannot hold."""
    width = group[PATH_FIELD].shape[1]
    longest = max(new, key=lambda i: len(table.names[i].encode()))
    if len(table.names[longest].encode()) > width:
        raise SourceError(f"{table.names[longest]!r} is longer than the {width} bytes the path field of {shown} "
                          "holds: ingest all the files again with overwrite=True (new stores hold 256 bytes or more)")
    for name in labels:
        if attrs.fields[name].classes is None:
            cast_values(name, table.labels[name][new], np.dtype(group[name].dtype))
