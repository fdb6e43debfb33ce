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

A store bound for an object store is built the same way in a local folder standing for its URL
(`outcore.storage.upload.local_mirror`), its shards uploaded as they finish and the store published
there by `outcore.storage.upload.Upload` instead of renamed into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
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

from ..errors import OptionError, OutcoreError, OutcoreWarning, StorageError, StoreExistsError
from ..threads import for_each
from .chunk_reads import unmap_idle
from .groups import is_url, is_zip
from .remote import is_object_url, redact
from .upload import STAGING_ENVIRONMENT, Upload, clean_leftovers, local_mirror

_RENAME_EXCHANGE = 2
STARTING_SECONDS = 60  # a run's folder is renamed into view within milliseconds of being made
_AT_FDCWD = -100


@dataclass(frozen=True)
class Staging:
    """Where a run builds its store: ``store`` (the directory that becomes it), the run's folder ``run``
    (manifest, done shards), whether it ``resumed`` a dead run's work, and for a store bound for an
    object store, its ``upload`` (where finished shards go)."""

    store: Path
    run: Path
    resumed: bool
    upload: Upload | None = None

    def scratch(self, suffix: str) -> Path:
        """A scratch path of this run, removed with it: ``.<name>.partial-<id>.<suffix>``."""
        return self.store.with_name(f"{self.store.name}.{suffix}")

    def done(self, part: str) -> Path:
        """The marker of a finished part of the work (a shard), holding what it found, as JSON."""
        return self.run / "done" / f"{part}.json"


