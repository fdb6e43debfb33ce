"""Pixels or encoded pictures, for this store on this machine: ``outcore bench``'s advice, measured.

An epoch is limited by the slower of two: what the cores decode (measured with the real pipeline on a
sample of the store's chunks read from memory) and, when the store does not fit in the memory the page
cache can give (and for a first epoch), what the device delivers (`outcore.storage.device`: its bandwidth
and request rates measured cold on the store's own files, applied to the bytes and reads an epoch
makes): `outcore.storage.epochs`, the model ingest's ``images=None`` uses too. The kinds the store does
not hold are measured on a sample converted to them: pixels (Blosc lz4, ingest's default, and Blosc
`ZSTD`), or JPEGs re-encoded from the pixels (what ``images="encoded", max_side=`` would keep). Where torch
sees a CUDA GPU and torchvision is installed, encoded pictures are also measured decoded there
(``ds.torch(decode="cuda")``, `outcore.adapters.torch_decode`): the kind to choose when the cores are the limit.
Where one process's GIL keeps its threads from the cores, loader processes (``process=``) are timed against
them (`outcore.cli.loaders`).
"""

from __future__ import annotations

import importlib.util
import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import imageio.v3 as iio
import numpy as np

from ..dataset import Dataset
from ..errors import OptionError
from ..format import companion_names
from ..imaging import DEFAULT_QUALITY
from ..ingest import from_arrays, ingest_images
from ..iterate.quality import label_fields
from ..iterate.transforms import CenterCrop, Compose, RandomFlip, RandomResizedCrop, Transform
from ..measure import interleaved, shuffled_epoch
from ..storage import is_url, samples_per_shard
from ..storage.device import SMALL_READ, DeviceRates, measure_device, whole_pages
from ..storage.epochs import GROWTH, LAYOUT_SHARE, Kind, Prediction, predict_epoch
from ..storage.page_cache import PAGE_CACHE_SHARE, Memory, memory
from ..storage.report import codecs, field_reports, human_size
from ..threads import thread_count
from .loaders import Loaders, measure_loaders

ZSTD = "zstd:5:bitshuffle"  # photographs' pixels compress better than with lz4, and decode fast
PIXELS_ZSTD = "pixels, zstd"
SAMPLE_BYTES = 256 * 2**20  # decoded bytes of the chunks the cores are timed on (at most)


