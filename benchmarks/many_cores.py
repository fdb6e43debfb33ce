"""How many threads' worth of decoding does one outcore process keep busy? Measured on any machine, for many cores.

    python benchmarks/many_cores.py [--threads 1,4,8,16] [--seconds 6] [--cases encoded,encoded+crop,rrc]
                                    [--images 6000] [--workdir bench-data/cores] [--feed 5 --held 0.8]
                                    [--feed-by threads,process]

A process's threads decode in parallel only as far as its scheduling gives each of them a run of decodes to do:
batches made at once, the runs of each, chunk reads ahead. That can be measured without the cores. For each
case of `cores.py` that decodes JPEGs (``ds.batches(256, shuffle=True)`` of its stores, epoch after epoch):

1. one thread, for real: samples/s, and the CPU time each sample's decode call took (outcore's C decode of a run of
   a batch: ``RowDecodes.run``, or ``BoxCuts.run`` where a crop is cut as the picture is decoded);
2. then, for each ``--threads`` n, the decode calls replaced by a sleep as long as step 1 measured (outside the
   GIL, as the decodes run), outcore told that n CPUs are free (its `Gauge`, which reads a sleeping thread as one
   waiting for a core, kept from lowering the pool's limit): as if each thread had a core of its own for its
   decodes, while the rest (reads, batch assembly, the transform's Python) runs on this machine's cores.

The ratio is the samples/s to n times one core's decodes (n / the decode time a sample): 1.0 where n threads
are kept decoding all the time. On 16 real cores the rest runs in parallel too, outside the GIL (its share is
`cores.py`'s), so this is what the scheduling allows, not a prediction of the rate. The stores are `cores.py`'s:
its JPEGs at their own sizes are a sixth of ``--images`` (1,024: 4 batches an epoch, whose starts and ends weigh
on many threads; ``--images 24576`` in another ``--workdir``: 16).

With ``--feed STEP_MS``, each thread count also feeds `cores.py`'s stand-in for a training step in the loader's
process (``STEP_MS`` of CPU a step, ``--held`` of it holding the GIL, as the Python between a small network's
kernel launches does), the decodes sleeps as above: the stand-in's steps/s taking a batch before each, as a ratio
to its own rate, and the share of the time it waited for one. On 2 cores that shows what the loader's GIL costs a
training loop when the loader decodes at 16 cores' rate: the other cores' part of the GPU machine's question.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from cores import CASES, child, epochs, fed, stores

import outcore
import outcore.threads
from outcore.imaging import BoxCuts, RowDecodes
from outcore.threads.pool import Gauge

DECODING = ("encoded", "encoded+crop", "rrc")  # the cases of cores.py whose time is their decodes
RUNS = (RowDecodes, BoxCuts)  # the C decodes of a batch's runs: each run(start, stop) decodes stop - start samples


def measured(location: Path, case: str, seconds: float) -> dict[str, float]:
    """One thread, for real: samples/s and each sample's decode CPU time (seconds)."""
    outcore.set_threads(1)
    spent = {"seconds": 0.0, "samples": 0}

    def timed(run: Callable[..., None]) -> Callable[..., None]:
        def decode(self: object, start: int, stop: int) -> None:
            began = time.thread_time()
            run(self, start, stop)
            spent["seconds"] += time.thread_time() - began
            spent["samples"] += stop - start

        return decode

    for kind in RUNS:
        kind.run = timed(kind.run)
    rate = epochs(location, case, 1, seconds)[0]
    if not spent["samples"]:  # a sleep of 0 would say every thread count is ideal
        raise SystemExit(f"{case}: no decode went through {' or '.join(kind.__name__ for kind in RUNS)}: nothing to "
                         "replace by a sleep")
    return {"samples_s": rate, "decode_s": spent["seconds"] / spent["samples"]}


def offered(location: Path, case: str, threads: int, decode_s: float, seconds: float,
            feed: tuple[float, float] | None = None, feeder: str = "threads") -> dict[str, float]:
    """``threads`` threads, each sample's decode a sleep of ``decode_s`` outside the GIL: samples/s; with ``feed``
    (a step's milliseconds and the share of it holding the GIL), `cores.fed`'s figures instead, the batches made
    by the loop's process (``feeder`` ``threads``) or by a process of their own (``process``)."""
    os.environ[SLEEPS] = f"{threads},{decode_s}"  # for a loader's process: its forkserver imports this script
    sleep_decodes()
    if feed is not None:
        return fed(location, case, seconds, *feed, workers=0 if feeder == "threads" else feeder)
    return {"samples_s": epochs(location, case, threads, seconds)[0]}


