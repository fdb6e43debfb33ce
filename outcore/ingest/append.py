"""Add new files to an image store in place: ``ingest_images(..., append=True)``, ``outcore ingest --append``.

Which files are new is decided against what the store records of its own (`outcore.ingest.new_files`):
``path``, and ``file_stat`` (size and modification time); with ``by_content``, ``file_digest`` (a file
renamed or only touched is then known by its bytes). A stored file whose size or time changed is an error
naming it: an append adds files, it never replaces one silently. The new files are then

1. ingested on their own into a part store beside the target, with the store's own settings (decoded in
   parallel, shuffled within themselves, bad files skipped or refused, resumable: `outcore.ingest.build`);
2. spliced onto the store (`outcore.ingest.splice`): the shards from the store's last, partial, one on are written into a splice
   folder beside it, the partial shard's old samples first (the same bytes again), in the store's own
   array settings; encoded pictures are placed so that every chunk's files fit its region
   (`outcore.ingest.packing`);
3. published: each shard file replaces the store's in one step (a reader of the old count reads the
   same old samples from it), then each array's metadata with its new shape, and last the group's,
   holding the new sample count, the grown class lists (old numbers kept) and the part's provenance.

Readers see the old count or the new one, never a mix. A killed append leaves the store as it was (at
most with shard files past its count, which nothing reads); running it again finishes it, the part's
ingest resuming where it stopped.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ..dataset import Dataset, open_dataset
from ..errors import OptionError, OutcoreError, OutcoreWarning, StorageError
from ..format import StoreAttrs
from ..storage import is_url, is_zip, open_group, remove_path
from ..storage.safety import check_safe, read_attrs
from ..storage.staging import storage_error
from .arrays import SOURCE_INDEX_FIELD
from .build import AllSkippedError, report_path, skipped_summary, write_report
from .fields import FILE_STAT_FIELD, file_stat
from .new_files import check_fits, grown_classes, label_fields, new_rows, stored_files
from .options import IngestOptions
from .sources import SourceTable
from .splice import discard_splice, save_attrs, splice, with_classes
from .writer import writer_lock

Ingest = Callable[[SourceTable, Path, IngestOptions], Dataset]  # `images._ingest_table`: a table into a new store


def append_table(
    table: SourceTable,
    location: str | os.PathLike,
    ingest: Ingest,
    options: IngestOptions,
    *,
    by_content: bool = False,
    classes: Mapping[str, Sequence[str]] | None = None,
) -> Dataset:
    """Add the files of ``table`` that the store at ``location`` lacks (see the module); return the store.

    ``ingest(table, location, options)`` writes a store of ``table`` with the image ``options`` (checked
    against the settings the store was made with). ``classes`` are
    the class lists the store should end with (each its old list extended; `ingest_splits` gives every
    split the same), by default the old lists extended by the new files' classes, sorted.
    """
    if is_url(location) or is_zip(location):
        raise OptionError(f"append adds to a local directory store, not {str(location)!r}: append to the "
                          "directory, then pack or upload it")
    if options.overwrite:
        raise OptionError("append=True adds to the store and overwrite=True replaces it: pass one of them")
    target = Path(location)
    if not target.exists():  # the first run of a recurring append: an ordinary ingest
        return ingest(_part_table(table, np.arange(len(table)), dict(classes or table.classes)), target, options)
    lock = writer_lock(target, str(target))
    try:
        _append(table, target, ingest, options, by_content, classes)
    except OSError as error:
        if isinstance(error, OutcoreError) and not isinstance(error, StorageError):
            raise
        raise _append_failed(error, target) from None
    finally:
        lock.close()
    return open_dataset(target)


def _append_failed(error: OSError, target: Path) -> StorageError:
    """A write the system refused while appending (a full disk): the store keeps its samples (its count is
    published last); the splice folder goes, the part ingested so far stays for the next run to go on from."""
    discard_splice(target)
    part = target.with_name(f".{target.name}.append.zarr")
    count = read_attrs(open_group(target, mode="r"), str(target)).num_samples
    goes_on = ""
    if part.exists():
        size = sum(file.stat().st_size for file in part.rglob("*") if file.is_file())
        goes_on = f", which goes on from the new files' part ingested so far ({part}, {size / 2**20:.1f} MiB)"
    keeps = (f"keeps its {count:,} samples as they were (an append publishes its count last): free some space, "
             f"then run the same append again{goes_on}")
    if isinstance(error, StorageError) and not error.errno:  # one line naming what failed already: not wrapped again
        return StorageError(f"{error} The store {target} {keeps}")
    reason = OSError(error.errno, os.strerror(error.errno)) if error.errno else error
    return storage_error(reason, target, f"It {keeps}")


def _append(table: SourceTable, target: Path, ingest: Ingest, options: IngestOptions, by_content: bool,
            classes: Mapping[str, Sequence[str]] | None) -> None:
    group = open_group(target, mode="r")
    attrs = read_attrs(group, str(target))
    check_safe(group, list(group.array_keys()), str(target))
    if options.images is None:  # left to choose: as the store holds them
        options = options.replace(images=(attrs.provenance.get("recipe") or {}).get("images"))
    _check_recipe(attrs, options, str(target))
    stored = stored_files(group, attrs, str(target), by_content)
    labels = label_fields(attrs)
    new = _not_skipped_before(target, table, new_rows(table, stored, labels, attrs, by_content, str(target)))
    grown = grown_classes(attrs, table, new, classes, str(target))
    if len(new) == 0:
        if grown != {name: attrs.fields[name].classes for name in grown}:
            save_attrs(target, with_classes(attrs, grown))
        return
    check_fits(group, table, new, attrs, labels, str(target))
    part_table = _part_table(table, new, grown)
    part, tried = target.with_name(f".{target.name}.append.zarr"), set(part_table.paths)
    try:
        ingest(part_table, part, options.replace(overwrite=True, resume=True, storage_options=None))
    except AllSkippedError as error:  # every new file is bad: only the record of skipped files changes
        skipped = _merged_skipped(target, error.messages, tried)
        save_attrs(target, dataclasses.replace(with_classes(attrs, grown), skipped=_summary(target, skipped)))
        write_report(target, skipped)
        return
    part_report = report_path(part)
    skipped = _merged_skipped(target, part_report.read_text(encoding="utf-8").splitlines()
                              if part_report.exists() else [], tried)
    splice(target, part, attrs, grown, _next_source_index(group, attrs), _summary(target, skipped), options)
    write_report(target, skipped)
    remove_path(part)
    remove_path(report_path(part))


def _check_recipe(attrs: StoreAttrs, options: IngestOptions, shown: str) -> None:
    """The options that make samples must be those the store's samples were made with."""
    recipe = attrs.provenance.get("recipe")
    if not recipe or FILE_STAT_FIELD not in attrs.fields:
        raise OptionError(
            f"{shown} does not record its files' sizes and times (it was not made by an image ingest of this "
            "outcore version), so the new files cannot be told from the old: ingest all of them again once "
            "(overwrite=True); later runs can append"
        )
    given = options.recipe(options.images)
    relevant = [name for name in ("shape", "dtype", "images", "resize", "max_side", "quality")
                if name != "quality" or recipe.get("max_side") is not None]
    if options.shape[0] is None:
        relevant.remove("resize")
    for name in relevant:
        if given[name] != recipe.get(name):
            stored = ",".join("none" if s is None else str(s) for s in recipe["shape"]) if name == "shape" \
                else recipe.get(name)
            raise OptionError(f"{shown} was made with {name} {stored!r}, not {given[name]!r}: append with the "
                              f"store's settings ({name}={stored!r}) so that old and new samples are alike")
    for name, value in (("chunk_size", attrs.chunk_size), ("compression", None)):
        if getattr(options, name) is not None and getattr(options, name) != value:
            raise OptionError(f"an append writes {shown}'s chunks as they are (chunk size {attrs.chunk_size}, its "
                              f"own compression): leave out {name}={getattr(options, name)!r}")