@dataclass(frozen=True)
class Advice:
    """What `advise` measured and what it predicts, printed by ``outcore bench``."""

    samples: int
    memory: Memory
    cores: int
    device: DeviceRates | None
    kinds: tuple[Kind, ...]
    loaders: Loaders | None = None  # threads or loader processes for this store's pictures

    def from_device(self, kind: Kind) -> bool:
        """Whether every epoch of ``kind`` reads the device (its bytes do not fit in the page cache)."""
        return self.device is not None and kind.from_device(self.samples, self.memory)

    def predict(self, kind: Kind, cold: bool = False) -> Prediction:
        """``kind``'s epoch (`outcore.storage.epochs.predict_epoch`): read from the device every epoch when it
        does not fit in the page cache and, with ``cold``, the first."""
        return predict_epoch(kind, self.samples, self.device, cold or self.from_device(kind))

    @property
    def choice(self) -> Prediction:
        """The kind with the fastest predicted epoch."""
        return max((self.predict(kind) for kind in self.kinds), key=lambda prediction: prediction.rate)

    def changes(self) -> list[str]:
        """What would make another kind the faster: a faster device, more memory, more cores."""
        best, lines = self.choice, []
        for kind in self.kinds:
            other = self.predict(kind)
            if kind is best.kind:
                continue
            if other.limit == "device" and kind.cpu > best.rate:
                needed = kind.bytes * best.rate
                lines.append(f"{kind.name} with a device reading over {needed / 1e6:,.0f} MB/s, or "
                             f"{human_size(kind.bytes * self.samples / PAGE_CACHE_SHARE)} of memory for the page cache "
                             f"(its epochs then come from memory)")
            if other.limit == "cores" and kind.cpu < best.rate and kind.gpu is None:
                cores = math.ceil(self.cores * best.rate / kind.cpu)
                lines.append(f"{kind.name} with {cores} cores or more (it decodes {kind.cpu / self.cores:,.0f} "
                             f"samples/s per core)")
        return lines

    def layout(self) -> list[str]:
        """Where this store's chunks are too small for the device: read from it every epoch, its request
        rate, not its bandwidth, bounds them; and how fast chunks `GROWTH` times as large were read.

        >>> kind = Kind("pixels", "this store", bytes=3_000, reads={384_000: 1 / 128, 4096: 1 / 128}, cpu=90_000)
        >>> device = DeviceRates(150e6, {384_000: 140.0, 1_536_000: 90.0, 4096: 150.0}, in_flight=2)
        >>> print(*Advice(10**6, Memory(2**30, None), 2, device, (kind,)).layout())
        pixels: chunks of 375.0 KiB are read 140 a second here, 54 MB/s of the device's 150 MB/s: its requests, not its bytes, bound the epochs; chunks of 512 samples read at 138 MB/s (ingest's chunk_size=512)
        """
        lines = []
        for kind in self.kinds:
            if self.device is None or kind.source != "this store" or self.predict(kind).limit != "device":
                continue
            size = max(kind.reads)
            rate = self.device.reads[size]
            if rate * size >= LAYOUT_SHARE * self.device.bandwidth:
                continue
            line = (f"{kind.name}: chunks of {human_size(size)} are read {rate:,.0f} a second here, "
                    f"{rate * size / 1e6:,.0f} MB/s of the device's {self.device.bandwidth / 1e6:,.0f} MB/s: its "
                    "requests, not its bytes, bound the epochs")
            larger = self.device.reads.get(GROWTH * size)
            if larger is not None:
                samples = GROWTH * round(1 / kind.reads[size])
                line += (f"; chunks of {samples} samples read at {larger * GROWTH * size / 1e6:,.0f} MB/s (ingest's "
                         f"chunk_size={samples})")
            lines.append(line)
        return lines

    def __str__(self) -> str:
        size = max(kind.bytes for kind in self.kinds if kind.source == "this store") * self.samples
        limit = f", a memory limit of {human_size(self.memory.limit or 0)}" if self.memory.limit is not None else ""
        room = f"memory for the page cache: {human_size(self.memory.available)}{limit}; the store: {human_size(size)}"
        device = (f"device, read cold: {self.device}" if self.device is not None
                  else "device: not measured (an object store: see the epoch's traffic below)")
        lines = [f"{room}; cores: {self.cores}", device, ""]
        width = max(13, *(len(kind.name) for kind in self.kinds))
        header = (f"{'kind':{width}s} {'measured on':40s} {'bytes/sample':>12s} {'reads/epoch':>11s} {'cores/s':>8s} "
                  f"{'1st epoch/s':>11s} {'later/s':>8s} {'from':>6s}  limit")
        lines += [header, "-" * len(header)]
        for kind in self.kinds:
            first, later = self.predict(kind, cold=True), self.predict(kind)
            reads = sum(kind.reads.values()) * self.samples
            lines.append(f"{kind.name:{width}s} {kind.source:40s} {kind.bytes:12,.0f} {reads:11,.0f} {kind.cpu:8,.0f} "
                         f"{first.rate:11,.0f} {later.rate:8,.0f} "
                         f"{'device' if self.from_device(kind) else 'memory':>6s}  {later.limit}")
        best = self.choice
        others = [self.predict(kind) for kind in self.kinds if kind is not best.kind]
        ratio = ", ".join(f"{best.rate / other.rate:.2f}x {other.kind.name}" for other in others)
        lines += ["", f"choose: {best.kind.name} ({ratio}; limited by the {best.limit})"]
        if best.kind.gpu is not None:
            lines += [f"that is: this store, read with ds.torch(..., decode={best.kind.gpu!r})"]
        lines += [f"it would change: {line}" for line in self.changes()]
        lines += [f"layout: {line}" for line in self.layout()]
        if self.loaders is not None:
            lines += ["", str(self.loaders)]
        return "\n".join(lines)


