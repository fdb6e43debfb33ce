"""Write a store to an object store: built on the local disk, uploaded as its shards finish, published
with its metadata last.

Object stores have no rename, so a run uploads into a staging prefix of its own beside the target,
``<parent>/.<name>.partial-<run>/``, each shard file as soon as it is written (and its local copy
removed, so the local disk holds a few shards, never the store). Publishing copies the shard objects
into the target inside the object store, then puts the arrays' metadata and, last, the group's
``zarr.json``: until that one request a new location holds no store, and afterwards it holds all of it.

Every object a run writes carries the run's id as its *generation* (object metadata `GENERATION`).
A reader holding one store's metadata checks each answer's generation against it (`RemoteStore`): while
an overwrite is being published, a reader of the old store gets `StoreChangedError` for a shard already
replaced, never the new bytes read as the old ones. Old objects the new store no longer has are deleted
once it is published.

A killed run's staging prefix is found by the next run on the same target: removed, or, with
``resume=True``, continued from the shards its local run folder lists as done (`outcore.storage.staging`).

>>> upload = Upload("s3://bucket/train.zarr", {"region": "eu-west-1"}, run="3f2a9c1e")  # doctest: +SKIP
>>> upload.put_shard(Path(".train.zarr.partial-3f2a9c1e"), 0)  # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import hashlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import zarr

from ..errors import CorruptChunkError, OptionError, OutcoreWarning
from ..threads import submit_io, wait_all
from .groups import shard_path
from .remote import GENERATION, RemoteStore, redact

STALE_SECONDS = 24 * 3600  # a staging prefix no process of this machine owns, untouched this long, is dead
STAGING_ENVIRONMENT = "OUTCORE_STAGING_DIR"  # where stores bound for object stores are built
METADATA = "zarr.json"


class Upload:
    """The objects of one run writing the store at ``url``: its staging prefix, the copies into the
    target, the clean-up. Pickles as its URL, settings and run (tasks on Dask workers upload their
    shards themselves); each process makes its own client."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None, run: str) -> None:
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme.lower() in ("http", "https"):
            raise OptionError(f"cannot write to {redact(url)}: an https:// location is read-only; write to "
                              "s3://, gs:// or az://")
        self.url, self.run = url.rstrip("/"), run
        self._options = dict(storage_options or {})
        self.target = parts.path.strip("/")
        if not self.target:
            raise OptionError(f"cannot write to {redact(url)}: name a store inside the bucket (s3://bucket/train.zarr)")
        parent, _, name = self.target.rpartition("/")
        self.staging = f"{parent}/.{name}.partial-{run}".lstrip("/")
        self._bucket = RemoteStore(f"{parts.scheme}://{parts.netloc}", self._options, read_only=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self._options, "run": self.run}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"], state["run"])

    def __repr__(self) -> str:
        return f"Upload({redact(self.url)!r}, run={self.run!r})"

    def exists(self) -> bool:
        """Whether a store is published at the target (its group's ``zarr.json`` is there)."""
        return self._request(f"{self.target}/{METADATA}", "look for", self._head) is not None

    def put_shard(self, directory: Path, shard: int) -> None:
        """Upload shard ``shard`` of every array of the store being built at ``directory`` (the files
        `outcore.storage.shard_path` names) into the staging prefix, then remove the local files."""
        group = zarr.open_group(directory, mode="r")
        for _, array in group.arrays():
            relative = shard_path(array, shard)
            if (directory / relative).is_file():
                self._put_file(directory / relative, f"{self.staging}/{relative}")

    def publish(self, directory: Path) -> None:
        """Make the store built at ``directory`` the store at the target: upload what is left of its data,
        copy the staged objects into the target, put the arrays' metadata, the group's last; then
        delete the target's objects the new store does not have, and the staging prefix."""
        for path in sorted(directory.rglob("*")):
            if path.is_file() and path.name != METADATA:
                self._put_file(path, f"{self.staging}/{path.relative_to(directory).as_posix()}")
        staged = [key[len(self.staging) + 1:] for key in self._keys(self.staging)]
        old = set(self._keys(self.target))
        self._each(staged, lambda key: self._request(key, "copy", lambda: self._copy(
            f"{self.staging}/{key}", f"{self.target}/{key}")))
        new = {f"{self.target}/{key}" for key in staged} | self._put_metadata(directory)
        self._delete(sorted(old - new))
        self.discard()

    def put_grown(self, directory: Path, data: list[str]) -> None:
        """Put a growing store's new files straight into the target (a `outcore.Writer`'s): ``data``
        (paths relative to ``directory``) first, then the arrays' metadata, the group's last: its sample
        count is published once the shards holding those samples are there."""
        self._each(data, lambda relative: self._put_file(directory / relative, f"{self.target}/{relative}"))
        self._put_metadata(directory)

    def fetch(self, directory: Path, samples: int | None = None) -> None:
        """Copy the target's metadata into ``directory``, and with ``samples`` (a growing store's count), each
        array's shard file that holds its last samples when that file is not full (its Writer completes it:
        it holds published samples, so a missing one is a `CorruptChunkError`, never a shard of fill values)."""
        for key in self._keys(self.target):
            if key.endswith(f"/{METADATA}"):
                self._fetch(key, directory)
        if samples:
            for _, array in zarr.open_group(directory, mode="r").arrays():
                shard, filled = divmod(samples, (array.shards or array.chunks)[0])
                if not filled:
                    continue
                key = f"{self.target}/{shard_path(array, shard)}"
                try:
                    self._fetch(key, directory)
                except FileNotFoundError:
                    raise CorruptChunkError(
                        f"{redact(self.url)}/{key[len(self.target) + 1:]} is missing, but the store says it holds "
                        "samples: the store is damaged; restore it from a copy, or write it again"
                    ) from None

    def _fetch(self, key: str, directory: Path) -> None:
        path = directory / key[len(self.target) + 1:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(self._request(key, "download", lambda: self._get(key))))

    def generation(self) -> str | None:
        """The generation of the store published at the target (None: none, or not written by outcore)."""
        import obstore

        key = f"{self.target}/{METADATA}"
        try:
            result = self._request(key, "read", lambda: obstore.get(self._bucket.store, key))
        except FileNotFoundError:
            return None
        return result.attributes.get(GENERATION)

    def clear(self) -> None:
        """Delete the store at the target, its group's ``zarr.json`` first (no reader opens it half gone)."""
        keys = list(self._keys(self.target))
        root = f"{self.target}/{METADATA}"
        self._delete([key for key in keys if key == root])
        self._delete([key for key in keys if key != root])

    def _put_metadata(self, directory: Path) -> set[str]:
        """Put every ``zarr.json`` of ``directory`` into the target, the group's last; return their keys."""
        keys = set()
        for path in sorted(directory.rglob(METADATA), key=lambda p: -len(p.parts)):  # the group's last
            key = f"{self.target}/{path.relative_to(directory).as_posix()}"
            self._put_file(path, key)
            keys.add(key)
        return keys

    def put_report(self, name: str, text: str) -> None:
        """Put ``text`` as the object ``name`` beside the store (the report of skipped samples); an empty
        ``text`` removes an old report."""
        key = f"{self.target.rpartition('/')[0]}/{name}".lstrip("/")
        if text:
            self._request(key, "upload", lambda: self._put(key, text.encode()))
        else:
            self._delete([key])

    def discard(self) -> None:
        """Delete everything this run put in its staging prefix."""
        self._delete(list(self._keys(self.staging)))

    def leftovers(self) -> dict[str, tuple[int, int, float]]:
        """The staging prefixes of other runs on this target: run id -> (objects, bytes, seconds since the
        newest was written)."""
        import obstore

        parent, _, name = self.target.rpartition("/")
        marker = f".{name}.partial-"
        listing = self._request(parent or "/", "list", lambda: obstore.list_with_delimiter(
            self._bucket.store, prefix=parent or None))
        found = {}
        now = datetime.datetime.now(datetime.UTC)
        for prefix in listing["common_prefixes"]:
            run = prefix.rpartition("/")[2].removeprefix(marker)
            if prefix.rpartition("/")[2].startswith(marker) and run != self.run:
                metas = list(self._metas(prefix))
                newest = max((m["last_modified"] for m in metas), default=now)
                found[run] = (len(metas), sum(int(m["size"]) for m in metas), (now - newest).total_seconds())
        return found

    def for_run(self, run: str) -> Upload:
        """The same target, written by run ``run``."""
        return Upload(self.url, self._options, run)

    def _put_file(self, path: Path, key: str) -> None:
        self._request(key, "upload", lambda: self._put(key, path))
        if key.startswith(f"{self.staging}/"):
            path.unlink()  # on the object store now: the local disk holds a few shards, never the store

    def _put(self, key: str, data: Path | bytes) -> None:
        import obstore

        obstore.put(self._bucket.store, key, data, attributes={GENERATION: self.run})

    def _get(self, key: str) -> Any:
        import obstore

        return obstore.get(self._bucket.store, key).bytes()

    def _copy(self, source: str, target: str) -> None:
        import obstore

        obstore.copy(self._bucket.store, source, target)

    def _head(self) -> Any:
        import obstore

        try:
            return obstore.head(self._bucket.store, f"{self.target}/{METADATA}")
        except FileNotFoundError:
            return None

    def _keys(self, prefix: str) -> Iterator[str]:
        for meta in self._metas(prefix):
            yield str(meta["path"])

    def _metas(self, prefix: str) -> Iterator[Mapping[str, Any]]:
        import obstore

        batches = self._request(prefix, "list", lambda: list(obstore.list(self._bucket.store, prefix=prefix)))
        for batch in batches:
            yield from batch

    def _delete(self, keys: list[str]) -> None:
        import obstore

        if not keys:
            return
        for start in range(0, len(keys), 1000):  # S3 deletes at most 1,000 objects a request
            batch = keys[start:start + 1000]
            self._request(batch[0], "delete", lambda batch=batch: obstore.delete(self._bucket.store, batch))

    def _each(self, keys: list[str], work: Callable[[str], Any]) -> None:
        """``work(key)`` for every key, on the I/O threads (requests in flight together)."""
        wait_all([submit_io(work, key) for key in keys])

    def _request(self, key: str, what: str, request: Callable[[], Any]) -> Any:
        """``request()`` retried within a bounded time, then one `RemoteError` naming the object."""
        return self._bucket.files._call(key, what, request)