def _not_skipped_before(target: Path, table: SourceTable, new: np.ndarray) -> np.ndarray:
    """``new`` without the files an earlier run skipped as bad (named in the store's report) that were not
    modified since: they would fail again. A file modified since is tried again."""
    report = report_path(target)
    if not report.exists() or not len(new):
        return new
    written = report.stat().st_mtime_ns
    paths = {table.paths[i]: i for i in new}
    again = {paths[path] for line in report.read_text(encoding="utf-8").splitlines()
             if (path := _named(line, paths)) is not None and file_stat(path)[1] <= written}
    if again:
        warnings.warn(f"{len(again)} file(s) that an earlier run skipped as bad (listed in {report}) are not tried "
                      "again: they were not modified since", OutcoreWarning, stacklevel=4)
    return np.array([i for i in new if i not in again], dtype=np.int64)


def _part_table(table: SourceTable, new: np.ndarray, grown: Mapping[str, Sequence[str]]) -> SourceTable:
    """The new files, with class labels numbered as in the grown lists."""
    labels = {}
    for name, values in table.labels.items():
        if name in grown:
            number = {c: i for i, c in enumerate(grown[name])}
            values = np.array([number[c] for c in np.array(table.classes[name])[values[new]]], dtype=np.int64)
        else:
            values = values[new]
        labels[name] = values
    return SourceTable([table.paths[i] for i in new], [table.names[i] for i in new], labels,
                       {name: tuple(names) for name, names in grown.items()}, description=table.description)


def _next_source_index(group: zarr.Group, attrs: StoreAttrs) -> int:
    """Where the part's ``source_index`` numbers start: after every number the store holds."""
    return int(group[SOURCE_INDEX_FIELD][: attrs.num_samples].max(initial=-1)) + 1


def _merged_skipped(target: Path, added: list[str], tried: set[str]) -> list[str]:
    """The messages of the store's skipped files after the append: those of the files ``tried`` again
    (skipped before, modified since) leave, ``added`` (the part's) join."""
    report = report_path(target)
    before = report.read_text(encoding="utf-8").splitlines() if report.exists() else []
    return [line for line in before if _named(line, tried) is None] + added


def _summary(target: Path, skipped: list[str]) -> dict[str, Any] | None:
    return skipped_summary(target.name, skipped) if skipped else None


def _named(message: str, paths: Mapping[str, Any] | set[str]) -> str | None:
    """The one of ``paths`` a skip message (``"<path>: <reason>"``) is about, if any."""
    position = message.find(": ")
    while position >= 0:
        if message[:position] in paths:
            return message[:position]
        position = message.find(": ", position + 1)
    return None
