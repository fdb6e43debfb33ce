"""Decode on a Dask cluster: what a worker spends per sample, how fast batches reach the consumer, how it scales.

    python benchmarks/cluster.py [--images 20000] [--copies 1] [--size 128] [--repeats 3] [--workers 1,2]
                                 [--settings dask,outcore] [--scheduler here] [--span-mib auto] [--consumers 2]
                                 [--crop-flip] [--workdir bench-data]

Writes ``--images`` photo crops as quality-90 JPEGs (kept in ``--workdir``), ingests them as an encoded
store (``images="encoded"``: the JPEG bytes; with ``--copies n``, each file n times, as hard links, for
epochs long enough to keep many workers busy) and measures in one run, with medians over ``--repeats``
shuffled epochs, each iterator's first two not counted, as a training run's epochs follow one another
(batch 256, no transform; with ``--crop-flip``, a random crop of 7/8 of the side and a flip, cut while
decoding, whose cost then counts against the plain bare decode):

- **bare decode**: each worker of a cluster, all at once, decodes stored JPEGs (read beforehand) into
  batch arrays in a tight loop, as outcore decodes fastest (a batch's plain JPEGs together, in C), each
  pass over other samples (an epoch's inputs are not in the caches either): the CPU a sample needs at
  the least, on the same cores, under the same load;
- **an epoch on a** ``distributed.LocalCluster`` of each of ``--workers`` single-threaded worker
  processes (``ds.batches(client=...)``): samples/s delivered to this process; the CPU its workers spent
  per sample (their processes' user + system time, event loops included) against the bare decode, and
  the part their event loops took (``loop us``: Dask's messages, heartbeats and monitors); the
  consumer's CPU per sample (this process: the scheduler of a LocalCluster runs here too); the chunks
  read per epoch over the store's (``reads``: 1.00 is each once; `outcore.testing.reads`); the most
  shared memory this process's batch files held at once (``shm MiB``, sampled every 20 ms: batches
  waiting, held, and free for the next; the bound is twice the worker threads' spans (`SPAN_BYTES` each),
  the consumer's ``prefetch`` batches, and at an epoch's end the next epoch's first spans); and the
  rate against ``n`` workers' bare decode (1.00: the cluster costs nothing beyond decoding); each
  cluster started with each of ``--settings``, in turn: ``dask``, Dask's defaults, and ``outcore``,
  `outcore.WORKER_CONFIG` (no statistical profiler, a tick a second); and with each of ``--scheduler``:
  ``here``, a ``LocalCluster`` (its scheduler, and the nannies of its workers, run in this process, on
  the event loop of this process's client), ``apart``, distributed's ``SubprocessCluster`` (experimental
  there: the scheduler and each worker in processes of their own; the scheduler's CPU then counts
  nowhere in the table); and on each cluster, with each of ``--span-mib``: ``auto``, spans of at most
  outcore's `outcore.iterate.cluster.SPAN_BYTES` of batches (64 MiB), or of that many MiB (fewer,
  larger tasks against more shared memory held: ``shm MiB``);
- **the workers' wall time** in each of those epochs, from the scheduler's task stream (`worker_time`):
  the share spent running spans, waiting between two (for the consumer to submit the next, or for the
  scheduler to send it), and before the epoch's first span or after its last (``edges``); the gaps
  between a worker's spans and the spans' lengths (median and 90th percentile): where the idle share of
  a large cluster goes;
- **delivery**: blank batches of the same shape made on every worker of the largest cluster (started
  with the first of ``--settings``, as are the two measures below) and received here: through shared
  memory (what a consumer on the workers' machine gets) and over Dask's sockets
  (``OUTCORE_SHARED_MEMORY=0``, or a consumer on another machine): taken as outcore takes them (straight
  from the workers it reaches, `outcore.iterate.direct`) and through the scheduler (Dask's default, and
  outcore's for workers it does not reach), in GB/s;
- **epoch boundaries**: on the largest cluster, epochs of 10 batches (a store of the first 2,560 JPEGs)
  with a 10 ms pause per batch standing for a training step, median of epochs 2-7: the next epoch
  started as one drains (`outcore.iterate.runs.NextEpoch`, what outcore does) against started when the
  consumer asks for it (``NextEpoch.handed`` patched out), interleaved ``--repeats`` times;
- **several consumers**: ``--consumers`` processes, ranks of one job, each reading its share of the epoch
  from the largest cluster at once: their total rate against one consumer alone;
- for comparison, the same store read with local threads in this process.

Scaling needs more cores than workers (the consumer and the scheduler need theirs): run ``--workers
1,2,4,8`` on a 16-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self
from unittest import mock

import dask
import numpy as np
import psutil
from common import local_cluster, prepare
from distributed import Client, LocalCluster, get_task_stream
from distributed.deploy.subprocess import SubprocessCluster

import outcore
from outcore.format.encoded import pack_regions
from outcore.imaging import decode_image
from outcore.imaging.decode import decode_plain_jpegs
from outcore.iterate import Transform
from outcore.iterate.direct import straight_from_workers
from outcore.iterate.runs import NextEpoch
from outcore.iterate.shared import LOCK, PREFIX, SHARED_ROOT, Mailbox, Slot
from outcore.storage import blocks, read_files
from outcore.testing.reads import chunk_reads, count_chunk_reads
from outcore.transforms import Compose, RandomCrop, RandomFlip

BATCH = 256
STEP_SECONDS = 0.01  # a training step, in the epoch-boundary rows
SHORT_EPOCH = 10  # batches per epoch in the epoch-boundary rows
SETTINGS = {"dask": {}, "outcore": outcore.WORKER_CONFIG}  # the workers' Dask settings (--settings)
SCHEDULERS = ("here", "apart")  # where the cluster's scheduler runs (--scheduler)


@contextlib.contextmanager
def started(workers: int, settings: str, scheduler: str) -> Iterator[tuple[LocalCluster | SubprocessCluster, Client]]:
    """A cluster of ``workers`` single-threaded worker processes with the Dask ``settings`` named, its
    scheduler in this process (``here``: a ``LocalCluster``) or in a process of its own (``apart``: a
    ``SubprocessCluster``, whose processes take the settings from their environment), and a client of it
    once every worker is in."""
    environment = outcore.worker_environment() if settings == "outcore" and scheduler == "apart" else {}
    with dask.config.set(SETTINGS[settings]), mock.patch.dict(os.environ, environment):
        opened = local_cluster(workers) if scheduler == "here" else _subprocess_cluster(workers)
        with opened as (cluster, client):
            profiled = set(client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks).values())
            if profiled != {settings == "dask"}:  # a row of the other settings would be silently wrong
                raise RuntimeError(f"the workers of a {scheduler} cluster did not start with --settings {settings}")
            yield cluster, client


@contextlib.contextmanager
def _subprocess_cluster(workers: int) -> Iterator[tuple[SubprocessCluster, Client]]:
    with SubprocessCluster(host="127.0.0.1", n_workers=workers, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers, timeout=120)
        yield cluster, client


def spans_of(mib: str) -> contextlib.AbstractContextManager[object]:
    """Spans of ``mib`` MiB of batches on every cluster while open (``auto``: as outcore chooses them)."""
    if mib == "auto":
        return contextlib.nullcontext()
    return mock.patch("outcore.iterate.cluster.SPAN_BYTES", int(mib) << 20)


def encoded_store(source: Path, target: Path, shape: tuple[int, ...]) -> outcore.Dataset:
    if target.exists():
        ds = outcore.open_dataset(target)
        if ds.attrs.provenance.get("source", "").endswith(str(source.absolute())) and ds["images"].shape[1:] == shape:
            return ds
    print(f"ingesting {source} -> {target} …", flush=True)
    return outcore.ingest_images(source, target, shape=shape, images="encoded", overwrite=True)


def linked_copies(source: Path, copies: int) -> Path:
    """``source``'s files ``copies`` times over, as hard links in a folder beside it (``source`` for 1)."""
    if copies == 1:
        return source
    target = source.with_name(f"{source.name}-x{copies}")
    if not target.exists():
        making = target.with_name(f"{target.name}.making")
        for path in sorted(source.rglob("*.jpg")):
            folder = making / path.parent.relative_to(source)
            folder.mkdir(parents=True, exist_ok=True)
            for copy in range(copies):
                os.link(path, folder / f"{copy}-{path.name}")
        making.rename(target)
    return target


