"""`ChunkCache`: byte ranges of remote objects kept on a local disk, shared by every process of the node.

One folder holds the entries (files under ``blobs/``) and an SQLite index of them (``index.sqlite``,
in WAL mode, so DataLoader workers, ranks and separate jobs share it safely). Its rules:

- **Bounded.** The bytes of the entries never exceed ``max_bytes``, and an entry is not written when it
  would leave less free on its disk than `min_free_bytes` (5 % of the disk, at most 4 GiB). Room is made by evicting entries whose
  next use nobody told (`expect`), least recently used first, then those read again the latest (the
  iterator knows when from the next epoch's order); an entry being written is never evicted.
- **Fetched once.** `get_or_fetch` claims a missing entry before fetching it: another process or thread
  that needs it meanwhile waits for it instead of fetching it again.
- **Checked.** Each entry starts with the crc32c of its bytes; an entry that fails it is dropped and
  fetched again. Names include the object's version (ETag), so a rewritten object never meets old bytes.
- **Crash-safe.** Every entry file is counted from before it is written until after it is removed; a
  process that dies mid-way leaves its entries marked, and the next process to open the cache removes
  them (`reconcile`), so nothing stays counted, or on disk uncounted, after a crash.

>>> cache = ChunkCache("/scratch/outcore-cache", max_bytes=50 * 2**30)  # doctest: +SKIP
>>> cache.get_or_fetch("s3://bucket/x.zarr/images/c/0@etag:0-4096", lambda: fetch())  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from ..errors import OptionError, OutcoreWarning, StorageError

ENVIRONMENT = "OUTCORE_CACHE_DIR"
SIZE_ENVIRONMENT = "OUTCORE_CACHE_SIZE"
DEFAULT_MAX_BYTES = 20 * 2**30
MIN_FREE_FRACTION = 0.05  # the cache leaves this much of its disk free ...
MIN_FREE_CAP = 4 * 2**30  # ... or this much, when less: 5 % of a shared 2 TB disk is not the cache's to keep
STALE_SECONDS = 300.0  # an entry still being written after this long belongs to a process that is gone
WAIT_SECONDS = 120.0  # the longest a reader waits for an entry another process is fetching
FULL_SECONDS = 1.0  # how long a cache whose disk was found full is left alone before it is tried again
USE_SECONDS = 10.0  # an entry's last use is written again only when older than this
_CHECKSUM = 4
_SETUP_LOCK = threading.Lock()
_WRITING, _READY, _REMOVING = 0, 1, 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    name TEXT PRIMARY KEY, file TEXT NOT NULL, size INTEGER NOT NULL,
    state INTEGER NOT NULL, owner INTEGER NOT NULL, used REAL NOT NULL, next REAL);
CREATE INDEX IF NOT EXISTS entries_by_use ON entries (state, used);
CREATE TABLE IF NOT EXISTS total (id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL);
INSERT OR IGNORE INTO total VALUES (0, 0);
"""


@dataclass(frozen=True)
class CacheUsage:
    """What a cache holds: ``entries`` files of ``bytes`` in all, of at most ``max_bytes``."""

    directory: str
    entries: int
    bytes: int
    max_bytes: int

    def __str__(self) -> str:
        share = self.bytes / self.max_bytes if self.max_bytes else 0.0
        return (f"{self.directory}: {self.entries:,} entries, {self.bytes / 2**20:,.1f} MiB of "
                f"{self.max_bytes / 2**20:,.0f} MiB ({share:.0%})")


@dataclass
class CacheCounts:
    """What this process's reads through a cache did: ``hits`` and ``misses`` (entries fetched), and
    the bytes fetched."""

    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0


def parse_size(text: str | int) -> int:
    """``"20GiB"``, ``"500MB"``, ``"1e9"`` or a number of bytes, as bytes."""
    if isinstance(text, int):
        return text
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    value = str(text).strip().lower().replace(" ", "").replace("_", "")
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        return int(float(number) * units[value[len(number):]])
    except (ValueError, KeyError):
        raise OptionError(f"cache size {text!r}: give bytes, or a number with KB, MB, GB, TB, KiB, MiB, GiB "
                          "or TiB") from None


