"""``images=None``: pixels or encoded pictures, chosen for the machine that will read the store.

A pixel store that fits in the memory the page cache can give is read from memory after its first
epoch, with nothing to decode: pixels. A bigger one is read from the device every epoch, so the choice
is measured, as ``outcore bench`` measures it (`outcore.storage.device`): the device under the target
folder read cold (a probe file written there, then evicted) for the bytes and reads an epoch of each kind
makes, and the rate at which the process's threads, all at once, decode a sample of the files. Whichever
epoch `outcore.storage.epochs` predicts faster wins.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OutcoreError
from ..imaging import decode_image
from ..storage import is_url
from ..storage.device import SMALL_READ, DeviceRates, measure_device, whole_pages
from ..storage.epochs import Kind, predict_epoch
from ..storage.page_cache import memory
from ..storage.report import human_size
from ..threads import thread_count

DECODED_FILES = 32  # files read to time the decoding
TIMED_DECODES = 64  # decodes timed at least (the files again, in turn, when there are few) ...
DECODES_PER_THREAD = 8  # ... and at least this many per thread
PROBE_BYTES = 128 * 2**20  # the probe file written under the target to read cold


@dataclass(frozen=True)
class ImagesChoice:
    """What ``images=None`` became (``images``), and why (``reason``, one sentence)."""

    images: str
    reason: str


def choose_images(location: str | os.PathLike, paths: Sequence[str], file_bytes: Sequence[int],
                  sample_nbytes: int, chunk_size: int, decode: dict[str, Any],
                  read: Callable[[str], bytes]) -> ImagesChoice:
    """Pixels or encoded pictures for ``len(paths)`` samples of ``sample_nbytes`` decoded bytes each, whose
    files hold ``file_bytes``, in chunks of ``chunk_size``; ``decode`` holds `decode_image`'s ``shape``,
    ``resize`` and ``dtype``, and ``read(path)`` gives a file's bytes.

    >>> choose_images("train.zarr", paths, sizes, 128 * 128 * 3, 128, decode, read).reason  # doctest: +SKIP
    'the pixel store (1.8 GiB) fits in the memory the page cache can give (21.7 GiB): its epochs come from memory'
    """
    count = len(paths)
    pixels, room = count * sample_nbytes, memory()
    if room.holds(pixels):
        return ImagesChoice("pixels", f"the pixel store ({human_size(pixels)}) fits in the memory the page cache can give "
                                      f"({human_size(room.available)}): its epochs come from memory, with nothing to decode")
    too_big = f"the pixel store ({human_size(pixels)}) does not fit in the memory the page cache can give ({human_size(room.available)})"
    encoded = float(np.mean(file_bytes))
    if is_url(location):
        return ImagesChoice("encoded", f"{too_big}, and every epoch fetches it from the object store: the files are "
                                       f"{sample_nbytes / encoded:.1f}x fewer bytes")
    folder = _existing_folder(Path(location))
    if shutil.disk_usage(folder).free < 4 * PROBE_BYTES:
        return ImagesChoice("encoded", f"{too_big}, and {folder} has too little free space to measure its device: "
                                       f"the files are {sample_nbytes / encoded:.1f}x fewer bytes")
    threads = thread_count()
    decoding = _decode_rate(paths, decode, read, threads)
    pixel_chunk, encoded_chunk = whole_pages(sample_nbytes * chunk_size), whole_pages(encoded * chunk_size)
    device = _probe(folder, [pixel_chunk, encoded_chunk, SMALL_READ])
    kinds = [Kind("pixels", "the pixel store", sample_nbytes, {pixel_chunk: 1 / chunk_size, SMALL_READ: 1 / chunk_size}, math.inf),
             Kind("encoded", "a sample of the files", encoded, {encoded_chunk: 1 / chunk_size, SMALL_READ: 2 / chunk_size}, decoding)]
    pixel, encoded_epoch = (predict_epoch(kind, count, device, from_device=True) for kind in kinds)
    images = "pixels" if pixel.rate >= encoded_epoch.rate else "encoded"
    return ImagesChoice(images, f"{too_big}; read from this device ({device}), an epoch of pixels would run at "
                                f"about {pixel.rate:,.0f} samples/s and one of encoded pictures at "
                                f"{encoded_epoch.rate:,.0f} ({threads} threads decoding {decoding:,.0f} a second)")


def _decode_rate(paths: Sequence[str], decode: dict[str, Any], read: Callable[[str], bytes], threads: int) -> float:
    """Files decoded a second by ``threads`` threads at once: `DECODED_FILES` spread over ``paths``, read and
    decoded once first, then `TIMED_DECODES` of them (`DECODES_PER_THREAD` a thread, when more) timed on a
    pool already started (files that cannot be read or decoded are left to the ingest, which reports or
    skips them)."""
    picked = [paths[i] for i in np.linspace(0, len(paths) - 1, min(len(paths), DECODED_FILES)).astype(int)]
    blobs = []
    for path in picked:
        try:
            blob = read(path)
            decode_image(blob, decode["shape"], decode["resize"], decode["dtype"], name=str(path))
        except (OutcoreError, OSError):
            continue
        blobs.append((path, blob))
    if not blobs:
        return math.inf  # nothing decodes: the ingest says why; the device alone decides
    work = [blobs[i % len(blobs)] for i in range(max(len(blobs), TIMED_DECODES, DECODES_PER_THREAD * threads))]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(time.sleep, [0.01] * threads))  # every thread started before the clock
        began = time.perf_counter()
        for _ in pool.map(lambda item: decode_image(item[1], decode["shape"], decode["resize"], decode["dtype"],
                                                    name=str(item[0])), work):
            pass
        return len(work) / max(1e-9, time.perf_counter() - began)


def _existing_folder(location: Path) -> Path:
    """The folder the store will be made in, or the nearest one above it that exists."""
    folder = location.absolute().parent
    while not folder.exists():
        folder = folder.parent
    return folder


def _probe(folder: Path, sizes: list[int]) -> DeviceRates:
    """The device under ``folder``, read cold: a probe file written there, measured, removed."""
    probe = folder / f".outcore-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as file:
            block = np.random.default_rng(0).integers(0, 256, 2**20, dtype=np.uint8).tobytes()
            file.writelines(block for _ in range(PROBE_BYTES // len(block)))
            file.flush()
            os.fsync(file.fileno())
        return measure_device([probe], thread_count(), sizes, seconds=1.0)
    finally:
        probe.unlink(missing_ok=True)
