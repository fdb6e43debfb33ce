"""The process's one pool of threads for reading, decoding, cutting and making batches, sized from the CPUs it
may use (`available_cpus`: the CPU affinity and the cgroup quota, not the host's cores).

One pool, made when first used and kept for the process's life, serves every chunk read, decode, copy and
batch, so a process never runs more of them at once than `thread_count` says: by default the available
CPUs, divided among the DataLoader workers when a process is one of them (`share_cpus`), so that their
total stays within the CPUs; the ``OUTCORE_THREADS`` environment variable or `set_threads` choose another
number. Of those, no more run at once than run well (`Gauge.limit`, measured by the pool's `Gauge`: threads
waiting for the GIL or for a core lower it), so more threads are never slower than fewer.

A forked child does not inherit running threads: the pool is made again in the child when it is
first used there. `for_each_run` shares the runs of a call between the calling thread and the pool's free
threads: a pool thread may call it (a batch made there) without waiting on work queued behind it.

>>> for_each(print, 2)  # doctest: +SKIP
0
1
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import OptionError
from .cpus import QUOTA_SECONDS, available_cpus
from .pool import Gauge, Pool, Runs
from .task import Task

ENVIRONMENT = "OUTCORE_THREADS"
IO_ENVIRONMENT = "OUTCORE_IO_THREADS"
IO_THREADS = 64  # the most requests to object stores in flight at once, by default: see `io_thread_count`
RECOUNT_SECONDS = QUOTA_SECONDS  # the pool's thread count is found again after this long (`shared_pool`)
BLOCKS_PER_THREAD = 4  # for_each: runs of items per thread, enough to even out uneven items

_lock = threading.Lock()
_pool: Pool | None = None
_pool_pid = 0
_pool_counted = 0.0  # when its thread count was last found (`shared_pool`)
_chosen: int | None = None  # set_threads
_shares = 1  # share_cpus: the processes this one shares its CPUs with (itself included)
_cap: int | None = None  # cap_threads: a worker of a Dask cluster uses at most its own threads
_io_pool: ThreadPoolExecutor | None = None
_io_pool_pid = 0
_io_pool_size = 0
_request_pool: ThreadPoolExecutor | None = None
_request_pool_pid = 0


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
        old.shutdown()


def shared_pool() -> Pool:
    """The process's pool of `thread_count` threads (made now if this process has none yet, e.g. in a forked
    child, or when the count changed), which runs at most as many tasks at once as its `Gauge` says run well,
    and no more than the CPUs this process may use (more threads than those may wait on object stores).
    `set_threads`, `share_cpus` and `cap_threads` change it at once; a count that changed otherwise (the CPU
    affinity or quota, ``OUTCORE_THREADS`` set in the process) is found within `RECOUNT_SECONDS`: the pool is
    asked for at every task, and counting the CPUs (a system call, the environment's Python) costs more than
    the rest of it."""
    global _pool, _pool_pid, _pool_counted
    pool = _pool
    if pool is not None and _pool_pid == os.getpid() and time.monotonic() < _pool_counted + RECOUNT_SECONDS:
        return pool
    threads = thread_count()
    with _lock:
        if _pool is None or _pool_pid != os.getpid() or _pool.threads != threads:
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown()
            _pool = Pool(threads, "outcore-pool", Gauge(min(threads, available_cpus())))  # no more busy than CPUs
            _pool_pid = os.getpid()
        _pool_counted = time.monotonic()
        return _pool


def submit(work: Callable[..., Any], *args: Any, limited: bool = True) -> Task[Any]:
    """``work(*args)`` on the pool; ``limited=False`` for work that may wait on a device or the network (reads):
    it never waits for the `Gauge`'s limit (`Pool`)."""
    return shared_pool().submit(work, *args, limited=limited)


def gauge() -> Gauge:
    """The pool's `Gauge`: how well its threads run, and how many may be busy at once."""
    return shared_pool().gauge


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
    `BLOCKS_PER_THREAD` runs per thread, counted over the calls under way (``k`` calls sharing the pool's
    ``n`` busy threads make ``ceil(n / k)`` threads' worth of runs each: each run takes and gives back the GIL,
    and with many batches made at once more runs only cost), of ``least`` items at least (a run costs a few
    microseconds of Python: cheap items go in long runs). The calling thread takes runs itself, and so do the
    pool's threads that are free now or go free before the last run is taken (`Pool.share`), so a call made on a
    pool thread (a batch made there) never waits on work queued behind it, and one made while the pool is busy is
    joined by each thread as it goes free. Returns when all are done, raising the first exception (no run is started
    after it).

    >>> for_each_run(lambda start, stop: print(start, stop), 3)  # doctest: +SKIP
    0 1
    1 2
    2 3
    """
    if count <= 0:
        return
    pool = shared_pool()  # once: finding it reads the environment (OUTCORE_THREADS)
    measured = pool.gauge
    threads = measured.limit
    calls = 1 + len(pool.shared)  # this one and those whose runs are not all taken (a length read: one C call)
    blocks = max(1, min(count // max(1, least), BLOCKS_PER_THREAD * -(-threads // calls)))
    if blocks == 1 or threads == 1:
        measured.measured(work, 0, count)
        return
    runs = Runs(work, count, blocks, measured)
    pool.share(runs, blocks - 1)
    try:
        runs.take()
    finally:  # an interrupt between runs (the main thread's): no thread takes up the runs the caller left
        pool.unshare(runs)
    runs.wait()


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


def wait_all(futures: list[Future[Any]] | list[Task[Any]]) -> None:
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
    global _pool, _io_pool, _request_pool, _lock
    _pool, _io_pool, _request_pool = None, None, None  # the parent's threads (and locks) do not exist here
    _lock = threading.Lock()


def _shut_down() -> None:
    """At the interpreter's exit, before it waits for threads: the pool's threads end once their task is done."""
    if _pool is not None and _pool_pid == os.getpid():
        _pool.shutdown()


os.register_at_fork(after_in_child=_forget_after_fork)
threading._register_atexit(_shut_down)  # as concurrent.futures does: before threading joins the threads
