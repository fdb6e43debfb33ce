"""How much Python does a batch cost? The Python calls a batch makes, by thread: a count, not a clock.

    python benchmarks/python_calls.py [--cases pixels,pixels+crop,encoded,encoded+crop] [--epochs 20] [--threads 1]
                                      [--workdir bench-data/cores] [--against PATH]

The GIL share that `cores.py` times (its ``scaling`` table) moves by a point from one run to the next on a shared
2-core machine, so a change that takes a tenth of a batch's Python away cannot be told from the noise there. The
calls cannot move: each case (`cores.CASES`, over `cores.stores`' stores, built there once) runs in a fresh process on
one thread (``outcore.set_threads(1)``; with ``--threads n``, n threads made and gauged as on n CPUs, `cores.as_cpus`:
a batch cut into as many runs, as many batches made at once and together as there), its two first epochs untimed, then ``--epochs`` epochs counted by a profile
function set in every thread before outcore is imported (``sys.setprofile``, ``threading.setprofile``): every call
of a Python function and every call of a C function from Python (``len``, ``dict.get``, numpy's), each about the
same few hundred nanoseconds of a thread holding the GIL. Printed per batch, by thread: the consumer's (the thread
taking the batches: a training loop's), the pool's (reads, batches and their runs) and the planning threads' (a
run's thread following the schedule and handing its batches over), and, with ``--against`` a checkout of outcore
(its C extensions built: ``python setup.py build_ext --inplace`` there), the same count there and the ratio of this
tree's to it.

Counted so, a batch's Python is the number of calls; where they go is what `cores.py --only gil` samples.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

GROUPS = ("consumer", "pool", "planning")

COUNT = """
import collections, json, sys, threading
counts, on = collections.Counter(), [False]


def group(name):
    return "pool" if name.startswith("outcore-pool") else "planning" if name.startswith("outcore-batches") \\
        else "consumer" if name == "MainThread" else "other"


def count(frame, event, arg):
    if on[0] and (event == "call" or event == "c_call"):
        counts[group(threading.current_thread().name)] += 1


threading.setprofile(count)
sys.setprofile(count)
sys.path.insert(0, sys.argv[4])
import cores
import outcore

case, location, epochs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[5])
store, transform = cores.CASES[case]
if threads > 1:  # made and gauged as on that many CPUs: as many batches made at once, and together, as there
    cores.as_cpus(threads)
outcore.set_threads(threads)
ds = outcore.open_dataset(location)
options = {"shuffle": True, "fields": cores.FIELDS.get(case, ["images", "labels"]), "transform": transform}
batches = ds.torch(cores.BATCH, **options) if case in cores.THROUGH_TORCH else ds.batches(cores.BATCH, **options)
for _ in range(2):
    for batch in batches:
        pass
on[0], taken = True, 0
for _ in range(epochs):
    for batch in batches:
        taken += 1
on[0] = False
print(json.dumps({name: counts[name] / taken for name in ("consumer", "pool", "planning", "other")}))
"""


def calls(tree: Path | None, case: str, location: Path, epochs: int, threads: int) -> dict[str, float]:
    """The calls a batch of ``case`` makes on ``threads`` threads, by thread group, with outcore from ``tree`` (None:
    as installed)."""
    environment = dict(os.environ)
    if tree is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [environment.get("PYTHONPATH")])])
    here = Path(__file__).resolve().parent  # the child runs there: no checkout's outcore/ in its working directory
    done = subprocess.run([sys.executable, "-c", COUNT, case, str(location.resolve()), str(epochs), str(here), str(threads)],
                          capture_output=True, text=True, check=True, env=environment, cwd=here)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="pixels,pixels+crop,encoded,encoded+crop")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/cores"))
    parser.add_argument("--threads", type=int, default=1,
                        help="the pool's threads, made and gauged as on that many CPUs (`cores.as_cpus`) past 1")
    parser.add_argument("--against", type=Path, help="a checkout of outcore (its extensions built) to compare with")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    import cores

    cases = args.cases.split(",")
    unknown = [case for case in cases if case not in cores.CASES]
    if unknown:
        parser.error(f"--cases: {', '.join(unknown)} not among {', '.join(cores.CASES)}")
    made = cores.stores(args.workdir, args.images, {cores.CASES[case][0] for case in cases})
    threads = "one thread" if args.threads == 1 else f"{args.threads} threads as on {args.threads} CPUs"
    print(f"\nPython calls a batch of ds.batches({cores.BATCH}, shuffle=True), {threads}, {args.epochs} epochs of "
          f"{args.images:,} samples counted (Python functions and the C functions Python calls), by thread"
          + (f"; against {args.against}" if args.against else ""))
    header = f"{'case':<16}" + "".join(f"{name:>10}" for name in (*GROUPS, "in all"))
    print(header + (f"{'there':>10}{'ratio':>8}" if args.against else ""))
    for case in cases:
        location = made[cores.CASES[case][0]]
        here = calls(None, case, location, args.epochs, args.threads)
        row = f"{case:<16}" + "".join(f"{here[name]:10.1f}" for name in GROUPS) + f"{sum(here.values()):10.1f}"
        if args.against:
            there = sum(calls(args.against, case, location, args.epochs, args.threads).values())
            row += f"{there:10.1f}{sum(here.values()) / there:8.2f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
