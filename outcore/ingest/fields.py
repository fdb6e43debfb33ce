"""The fields an image ingest writes beside the labels, and what they record of each file."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence

import numpy as np

from ..storage import stat_files_at_once
from ..threads import for_each_run

IMAGE_FIELD = "images"
ENCODED_FIELD = "images_encoded"  # the files, beside the pixels of ``images="both"``
PATH_FIELD = "path"  # each file, relative to the folder or CSV
FILE_STAT_FIELD = "file_stat"  # (N, 2) int64: each file's size in bytes and modification time in ns
FILE_DIGEST_FIELD = "file_digest"  # (N, 16) uint8: each file's content digest (`decode_tasks.file_digest`)
PATH_WIDTH = 256  # bytes the path field holds at least, so that the longer paths of an append still fit
FILE_TYPE = 0o170000  # a mode's file type bits (what `stat.S_IFMT` keeps)


def file_stat(path: str) -> tuple[int, int]:
    """``(size, modification time in ns)``; zeros for a file that cannot be read (the decoder reports it).

    >>> file_stat("/no/such/file")
    (0, 0)
    """
    try:
        status = os.stat(path)
    except OSError:
        return 0, 0
    return status.st_size, status.st_mtime_ns


def file_stats(paths: Sequence[str]) -> np.ndarray:
    """(N, 2) int64: `file_stat` of each path, on the pool's threads (each stat waits on the file system outside
    the GIL, and an ingest of a million files makes a million), a run of paths by one call of the C extension
    where it is built (`outcore.storage.stat_files_at_once`).

    >>> file_stats(["/no/such/file"]).tolist()
    [[0, 0]]
    """
    return _stats(paths, 2, file_stat)


def regular_files(paths: Sequence[str]) -> np.ndarray:
    """Whether each path is a regular file (`os.path.isfile`: a link followed), as `file_stats` finds it: a run of
    paths by one call that releases the GIL once where the C extension is built, not a Python call and a stat each.

    >>> regular_files([__file__, "/no/such/file", "/"]).tolist()
    [True, False, False]
    """
    modes = _stats(paths, 3, lambda path: (0, 0, stat.S_IFREG if os.path.isfile(path) else 0))[:, 2]
    return (modes & FILE_TYPE) == stat.S_IFREG


def missing_files(paths: Sequence[str]) -> list[str]:
    """The ``paths`` that are not regular files (`regular_files`), in order.

    >>> missing_files([__file__, "/no/such/file"])
    ['/no/such/file']
    """
    return [paths[k] for k in np.flatnonzero(~regular_files(paths)).tolist()]


def _stats(paths: Sequence[str], columns: int, each: Callable[[str], tuple[int, ...]]) -> np.ndarray:
    """(N, ``columns``) int64: each path's size, modification time in ns (and mode), by `stat_files_at_once` on the
    pool's threads, a run of paths a call, or by ``each`` path without it."""
    stats = np.zeros((len(paths), columns), np.int64)

    def run(start: int, stop: int) -> None:
        if stat_files_at_once is not None:
            stat_files_at_once(paths[start:stop], stats[start:stop])
        else:
            stats[start:stop] = [each(paths[i]) for i in range(start, stop)]

    for_each_run(run, len(paths), least=512)
    return stats
