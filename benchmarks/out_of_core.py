"""Epochs of a store bigger than memory, read from a throttled device: outcore's pixels and encoded
pictures, a JPEG-folder DataLoader and a plain read of the store's files (the device's limit), each in
a memory cgroup smaller than the store, with the store's pages evicted before each epoch; and
``outcore bench``'s prediction of each outcore epoch, made inside the same cgroup.

    sudo python benchmarks/out_of_core.py [--images 24000] [--memory 512MiB] [--devices cloud,sata,disk]

Needs root and cgroup v1's ``memory`` and ``blkio`` controllers (``blkio.throttle.read_bps_device`` and
``read_iops_device`` on the block device under ``--workdir``; reads of every other process on that device
are not throttled). Devices: ``cloud`` (200 MB/s, 3,000 reads/s, as a cloud volume), ``sata`` (500 MB/s,
50,000 reads/s), ``disk`` (150 MB/s, 150 reads/s). Each loader runs in its own process (the cgroup's
only one) for ``--epochs`` epochs; the table shows the median epoch, bytes and reads the cgroup made of
the device per epoch (blkio's counters) against the store's size, and the loader's peak resident memory (its own and its worker processes', page cache not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import prepare

import outcore
from outcore.storage.cache import parse_size
from outcore.storage.page_cache import evict

PEERS = {"litdata-raw": "LitData, pixels", "litdata-jpeg": "LitData, JPEG", "mosaic-raw": "Mosaic, pixels",
         "mosaic-jpeg": "Mosaic, JPEG"}
PEER_SCRIPT = Path(__file__).resolve().parent / "out_of_core_peers.py"
STORES = {"pixels": ("pixels", None), "zstd": ("pixels", "zstd:5:bitshuffle"), "encoded": ("encoded", None)}
KIND_NAMES = {"pixels": "pixels", "zstd": "pixels, zstd", "encoded": "encoded"}  # outcore.cli.advice's
DEVICES = {"cloud": (200e6, 3000), "sata": (500e6, 50000), "disk": (150e6, 150)}
CGROUP = Path("/sys/fs/cgroup")
BATCH = 256


def store_files(location: Path) -> list[Path]:
    return sorted(path for path in location.rglob("*") if path.is_file())


def block_device(path: Path) -> str:
    """``major:minor`` of the whole disk holding ``path`` (blkio throttles disks, not partitions)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (node / "partition").exists():
        node = node.resolve().parent
    return (node / "dev").read_text().strip()


class Cgroup:
    """A v1 memory and blkio cgroup of its own, with ``memory`` bytes and the device's limits."""

    def __init__(self, name: str, memory: int, device: str, bandwidth: float, requests: float) -> None:
        self.folders = [CGROUP / "memory" / name, CGROUP / "blkio" / name]
        for folder in self.folders:
            folder.mkdir(exist_ok=True)
        self.memory, self.blkio = self.folders
        self.device = device
        (self.memory / "memory.limit_in_bytes").write_text(str(memory))
        (self.blkio / "blkio.throttle.read_bps_device").write_text(f"{device} {int(bandwidth)}")
        (self.blkio / "blkio.throttle.read_iops_device").write_text(f"{device} {int(requests)}")

    def run(self, argv: list[str]) -> dict:
        """Run ``argv`` in the cgroup; its JSON line, with the device's bytes and reads and peak memory."""
        (self.memory / "memory.max_usage_in_bytes").write_text("0")
        before = self.counters()
        joined = ("import os, sys; [open(f'{d}/cgroup.procs', 'w').write(str(os.getpid())) for d in sys.argv[1:3]];"
                  " os.execv(sys.argv[3], sys.argv[3:])")
        done = subprocess.run([sys.executable, "-c", joined, *map(str, self.folders), *argv], check=True,
                              capture_output=True, text=True, timeout=1800)
        after = self.counters()
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result.update(bytes=after[0] - before[0], reads=after[1] - before[1],
                      peak=int((self.memory / "memory.max_usage_in_bytes").read_text()))
        return result

    def counters(self) -> tuple[int, int]:
        def read(name: str) -> int:
            for line in (self.blkio / name).read_text().splitlines():
                parts = line.split()
                if parts[:2] == [self.device, "Read"]:
                    return int(parts[2])
            return 0

        return read("blkio.throttle.io_service_bytes"), read("blkio.throttle.io_serviced")

    def remove(self) -> None:
        """Remove the cgroup once its processes (a loader's orphaned workers too) are gone."""
        for _ in range(100):
            left = [int(pid) for pid in (self.memory / "cgroup.procs").read_text().split()]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for folder in self.folders:
            folder.rmdir()