def clean_leftovers(upload: Upload, here: set[str], live: set[str], keep: str | None) -> None:
    """Delete the staging prefixes of dead runs on ``upload``'s target. ``here``: the runs this machine
    has run folders for, ``live`` those of them still running, ``keep`` the run being continued. A run
    of this machine that is not live is dead; a run of another machine is taken for dead once nothing
    was written in its prefix for `STALE_SECONDS`, and left (with a warning) before."""
    for run, (objects, size, age) in upload.leftovers().items():
        if run in live or run == keep:
            continue
        other = upload.for_run(run)
        if run in here or age >= STALE_SECONDS:
            other.discard()
            warnings.warn(f"removed what an interrupted upload of {redact(upload.url)} left behind: {objects} "
                          f"object(s), {size / 2**20:.1f} MiB (under {other.staging}/)", OutcoreWarning, stacklevel=5)
        else:
            warnings.warn(f"another ingest may be uploading {redact(upload.url)} (its objects under {other.staging}/ "
                          f"were written {age:.0f} s ago): the one that publishes last leaves its store there",
                          OutcoreWarning, stacklevel=5)


def staging_root() -> Path:
    """Where stores bound for object stores are built: ``$OUTCORE_STAGING_DIR``, else ``uploads`` in
    ``$OUTCORE_CACHE_DIR``, else ``~/.cache/outcore/uploads``."""
    chosen = os.environ.get(STAGING_ENVIRONMENT)
    if chosen:
        return Path(chosen)
    cache = os.environ.get("OUTCORE_CACHE_DIR")
    base = Path(cache) if cache else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "outcore"
    return base / "uploads"


def local_mirror(url: str) -> Path:
    """The local path standing for ``url`` while a store bound for it is built (runs are staged beside
    it, as for a local target; nothing is ever written at the path itself)."""
    digest = hashlib.sha256(redact(url.rstrip("/")).encode()).hexdigest()[:16]
    return staging_root() / digest / url.rstrip("/").rpartition("/")[2]
