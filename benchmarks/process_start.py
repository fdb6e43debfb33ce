"""How soon a loader process makes batches, and what it holds, beside a training script that imports a framework.

    python benchmarks/process_start.py [--rounds 3] [--workdir bench-data/process-start]

For a script that imports nothing more than outcore, torch, or TensorFlow (those installed), each run in a fresh
process, in turns: the seconds from ``ds.batches(100, shuffle=True, process=True)`` until its process makes the
batches (``ready()``: until then they are made in the script's process), and that process's resident memory;
beside it, the same for a process started as multiprocessing starts DataLoader workers (``forkserver``, the
script's guard in place; as outcore's loader processes started before), which imports the script's main module,
with all it imports, then outcore's loader modules and opens the store. Medians
of ``--rounds``; the ratio of the forkserver process's seconds and memory to outcore's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import outcore

SCRIPT = """
import json, multiprocessing, os, sys, time
{imports}
import outcore


def resident(pid):
    status = open(f"/proc/{{pid}}/status").read().split("VmRSS:")[1]
    return int(status.split()[0]) / 1024


def answer(connection, store):  # the forkserver process's first work, as a loader's: the store open, say so
    import outcore.iterate.process
    outcore.open_dataset(store)
    connection.send(os.getpid())
    connection.recv()


if __name__ == "__main__":
    import outcore.iterate.process  # imported and opened here first: only the process's start is timed
    ds = outcore.open_dataset(sys.argv[1])
    began = time.perf_counter()
    if sys.argv[2] == "outcore":
        iterator = ds.batches(100, shuffle=True, process=True)
        while not iterator._process.ready():
            time.sleep(0.002)
        seconds, pid = time.perf_counter() - began, iterator._process.process.pid
        mib = resident(pid)
        iterator.close()
    else:
        context = multiprocessing.get_context("forkserver")
        mine, theirs = context.Pipe()
        process = context.Process(target=answer, args=(theirs, sys.argv[1]))
        process.start()
        pid = mine.recv()
        seconds = time.perf_counter() - began
        mib = resident(pid)
        mine.send("done")
        process.join()
    print(json.dumps({{"seconds": seconds, "mib": mib}}))
"""
IMPORTS = {"outcore alone": "", "torch": "import torch", "tensorflow": "import tensorflow"}


def timed(folder: Path, store: Path, imports: str, how: str) -> dict[str, float]:
    """One fresh script importing ``imports``, its process started ``how`` (``outcore`` or ``forkserver``)."""
    script = folder / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(imports=imports)))
    done = subprocess.run([sys.executable, str(script), str(store), how], capture_output=True, text=True,
                          check=True, cwd=folder, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/process-start"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    store = args.workdir / "s.zarr"
    if not store.exists():
        outcore.from_arrays({"x": np.arange(100_000).reshape(-1, 1).repeat(64, 1)}, store, chunk_size=1_000,
                            progress=False)
    cases = {name: line for name, line in IMPORTS.items()
             if not line or importlib.util.find_spec(line.split()[-1]) is not None}
    found: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for name, line in cases.items():
            for how in ("outcore", "forkserver"):
                found.setdefault((name, how), []).append(timed(args.workdir, store, line, how))
    print(f"a loader process's start beside a script (medians of {args.rounds}, each a fresh script): seconds until "
          "it makes the batches, its resident memory; a forkserver process imports the script first, as "
          "DataLoader workers started so do")
    header = (f"{'the script imports':20s} {'outcore, s':>10s} {'MiB':>6s} {'forkserver, s':>13s} {'MiB':>6s} "
              f"{'x seconds':>9s} {'x memory':>8s}")
    print(header)
    print("-" * len(header))
    for name in cases:
        ours, theirs = ({key: statistics.median(run[key] for run in found[name, how]) for key in ("seconds", "mib")}
                        for how in ("outcore", "forkserver"))
        print(f"{name:20s} {ours['seconds']:10.2f} {ours['mib']:6.0f} {theirs['seconds']:13.2f} {theirs['mib']:6.0f} "
              f"{theirs['seconds'] / ours['seconds']:9.2f} {theirs['mib'] / ours['mib']:8.2f}")


if __name__ == "__main__":
    main()
