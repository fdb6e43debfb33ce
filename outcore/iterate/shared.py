"""Batches handed from Dask workers to a consumer on the same machine through shared memory, not sockets.

A cluster run's consumer opens a `Mailbox`: a folder of its own in the machine's shared-memory
filesystem (``/dev/shm``). Its `Slot` (small, picklable) goes to the workers with each task. A worker
that sees the folder is on the consumer's machine: it makes each batch's large arrays straight into
files of that folder (`Slot.arena`, one file per array) and returns only their names (`SharedBatch`);
the consumer maps the files, and has the batch without a copy or a socket.

Files are recycled, because fresh shared memory is slow to touch (every page is allocated and
zeroed on first use: measured at 6x the cost of writing reused memory, a fifth of a JPEG decode):
when every array of a batch is gone from the consumer, the file is renamed ``free-<size>-...`` and
the next batch of that size is made in it. Nothing the consumer still holds is ever written again.
Mapping a file costs too (its page tables): workers and consumer keep their mappings of the files
they have seen (`outcore.iterate.mappings`), and a worker takes back its own free files first. A new
file's room is reserved with ``posix_fallocate``, so a full ``/dev/shm`` (Docker's default is 64 MB)
means plain memory for that array, never a crash, and an `OutcoreWarning` (once per run) saying so.

A worker that cannot see the folder (another machine, another container), finds no room, or makes a
small array (under `SHARED_MIN_BYTES`) puts the array in the `SharedBatch` itself, which Dask sends
over its sockets: the batches are the same either way. ``OUTCORE_SHARED_MEMORY=0`` turns the shared
path off.

The folder goes when the run closes; the free files it received batches in go to the process's newest
mailbox still open (the next epoch's run, started as this one drains), or wait in a spare folder of the
consumer's process for the next run, which starts with reused memory, and go when the process exits
(free files a run took over and never needed go with its folder: a process keeps what its last run
used, not the most it ever held).
A consumer killed before that leaves its folders behind: each holds a lock on a file in it for its
life, and a new mailbox removes the folders whose lock is free (their consumer is gone), so nothing
piles up.

>>> mailbox = Mailbox.open()  # in the consumer (None without /dev/shm)
>>> arena = mailbox.slot.arena()  # on a worker, for one batch
>>> batch = {"x": arena.empty((1024, 1024), np.dtype("uint8"))}
>>> batch["x"].fill(7)
>>> int(mailbox.receive(arena.publish(batch))["x"].sum())  # in the consumer
7340032
>>> mailbox.close()
"""

from __future__ import annotations

import atexit
import contextlib
import math
import mmap
import os
import shutil
import threading
import warnings
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from ..errors import ClusterError, OutcoreWarning
from ..format import offsets_name, ragged_names
from ..imaging import LEAD
from .batch import join_field, joined_offsets, plain
from .mappings import kept_mappings, open_file

try:
    import fcntl
except ImportError:  # Windows: no /dev/shm either; batches travel over sockets
    fcntl = None  # type: ignore[assignment]

SHARED_ROOT = Path("/dev/shm")
ENVIRONMENT = "OUTCORE_SHARED_MEMORY"
PREFIX = "outcore-batches-"
LOCK = "owner.lock"
FREE = "free-"  # a recycled file: free-<size>-<name>
SPARE = "spare-"  # a process's folder of free files between its mailboxes: outcore-batches-<pid>-spare-<id>
PRUNE_SECONDS = 1.0  # how often taking a free file lets go of the mappings of files removed meanwhile
SHARED_MIN_BYTES = 1 << 18  # smaller arrays travel in the task's answer: a file costs more than they do


@dataclass(frozen=True)
class SharedArray:
    """An array a worker wrote into file ``name`` of the mailbox."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def file_size(self) -> int:
        """The size of its file: the array's bytes, `LEAD` bytes into it (as plain batch arrays start)."""
        return LEAD + self.nbytes


@dataclass(frozen=True)
class SharedBatch:
    """A batch whose arrays (all or some: the others travel in ``fields`` themselves) wait in the mailbox;
    ``no_room``: the worker saw the mailbox but found no room there for an array it sends itself."""

    fields: dict[str, SharedArray | np.ndarray]
    no_room: bool = False


