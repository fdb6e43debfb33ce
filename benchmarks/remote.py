"""Training from an object store: outcore's epochs from a real S3 API against the same epoch from local disk.

    python benchmarks/remote.py [--samples 20000] [--size 128] [--bandwidth 100] [--workdir bench-data]

Builds (once, kept in ``--workdir``) the photo store of ``benchmarks/iterate.py``, uploads it to moto's S3
server on loopback (``outcore.testing.s3.S3Server``) and reads it through outcore's fault proxy
(``outcore.testing.proxy.FaultProxy``) with 0 ms and 20 ms of added latency and a cap of ``--bandwidth``
MB/s. One shuffled epoch (batch 256) each, medians of ``--repeats``:

- local disk (warm page cache): the ceiling;
- cold, no cache, at 0 ms and 20 ms: against the lesser of local disk and the link (store bytes over the cap,
  or over what the proxy passes of whole shards when that is less);
- cold at 20 and 60 ms with the depth measured (`outcore.storage.pace`) against fixed depths of 4 and 16
  chunks (``OUTCORE_IO_THREADS``; 16 was the fixed default before the depth was measured);
- the second epoch from a full cache (the proxy closed: nothing can be fetched);
- a cache of 25 % of the store, 3 epochs: each against a cold unbounded epoch, the cache's largest size;
- 4 processes sharing one cache, one epoch each: bytes fetched over the store's bytes;
- with ``--peers PYTHON`` (a Python that has litdata and mosaicml-streaming, see
  ``benchmarks/remote_peers.py``): LitData and Mosaic streaming reading the same samples from the same
  endpoint at 0 and 20 ms, cold and from their caches (unbounded, as outcore's), each in a process of
  its own, beside outcore's cold epoch in a process of its own; peak memory of each process.

moto is a Python server: its own rate on this machine is measured too (a plain sequential read of every
shard through obstore, 16 at a time) and is the real ceiling of the cold rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from iterate import BATCH, build

import outcore
from outcore.storage import ChunkCache
from outcore.testing.proxy import FaultProxy
from outcore.testing.s3 import S3Server, upload


def epoch_rate(ds: outcore.Dataset, seed: int = 1) -> float:
    began = time.perf_counter()
    count = sum(len(batch["labels"]) for batch in ds.batches(BATCH, shuffle=True, seed=seed))
    return count / (time.perf_counter() - began)


def server_rate(options: dict, url: str, keys: list[str], parts: int = 1) -> float:
    """Bytes/s of GETs of every shard, 16 in flight: whole objects, or each in ``parts`` ranged GETs (as
    a chunk reader asks): what the server itself can serve."""
    import obstore
    from obstore.store import from_url

    store = from_url(url, client_options={"allow_http": True}, **options)
    sizes = {key: obstore.head(store, key)["size"] for key in keys}

    def get(request: tuple[str, int]) -> int:
        key, part = request
        step = -(-sizes[key] // parts)
        options = {} if parts == 1 else {"range": (part * step, min(sizes[key], (part + 1) * step))}
        return len(obstore.get(store, key, options=options).bytes())

    began = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        total = sum(pool.map(get, [(key, part) for key in keys for part in range(parts)]))
    return total / (time.perf_counter() - began)


def _own_process_epochs(url: str, options: dict, cache_dir: str) -> tuple[float, float, float]:
    """A cold epoch and a cached one in a process of its own: (samples/s, samples/s, peak MiB)."""
    ds = outcore.open_dataset(url, storage_options=options, cache_dir=cache_dir)
    cold, cached = epoch_rate(ds), epoch_rate(ds)
    return cold, cached, peak_mib()


def peak_mib() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited across exec)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024


def peer_rates(python: str, peer: str, samples: Path, endpoint: str, via: str, workdir: Path) -> dict[str, float]:
    """What ``benchmarks/remote_peers.py`` measured of ``peer`` (run by ``python``)."""
    script = Path(__file__).with_name("remote_peers.py")
    done = subprocess.run([python, str(script), peer, "--samples", str(samples), "--endpoint", endpoint, "--via", via,
                           "--workdir", str(workdir)], capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{peer} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def export_samples(ds: outcore.Dataset, path: Path) -> Path:
    """The store's images and labels as one .npz for the peers to write in their formats (kept)."""
    if not path.exists():
        np.savez(path, images=ds["images"].compute(), labels=ds["labels"].compute())
    return path


