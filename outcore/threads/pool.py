"""A pool of threads that never runs more tasks at once than run well: `Pool` runs at most `Gauge.limit` tasks
at a time, each handed to the thread that went idle last, and `Gauge` sets that limit from what the threads'
CPU time says of their wall time.

Why not `concurrent.futures.ThreadPoolExecutor`: it wakes whichever idle thread the queue picks, so on 16
threads the tasks spread over all of them (each one cold, woken by the kernel); and it runs as many at once as
it has threads, and more threads at once than there are cores only take turns (each slower, none more done).
Here the last idle thread takes the next task (its caches warm; the others stay asleep), and the tasks
beyond the limit wait in order.

>>> pool = Pool(2, "example")
>>> pool.submit(sum, [1, 2]).result()
3
>>> pool.shutdown()
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .task import Task


class Gauge:
    """How well the pool's threads run: the CPU time over the wall time of the runs they do (`for_each_run`'s:
    copies, decodes, crops; never reads, which may wait on a device), and from it how many tasks may run at once
    (`limit`). A thread that waits for the GIL, or for a core that other threads (or processes) hold, spends
    wall time without CPU time (docs/benchmarks.md, "Figures behind the code", has the shares measured). A run every `INTERVAL` is measured; every `EVERY` measured runs, the share
    (`last`, a mean over the last judgements, so that a run held up by another process moves it little) is
    judged:
    below `LOW`, the limit falls to the threads' worth that ran at `TARGET` (more threads than help are never
    busy: they would only be slower); above `HIGH` for `patience` judgements in a row, it rises by one, up to
    the pool's threads, and a rise undone at once makes the next wait twice as long (at most `MOST_PATIENCE`).
    The judgement after a change is skipped (its runs began before it).

    >>> gauge = Gauge(8)
    >>> for _ in range(Gauge.EVERY):
    ...     gauge.record(cpu=0.25, wall=1.0)  # three quarters of the time waiting: a mean share of 0.625
    >>> gauge.limit  # 8 x 0.625 / 0.85
    6
    """

    LOW, TARGET, HIGH = 0.7, 0.85, 0.9
    EVERY = 8
    INTERVAL = 0.02  # seconds between the starts of runs measured: a thread's CPU clock is read holding the GIL,
    # after a long call outside it, which read at every run would cost the pool a share of its parallel time
    MOST_PATIENCE = 8

    def __init__(self, threads: int) -> None:
        self.threads = self.limit = threads
        self.cpu = self.wall = 0.0
        self.runs = 0
        self.last = 1.0  # the share: the mean of the judgements' own, the last one weighing half
        self.patience = 1  # judgements above HIGH in a row before a rise
        self.high = 0  # such judgements so far
        self.rose = False  # the last change was a rise
        self.settling = False  # skip the next judgement
        self.sampled = 0.0  # when the last run measured began
        self.lock = threading.Lock()

    def record(self, cpu: float, wall: float) -> None:
        with self.lock:
            self.cpu, self.wall, self.runs = self.cpu + cpu, self.wall + wall, self.runs + 1
            if self.runs >= self.EVERY and self.wall > 0:
                self._judge(min(1.0, self.cpu / self.wall))
                self.cpu = self.wall = 0.0
                self.runs = 0

    def _judge(self, share: float) -> None:
        if self.settling:
            self.settling = False
            return
        self.last = share = (self.last + share) / 2
        if share < self.LOW and self.limit > 1:
            self.patience = min(self.MOST_PATIENCE, self.patience * 2) if self.rose else self.patience
            self.limit = max(1, min(self.limit - 1, round(self.limit * share / self.TARGET)))
            self.rose, self.settling, self.high = False, True, 0
            self.last = self.TARGET  # what the new limit is expected to give
        elif share > self.HIGH and self.limit < self.threads:
            self.high += 1
            if self.high >= self.patience:
                self.limit += 1
                self.rose, self.settling, self.high = True, True, 0
        else:
            self.high = 0

    def measured(self, work: Callable[[int, int], None], start: int, stop: int) -> None:
        """``work(start, stop)``, its CPU and wall time recorded (when `INTERVAL` has passed since the last run
        measured began)."""
        wall = time.perf_counter()
        if wall - self.sampled < self.INTERVAL:
            work(start, stop)
            return
        self.sampled, cpu = wall, time.thread_time()
        work(start, stop)
        self.record(time.thread_time() - cpu, time.perf_counter() - wall)


class Runs:
    """The runs of one `outcore.threads.for_each_run` call: ``blocks`` runs of ``work(start, stop)`` over
    ``count`` items, taken one at a time by whichever thread asks (`take`: the caller, and the pool's threads
    that join it, `Pool.share`), the next from an iterator the threads share (one C call, under the GIL), and
    the caller told that the last has ended by a C lock, never a Python condition.

    >>> runs = Runs(lambda start, stop: print(start, stop), 4, 2, Gauge(1))
    >>> runs.take()
    0 2
    2 4
    >>> runs.left(), runs.wait()
    (False, None)
    """

    def __init__(self, work: Callable[[int, int], None], count: int, blocks: int, gauge: Gauge) -> None:
        self.work, self.count, self.blocks, self.gauge = work, count, blocks, gauge
        self.runs = iter(range(blocks))  # the runs no thread took yet
        self.ended = itertools.count(1)  # ``next`` counts a run ended (or skipped after a failure): one C call
        self.all_ended = threading.Lock()  # held until the last run has ended
        self.all_ended.acquire()
        self.error: BaseException | None = None

    def left(self) -> bool:
        """Whether runs are left for another thread to take (the shared iterator's own count: one C call)."""
        return operator.length_hint(self.runs) > 0

    def take(self) -> None:
        """Do runs until none is left (those taken after a failure are skipped)."""
        for block in self.runs:
            if self.error is None:
                try:
                    self.gauge.measured(self.work, block * self.count // self.blocks,
                                        (block + 1) * self.count // self.blocks)
                except BaseException as error:  # noqa: BLE001 - raised by the caller, in `wait`
                    if self.error is None:
                        self.error = error
            if next(self.ended) == self.blocks:
                self.all_ended.release()

    def wait(self) -> None:
        """Once the caller found no run left: wait for those other threads took to end (they are under way, never
        queued), then raise the first failure."""
        self.all_ended.acquire()
        if self.error is not None:
            raise self.error


_Task = tuple[Task, Callable[..., Any], tuple[Any, ...], bool]  # its result, the work, its arguments, limited


class Pool:
    """``threads`` threads (started as needed, named ``name-N``) that run the tasks `submit` gives them, in the
    order given, each handed to the thread that went idle last. Of the tasks of work the `Gauge` measures
    (``limited``: batches made, runs of a batch), at most ``gauge.limit`` run at once; the others (reads, which
    may wait on a device or the network) take any thread, first. A thread that goes free with no task waiting
    joins the oldest `Runs` shared with the pool (`share`) that has runs left: a batch's runs started while
    every thread was busy are done by as many threads as go free meanwhile, oldest batch first (a waiting task
    first: the reads and batches queued are what keeps threads busy next). Threads end at `shutdown`, once
    their task is done (the interpreter waits for them at its exit: `outcore.threads` shuts its pool down
    then)."""

    def __init__(self, threads: int, name: str, gauge: Gauge | None = None) -> None:
        self.threads, self.name = threads, name
        self.gauge = gauge or Gauge(threads)  # its threads: the most that may be busy
        self.lock = threading.Lock()
        self.waiting: dict[bool, deque[_Task]] = {False: deque(), True: deque()}  # tasks no thread took yet
        self.idle: list[_Worker] = []  # threads waiting for a task, the last to go idle at the end
        self.started: list[_Worker] = []
        self.running = 0  # tasks being run
        self.running_limited = 0  # of them, limited ones
        self.shared: deque[Runs] = deque()  # `share`d runs that free threads join, oldest first
        self.closed = False

    def submit(self, work: Callable[..., Any], *args: Any, limited: bool = True) -> Task[Any]:
        """``work(*args)`` on one of the threads: its result, or its failure, in the `Task` returned;
        ``limited``: it counts against the gauge's limit (the CPU work the gauge measures)."""
        task: _Task = (Task(), work, args, limited)
        with self.lock:
            if self.closed:
                raise RuntimeError(f"the thread pool {self.name} was shut down")
            thread = self.idle or len(self.started) < self.threads
            if not thread or (limited and self.running_limited >= self.gauge.limit):
                self.waiting[limited].append(task)
                return task[0]
            self._start(task)
        return task[0]

    def share(self, runs: Runs, helpers: int) -> None:
        """Let the pool's threads join ``runs`` (until `unshare`): up to ``helpers`` of those idle (or not
        started) now, within the gauge's limit, and from then on any that goes free while runs are left."""
        with self.lock:
            if self.closed:
                return
            self.shared.append(runs)
            for _ in range(helpers):
                if self.running_limited >= self.gauge.limit or not (self.idle or len(self.started) < self.threads):
                    break
                self._start((Task(), runs.take, (), True))

    def _start(self, task: _Task) -> None:
        """Hand ``task`` to the thread that went idle last, or to a new one (called holding the lock, with one of
        them to be had)."""
        self._count(task, +1)
        if self.idle:
            self.idle.pop().give(task)
        else:
            self.started.append(_Worker(self, task, f"{self.name}-{len(self.started)}"))

    def unshare(self, runs: Runs) -> None:
        """No thread joins ``runs`` from now on (its caller took the last)."""
        with self.lock:
            if runs in self.shared:
                self.shared.remove(runs)

    def _helping(self) -> _Task | None:
        """A task joining the oldest shared runs with runs left, if any (called holding the lock)."""
        shared = self.shared
        while shared and not shared[0].left():
            shared.popleft()
        for runs in shared:
            if runs.left():
                return (Task(), runs.take, (), True)
        return None

    def _count(self, task: _Task, change: int) -> None:
        self.running += change
        self.running_limited += change * task[3]

    def next_task(self, worker: _Worker, done: _Task) -> _Task | None:
        """The task a thread that finished ``done`` runs next, or None: it goes idle (the limit may have fallen)."""
        with self.lock:
            self._count(done, -1)
            task = None
            if not self.closed:
                if self.waiting[False]:
                    task = self.waiting[False].popleft()
                elif self.running_limited < self.gauge.limit:
                    task = self.waiting[True].popleft() if self.waiting[True] else self._helping()
            if task is None:
                if not self.closed:
                    self.idle.append(worker)
                return None
            self._count(task, +1)
            return task

    def shutdown(self) -> None:
        """Let every thread end once its task is done; tasks not started are cancelled."""
        with self.lock:
            self.closed = True
            waiting = [*self.waiting[False], *self.waiting[True]]
            self.waiting = {False: deque(), True: deque()}
            idle, self.idle = self.idle, []
        for result, _, _, _ in waiting:
            result.cancel()
        for worker in idle:
            worker.give(None)


class _Worker:
    """One thread of a `Pool`: runs the task it is given, then the pool's next, until none; then waits."""

    def __init__(self, pool: Pool, task: _Task, name: str) -> None:
        self.pool = pool
        self.task: _Task | None = task
        self.ready = threading.Lock()  # held but while `give` hands a task over: a C lock, cheaper than an Event
        self.ready.acquire()
        threading.Thread(target=self.run, name=name, daemon=False).start()  # not a daemon, even when made by one

    def give(self, task: _Task | None) -> None:
        """Run ``task`` next (None: end)."""
        self.task = task
        self.ready.release()

    def run(self) -> None:
        while True:
            task = self.task
            self.task = None
            while task is not None:
                result, work, args, _ = task
                result.run(work, *args)  # unless cancelled
                del result, work, args  # nothing of a task is kept while waiting for the next
                task = self.pool.next_task(self, task)
            if self.pool.closed:
                return
            self.ready.acquire()  # until `give`
