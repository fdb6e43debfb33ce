"""Elastic order: what reading the same global steps on any number of ranks costs, from the plans alone.

    python benchmarks/elastic.py [--samples 1281167] [--chunk 64] [--batch 1024] [--buffer 8] [--epochs 2]
                                 [--world-sizes 1,2,4,8,3,6,16,64]

For each world size W (``--batch // W`` per rank), with the default streams (`default_streams`: 8, or the
least multiple of 8 and W):

- whether every global step (the union of the ranks' batches, less the last step's documented repeats)
  holds the same samples as on one rank with the same global batch and streams;
- chunk reads per rank over ``chunks / W`` (each rank reads its own share; the target is <= 1.1), and the
  same with ``--workers`` DataLoader workers, each making its part of every batch (its share of the rank's
  streams, where the rank has one for each: `outcore.adapters.torch`), or taking turns at whole batches,
  each reading the chunks its turns draw on;
- the most chunks a rank holds while following its schedule (measured step by step) against the bound of
  the previous, per-rank order (``buffer_chunks + 2 + ceil(batch / chunk) + read_ahead``; the target is
  within 2x);
- shuffle quality: the mean label total-variation distance of the global batches and of each rank's
  batches, over that of a full random permutation (1.0 is as good; the target is <= 1.2), on a store
  shuffled on write (random labels) and on a class-sorted one (1,000 classes in order).

No store is read: the plans and schedules are pure, so the figures are exact for any machine.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from outcore.iterate.plan import Consumer, EpochPlan, default_streams
from outcore.iterate.quality import mean_label_tv
from outcore.iterate.schedule import schedule
from outcore.seeds import Domain, generator

READ_AHEAD = 8  # the most a local run reads ahead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_281_167)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024, help="the global batch")
    parser.add_argument("--buffer", type=int, default=8)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--world-sizes", default="1,2,4,8,3,6,16,64")
    args = parser.parse_args()
    n, chunk = args.samples, args.chunk
    sorted_labels = np.arange(n) * args.classes // n
    mixed_labels = generator(Domain.REFERENCE, 99).permutation(sorted_labels)
    print(f"{n:,} samples in chunks of {chunk} ({math.ceil(n / chunk):,} chunks), global batch {args.batch}, "
          f"buffer_chunks {args.buffer}, default streams, {args.epochs} epochs")
    print(f"| ranks | streams | steps as on 1 rank | chunk reads per rank / (chunks / W) | {args.workers} workers making "
          f"parts | {args.workers} workers taking turns | most chunks held per rank (old bound) "
          "| TV ratio global, shuffled store | per rank | TV ratio global, class-sorted store | per rank |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for world_size in (int(w) for w in args.world_sizes.split(",")):
        batch, streams = args.batch // world_size, default_streams(world_size)
        identical, reads, part_reads, worker_reads, held = True, [], [], [], []
        quality: dict[str, list[tuple[float, float]]] = {"mixed": [], "sorted": []}
        for epoch in range(args.epochs):
            plans = [EpochPlan(n, chunk, batch_size=batch, seed=1, epoch=epoch, buffer_chunks=args.buffer, rank=r,
                               world_size=world_size) for r in range(world_size)]
            orders = [plan.take(0, len(plan))[0] for plan in plans]
            steps = _global_steps(plans, orders, batch)
            if world_size > 1:
                alone = EpochPlan(n, chunk, batch_size=batch * world_size, seed=1, epoch=epoch, streams=streams,
                                  buffer_chunks=args.buffer)
                reference = _global_steps([alone], [alone.take(0, len(alone))[0]], batch * world_size)
                identical &= all(np.array_equal(a, b) for a, b in zip(steps, reference, strict=True))
            parts = args.workers if args.workers <= streams // world_size else 0  # a stream each, else turns
            for rank, plan in enumerate(plans):
                share = math.ceil(n / chunk) / world_size
                reads.append(len(plan.chunks) / share)
                part_reads.append(sum(len(EpochPlan(n, chunk, batch_size=batch, seed=1, epoch=epoch, rank=rank,
                                                    buffer_chunks=args.buffer, world_size=world_size,
                                                    part=(w, parts)).chunks) for w in range(parts)) / share)
                turns = [Consumer(worker=w, num_workers=args.workers).steps(plan.steps) for w in range(args.workers)]
                worker_reads.append(sum(_loads(plan, steps) for steps in turns) / share)
                held.append(_most_held(plan))
            for name, labels in (("mixed", mixed_labels), ("sorted", sorted_labels)):
                full = mean_label_tv(labels, generator(Domain.REFERENCE, 1, epoch).permutation(n), args.batch)
                full_rank = mean_label_tv(labels, generator(Domain.REFERENCE, 1, epoch).permutation(n), batch)
                global_tv = np.mean([mean_label_tv(labels, step, len(step)) for step in steps[:-1]])
                rank_tv = np.mean([mean_label_tv(labels, order, batch) for order in orders])
                quality[name].append((global_tv / full, rank_tv / full_rank))
        old = args.buffer + 2 + math.ceil(batch / chunk) + READ_AHEAD
        cells = [f"{np.mean([q[i] for q in quality[name]]):.2f}" for name in ("mixed", "sorted") for i in (0, 1)]
        parts_cell = f"{max(part_reads):.3f}" if parts else "(turns: fewer streams than workers)"
        print(f"| {world_size} | {streams} | {'—' if world_size == 1 else 'yes' if identical else 'NO'} | "
              f"{max(reads):.3f} | {parts_cell} | "
              f"{max(worker_reads):.2f} | "
              f"{max(held)} ({old}) | "
              + " | ".join(cells) + " |")


def _global_steps(plans: list[EpochPlan], orders: list[np.ndarray], batch: int) -> list[np.ndarray]:
    """The union of the ranks' batches at each step, sorted, the last step's documented repeats left out."""
    own = [order[: len(order) - plan.repeats] for plan, order in zip(plans, orders, strict=True)]
    return [np.sort(np.concatenate([order[k * batch : (k + 1) * batch] for order in own]))
            for k in range(plans[0].steps)]


def _loads(plan: EpochPlan, steps: range) -> int:
    return sum(len(step.load) for step in schedule(plan, steps, read_ahead=0))


def _most_held(plan: EpochPlan) -> int:
    held, most = set(), 0
    for step in schedule(plan, range(plan.steps), read_ahead=READ_AHEAD):
        held |= set(step.load)
        most = max(most, len(held))
        held -= set(step.release)
    return most


if __name__ == "__main__":
    main()
