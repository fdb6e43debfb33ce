"""The fields an image ingest writes beside the labels, and what they record of each file."""

from __future__ import annotations

import os

IMAGE_FIELD = "images"
ENCODED_FIELD = "images_encoded"  # the files, beside the pixels of ``images="both"``
PATH_FIELD = "path"  # each file, relative to the folder or CSV
FILE_STAT_FIELD = "file_stat"  # (N, 2) int64: each file's size in bytes and modification time in ns
FILE_DIGEST_FIELD = "file_digest"  # (N, 16) uint8: each file's content digest (`decode_tasks.file_digest`)
PATH_WIDTH = 256  # bytes the path field holds at least, so that the longer paths of an append still fit


def file_stat(path: str) -> tuple[int, int]:
    """``(size, modification time in ns)``; zeros for a file that cannot be read (the decoder reports it).

    >>> file_stat("/no/such/file")
    (0, 0)
    """
    try:
        stat = os.stat(path)
    except OSError:
        return 0, 0
    return stat.st_size, stat.st_mtime_ns