def advise(ds: Dataset, batch_size: int = 256, crop: int = 224, seconds: float = 2.0,
           gpu: str | None = None, processes: Sequence[int] | None = None) -> Advice:
    """Measure this machine for ``ds`` and predict its epochs as pixels and as encoded pictures, and as encoded
    pictures decoded on ``gpu`` (a torch device; default: ``"cuda"`` where torch sees one and torchvision is
    installed, `cuda_decoding`). This store's epochs made by loader ``processes`` are timed against this
    process's threads (default: where its GIL share keeps the threads from the cores, `measure_loaders`).

    Evicts the store's pages from the page cache (to measure the device) and writes converted samples
    into a temporary folder.

    >>> print(advise(outcore.open_dataset("train.zarr")))  # doctest: +SKIP
    memory for the page cache: 0.4 GiB, a memory limit of 0.5 GiB; the store: 1.0 GiB; cores: 2
    ...
    choose: encoded (1.93x pixels; limited by the cores)
    """
    images = picture_fields(ds)
    if not images:
        raise OptionError(f"{ds.location} holds no image field: there is no pixels-or-encoded choice to make")
    targets = label_fields(ds)  # one value per sample: not maps, nor boxes
    room = memory()
    sample = _sample_indices(ds, images[0], min(SAMPLE_BYTES, room.available // 8))
    measured = {name: _measure(ds, name, targets, sample, "this store", batch_size, crop) for name in images}
    kinds = list(measured.values())
    held = {kind.name for kind in kinds}
    encoded = next((name for name, kind in measured.items() if kind.name == "encoded"), None)
    gpu = gpu or cuda_decoding()
    if gpu is not None and encoded is not None:
        kinds.append(_decoded_on(ds, encoded, targets, sample, batch_size, crop, gpu, measured[encoded]))
    if len(held) == 1 or PIXELS_ZSTD not in held:
        kinds += _converted(ds, images[0], targets, sample, held, batch_size, crop)
    sizes = sorted({size for kind in kinds for size in kind.reads}
                   | {GROWTH * max(kind.reads) for kind in kinds if kind.source == "this store"})
    device = None if is_url(ds.location) else measure_device(_files(Path(ds.location)), thread_count(), sizes,
                                                             seconds)
    loaders = measure_loaders(ds, [images[0], *targets], sample, batch_size, _transform(ds, images[0], crop),
                              thread_count(), seconds, processes)
    return Advice(len(ds), room, thread_count(), device, tuple(kinds), loaders)


def cuda_decoding() -> str | None:
    """``"cuda"`` where encoded pictures can be decoded on a GPU here (torch sees one, torchvision is installed),
    else None; torch is imported only where it is installed."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is None:
        return None
    import torch

    return "cuda" if torch.cuda.is_available() else None


def _decoded_on(ds: Dataset, field: str, targets: Sequence[str], sample: np.ndarray, batch_size: int, crop: int,
                device: str, encoded: Kind, repeats: int = 3) -> Kind:
    """The store's ``encoded`` kind decoded on ``device`` (``ds.torch(decode=device)``): its bytes and reads, and
    an epoch of ``sample`` from memory, the device's work waited for."""
    import torch

    loader = ds.torch(batch_size, fields=[field, *targets], indices=sample, transform=_transform(ds, field, crop),
                      shuffle=True, seed=1, decode=device)

    def epoch() -> int:
        count = sum(len(batch[field]) for batch in loader)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        return count

    epoch()
    rate = interleaved({field: epoch}, repeats)[field]
    return Kind(f"encoded, decode={device}", f"this store, decoded on {device}", encoded.bytes, encoded.reads, rate,
                device)


def picture_fields(ds: Dataset) -> list[str]:
    """The fields that hold pictures: encoded ones, and ``uint8`` pixels of (N, H, W) or (N, H, W, C)."""
    def is_picture(name: str) -> bool:
        info, array = ds.info(name), ds.array(name)
        return info.is_image or (not info.is_text and array.dtype == np.uint8 and array.ndim in (3, 4))

    return [name for name in ds.fields if is_picture(name)]


def _files(root: Path) -> list[Path]:
    return [root] if root.is_file() else sorted(path for path in root.rglob("*") if path.is_file())


def _kind_name(ds: Dataset, field: str) -> str:
    if ds.info(field).is_image:
        return "encoded"
    return PIXELS_ZSTD if ZSTD in codecs(ds.array(field)) else "pixels"


def _sample_indices(ds: Dataset, field: str, nbytes: int) -> np.ndarray:
    """Whole chunks, spread over the store, of about ``nbytes`` decoded (two at least)."""
    decoded = next(report.decoded for report in field_reports(ds) if report.name == field)
    chunks = max(2, min(ds.num_chunks, nbytes * ds.num_chunks // max(1, decoded)))
    picked = np.unique(np.linspace(0, ds.num_chunks - 1, chunks).round().astype(int))
    return np.concatenate([np.arange(k * ds.chunk_size, min(len(ds), (k + 1) * ds.chunk_size)) for k in picked])


def _transform(ds: Dataset, field: str, crop: int) -> Transform | None:
    if _variable(ds, field):
        return Compose([RandomResizedCrop(crop, field=field), RandomFlip(field=field)])
    return None


def _variable(ds: Dataset, field: str) -> bool:
    decode = ds.info(field).decode
    return decode is not None and decode.variable


def _measure(ds: Dataset, field: str, targets: Sequence[str], sample: np.ndarray, source: str, batch_size: int,
             crop: int, repeats: int = 3) -> Kind:
    """``field``'s kind as ``ds`` stores it: bytes and reads per sample, and an epoch of ``sample`` from
    memory (read once first) on all cores."""
    fields = [field, *targets]
    stored = {report.name: report.stored for report in field_reports(ds)}
    nbytes = sum(stored[name] for name in fields)  # an encoded field's: its files' bytes and their ranges
    chunk_bytes = whole_pages(ds.array(field).nbytes_stored() / ds.num_chunks)
    companions = companion_names(field, _variable(ds, field)) if ds.info(field).is_image else []
    # Small arrays (labels, an encoded field's ranges) are read a page at a time, and a page holds the
    # chunks beside the one asked for: each page of their shard files is one request an epoch.
    small = sum(max(_shard_files(ds, name), whole_pages(ds.array(name).nbytes_stored()) // SMALL_READ)
                for name in [*targets, *companions])
    reads = {chunk_bytes: 1 / ds.chunk_size, SMALL_READ: small / len(ds)}
    transform = _transform(ds, field, crop)

    def epoch() -> int:
        return shuffled_epoch(ds, fields, batch_size, indices=sample, transform=transform, seed=1)

    epoch()
    cpu = interleaved({field: epoch}, repeats)[field]
    return Kind(_kind_name(ds, field), source, nbytes / len(ds), reads, cpu)


def _shard_files(ds: Dataset, name: str) -> int:
    """The shard files of array ``name`` (a small field's hold more samples than the pictures')."""
    return math.ceil(len(ds) / samples_per_shard(ds.array(name), ds.chunk_size))


def _converted(ds: Dataset, field: str, targets: Sequence[str], sample: np.ndarray, held: set[str],
               batch_size: int, crop: int) -> list[Kind]:
    """The kinds not ``held``, each measured on ``sample`` converted into a temporary store: encoded
    pictures (quality-90 JPEGs of the pixels), pixels compressed as ingest does, and pixels compressed
    with Blosc zstd (`ZSTD`)."""
    pixels, labels = _sample_pixels(ds, field, targets, sample, batch_size, crop)
    roles = {"images": "input", **dict.fromkeys(labels, "target")}
    decoded = f"{len(pixels):,} samples decoded" + (f", {crop}x{crop} crops" if _variable(ds, field) else "")
    kinds = []
    with tempfile.TemporaryDirectory(prefix="outcore-bench-") as scratch:
        for name, compression in (("pixels", None), (PIXELS_ZSTD, ZSTD)):
            if name not in held:
                converted = from_arrays({"images": pixels, **labels}, Path(scratch) / f"{name}.zarr", roles=roles,
                                        compression=compression, shuffle_on_write=False, progress=False)
                source = decoded if "encoded" in held else f"{len(pixels):,} samples recompressed"
                kinds.append(_measure(converted, "images", list(labels), np.arange(len(pixels)), source,
                                      batch_size, crop))
        if "encoded" not in held:
            folder = Path(scratch) / "pictures" / "all"
            folder.mkdir(parents=True)
            for i, picture in enumerate(pixels):
                iio.imwrite(folder / f"{i:07d}.jpg", picture, quality=DEFAULT_QUALITY)
            converted = ingest_images(folder.parent, Path(scratch) / "encoded.zarr", shape=pixels.shape[1:],
                                      images="encoded", shuffle_on_write=False, progress=False)
            kinds.append(_measure(converted, "images", ["labels"], np.arange(len(converted)),
                                  f"{len(pixels):,} samples as quality-{DEFAULT_QUALITY} JPEGs", batch_size, crop))
    return kinds


def _sample_pixels(ds: Dataset, field: str, targets: Sequence[str], sample: np.ndarray, batch_size: int,
                   crop: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The pixels and targets of ``sample`` (pictures of varying sizes: their central ``crop``)."""
    transform = CenterCrop(crop, resize=crop, field=field) if _variable(ds, field) else None
    pixels, labels = None, {name: np.empty(len(sample), ds.array(name).dtype) for name in targets}
    done = 0
    for batch in ds.batches(batch_size, fields=[field, *targets], shuffle=False, indices=sample, transform=transform):
        if pixels is None:
            pixels = np.empty((len(sample), *batch[field].shape[1:]), batch[field].dtype)
        pixels[done : done + len(batch[field])] = batch[field]
        for name in targets:
            labels[name][done : done + len(batch[field])] = batch[name]
        done += len(batch[field])
    assert pixels is not None and done == len(sample)
    return pixels, labels