def linked_subset(source: Path, count: int) -> Path:
    """The first ``count`` of ``source``'s files, as hard links in a folder beside it."""
    target = source.with_name(f"{source.name}-first{count}")
    if not target.exists():
        making = target.with_name(f"{target.name}.making")
        for path in sorted(source.rglob("*.jpg"))[:count]:
            folder = making / path.parent.relative_to(source)
            folder.mkdir(parents=True, exist_ok=True)
            os.link(path, folder / path.name)
        making.rename(target)
    return target


def short_epochs(ds: outcore.Dataset, client: Client, ahead: bool, epochs: int = 8) -> float:
    """Samples/s of epochs 2.. of ``ds`` (a few batches each) with a 10 ms pause per batch standing for a
    training step, with the next epoch started as one drains (``ahead``, what outcore does) or not."""
    it = ds.batches(BATCH, fields=["images", "labels"], client=client, prefetch=4)
    rates = []
    with contextlib.nullcontext() if ahead else mock.patch.object(NextEpoch, "handed", lambda *_: None):
        for _ in range(epochs):
            began, samples = time.perf_counter(), 0
            for batch in it:
                samples += len(batch["labels"])
                time.sleep(STEP_SECONDS)
            rates.append(samples / (time.perf_counter() - began))
        it.close()
    return statistics.median(rates[2:])


