"""DataLoader workers over an object store: how soon each epoch starts, and how fast it runs.

    python benchmarks/remote_workers.py [--samples 5000] [--size 32] [--epochs 3] [--repeats 3]
                                        [--peers PYTHON] [--workdir bench-data]

``ds.torch(256, shuffle=True, num_workers=2)`` (the default options otherwise) over a store of
``--samples`` random ``--size`` x ``--size`` x 3 pictures, each loader in a process of its own reading
``--epochs`` epochs in a row:

- local disk (warm page cache; the workers start by fork): the reference;
- moto's S3 server on loopback (run by this process): an empty node cache, then a new process with that
  cache warm (the forkserver, started with the loader, still imports torch, outcore and this script: the
  loader makes the first batches itself meanwhile, and its workers go on from there once they can be
  forked; with epochs this short, that is after the loader's 3 epochs);
- the same warm cache, the loader made 2 s before its first epoch (as while a model is built): the
  forkserver has imported them by then, and the workers make every batch;
- the same warm cache with the workers of before (``persistent_workers=False``, nothing preloaded in the
  forkserver): new workers, importing torch, outcore and this script, every epoch;
- with ``--peers PYTHON`` (a Python with litdata and mosaicml-streaming: ``benchmarks/remote_peers.py``):
  LitData's and Mosaic streaming's own DataLoaders with 2 workers (their defaults otherwise) from the same
  endpoint, epoch 0 into an empty cache, the later epochs from it.

Each row: the first batch of epoch 0 and of the later epochs (seconds), and samples/s likewise; medians
over ``--repeats`` runs. Ratios: the warm cache's later epochs against local disk's, and against each
peer's epochs from its cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import outcore
from outcore.testing.s3 import S3Server, upload

BATCH = 256
ROWS = {  # scenario -> what the table calls it
    "local": "local disk (fork)",
    "cold": "S3, empty node cache",
    "warm": "S3, warm node cache (new process)",
    "ahead": "S3, warm node cache, loader made 2 s ahead",
    "before": "S3, warm cache, workers of before",
}


def child(args: argparse.Namespace) -> None:
    """One scenario's loader, in this process: each epoch's first batch and samples/s, as one JSON line."""
    options = json.loads(args.options)
    if args.child == "local":
        ds = outcore.open_dataset(args.store)
    else:
        ds = outcore.open_dataset(args.store, storage_options=options, cache_dir=args.cache)
    extra = {}
    if args.child == "before":
        import outcore.adapters.torch as adapter

        adapter.preload_forkserver = lambda: None
        extra["persistent_workers"] = False
    loader = ds.torch(BATCH, shuffle=True, num_workers=2, **extra)
    if args.child == "ahead":
        time.sleep(2.0)
    measured = []
    for _ in range(args.epochs):
        began, first, count = time.perf_counter(), None, 0
        for batch in loader:
            first = time.perf_counter() - began if first is None else first
            count += len(batch["labels"])
        measured.append({"first": first, "rate": count / (time.perf_counter() - began), "samples": count})
    print(json.dumps({"epochs": measured}))


def run(command: list[str]) -> list[dict]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{command[1:3]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["epochs"]


def summary(runs: list[list[dict]]) -> tuple[float, float, float, float]:
    """Medians over runs: (first batch of epoch 0, of the later epochs, samples/s of epoch 0, of the later)."""
    def median(key: str, later: bool) -> float:
        return statistics.median(statistics.median(e[key] for e in epochs[1:]) if later else epochs[0][key]
                                 for epochs in runs)

    return median("first", False), median("first", True), median("rate", False), median("rate", True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--peers", metavar="PYTHON", help="a Python with litdata and mosaicml-streaming: compare them")
    parser.add_argument("--child", choices=sorted(ROWS), help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    workdir = Path(args.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    local = workdir / f"workers-{args.samples}-{args.size}.zarr"
    if not local.exists():
        rng = np.random.default_rng(0)
        outcore.from_arrays({"images": rng.integers(0, 256, (args.samples, args.size, args.size, 3), np.uint8),
                             "labels": np.arange(args.samples) % 10}, local, chunk_size=256, progress=False)
    me = [sys.executable, __file__, "--epochs", str(args.epochs)]
    results: dict[str, list[list[dict]]] = {name: [] for name in ROWS}
    peers: dict[str, list[list[dict]]] = {"litdata": [], "mosaic": []}
    with S3Server() as server:
        server.create_bucket("data")
        upload(local, "s3://data/train.zarr", server.options)
        remote = ["--store", "s3://data/train.zarr", "--options", json.dumps(server.options)]
        for repeat in range(args.repeats):
            cache = workdir / f"workers-cache-{repeat}"
            subprocess.run(["rm", "-rf", str(cache)], check=True)
            results["local"].append(run([*me, "--child", "local", "--store", str(local)]))
            for name in ("cold", "warm", "ahead", "before"):  # cold fills the cache the others read
                results[name].append(run([*me, "--child", name, *remote, "--cache", str(cache)]))
            if args.peers:
                samples = workdir / f"workers-{args.samples}-{args.size}.npz"
                if not samples.exists():
                    ds = outcore.open_dataset(local)
                    np.savez(samples, images=ds["images"].compute(), labels=ds["labels"].compute())
                script = Path(__file__).with_name("remote_peers.py")
                for peer, runs in peers.items():
                    runs.append(run([args.peers, str(script), peer, "--samples", str(samples), "--endpoint",
                                            server.endpoint, "--via", server.endpoint, "--workdir", str(workdir),
                                            "--workers", "2", "--epochs", str(args.epochs)]))
    print(f"\n{args.samples:,} samples of {args.size}x{args.size}x3 uint8, batch {BATCH}, 2 DataLoader workers, "
          f"{args.epochs} epochs a loader, medians of {args.repeats} runs, {len(os.sched_getaffinity(0))}"
          " cores\n")
    print("| loader | first batch, epoch 0 (s) | later epochs (s) | samples/s, epoch 0 | later epochs |")
    print("| --- | ---: | ---: | ---: | ---: |")
    table = {ROWS[name]: summary(runs) for name, runs in results.items()}
    table.update({f"{peer} (2 workers), S3: empty cache, then its cache": summary(runs)
                  for peer, runs in peers.items() if runs})
    for name, (first0, first, rate0, rate) in table.items():
        print(f"| {name} | {first0:.2f} | {first:.3f} | {rate0:,.0f} | {rate:,.0f} |")
    warm, base = table[ROWS["warm"]], table[ROWS["local"]]
    print(f"\nwarm node cache against local disk, later epochs: first batch {base[1] / warm[1]:.2f}x as soon, "
          f"samples/s {warm[3] / base[3]:.2f}x; epoch 0 (a new process): {base[0] / warm[0]:.2f}x, "
          f"{warm[2] / base[2]:.2f}x")
    for name, figures in table.items():
        if "workers)" in name:
            print(f"warm node cache against {name.split()[0]}'s epochs from its cache: samples/s "
                  f"{warm[3] / figures[3]:.2f}x, first batch {figures[1] / warm[1]:.2f}x as soon")


if __name__ == "__main__":
    main()
