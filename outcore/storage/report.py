"""What a store holds, field by field: shapes, chunking, codecs, sizes decoded and on disk. Behind
``outcore info`` and the Dataset's Jupyter view."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import zarr

from ..format import companion_names, ranges_name, shapes_name
from .groups import samples_per_shard
from .store import Store


@dataclass(frozen=True)
class FieldReport:
    """One field: ``dtype`` as read (encoded images: their decoded dtype), ``shape`` with the sample axis,
    samples per ``chunk`` and per ``shard``, ``codecs``, ``decoded`` and ``stored`` bytes."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    chunk: int
    shard: int
    codecs: str
    decoded: int
    stored: int
    role: str
    classes: tuple[str, ...] = ()

    @property
    def ratio(self) -> str:
        """Decoded size over size on disk, e.g. ``"3.2x"``."""
        return f"{self.decoded / self.stored:.1f}x" if self.stored else "-"


def field_reports(store: Store) -> list[FieldReport]:
    """A `FieldReport` per field (reads metadata and file sizes, no chunk).

    An encoded image field's ``decoded`` size is its pixels', ``stored`` its files' bytes and ranges (and
    shapes: pictures kept at their own size show each size's range, e.g. ``"300..500"``); a ragged field's, its
    rows' (its shape ``(N, "rows", *row)``).

    >>> [(r.name, r.shape, r.ratio) for r in field_reports(outcore.open_dataset("train.zarr"))]  # doctest: +SKIP
    [('images', (1000, 64, 64, 3), '3.1x'), ('labels', (1000,), '0.4x'), ...]
    """
    reports = []
    for name in store.fields:
        info, array = store.info(name), store.array(name)
        stored = array.nbytes_stored()
        if info.is_image:  # decoded pixels vs the files' bytes and their ranges (and shapes) as stored
            counted = store.array(ranges_name(name))
            stored += sum(store.array(companion).nbytes_stored()
                          for companion in companion_names(name, info.decode.variable))
            dtype, sample_shape = f"{info.decode.dtype} (encoded images)", info.decode.shape
            decoded = len(store) * (info.decode.nbytes or 0)
            if info.decode.variable:
                shapes = stored_shapes(store, name)
                sample_shape = variable_shape(shapes)
                decoded = int(shapes.astype(np.int64).prod(axis=1).sum()) * np.dtype(info.decode.dtype).itemsize
        elif info.is_raster:  # its pixels, their ranges and shapes
            stored += sum(store.array(companion).nbytes_stored() for companion in info.companions(name))
            counted, shapes = store.array(ranges_name(name)), stored_shapes(store, name)
            dtype, sample_shape = f"{array.dtype} (own sizes)", (*variable_shape(shapes)[:2], *info.sample_shape)
            decoded = int(shapes[:, :2].astype(np.int64).prod(axis=1).sum()) * array.dtype.itemsize \
                * math.prod(info.sample_shape)
        elif info.is_ragged:  # its rows (a count per sample) and their ranges
            counted = store.array(ranges_name(name))
            stored += counted.nbytes_stored()
            spans = counted[: len(store)]
            rows = int((spans[:, 1] - spans[:, 0]).sum()) if len(spans) else 0
            dtype, sample_shape = f"{array.dtype} (ragged: {rows:,} rows)", ("rows", *array.shape[1:])
            decoded = rows * array.dtype.itemsize * math.prod(array.shape[1:])
        else:
            counted = array
            dtype, sample_shape = str(array.dtype) + (" (utf-8 text)" if info.is_text else ""), array.shape[1:]
            decoded = len(store) * array.dtype.itemsize * math.prod(array.shape[1:])
        reports.append(FieldReport(name, dtype, (len(store), *sample_shape), counted.chunks[0],
                                   samples_per_shard(array, counted.chunks[0]), codecs(array), decoded, stored,
                                   info.role, info.classes or ()))  # the samples of the field's own shard files
    return reports


def stored_shapes(store: Store, name: str) -> np.ndarray:
    """The decoded shape of each sample of a field of pictures kept at their own size (or of a raster field), (N, 3):
    read chunk by chunk by the store's shard reader (a C call a chunk, its checksum checked), not by zarr's
    pipeline, whose Python a chunk made the end of an ingest of 100,000 pictures wait (docs/benchmarks.md); from an
    object store, the chunks stored back to back asked for in one request."""
    reader = store.shard_reader(shapes_name(name))
    chunks = range(-(-len(store) // reader.chunk_size))
    reader.prefetch(chunks)
    read = [reader.read(chunk) for chunk in chunks]
    return np.concatenate(read) if read else np.empty((0, 3), reader.array.dtype)


def variable_shape(shapes: np.ndarray) -> tuple[int | str, ...]:
    """A sample shape for pictures of varying sizes: each size as its range.

    >>> variable_shape(np.array([[300, 500, 3], [400, 333, 3]]))
    ('300..400', '333..500', 3)
    """
    if len(shapes) == 0:
        return ("0", "0", 0)
    low, high = shapes.min(axis=0).tolist(), shapes.max(axis=0).tolist()
    return (*(f"{a}..{b}" if a != b else str(a) for a, b in zip(low[:2], high[:2], strict=True)), high[2])


def total(reports: list[FieldReport]) -> FieldReport:
    """The fields' sizes added up, as a report named ``total``."""
    return FieldReport("total", "", (), 0, 0, "", sum(r.decoded for r in reports), sum(r.stored for r in reports), "")


def codecs(array: zarr.Array) -> str:
    """The codecs inside an array's shards, e.g. ``"blosc(lz4:5:shuffle)+crc32c"``."""
    described = array.metadata.to_dict()["codecs"]
    inner = described[0].get("configuration", {}).get("codecs", described)
    names = []
    for codec in inner:
        config = codec.get("configuration", {})
        if codec["name"] == "blosc":
            names.append(f"blosc({config['cname']}:{config['clevel']}:{config['shuffle']})")
        elif codec["name"] != "bytes":
            names.append(codec["name"])
    return "+".join(names)


def human_size(nbytes: float) -> str:
    """``nbytes`` in B, KiB, MiB, ...

    >>> human_size(512), human_size(3 * 2**20)
    ('512 B', '3.0 MiB')
    """
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        nbytes /= 1024
        if nbytes < 1024:
            break
    return f"{nbytes:.1f} {unit}"
