"""Build a store out of sight and move it into place only when it is complete; clean up after dead runs.

A run writes beside its target, under names that all start with ``.<name>.partial-<id>``: the store
being built (that name itself), its scratch folders (``….raw``, ``….permute``, ``….zip``) and the run's
own folder ``….run`` (a lock held while the run lives, its manifest, which shards are done). When the
store is complete it takes the target's place in one step — for a directory replacing a directory,
Linux's ``renameat2(RENAME_EXCHANGE)`` swaps the two, so at every instant the target path holds the
old store or the new one; elsewhere two renames leave the old store at ``.<name>.previous-<id>``
between them, and the next run puts it back if it was left there.

A run's folder is made and locked as ``.<name>.starting-<id>`` and only then renamed into view, so
no run ever finds another's folder unlocked; target names are escaped in every pattern (a store named
``data[1].zarr`` is not the pattern ``data1.zarr``).

The next run on the same target finds what dead runs left (their lock is free) and removes it, with
a warning saying what and how much — or, with ``resume=True``, continues the run whose manifest
matches its own, keeping the shards it finished.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import json
import os
import shutil
import time
import uuid
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OptionError, OutcoreWarning, StorageError, StoreExistsError
from .groups import is_url, is_zip

_RENAME_EXCHANGE = 2
STARTING_SECONDS = 60  # a run's folder is renamed into view within milliseconds of being made
_AT_FDCWD = -100


@dataclass(frozen=True)
class Staging:
    """Where a run builds its store: ``store`` (the directory that becomes it), the run's folder ``run``
    (manifest, done shards), and whether it ``resumed`` a dead run's work."""

    store: Path
    run: Path
    resumed: bool

    def scratch(self, suffix: str) -> Path:
        """A scratch path of this run, removed with it: ``.<name>.partial-<id>.<suffix>``."""
        return self.store.with_name(f"{self.store.name}.{suffix}")

    def done(self, part: str) -> Path:
        """The marker of a finished part of the work (a shard), holding what it found, as JSON."""
        return self.run / "done" / f"{part}.json"


@contextmanager
def staged_store(location: str | os.PathLike, overwrite: bool, *, manifest: dict[str, Any] | None = None,
                 resume: bool = False) -> Iterator[Staging]:
    """Yield a `Staging` to build a store in; move it to ``location`` only when the block succeeds.

    A failed ingest leaves no store at ``location`` (nor touches an existing one); a ``.zip`` location
    gets the finished directory packed into one file (entries stored, not recompressed). ``manifest``
    says what the run writes, from what: a run that has one keeps its finished shards when it is
    interrupted (Ctrl-C, or killed), and with ``resume`` a dead run with the same manifest is continued
    instead of started again.
    """
    target = local_target(location).absolute()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise storage_error(error, target) from None
    _restore_previous(target)
    if target.exists() and not overwrite:
        raise StoreExistsError(f"{target} already exists; pass overwrite=True to replace it")
    staging, lock = _adopt_or_clean(target, manifest if resume else None)
    if staging is None:
        staging, lock = _start(target, manifest)
    try:
        yield staging
        built = staging.store
        if is_zip(target):
            built = staging.scratch("zip")
            pack_zip(staging.store, built)
        _replace(built, target)
        _remove_run(staging.store)
    except BaseException as error:
        if manifest is not None and isinstance(error, KeyboardInterrupt):  # keep the finished shards to resume
            for suffix in ("zip", "permute"):
                remove_path(staging.scratch(suffix))
        else:  # a failure, or nothing could continue this run: leave nothing behind
            _remove_run(staging.store)
        if isinstance(error, OSError) and not isinstance(error, StorageError):
            raise storage_error(error, target) from None
        raise
    finally:
        lock.close()


def local_target(location: str | os.PathLike) -> Path:
    """``location`` as the local path a store is written to; a URL is an `OptionError` (``Path`` would
    make ``s3://bucket/x.zarr`` a local folder named ``s3:/bucket/x.zarr``).

    >>> local_target("s3://bucket/x.zarr")
    Traceback (most recent call last):
    ...
    outcore.errors.OptionError: cannot write to 's3://bucket/x.zarr': outcore writes stores to local paths; write the store to a local disk, then copy it to the object store (a .zip store is one file to copy)
    """
    if is_url(location):
        raise OptionError(f"cannot write to {str(location)!r}: outcore writes stores to local paths; write the store "
                          "to a local disk, then copy it to the object store (a .zip store is one file to copy)")
    return Path(location)


def storage_error(error: OSError, location: Path) -> StorageError:
    """``error`` as one line naming the store and what to do."""
    advice = {
        errno.ENOSPC: f"free some space there (it has {_free_mib(location):,.0f} MiB free), or write the store "
                      "elsewhere",
        errno.EDQUOT: "your disk quota is used up there: free some of it, or write the store elsewhere",
        errno.EACCES: "you may not write there: choose another location, or change its permissions",
        errno.EROFS: "that file system is read-only: write the store elsewhere",
        errno.ENOTDIR: "a file stands where a folder of the location should be: choose another location",
        errno.EEXIST: "a file stands where a folder of the location should be: choose another location",
    }.get(error.errno, "check the location and the disk")
    where = f" ({error.filename})" if error.filename else ""
    return StorageError(error.errno, f"writing the store {location} failed: {error.strerror or error}{where}; "
                                     f"{advice}. Nothing was left at {location}")