def bare_decode(location: str, count: int, repeats: int, worker: int) -> float:
    """On worker ``worker``: CPU seconds per sample to decode stored JPEGs into batch arrays (median of
    ``repeats`` passes over ``count`` samples each, a stretch of its own per worker and pass: inputs not
    in the caches, as an epoch's are not; the bytes are read and packed a batch to a buffer beforehand),
    the fastest way outcore decodes them: the plain JPEGs of a batch together in C (`decode_plain_jpegs`),
    any others one by one (`decode_image`, also all of them without the C extension), into a new batch
    array each time, placed as outcore places its batches (`outcore.storage.blocks.empty`)."""
    ds = outcore.open_dataset(location)
    shape, dtype = ds["images"].shape[1:], np.dtype("uint8")
    costs = []
    for repeat in range(repeats):
        start = (worker * repeats + repeat) * count % max(1, len(ds) - count)
        blobs = read_files(ds.array("images"), ds.array("images_ranges"), start, start + count)
        batches = [blobs[low : low + BATCH] for low in range(0, count, BATCH)]
        batches = [(files, *pack_regions(files, len(files), sum(map(len, files)))) for files in batches]
        began = time.thread_time()
        for files, region, ranges in batches:
            out, rows = blocks.empty((len(files), *shape), dtype), np.arange(len(files))
            for i in decode_plain_jpegs([region], [ranges], np.zeros_like(rows), rows, out, rows):
                decode_image(files[i], shape, "crop", dtype, out=out[i])
        costs.append((time.thread_time() - began) / count)
    return statistics.median(costs)


def on_every_worker(client: Client, function: object, *args: object, direct: bool | None = None) -> list[object]:
    """``function(*args, i)`` on every worker ``i`` at once (one task each), their answers (taken straight from
    the workers, or through the scheduler: ``direct``, Dask's default when None)."""
    futures = [client.submit(function, *args, i, workers=[address], pure=False, allow_other_workers=False)
               for i, address in enumerate(client.scheduler_info()["workers"])]
    return client.gather(futures, direct=direct)


