"""Reading speed of a store, measured side by side: behind ``outcore bench`` and benchmarks/iterate.py."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from PIL import Image

from ..dataset import Dataset
from ..format import ranges_name
from ..iterate.transforms import Compose, RandomFlip, RandomResizedCrop
from ..storage import read_files
from ..storage.report import field_reports, total
from ..threads import thread_count


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


def epoch_traffic(ds: Dataset, batch_size: int = 256) -> str:
    """One shuffled epoch of a store in an object store, and what it asked of the store and the cache.

    >>> epoch_traffic(outcore.open_dataset("s3://bucket/train.zarr"))  # doctest: +SKIP
    '312 requests, 1,250.0 MB fetched (1.00x the store); cache: 0 hits, 310 misses; fetching 24 chunks ahead (a ...'
    """
    store = ds.group.store
    before, cache = replace(store.files.traffic), store.cache
    hits, misses = (cache.counts.hits, cache.counts.misses) if cache is not None else (0, 0)
    shuffled_epoch(ds, list(ds.fields), batch_size, seed=1)
    traffic = store.files.traffic
    fetched = traffic.bytes - before.bytes
    stored = total(field_reports(ds)).stored
    line = (f"{traffic.requests - before.requests:,} requests, {fetched / 1e6:,.1f} MB fetched "
            f"({fetched / max(1, stored):.2f}x the store)")
    if cache is not None:
        line += f"; cache: {cache.counts.hits - hits:,} hits, {cache.counts.misses - misses:,} misses"
    measured = store.files.pace.measured()
    if measured is not None:
        seconds, rate = measured
        line += (f"; fetching {store.files.fetch_ahead()} chunks ahead (a request: {seconds * 1e3:,.0f} ms, "
                 f"at best {rate / 1e6:,.1f} MB/s)")
    return line


def compare(ds: Dataset, fields: Sequence[str] | None = None, batch_size: int = 256,
            repeats: int = 3, crop: int = 224) -> list[tuple[str, float]]:
    """Median samples/s of plain sequential zarr, outcore's shuffled epoch and the decompression ceiling
    (on as many threads as outcore reads with), timed in turns: ``repeats`` rounds of each, so that a
    machine busy for a while slows all three alike.

    A first sequential pass warms the page cache, so all three read from memory-cached files. A field
    of pictures at their own size is read as training reads it: ``RandomResizedCrop(crop)`` and a flip,
    done while decoding.
    """
    fields = list(fields or ds.fields)
    sequential_zarr(ds, fields)
    variable = [name for name in fields if ds.info(name).is_image and ds.info(name).decode.variable]
    epoch, transform = f"outcore ds.batches({batch_size}), shuffled, defaults", None
    if variable:
        transform = Compose([RandomResizedCrop(crop, field=variable[0]), RandomFlip(field=variable[0])])
        epoch = f"outcore ds.batches({batch_size}), shuffled, crop {crop} + flip"
    cases = {
        "plain zarr, sequential, one chunk per call": lambda: sequential_zarr(ds, fields),
        epoch: lambda: shuffled_epoch(ds, fields, batch_size, transform=transform),
        f"decompression ceiling (every chunk, {thread_count()} threads)": lambda: decompress_all(ds, fields),
    }
    return list(interleaved(cases, repeats).items())
