"""``outcore bench``'s reading speed of a store, measured side by side (`outcore.measure` times the cases),
and an object store's traffic over an epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..dataset import Dataset
from ..iterate.targets import Targets
from ..iterate.transforms import Compose, RandomFlip, RandomResizedCrop
from ..measure import decompress_all, interleaved, sequential_zarr, shuffled_epoch
from ..storage.report import field_reports, total
from ..threads import thread_count


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
    done while decoding, their label maps and paired pictures (raster fields) cut with them.
    """
    fields = list(fields or ds.fields)
    sequential_zarr(ds, fields)
    variable = [name for name in fields if ds.info(name).is_image and ds.info(name).decode.variable]
    epoch, transform = f"outcore ds.batches({batch_size}), shuffled, defaults", None
    if variable:
        rasters = [name for name in fields if ds.info(name).is_raster]  # their maps, cut with them
        targets = Targets(label_maps=tuple(name for name in rasters if ds.info(name).role == "target"),
                          pictures=tuple(name for name in rasters if ds.info(name).role != "target")) if rasters else None
        transform = Compose([RandomResizedCrop(crop, field=variable[0], targets=targets),
                             RandomFlip(field=variable[0], targets=targets)])
        epoch = f"outcore ds.batches({batch_size}), shuffled, crop {crop} + flip"
    cases = {
        "plain zarr, sequential, one chunk per call": lambda: sequential_zarr(ds, fields),
        epoch: lambda: shuffled_epoch(ds, fields, batch_size, transform=transform),
        f"decompression ceiling (every chunk, {thread_count()} threads)": lambda: decompress_all(ds, fields),
    }
    return list(interleaved(cases, repeats).items())