def workers_cpu(client: Client) -> tuple[float, float]:
    """CPU seconds (user + system) the workers' processes have used so far, together, and the part their event
    loops' threads used (`Client.run` calls a function on the worker's event loop)."""
    used = client.run(lambda: (sum(psutil.Process().cpu_times()[:2]), time.thread_time())).values()
    return sum(process for process, _ in used), sum(loop for _, loop in used)


class SharedPeak:
    """The most bytes this process's batch folders in /dev/shm held at once, sampled every 20 ms while open."""

    def __init__(self) -> None:
        self.peak, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            held = 0
            for folder in SHARED_ROOT.glob(f"{PREFIX}{os.getpid()}-*"):
                with contextlib.suppress(OSError), os.scandir(folder) as entries:
                    for entry in entries:
                        with contextlib.suppress(OSError):  # taken, freed or removed meanwhile
                            held += entry.stat().st_size if entry.name != LOCK else 0
            self.peak = max(self.peak, held)


def epoch(ds: outcore.Dataset, client: Client | None, repeats: int, transform: Transform | None) -> dict[str, float]:
    """Samples/s of full shuffled epochs (median), the workers' and this process's CPU per sample, the chunks
    read per epoch over the store's (with the next epoch's first spans, started as one drains), and where the
    workers' time went (`worker_time`). The iterator's first two epochs are not measured: its epochs from
    the third on are what a training run spends most of its time in, each started as the one before drains
    (`NextEpoch`, from the second epoch on). On 2 cores, 2 workers, 1-second epochs, after one batch taken
    and the iterator closed (as this benchmark did until 2026-11-26): the first epoch delivered 0.75x the
    later ones (each worker waited 130-150 ms for its first span, behind the spans of the closed epoch,
    and idled up to 60 ms at its end, no next epoch started), the second 0.92x (waits of 30 ms)."""
    it = ds.batches(BATCH, fields=["images", "labels"], client=client, prefetch=4, transform=transform)
    for _ in range(2):
        for _ in it:
            pass
    if client is None:
        count_chunk_reads()
    else:
        client.run(count_chunk_reads)
    rates, worker, loop, consumer, windows = [], [], [], [], []
    with SharedPeak() as shared, get_task_stream(client) if client else contextlib.nullcontext() as stream:
        for _ in range(repeats):
            cpu, mine, began = workers_cpu(client) if client else (0.0, 0.0), time.process_time(), time.perf_counter()
            window = time.time()
            samples = sum(len(batch["labels"]) for batch in it)
            windows.append((window, time.time()))
            rates.append(samples / (time.perf_counter() - began))
            consumer.append((time.process_time() - mine) / samples)
            spent = workers_cpu(client) if client else (0.0, 0.0)
            worker.append((spent[0] - cpu[0]) / samples)
            loop.append((spent[1] - cpu[1]) / samples)
        if client:  # the spans running as the last epoch ended enter the task stream once they finish
            settled(client)
    reads = sum(client.run(chunk_reads).values()) if client else chunk_reads()
    timeline = worker_time(stream.data, windows, list(client.scheduler_info()["workers"])) if client else {}
    return {"rate": statistics.median(rates), "worker": statistics.median(worker), "loop": statistics.median(loop),
            "consumer": statistics.median(consumer), "reads": reads / (repeats * math.ceil(len(ds) / ds.chunk_size)),
            "shm MiB": shared.peak / 2**20, **timeline}


def settled(client: Client, seconds: float = 60.0) -> None:
    """Wait until no worker of ``client`` runs or holds a task (at most ``seconds``, then say so: the spans
    still running are missing from the workers' wall time)."""
    deadline = time.monotonic() + seconds
    while any(client.processing().values()):
        if time.monotonic() > deadline:
            print(f"(tasks still running after {seconds:g} s: the workers' wall time below misses them)", flush=True)
            return
        time.sleep(0.05)