def _free_mib(location: Path) -> float:
    for folder in (location, *location.parents):
        if folder.exists():
            stats = os.statvfs(folder)
            return stats.f_bavail * stats.f_frsize / 2**20
    return 0.0


def _start(target: Path, manifest: dict[str, Any] | None) -> tuple[Staging, Any]:
    """A new run: its folder is made and locked under a name no other run looks at, then renamed into
    view, so no run ever sees it unlocked (and takes it for a dead one)."""
    run_id = uuid.uuid4().hex[:8]
    store = target.parent / f".{target.name}.partial-{run_id}"
    run = store.with_name(store.name + ".run")
    hidden = target.parent / f".{target.name}.starting-{run_id}"
    (hidden / "done").mkdir(parents=True)
    lock = _lock(hidden)
    if manifest is not None:
        (hidden / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    os.rename(hidden, run)  # the open lock file moves with its folder: still held
    return Staging(store, run, resumed=False), lock


def _adopt_or_clean(target: Path, manifest: dict[str, Any] | None) -> tuple[Staging | None, Any]:
    """Continue the dead run whose manifest is ``manifest`` (if any); remove what other dead runs left."""
    adopted, lock = None, None
    name = glob.escape(target.name)  # a name like data[1].zarr is not a pattern
    for starting in sorted(target.parent.glob(f".{name}.starting-*")):  # runs that died before they were seen
        if time.time() - starting.stat().st_mtime > STARTING_SECONDS and (held := _try_lock(starting)) is not None:
            held.close()
            _remove_leftovers(starting, target)
    for run in sorted(target.parent.glob(f".{name}.partial-*.run")):
        held = _try_lock(run)
        if held is None:
            warnings.warn(f"another ingest is writing {target} now (its files: {run.with_suffix('')}*); the one "
                          "that finishes last leaves its store there", OutcoreWarning, stacklevel=4)
            continue
        if adopted is None and manifest is not None and _manifest(run) == manifest:
            adopted, lock = Staging(run.with_suffix(""), run, resumed=True), held
            continue
        held.close()
        resumable = manifest is None and _manifest(run) is not None
        _remove_leftovers(run.with_suffix(""), target, "; resume=True (--resume) continues such a run instead of "
                          "removing it" if resumable else "")
    for store in sorted(target.parent.glob(f".{name}.partial-*")):  # runs older than run folders
        if not store.name.endswith(".run") and not store.with_name(_run_name(store)).exists():
            _remove_leftovers(store, target)
    return adopted, lock


def _run_name(path: Path) -> str:
    """The run folder of any of a run's paths: ``.<name>.partial-<id>.run``."""
    head, _, rest = path.name.partition(".partial-")
    return f"{head}.partial-{rest.split('.')[0]}.run"


def _remove_leftovers(store: Path, target: Path, advice: str = "") -> None:
    paths = list(store.parent.glob(glob.escape(store.name) + "*"))
    size = sum(_size(p) for p in paths)
    for path in paths:
        remove_path(path)
    warnings.warn(f"removed what an interrupted ingest of {target} left behind: {len(paths)} path(s), "
                  f"{size / 2**20:.1f} MiB ({store}*){advice}", OutcoreWarning, stacklevel=5)


def _manifest(run: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _lock(run: Path) -> Any:
    lock = _try_lock(run)
    if lock is None:
        raise StoreExistsError(f"another process holds the run folder {run}")
    return lock


def _try_lock(run: Path) -> Any:
    """The run's lock file, locked by us; None when a live process holds it."""
    file = open(run / "lock", "a+")  # noqa: SIM115 - held open for the run's lifetime, closed by the caller
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        return None
    return file


def _remove_run(store: Path) -> None:
    for path in store.parent.glob(glob.escape(store.name) + "*"):
        remove_path(path)


def pack_zip(directory: Path, zip_path: Path) -> None:
    """Pack a store directory into a zip file that ``zarr.storage.ZipStore`` reads."""
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())


def _replace(new: Path, target: Path) -> None:
    """Put ``new`` at ``target`` in one step where the system allows (see the module docstring)."""
    if not target.exists() or new.is_file():
        os.replace(new, target)  # atomic: a path that does not exist yet, or a file over a file
        return
    if _exchange(new, target):
        remove_path(new)  # the old store, now at the new one's former path
        return
    previous = target.with_name(f".{target.name}.previous-{uuid.uuid4().hex[:8]}")
    os.replace(target, previous)
    os.replace(new, target)
    remove_path(previous)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with ``renameat2(RENAME_EXCHANGE)``; False where it is not available."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _restore_previous(target: Path) -> None:
    """After a run died between the two renames of a replace, put the old store back (or drop it)."""
    for previous in sorted(target.parent.glob(f".{glob.escape(target.name)}.previous-*")):
        if target.exists():
            remove_path(previous)
            warnings.warn(f"removed {previous}, the store {target} held before an interrupted replace",
                          OutcoreWarning, stacklevel=4)
        else:
            os.replace(previous, target)
            warnings.warn(f"put back {target}: an ingest that was replacing it died between two renames",
                          OutcoreWarning, stacklevel=4)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def remove_path(path: Path) -> None:
    """Remove a file or a folder tree; a folder that tasks still running on a cluster write into is
    removed as far as it goes (the next run removes the rest: their lock is free by then)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
