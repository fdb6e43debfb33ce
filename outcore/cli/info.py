"""`describe`: the full text report behind ``outcore info``."""

from __future__ import annotations

import json
import math

import zarr

from ..dataset import Dataset
from ..errors import CorruptChunkError
from ..format import ranges_name


def describe(ds: Dataset) -> str:
    """Fields, shapes, dtypes, chunking, codecs, size on disk and compression ratio, classes, provenance.

    An encoded image field shows both sizes: ``decoded`` (its pixels) and ``on disk`` (the files).

    A store whose shard files are not all there is refused with a `CorruptChunkError` naming them.

    >>> print(describe(outcore.open_dataset("train.zarr")))  # doctest: +SKIP
    """
    missing = ds.missing_shards()
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CorruptChunkError(
            f"{ds.location}: {len(missing)} shard file(s) that its samples need are missing ({shown}); "
            f"run `outcore verify {ds.location}` for every problem, and restore the files or re-create the store"
        )
    lines = [repr(ds).splitlines()[0], ""]
    header = ("field", "dtype", "shape", "chunk", "shard", "codecs", "decoded", "on disk", "ratio", "role")
    rows = [header]
    total_raw = total_stored = 0
    for name in ds.fields:
        info, array = ds.attrs.fields[name], ds.array(name)
        stored = array.nbytes_stored()
        if info.is_image:  # decoded size vs the files' bytes (and their ranges) as stored
            ranges = ds.array(ranges_name(name))
            stored += ranges.nbytes_stored()
            raw, dtype, sample_shape = len(ds) * info.decode.nbytes, f"{info.decode.dtype} (encoded images)", \
                info.decode.shape
            array = ranges
        else:
            raw = len(ds) * array.dtype.itemsize * math.prod(array.shape[1:])
            dtype, sample_shape = str(array.dtype) + (" (utf-8 text)" if info.is_text else ""), array.shape[1:]
        total_raw, total_stored = total_raw + raw, total_stored + stored
        rows.append((
            name,
            dtype,
            "x".join(map(str, (len(ds), *sample_shape))),
            str(array.chunks[0]),
            str((array.shards or array.chunks)[0]),
            _codecs(ds.array(name)),
            _size(raw),
            _size(stored),
            f"{raw / stored:.1f}x" if stored else "-",
            ds.attrs.fields[name].role,
        ))
    rows.append(("total", "", "", "", "", "", _size(total_raw), _size(total_stored),
                 f"{total_raw / total_stored:.1f}x" if total_stored else "-", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for name in ds.fields:
        if ds.classes_of(name):
            lines.append(f"\nclasses of {name!r} ({len(ds.classes_of(name))}): {', '.join(ds.classes_of(name))}")
    if ds.unpublished():
        lines.append(f"\n{ds.unpublished():,} sample(s) written beyond the published count (a Writer still "
                     "appending, or one that stopped before publishing them): readers ignore them")
    if ds.attrs.skipped:
        skipped = ds.attrs.skipped
        lines.append(f"\nskipped {skipped['count']} source file(s) (full list: {skipped.get('report')}):")
        lines += [f"  {message}" for message in skipped["examples"][:10]]
    lines.append("\nprovenance: " + json.dumps(ds.attrs.provenance, indent=2))
    return "\n".join(lines)


def _codecs(array: zarr.Array) -> str:
    sharding = array.metadata.to_dict()["codecs"][0]
    inner = sharding.get("configuration", {}).get("codecs", array.metadata.to_dict()["codecs"])
    names = []
    for codec in inner:
        config = codec.get("configuration", {})
        if codec["name"] == "blosc":
            names.append(f"blosc({config['cname']}:{config['clevel']}:{config['shuffle']})")
        elif codec["name"] != "bytes":
            names.append(codec["name"])
    return "+".join(names)


def _size(nbytes: float) -> str:
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        nbytes /= 1024
        if nbytes < 1024:
            break
    return f"{nbytes:.1f} {unit}"
