"""Memory for decoded pictures and batches, used again: a large array is made in a block of memory that comes
back once nothing refers to it (the batch dropped, with every view of it), and the next array of its size is
made in that block, which is mapped already.

Why: a new array of a few megabytes is new pages. The kernel zeroes each one at its first write (8 % of the
CPU time of a batch copied out of its pixel chunks, measured: docs/benchmarks.md, "Figures behind the code"),
and glibc gives the block back to the kernel when it is freed (``munmap``, ``madvise``), holding the GIL and
the process's memory map, which the page faults of every other thread wait for: on many cores, the threads
making batches take turns in the kernel.

How a block comes back: the array is made over a ``ctypes`` view of the block, which numpy keeps alive as long
as any array made from it (slices, reshapes, a ``torch.from_numpy`` tensor of it, a ``memoryview``); the block
is kept for the next array once that view is gone (a weak reference's callback). So an array handed out is never
written again while anything refers to it. Blocks are kept unused up to the most bytes of them that were in use at
once (when a new one had to be made), at least `KEEP_BYTES` and at most `MOST_KEPT_BYTES`: a loader's batches under way,
queued and held by its consumer come back to blocks enough for them all, however many threads make them (with a
fixed amount, the blocks past it went back to glibc at every peak and were made again, zeroed, at the next). None
of those handed out before `let_go` are kept (a process whose batches are made by loader processes from then on).

>>> pictures = empty((16, 224, 224, 3), np.uint8)
>>> pictures.nbytes, pictures.ctypes.data % ALIGN == LEAD
(2408448, True)
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import threading
import weakref

import numpy as np

# Arrays start LEAD bytes past a multiple of ALIGN: libjpeg-turbo's SIMD colour conversion writes a decoded row that
# starts on a multiple of 32 bytes with non-temporal stores, which bypass the caches and make each decode slower;
# numpy's arrays start at either, as malloc places them (docs/benchmarks.md, "Figures behind the code").
ALIGN, LEAD = 32, 16
SMALLEST = 1 << 20  # smaller arrays come from the heap as they are (glibc keeps those mapped)
KEEP_BYTES = 256 << 20  # blocks kept unused: up to this, or to as many as were in use at once (about: a thread or two
# may each add one more)
MOST_KEPT_BYTES = 1 << 30  # and never more than this, however many were in use at once


class Blocks:
    """Blocks of memory handed out as arrays (`empty`) and kept, once nothing refers to them, for the next array
    of their size, the most recent first: up to ``keep_bytes`` of them, or as many bytes as were in use at once
    when a new block was made (`peak`), up to ``most_bytes``.

    >>> blocks = Blocks()
    >>> a = blocks.empty((2, 1024, 1024), np.uint8)
    >>> address = a.ctypes.data
    >>> view = a[1:]
    >>> del a
    >>> blocks.empty((2, 1024, 1024), np.uint8).ctypes.data == address  # its view still refers to the block
    False
    >>> del view
    >>> blocks.empty((1024, 1024), np.uint16).ctypes.data == address  # nothing does: made in the same block
    True
    """

    def __init__(self, keep_bytes: int = KEEP_BYTES, most_bytes: int = MOST_KEPT_BYTES) -> None:
        self.keep_bytes, self.most_bytes = keep_bytes, most_bytes
        self.peak = 0  # the most bytes of blocks in use at once, counted when a new block is made
        self.free: list[np.ndarray] = []  # blocks back, oldest first: appended by `_gone`, taken under the lock
        self.lock = threading.Lock()  # taken by `empty` only: `_gone` may run in any thread, at any allocation
        # the views handed out: id(weak ref) -> (it, its block, the block's number)
        self.watched: dict[int, tuple[weakref.ref, np.ndarray, int]] = {}
        self.numbers = itertools.count()  # of the blocks handed out (`next` of a count is one C call: no lock)
        self.keep_from = 0  # blocks numbered before are not kept when they come back (`let_go`)

    def empty(self, shape: tuple[int, ...], dtype: np.typing.DTypeLike) -> np.ndarray:
        """A new uninitialized array (not of objects) starting `LEAD` bytes past a multiple of `ALIGN`: made in a
        block that came back where one of its size did (`SMALLEST` bytes or more)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < SMALLEST:
            return _aligned(nbytes).view(dtype).reshape(shape)
        block = self._reuse(nbytes)
        made = block is None
        if made:
            block = _aligned(nbytes)
        view = (ctypes.c_char * nbytes).from_buffer(block)
        watch = weakref.ref(view, self._gone)  # C's weak reference: `weakref.finalize` is Python code at both ends
        self.watched[id(watch)] = (watch, block, next(self.numbers))
        if made:  # the blocks wanted at once now: as many are kept once back (a list of a dict's values: one C call)
            self.peak = max(self.peak, sum(held.nbytes for _, held, _ in list(self.watched.values())))
        return np.frombuffer(view, dtype).reshape(shape)

    def keeps(self) -> int:
        """The most bytes of blocks kept unused now: ``keep_bytes``, or as many as were in use at once (`peak`), up to
        ``most_bytes``.

        >>> Blocks(keep_bytes=1 << 20, most_bytes=1 << 30).keeps()
        1048576
        """
        return max(self.keep_bytes, min(self.most_bytes, self.peak))

    def _reuse(self, nbytes: int) -> np.ndarray | None:
        """A kept block of ``nbytes``, the most recent; None where none is kept, the oldest of the others then let go
        until a new one fits with them (`keeps`: blocks of sizes no longer asked for do not stay in the way)."""
        with self.lock:
            free = self.free
            for k in range(len(free) - 1, -1, -1):  # `_gone` only appends: the indices here stay
                if free[k].nbytes == nbytes:
                    return free.pop(k)
            kept = sum(block.nbytes for block in free)
            while free and kept + nbytes > self.keeps():
                kept -= free.pop(0).nbytes
        return None

    def _gone(self, watch: weakref.ref) -> None:
        """Keep the block of the view ``watch`` watched, now gone, unless as much is kept already (`keeps`; no lock: a
        weak reference's callback may run inside `_reuse`, in the thread holding it; a count read while another thread
        changes the list is off by a block at most)."""
        _, block, number = self.watched.pop(id(watch))
        if number >= self.keep_from and sum(kept.nbytes for kept in list(self.free)) + block.nbytes <= self.keeps():
            self.free.append(block)

    def let_go(self) -> None:
        """Keep none of the blocks kept or handed out so far: each goes back to the heap once nothing refers to it
        (a process whose arrays are made elsewhere from now on: `outcore.iterate.process.StartingRun`). Blocks
        handed out from now on are kept as before.

        >>> blocks = Blocks()
        >>> before = blocks.empty((1024, 1024), np.uint8)
        >>> blocks.let_go()
        >>> after = blocks.empty((1024, 1024), np.uint8)
        >>> del before, after
        >>> len(blocks.free)  # only the block handed out after
        1
        """
        self.keep_from = next(self.numbers)
        self.peak = 0
        self.free = []  # a `_reuse` under way pops from the list it found


def empty(shape: tuple[int, ...], dtype: np.typing.DTypeLike) -> np.ndarray:
    """A new uninitialized array, made by the process's `Blocks` (one of objects: by numpy, as ever)."""
    return np.empty(shape, dtype) if np.dtype(dtype).hasobject else BLOCKS.empty(shape, dtype)


def let_go() -> None:
    """Keep none of the process's blocks kept or handed out so far (`Blocks.let_go`)."""
    BLOCKS.let_go()


def _aligned(nbytes: int) -> np.ndarray:
    memory = np.empty(nbytes + ALIGN, np.uint8)
    start = (LEAD - ctypes.addressof(ctypes.c_char.from_buffer(memory))) % ALIGN  # ndarray.ctypes: Python, slower
    return memory[start : start + nbytes]


BLOCKS = Blocks()  # the process's


def _forget_after_fork() -> None:
    """A forked child has its own blocks, and a lock that no thread of the parent may hold there."""
    global BLOCKS
    BLOCKS = Blocks(BLOCKS.keep_bytes, BLOCKS.most_bytes)


os.register_at_fork(after_in_child=_forget_after_fork)
