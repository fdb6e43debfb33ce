"""Add new files to an image store in place: ``ingest_images(..., append=True)``, ``outcore ingest --append``.

Which files are new is decided against what the store records of its own: ``path``, and ``file_stat``
(size and modification time); with ``by_content``, ``file_digest`` (a file renamed or only touched is
then known by its bytes). A stored file whose size or time changed is an error naming it: an append
adds files, it never replaces one silently. The new files are then

1. ingested on their own into a part store beside the target, with the store's own settings (decoded in
   parallel, shuffled within themselves, bad files skipped or refused, resumable: `outcore.ingest.build`);
2. spliced onto the store: the shards from the store's last, partial, one on are written into a splice
   folder beside it, the partial shard's old samples first (the same bytes again), in the store's own
   array settings; encoded pictures are placed so that every chunk's files fit its region;
3. published: each shard file replaces the store's in one step (a reader of the old count reads the
   same old samples from it), then each array's metadata with its new shape, and last the group's,
   holding the new sample count, the grown class lists (old numbers kept) and the part's provenance.

Readers see the old count or the new one, never a mix. A killed append leaves the store as it was (at
most with shard files past its count, which nothing reads); running it again finishes it, the part's
ingest resuming where it stopped.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import zarr

from ..dataset import Dataset, open_dataset
from ..errors import OptionError, OutcoreError, OutcoreWarning, SourceError, StorageError
from ..format import ATTRS_KEY, StoreAttrs, decode_text, encode_text, ranges_name, shapes_name
from ..imaging import parse_image_dtype, parse_image_shape, parse_resize, read_image_file
from ..storage import (
    consolidate,
    describe_classes,
    is_url,
    is_zip,
    make_durable,
    open_group,
    read_files,
    remove_path,
    stored_nbytes,
    writable,
    write_encoded_shard,
)
from ..storage.safety import check_safe, read_attrs
from ..storage.staging import put_in_place, storage_error
from ..threads import for_each
from .arrays import SOURCE_INDEX_FIELD
from .build import AllSkippedError, provenance, report_path, skipped_summary, write_report
from .decode_tasks import DIGEST_SIZE, file_digest
from .fields import FILE_DIGEST_FIELD, FILE_STAT_FIELD, PATH_FIELD, file_stat
from .scheduler import run_tasks
from .sources import SourceTable
from .writer import cast_values, writer_lock

Ingest = Callable[..., Dataset]  # `images._ingest_table`: a table into a new store, with the image options
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


def append_table(
    table: SourceTable,
    location: str | os.PathLike,
    ingest: Ingest,
    options: dict[str, Any],
    *,
    by_content: bool = False,
    classes: Mapping[str, Sequence[str]] | None = None,
) -> Dataset:
    """Add the files of ``table`` that the store at ``location`` lacks (see the module); return the store.

    ``ingest(table, location, **options)`` writes a store of ``table`` with the image ``options`` (those
    of `outcore.ingest_images`, checked against the settings the store was made with). ``classes`` are
    the class lists the store should end with (each its old list extended; `ingest_splits` gives every
    split the same), by default the old lists extended by the new files' classes, sorted.
    """
    if is_url(location) or is_zip(location):
        raise OptionError(f"append adds to a local directory store, not {str(location)!r}: append to the "
                          "directory, then pack or upload it")
    if options["overwrite"]:
        raise OptionError("append=True adds to the store and overwrite=True replaces it: pass one of them")
    target = Path(location)
    if not target.exists():  # the first run of a recurring append: an ordinary ingest
        return ingest(_part_table(table, np.arange(len(table)), dict(classes or table.classes)), target, **options)
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
    remove_path(target.with_name(f".{target.name}.append-splice"))
    part = target.with_name(f".{target.name}.append.zarr")
    count = read_attrs(open_group(target, mode="r"), str(target)).num_samples
    goes_on = ""
    if part.exists():
        size = sum(file.stat().st_size for file in part.rglob("*") if file.is_file())
        goes_on = f", which goes on from the new files' part ingested so far ({part}, {size / 2**20:.1f} MiB)"
    reason = OSError(error.errno, os.strerror(error.errno)) if error.errno else error
    return storage_error(reason, target, f"It keeps its {count:,} samples as they were (an append publishes its "
                                         f"count last): free some space, then run the same append again{goes_on}")


def _append(table: SourceTable, target: Path, ingest: Ingest, options: dict[str, Any], by_content: bool,
            classes: Mapping[str, Sequence[str]] | None) -> None:
    group = open_group(target, mode="r")
    attrs = read_attrs(group, str(target))
    check_safe(group, list(group.array_keys()), str(target))
    if options["images"] is None:  # left to choose: as the store holds them
        options = {**options, "images": (attrs.provenance.get("recipe") or {}).get("images")}
    _check_recipe(attrs, options, str(target))
    stored = _stored_files(group, attrs, str(target), by_content)
    labels = label_fields(attrs)
    new = _not_skipped_before(target, table, _new_rows(table, stored, labels, attrs, by_content, str(target)))
    grown = _grown_classes(attrs, table, new, classes, str(target))
    if len(new) == 0:
        if grown != {name: attrs.fields[name].classes for name in grown}:
            _save_attrs(target, _with_classes(attrs, grown))
        return
    _check_fits(group, table, new, attrs, labels, str(target))
    part_table = _part_table(table, new, grown)
    part, tried = target.with_name(f".{target.name}.append.zarr"), set(part_table.paths)
    try:
        ingest(part_table, part, **{**options, "overwrite": True, "resume": True, "storage_options": None})
    except AllSkippedError as error:  # every new file is bad: only the record of skipped files changes
        skipped = _merged_skipped(target, error.messages, tried)
        _save_attrs(target, dataclasses.replace(_with_classes(attrs, grown), skipped=_summary(target, skipped)))
        write_report(target, skipped)
        return
    _splice(target, part, attrs, grown, _next_source_index(group, attrs), tried, options)
    remove_path(part)
    remove_path(report_path(part))


def label_fields(attrs: StoreAttrs) -> list[str]:
    """The fields of an image store that came from the source's labels (folders, or a table's columns)."""
    return [name for name, info in attrs.fields.items() if info.role in LABEL_ROLES]


def _check_recipe(attrs: StoreAttrs, options: dict[str, Any], shown: str) -> None:
    """The options that make samples must be those the store's samples were made with."""
    recipe = attrs.provenance.get("recipe")
    if not recipe or FILE_STAT_FIELD not in attrs.fields:
        raise OptionError(
            f"{shown} does not record its files' sizes and times (it was not made by an image ingest of this "
            "outcore version), so the new files cannot be told from the old: ingest all of them again once "
            "(overwrite=True); later runs can append"
        )
    shape = parse_image_shape(options["shape"])
    given = {"shape": list(shape), "dtype": parse_image_dtype(options["dtype"]).name, "images": options["images"],
             "resize": parse_resize(options["resize"]), "max_side": options["max_side"], "quality": options["quality"]}
    relevant = [name for name in given if name != "quality" or recipe.get("max_side") is not None]
    if shape[0] is None:
        relevant.remove("resize")
    for name in relevant:
        if given[name] != recipe.get(name):
            stored = ",".join("none" if s is None else str(s) for s in recipe["shape"]) if name == "shape" \
                else recipe.get(name)
            raise OptionError(f"{shown} was made with {name} {stored!r}, not {given[name]!r}: append with the "
                              f"store's settings ({name}={stored!r}) so that old and new samples are alike")
    for name, value in (("chunk_size", attrs.chunk_size), ("compression", None)):
        if options[name] is not None and options[name] != value:
            raise OptionError(f"an append writes {shown}'s chunks as they are (chunk size {attrs.chunk_size}, its "
                              f"own compression): leave out {name}={options[name]!r}")