@dataclass(frozen=True)
class Slot:
    """Where the workers put the batches of one consumer: a folder, if they see it (same machine)."""

    folder: str

    def seen(self) -> bool:
        """Whether this process sees the folder: it is on the consumer's machine, and the consumer's run is
        open (its folder goes when it closes)."""
        return Path(self.folder).is_dir()

    def arena(self, part: Part | None = None) -> Arena:
        """The allocator of one batch's arrays (or of one ``part`` of a batch): in the folder when this
        process sees it, else plain memory."""
        return Arena(Path(self.folder) if self.seen() else None, part)


@dataclass(frozen=True)
class Part:
    """A worker's part of a batch of ``size`` samples: its rows ``[offset, offset + n)`` of the batch's files
    ``<batch>-<field>``, which the other parts' workers write beside it (`Arena`)."""

    batch: str
    offset: int
    size: int


class Arena:
    """Allocates one batch's arrays as files of the mailbox (``empty``) and says where they are
    (``publish``); without a folder, or room in it, arrays are plain memory and travel in the
    `SharedBatch` itself. With a `Part`, the arrays are the part's rows of the batch's files, one per
    field, that the workers making the other parts write too (`join_parts` puts the batch together)."""

    def __init__(self, folder: Path | None, part: Part | None = None) -> None:
        self.folder, self.part = folder, part
        self.prefix = uuid4().hex[:12]
        self.made: dict[int, tuple[SharedArray, np.ndarray]] = {}  # id(array) -> its file (and it, to keep the id)
        self.no_room = False

    def empty(self, shape: tuple[int, ...], dtype: np.dtype, field: str = "") -> np.ndarray:
        """A new uninitialized array (of field ``field``): in a file of the mailbox (a recycled one of its
        size, if any) when there is a mailbox with room for it and the array is not small (the whole
        batch's, for a part); else in plain memory."""
        dtype = np.dtype(dtype)
        rows = shape[0] if self.part is None else self.part.size
        size = int(np.prod((rows, *shape[1:]), dtype=np.int64)) * dtype.itemsize
        if self.folder is None or size < SHARED_MIN_BYTES or dtype.hasobject:
            return plain(shape, dtype)
        if self.part is not None and dtype.kind in "US":  # text: each part as wide as its own widest
            return plain(shape, dtype)
        if self.part is not None:
            return self._part_of(f"{self.part.batch}-{field}", shape, dtype, size)
        shared = SharedArray(f"{self.prefix}-{len(self.made)}", dtype.str, tuple(shape))
        try:
            mapped = self._recycled(shared.name, shared.file_size) or self._new(shared.name, shared.file_size)
        except OSError:  # no room (a small /dev/shm), or the run was closed meanwhile: plain memory
            self.no_room = True
            return plain(shape, dtype)
        array = np.frombuffer(mapped, dtype, size // dtype.itemsize, LEAD).reshape(shape)
        self.made[id(array)] = (shared, array)
        return array

    def _part_of(self, name: str, shape: tuple[int, ...], dtype: np.dtype, size: int) -> np.ndarray:
        """This part's rows of file ``name`` of the whole batch: made by the first worker to ask (in a free file
        of its size, if any), mapped by the others; plain memory without room, or where the file was made
        with another size (the parts disagree on the batch's shape: `join_parts` then says so)."""
        assert self.folder is not None and self.part is not None
        path, private, file_size = self.folder / name, f".{uuid4().hex[:12]}", LEAD + size
        try:
            if not path.exists():
                if _take_free(self.folder, private, file_size) is None:
                    os.close(open_file(self.folder / private, file_size, create=True))  # made, its room reserved
                try:
                    os.link(self.folder / private, path)  # atomic: fails where another worker made it first
                except FileExistsError:
                    free_file(self.folder, private, file_size)
                else:
                    (self.folder / private).unlink()
            row = size // self.part.size
            first = LEAD + self.part.offset * row  # only this part's pages
            last = first + shape[0] * row
            status = path.stat()
            if status.st_size != file_size or not first < last <= file_size:
                return plain(shape, dtype)
            start = first - first % mmap.ALLOCATIONGRANULARITY
            mapped = kept_mappings.map(path, last - start, start=start, status=status)
        except OSError:  # no room (a small /dev/shm), or the run was closed meanwhile
            self.no_room = True
            return plain(shape, dtype)
        rows = np.frombuffer(mapped, dtype, (last - first) // dtype.itemsize, first - start).reshape(shape)
        self.made[id(rows)] = (SharedArray(name, dtype.str, (self.part.size, *shape[1:])), rows)
        return rows

    def _recycled(self, name: str, size: int) -> mmap.mmap | None:
        """A free file of ``size`` bytes, taken (`_take_free`: one this process has mapped before, if any)
        and mapped; None when there is none."""
        assert self.folder is not None
        if _take_free(self.folder, name, size, kept_mappings.inodes()) is None:
            return None
        try:
            return kept_mappings.map(self.folder / name, size)
        except OSError:
            free_file(self.folder, name, size)  # back with the free ones, for another batch
            raise

    def _new(self, name: str, size: int) -> mmap.mmap:
        """A new file of ``size`` bytes, its room reserved, mapped (a file no one else knows of yet: removed
        if that fails)."""
        assert self.folder is not None
        try:
            return kept_mappings.map(self.folder / name, size, create=True)
        except OSError:
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()
            raise

    def discard(self, keep: Collection[str] = ()) -> None:
        """The files made but those named in ``keep`` go back to the free ones (all of them: the batch will not be
        published, its run stopped first); the arena starts afresh."""
        if self.folder is not None and self.part is None:
            for shared, _ in self.made.values():
                if shared.name not in keep:
                    free_file(self.folder, shared.name, shared.file_size)
        self.made.clear()

    def publish(self, batch: dict[str, np.ndarray]) -> SharedBatch:
        """The batch as the consumer will find it: arrays made by `empty` by file name, others copied into
        new files (a transform's outputs), or, when small or without room, themselves. Files made and
        not in the batch are freed for the next batch."""
        fields: dict[str, SharedArray | np.ndarray] = {}
        for name, array in batch.items():
            if id(array) not in self.made:
                copy = self.empty(array.shape, array.dtype, field=name)
                copy[...] = array
                array = copy
            fields[name] = self.made[id(array)][0] if id(array) in self.made else array
        self.discard(keep={shared.name for shared in fields.values() if isinstance(shared, SharedArray)})
        return SharedBatch(fields, self.no_room)


class Mailbox:
    """The consumer's folder in shared memory (`Slot` for the workers), or none: `open` gives None where
    there is no shared-memory filesystem or ``OUTCORE_SHARED_MEMORY=0``."""

    def __init__(self, folder: Path, lock: Any) -> None:
        self.folder, self._lock = folder, lock
        self.slot = Slot(str(folder))
        self.warned = False
        self.used: set[int] = set()  # the inodes of the files batches were received in

    @classmethod
    def open(cls, root: Path = SHARED_ROOT) -> Mailbox | None:
        """A new mailbox under ``root``, after removing those their consumers left behind, holding the free
        files this process's earlier mailboxes left (an epoch's run then starts with reused memory);
        None if shared memory is off or ``root`` cannot be written."""
        if os.environ.get(ENVIRONMENT, "1") == "0" or fcntl is None or not os.access(root, os.W_OK):
            return None
        _sweep(root)
        mailbox = cls._made(root)
        spare = _spares(root)
        if mailbox is not None and spare is not None:
            _move_free(spare.folder, mailbox.folder)
        if mailbox is not None:
            with _open_lock:
                _open.append((os.getpid(), mailbox))
        return mailbox

    @classmethod
    def _made(cls, root: Path, kind: str = "") -> Mailbox | None:
        name = f"{os.getpid()}-{kind}{uuid4().hex[:8]}"
        making, folder = root / f".{name}", root / f"{PREFIX}{name}"  # locked before a sweep can see it
        try:
            making.mkdir(mode=0o700)
            lock = open(making / LOCK, "w")  # noqa: SIM115 - held for the mailbox's life
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            making.rename(folder)
        except OSError:
            shutil.rmtree(making, ignore_errors=True)
            return None
        return cls(folder, lock)

    def receive(self, made: SharedBatch | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch a worker made, its files mapped into this process."""
        if not isinstance(made, SharedBatch):
            return made
        if made.no_room:
            self.warn_no_room()
        return {name: self._take(value) if isinstance(value, SharedArray) else value
                for name, value in made.fields.items()}

    def warn_no_room(self) -> None:
        """Say once that workers found no room here: an `OutcoreWarning` naming what to do."""
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"no room in {self.folder.parent} for batches in shared memory: workers on this machine send "
                "them over sockets instead (the same batches, slower). Give it room (docker run --shm-size=2g, "
                f"a memory-backed /dev/shm on Kubernetes), or set {ENVIRONMENT}=0 to choose sockets",
                OutcoreWarning, stacklevel=3,
            )

    def take(self, shared: SharedArray) -> np.ndarray:
        """The array in file ``shared.name`` (a batch that workers wrote parts of: `Part`), mapped into this
        process, its name taken at once (no worker opens it by name again); freed for another batch once
        dropped."""
        taken = f"taken-{uuid4().hex[:12]}"
        try:
            os.rename(os.path.join(self.folder, shared.name), os.path.join(self.folder, taken))
        except OSError as error:
            raise batch_gone(self.folder, error) from None
        return self._take(SharedArray(taken, shared.dtype, shared.shape))

    def _take(self, shared: SharedArray) -> np.ndarray:
        """The array in file ``shared.name``, mapped (the mapping kept from the file's last batch, if any);
        the file is freed for another batch once the consumer has dropped every array of it (its views
        keep the array this returns a view of alive)."""
        array, inode = mapped_file(self.folder, shared)
        self.used.add(inode)
        weakref.finalize(array, free_file, self.folder, shared.name, shared.file_size)
        return array.reshape(shared.shape)

    def close(self, keep_free: bool = True) -> None:
        """Hand the free files this run received batches in to this process's newest mailbox still open (the
        next epoch's), or keep them for its next one (unless ``keep_free`` is False: its processes went idle),
        and remove the folder with what is left in it (free files taken over and never needed: a process keeps
        what its last run used, not the most it ever held; batches still held by the consumer, whose memory
        lives on while they do; batches made and never taken; files a worker may still be writing)."""
        with _open_lock:
            _open[:] = [(pid, box) for pid, box in _open if box is not self and pid == os.getpid()]
            heirs = [box for _, box in _open if box.folder.parent == self.folder.parent]
        heir = heirs[-1] if heirs else _spares(self.folder.parent) if keep_free else None
        if heir is not None and heir is not self:
            _move_free(self.folder, heir.folder, self.used)
        shutil.rmtree(self.folder, ignore_errors=True)
        self._lock.close()
        kept_mappings.prune()  # the mappings of the files that went with the folder


_spare: dict[Path, tuple[int, Mailbox | None]] = {}  # root -> (pid, this process's folder of spare files)
_open: list[tuple[int, Mailbox]] = []  # the mailboxes open now (and the pid of their process), oldest first
_open_lock = threading.Lock()


def _spares(root: Path) -> Mailbox | None:
    """This process's folder under ``root`` for free files between mailboxes (made when first needed,
    removed at exit; a killed process's is swept like a mailbox)."""
    pid, spare = _spare.get(root, (0, None))
    if pid != os.getpid():  # none yet, or the parent's (a forked child)
        spare = Mailbox._made(root, SPARE)
        _spare[root] = (os.getpid(), spare)
        if spare is not None:
            atexit.register(spare.close)
    return spare


def _move_free(source: Path, target: Path, only: Collection[int] | None = None) -> None:
    """Move the free files of folder ``source`` (those of inodes ``only``, when given) into ``target`` (one
    filesystem: renames; the mappings of them kept by any process stay good, `outcore.iterate.mappings`)."""
    free: list[str] = []
    with contextlib.suppress(OSError), os.scandir(source) as entries:
        free = [entry.name for entry in entries
                if entry.name.startswith(FREE) and (only is None or entry.inode() in only)]
    for name in free:
        with contextlib.suppress(OSError):  # taken meanwhile by a worker still running
            os.rename(source / name, target / name)


def join_parts(parts: Sequence[SharedBatch | Mapping[str, np.ndarray]], sizes: Sequence[int],
               mailbox: Mailbox | None) -> dict[str, np.ndarray]:
    """The batch that workers' ``parts`` of it make (in order, ``sizes`` samples each; `Part`): a field
    written side by side in shared memory is mapped from ``mailbox``, the parts sent as arrays (small, or
    without room) copied into it or joined.

    >>> join_parts([{"x": np.arange(2)}, {"x": np.arange(3)}], [2, 3], None)["x"].tolist()
    [0, 1, 0, 1, 2]
    """
    fields = [part.fields if isinstance(part, SharedBatch) else part for part in parts]
    if mailbox is not None and any(isinstance(part, SharedBatch) and part.no_room for part in parts):
        mailbox.warn_no_room()
    offsets = np.cumsum([0, *sizes]).tolist()
    ragged = {offsets_name(name) for name in ragged_names(fields[0])}
    batch = {}
    for name in fields[0]:
        pieces = [part[name] for part in fields]
        shared = next((piece for piece in pieces if isinstance(piece, SharedArray)), None)
        if shared is None:  # a ragged field's offsets (plain memory, always) run on across the parts
            batch[name] = joined_offsets(pieces) if name in ragged else join_field(pieces, name)
            continue
        if mailbox is None or any(isinstance(piece, SharedArray) and piece != shared for piece in pieces):
            raise ClusterError(f"the parts of a batch disagree on field {name!r}: {pieces}")
        batch[name] = whole = mailbox.take(shared)
        for piece, offset, size in zip(pieces, offsets[:-1], sizes, strict=True):
            if not isinstance(piece, SharedArray):
                if piece.shape[1:] != whole.shape[1:] or len(piece) != size or piece.dtype != whole.dtype:
                    raise ClusterError(f"the parts of a batch disagree on field {name!r}: {piece.dtype}{piece.shape} "
                                       f"against {whole.dtype}{whole.shape}")
                whole[offset : offset + size] = piece
    return batch


def _take_free(folder: Path, name: str, size: int, mine: Collection[int] = ()) -> int | None:
    """The inode of the free file of ``size`` bytes in ``folder`` taken, renamed ``name`` (another worker
    taking it too fails), one of inodes ``mine`` if any is free; None when none was."""
    with os.scandir(folder) as entries:
        free = {entry.inode(): entry.name for entry in entries if entry.name.startswith(f"{FREE}{size}-")}
    kept_mappings.prune(every=PRUNE_SECONDS)  # the files removed since (with the folders of runs closed)
    for inode in sorted(free, key=lambda inode: inode not in mine):
        try:
            os.rename(folder / free[inode], folder / name)
        except OSError:  # taken by another worker first
            continue
        return inode
    return None


def batch_gone(folder: Path, error: OSError | str) -> ClusterError:
    """The error of a run whose files in shared memory (in ``folder``) went while it used them."""
    return ClusterError(
        f"a worker's batch in shared memory is gone ({error}): something removed files of "
        f"{folder} while the run was using it. Set {ENVIRONMENT}=0 to have batches sent over sockets instead"
    )


def mapped_file(folder: Path, shared: SharedArray) -> tuple[np.ndarray, int]:
    """The array in file ``shared.name`` of ``folder``, flat, mapped (the mapping kept from the file's last batch,
    if any), and the file's inode. A file gone, or of another size than the array makes (never mapped: reading
    past its end would crash the process), is a `ClusterError` that names it."""
    dtype, path, size = np.dtype(shared.dtype), os.path.join(folder, shared.name), shared.file_size
    try:
        status = os.stat(path)
        if status.st_size != size:
            raise ClusterError(
                f"a worker's batch file {shared.name} in {folder} holds {status.st_size} bytes where a "
                f"{shared.dtype}{shared.shape} array makes {size}: a worker of another outcore "
                "version wrote it. Install the same outcore on the workers and the consumer"
            )
        mapped = kept_mappings.map(path, size, status=status)
    except OSError as error:
        raise batch_gone(folder, error) from None
    return np.frombuffer(mapped, dtype, (size - LEAD) // dtype.itemsize, LEAD), status.st_ino


def free_file(folder: Path, name: str, size: int) -> None:
    """File ``name`` may be written again: rename it for the next batch of its size (nothing if the
    mailbox is gone)."""
    with contextlib.suppress(OSError):  # paths joined as strings: a batch's files are freed on the consumer's thread
        os.rename(os.path.join(folder, name), os.path.join(folder, f"{FREE}{size}-{name}"))


def _sweep(root: Path) -> None:
    """Remove the mailboxes under ``root`` whose consumer is gone (nobody holds their lock)."""
    for folder in root.glob(f"{PREFIX}*"):
        try:
            with open(folder / LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its consumer lives (or the folder just went)
            continue
        shutil.rmtree(folder, ignore_errors=True)



def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a mapped file: a batch a worker handed over through shared memory.

    >>> is_mapped(np.zeros(3))
    False
    """
    base: Any = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False
