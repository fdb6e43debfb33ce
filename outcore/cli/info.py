"""`describe`: the full text report behind ``outcore info``; `system_report`, behind ``outcore info --system``."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .. import seeds
from ..dataset import Dataset
from ..errors import CorruptChunkError
from ..imaging import native
from ..storage import chunk_reads
from ..storage.report import field_reports, human_size, total
from ..threads import available_cpus, thread_count


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
    lines = [ds.summary(), ""]
    header = ("field", "dtype", "shape", "chunk", "shard", "codecs", "decoded", "on disk", "ratio", "role")
    reports = field_reports(ds)
    rows = [header] + [(r.name, r.dtype, "x".join(map(str, r.shape)), str(r.chunk), str(r.shard), r.codecs,
                        human_size(r.decoded), human_size(r.stored), r.ratio, r.role) for r in reports]
    summed = total(reports)
    rows.append(("total", "", "", "", "", "", human_size(summed.decoded), human_size(summed.stored), summed.ratio, ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    for name in ds.fields:
        if ds.classes_of(name):
            lines.append(f"\nclasses of {name!r} ({len(ds.classes_of(name))}): {', '.join(ds.classes_of(name))}")
        if ds.info(name).points:
            lines.append(f"\npoints of {name!r} ({len(ds.info(name).points)}): {', '.join(ds.info(name).points)}")
    if ds.unpublished():
        lines.append(f"\n{ds.unpublished():,} sample(s) written beyond the published count (a Writer still "
                     "appending, or one that stopped before publishing them): readers ignore them")
    if ds.attrs.skipped:
        skipped = ds.attrs.skipped
        lines.append(f"\nskipped {skipped['count']} source file(s) (full list: {skipped.get('report')}):")
        lines += [f"  {message}" for message in skipped["examples"][:10]]
    lines += ["\nprovenance:", *provenance_lines(ds.attrs.provenance)]
    return "\n".join(lines)


def provenance_lines(provenance: Mapping[str, Any]) -> list[str]:
    """A store's provenance, a line an entry; an ingest's manifest (what a rerun compares) in brief.

    >>> provenance_lines({"source": "image folder photos", "versions": {"outcore": "0.1.0", "zarr": "3.1.6"},
    ...                   "manifest": {"ingest": "images", "files": 120, "fingerprint": "15058adb6318db75"}})
    ['  source: image folder photos', '  versions: outcore 0.1.0, zarr 3.1.6', '  manifest: 120 files, fingerprint \
15058adb6318 (what the same ingest run again is compared with)']
    """
    lines = []
    for name, value in provenance.items():
        if name == "manifest" and isinstance(value, Mapping):
            value = (f"{value.get('files')} files, fingerprint {str(value.get('fingerprint'))[:12]} (what the same "
                     "ingest run again is compared with)")
        elif isinstance(value, Mapping):
            value = ", ".join(f"{key} {json.dumps(item) if not isinstance(item, str) else item}"
                              for key, item in value.items())
        lines.append(f"  {name}: {value}")
    return lines


def system_report() -> str:
    """What outcore runs on in this process: versions, the JPEG decoder behind fused crops (the C extension
    or simplejpeg and Pillow), what copies batches' samples (the C extension or numpy), what reads local chunks (the
    C extension or Python's calls), what draws the transforms' and plans' numbers (the C extension or numpy), CPUs and
    threads.

    >>> print(system_report())  # doctest: +SKIP
    outcore 0.1.0 on Python 3.11.9 (Linux x86_64)
    JPEG boxes: C extension (libjpeg-turbo 2.1.5; cropped decoding, AVX2 resize; PNGs with zlib 1.2.13)
    batch copies: C extension (one call a run of samples, outside the GIL)
    chunk reads: C extension (a chunk read, checked and decoded in one call outside the GIL; a shard's chunks encoded in one)
    random draws: C extension (a generator of each key made and drawn from in one call: crops, flips, orders)
    ...
    """
    where = f"{platform.system()} {platform.machine()}"
    lines = [f"outcore {_version('outcore')} on Python {platform.python_version()} ({where})",
             f"JPEG boxes: {native.backend()}",
             f"batch copies: {native.copies()}",
             f"chunk reads: {chunk_reads.how()}",
             f"random draws: {seeds.how()}",
             f"CPUs available: {available_cpus()}, decode threads: {thread_count()}"]
    packages = ("numpy", "zarr", "dask", "distributed", "pillow", "simplejpeg", "torch", "tensorflow-cpu", "keras")
    lines.append("packages: " + ", ".join(f"{name} {_version(name)}" for name in packages))
    return "\n".join(lines)


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"
