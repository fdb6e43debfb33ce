"""Build a store out of sight and move it into place only when it is complete."""

from __future__ import annotations

import os
import shutil
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import StoreExistsError
from .groups import is_url, is_zip


@contextmanager
def staged_store(location: str | os.PathLike, overwrite: bool) -> Iterator[Path]:
    """Yield a fresh directory to build a store in; move it to ``location`` only when the block succeeds.

    A failed or interrupted ingest leaves no store at ``location`` (nor touches an existing one); a
    ``.zip`` location gets the finished directory packed into one file (entries stored, not recompressed).
    """
    if is_url(location):
        raise ValueError(f"cannot write to {location!r}: outcore writes stores to local paths only")
    target = Path(location).absolute()
    if target.exists() and not overwrite:
        raise StoreExistsError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        yield staging
        if is_zip(target):
            packed = staging.with_suffix(".zip")
            pack_zip(staging, packed)
            shutil.rmtree(staging)
            staging = packed
        _replace(staging, target)
    finally:
        remove_path(staging)


def pack_zip(directory: Path, zip_path: Path) -> None:
    """Pack a store directory into a zip file that ``zarr.storage.ZipStore`` reads."""
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())


def _replace(new: Path, target: Path) -> None:
    previous = target.parent / f".{target.name}.previous-{uuid.uuid4().hex[:8]}"
    if target.exists():
        os.replace(target, previous)
    os.replace(new, target)
    remove_path(previous)


def remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
