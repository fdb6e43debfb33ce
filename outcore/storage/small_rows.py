"""The small fields' rows of a store being written, kept apart by the tasks that write its shards of pictures.

A small field (labels, paths, byte ranges) has shard files of many more samples than a picture field's
(`outcore.format.Layout.shard_size_for`), so one of its files holds the rows of several tasks, which would
write it at once. Each task instead saves its rows of every small field as a file of its own, their bytes
only (`SmallColumn`: zarr's write of them is mostly Python holding the GIL, docs/benchmarks.md's "Figures
behind the code" says how much), and once the tasks are done `copy_rows` reads them back in order and writes
each shard file of the store once. The column knows its dtype and row shape, so a file holds nothing to
parse (a ``.npy`` header is read by Python), let alone to unpickle.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from ..errors import StorageError
from .groups import samples_per_shard

SUFFIX = ".rows"
_AGAIN = "write the store again from the start (resume=False, or without --resume)"


@dataclass(frozen=True)
class SmallColumn:
    """The rows of one small field saved apart, a file per task (named after its first row): ``column[a:b] =
    rows`` saves them (cast to the field's dtype, checked against its row shape), ``column[a:b]`` reads them
    back, refusing rows no task saved.

    >>> import tempfile
    >>> column = SmallColumn(tempfile.mkdtemp(), "labels", "int64", ())
    >>> column[0:2] = [3, 1]; column[2:3] = [7]
    >>> column[1:3].tolist()
    [1, 7]
    """

    folder: str
    name: str
    dtype: str
    row_shape: tuple[int, ...]

    def __setitem__(self, rows: slice, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=self.dtype)
        if values.shape[1:] != self.row_shape or len(values) != rows.stop - rows.start:
            raise ValueError(f"field {self.name!r}: rows {rows.start}..{rows.stop - 1} given as an array of shape "
                             f"{values.shape}; its rows are {self.row_shape}")
        # Python's file, not ndarray.tofile: a full disk is then ENOSPC, not an OSError without its errno
        Path(self.folder, f"{rows.start}{SUFFIX}").write_bytes(values.tobytes())

    def __getitem__(self, rows: slice) -> np.ndarray:
        starts = sorted(int(name[: -len(SUFFIX)]) for name in os.listdir(self.folder) if name.endswith(SUFFIX))
        parts = [np.zeros((0, *self.row_shape), self.dtype)]
        reached = rows.start
        for k, start in enumerate(starts):
            if start > reached or reached >= rows.stop:
                break
            if k + 1 < len(starts) and starts[k + 1] <= reached:
                continue  # a file of rows before those asked for: not opened
            saved = self._load(start)
            parts.append(saved[reached - start : rows.stop - start])
            reached += len(parts[-1])
        if reached < rows.stop:
            raise StorageError(f"field {self.name!r}: rows from {reached} on (of {rows.start}..{rows.stop - 1}) were "
                               f"saved by no task in {self.folder}: it was changed while the store was written, "
                               f"or the run resumed was made by another outcore; {_AGAIN}")
        return np.concatenate(parts)

    def _load(self, start: int) -> np.ndarray:
        """The rows saved from row ``start`` on; a file that is not whole rows is refused."""
        path = Path(self.folder, f"{start}{SUFFIX}")
        row, size = np.dtype(self.dtype).itemsize * math.prod(self.row_shape), path.stat().st_size
        if row and size % row:
            raise StorageError(f"field {self.name!r}: {path} holds {size} bytes, not whole rows of {self.dtype} "
                               f"{self.row_shape} ({row} bytes each): it was changed while the store was written; "
                               f"{_AGAIN}")
        return np.fromfile(path, dtype=self.dtype).reshape(-1, *self.row_shape)


@dataclass(frozen=True)
class SmallRows:
    """Where the tasks writing a store's shards save its small fields' rows: a folder, and a `SmallColumn` in
    it for each array of the store whose shard files hold more samples than a task writes.

    >>> import tempfile
    >>> group = zarr.open_group(tempfile.mkdtemp(), mode="w")
    >>> _ = group.create_array("images", shape=(64, 4), chunks=(8, 4), shards=(16, 4), dtype="u1")
    >>> _ = group.create_array("labels", shape=(64,), chunks=(8,), shards=(64,), dtype="i8")
    >>> SmallRows.of(group, tempfile.mkdtemp(), chunk_size=8, shard_size=16).names
    ('labels',)
    """

    path: str
    columns: dict[str, SmallColumn]

    @classmethod
    def of(cls, group: zarr.Group, path: str | Path, chunk_size: int, shard_size: int) -> SmallRows:
        """The small rows of ``group``'s arrays, saved at ``path`` by tasks writing ``shard_size`` samples each."""
        columns = {name: SmallColumn(str(Path(path, name)), name, array.dtype.str, tuple(array.shape[1:]))
                   for name, array in group.arrays() if samples_per_shard(array, chunk_size) > shard_size}
        return cls(str(path), columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.columns)

    def make(self) -> SmallRows:
        """Make the folders, empty (what an earlier run saved there is removed); return ``self``."""
        shutil.rmtree(self.path, ignore_errors=True)
        for column in self.columns.values():
            Path(column.folder).mkdir(parents=True)
        return self
