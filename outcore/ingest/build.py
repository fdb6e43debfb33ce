"""Write lazy field arrays into a new store: one task per shard file, in parallel, with a progress bar.

Each task writes a whole shard, so no two tasks ever touch the same file. The store is built in a
staging folder and moved into place only when complete (`outcore.storage.staged_store`); a store bound
for an object store has each shard uploaded by the task that wrote it, and is published once complete
(`outcore.storage.upload`). Samples are
written in a given order when asked (shuffle on write, `outcore.ingest.permute`). When samples were
skipped (``on_error="skip"``) the written store is compacted into a second one without the holes.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
import zarr

from ..errors import SourceError
from ..format import (
    ATTRS_KEY,
    Compression,
    FieldInfo,
    Layout,
    Ragged,
    StoreAttrs,
    chunk_capacity,
    dimension_names,
    ranges_name,
    shapes_name,
)
from ..storage import (
    SmallRows,
    Staging,
    StoreArrays,
    Upload,
    consolidate,
    copy_rows,
    create_encoded_field,
    create_field,
    create_ragged_field,
    describe_classes,
    read_files,
    read_ragged,
    samples_per_shard,
    small_fields,
    small_rows_path,
    staged_store,
    stored_nbytes,
    write_encoded_shard,
    write_ragged_shard,
    write_rows,
)
from ..threads import for_each
from .decode_tasks import BLOB_DTYPE
from .permute import Part, Permuted, as_dask, free_bytes, scratch_bytes
from .resume import resume_finished
from .scheduler import run_tasks

if TYPE_CHECKING:
    import dask.array as da

MAX_SKIPPED_IN_ATTRS = 100


class AllSkippedError(SourceError):
    """Every sample of an ingest failed to load (with ``on_error="skip"``): ``messages`` say why, one each."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__(f"all {len(messages)} samples failed to load; the first: {messages[0]}")
        self.messages = messages


@dataclass(frozen=True)
class FieldSource:
    """A field to write: its lazy data (samples on axis 0) and what it is for.

    ``data`` is a dask array, or, for a field written in another order than its source's (shuffle on
    write), any array (numpy, dask, zarr, h5py). For an encoded image field, ``data`` holds each sample's
    file as ``bytes`` and ``nbytes`` their sizes, known before writing (they fix the size of each
    chunk's region, see `outcore.format.encoded`); for pictures kept at their own size, ``shapes``
    (N, 3) is what each decodes to. A raster field's ``data`` holds each sample's pixels as rows, ``nbytes`` their
    counts and ``shapes`` its height, width and channels. A ragged field's ``data`` is a `Ragged` in memory
    (boxes, keypoints).
    """

    data: Any
    info: FieldInfo
    nbytes: np.ndarray | None = None
    shapes: np.ndarray | None = None


Prepare = Callable[[Path], tuple[dict[str, FieldSource], "da.Array | None"]]


@dataclass(frozen=True)
class BuildOptions:
    layout: Layout
    compression: Compression
    client: Any = None
    progress: bool = True
    overwrite: bool = False
    storage_options: Mapping[str, Any] | None = None  # of an object store location


