"""Before writing pictures kept at their own size (``shape=None``) or capped (``max_side=``): every file is
decoded once, in parallel, its shape recorded, and the ones whose longer side exceeds ``max_side`` are
re-encoded smaller into the run's scratch folder. The store's byte regions are then sized exactly from
what will be stored (`outcore.format.encoded`), and the write reads files without decoding them again.

The survey is saved in the scratch folder, so an interrupted ingest resumed (``resume=True``) does not
decode again.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import dask
import numpy as np

from ..errors import ImageError, StorageError
from ..imaging import MAX_PIXELS, plain_jpeg_files, plain_jpeg_sizes, shrink_image, stored_frame
from .decode_tasks import DIGEST_SIZE, ERROR_DTYPE, FILES, bad_file, file_digest, path_block
from .imports import import_ahead
from .records.reader import SampleReader
from .scheduler import run_tasks

JPEG_START = b"\xff\xd8"
# Files a survey task takes: the files in about TASKS tasks (each task's scheduling holds the GIL on the one thread
# scheduling them all), at least MIN_BLOCK (small sets: every thread has work), at most MAX_BLOCK.
TASKS, MIN_BLOCK, MAX_BLOCK = 512, 64, 1024
GROUP_BYTES = 8 << 20  # a survey task reads this much of its files, checks them, then reads the next


@dataclass(frozen=True)
class Survey:
    """What to store for each file: ``paths`` (the file, or its smaller copy; ``""`` for a bad file),
    ``shapes`` (N, 3) as decoded, ``nbytes`` to store, ``errors`` (``""`` for every good file; as wide as the
    longest),
    ``digests`` (N, 16), each source file's `outcore.ingest.decode_tasks.file_digest`, and ``orientations`` (N,)
    each file's EXIF orientation (1: stored upright; what lies on a picture is checked against it)."""

    paths: list[str]
    shapes: np.ndarray
    nbytes: np.ndarray
    errors: np.ndarray
    digests: np.ndarray
    orientations: np.ndarray


@dataclass(frozen=True)
class SurveyOptions:
    """How to survey: decode to ``channels`` and ``dtype``; shrink past ``max_side`` at ``quality``; as
    `ingest_images` says for ``on_error`` and ``max_pixels``."""

    channels: int
    dtype: np.dtype
    max_side: int | None
    quality: int
    on_error: str = "raise"
    max_pixels: int | None = MAX_PIXELS