def worker_time(tasks: list[dict], windows: list[tuple[float, float]], workers: list[str]) -> dict[str, float]:
    """Where the workers' wall time went in the epochs ``windows`` (``time.time()`` at each epoch's start and
    end), from the scheduler's task stream: the share spent running spans (``busy``), waiting between two
    (``between``: for a span's submission, or for the scheduler to send it), and before an epoch's first span
    or after its last (``edges``), medians over the epochs; the gaps between a worker's spans and the spans'
    lengths, in seconds (medians and 90th percentiles over every epoch's)."""
    runs: dict[str, list[tuple[float, float]]] = {worker: [] for worker in workers}
    for task in tasks:
        if str(task["key"]).startswith("outcore-span-") and task["worker"] in runs:
            runs[task["worker"]] += [(part["start"], part["stop"]) for part in task["startstops"]
                                     if part["action"] == "compute"]
    shares: dict[str, list[float]] = {"busy": [], "between": [], "edges": []}
    gaps, lengths = [], []
    for low, high in windows:
        spent = dict.fromkeys(shares, 0.0)
        for intervals in runs.values():
            inside = sorted((max(start, low), min(stop, high)) for start, stop in intervals if stop > low and start < high)
            busy = sum(stop - start for start, stop in inside)
            edges = (inside[0][0] - low) + (high - inside[-1][1]) if inside else high - low
            spent["busy"] += busy
            spent["edges"] += edges
            spent["between"] += (high - low) - busy - edges
            gaps += [max(0.0, later[0] - earlier[1]) for earlier, later in itertools.pairwise(inside)]
            lengths += [stop - start for start, stop in inside[1:-1]]  # whole spans: not cut by the window
        for name, values in shares.items():
            values.append(spent[name] / (len(runs) * (high - low)))
    quantiles = {f"{name} {q}": float(np.percentile(values, q)) if values else math.nan
                 for name, values in (("gap", gaps), ("span", lengths)) for q in (50, 90)}
    return {**{name: statistics.median(values) for name, values in shares.items()}, **quantiles}


def blank_batches(slot: Slot | None, shape: tuple[int, ...], count: int, worker: int) -> list[object]:
    """On a worker: ``count`` batches of ones, made as a batch task makes them (into shared memory when the
    consumer is on this machine)."""
    made = []
    for _ in range(count):
        arena = slot.arena() if slot is not None else None
        images = (np.empty if arena is None else arena.empty)((BATCH, *shape), np.dtype("uint8"))
        images.fill(1)
        batch = {"images": images}
        made.append(batch if arena is None else arena.publish(batch))
    return made