def build_store(
    location: str | os.PathLike,
    fields: Mapping[str, FieldSource] | Prepare,
    options: BuildOptions,
    *,
    shuffled_on_write: bool,
    seed: int | None,
    source: str,
    errors: da.Array | None = None,
    order: np.ndarray | None = None,
    manifest: dict[str, Any] | None = None,
    resume: bool = False,
    recipe: dict[str, Any] | None = None,
) -> str | Path:
    """Write ``fields`` to a new store at ``location`` (a local path, or an object store URL reached with
    ``options.storage_options``); return its location.

    ``errors`` (one string per sample, ``""`` when good) marks samples to leave out; they are listed in
    the attributes and, in full, in a ``<store>.skipped.txt`` report beside the store. With ``order``,
    the store's sample ``i`` is the fields' sample ``order[i]``. With a ``manifest`` (what is written,
    from what), each finished shard is recorded, and ``resume`` continues a dead run that had the same
    manifest from its finished shards (`outcore.storage.staged_store`); when the store at ``location`` is
    the one a run of the manifest finished, it is returned, resumed or not (`outcore.ingest.resume`). ``fields`` may be a function
    making ``(fields, errors)`` given a scratch folder of the run, for sources prepared before they are
    written (pictures re-encoded smaller, `outcore.ingest.survey`); the folder is kept for ``resume``.
    ``recipe`` (the settings that made the samples, e.g. an image ingest's shape) is recorded in the
    provenance, for an append to make its samples alike.
    """
    name = store_name(location)
    if manifest is not None and not options.overwrite \
            and resume_finished(location, manifest, options.storage_options, resume):
        return location
    with staged_store(location, options.overwrite, manifest=manifest, resume=resume,
                      storage_options=dict(options.storage_options or {})) as staging:
        if callable(fields):
            fields, errors = fields(staging.scratch("prepared"))
        raw = staging.scratch("raw") if errors is not None else staging.store
        if order is not None:
            fields = _permuted(fields, order, options.layout.shard_size, staging.scratch("permute"))
        failures = _write_fields(raw, fields, errors, options, f"ingest → {name}",
                                 staging if manifest is not None else None,
                                 staging.upload if raw == staging.store else None)
        if failures:
            fields = _without(raw, fields, failures, _num_samples(fields))
            _write_fields(staging.store, fields, None, options, f"compact → {name}", None, staging.upload)
        elif raw != staging.store:
            os.replace(raw, staging.store)
        messages = [message for _, message in failures]
        attrs = StoreAttrs(
            num_samples=_num_samples(fields),
            chunk_size=options.layout.chunk_size,
            fields={name: _recorded(f) for name, f in fields.items()},
            shuffled_on_write=shuffled_on_write,
            seed=seed,
            provenance={**provenance(source, recipe), **({"manifest": manifest} if manifest else {})},
            skipped=skipped_summary(name, messages) if messages else None,
        )
        group = zarr.open_group(staging.store, mode="r+")
        group.attrs[ATTRS_KEY] = attrs.to_dict()
        describe_classes(group, attrs.fields)
        consolidate(staging.store)
        if staging.upload:
            staging.upload.put_report(report_name(name), "".join(f"{m}\n" for m in messages))
    if not staging.upload:
        write_report(Path(location), messages)
    return location


def _write_fields(
    directory: Path,
    fields: Mapping[str, FieldSource],
    errors: da.Array | None,
    options: BuildOptions,
    description: str,
    staging: Staging | None,
    upload: Upload | None,
) -> list[tuple[int, str]]:
    """Create the group at ``directory``, write every shard; return ``(index, message)`` of bad samples.

    With ``staging``, each finished shard leaves a marker holding its bad samples, and the shards that a
    resumed run finished are not written again. With ``upload``, each finished shard is uploaded (by
    the task that wrote it) before its marker is left.
    """
    num_samples = _num_samples(fields)
    for name, field in fields.items():
        if len(field.data) != num_samples:
            raise SourceError(f"field {name!r} has {len(field.data)} samples, others have {num_samples}")
    shard = options.layout.shard_size
    starts = range(0, num_samples, shard)
    markers = [staging.done(f"shard-{i}") if staging else None for i in range(len(starts))]
    todo = [i for i, marker in enumerate(markers) if marker is None or not marker.exists()]
    fresh = len(todo) == len(starts)  # nothing written yet: (re)create the arrays
    group = zarr.open_group(directory, mode="w" if fresh else "r")
    if fresh:
        _create_fields(group, fields, num_samples, options)
    small = SmallRows.of(group, small_rows_path(directory), options.layout.chunk_size, options.layout.shard_size)
    if fresh:
        small.make()
    encoded = [name for name, field in fields.items() if field.nbytes is not None]
    blocks = {name: _shard_blocks(field.data, shard) for name, field in fields.items()}
    for name, field in fields.items():
        if field.shapes is not None:  # written as a plain array beside the field's bytes
            blocks[shapes_name(name)] = _shard_blocks(as_dask(field.shapes, shard), shard)
    error_blocks = _shard_blocks(errors, shard) if errors is not None else None
    # What every shard shares is bound once; a shard's blocks are top-level arguments: Dask finalizes a collection
    # met inside a container (a dict of blocks), culling the whole array's graph each time: shards x graph.
    write = dask.delayed(functools.partial(_write_shard, StoreArrays(str(directory)), small, tuple(blocks), encoded,
                                           options.layout.chunk_size), pure=False)
    tasks = [
        write(starts[i], error_blocks[i] if error_blocks is not None else None,
              str(markers[i]) if markers[i] else None, (upload, i) if upload else None, *(b[i] for b in blocks.values()))
        for i in todo
    ]
    weights = [min(shard, num_samples - starts[i]) for i in todo]
    results = run_tasks(tasks, weights, client=options.client, progress=options.progress, description=description)
    _gather_small(directory, small, num_samples)
    if staging is not None:
        results = [[tuple(failure) for failure in json.loads(marker.read_text())] for marker in markers]
    return [failure for shard_failures in results for failure in shard_failures]