def _shared_epoch(url: str, options: dict, cache_dir: str, seed: int) -> int:
    ds = outcore.open_dataset(url, storage_options=options, cache_dir=cache_dir)
    return sum(len(batch["labels"]) for batch in ds.batches(BATCH, shuffle=True, seed=seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--bandwidth", type=float, default=100.0, help="MB/s cap of the proxied link (0: none)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--peers", metavar="PYTHON", help="a Python with litdata and mosaicml-streaming: compare them")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(exist_ok=True)
    local = outcore.open_dataset(build(workdir, args.samples, args.size))
    files = [p for p in Path(local.location).rglob("*") if p.is_file() and p.name != "zarr.json"]
    stored = sum(p.stat().st_size for p in files)
    rows: list[tuple[str, float, str]] = []
    local_rate = statistics.median(epoch_rate(local) for _ in range(args.repeats))
    rows.append(("local disk, warm page cache", local_rate, ""))

    with S3Server() as server, tempfile.TemporaryDirectory(dir=workdir) as scratch:
        server.create_bucket("data")
        url = "s3://data/photos.zarr"
        upload(local.location, url, server.options)
        keys = [p.relative_to(local.location).as_posix() for p in files]
        served = server_rate(server.options, url, keys)
        print(f"moto serves {served / 1e6:.0f} MB/s of whole shards on this machine (16 requests in flight)")
        parts = local.shard_reader("images")._layout.chunks_per_shard
        ranged = server_rate(server.options, url, keys, parts)
        print(f"and {ranged / 1e6:.0f} MB/s of ranged reads of a chunk's size (each shard in {parts}): moto reads "
              "the whole object for each range, which an object store does not")
        cap = f"{args.bandwidth:.0f} MB/s cap" if args.bandwidth else "no cap"
        link_rate = len(local) / (stored / (args.bandwidth * 1e6)) if args.bandwidth else float("inf")
        with FaultProxy(server.host, server.port) as proxy:
            via = {**server.options, "endpoint": proxy.url}
            proxy.bandwidth = args.bandwidth * 1e6
            through = server_rate(via, url, keys)
            print(f"through the proxy ({cap}): {through / 1e6:.0f} MB/s of whole shards")
            link_rate = min(link_rate, len(local) / (stored / through))
            for latency in (0.0, 0.02):
                proxy.latency = latency
                cold = outcore.open_dataset(url, storage_options=via, cache_dir=False)
                before = proxy.traffic.bytes_sent
                rate = statistics.median(epoch_rate(cold) for _ in range(args.repeats))
                fetched = (proxy.traffic.bytes_sent - before) / args.repeats / stored
                ceiling = min(local_rate, link_rate)
                rows.append((f"cold, no cache, {latency * 1e3:.0f} ms, {cap}", rate,
                             f"{rate / ceiling:.2f} of min(local, link); {fetched:.2f}x the store fetched"))
            for latency in (0.02, 0.06):  # the measured depth against fixed ones (OUTCORE_IO_THREADS)
                proxy.latency = latency
                for chosen in ("", "4", "16"):
                    os.environ["OUTCORE_IO_THREADS"] = chosen
                    cold = outcore.open_dataset(url, storage_options=via, cache_dir=False)
                    rate = statistics.median(epoch_rate(cold) for _ in range(args.repeats))
                    depth = f"{chosen} chunks ahead, fixed" if chosen else \
                        f"measured: {cold.group.store.files.fetch_ahead()} chunks ahead"
                    rows.append((f"cold, {latency * 1e3:.0f} ms, {depth}", rate,
                                 f"{rate / min(local_rate, link_rate):.2f} of min(local, link)"))
            os.environ.pop("OUTCORE_IO_THREADS")
            proxy.latency = 0.0
            cold_rate = rows[1][1]
            cached = outcore.open_dataset(url, storage_options=via, cache_dir=f"{scratch}/full")
            epoch_rate(cached)  # fills the cache
        warm = statistics.median(epoch_rate(cached) for _ in range(args.repeats))  # the proxy is closed now
        rows.append(("second epoch, full cache, server unreachable", warm, f"{warm / local_rate:.2f} of local"))

        with FaultProxy(server.host, server.port) as proxy:
            via = {**server.options, "endpoint": proxy.url}
            proxy.bandwidth = args.bandwidth * 1e6
            bound = stored // 4
            small = outcore.open_dataset(url, storage_options=via, cache_dir=f"{scratch}/quarter", cache_size=bound)
            cache = small.group.store.cache
            largest, rates = 0, []
            for epoch in range(3):
                rates.append(epoch_rate(small, seed=epoch))
                largest = max(largest, cache.usage().bytes)
            rows.append(("cache of 25 % of the store, 3 epochs (slowest)", min(rates),
                         f"{min(rates) / cold_rate:.2f} of cold; cache at most {largest / bound:.2f} of its bound"))

            proxy.traffic.bytes_sent = 0
            shared = f"{scratch}/shared"
            ChunkCache(shared)
            context = multiprocessing.get_context("spawn")
            began = time.perf_counter()
            with context.Pool(4) as pool:
                counts = pool.starmap(_shared_epoch, [(url, via, shared, seed) for seed in range(4)])
            rate = sum(counts) / (time.perf_counter() - began)
            rows.append(("4 processes, one shared cache, one epoch each", rate,
                         f"{proxy.traffic.bytes_sent / stored:.2f}x the store fetched"))

            if args.peers:
                samples = export_samples(local, workdir / "peer-samples.npz")
                for latency in (0.0, 0.02):
                    proxy.latency = latency
                    shown = f"{latency * 1e3:.0f} ms"
                    with context.Pool(1) as pool:
                        cold, cached, peak = pool.apply(_own_process_epochs, (url, via, f"{scratch}/own-{shown}"))
                    rows.append((f"outcore, own process, {shown}: cold / cached", cold,
                                 f"cached {cached:,.0f}; peak {peak:,.0f} MiB"))
                    for peer in ("litdata", "mosaic"):
                        measured = peer_rates(args.peers, peer, samples, server.endpoint, proxy.url, workdir)
                        said = (f"cached {measured['cached']:,.0f}; peak {measured['peak_rss_mib']:,.0f} MiB; outcore "
                                f"{cold / measured['cold']:.2f}x cold, {cached / measured['cached']:.2f}x cached")
                        rows.append((f"{peer}, {shown}: cold / cached", measured["cold"], said))

    print(f"\n{len(local):,} samples of {args.size}x{args.size}x3 uint8, {stored / 1e6:.0f} MB stored, batch {BATCH}, "
          f"2 cores; link limit {link_rate:,.0f} samples/s (the cap, or what the proxy passed if less); medians "
          f"of {args.repeats}\n")
    print(f"{'what':50s} {'samples/s':>10s}  ratio")
    for name, rate, ratio in rows:
        print(f"{name:50s} {rate:10.0f}  {ratio}")


if __name__ == "__main__":
    main()
