"""Does an ingest of a large folder scale with its cores? Whole ingests, timed by phase and sampled holding the GIL.

    python benchmarks/ingest_scale.py [--files 100000] [--threads 1,2] [--repeats 2] [--workdir bench-data] [--no-gil]
                                      [--pixels H,W]

Writes (once, in ``--workdir``) ``--files`` ImageNet-like JPEGs (`imagenet.write_folder`: 300-500 pixels on the
short side, about 52 KiB each), then, each run in a fresh process, ingests them at their own size with the
command, as the console script runs it (``outcore ingest FOLDER STORE --shape any --images encoded --no-progress``,
which calls ``outcore.ingest_images(folder, store, shape=None, images="encoded")``: a survey that checks every
file, then the writes), or, with ``--pixels H,W``, into a pixel store of that size (``--shape H,W,3 --images
pixels``: each file decoded and cut in the writes, no survey), from its imports to the process's end:

- **scaling**: seconds, files/s and CPU seconds of whole ingests at each ``--threads`` (``--repeats`` each,
  in turns), and the ratio to n times the one-thread rate;
- **phases**: where each thread count's fastest ingest spent its time: importing what an ingest needs, the work
  before the survey (listing the folder, the files' stats, the manifest), the survey, making the write tasks, the
  writes, the small fields' rows gathered into the store once they are done (a field a thread), what comes after
  (the store's metadata, opening it, the command's summary) and the interpreter's exit once the command returned.
  The imports and the work between the phases run on one thread whatever the thread count: on many cores they
  bound the whole;
- **gil**: one whole ingest at the last thread count sampled by py-spy (``cores.RATE`` a second), only the
  thread holding the GIL (``--gil``): its seconds holding the GIL against the CPU seconds of an unsampled
  run, the bound that share sets on 16 cores, the seconds per phase (a sample's phase: the first of them its stack
  is in; the survey's and the writes' tasks on the pool's threads, their scheduling on the main thread), and
  the functions holding it most.

The ingests import outcore as an installed copy does, from bytecode compiled once (into ``--workdir``'s
``pycache``, whatever ``PYTHONDONTWRITEBYTECODE`` says): compiling its sources again at each start would count
a few tenths of a second of "imports" that no user's ingest pays.

Unlike ``cores.py --cases ingest`` (a folder of ~1,000 files, ingested again and again and sampled for some
seconds), the per-ingest costs (imports, the task graph, the manifest) weigh here as they do on a large set.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from cores import FUNCTIONS, RATE, functions, stacks
from imagenet import write_folder

from outcore.measure import gil_bound

INGEST = """
import json, sys, time
start = time.perf_counter()
import outcore, outcore_command
from outcore.cli import main
from outcore.ingest import build, images
outcore.set_threads(int(sys.argv[3]))
imported = time.perf_counter()
spans = {}


def timed(module, name):
    wrapped = getattr(module, name)

    def timing(*args, **kwargs):
        began = time.perf_counter()
        try:
            return wrapped(*args, **kwargs)
        finally:
            spans[name] = (began, time.perf_counter())

    setattr(module, name, timing)


timed(images, "survey_images")
timed(build, "_write_fields")
timed(build, "_gather_small")
sys.argv = ["outcore", "ingest", sys.argv[1], sys.argv[2], "--shape", sys.argv[4], "--images", sys.argv[5],
            "--no-progress"]
status = outcore_command.main()  # as the console script runs it, to its end
end = time.perf_counter()
(survey, surveyed) = spans.get("survey_images", (imported, imported))  # a pixel ingest of one shape: no survey
(writes, written) = spans["_write_fields"]
gather, gathered = spans["_gather_small"]
print(json.dumps({"seconds": end - start, "ended": time.time(), "phases": [
    imported - start, survey - imported, surveyed - survey, writes - surveyed, gather - writes, gathered - gather,
    end - gathered]}))
sys.exit(status)
"""
PHASES = ("imports", "before the survey", "survey", "making the writes", "writes", "small fields", "after",
          "exit")
PHASE_FRAMES = (("imports", ("_find_and_load",)), ("survey", ("survey_images", "_survey_block")),
                ("writes", ("_write_fields", "_write_shard", "_read_block")))


def compiled(workdir: Path) -> dict[str, str]:
    """The environment of an ingest's process: Python's bytecode kept in ``workdir``'s ``pycache``, made now for
    outcore and what an ingest imports (as installing a package compiles it), read by every ingest after."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    environment["PYTHONPYCACHEPREFIX"] = str((workdir / "pycache").resolve())
    subprocess.run([sys.executable, "-c", "import outcore_command, outcore.cli.main, outcore.ingest.build, dask.array"],
                   env=environment, check=True)
    return environment


