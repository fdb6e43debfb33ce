"""The process's one pool of threads for reading, decoding and resizing, sized from the CPUs it may use.

``os.cpu_count()`` counts the host's cores: a job given 8 CPUs of a 96-core machine (Slurm, a
Kubernetes limit, ``taskset``) would start 96 threads where 8 can run. `available_cpus` reads the
CPU affinity and the cgroup CPU quota instead. One pool, made when first used and kept for the
process's life, serves every chunk read, decode and resize, so a process never runs more of them at
once than `thread_count` says: by default the available CPUs, divided among the DataLoader workers
when a process is one of them (`share_cpus`), so that their total stays within the CPUs; the
``OUTCORE_THREADS`` environment variable or `set_threads` choose another number.

A forked child does not inherit running threads: the pool is made again in the child when it is
first used there. `for_each_run` shares the runs of a call between the calling thread and the pool's free
threads: a pool thread may call it (a batch made there) without waiting on work queued behind it.

>>> for_each(print, 2)  # doctest: +SKIP
0
1
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .errors import OptionError

ENVIRONMENT = "OUTCORE_THREADS"
IO_ENVIRONMENT = "OUTCORE_IO_THREADS"
IO_THREADS = 64  # the most requests to object stores in flight at once, by default: see `io_thread_count`
BLOCKS_PER_THREAD = 4  # for_each: runs of items per thread, enough to even out uneven items
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUP = Path("/proc/self/cgroup")  # which cgroup(s) this process is in
QUOTA_SECONDS = 5.0  # the cgroup CPU quota is read again after this long (not at every batch: files to read)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_chosen: int | None = None  # set_threads
_shares = 1  # share_cpus: the processes this one shares its CPUs with (itself included)
_cap: int | None = None  # cap_threads: a worker of a Dask cluster uses at most its own threads
_pending = 0  # the pool's tasks submitted and not finished (`_free_threads`)
_pending_lock = threading.Lock()
_io_pool: ThreadPoolExecutor | None = None
_io_pool_pid = 0
_io_pool_size = 0
_request_pool: ThreadPoolExecutor | None = None
_request_pool_pid = 0
_quota_read: tuple[float, tuple[Path, Path], float | None] | None = None  # (when, which files, quota)


def available_cpus() -> int:
    """The CPUs this process may run on: its CPU affinity, capped by its cgroups' CPU quota (v2
    ``cpu.max`` or v1 ``cpu.cfs_quota_us``, the process's cgroup and its ancestors), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, math.ceil(quota)) if quota else cpus)


def _cgroup_quota() -> float | None:
    """CPUs allowed by the CPU quotas of this process's cgroup and its ancestors (the smallest), or None
    when none sets one (or none can be read); read again once `QUOTA_SECONDS` have passed (a quota
    rarely changes, and the thread count is asked for at every batch: on 2 cores, reading its files cost
    a Dask worker about 1 % of its time)."""
    global _quota_read
    now, files = time.monotonic(), (CGROUP_ROOT, OWN_CGROUP)
    if _quota_read is None or _quota_read[1] != files or now - _quota_read[0] >= QUOTA_SECONDS:
        _quota_read = (now, files, _read_cgroup_quota())
    return _quota_read[2]


def _read_cgroup_quota() -> float | None:
    quotas = []
    for path in _cgroup_cpu_files():
        try:
            quota = _cpu_max(path) if path.name == "cpu.max" else _cfs_quota(path)
        except (OSError, ValueError, IndexError):
            continue
        if quota:
            quotas.append(quota)
    return min(quotas) if quotas else None


def _cgroup_cpu_files() -> list[Path]:
    """The quota files of this process's cgroup and its ancestors: v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``."""
    try:
        lines = OWN_CGROUP.read_text().splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        _, controllers, where = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            top, name = CGROUP_ROOT, "cpu.max"
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            top, name = CGROUP_ROOT / controllers, "cpu.cfs_quota_us"
        else:
            continue
        folder = top / where.strip("/")
        files += [path / name for path in (folder, *folder.parents) if path == top or top in path.parents]
    return files


def _cpu_max(path: Path) -> float | None:
    quota, period = path.read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _cfs_quota(path: Path) -> float | None:
    quota = int(path.read_text())
    period = int((path.parent / "cpu.cfs_period_us").read_text())
    return None if quota <= 0 else quota / period