def sleep_decodes() -> None:
    """In a process told so (`SLEEPS`: n threads and a decode's seconds), each decode a sleep, outcore's pool n
    threads kept busy at most."""
    if SLEEPS not in os.environ:
        return
    threads, decode_s = int(os.environ[SLEEPS].split(",")[0]), float(os.environ[SLEEPS].split(",")[1])
    outcore.threads.available_cpus = lambda: threads  # the pool's limit: n busy at once
    Gauge.LOW = 0.0  # a sleeping thread is no thread waiting for a core
    for kind in RUNS:
        kind.run = lambda self, start, stop: time.sleep((stop - start) * decode_s)
    outcore.set_threads(threads)


SLEEPS = "OUTCORE_BENCH_SLEEPS"
sleep_decodes()  # imported by a loader's process (its forkserver preloads the script): decodes as its consumer's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,4,8,16")
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--cases", default=",".join(DECODING))
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/cores"))
    parser.add_argument("--feed", type=float, metavar="STEP_MS", help="also feed a training step's stand-in of this "
                        "many milliseconds at each thread count")
    parser.add_argument("--held", type=float, default=0.8, help="the share of the stand-in's step holding the GIL")
    parser.add_argument("--measure", nargs=3, metavar=("CASE", "STORE", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--offer", nargs=5, metavar=("CASE", "STORE", "THREADS", "DECODE_S", "SECONDS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--feed-by", default="threads", help="who makes the fed batches: threads (in the loop's "
                        "process), process (ds.batches(process=True)), or both: threads,process")
    parser.add_argument("--offer-feed", nargs=3, metavar=("STEP_MS", "HELD", "FEEDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        case, location, seconds = args.measure
        print(json.dumps(measured(Path(location), case, float(seconds))))
        return
    if args.offer:
        case, location, threads, decode_s, seconds = args.offer
        print(json.dumps(offered(Path(location), case, int(threads), float(decode_s), float(seconds),
                                 (float(args.offer_feed[0]), float(args.offer_feed[1])) if args.offer_feed else None,
                                 args.offer_feed[2] if args.offer_feed else "threads")))
        return
    cases, threads = args.cases.split(","), [int(n) for n in args.threads.split(",")]
    unknown = sorted(set(cases) - set(DECODING))
    if unknown:
        parser.error(f"--cases {','.join(unknown)}: these decode no JPEGs; use some of {','.join(DECODING)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    made = stores(args.workdir, args.images, {CASES[case][0] for case in cases})
    print("\nsamples/s of ds.batches(256, shuffle=True) with each sample's decode a sleep as long as one core's decode "
          "(one thread, for real: its rate and decode time a sample); the ratio: to n / that time")
    print(f"{'case':14s} {'1 thread, real':>15s} {'decode':>9s}"
          + "".join(f" {f'{n} thread' + 's' * (n > 1):>11s} {'ratio':>6s}" for n in threads), flush=True)
    decode_times = {}
    for case in cases:
        location = made[CASES[case][0]]
        real = child("--measure", case, location, args.seconds, script=__file__)
        decode_times[case] = real["decode_s"]
        row = f"{case:14s} {real['samples_s']:15.0f} {real['decode_s'] * 1e3:7.3f}ms"
        for n in threads:
            rate = child("--offer", case, location, n, real["decode_s"], args.seconds, script=__file__)["samples_s"]
            row += f" {rate:11.0f} {rate * real['decode_s'] / n:6.2f}"
        print(row, flush=True)
    if args.feed is None:
        return
    print(f"\na training step's stand-in ({args.feed:g} ms, {args.held:.0%} of it holding the GIL) taking a batch of "
          "ds.batches(256, shuffle=True) before each, the decodes sleeps as above, the batches made by the loop's "
          "process (threads) or by one of their own (process): its steps/s as a ratio to its own rate, and the share "
          "of the time it waited for a batch")
    print(f"{'case':14s} {'made by':>8s}" + "".join(f" {f'{n} thread' + 's' * (n > 1):>11s} {'waiting':>8s}"
                                                   for n in threads))
    for case in cases:
        for feeder in args.feed_by.split(","):
            row = f"{case:14s} {feeder:>8s}"
            for n in threads:
                got = child("--offer", case, made[CASES[case][0]], n, decode_times[case], args.seconds,
                            "--offer-feed", args.feed, args.held, feeder, script=__file__)
                row += f" {got['fed'] / got['alone']:11.2f} {got['waiting']:8.1%}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