def _stored_files(group: zarr.Group, attrs: StoreAttrs, shown: str, by_content: bool) -> StoredFiles:
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


def _new_rows(table: SourceTable, stored: StoredFiles, labels: list[str], attrs: StoreAttrs, by_content: bool,
              shown: str) -> np.ndarray:
    """The rows of ``table`` to add; a stored file that changed, or whose label did, is a `SourceError`."""
    if sorted(table.labels) != sorted(labels):
        raise SourceError(f"the source has label field(s) {sorted(table.labels)}, {shown} has {sorted(labels)}: "
                          "append from a source of the same columns")
    where = {name: i for i, name in enumerate(stored.names)}
    known = np.array([where.get(name, -1) for name in table.names], dtype=np.int64)
    old = known >= 0
    now = np.array([file_stat(path) for path in table.paths], dtype=np.int64).reshape(-1, 2)
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


def _grown_classes(attrs: StoreAttrs, table: SourceTable, new: np.ndarray,
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


def _check_fits(group: zarr.Group, table: SourceTable, new: np.ndarray, attrs: StoreAttrs, labels: list[str],
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


def _with_classes(attrs: StoreAttrs, grown: dict[str, tuple[str, ...]]) -> StoreAttrs:
    fields = {name: dataclasses.replace(info, classes=grown[name]) if name in grown else info
              for name, info in attrs.fields.items()}
    return dataclasses.replace(attrs, fields=fields)


def _save_attrs(target: Path, attrs: StoreAttrs) -> None:
    """Write ``attrs`` (and the class flags of the label arrays) into the group at ``target``."""
    group = open_group(target, mode="r+")
    describe_classes(group, attrs.fields)
    group.attrs[ATTRS_KEY] = attrs.to_dict()
    consolidate(target)


# --- the splice ---------------------------------------------------------------------------------------


def _splice(target: Path, part_location: Path, attrs: StoreAttrs, grown: dict[str, tuple[str, ...]],
            first_source_index: int, tried: set[str], options: dict[str, Any]) -> None:
    """Write the part's samples after the store's (see the module), then publish them; ``tried`` are the
    files the part was made of."""
    store, part = open_group(target, mode="r"), open_group(part_location, mode="r")
    part_attrs = read_attrs(part, str(part_location))
    if set(part_attrs.fields) != set(attrs.fields):
        raise SourceError(f"the appended part has fields {sorted(part_attrs.fields)}, {target} has "
                          f"{sorted(attrs.fields)}: it was made with other settings; append with the store's")
    count, added = attrs.num_samples, part_attrs.num_samples
    total, paths = count + added, store[PATH_FIELD]  # an array of samples (an encoded field's is of bytes)
    shard = (paths.shards or paths.chunks)[0]
    start = count // shard * shard
    encoded = [name for name, info in attrs.fields.items() if info.is_image]
    order, rooms = _fitting_order(store, part, encoded, count, added, attrs.chunk_size, str(target))
    if rooms:  # every chunk of those fields is written again, in regions of the new room
        start = 0
    splice = target.with_name(f".{target.name}.append-splice")
    remove_path(splice)
    _copy_metadata(target, splice, store, encoded, total, attrs.chunk_size, rooms)
    spec = _Splice(str(target), str(part_location), str(splice), sorted(attrs.fields), count, order,
                   attrs.chunk_size, encoded, first_source_index, sorted(rooms))
    write = dask.delayed(_splice_shard, pure=False)
    bounds = [(s, min(total, s + shard)) for s in range(start, total, shard)]
    run_tasks([write(spec, a, b) for a, b in bounds], [b - max(a, count) for a, b in bounds],
              client=options["client"], progress=options["progress"], description=f"append → {target.name}")
    part_report = report_path(part_location)
    skipped = _merged_skipped(target, part_report.read_text(encoding="utf-8").splitlines()
                              if part_report.exists() else [], tried)
    _save_attrs(splice, _grown_attrs(attrs, part_attrs, grown, _summary(target, skipped)))
    if rooms:
        _publish_regrown(splice, target, {name: store[name].chunks[0] for name in rooms}, rooms)
    else:  # said first: readers opening the store meanwhile see arrays grown beyond the count, and allow them
        _save_attrs(target, dataclasses.replace(attrs, growing=True))
        _publish(splice, target)
    write_report(target, skipped)
    remove_path(splice)


def _grown_attrs(attrs: StoreAttrs, part_attrs: StoreAttrs, grown: dict[str, tuple[str, ...]],
                 skipped: dict[str, Any] | None) -> StoreAttrs:
    """The store's attributes once the part is added: its count, class lists, provenance and skip record."""
    appended = {**provenance(part_attrs.provenance.get("source", "")), "first_sample": attrs.num_samples,
                "samples": part_attrs.num_samples, "shuffled_on_write": part_attrs.shuffled_on_write,
                "seed": part_attrs.seed}
    return dataclasses.replace(_with_classes(attrs, grown), num_samples=attrs.num_samples + part_attrs.num_samples,
                               provenance={**attrs.provenance, "appended": [*attrs.provenance.get("appended", []),
                                                                            appended]},
                               skipped=skipped)


def _fitting_order(store: zarr.Group, part: zarr.Group, encoded: list[str], count: int, added: int,
                   chunk_size: int, shown: str) -> tuple[np.ndarray, dict[str, int]]:
    """The order of the part's samples after the store's: the part's own (shuffled on write), with the
    fewest swaps, or the packing, that make every chunk's encoded files fit its region (`fitting_order`);
    and the room each encoded field's chunks must grow to where nothing fits (the part's own order then:
    the fullest chunk's bytes, as an ingest sizes them), by field."""
    order, rooms = np.arange(added), {}
    for name in encoded:
        ranges = store[ranges_name(name)][count // chunk_size * chunk_size : count]  # the last chunk's
        used = int((ranges[:, 1] - ranges[:, 0]).sum())
        capacity, nbytes = store[name].chunks[0], stored_nbytes(part, name, added)
        if name == encoded[0] and not rooms:
            try:
                order = fitting_order(nbytes, count, used, chunk_size, capacity, name, shown)
            except SourceError:
                order = np.arange(added)
        loads = _chunk_loads(nbytes[order], count, used, chunk_size)
        if loads.max() > capacity:
            rooms[name] = int(loads.max())
    return order, rooms


def _chunk_loads(nbytes: np.ndarray, first: int, used: int, chunk_size: int) -> np.ndarray:
    slots = (first + np.arange(len(nbytes))) // chunk_size - first // chunk_size
    loads = np.bincount(slots, weights=nbytes, minlength=int(slots[-1]) + 1 if len(slots) else 1).astype(np.int64)
    loads[0] += used
    return loads


def fitting_order(nbytes: np.ndarray, first: int, used: int, chunk_size: int, capacity: int, name: str = "images",
                  shown: str = "the store") -> np.ndarray:
    """An order of samples of ``nbytes`` bytes, placed from sample ``first`` of a store on (the chunk
    ``first`` falls in already holds ``used`` bytes), in which each chunk's bytes fit ``capacity``: the
    given order, but for a few swaps of a sample of a chunk over capacity with a smaller one of the chunk
    with the most room; when swaps cannot make them fit, a packing of all of them (`_packed`). A
    `SourceError` when that does not fit either.

    >>> fitting_order(np.array([9, 9, 1, 1]), 0, 0, 2, 10).tolist()
    [2, 1, 0, 3]
    """
    swapped = _swapped(nbytes, first, used, chunk_size, capacity)
    if swapped is None:
        swapped = _packed(nbytes, first, used, chunk_size, capacity)
    if swapped is None:
        raise SourceError(f"field {name!r}: the appended files are larger than the chunks of {shown} have room "
                          f"for ({capacity} bytes a chunk, sized at ingest by its largest): ingest all the files "
                          "again with overwrite=True")
    return swapped


def _swapped(nbytes: np.ndarray, first: int, used: int, chunk_size: int, capacity: int) -> np.ndarray | None:
    """The given order with a few swaps that make every chunk fit (see `fitting_order`), or None."""
    order = np.arange(len(nbytes))
    slots = (first + order) // chunk_size - first // chunk_size
    loads = _chunk_loads(nbytes, first, used, chunk_size)
    for _ in range(4 * len(nbytes) + 8):
        over = np.flatnonzero(loads > capacity)
        if not over.size:
            return order
        chunk, donor = over[0], int(np.argmin(loads))
        swap = _swap(nbytes[order], np.flatnonzero(slots == chunk), np.flatnonzero(slots == donor),
                     int(loads[chunk] - capacity), int(capacity - loads[donor]))
        if swap is None:
            return None
        big, small = swap
        delta = int(nbytes[order[big]] - nbytes[order[small]])
        order[[big, small]] = order[[small, big]]
        loads[chunk] -= delta
        loads[donor] += delta
    return None


def _packed(nbytes: np.ndarray, first: int, used: int, chunk_size: int, capacity: int) -> np.ndarray | None:
    """An order in which every chunk fits, found by packing: the samples, largest first, each into the chunk
    with the most room left that has a place left (each chunk takes as many samples as its place in the
    store gives it), then each chunk's samples in the given order (the part's shuffled one); None when
    that leaves a chunk over ``capacity``.

    >>> _packed(np.array([6, 6, 5, 5, 1, 1]), 0, 0, 3, 12).tolist()
    [0, 2, 4, 1, 3, 5]
    """
    count = len(nbytes)
    chunk_of = (first + np.arange(count)) // chunk_size - first // chunk_size
    places = np.bincount(chunk_of).tolist()
    room = [capacity - (used if chunk == 0 else 0) for chunk in range(len(places))]
    most_room = [(-room[chunk], chunk) for chunk in range(len(places))]
    heapq.heapify(most_room)
    for sample in np.argsort(-nbytes, kind="stable").tolist():
        _, chunk = heapq.heappop(most_room)
        chunk_of[sample] = chunk
        room[chunk] -= int(nbytes[sample])
        places[chunk] -= 1
        if places[chunk]:
            heapq.heappush(most_room, (-room[chunk], chunk))
    if min(room) < 0:
        return None
    return np.lexsort((np.arange(count), chunk_of))


def _swap(sizes: np.ndarray, mine: np.ndarray, theirs: np.ndarray, excess: int, spare: int) -> tuple[int, int] | None:
    """Positions ``(a, b)`` of ``mine`` and ``theirs`` whose exchange moves from 1 to ``spare`` bytes to
    theirs: ``excess`` or more if any pair can, else as many as can be."""
    theirs = theirs[np.argsort(sizes[theirs], kind="stable")]
    sorted_sizes = sizes[theirs]
    best: tuple[int, int, int] | None = None  # (bytes moved, a, b)
    for a in mine:
        i = int(np.searchsorted(sorted_sizes, sizes[a] - spare))  # the largest move that still fits
        if i == len(theirs) or sorted_sizes[i] >= sizes[a]:
            continue
        moved = int(sizes[a] - sorted_sizes[i])
        if moved >= excess:
            return int(a), int(theirs[i])
        if best is None or moved > best[0]:
            best = (moved, int(a), int(theirs[i]))
    return None if best is None else best[1:]


def _copy_metadata(target: Path, splice: Path, store: zarr.Group, encoded: list[str], total: int,
                   chunk_size: int, rooms: Mapping[str, int]) -> None:
    """The store's group and array metadata in ``splice``, each array's shape grown to ``total`` samples
    (an encoded field's bytes to as many chunk regions, of its new room where ``rooms`` gives one)."""
    splice.mkdir(parents=True)
    shutil.copyfile(target / "zarr.json", splice / "zarr.json")
    for name in store.array_keys():
        document = json.loads((target / name / "zarr.json").read_text())
        if name in encoded:  # chunk regions of bytes
            room = rooms.get(name, store[name].chunks[0])
            document = _with_room(document, store[name], room) if name in rooms else document
            shape = [-(-total // chunk_size) * room]
        else:
            shape = [total, *document["shape"][1:]]
        (splice / name).mkdir()
        (splice / name / "zarr.json").write_text(json.dumps({**document, "shape": shape}, indent=2))


def _with_room(document: dict[str, Any], array: zarr.Array, room: int) -> dict[str, Any]:
    """An encoded field's bytes array metadata with chunk regions of ``room`` bytes (as many per shard)."""
    per_shard = array.shards[0] // array.chunks[0]
    grid = {**document["chunk_grid"], "configuration": {"chunk_shape": [room * per_shard]}}
    codecs = [{**codec, "configuration": {**codec["configuration"], "chunk_shape": [room]}}
              if codec.get("name") == "sharding_indexed" else codec for codec in document["codecs"]]
    return {**document, "chunk_grid": grid, "codecs": codecs}


def _publish_regrown(splice: Path, target: Path, before: Mapping[str, int], rooms: Mapping[str, int]) -> None:
    """Put the grown store in place in one step, its chunks' room grown: ``splice`` is completed with
    hard links to the store's files it does not replace (no copy), then swapped in (`put_in_place`). Readers
    of the old store keep reading the files they share; those of the rewritten fields stop with
    `StoreChangedError`. Says what it cost."""
    rewritten = sum(path.stat().st_size for path in splice.rglob("*") if path.is_file())
    for folder, _, names in os.walk(target):
        for name in names:
            path = Path(folder, name)
            linked = splice / path.relative_to(target)
            if not linked.exists():
                linked.parent.mkdir(parents=True, exist_ok=True)
                os.link(path, linked)
    make_durable([path for path in splice.rglob("*") if path.is_file()])
    put_in_place(splice, target)
    grown = ", ".join(f"{name!r} from {before[name]:,} to {room:,} bytes" for name, room in rooms.items())
    warnings.warn(f"the appended files are larger than the chunks of {target} had room for: grew the room of "
                  f"field(s) {grown} a chunk, writing those fields again ({rewritten / 2**20:,.1f} MiB written; the "
                  "other fields' files kept as they are). Readers that had the store open stop with "
                  "StoreChangedError when they read those fields", OutcoreWarning, stacklevel=5)


@dataclass(frozen=True)
class _Splice:
    """What every splice task needs: the three folders, the fields, the store's count, the part's order,
    the chunk size, the encoded fields and the first ``source_index`` of the part."""

    target: str
    part: str
    splice: str
    fields: list[str]
    count: int
    order: np.ndarray
    chunk_size: int
    encoded: list[str]
    first_source_index: int
    regrown: list[str]  # encoded fields whose chunks' room grows: every shard of theirs is written again


def _splice_shard(spec: _Splice, start: int, stop: int) -> None:
    """Write samples ``start .. stop - 1`` (a shard) of the grown store into the splice folder: the
    store's own up to its count, then the part's in ``spec.order``."""
    store, part = open_group(spec.target, mode="r"), open_group(spec.part, mode="r")
    splice = open_group(spec.splice, mode="r+")
    old = slice(start, min(stop, spec.count))
    rows = spec.order[max(start, spec.count) - spec.count : max(stop, spec.count) - spec.count]
    for name in spec.fields:
        if stop <= spec.count and name not in spec.regrown:
            continue  # a shard of old samples only, written again for the fields whose room grows
        if name in spec.encoded:
            blobs = read_files(store[name], store[ranges_name(name)], old.start, old.stop) if old.stop > old.start \
                else []
            write_encoded_shard(splice, name, start, blobs + _take_files(part, name, rows), spec.chunk_size)
            if shapes_name(name) in splice:
                _write_rows(splice[shapes_name(name)], start, store[shapes_name(name)][old],
                            _take(part[shapes_name(name)], rows))
            continue
        new = _take(part[name], rows)
        target_array = splice[name]
        if name == PATH_FIELD:
            new = encode_text(decode_text(new), target_array.shape[1])
        elif name == SOURCE_INDEX_FIELD:
            new = new + spec.first_source_index
        _write_rows(target_array, start, store[name][old], new.astype(target_array.dtype, copy=False))


def _write_rows(array: zarr.Array, start: int, old: np.ndarray, new: np.ndarray) -> None:
    writable(array)[start : start + len(old) + len(new)] = np.concatenate([old, new.astype(old.dtype)])


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """``rows`` sorted, as runs ``[start, stop)`` of consecutive numbers."""
    ordered = np.unique(rows)
    breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(ordered, breaks) if len(run)]


def _take(array: zarr.Array, rows: np.ndarray) -> np.ndarray:
    """``array[rows]``, read as a few runs of consecutive rows (the part's order is its own but for swaps)."""
    if len(rows) == 0:
        return np.zeros((0, *array.shape[1:]), dtype=array.dtype)
    runs = _runs(rows)
    values = np.concatenate([array[a:b] for a, b in runs])
    position = np.concatenate([np.arange(a, b) for a, b in runs])
    return values[np.searchsorted(position, rows)]


def _take_files(part: zarr.Group, name: str, rows: np.ndarray) -> list[bytes]:
    files: dict[int, bytes] = {}
    for a, b in _runs(rows):
        files.update(zip(range(a, b), read_files(part[name], part[ranges_name(name)], a, b), strict=True))
    return [files[int(row)] for row in rows]


def _publish(splice: Path, target: Path) -> None:
    """Move the splice folder's shard files into the store, then its arrays' metadata, then its group's:
    each file in one step, each made durable before the next kind is moved."""
    shards = [Path(folder, name).relative_to(splice) for folder, _, names in os.walk(splice) for name in names
              if name != "zarr.json"]
    metadata = [Path(name, "zarr.json") for name in os.listdir(splice) if (splice / name).is_dir()]
    for kind in (shards, metadata, [Path("zarr.json")]):
        make_durable([splice / path for path in kind])
        for path in kind:
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(splice / path, target / path)
        make_durable([target / path for path in kind])


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