def _create_fields(group: zarr.Group, fields: Mapping[str, FieldSource], num_samples: int,
                   options: BuildOptions) -> None:
    dims = dimension_names({name: (field.data.dtype, field.data.shape[1:]) for name, field in fields.items()
                            if field.nbytes is None and not isinstance(field.data, Ragged)})
    small = small_fields({name: _sample_nbytes(field) for name, field in fields.items()})
    for name, field in fields.items():
        if isinstance(field.data, Ragged):
            create_ragged_field(group, name, field.data.counts, options.layout, options.compression,
                                field.data.values.dtype, field.data.row_shape)
        elif field.nbytes is not None:  # files' bytes, or a raster's pixels
            capacity = chunk_capacity(field.nbytes, options.layout.chunk_size)
            create_encoded_field(group, name, num_samples, capacity, options.layout, options.compression,
                                 variable=field.shapes is not None, dtype=field.info.dtype or np.uint8,
                                 row_shape=field.info.sample_shape or ())
        else:  # the fields smaller than the largest (labels, paths beside the pictures) in shards of their own
            create_field(group, name, field.data.dtype, field.data.shape[1:], num_samples, options.layout,
                         options.compression, dims[name], small=name in small)


def _sample_nbytes(field: FieldSource) -> float:
    """A sample's bytes in ``field``: its array's, or an encoded field's files' on average."""
    if field.nbytes is not None:
        return float(np.mean(field.nbytes)) if len(field.nbytes) else 0.0
    if isinstance(field.data, Ragged):
        return field.data.values.nbytes / max(1, len(field.data))
    return math.prod(field.data.shape[1:]) * np.dtype(field.data.dtype).itemsize


def _gather_small(directory: Path, small: SmallRows, num_samples: int) -> None:
    """Copy the small fields' rows the tasks saved apart (``small``) into the store's arrays at ``directory``,
    a shard file of theirs at a time (the rows stay until the run ends: a resumed run gathers again), the fields
    on the pool's threads (each file's read, and each shard's encoding and write, release the GIL)."""
    group = zarr.open_group(directory, mode="r+")
    columns = [(group[name], column) for name, column in small.columns.items()]
    for_each(lambda i: copy_rows(columns[i][0], [(columns[i][1], 0, num_samples)]), len(columns))


def _recorded(field: FieldSource) -> FieldInfo:
    """The field's attributes, with what its array holds (encoded images: their decode settings say)."""
    if field.nbytes is not None or field.info.is_ragged:
        return field.info
    return dataclasses.replace(field.info, dtype=np.dtype(field.data.dtype).name,
                               sample_shape=tuple(int(s) for s in field.data.shape[1:]))


def _permuted(fields: Mapping[str, FieldSource], order: np.ndarray, shard: int, scratch: Path) -> dict[str, FieldSource]:
    needed = sum(scratch_bytes(field.data) for field in fields.values() if not isinstance(field.data, Ragged))
    if needed > free_bytes(scratch.parent):
        raise SourceError(
            f"shuffling on write needs {needed / 2**30:.1f} GiB of scratch space beside the store, and "
            f"{scratch.parent} has {free_bytes(scratch.parent) / 2**30:.1f} GiB free: free some, or pass "
            "shuffle_on_write=False (iteration still shuffles, less thoroughly)"
        )
    if any(field.nbytes is not None for field in fields.values()):
        raise SourceError("encoded image fields are written in their own order; they cannot be permuted")
    return {name: FieldSource(field.data.take(order) if isinstance(field.data, Ragged)  # rows in memory
                              else Permuted(field.data, order, scratch), field.info) for name, field in fields.items()}


def _num_samples(fields: Mapping[str, FieldSource]) -> int:
    return len(next(iter(fields.values())).data)


def _shard_blocks(data: da.Array | Permuted | Ragged, shard: int) -> list[Any]:
    """One task per shard: its samples, or (shuffled on write) the `Part` that makes them."""
    if isinstance(data, Permuted):
        return data.parts(shard)
    if isinstance(data, Ragged):
        return [data[start : start + shard] for start in range(0, len(data), shard)]
    whole = (shard,) + (-1,) * (data.ndim - 1)
    return list(data.rechunk(whole).to_delayed(optimize_graph=False).ravel())


