"""Reading speed measured side by side: the cases ``outcore bench`` and the benchmarks time, and timing
them in turns.

>>> ds = outcore.open_dataset("train.zarr")  # doctest: +SKIP
>>> interleaved({"zarr": lambda: sequential_zarr(ds, ["images"]),
...              "outcore": lambda: shuffled_epoch(ds, ["images", "labels"])}, repeats=3)  # doctest: +SKIP
{'zarr': 10412.3, 'outcore': 31877.9}
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

from PIL import Image

from .dataset import Dataset
from .format import ranges_name
from .imaging import native
from .storage import chunk_reads, read_files
from .threads import thread_count


def interleaved(cases: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median items per second of each case, over ``repeats`` rounds that run every case in turn (a machine
    busy for a while then slows every case alike, not one). A case returns how many items it did.

    >>> interleaved({"a": lambda: 10, "b": lambda: 20}, 3)  # doctest: +SKIP
    {'a': 412345.1, 'b': 803333.3}
    """
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, work in cases.items():
            began = time.perf_counter()
            done = work()
            rates[name].append(done / (time.perf_counter() - began))
    return {name: statistics.median(measured) for name, measured in rates.items()}


def sequential_zarr(ds: Dataset, fields: Sequence[str]) -> int:
    """Plain zarr: read the store front to back, one chunk per call and field (encoded images: the
    chunk's byte ranges and bytes, then each image decoded with Pillow)."""
    for start in range(0, len(ds), ds.chunk_size):
        for name in fields:
            if ds.attrs.fields[name].is_image:
                _decode_with_pillow(ds, name, start)
            else:
                ds.array(name)[start : start + ds.chunk_size]
    return len(ds)


def _decode_with_pillow(ds: Dataset, name: str, start: int) -> None:
    stop = min(len(ds), start + ds.chunk_size)
    for blob in read_files(ds.array(name), ds.array(ranges_name(name)), start, stop):
        with Image.open(io.BytesIO(blob)) as image:
            image.load()


def decompress_all(ds: Dataset, fields: Sequence[str], threads: int | None = None) -> int:
    """The ceiling: decompress (and decode) every chunk into memory on ``threads`` threads (default: as many
    as outcore reads with, `outcore.threads.thread_count`), in storage order, with outcore's chunk readers
    and no shuffling, batching or copying."""
    readers = [ds.chunk_reader(name) for name in fields]
    jobs = [(reader, chunk) for chunk in range(ds.num_chunks) for reader in readers]
    with ThreadPoolExecutor(threads or thread_count()) as pool:
        for _ in pool.map(lambda job: job[0].read(job[1]), jobs):
            pass
    return len(ds)


def shuffled_epoch(ds: Dataset, fields: Sequence[str], batch_size: int = 256, **options: object) -> int:
    """One epoch of ``ds.batches`` with default settings unless ``options`` say otherwise."""
    return sum(len(batch[fields[0]]) for batch in ds.batches(batch_size, fields=fields, **options))


def gil_free_clock() -> Callable[[], float] | None:
    """A clock of the CPU seconds this process's threads spend in outcore's C calls with the GIL released (chunk
    reads, copies and windows, JPEG decodes and crops), from now on; None where nothing is counted (no C
    extension loads, or the system has no thread CPU clock). Each thread's own CPU time is counted, so time a
    thread waits for a core is not: beside `time.process_time`, the rest of the CPU time is an upper bound of the
    time spent holding the GIL (it holds numpy's and other libraries' work too), whatever else the machine runs.
    On ``n`` cores, a share ``s`` of the work holding the GIL allows at most ``1 / (s + (1 - s) / n)`` times one
    core's rate (`gil_bound`).

    >>> clock = gil_free_clock()  # doctest: +SKIP
    >>> cpu = time.process_time(); ...; held = 1 - clock() / (time.process_time() - cpu)  # doctest: +SKIP
    """
    counters = [module.count_free for module in _counting()]
    counted = [(count, count(True)) for count in counters]
    counted = [(count, start) for count, start in counted if start is not None]
    if not counted:
        return None
    return lambda: sum(count(True) - start for count, start in counted)


def thread_free_seconds() -> float:
    """The part of `gil_free_clock`'s seconds counted on the calling thread so far (while a clock counted): 0 where
    nothing is counted. Beside ``time.thread_time()``, what the thread spent holding the GIL, at most.

    >>> clock = gil_free_clock()  # doctest: +SKIP
    >>> began = time.thread_time() - thread_free_seconds(); ...  # doctest: +SKIP
    >>> held = time.thread_time() - thread_free_seconds() - began  # doctest: +SKIP
    """
    return sum(module.thread_free() or 0.0 for module in _counting() if hasattr(module, "thread_free"))


def _counting() -> list[ModuleType]:
    """outcore's C extensions that count their time outside the GIL (loaded here)."""
    return [module for module in (native.extension, native.windows, chunk_reads.extension())
            if module is not None and hasattr(module, "count_free")]


def gil_bound(held: float, cores: int) -> float:
    """The most times one core's rate one process's threads reach on ``cores`` when a share ``held`` of a batch's
    CPU time holds the GIL (Amdahl's law, the GIL's time taken as serial).

    >>> round(gil_bound(0.118, 16), 2), round(gil_bound(0.0, 16), 2)
    (5.78, 16.0)
    """
    return 1 / (held + (1 - held) / cores)