@contextmanager
def staged_store(location: str | os.PathLike, overwrite: bool, *, manifest: dict[str, Any] | None = None,
                 resume: bool = False, storage_options: dict[str, Any] | None = None) -> Iterator[Staging]:
    """Yield a `Staging` to build a store in; move it to ``location`` only when the block succeeds.

    A failed ingest leaves no store at ``location`` (nor touches an existing one); a ``.zip`` location
    gets the finished directory packed into one file (entries stored, not recompressed); an object
    store URL (``s3://``, ``gs://``, ``az://``, reached with ``storage_options``) gets the store
    uploaded and published (`outcore.storage.upload`). ``manifest`` says what the run writes, from
    what: a run that has one keeps its finished shards when it is interrupted (Ctrl-C, or killed), and
    with ``resume`` a dead run with the same manifest is continued instead of started again.
    """
    remote = _upload(location, storage_options)
    target = local_mirror(str(location)) if remote else local_target(location).absolute()
    shown = redact(str(location)) if remote else str(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise storage_error(error, target, shown=shown) from None
    _restore_previous(target)
    if (remote.exists() if remote else target.exists()) and not overwrite:
        raise StoreExistsError(f"{shown} already exists; pass overwrite=True to replace it")
    here, live = _runs(target)
    staging, lock = _adopt_or_clean(target, manifest if resume else None, shown)
    if staging is None:
        staging, lock = _start(target, manifest)
    if remote:
        staging = dataclasses.replace(staging, upload=remote.for_run(_run_id(staging.store)))
        clean_leftovers(remote, here, live, keep=staging.upload.run)
    try:
        yield staging
        if staging.upload:
            staging.upload.publish(staging.store)
        else:
            built = staging.store
            if is_zip(target):
                built = staging.scratch("zip")
                pack_zip(staging.store, built)
            put_in_place(built, target)
        _remove_run(staging.store)
    except BaseException as error:
        if manifest is not None and isinstance(error, KeyboardInterrupt):  # keep the finished shards to resume
            for suffix in ("zip", "permute"):
                remove_path(staging.scratch(suffix))
        else:  # a failure, or nothing could continue this run: leave nothing behind
            _remove_run(staging.store)
            if staging.upload:
                _discard(staging.upload)
        if isinstance(error, OSError) and not isinstance(error, OutcoreError):
            raise storage_error(error, target, shown=shown) from None
        raise
    finally:
        lock.close()


def check_target(location: str | os.PathLike) -> None:
    """Refuse, before any work, a location no store can be written to (a URL that is not an object
    store's, a zip or https:// object URL)."""
    _upload(location, None)
    if not is_object_url(str(location)):
        local_target(location)


def _upload(location: str | os.PathLike, storage_options: dict[str, Any] | None) -> Upload | None:
    """The upload of a store bound for an object store (its run named later), else None."""
    if not (is_url(location) and is_object_url(str(location))):
        return None
    if is_zip(location):
        raise OptionError(f"cannot write {redact(str(location))}: outcore writes folder stores to object stores "
                          "(a zip store is read from a local disk); drop the .zip")
    return Upload(str(location), storage_options, run="")


def _discard(upload: Upload) -> None:
    """Remove a failed run's staged objects; when that fails too, the next run on the target does."""
    try:
        upload.discard()
    except OutcoreError as error:
        warnings.warn(f"could not remove the objects of the failed upload under {upload.staging}/ ({error}); "
                      "the next ingest of the same location removes them", OutcoreWarning, stacklevel=4)


def _runs(target: Path) -> tuple[set[str], set[str]]:
    """The runs of ``target`` that have run folders here, and those of them a live process holds."""
    here, live = set(), set()
    for run in target.parent.glob(f".{glob.escape(target.name)}.partial-*.run"):
        here.add(_run_id(run))
        held = try_lock(run)
        if held is None:
            live.add(_run_id(run))
        else:
            held.close()
    return here, live


def _run_id(path: Path) -> str:
    """The id of the run a path belongs to (``.<name>.partial-<id>[.suffix]``)."""
    return path.name.partition(".partial-")[2].split(".")[0]


def local_target(location: str | os.PathLike) -> Path:
    """``location`` as the local path a store is written to; a URL is an `OptionError` (``Path`` would
    make ``ftp://host/x.zarr`` a local folder named ``ftp:/host/x.zarr``).

    >>> local_target("ftp://host/x.zarr")
    Traceback (most recent call last):
    ...
    outcore.errors.OptionError: cannot write to 'ftp://host/x.zarr': outcore writes stores to local paths and to object stores (s3://, gs://, az://); copy the store there yourself
    """
    if is_url(location):
        raise OptionError(f"cannot write to {redact(str(location))!r}: outcore writes stores to local paths and to "
                          "object stores (s3://, gs://, az://); copy the store there yourself")
    return Path(location)


def storage_error(error: OSError, location: Path, kept: str | None = None, shown: str | None = None) -> StorageError:
    """``error`` as one line naming the store and what to do, and what is ``kept`` of it (default: nothing
    was left there). ``shown`` is the store as the user named it when ``location`` is the local folder a
    store bound for an object store is built in (`outcore.storage.upload.staging_root`)."""
    staged = shown is not None and shown != str(location)
    elsewhere = f"set ${STAGING_ENVIRONMENT} to a folder on a larger disk" if staged else "write the store elsewhere"
    advice = {
        errno.ENOSPC: f"free some space there (it has {_free_mib(location):,.0f} MiB free), or {elsewhere}",
        errno.EDQUOT: f"your disk quota is used up there: free some of it, or {elsewhere}",
        errno.EACCES: "you may not write there: choose another location, or change its permissions",
        errno.EROFS: f"that file system is read-only: {elsewhere}",
        errno.ENOTDIR: "a file stands where a folder of the location should be: choose another location",
        errno.EEXIST: "a file stands where a folder of the location should be: choose another location",
    }.get(error.errno, "check the location and the disk")
    where = f" ({error.filename})" if error.filename else ""
    name = shown or str(location)
    place = f" in its local staging folder {location.parent}" if staged else ""
    kept = kept or f"Nothing was left at {name}"
    message = f"writing the store {name} failed{place}: {error.strerror or error}{where}; {advice}. {kept}"
    return StorageError(error.errno, message) if error.errno is not None else StorageError(message)


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


def _adopt_or_clean(target: Path, manifest: dict[str, Any] | None, shown: str) -> tuple[Staging | None, Any]:
    """Continue the dead run whose manifest is ``manifest`` (if any); remove what other dead runs left,
    saying so of the store ``shown`` (the target, or the URL it stands for)."""
    adopted, lock = None, None
    name = glob.escape(target.name)  # a name like data[1].zarr is not a pattern
    for starting in sorted(target.parent.glob(f".{name}.starting-*")):  # runs that died before they were seen
        if time.time() - starting.stat().st_mtime > STARTING_SECONDS and (held := try_lock(starting)) is not None:
            held.close()
            _remove_leftovers(starting, shown)
    for run in sorted(target.parent.glob(f".{name}.partial-*.run")):
        held = try_lock(run)
        if held is None:
            warnings.warn(f"another ingest is writing {shown} now (its files: {run.with_suffix('')}*); the one "
                          "that finishes last leaves its store there", OutcoreWarning, stacklevel=4)
            continue
        if adopted is None and manifest is not None and _manifest(run) == manifest:
            adopted, lock = Staging(run.with_suffix(""), run, resumed=True), held
            continue
        held.close()
        resumable = manifest is None and _manifest(run) is not None
        _remove_leftovers(run.with_suffix(""), shown, "; resume=True continues such a run instead of "
                          "removing it" if resumable else "")
    for store in sorted(target.parent.glob(f".{name}.partial-*")):  # runs older than run folders
        if not store.name.endswith(".run") and not store.with_name(_run_name(store)).exists():
            _remove_leftovers(store, shown)
    return adopted, lock


def _run_name(path: Path) -> str:
    """The run folder of any of a run's paths: ``.<name>.partial-<id>.run``."""
    return f"{path.name.partition('.partial-')[0]}.partial-{_run_id(path)}.run"


def _remove_leftovers(store: Path, target: str, advice: str = "") -> None:
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
    lock = try_lock(run)
    if lock is None:
        raise StoreExistsError(f"another process holds the run folder {run}")
    return lock


def try_lock(run: Path) -> Any:
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


def _remove_files(folder: str) -> None:
    """Remove what ``folder`` holds but its folders (files, and links, not followed), as much as can be."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def pack_zip(directory: Path, zip_path: Path) -> None:
    """Pack a store directory into a zip file that ``zarr.storage.ZipStore`` reads."""
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(directory).as_posix())


def put_in_place(new: Path, target: Path) -> None:
    """Put ``new`` at ``target`` in one step where the system allows (see the module docstring)."""
    if not target.exists() or new.is_file():
        os.replace(new, target)  # atomic: a path that does not exist yet, or a file over a file
        return
    if _exchange(new, target):
        unmap_idle(new)  # the old store, now at the new one's former path: its files' space freed once removed
        remove_path(new)
        return
    previous = target.with_name(f".{target.name}.previous-{uuid.uuid4().hex[:8]}")
    os.replace(target, previous)
    os.replace(new, target)
    unmap_idle(previous)
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
    """Remove a file or a folder tree, the files of its folders on the pool's threads (a folder each: each removal is
    a system call outside the GIL, and a finished ingest leaves a few thousand small files); a folder that tasks
    still running on a cluster write into is removed as far as it goes (the next run removes the rest: their lock
    is free by then)."""
    if path.is_dir() and not path.is_symlink():
        folders = [folder for folder, _, files in os.walk(path) if files]
        if len(folders) > 1:
            for_each(lambda i: _remove_files(folders[i]), len(folders))
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