def _write_shard(
    store: StoreArrays, small: SmallRows, names: tuple[str, ...], encoded: list[str], chunk_size: int, start: int,
    errors: np.ndarray | None, marker: str | None, upload: tuple[Upload, int] | None, *values: Any,
) -> list[tuple[int, str]]:
    """Write one shard of every field ``names`` (their blocks ``values``; into the arrays of ``store``, opened once
    a process; the small fields' rows saved apart, ``small``); with ``upload`` (where to, which shard), upload it;
    then, with a ``marker`` path, record it as done (with its failures)."""
    blocks = dict(zip(names, values, strict=True))
    ranges = [ranges_name(name) for name, block in blocks.items() if name in encoded or isinstance(block, Ragged)]
    arrays = {name: small.columns[name] if name in small.columns else store[name] for name in [*blocks, *ranges]}
    for name, block in blocks.items():
        if isinstance(block, Part):  # shuffled on write: made here, so it never waits between tasks
            block = block()
        if isinstance(block, Ragged):
            write_ragged_shard(arrays, name, start, block, chunk_size)
        elif name in encoded:
            write_encoded_shard(arrays, name, start, block, chunk_size)
        else:
            write_rows(arrays[name], start, block)
    failures = [] if errors is None else [(start + int(i), str(errors[i])) for i in np.flatnonzero(errors != "")]
    if upload is not None:
        upload[0].put_shard(Path(store.directory), upload[1])
    if marker is not None:
        partial = f"{marker}.partial"
        Path(partial).write_text(json.dumps(failures))
        os.replace(partial, marker)  # a marker exists only once its shard is written
    return failures


def _without(
    directory: Path, fields: Mapping[str, FieldSource], failures: list[tuple[int, str]], num_samples: int
) -> dict[str, FieldSource]:
    import dask.array as da  # here, not at the top: `outcore.ingest.imports`

    keep = np.setdiff1d(np.arange(num_samples), [index for index, _ in failures])
    if keep.size == 0:
        raise AllSkippedError([message for _, message in sorted(failures)])
    group = zarr.open_group(directory, mode="r")
    kept = {}
    for name, field in fields.items():
        if field.nbytes is not None:
            block = samples_per_shard(group[name], group[ranges_name(name)].chunks[0])  # a shard of pictures
            data = _blob_array(str(directory), name, num_samples, block)[keep]
            shapes = None if field.shapes is None else field.shapes[keep]
            kept[name] = FieldSource(data, field.info, stored_nbytes(group, name, num_samples)[keep], shapes)
        elif isinstance(field.data, Ragged):
            kept[name] = FieldSource(read_ragged(group, name, 0, num_samples).take(keep), field.info)
        else:
            kept[name] = FieldSource(da.from_zarr(group[name])[keep], field.info)
    return kept


def _blob_array(directory: str, name: str, num_samples: int, block_size: int) -> da.Array:
    """A field's stored files as a lazy object array of ``bytes``, one task per block of samples."""
    import dask.array as da

    read = dask.delayed(_read_blobs, pure=True)
    parts = [
        da.from_delayed(read(directory, name, start, min(num_samples, start + block_size)),
                        (min(num_samples, start + block_size) - start,), dtype=BLOB_DTYPE)
        for start in range(0, num_samples, block_size)
    ]
    return da.concatenate(parts)


def _read_blobs(directory: str, name: str, start: int, stop: int) -> np.ndarray:
    """Samples ``start .. stop - 1`` of a field in regions: each one's file, or a raster's pixels (its rows)."""
    group = zarr.open_group(directory, mode="r")
    blobs = np.empty(stop - start, dtype=BLOB_DTYPE)
    files = group[name].dtype == np.uint8 and group[name].ndim == 1
    for i, blob in enumerate(read_files(group[name], group[ranges_name(name)], start, stop) if files
                             else read_ragged(group, name, start, stop).samples()):
        blobs[i] = blob
    return blobs


def provenance(source: str, recipe: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where a store (or a part appended to it) came from, when, and with what versions and settings."""
    return {
        "source": source,
        **({"recipe": recipe} if recipe else {}),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": dict(_versions()),
    }


@functools.cache
def _versions() -> dict[str, str]:
    """The versions of the packages that write a store, read once a process (each read scans the import paths)."""
    return {name: version(name) for name in ("outcore", "zarr", "numcodecs", "dask", "numpy", "pillow", "simplejpeg")}


def store_name(location: str | os.PathLike) -> str:
    """The last part of a store's path or URL: ``train.zarr``."""
    return str(location).rstrip("/").rpartition("/")[2]


def report_name(name: str) -> str:
    """The name of the report of skipped samples beside the store ``name``."""
    return f"{name}.skipped.txt"


def report_path(location: Path) -> Path:
    return location.with_name(report_name(location.name))


def skipped_summary(name: str, messages: list[str]) -> dict[str, Any]:
    """The attributes' record of the samples left out of the store ``name``, ``messages`` saying why."""
    return {
        "count": len(messages),
        "examples": messages[:MAX_SKIPPED_IN_ATTRS],
        "report": report_name(name),
    }


def write_report(location: Path, messages: list[str]) -> None:
    """The report of skipped samples beside the store at ``location``: ``messages``, one a line (none: no report)."""
    report = report_path(location)
    if messages:
        report.write_text("".join(f"{m}\n" for m in messages), encoding="utf-8")
    elif report.exists():
        report.unlink()