def survey_images(paths: Sequence[str], options: SurveyOptions, scratch: Path, *, client: object = None,
                  progress: bool = True, description: str = "survey", reader: SampleReader = FILES) -> Survey:
    """Decode every file of ``paths`` once (on ``client``, or local threads, with a progress bar); return
    what to store for each, smaller copies written under ``scratch`` (``reader`` reads each path). A bad file raises `ImageError`
    naming it, or, with ``on_error="skip"``, is recorded in ``errors``.

    >>> survey = survey_images(paths, SurveyOptions(3, np.dtype("uint8"), 512, 90), Path(".scratch"))  # doctest: +SKIP
    >>> survey.shapes[0]  # doctest: +SKIP
    array([375, 500,   3], dtype=int32)
    """
    saved = scratch / "survey.npz"
    if saved.exists():  # a resumed run: its survey is done (unless an older outcore saved it without all of it)
        with np.load(saved, allow_pickle=False) as survey:
            if {"digests", "orientations"} <= set(survey.files):
                found = Survey(_paths_of(survey["paths"]), survey["shapes"], survey["nbytes"], survey["errors"],
                               survey["digests"], survey["orientations"])
                if not len(found.paths) == len(found.shapes) == len(paths):
                    raise StorageError(f"{saved} holds a survey of {len(found.paths)} paths and {len(found.shapes)} "
                                       f"shapes where this run has {len(paths)} files: it is not this run's survey; "
                                       "remove it, and the resumed ingest surveys the files again")
                return found
    scratch.mkdir(parents=True, exist_ok=True)
    block = min(MAX_BLOCK, max(MIN_BLOCK, -(-len(paths) // TASKS)))
    starts = range(0, len(paths), block)
    # bound once: Dask walks a task's arguments (the options' fields, the reader's) at every task it makes
    survey = dask.delayed(functools.partial(_survey_block, options=options, scratch=str(scratch), reader=reader),
                          pure=False)
    tasks = [survey(path_block(paths, start, start + block), start) for start in starts]
    weights = [min(block, len(paths) - start) for start in starts]
    import_ahead()  # what the writes need, imported beside the tasks (in C calls) once they are made (in Python)
    blocks = run_tasks(tasks, weights, client=client, progress=progress, description=description, unit="files")
    result = Survey(
        [path for block in blocks for path in block[0]],
        np.concatenate([block[1] for block in blocks]) if blocks else np.zeros((0, 3), np.int32),
        np.concatenate([block[2] for block in blocks]) if blocks else np.zeros(0, np.int64),
        np.concatenate([block[3] for block in blocks]) if blocks else np.zeros(0, ERROR_DTYPE),
        np.concatenate([block[4] for block in blocks]) if blocks else np.zeros((0, DIGEST_SIZE), np.uint8),
        np.concatenate([block[5] for block in blocks]) if blocks else np.zeros(0, np.uint8),
    )
    partial = scratch / "survey.partial.npz"
    np.savez(partial, paths=_saved_paths(result.paths), shapes=result.shapes, nbytes=result.nbytes,
             errors=result.errors, digests=result.digests, orientations=result.orientations)
    os.replace(partial, saved)
    return result


def _saved_paths(paths: list[str]) -> np.ndarray:
    """``paths`` as a resumed survey reads them back (`_paths_of`): their UTF-8 bytes, each path ended by a NUL (no
    path holds one; any surrogate kept), instead of an array of strings as wide as the longest, four bytes a
    character (which took several times as long to make and to write).

    >>> _paths_of(_saved_paths(["a/b.jpg", "\\udcff.jpg"])), _paths_of(_saved_paths([]))
    (['a/b.jpg', '\\udcff.jpg'], [])
    """
    joined = "\0".join(paths) + "\0" if paths else ""  # one call: a generator's step a path cost more than the rest
    return np.frombuffer(joined.encode("utf-8", "surrogatepass"), np.uint8)


def _paths_of(saved: np.ndarray) -> list[str]:
    """The paths `_saved_paths` saved; an array of strings as it is (a survey saved by an earlier version)."""
    if saved.dtype.kind == "U":
        return saved.tolist()
    return saved.tobytes().decode("utf-8", "surrogatepass").split("\0")[:-1]


def _survey_block(block: np.ndarray, start: int, options: SurveyOptions, scratch: str,
                  reader: SampleReader) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The survey of the files of ``block`` (`path_block`), the first ``start``. Files on this machine are read,
    digested and, JPEGs (plain, or turned or mirrored by their EXIF), checked by one call outside the GIL
    (`plain_jpeg_files`); the files it leaves (and every file of another reader) are read a group at a time
    (`_groups`), each group's JPEGs checked by one call (`plain_jpeg_sizes`), each other file (and each to shrink) in
    Python, which words their errors."""
    paths: list[str] = block.tolist()
    stored, shapes = list(paths), np.zeros((len(paths), 3), np.int32)
    nbytes, errors = np.zeros(len(paths), np.int64), [""] * len(paths)
    digests, orientations = np.zeros((len(paths), DIGEST_SIZE), np.uint8), np.zeros(len(paths), np.uint8)
    found = plain_jpeg_files(paths, options.channels, options.max_pixels, options.max_side, DIGEST_SIZE) \
        if reader.paths_are_files() else None
    todo = list(range(len(paths))) if found is None else found.left
    if found is not None:  # a JPEG checked: kept as it is, its upright size and orientation found
        shapes[:, :2], shapes[:, 2], nbytes[:], digests[:], orientations[:] = found.sizes, options.channels, \
            found.nbytes, found.digests, found.orientations
    for first, files in _groups([paths[i] for i in todo], reader):
        turns = np.zeros(len(files), np.uint8)
        sizes, left = plain_jpeg_sizes([b"" if isinstance(data, ImageError) else data for data in files],
                                       options.channels, options.max_pixels, options.max_side, turns)  # past: shrunk
        checked = np.ones(len(files), bool)
        checked[list(left)] = False
        for k, data in enumerate(files):
            i = todo[first + k]
            path = paths[i]
            try:
                if isinstance(data, ImageError):
                    raise data
                if checked[k]:
                    shape, smaller, orientations[i] = (*sizes[k].tolist(), options.channels), None, turns[k]
                else:
                    upright, orientations[i] = stored_frame(data, path, options.max_pixels)  # its header, read once
                    shape, smaller = shrink_image(data, options.channels, options.dtype, options.max_side,
                                                  options.quality, path, options.max_pixels, upright)
            except ImageError as error:
                if options.on_error == "raise":
                    raise bad_file(error) from None
                stored[i], errors[i] = "", str(error)[: ERROR_DTYPE.itemsize // 4]
                shapes[i], nbytes[i], digests[i], orientations[i] = 0, 0, 0, 0
                continue
            if smaller is not None:
                suffix = ".jpg" if smaller.startswith(JPEG_START) else ".png"
                stored[i] = os.path.join(scratch, f"{start + i}{suffix}")
                Path(stored[i]).write_bytes(smaller)
            shapes[i], nbytes[i] = shape, len(data) if smaller is None else len(smaller)
            digests[i] = file_digest(data)
    # as wide as the longest message: a million good files keep 4 MB of them, not 1.6 GB at ERROR_DTYPE's width
    return stored, shapes, nbytes, np.array(errors, dtype=str), digests, orientations


def _groups(paths: Sequence[str], reader: SampleReader) -> Iterator[tuple[int, list[bytes | ImageError]]]:
    """The files of ``paths`` read in order, in groups of `GROUP_BYTES` or a little more (each group's first
    position and its files; a file that cannot be read: its `ImageError`): what a survey task holds at once."""
    first, files, held = 0, [], 0
    for path in paths:
        try:
            data = reader.read(path)
        except ImageError as error:
            data = error
        files.append(data)
        held += 0 if isinstance(data, ImageError) else len(data)
        if held >= GROUP_BYTES:
            yield first, files
            first, files, held = first + len(files), [], 0
    if files:
        yield first, files