def child(args: argparse.Namespace) -> None:
    """One loader's epoch (or outcore's prediction), in the cgroup: prints one JSON line."""
    if args.loader == "advise":
        from outcore.cli.advice import advise

        advice = advise(outcore.open_dataset(args.store), batch_size=BATCH)
        print(advice, file=sys.stderr)
        print(json.dumps({kind.name: advice.predict(kind, cold=True).rate for kind in advice.kinds}))
        return
    began = time.perf_counter()
    if args.loader == "read":
        samples = args.samples
        for path in store_files(Path(args.store)):
            with open(path, "rb", buffering=0) as file:
                while file.read(4 * 2**20):
                    pass
    elif args.loader == "folder":
        import torch
        from common import JpegFolder

        loader = torch.utils.data.DataLoader(JpegFolder(Path(args.store)), batch_size=BATCH, shuffle=True,
                                             num_workers=os.cpu_count() or 1)
        samples = sum(len(labels) for _, labels in loader)
    else:
        ds = outcore.open_dataset(args.store)
        samples = sum(len(batch["labels"]) for batch in ds.batches(BATCH, fields=["images", "labels"], seed=1))
    seconds = time.perf_counter() - began
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"samples": samples, "seconds": seconds, "rss": rss * 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=24000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--memory", default="512MiB", help="the cgroup's memory limit (page cache included)")
    parser.add_argument("--devices", default="cloud,sata,disk")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--loaders", default="read,pixels,zstd,encoded,folder",
                        help="which of read, pixels, zstd, encoded, folder (the JPEG folder: slow where reads are capped)")
    parser.add_argument("--workdir", default="bench-data/out-of-core")
    parser.add_argument("--peers", metavar="PYTHON", help="a Python with litdata and mosaicml-streaming: "
                        "their raw and JPEG formats too (benchmarks/out_of_core_peers.py)")
    parser.add_argument("--chunk-size", type=int, default=None, help="samples per chunk (default: ingest's)")
    parser.add_argument("--child", nargs=3, metavar=("LOADER", "STORE", "SAMPLES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        loader, store, samples = args.child
        return child(argparse.Namespace(loader=loader, store=store, samples=int(samples)))
    if os.geteuid() != 0 or not (CGROUP / "blkio").is_dir():
        sys.exit("out_of_core.py needs root and cgroup v1's memory and blkio controllers")
    workdir = Path(args.workdir).resolve()
    folder = workdir / f"jpeg-{args.images}"
    prepare(folder, args.images, args.size)
    shape = (args.size, args.size, 3)
    stores = {}
    for kind, (images, compression) in STORES.items():
        chunks = f"-chunk{args.chunk_size}" if args.chunk_size else ""
        stores[kind] = workdir / f"{kind}-{args.images}{chunks}.zarr"
        if not stores[kind].exists():
            print(f"ingesting {stores[kind]} …")
            outcore.ingest_images(folder, stores[kind], shape=shape, images=images, chunk_size=args.chunk_size,
                                  compression=compression, progress=False)
    memory = parse_size(args.memory)
    device = block_device(workdir)
    sizes = {kind: sum(p.stat().st_size for p in store_files(store)) for kind, store in stores.items()}
    loaders = {"read of the pixel store's files": ("read", stores["pixels"]),
               "outcore pixels": ("pixels", stores["pixels"]), "outcore pixels, zstd": ("zstd", stores["zstd"]),
               "outcore encoded": ("encoded", stores["encoded"]), "JPEG folder, DataLoader": ("folder", folder)}
    loaders = {label: what for label, what in loaders.items() if what[0] in args.loaders.split(",")}
    if args.peers:
        for peer, label in PEERS.items():
            written = workdir / "peers" / f"{peer}-{args.images}"
            if not (written / "index.json").exists():
                print(f"writing {written} …")
                subprocess.run([args.peers, str(PEER_SCRIPT), "write", peer, "--folder", str(folder), "--output",
                                str(written)], check=True, capture_output=True)
            loaders[label] = (peer, written)
            sizes[peer] = sum(p.stat().st_size for p in store_files(written))
    folder_bytes = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    for name in args.devices.split(","):
        bandwidth, requests = DEVICES[name]
        cgroup = Cgroup(f"outcore-ooc-{os.getpid()}", memory, device, bandwidth, requests)
        try:
            rows = []
            predicted = _predicted(cgroup, stores, args)
            for label, (loader, store) in loaders.items():
                argv = ([args.peers, str(PEER_SCRIPT), "read", loader, "--output", str(store)] if loader in PEERS
                        else _argv(loader, store, args.images))
                runs = []
                for _ in range(args.epochs):
                    evict(store_files(store))
                    runs.append(cgroup.run(argv))
                rate = statistics.median(run["samples"] / run["seconds"] for run in runs)
                size = sizes.get(loader, folder_bytes if loader == "folder" else sizes["pixels"])
                rows.append((label, rate, runs, size, predicted.get(loader)))
        finally:
            cgroup.remove()
        _print(name, bandwidth, requests, memory, rows, args.images)


def _predicted(cgroup: Cgroup, stores: dict[str, Path], args: argparse.Namespace) -> dict[str, float]:
    """bench's prediction of each outcore loader's epoch, made in ``cgroup`` (none where bench itself does
    not fit in its memory: it imports and times what it advises on, 200 MiB and more)."""
    predicted = {}
    for kind, store in stores.items():
        if kind in args.loaders.split(","):
            try:
                predicted[kind] = cgroup.run(_argv("advise", store, args.images))[KIND_NAMES[kind]]
            except subprocess.CalledProcessError as error:
                if error.returncode != -signal.SIGKILL:
                    raise
                print(f"bench's advice on {store} was killed in {args.memory} of memory: no prediction")
    return predicted


def _argv(loader: str, store: Path, samples: int) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", loader, str(store), str(samples)]


def _print(name: str, bandwidth: float, requests: float, memory: int, rows: list, samples: int) -> None:
    limit = next((rate for label, rate, *_ in rows if label.startswith("read")), float("nan"))
    print(f"\n{name}: {bandwidth / 1e6:.0f} MB/s, {requests:,.0f} reads/s; memory {memory / 2**20:.0f} MiB; "
          f"{samples:,} samples, medians of each loader's epochs")
    header = (f"{'loader':34s} {'samples/s':>9s} {'vs device':>9s} {'predicted':>9s} {'pred/meas':>9s} "
              f"{'MB read':>8s} {'vs store':>8s} {'reads':>7s} {'RSS MiB':>8s}")
    print(header)
    print("-" * len(header))
    for label, rate, runs, size, predicted in rows:
        run = runs[len(runs) // 2]
        guess = f"{predicted:9,.0f} {predicted / rate:9.2f}" if predicted else f"{'':9s} {'':9s}"
        print(f"{label:34s} {rate:9,.0f} {rate / limit:9.2f} {guess} "
              f"{run['bytes'] / 1e6:8,.0f} {run['bytes'] / size:8.2f} "
              f"{run['reads']:7,d} {run['rss'] / 2**20:8,.0f}")


if __name__ == "__main__":
    main()