def delivery(client: Client, shape: tuple[int, ...], shared: bool, repeats: int, direct: bool | None = None) -> float:
    """GB/s of blank batches made on every worker and received (and read once) here (in a shared-memory
    folder of its own, removed after: its many files would be kept for the epochs measured next; else
    over sockets, straight from the workers or through the scheduler: ``direct``)."""
    root = Path(tempfile.mkdtemp(dir=SHARED_ROOT))
    mailbox = Mailbox.open(root) if shared else None
    workers = len(client.scheduler_info()["workers"])
    per_worker = max(2, 64 // workers)
    slot = None if mailbox is None else mailbox.slot
    rates = []
    try:
        for _ in range(repeats + 1):  # the first warms the recycled files up
            began, received = time.perf_counter(), 0
            for made in on_every_worker(client, blank_batches, slot, shape, per_worker, direct=direct):
                for batch in made:
                    images = (mailbox.receive(batch) if mailbox else batch)["images"]
                    received += int(images.max()) * images.nbytes
                    del images
            rates.append(received / (time.perf_counter() - began) / 1e9)
    finally:
        if mailbox is not None:
            mailbox.close()
        shutil.rmtree(root)
    return statistics.median(rates[1:])


CONSUMER = """
import sys, time, outcore
from distributed import Client
address, location, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Client(address) as client:
    ds = outcore.open_dataset(location)
    it = ds.batches({batch} // world, fields=["images", "labels"], client=client, prefetch=4, rank=rank, world_size=world)
    next(iter(it)); it.close()
    print("ready", flush=True); sys.stdin.readline()
    began = time.perf_counter()
    samples = sum(len(b["labels"]) for b in it)
    print(samples / (time.perf_counter() - began), flush=True)
"""


def consumers(address: str, location: str, count: int) -> float:
    """Total samples/s of ``count`` consumer processes (ranks of one job) reading one epoch from one cluster,
    started together once each has opened the store."""
    script = CONSUMER.format(batch=BATCH)
    procs = [subprocess.Popen([sys.executable, "-c", script, address, location, str(rank), str(count)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for rank in range(count)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    rates = [float(proc.stdout.readline()) for proc in procs]
    for proc in procs:
        proc.wait()
    return sum(rates)


def largest(client: Client, address: str, location: str, short: outcore.Dataset, shape: tuple[int, ...],
            args: argparse.Namespace) -> dict[str, object]:
    """On the largest cluster: delivery through shared memory and over sockets, epoch boundaries, consumers."""
    straight = straight_from_workers(client, client.scheduler_info()["workers"])
    found: dict[str, object] = {"shared GB/s": delivery(client, shape, True, args.repeats),
                                "sockets GB/s": delivery(client, shape, False, args.repeats, direct=straight),
                                "relayed GB/s": delivery(client, shape, False, args.repeats, direct=False)}
    runs = [(ahead, short_epochs(short, client, ahead)) for _ in range(args.repeats) for ahead in (True, False)]
    found["short epochs"] = {key: statistics.median(rate for ahead, rate in runs if ahead == (key == "ahead"))
                             for key in ("ahead", "not ahead")}
    if args.consumers > 1:
        found["consumers"] = {1: consumers(address, location, 1), args.consumers: consumers(address, location, args.consumers)}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--copies", type=int, default=1, help="ingest each JPEG this many times (longer epochs)")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="LocalCluster sizes, comma-separated (1 first)")
    parser.add_argument("--consumers", type=int, default=2, help="consumer processes sharing the largest cluster")
    parser.add_argument("--crop-flip", action="store_true", help="a random crop and flip after decoding")
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--settings", default="dask,outcore",
                        help="the workers' Dask settings, comma-separated: dask (its defaults), outcore (WORKER_CONFIG)")
    parser.add_argument("--scheduler", default="here",
                        help="where each cluster's scheduler runs, comma-separated: here (LocalCluster), apart "
                             "(SubprocessCluster)")
    parser.add_argument("--span-mib", default="auto",
                        help="batch bytes per span on each cluster, comma-separated: auto (outcore's choice), or MiB")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    for option, given, known in (("--settings", args.settings, SETTINGS), ("--scheduler", args.scheduler, SCHEDULERS)):
        if unknown := set(given.split(",")) - set(known):
            parser.error(f"{option} {given}: {', '.join(sorted(unknown))} is not one of {', '.join(known)}")
    spans = args.span_mib.split(",")
    if unknown := [span for span in spans if span != "auto" and not span.isdigit()]:
        parser.error(f"--span-mib {args.span_mib}: {', '.join(unknown)} is neither auto nor a whole number of MiB")
    sizes = [int(n) for n in args.workers.split(",")]
    workdir = Path(args.workdir)
    shape = (args.size, args.size, 3)
    source = workdir / f"jpeg-{args.size}-{args.images}"
    prepare(source, args.images, args.size)
    source = linked_copies(source, args.copies)
    ds = encoded_store(source, workdir / f"encoded-{source.name}.zarr", shape)
    location = str(Path(ds.location).absolute())
    probe = min(len(ds), 4096)
    subset = linked_subset(source, BATCH * SHORT_EPOCH)
    short = encoded_store(subset, workdir / f"encoded-{subset.name}.zarr", shape)

    transform = Compose([RandomCrop(args.size * 7 // 8), RandomFlip()]) if args.crop_flip else None
    local = epoch(ds, None, args.repeats, transform)
    results: dict[str, object] = {"cores": os.cpu_count(), "local threads": local["rate"], "clusters": {}}
    print(f"{len(ds)} JPEGs of {args.size}x{args.size} ({args.copies} cop(ies) of {args.images}); "
          f"{'crop + flip; ' if transform else ''}{os.cpu_count()} cores; batch {BATCH}; medians of "
          f"{args.repeats}\n")
    print(f"local threads in this process: {local['rate']:.0f} samples/s, chunk reads / chunks {local['reads']:.2f}\n")
    header = (f"{'workers':>22s} {'samples/s':>10s} {'vs 1 worker':>11s} {'vs n x bare':>11s} "
              f"{'bare us':>8s} {'worker us':>9s} {'loop us':>7s} {'worker/bare':>11s} {'consumer us':>11s} {'reads':>6s} "
              f"{'shm MiB':>8s}")
    print(header)
    print("-" * len(header), flush=True)
    timelines: list[tuple[str, dict[str, float]]] = []
    first, kinds = None, [(kind, where) for where in args.scheduler.split(",") for kind in args.settings.split(",")]
    for workers in sizes:
        for kind, where in kinds:
            with started(workers, kind, where) as (running, client):
                bare = statistics.median(on_every_worker(client, bare_decode, location, probe, args.repeats))
                for span in spans:
                    with spans_of(span):
                        got = epoch(ds, client, args.repeats, transform)
                    first = first or got["rate"]
                    name = f"{workers}, {kind}" + (", apart" if where == "apart" else "") + (
                        f", {span}M" if span != "auto" else "")
                    print(f"{name:>22s} {got['rate']:10.0f} {got['rate'] / first:11.2f} "
                          f"{got['rate'] * bare / workers:11.2f} {bare * 1e6:8.0f} {got['worker'] * 1e6:9.0f} "
                          f"{got['loop'] * 1e6:7.1f} {got['worker'] / bare:11.2f} {got['consumer'] * 1e6:11.0f} "
                          f"{got['reads']:6.2f} {got['shm MiB']:8.0f}", flush=True)
                    results["clusters"].setdefault(name.split(", ", 1)[1], {})[workers] = {**got, "bare": bare}
                    timelines.append((name, got))
                if workers == sizes[-1] and (kind, where) == kinds[0]:
                    results["largest"] = largest(client, running.scheduler_address, location, short, shape, args)
    print(f"\nthe workers' wall time in each epoch (the scheduler's task stream, medians of {args.repeats}): running "
          "spans, waiting between two, before an epoch's first or after its last; gaps between spans and spans' "
          "lengths in ms (median / 90th percentile)\n")
    header = f"{'workers':>22s} {'busy':>6s} {'between':>8s} {'edges':>6s} {'gap ms':>13s} {'span ms':>13s}"
    print(header)
    print("-" * len(header))
    for name, got in timelines:
        print(f"{name:>22s} {got['busy']:6.1%} {got['between']:8.1%} {got['edges']:6.1%} "
              f"{got['gap 50'] * 1e3:6.1f} / {got['gap 90'] * 1e3:4.0f} {got['span 50'] * 1e3:6.0f} / "
              f"{got['span 90'] * 1e3:4.0f}")
    last = results["largest"]
    print(f"\ndelivery from {sizes[-1]} workers (blank {BATCH}x{args.size}x{args.size}x3 batches, received and read): "
          f"shared memory {last['shared GB/s']:.2f} GB/s, sockets {last['sockets GB/s']:.2f} GB/s (as outcore takes "
          f"them), through the scheduler {last['relayed GB/s']:.2f} GB/s")
    boundary = last["short epochs"]
    print(f"epoch boundaries on {sizes[-1]} workers (epochs of {SHORT_EPOCH} batches, a {STEP_SECONDS * 1e3:.0f} ms "
          f"step each, epochs 2-7): next epoch started as one drains {boundary['ahead']:.0f} samples/s, not "
          f"{boundary['not ahead']:.0f}: {boundary['ahead'] / boundary['not ahead']:.2f}x")
    if "consumers" in last:
        alone, together = last["consumers"][1], last["consumers"][args.consumers]
        print(f"{args.consumers} consumers sharing {sizes[-1]} workers: {together:.0f} samples/s together, "
              f"{together / alone:.2f}x one consumer alone ({alone:.0f})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
