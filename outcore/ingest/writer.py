"""`Writer`: stream batches into a store without knowing the number of samples up front."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

import numpy as np
import zarr

from ..errors import OptionError, OutcoreError, SourceError, StoreBusyError, StoreExistsError
from ..format import ATTRS_KEY, Compression, FieldInfo, Layout, StoreAttrs, dimension_names, guess_roles
from ..storage import (
    Upload,
    consolidate,
    create_field,
    describe_classes,
    is_object_url,
    is_url,
    is_zip,
    make_durable,
    open_group,
    redact,
    remove_path,
    samples_per_shard,
    shard_path,
    small_fields,
    writable,
)
from ..storage.safety import check_safe, read_attrs
from ..storage.staging import storage_error
from ..storage.upload import local_mirror
from .build import provenance

FieldSpec = tuple[Any, Sequence[int]]  # (dtype, shape of one sample)


class Writer:
    """Append batches of samples (dicts of arrays) to a store, e.g. model predictions batch by batch.

    Batches may have any size. Samples are buffered and written a whole shard file at a time (each file
    replaced in one step), and the store's sample count is published only once the shards holding those
    samples are on disk (fsync), so readers see a consistent prefix while it grows, and after a crash.
    ``specs`` maps field names to ``(dtype, sample_shape)``; when omitted, the first batch defines them.
    ``roles`` default as in `outcore.from_arrays`. ``append=True`` reopens an existing store and adds
    to it.

    An object store URL (``s3://bucket/preds.zarr``, reached with ``storage_options``) works the same:
    the Writer keeps the shard it is filling on the local disk (`outcore.storage.upload.staging_root`)
    and uploads each shard when it is written, then the metadata with the new sample count. Only one
    Writer may write a store: on an object store, no lock can keep a Writer of another machine out.

    >>> with outcore.Writer("preds.zarr", specs={"emb": ("float32", (512,))}) as w:  # doctest: +SKIP
    ...     for x in batches:
    ...         w.append({"emb": model.predict(x)})
    """

    def __init__(
        self,
        location: str | os.PathLike,
        specs: Mapping[str, FieldSpec] | None = None,
        *,
        append: bool = False,
        overwrite: bool = False,
        roles: Mapping[str, str] | None = None,
        classes: Mapping[str, Sequence[str]] | None = None,
        chunk_size: int | None = None,
        compression: str | Compression | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if is_zip(location) or (is_url(location) and not is_object_url(str(location))):
            raise OptionError(
                f"Writer writes directory stores, locally or to object stores (s3://, gs://, az://), not "
                f"{redact(str(location))!r}; write a directory, then copy it into a .zip with outcore.from_arrays"
            )
        self._upload = Upload(str(location), storage_options, run=uuid.uuid4().hex[:8]) if is_url(location) else None
        self.location = local_mirror(str(location)) if self._upload else Path(location)
        self._shown = redact(str(location)) if self._upload else str(location)
        self._roles, self._classes = dict(roles or {}), dict(classes or {})
        self._chunk_size, self._compression = chunk_size, Compression.parse(compression)
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_count = 0
        self._group: zarr.Group | None = None
        self._attrs: StoreAttrs | None = None
        self._shard_size = 0
        self._lock_file: Any = None
        self._made = False  # whether this Writer created the store (not append=True to one that was there)
        self.closed = False
        try:
            self._open(specs, append, overwrite)
        except BaseException:
            self._unlock()
            raise

    def _open(self, specs: Mapping[str, FieldSpec] | None, append: bool, overwrite: bool) -> None:
        exists = self._upload.exists() if self._upload else self.location.exists()
        if append and exists:
            self._open_existing()
        elif exists and not overwrite:
            raise StoreExistsError(
                f"{self._shown} already exists; pass append=True to add to it or overwrite=True to replace it"
            )
        else:
            if self.location.is_dir() or self._upload:
                self._lock()  # not while another Writer writes it
                self._unlock()
            remove_path(self.location)
            if self._upload and exists:
                self._upload.clear()
            if specs is not None:
                with self._writing():
                    self._create({name: (np.dtype(dtype), tuple(shape)) for name, (dtype, shape) in specs.items()})

    def __len__(self) -> int:
        """Samples appended so far, written or still buffered."""
        return self._written + self._pending_count

    @property
    def _written(self) -> int:
        return self._attrs.num_samples if self._attrs else 0

    def append(self, batch: Mapping[str, Any]) -> None:
        """Add a batch: one array per field, all with the same length on axis 0."""
        if self.closed:
            raise ValueError(f"Writer for {self._shown} is closed")
        arrays = {name: np.asarray(values) for name, values in batch.items()}
        if self._attrs is None:
            with self._writing():
                self._create({name: (a.dtype, a.shape[1:]) for name, a in arrays.items()})
        self._pending.append(self._checked(arrays))
        self._pending_count += len(next(iter(arrays.values())))
        shard = self._shard_size
        with self._writing():
            while len(self) >= (self._written // shard + 1) * shard:
                self._write_until((self._written // shard + 1) * shard)

    def flush(self) -> None:
        """Write every buffered sample now (a partial shard is rewritten by later flushes)."""
        if self._pending_count and not self.closed:
            with self._writing():
                self._write_until(len(self))

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Writes the system refuses (a full disk, a quota, permissions) end the Writer with one
        `StorageError` naming the store and what it keeps: the samples published before (each shard is
        replaced in one step, the count published after it), or nothing, for a store it made that holds
        none, which is removed so that the same Writer can run again."""
        try:
            yield
        except OSError as error:
            if isinstance(error, OutcoreError):
                raise
            self.closed, self._pending, self._pending_count = True, [], 0
            if self._upload is None and self._made and not self._written:
                remove_path(self.location)
                kept = None
            else:
                kept = (f"It keeps the {self._written:,} samples published before, readable as they are: free "
                        "some space, then a Writer with append=True goes on from there")
            self._unlock()
            raise storage_error(error, self.location, kept, self._shown) from None

    def close(self) -> None:
        """Flush and close; the store is then complete. Closing twice is harmless."""
        if not self.closed:
            try:
                self.flush()
                if self._attrs is not None and self._attrs.growing:
                    with self._writing():  # every array now holds exactly the published samples
                        self._fit_arrays()
                        self._save_attrs(dataclasses.replace(self._attrs, growing=False))
            finally:
                self.closed = True
                self._unlock()
                if self._upload:  # all of it is in the object store: the local copy goes
                    remove_path(self.location)

    def _fit_arrays(self) -> None:
        """Cut every array back to the published samples (what a Writer that died wrote beyond them)."""
        for name in self._attrs.fields:
            array = self._group[name]
            if array.shape[0] > self._written:
                array.resize((self._written, *array.shape[1:]))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _create(self, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
        if not specs:
            raise SourceError("a Writer needs at least one field")
        for name, (dtype, _) in specs.items():
            if dtype.kind in "OUS":
                raise SourceError(
                    f"field {name!r} has dtype {dtype}; a Writer stores numbers (encode text with "
                    "outcore.format.encode_text, or write it with outcore.from_arrays)"
                )
        sample_nbytes = sum(math.prod(shape) * dtype.itemsize for dtype, shape in specs.values())
        layout = Layout.for_samples(sample_nbytes, None, self._chunk_size)
        self._lock()
        self._made = True
        group = zarr.open_group(self.location, mode="w")
        dims = dimension_names(specs)
        small = small_fields({name: math.prod(shape) * dtype.itemsize for name, (dtype, shape) in specs.items()})
        for name, (dtype, shape) in specs.items():  # the fields smaller than the largest in shards of their own
            create_field(group, name, dtype, shape, 0, layout, self._compression, dims[name], small=name in small)
        roles = guess_roles(list(specs), self._roles)
        infos = {
            name: FieldInfo(roles[name], tuple(self._classes[name]) if name in self._classes else None,
                            dtype=dtype.name, sample_shape=tuple(int(s) for s in shape))
            for name, (dtype, shape) in specs.items()
        }
        self._group, self._shard_size = group, layout.shard_size
        self._save_attrs(StoreAttrs(0, layout.chunk_size, infos, provenance=provenance("outcore.Writer"), growing=True))

    def _lock(self) -> None:
        self._lock_file = writer_lock(self.location, self._shown)

    def _unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # the lock goes with the file; the empty file stays (see `_lock`)
            self._lock_file = None

    def _open_existing(self) -> None:
        self._lock()
        if self._upload:  # the metadata, and the shard the next samples go to
            remove_path(self.location)
            self._upload = self._upload.for_run(self._upload.generation() or self._upload.run)
            self._upload.fetch(self.location)
            attrs = read_attrs(open_group(self.location, mode="r"), self._shown)
            self._upload.fetch(self.location, attrs.num_samples)
        group = open_group(self.location, mode="r+")
        attrs = read_attrs(group, self._shown)
        check_safe(group, list(attrs.fields), self._shown)
        encoded = [name for name, info in attrs.fields.items() if info.in_regions]
        if encoded:
            raise SourceError(
                f"{self._shown} has encoded image or ragged field(s) {encoded}; a Writer appends arrays of numbers "
                "only. Re-ingest the images with the new ones (outcore.ingest_dataframe takes a table of all the files)"
            )
        shard = min(samples_per_shard(group[name], attrs.chunk_size) for name in attrs.fields)  # small fields' are larger
        self._group, self._attrs, self._shard_size = group, attrs, shard
        if not attrs.growing:  # said before any array grows: readers then allow samples beyond the count
            self._save_attrs(dataclasses.replace(attrs, growing=True))

    def _checked(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = set(self._attrs.fields)
        if set(arrays) != expected:
            raise SourceError(f"batch has fields {sorted(arrays)}; the store at {self._shown} has {sorted(expected)}")
        lengths = {name: len(a) if a.ndim else -1 for name, a in arrays.items()}
        if len(set(lengths.values())) != 1 or -1 in lengths.values():
            raise SourceError(f"batch fields must share their length on axis 0; got {lengths}")
        checked = {}
        for name, values in arrays.items():
            array = self._group[name]
            if values.shape[1:] != array.shape[1:]:
                raise SourceError(
                    f"field {name!r}: batch samples have shape {values.shape[1:]}, the store's {array.shape[1:]}"
                )
            checked[name] = cast_values(name, values, np.dtype(array.dtype))
        return checked

    def _write_until(self, stop: int) -> None:
        start = self._written
        count = stop - start
        merged = {name: np.concatenate([b[name] for b in self._pending]) for name in self._attrs.fields}
        written: list[tuple[bool, str]] = []  # (whether the shard file is full: final, its file)
        for name, values in merged.items():
            array = self._group[name]
            if array.shape[0] != stop:  # grown, or cut back to the samples it publishes (a dead Writer's left)
                array.resize((stop, *array.shape[1:]))
            writable(array)[start:stop] = values[:count]  # a small field's last shard file: written again
            size = samples_per_shard(array, self._attrs.chunk_size)
            written += [(shard < stop // size, shard_path(array, shard))
                        for shard in range(start // size, (stop - 1) // size + 1)]
        if not self._upload:
            make_durable([self.location / path for _, path in written])
        rest = {name: values[count:] for name, values in merged.items()}
        self._pending = [rest] if self._pending_count > count else []
        self._pending_count -= count
        # published once the shards are on disk (or in the object store)
        self._save_attrs(dataclasses.replace(self._attrs, num_samples=stop), [path for _, path in written])
        if self._upload:  # full shards are final: only the one being filled stays on the local disk
            for full, path in written:
                if full:
                    (self.location / path).unlink()

    def _save_attrs(self, attrs: StoreAttrs, written: Sequence[str] = ()) -> None:
        """Publish ``attrs`` (the sample count) after the shard files ``written`` (on an object store,
        uploaded first)."""
        self._group.attrs[ATTRS_KEY] = attrs.to_dict()
        if self._attrs is None:
            describe_classes(self._group, attrs.fields)
        consolidate(self.location)  # for xarray: outcore's readers read the arrays' own metadata
        if self._upload:
            self._upload.put_grown(self.location, list(written))
        self._attrs = attrs


def writer_lock(location: Path, shown: str) -> IO[str]:
    """Hold the writer lock of the store at ``location`` (``.<name>.writer-lock`` beside it: zarr warns of
    files in a group that are not its own) until the returned file is closed; `StoreBusyError` while
    another writer (a `Writer`, an append) holds it. The file is never removed: a removed lock file
    could be locked by two writers through two inodes."""
    location.parent.mkdir(parents=True, exist_ok=True)
    file = open(location.with_name(f".{location.name}.writer-lock"), "a+")  # noqa: SIM115 - the caller closes it
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        raise StoreBusyError(
            f"another writer (a Writer or an append, in this process or another) is writing {shown}: let it "
            "finish first; two writers would interleave their shards and sample counts"
        ) from None
    return file


def cast_values(name: str, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` as ``dtype``; a cast that would change a value (an integer out of range, an integer
    a float cannot hold exactly, a float beyond the range of a smaller float, a float into an integer
    field) is a `SourceError` naming the field and both dtypes. Floats rounding into a smaller float
    type (float64 predictions into a float32 field) are allowed: that is what float storage does.

    >>> cast_values("labels", np.array([300]), np.dtype("int8"))
    Traceback (most recent call last):
    ...
    outcore.errors.SourceError: field 'labels': the int64 values 300..300 do not fit its int8 dtype (-128..127); store them in a wider field, or convert them yourself
    """
    source, target = values.dtype.kind, dtype.kind
    if values.size == 0 or (source == target == "b"):
        return values.astype(dtype, copy=False)
    checked = (source in "biu" and target in "iufc") or (source == "f" and target in "fc") or source == target == "c"
    if not (checked or np.can_cast(values.dtype, dtype, casting="safe")):
        raise SourceError(f"field {name!r}: cannot store {values.dtype} values in its {dtype} field")
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(dtype)
    if source in "biu" and target in "iu":
        info = np.iinfo(dtype)
        low, high = values.min(), values.max()
        if low < info.min or high > info.max:
            raise SourceError(f"field {name!r}: the {values.dtype} values {low}..{high} do not fit its {dtype} dtype "
                              f"({info.min}..{info.max}); store them in a wider field, or convert them yourself")
    elif source in "biu" and target in "fc":  # integers into floats: only those the float holds exactly
        if not np.array_equal(cast.astype(values.dtype), values):
            raise SourceError(f"field {name!r}: some {values.dtype} values cannot be held exactly by its {dtype} "
                              "dtype; store them in an integer or wider field")
    elif checked and (np.isfinite(values) & ~np.isfinite(cast)).any():  # floats: rounding yes, overflow no
        raise SourceError(f"field {name!r}: some {values.dtype} values are beyond the range of its {dtype} dtype")
    return cast
