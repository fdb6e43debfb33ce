"""The peers' own converters, timed on the WebDataset shards of ``benchmarks/record_sources.py``: LitData's
``optimize`` (one input a shard, its worker processes) and Mosaic's ``MDSWriter`` (one process), each
storing every sample's JPEG bytes and label as they are (neither decodes the pictures).

Run by ``benchmarks/record_sources.py --peers PYTHON`` with a Python that has them (their own environment:
``pip install torch==2.13.0`` first, then ``pip install --no-deps litdata mosaicml-streaming`` and their light
dependencies; torchvision, which Mosaic imports for its vision datasets only, is stood in for). Prints one
JSON line: the samples written and the seconds taken.

    python benchmarks/record_peers.py litdata --shards 'bench-data/wds/shard-*.tar' --output /tmp/out
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from remote_peers import _stand_in_for_torchvision


def shard_samples(shard: str) -> Iterator[dict]:
    """A WebDataset shard's samples, ``{"image": the .jpg's bytes, "label": the .cls}``, read with tarfile."""
    sample: dict = {}
    key = None
    with tarfile.open(shard, "r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            name, _, extension = member.name.partition(".")
            if key is not None and name != key:
                yield sample
                sample = {}
            key = name
            data = archive.extractfile(member).read()
            if extension == "jpg":
                sample["image"] = data
            elif extension == "cls":
                sample["label"] = int(data)
    if sample:
        yield sample


def _litdata(shards: list[str], output: Path, workers: int) -> int:
    from litdata import optimize  # imported before the clock starts (main)

    optimize(fn=shard_samples, inputs=shards, output_dir=str(output), chunk_bytes="64MB", num_workers=workers,
             mode="overwrite")
    return sum(chunk["chunk_size"] for chunk in json.loads((output / "index.json").read_text())["chunks"])


def _mosaic(shards: list[str], output: Path, workers: int) -> int:
    from streaming import MDSWriter  # imported before the clock starts (main)

    count = 0
    with MDSWriter(out=str(output), columns={"image": "bytes", "label": "int"}, size_limit="64mb") as writer:
        for shard in shards:
            for sample in shard_samples(shard):
                writer.write(sample)
                count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=["litdata", "mosaic"])
    parser.add_argument("--shards", required=True, help="glob of the WebDataset shards")
    parser.add_argument("--output", required=True, help="folder to write (replaced)")
    parser.add_argument("--workers", type=int, default=2, help="LitData's worker processes (default 2)")
    args = parser.parse_args()
    shards, output = sorted(glob.glob(args.shards)), Path(args.output)
    shutil.rmtree(output, ignore_errors=True)
    _stand_in_for_torchvision()
    importlib.import_module("litdata" if args.peer == "litdata" else "streaming")
    start = time.perf_counter()
    count = {"litdata": _litdata, "mosaic": _mosaic}[args.peer](shards, output, args.workers)
    print(json.dumps({"samples": count, "seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
