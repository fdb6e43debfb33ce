"""The splice of an append: the part's samples written after the store's, then published.

The shards from the store's last, partial, one on are written into a splice folder beside the store, the
partial shard's old samples first (the same bytes again), in the store's own array settings; encoded
pictures are placed so that every chunk's files fit its region (`outcore.ingest.packing`), or, where
nothing fits, those fields' chunks are given more room and written again. Publishing moves each shard file
into the store in one step (a reader of the old count reads the same old samples from it), then each
array's metadata with its new shape, and last the group's, holding the new count.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import zarr

from ..errors import OutcoreWarning, SourceError
from ..format import (
    ATTRS_KEY,
    StoreAttrs,
    companion_names,
    decode_text,
    encode_text,
    ranges_name,
    shapes_name,
)
from ..storage import (
    SmallRows,
    consolidate,
    copy_rows,
    describe_classes,
    make_durable,
    open_group,
    read_files,
    remove_path,
    samples_per_shard,
    small_rows_path,
    stored_nbytes,
    write_encoded_shard,
    write_rows,
)
from ..storage.safety import read_attrs
from ..storage.staging import put_in_place
from .arrays import SOURCE_INDEX_FIELD
from .build import provenance
from .fields import PATH_FIELD
from .options import IngestOptions
from .packing import chunk_loads, fitting_order
from .scheduler import run_tasks


def splice(target: Path, part_location: Path, attrs: StoreAttrs, grown: dict[str, tuple[str, ...]],
           first_source_index: int, skipped: dict[str, Any] | None, options: IngestOptions) -> None:
    """Write the part's samples after the store's (see the module), then publish them, with the class lists
    ``grown`` and the record of ``skipped`` files, on the ``options``' client, with its progress bar."""
    store, part = open_group(target, mode="r"), open_group(part_location, mode="r")
    part_attrs = read_attrs(part, str(part_location))
    if set(part_attrs.fields) != set(attrs.fields):
        raise SourceError(f"the appended part has fields {sorted(part_attrs.fields)}, {target} has "
                          f"{sorted(attrs.fields)}: it was made with other settings; append with the store's")
    count, added = attrs.num_samples, part_attrs.num_samples
    total, chunk = count + added, attrs.chunk_size
    shard = min(samples_per_shard(store[name], chunk) for name in attrs.fields)  # the pictures' (small: more)
    encoded = [name for name, info in attrs.fields.items() if info.is_image]
    order, rooms = _store_order(store, part, encoded, count, added, chunk, str(target))
    splice = _splice_folder(target)
    discard_splice(target)
    _copy_metadata(target, splice, store, encoded, total, chunk, rooms)
    small = SmallRows.of(open_group(splice, mode="r"), small_rows_path(splice), chunk, shard).make()
    # every chunk of the fields whose room grows is written again, in regions of the new room
    start = 0 if rooms else count // shard * shard
    spec = _Splice(str(target), str(part_location), str(splice), small, sorted(attrs.fields), count, order, chunk,
                   encoded, first_source_index, sorted(rooms))
    write = dask.delayed(_splice_shard, pure=False)
    bounds = [(s, min(total, s + shard)) for s in range(start, total, shard)]
    run_tasks([write(spec, a, b) for a, b in bounds], [b - max(a, count) for a, b in bounds],
              client=options.client, progress=options.progress, description=f"append → {target.name}")
    _gather_small(store, splice, small, count, total, written_from=count // shard * shard, regrown=list(rooms))
    save_attrs(splice, _grown_attrs(attrs, part_attrs, grown, skipped))
    if rooms:
        _publish_regrown(splice, target, {name: store[name].chunks[0] for name in rooms}, rooms)
    else:  # said first: readers opening the store meanwhile see arrays grown beyond the count, and allow them
        save_attrs(target, dataclasses.replace(attrs, growing=True))
        publish(splice, target)
    discard_splice(target)


def discard_splice(target: Path) -> None:
    """Remove what a splice onto ``target`` wrote beside it (its folder and scratch), finished or not."""
    splice = _splice_folder(target)
    remove_path(splice)
    remove_path(small_rows_path(splice))


def _splice_folder(target: Path) -> Path:
    return target.with_name(f".{target.name}.append-splice")


def _gather_small(store: zarr.Group, splice_location: Path, small: SmallRows, count: int, total: int,
                  written_from: int, regrown: list[str]) -> None:
    """Each small field's shard files from its last partial one on, into the splice folder: the store's old
    samples before the first the tasks wrote (``written_from``; 0 for the ranges and shapes of the fields
    whose room grows, ``regrown``, written again whole), then the rows the tasks saved apart (``small``), up
    to ``total`` samples."""
    splice = open_group(splice_location, mode="r+")
    for name, column in small.columns.items():
        start = 0 if any(name in companion_names(field, True) for field in regrown) else written_from
        size = (splice[name].shards or splice[name].chunks)[0]
        old = min(start, count) // size * size
        copy_rows(splice[name], [(store[name], old, start), (column, start, total)])


def _grown_attrs(attrs: StoreAttrs, part_attrs: StoreAttrs, grown: dict[str, tuple[str, ...]],
                 skipped: dict[str, Any] | None) -> StoreAttrs:
    """The store's attributes once the part is added: its count, class lists, provenance and skip record."""
    appended = {**provenance(part_attrs.provenance.get("source", "")), "first_sample": attrs.num_samples,
                "samples": part_attrs.num_samples, "shuffled_on_write": part_attrs.shuffled_on_write,
                "seed": part_attrs.seed}
    return dataclasses.replace(with_classes(attrs, grown), num_samples=attrs.num_samples + part_attrs.num_samples,
                               provenance={**attrs.provenance, "appended": [*attrs.provenance.get("appended", []),
                                                                            appended]},
                               skipped=skipped)


def _store_order(store: zarr.Group, part: zarr.Group, encoded: list[str], count: int, added: int,
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
        loads = chunk_loads(nbytes[order], count, used, chunk_size)
        if loads.max() > capacity:
            rooms[name] = int(loads.max())
    return order, rooms


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
    """What every splice task needs: the three folders, where the small fields' rows are saved, the fields,
    the store's count, the part's order, the chunk size, the encoded fields and the first ``source_index``
    of the part."""

    target: str
    part: str
    splice: str
    small: SmallRows
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
    splice = {**dict(open_group(spec.splice, mode="r+").arrays()), **spec.small.columns}  # small fields' apart
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
            new = encode_text(decode_text(new), store[name].shape[1])  # the splice's own width
        elif name == SOURCE_INDEX_FIELD:
            new = new + spec.first_source_index
        _write_rows(target_array, start, store[name][old], new.astype(target_array.dtype, copy=False))


def _write_rows(array: zarr.Array, start: int, old: np.ndarray, new: np.ndarray) -> None:
    write_rows(array, start, np.concatenate([old, new.astype(old.dtype)]))


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


def publish(splice: Path, target: Path) -> None:
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


def with_classes(attrs: StoreAttrs, grown: dict[str, tuple[str, ...]]) -> StoreAttrs:
    fields = {name: dataclasses.replace(info, classes=grown[name]) if name in grown else info
              for name, info in attrs.fields.items()}
    return dataclasses.replace(attrs, fields=fields)


def save_attrs(target: Path, attrs: StoreAttrs) -> None:
    """Write ``attrs`` (and the class flags of the label arrays) into the group at ``target``."""
    group = open_group(target, mode="r+")
    describe_classes(group, attrs.fields)
    group.attrs[ATTRS_KEY] = attrs.to_dict()
    consolidate(target)