def thread_count() -> int:
    """How many threads the pool has: `set_threads`'s number, else ``OUTCORE_THREADS``, else the
    available CPUs divided among the processes that share them (`share_cpus`)."""
    if _chosen is not None:
        return _chosen
    chosen = os.environ.get(ENVIRONMENT)
    if chosen:
        try:
            return _checked(int(chosen), ENVIRONMENT)
        except ValueError:
            raise OptionError(f"{ENVIRONMENT}={chosen!r} must be a whole number of threads, 1 or more") from None
    shared = max(1, available_cpus() // _shares)
    return shared if _cap is None else min(shared, _cap)


def set_threads(count: int | None) -> None:
    """Use ``count`` threads from now on (None: back to the default). Read by the next read or decode.

    >>> outcore.set_threads(4)  # doctest: +SKIP
    """
    global _chosen
    _chosen = None if count is None else _checked(count, "set_threads")
    _replace_pool()


def sharing() -> int:
    """The processes that share this one's CPUs and memory (the DataLoader workers of one loader, `share_cpus`),
    itself included: 1 by default."""
    return _shares


def share_cpus(processes: int) -> None:
    """This process is one of ``processes`` that share the CPUs (DataLoader workers): take its part."""
    global _shares
    if _shares != max(1, int(processes)):
        _shares = max(1, int(processes))
        _replace_pool()


def cap_threads(count: int) -> None:
    """Use at most ``count`` threads by default (a Dask worker: the threads its cluster gave it, so that the
    workers of a machine together stay within its CPUs); `set_threads` and ``OUTCORE_THREADS`` still win."""
    global _cap
    if _cap != max(1, int(count)):
        _cap = max(1, int(count))
        _replace_pool()


def _checked(count: int, name: str) -> int:
    if int(count) < 1:
        raise OptionError(f"{name}: {count} threads; use 1 or more")
    return int(count)


def _replace_pool() -> None:
    global _pool
    with _lock:
        old, _pool = _pool, None
    if old is not None and _pool_pid == os.getpid():
        old.shutdown(wait=False)


def pool() -> ThreadPoolExecutor:
    """The process's pool (made now if this process has none yet, e.g. in a forked child)."""
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(thread_count(), thread_name_prefix="outcore-pool")
            _pool_pid = os.getpid()
        return _pool


def submit(work: Callable[..., Any], *args: Any) -> Future[Any]:
    """``work(*args)`` on the pool."""
    global _pending
    with _pending_lock:
        _pending += 1
    future = pool().submit(work, *args)
    future.add_done_callback(_finished)  # run when it ends, or is cancelled before it starts
    return future


def _finished(_: Future[Any]) -> None:
    global _pending
    with _pending_lock:
        _pending -= 1


def _free_threads(threads: int) -> int:
    """How many of the pool's ``threads`` have no task, running or waiting (about: a task may be ending)."""
    return max(0, threads - _pending)


def for_each(work: Callable[[int], None], count: int) -> None:
    """``work(i)`` for ``i < count`` on the pool (for Pillow, libjpeg-turbo and Blosc calls, which run
    outside the GIL), in runs of consecutive ``i`` (`for_each_run`); returns when all are done, raising
    the first exception."""

    def run(start: int, stop: int) -> None:
        for i in range(start, stop):
            work(i)

    for_each_run(run, count)


def for_each_run(work: Callable[[int, int], None], count: int, least: int = 1) -> None:
    """``work(start, stop)`` over runs of consecutive ``i < count`` that cover them all once: up to
    `BLOCKS_PER_THREAD` runs per thread, of ``least`` items at least (a run costs a few microseconds of
    Python: cheap items go in long runs). The calling thread takes runs itself, and so do as many of the
    pool's threads as are free (helpers submitted to the pool, each taking runs until none is left), so a
    call made on a pool thread (a batch made there) never waits on work queued behind it, and one made while
    the pool is busy runs on the caller alone. Returns when all are done, raising the first exception (no
    run is started after it).

    >>> for_each_run(lambda start, stop: print(start, stop), 3)  # doctest: +SKIP
    0 1
    1 2
    2 3
    """
    if count <= 0:
        return
    threads = thread_count()
    blocks = max(1, min(count // max(1, least), BLOCKS_PER_THREAD * threads))
    if blocks == 1 or threads == 1:
        work(0, count)
        return
    runs = _Runs(work, count, blocks)
    for _ in range(min(blocks - 1, _free_threads(threads))):
        submit(runs.take)
    runs.take()
    runs.wait()


class _Runs:
    """The runs of one `for_each_run` call, taken one at a time by whichever thread asks (`take`)."""

    def __init__(self, work: Callable[[int, int], None], count: int, blocks: int) -> None:
        self.work, self.count, self.blocks = work, count, blocks
        self.next = 0  # the next run to take
        self.running = 0  # runs taken and not finished
        self.error: BaseException | None = None
        self.finished = threading.Condition(threading.Lock())

    def take(self) -> None:
        """Do runs until none is left (or one failed)."""
        while True:
            with self.finished:
                if self.next >= self.blocks or self.error is not None:
                    return
                block, self.next, self.running = self.next, self.next + 1, self.running + 1
            try:
                self.work(block * self.count // self.blocks, (block + 1) * self.count // self.blocks)
            except BaseException as error:  # noqa: BLE001 - raised by the caller, in `wait`
                with self.finished:
                    self.error = self.error or error
            finally:
                with self.finished:
                    self.running -= 1
                    self.finished.notify_all()

    def wait(self) -> None:
        """Wait for the runs other threads took (the caller took every other), then raise the first failure."""
        with self.finished:
            while self.running:
                self.finished.wait()
        if self.error is not None:
            raise self.error


def on_own_thread(work: Callable[[], Any], name: str) -> Future[Any]:
    """``work()`` on a daemon thread of its own, named ``name``: its result, or its failure, when it ends. For
    a call that may block for long (a fetch from a vanished machine, worker processes starting), which must
    not hold a pool thread, nor the interpreter's exit.

    >>> on_own_thread(lambda: 6 * 7, "example").result()
    42
    """
    done: Future[Any] = Future()

    def run() -> None:
        try:
            done.set_result(work())
        except BaseException as error:  # noqa: BLE001 - handed to whoever takes the result
            done.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


def wait_all(futures: list[Future[Any]]) -> None:
    """Wait for every one of ``futures``, raising the first exception (the others not started yet are
    cancelled then)."""
    try:
        for future in futures:
            future.result()
    finally:
        for future in futures:
            future.cancel()


def io_thread_count() -> int:
    """The most requests to object stores a process has in flight at once (its I/O threads, which wait
    on the network, not the CPUs): `chosen_io_threads`, else `IO_THREADS`."""
    return chosen_io_threads() or IO_THREADS


def chosen_io_threads() -> int | None:
    """``OUTCORE_IO_THREADS``: when set, the requests a process keeps in flight, fixed. Unset (None), the
    number follows the measured latency and bandwidth (`outcore.storage.pace`): to hide a latency ``L``
    at a bandwidth ``B`` with chunks of ``C`` bytes, about ``L * B / C`` must be in flight (20 ms at
    1 GB/s with 2 MB chunks: 10)."""
    chosen = os.environ.get(IO_ENVIRONMENT)
    if not chosen:
        return None
    try:
        return _checked(int(chosen), IO_ENVIRONMENT)
    except ValueError:
        raise OptionError(f"{IO_ENVIRONMENT}={chosen!r} must be a whole number of threads, 1 or more") from None


def submit_io(work: Callable[..., Any], *args: Any) -> Future[Any]:
    """``work(*args)`` on the process's pool of `io_thread_count` threads for requests to object stores
    (apart from the CPU pool, so that waiting on the network never holds a CPU thread)."""
    global _io_pool, _io_pool_pid, _io_pool_size
    size = io_thread_count()
    with _lock:
        if _io_pool is None or _io_pool_pid != os.getpid() or _io_pool_size != size:
            if _io_pool is not None and _io_pool_pid == os.getpid():
                _io_pool.shutdown(wait=False)  # OUTCORE_IO_THREADS changed: what it runs finishes, no more
            _io_pool = ThreadPoolExecutor(size, thread_name_prefix="outcore-io")
            _io_pool_pid, _io_pool_size = os.getpid(), size
        return _io_pool.submit(work, *args)


def submit_request(work: Callable[..., Any], *args: Any) -> Future[Any]:
    """``work(*args)`` on the process's pool for single requests that a caller waits on with a deadline (an
    I/O thread asking twice for a slow answer): apart from the I/O pool, so a waiting I/O thread never
    waits on a request queued behind it."""
    global _request_pool, _request_pool_pid
    with _lock:
        if _request_pool is None or _request_pool_pid != os.getpid():
            _request_pool = ThreadPoolExecutor(2 * io_thread_count(), thread_name_prefix="outcore-request")
            _request_pool_pid = os.getpid()
        return _request_pool.submit(work, *args)


def _forget_after_fork() -> None:
    global _pool, _io_pool, _request_pool, _lock, _pending, _pending_lock
    _pool, _io_pool, _request_pool = None, None, None  # the parent's threads (and locks) do not exist here
    _lock, _pending, _pending_lock = threading.Lock(), 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
