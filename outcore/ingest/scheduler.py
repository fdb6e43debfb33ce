"""Where ingest tasks run: on a Dask cluster (the client given, or the active one), else on local
threads, one per core; with a progress bar counted in samples."""

from __future__ import annotations

import _thread
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dask.base import get_scheduler
from dask.callbacks import Callback
from dask.delayed import Delayed, optimize
from dask.threaded import get as threaded_get
from tqdm import tqdm

from ..threads import thread_count


def progress_bar(total: int, description: str, unit: str, enabled: bool = True) -> tqdm:
    """A tqdm bar: a widget in a Jupyter kernel that has ipywidgets, text everywhere else (never tqdm's
    "IProgress not found" warning for a notebook without ipywidgets)."""
    kind = tqdm
    if _in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm import notebook  # here: it imports IPython, which a script does not need

        kind = notebook.tqdm
    return kind(total=total, desc=description, unit=unit, disable=not enabled, dynamic_ncols=True)


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in shell.config


def active_client(client: Any = None) -> Any:
    """``client``, or else the ``distributed.Client`` that ``dask.compute`` would use (the active one,
    unless ``dask.config.set(scheduler=...)`` says otherwise), or ``None``.

    >>> active_client() is None  # no distributed.Client in this process
    True
    """
    if client is not None or "distributed" not in sys.modules:  # no client can exist without distributed
        return client
    from distributed import Client

    owner = getattr(get_scheduler(), "__self__", None)
    return owner if isinstance(owner, Client) else None


def run_tasks(
    tasks: Sequence[Delayed],
    weights: Sequence[int],
    *,
    client: Any = None,
    progress: bool = True,
    description: str = "",
    unit: str = "samples",
    threads: int | None = None,
) -> list[Any]:
    """Compute ``tasks`` and return their results in order; the bar advances by ``weights[i]`` per task.

    With ``client`` (a ``distributed.Client``), or an active one (`active_client`), the tasks run on its
    cluster; without, on a local pool of ``threads`` threads (default: `outcore.thread_count`, one per CPU this
    process may use unless `outcore.set_threads` or ``OUTCORE_THREADS`` say otherwise; one for work that holds
    the GIL, which more threads only slow down).
    """
    client = active_client(client)
    with progress_bar(sum(weights), description, unit, progress) as bar:
        if client is not None:
            return _run_on_cluster(tasks, weights, client, bar)
        weight_of = {task.key: weight for task, weight in zip(tasks, weights, strict=True)}
        pool = ThreadPoolExecutor(threads or thread_count(), thread_name_prefix="outcore-ingest")
        graph, keys, progress = task_graph(tasks), [task.key for task in tasks], _ProgressCallback(weight_of, bar)

        def scheduled() -> list[Any]:
            with progress:
                return list(threaded_get(graph, keys, pool=pool))

        try:
            return _waited(scheduled, progress.stop_starting)
        finally:  # after a failure, the tasks still running finish before anything cleans up after them
            pool.shutdown(wait=True, cancel_futures=True)


def _waited(work: Callable[[], list[Any]], stop: Callable[[], None]) -> list[Any]:
    """``work()``, the scheduler of an ingest's tasks, run on a thread of its own: the calling thread only waits for
    it, on a lock that nothing else takes (not `outcore.threads.on_own_thread`'s ``Future``, whose ``result`` waits in
    a ``with`` of the future's condition, the kind of lock this is about). Interrupted there, it calls ``stop()`` (no
    task starts after it), waits for ``work`` to end (the tasks under way finish), and the ``KeyboardInterrupt`` goes
    on; where ``stop()`` fails, the ``KeyboardInterrupt`` goes on at once, its note naming that failure.

    Python raises a Ctrl-C's ``KeyboardInterrupt`` in the main thread, wherever it is, and one raised in a ``with``
    statement's ``__enter__``, once it has taken its lock, leaves that lock taken for ever. Schedulers take such
    locks all the time: dask's threaded one at every task (each task's future, as it gives it its queue's ``put``;
    its queue, as it waits for the next result), ``distributed.as_completed`` at every wake-up. Run on the main
    thread, a Ctrl-C could leave one taken, and the thread that next took it (the one that ran the task; a
    cluster's client's event loop) waited for ever, and so did the cleanup (tests/test_staging.py,
    tests/test_distributed.py)."""
    ended: dict[str, Any] = {}
    done = _thread.allocate_lock()
    done.acquire()

    def run() -> None:
        try:
            ended["results"] = work()
        except BaseException as error:  # noqa: BLE001 - raised in the caller's thread
            ended["error"] = error
        finally:
            done.release()

    threading.Thread(target=run, name="outcore-ingest-scheduler", daemon=True).start()
    try:
        done.acquire()
    except BaseException as interrupt:  # a Ctrl-C: no task starts after it, those under way finish before it goes on
        try:
            stop()
        except Exception as failure:  # noqa: BLE001 - any (a cluster gone): said with the interrupt, which goes on
            interrupt.add_note(f"outcore could not stop the ingest's tasks ({type(failure).__name__}: {failure}); "
                               "those started may still run")
            raise interrupt from None
        if not ended:  # (else the scheduler had returned, as the interrupt came)
            done.acquire()
        raise
    if "error" in ended:
        raise ended["error"]
    return ended["results"]


class _Stopped(Exception):
    """Raised in dask's scheduler before it would start a task once the caller was interrupted."""


def task_graph(tasks: Sequence[Delayed]) -> dict[Any, Any]:
    """The graph of ``tasks`` and all they depend on, as ``dask.compute`` would run it (`dask.delayed.optimize`:
    culled to them), for dask's threaded scheduler. ``dask.compute`` finds each task's graph apart: a few hundred
    microseconds holding the GIL a task, the ingest's largest cost after its imports. Here each layer their graphs
    share is taken once.

    >>> from dask import delayed
    >>> tasks = [delayed(pow)(2, 3), delayed(abs)(-4)]
    >>> threaded_get(task_graph(tasks), [task.key for task in tasks])
    (8, 4)
    """
    layers: dict[str, Any] = {}
    for task in tasks:
        layers.update(task.__dask_graph__().layers)
    graph: dict[Any, Any] = {}
    for layer in layers.values():
        graph.update(layer)
    return dict(optimize(graph, [task.key for task in tasks]))


def _run_on_cluster(tasks: Sequence[Delayed], weights: Sequence[int], client: Any, bar: tqdm) -> list[Any]:
    from distributed import as_completed

    futures = client.compute(list(tasks))
    weight_of = {future.key: weight for future, weight in zip(futures, weights, strict=True)}

    def gathered() -> list[Any]:
        for future in as_completed(futures):
            future.result()  # raise the first failure at once, with its traceback
            bar.update(weight_of[future.key])
        return client.gather(futures)

    try:
        return _waited(gathered, lambda: client.cancel(futures))
    finally:
        for future in futures:
            future.cancel()


class _ProgressCallback(Callback):
    """Advances the bar by each task's weight as it ends; once `stop_starting` was called, raises `_Stopped`
    instead of starting a task."""

    def __init__(self, weight_of: dict[Any, int], bar: tqdm) -> None:
        super().__init__()
        self._weight_of = weight_of
        self._bar = bar
        self._stopped = False  # a plain attribute: set after a Ctrl-C, it takes no lock

    def stop_starting(self) -> None:
        self._stopped = True

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        if self._stopped:
            raise _Stopped

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        weight = self._weight_of.get(key)
        if weight:
            self._bar.update(weight)