def ingest(folder: Path, threads: int, environment: dict[str, str], gil_samples: Path | None = None,
           pixels: str | None = None) -> tuple[float, float, list[float]]:
    """One whole ingest of ``folder`` in a fresh process with ``environment``: ``(seconds, CPU seconds, seconds per
    phase)``; with ``gil_samples``, run under ``py-spy record --gil``, its raw samples written there; with ``pixels``
    (``"H,W"``), into a pixel store of that size (``--shape H,W,3 --images pixels``)."""
    shape, images = ("any", "encoded") if pixels is None else (f"{pixels},3", "pixels")
    with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:
        command = [sys.executable, "-c", INGEST, str(folder), str(Path(scratch) / "ingested.zarr"), str(threads), shape,
                   images]
        if gil_samples is not None:
            command = ["py-spy", "record", "--rate", str(RATE), "--nonblocking", "--format", "raw", "--gil",
                       "--output", str(gil_samples), "--", *command]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
        ended, after = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))  # py-spy's last
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    exit_seconds = ended - result["ended"]  # the interpreter's shutdown, once the command returned
    return result["seconds"] + exit_seconds, cpu, [*result["phases"], exit_seconds]


def phases(raw: str) -> Counter:
    """py-spy's raw output counted per phase (`PHASE_FRAMES`; ``"other"`` for a stack in none of them, and
    ``"start and exit"`` for one without Python frames: the interpreter's, outside the timed seconds)."""
    counted: Counter = Counter()
    for frames, count in stacks(raw):
        stack = ";".join(frames)
        found = (name for name, phase_frames in PHASE_FRAMES if any(frame in stack for frame in phase_frames))
        counted[next(found, "other") if stack else "start and exit"] += count
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data"))
    parser.add_argument("--no-gil", action="store_true", help="leave out the ingest sampled holding the GIL")
    parser.add_argument("--pixels", help="H,W: ingest into a pixel store of that size (--shape H,W,3 --images pixels)")
    args = parser.parse_args()
    folder = args.workdir / f"imagenet-like-{args.files}"
    files = len(write_folder(folder, args.files))
    threads = [int(n) for n in args.threads.split(",")]
    runs: dict[int, list[tuple[float, float, list[float]]]] = {n: [] for n in threads}
    environment = compiled(args.workdir)
    for _ in range(args.repeats):  # in turns: a slow spell of the machine falls on every thread count alike
        for n in threads:
            runs[n].append(ingest(folder, n, environment, pixels=args.pixels))
    one = min(seconds for seconds, _, _ in runs[1]) if 1 in runs else None
    kept = "at their own size (shape=None, images='encoded')" if args.pixels is None else \
        f"as {args.pixels} pixels (shape=({args.pixels}, 3), images='pixels')"
    print(f"\noutcore.ingest_images of {files:,} JPEGs {kept}, whole ingests, fresh processes, best of {args.repeats} "
          "(the ratio: to n x the 1-thread rate)")
    print(f"{'threads':>7s} {'seconds':>15s} {'files/s':>8s} {'CPU s':>7s} {'ratio':>6s}")
    for n in threads:
        best, cpu, _ = min(runs[n])
        spread = f"{min(s for s, _, _ in runs[n]):.1f}-{max(s for s, _, _ in runs[n]):.1f}"
        print(f"{n:7d} {spread:>15s} {files / best:8.0f} {cpu:7.1f} {one / (n * best) if one else float('nan'):6.2f}")
    print("\nseconds per phase of each thread count's fastest ingest (imports and the work between the survey and "
          "the writes run on one thread)")
    print(f"{'threads':>7s} " + " ".join(f"{name:>17s}" for name in PHASES))
    for n in threads:
        print(f"{n:7d} " + " ".join(f"{seconds:17.2f}" for seconds in min(runs[n])[2]))
    if args.no_gil:
        return
    if shutil.which("py-spy") is None:
        print("\npy-spy is not installed (pip install py-spy): no GIL shares")
        return
    n = threads[-1]
    raw_path = args.workdir / "ingest-gil-samples.txt"
    ingest(folder, n, environment, raw_path, args.pixels)
    raw = raw_path.read_text()
    raw_path.unlink()
    held, holders = phases(raw), functions(raw)
    cpu = min(runs[n])[1]
    total = sum(held.values())
    share = total / RATE / cpu
    print(f"\none whole ingest at {n} threads holds the GIL {total / RATE:.1f} s of {cpu:.1f} CPU seconds: GIL share "
          f"{share:.1%}, at most {gil_bound(share, 16):.1f}x one core's rate on 16 cores")
    print(f"  {'phase':24s} {'GIL s':>6s} {'µs a file':>9s}")
    for name, count in held.most_common():
        print(f"  {name:24s} {count / RATE:6.2f} {count / RATE / files * 1e6:9.1f}")
    print(f"  the functions holding the GIL most (share of the GIL samples, {total} in all):")
    for name, count in holders.most_common(FUNCTIONS * 2):
        print(f"    {count / max(1, total):6.1%}  {name}")


if __name__ == "__main__":
    main()
