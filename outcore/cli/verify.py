"""Read every chunk of a store and check its checksums and invariants."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import Dataset, open_dataset
from ..errors import CorruptChunkError, NotAStoreError, SampleDecodeError, StorageError, UnsafeStoreError
from ..ingest import progress_bar
from ..iterate import ChunkReader
from ..storage import is_url
from ..threads import available_cpus


@dataclass
class VerifyReport:
    """What `verify` found: ``ok`` is true when ``problems`` is empty."""

    location: str
    chunks_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        return "\n".join([f"{self.location}: {self.chunks_checked} chunks checked, {verdict}", *self.problems])


def verify(location: str | os.PathLike, *, progress: bool = True, **open_options: Any) -> VerifyReport:
    """Decompress every chunk of every field (checksums included), decode every sample of encoded image
    fields, and check labels against the classes. A store whose metadata is damaged or inconsistent is
    reported as such (it cannot be read further); a location with no store at all is a `NotAStoreError`.
    ``open_options`` go to `outcore.open_dataset` (``storage_options``, ``cache_dir``, ...).

    >>> print(outcore.verify("train.zarr"))  # doctest: +SKIP
    train.zarr: 316 chunks checked, OK
    """
    try:
        ds = open_dataset(location, **open_options)
    except (NotAStoreError, UnsafeStoreError) as error:
        if not is_url(location) and not Path(location).exists():
            raise
        return VerifyReport(str(location), problems=[str(error)])
    report = VerifyReport(ds.location)
    readers = {name: ds.chunk_reader(name) for name in ds.fields}
    jobs = [(name, chunk) for name in ds.fields for chunk in range(ds.num_chunks)]
    with ThreadPoolExecutor(max_workers=available_cpus()) as pool, \
            progress_bar(len(jobs), f"verify {ds.location}", "chunks", progress) as bar:
        for problem in pool.map(lambda job: _check_chunk(ds, readers[job[0]], *job), jobs):
            bar.update()
            report.chunks_checked += 1
            if problem:
                report.problems.append(problem)
    return report


def _check_chunk(ds: Dataset, reader: ChunkReader, name: str, chunk: int) -> str | None:
    start = chunk * ds.chunk_size
    stop = min(len(ds), start + ds.chunk_size)
    try:
        values = reader.read(chunk)
    except (CorruptChunkError, SampleDecodeError, StorageError) as error:  # StorageError: the disk failed it
        return str(error)
    classes = ds.classes_of(name)
    if values.dtype == object:  # a ragged field's samples: their rows' values
        values = np.concatenate([np.ravel(sample) for sample in values]) if len(values) else np.zeros(0)
    if classes and values.size and (values.min() < 0 or values.max() >= len(classes)):
        bad = values[(values < 0) | (values >= len(classes))]
        return (
            f"{ds.location}: field {name!r}, samples {start}..{stop - 1}: label(s) {np.unique(bad)[:5].tolist()} "
            f"outside the {len(classes)} classes"
        )
    return None