def min_free_bytes(disk_bytes: int) -> int:
    """The free space the cache leaves on a disk of ``disk_bytes``: 5 % of it, at most 4 GiB.

    >>> min_free_bytes(40 * 2**30) / 2**30, min_free_bytes(2**41) / 2**30
    (2.0, 4.0)
    """
    return min(int(MIN_FREE_FRACTION * disk_bytes), MIN_FREE_CAP)


class ChunkCache:
    """A bounded, crash-safe cache of byte ranges in ``directory``, shared by the node's processes."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int | str = DEFAULT_MAX_BYTES, *,
                 node_default: bool = False) -> None:
        self.directory = Path(directory).expanduser().absolute()
        self.node_default = node_default  # the reading node's $OUTCORE_CACHE_DIR: each node resolves its own
        self.max_bytes = parse_size(max_bytes)
        if self.max_bytes <= 0:
            raise OptionError(f"cache_size={max_bytes!r}: give a positive number of bytes")
        self.counts = CacheCounts()
        self._local = threading.local()
        self._reconciled = 0  # the pid that reconciled the folder last in this object
        self._connections: list[tuple[int, sqlite3.Connection]] = []  # every thread's, to close them
        self._warned: set[str] = set()  # the kinds of trouble already told of (`_warn_once`)
        self._full_until = 0.0  # its disk was found full: until then, read without it (`_warn_full`)
        weakref.finalize(self, _close_connections, self._connections)

    @classmethod
    def from_environment(cls, directory: str | os.PathLike | None, max_bytes: int | str | None) -> ChunkCache | None:
        """The cache ``directory`` (or ``$OUTCORE_CACHE_DIR``) of ``max_bytes`` (or ``$OUTCORE_CACHE_SIZE``,
        else `DEFAULT_MAX_BYTES`); None when neither names a folder."""
        folder = directory if directory is not None else os.environ.get(ENVIRONMENT) or None
        if folder is None:
            return None
        return cls(folder, max_bytes if max_bytes is not None else os.environ.get(SIZE_ENVIRONMENT) or DEFAULT_MAX_BYTES,
                   node_default=directory is None)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "max_bytes": self.max_bytes, "node_default": self.node_default}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A cache chosen by ``$OUTCORE_CACHE_DIR`` is, in a process on another node (a Dask worker), that
        node's own ``$OUTCORE_CACHE_DIR`` when it has one."""
        node_default = state.get("node_default", False)
        directory = (node_default and os.environ.get(ENVIRONMENT)) or state["directory"]
        self.__init__(directory, state["max_bytes"], node_default=node_default)

    def __repr__(self) -> str:
        return f"ChunkCache({str(self.directory)!r}, max_bytes={self.max_bytes:,})"

    def holds(self, name: str) -> bool:
        """Whether entry ``name`` is in the cache, ready to read."""
        row = self._db().execute("SELECT state FROM entries WHERE name = ?", (name,)).fetchone()
        return row is not None and row[0] == _READY

    def get_or_fetch(self, name: str, size: int, fetch: Callable[[], bytes | memoryview],
                     out: memoryview | None = None) -> memoryview:
        """The entry ``name`` (``size`` bytes): read from the cache (into ``out`` when given), or fetched with
        ``fetch()`` and kept. Fetched once across the node: a reader that finds another fetching it waits
        for that fetch."""
        deadline = time.monotonic() + WAIT_SECONDS
        pause = 0.002
        while True:
            try:
                if time.monotonic() < self._full_until:
                    raise OSError(errno.ENOSPC, "No space left on device")  # found so a moment ago
                data = self._read(name, size, out)
                claim = "hit" if data is not None else self._claim(name, size)
            except (OSError, sqlite3.Error) as error:
                if not _disk_full(error):
                    raise
                self._warn_full(error)
                data, claim = None, "full"
            if data is not None:
                self.counts.hits += 1
                return data
            if claim == "no room":
                self._warn_once("no room", f"the cache {self.directory} has no room for a range of {size:,} bytes "
                                "(the ranges being fetched at once fill it, or the range is larger than it, or its "
                                f"disk has less than {min_free_bytes(shutil.disk_usage(self.directory).total) / 2**30:.1f} GiB free): such "
                                "ranges are read without being kept; give a larger cache_size=, or free space on "
                                "that disk")
            if claim in ("mine", "no room", "full") or time.monotonic() > deadline:
                break
            time.sleep(pause)  # another process or thread is fetching it
            pause = min(0.05, pause * 2)
        self.counts.misses += 1
        try:
            data = memoryview(fetch())
        except BaseException:
            if claim == "mine":
                self._drop(name, _WRITING)
            raise
        self.counts.fetched_bytes += len(data)
        if claim == "mine":
            try:
                self._write(name, data)
            except (OSError, sqlite3.Error) as error:
                if not _disk_full(error):
                    raise
                self._warn_full(error)
        if out is None:
            return data
        out[: len(data)] = data
        return out[: len(data)]

    def offer(self, name: str, data: memoryview) -> None:
        """Keep ``data`` as entry ``name`` unless it is there or another process is fetching it; never waits.
        A range fetched in one request with the one asked for (`RemoteFiles` fetches runs of ranges) is offered
        before that one is kept, so that a process waiting for it finds the others kept, not to fetch again."""
        try:
            if time.monotonic() >= self._full_until and self._claim(name, len(data)) == "mine":
                self._write(name, data)
        except (OSError, sqlite3.Error) as error:
            if not _disk_full(error):
                raise
            self._warn_full(error)

    def expect(self, name: str, when: float) -> None:
        """Say when entry ``name`` will be read next (in epochs, `outcore.iterate.plan.next_use`): when room
        is needed, entries whose next use is unknown go first, least recently used first, then those
        read again the latest."""
        self._db().execute("UPDATE entries SET next = ? WHERE name = ? AND state = ?", (when, name, _READY))

    def usage(self) -> CacheUsage:
        rows = self._db().execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries").fetchone()
        return CacheUsage(str(self.directory), rows[0], rows[1], self.max_bytes)

    def clear(self) -> CacheUsage:
        """Remove every entry that no process is writing; returns what is left."""
        db = self._db()
        with _transaction(db):
            rows = db.execute("SELECT name, file, size FROM entries WHERE state != ?", (_WRITING,)).fetchall()
            db.executemany("UPDATE entries SET state = ? WHERE name = ?", [(_REMOVING, r[0]) for r in rows])
        self._remove(rows)
        return self.usage()

    def reconcile(self) -> int:
        """Remove what processes that died left: entries marked for removal, and entries whose writer is
        gone or was writing for over `STALE_SECONDS`. Returns how many entries were removed."""
        db = self._db()
        now = time.time()
        with _transaction(db):
            rows = db.execute("SELECT name, file, size, state, owner, used FROM entries WHERE state != ?",
                              (_READY,)).fetchall()
            dead = [r[:3] for r in rows
                    if r[3] == _REMOVING or not _alive(r[4]) or now - r[5] > STALE_SECONDS]
            db.executemany("UPDATE entries SET state = ? WHERE name = ?", [(_REMOVING, r[0]) for r in dead])
        self._remove(dead)
        return len(dead)

    # -- the index and the files

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is not None and self._local.pid == os.getpid():
            return db
        try:
            with _SETUP_LOCK:  # threads of one process set up their connections one at a time
                db = self._connect()
        except (OSError, sqlite3.Error) as error:
            if _disk_full(error):  # it may have room later: `get_or_fetch` reads without it meanwhile
                raise
            raise StorageError(f"the cache folder {self.directory} cannot be used ({error}); give another with "
                               f"cache_dir= or ${ENVIRONMENT}, or cache_dir=False for none") from None
        self._local.db, self._local.pid = db, os.getpid()
        with _SETUP_LOCK:
            self._connections.append((os.getpid(), db))
        if self._reconciled != os.getpid():
            self._reconciled = os.getpid()
            self.reconcile()
        return db

    def _connect(self) -> sqlite3.Connection:
        """A connection to the index, made in WAL mode with the tables in place. Switching to WAL takes the
        database alone, which SQLite does not wait for: another process doing so is waited for here, in
        bounded tries."""
        (self.directory / "blobs").mkdir(parents=True, exist_ok=True)
        (self.directory / "tmp").mkdir(exist_ok=True)
        db = sqlite3.connect(self.directory / "index.sqlite", timeout=WAIT_SECONDS, isolation_level=None,
                             check_same_thread=False)
        try:
            self._prepare(db)
        except BaseException:  # a full disk, say: the connection is not kept, so it is closed now
            db.close()
            raise
        return db

    @staticmethod
    def _prepare(db: sqlite3.Connection) -> None:
        """WAL mode and the tables, on a new connection."""
        for attempt in range(200):
            try:
                if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as error:
                if attempt == 199 or _disk_full(error):
                    raise
                time.sleep(0.05)
        db.execute("PRAGMA synchronous=NORMAL")
        with _transaction(db):
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            if "next" not in {row[1] for row in db.execute("PRAGMA table_info(entries)")}:  # made by an older outcore
                db.execute("ALTER TABLE entries ADD COLUMN next REAL")

    def _read(self, name: str, size: int, out: memoryview | None) -> memoryview | None:
        """Entry ``name``'s ``size`` bytes, read into ``out`` (else a new buffer); None when it is not there,
        or fails its checksum (then it is dropped)."""
        db = self._db()
        row = db.execute("SELECT file, state, used FROM entries WHERE name = ?", (name,)).fetchone()
        if row is None or row[1] != _READY:
            return None
        data = (out if out is not None else memoryview(bytearray(size)))[:size]
        try:
            with open(self.directory / "blobs" / row[0], "rb", buffering=0) as entry:
                checksum = entry.read(_CHECKSUM)
                count = entry.readinto(data)
                extra = entry.read(1)
        except FileNotFoundError:  # evicted since, or deleted by hand: fetch it again
            self._drop(name, _READY)
            return None
        if count != size or extra or crc32c.crc32c(data).to_bytes(4, "little") != checksum:
            self._drop(name, _READY)
            return None
        if time.time() - row[2] > USE_SECONDS:  # least recently used, to within USE_SECONDS: one write less a read
            db.execute("UPDATE entries SET used = ? WHERE name = ?", (time.time(), name))
        return data

    def _claim(self, name: str, size: int) -> str:
        """Reserve room for ``name`` and mark it as being written by this process: ``"mine"``; or
        ``"taken"`` when it is there or being written; or ``"no room"`` (larger than the cache, or the disk
        is nearly full and nothing can be evicted)."""
        stored = size + _CHECKSUM
        if stored > self.max_bytes:
            return "no room"
        db = self._db()
        victims: list[tuple[str, str, int]] = []
        try:
            return self._reserve(db, name, stored, victims)
        finally:
            self._remove(victims)

    def _reserve(self, db: sqlite3.Connection, name: str, stored: int, victims: list[tuple[str, str, int]]) -> str:
        with _transaction(db):
            row = db.execute("SELECT state, owner, used FROM entries WHERE name = ?", (name,)).fetchone()
            if row is not None:
                if row[0] == _WRITING and (not _alive(row[1]) or time.time() - row[2] > STALE_SECONDS):
                    db.execute("UPDATE entries SET state = ? WHERE name = ?", (_REMOVING, name))
                    victims[:] = [db.execute("SELECT name, file, size FROM entries WHERE name = ?", (name,)).fetchone()]
                else:
                    return "taken"
            if victims:  # its writer is gone: remove what it left, then claim it again
                return "taken"
            total = db.execute("SELECT bytes FROM total").fetchone()[0]
            disk = shutil.disk_usage(self.directory)
            needed = max(total + stored - self.max_bytes, min_free_bytes(disk.total) - disk.free + stored)
            if needed > 0:
                for victim in db.execute("SELECT name, file, size FROM entries WHERE state = ? "
                                         "ORDER BY next IS NOT NULL, next DESC, used", (_READY,)):
                    victims.append(victim)
                    needed -= victim[2]
                    if needed <= 0:
                        break
                if needed > 0:
                    victims.clear()
                    return "no room"
                db.executemany("UPDATE entries SET state = ? WHERE name = ?", [(_REMOVING, v[0]) for v in victims])
            file = hashlib.sha256(name.encode()).hexdigest()
            db.execute("INSERT INTO entries (name, file, size, state, owner, used) VALUES (?, ?, ?, ?, ?, ?)",
                       (name, f"{file[:2]}/{file[2:]}", stored, _WRITING, os.getpid(), time.time()))
            db.execute("UPDATE total SET bytes = bytes + ?", (stored,))
        return "mine"

    def _write(self, name: str, data: memoryview) -> None:
        db = self._db()
        row = db.execute("SELECT file FROM entries WHERE name = ? AND owner = ? AND state = ?",
                         (name, os.getpid(), _WRITING)).fetchone()
        if row is None:  # cleared meanwhile
            return
        file = row[0]
        target = self.directory / "blobs" / file
        partial = self.directory / "tmp" / f"{file.replace('/', '')}.{os.getpid()}.{threading.get_ident()}"
        try:
            with open(partial, "wb") as out:
                out.write(crc32c.crc32c(data).to_bytes(4, "little"))
                out.write(data)
            target.parent.mkdir(exist_ok=True)
            os.replace(partial, target)
        except OSError as error:  # a full or failing disk: the bytes are still returned, only not kept
            partial.unlink(missing_ok=True)
            self._drop(name, _WRITING)
            self._warn_full(error)
            return
        db.execute("UPDATE entries SET state = ?, used = ? WHERE name = ?", (_READY, time.time(), name))

    def _warn_full(self, error: OSError | sqlite3.Error) -> None:
        """Say once that the cache's disk is full, and read without the cache for `FULL_SECONDS`."""
        self._full_until = time.monotonic() + FULL_SECONDS
        reason = getattr(error, "strerror", None) or str(error)
        self._warn_once("write", f"the cache {self.directory} cannot keep what is fetched ({reason}): reading "
                        "goes on from the object store, fetching it again each epoch; free space on that disk, "
                        "or give another cache_dir=")

    def _warn_once(self, kind: str, message: str) -> None:
        """An `OutcoreWarning` the first time this process meets ``kind`` of trouble with this cache."""
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, OutcoreWarning, stacklevel=4)

    def _drop(self, name: str, state: int) -> None:
        """Remove entry ``name`` if it is still in ``state``."""
        db = self._db()
        with _transaction(db):
            row = db.execute("SELECT name, file, size FROM entries WHERE name = ? AND state = ?",
                             (name, state)).fetchone()
            if row is None:
                return
            db.execute("UPDATE entries SET state = ? WHERE name = ?", (_REMOVING, name))
        self._remove([row])

    def _remove(self, rows: list[tuple[str, str, int]]) -> None:
        """Delete the files of entries marked for removal, then their rows (a crash in between leaves
        them marked, for `reconcile`)."""
        if not rows:
            return
        for _, file, _ in rows:
            (self.directory / "blobs" / file).unlink(missing_ok=True)
            for partial in (self.directory / "tmp").glob(f"{file.replace('/', '')}.*"):
                partial.unlink(missing_ok=True)
        db = self._db()
        with _transaction(db):
            for name, _, size in rows:
                if db.execute("DELETE FROM entries WHERE name = ? AND state = ?", (name, _REMOVING)).rowcount:
                    db.execute("UPDATE total SET bytes = bytes - ?", (size,))


def _disk_full(error: OSError | sqlite3.Error) -> bool:
    """Whether ``error`` says the cache's disk (or quota) is full: the cache then reads without keeping."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    return "full" in str(error)  # sqlite3: "database or disk is full"


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an error): one writer at a time across processes."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


_INHERITED: list[sqlite3.Connection] = []  # connections a forked child got from its parent: never closed


def _close_connections(connections: list[tuple[int, sqlite3.Connection]]) -> None:
    """Close this process's connections of a cache no longer used. Those a forked child inherited are kept
    open (closing them would release the parent's locks on the index) and referenced for good."""
    for pid, db in connections:
        if pid == os.getpid():
            db.close()
        else:
            _INHERITED.append(db)
    connections.clear()


def _new_setup_lock() -> None:
    global _SETUP_LOCK
    _SETUP_LOCK = threading.Lock()  # a forked child does not have the thread that may have held it


os.register_at_fork(after_in_child=_new_setup_lock)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
