"""Is ingesting from record files as fast as from the folder of the same JPEGs, and how does it compare
with the peers' own converters?

    python benchmarks/record_sources.py [--images 20000] [--size 256] [--shape 128] [--repeats 3]
                                        [--workdir bench-data] [--peers PYTHON]

Writes ``--images`` photo crops of ``--size`` px as quality-90 JPEGs, then the same pictures and labels as
each format's own library writes them (TensorFlow's ``TFRecordWriter``, plain and GZIP; webdataset's
``ShardWriter``; ``lmdb``; Hugging Face ``datasets``' ``save_to_disk`` and ``to_parquet``), all kept in
``--workdir``. Then measures, with medians over ``--repeats`` rounds that take every row in turn, the
images/s of ``outcore.ingest_images`` from the folder and ``outcore.ingest_records`` from each format
(pixels of ``--shape`` px; every picture decoded, as an ingest does; and, from the tars, the JPEGs kept
as they are with ``images="encoded"``, still each decoded once to find bad ones), each twice: with the sources' pages
in memory (hot) and evicted before the run (cold: ``posix_fadvise(DONTNEED)`` on every source file, so
that the folder's small files and the formats' big ones are read from the disk). With ``--peers PYTHON``
(a Python with LitData and Mosaic streaming, see ``benchmarks/record_peers.py``), the peers' converters
from the WebDataset shards, run in the same rounds (they store the JPEG bytes without decoding them).

The table gives images/s and each row as a fraction of the folder's rate (hot and cold). The ceiling is
the 2 cores' JPEG decoding, which every outcore row does in full.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common import prepare, print_table

import outcore
from outcore.storage.page_cache import evict
from outcore.testing.records import write_hf_dataset, write_lmdb, write_tfrecords, write_webdataset

HERE = Path(__file__).resolve().parent


def write_sources(work: Path, files: list[Path]) -> dict[str, tuple[object, object, list[Path]]]:
    """Each format's files (written once, kept): name -> (source, format, the files to evict)."""
    classes = [f.parent.name for f in files]
    shards = max(2, len(files) // 1000)
    done = work / "records.done"
    if not done.exists() or done.read_text() != str(len(files)):
        print("writing the record files …")
        for folder in ("tfrecord", "tfrecord-gz", "wds", "hf"):
            subprocess.run(["rm", "-rf", str(work / folder), str(work / "lmdb")], check=True)
        write_tfrecords(files, classes, work / "tfrecord", shards=shards)
        write_tfrecords(files, classes, work / "tfrecord-gz", shards=shards, compression="GZIP")
        write_webdataset(files, classes, work / "wds", per_shard=len(files) // shards + 1)
        write_lmdb(files, classes, work / "lmdb")
        write_hf_dataset(files, classes, work / "hf", parquet_shards=shards)
        done.write_text(str(len(files)))
    parquet = sorted((work / "hf").glob("*.parquet"))
    return {
        "TFRecord": (work / "tfrecord", None, sorted((work / "tfrecord").iterdir())),
        "TFRecord GZIP": (work / "tfrecord-gz", None, sorted((work / "tfrecord-gz").iterdir())),
        "WebDataset tars": (work / "wds", None, sorted((work / "wds").glob("*.tar"))),
        "LMDB of JPEGs": (work / "lmdb", outcore.LMDB(label_pattern=r"^(?P<labels>[^/]+)/"),
                          sorted((work / "lmdb").iterdir())),
        "Parquet (HF to_parquet)": ([str(p) for p in parquet], None, parquet),
        "HF save_to_disk": (work / "hf" / "saved", None, sorted((work / "hf" / "saved").iterdir())),
    }


def interleaved_rates(cases: dict[str, Callable[[], tuple[int, float]]], repeats: int) -> dict[str, float]:
    """Median images/s of each case over ``repeats`` rounds that run every case in turn; a case returns
    how many images it did and in how many seconds (a peer by its own clock, its interpreter's start left
    out)."""
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, work in cases.items():
            count, seconds = work()
            rates[name].append(count / seconds)
    return {name: statistics.median(measured) for name, measured in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--shape", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--peers", metavar="PYTHON", help="a Python with LitData and Mosaic streaming")
    args = parser.parse_args()
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    files = prepare(work / f"jpegs-{args.size}", args.images, args.size)
    sources = write_sources(work, files)
    target, shape = work / "records.zarr", (args.shape, args.shape, 3)

    def folder(cold: bool) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            if cold:
                evict(files)
            began = time.perf_counter()
            count = len(outcore.ingest_images(files[0].parent.parent, target, shape=shape, overwrite=True,
                                              progress=False))
            return count, time.perf_counter() - began
        return run

    def records(source: object, format: object, evicted: list[Path], cold: bool,
                images: str = "pixels") -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            if cold:
                evict(evicted)
            began = time.perf_counter()
            count = len(outcore.ingest_records(source, target, format=format, shape=shape, images=images,
                                               overwrite=True, progress=False))
            return count, time.perf_counter() - began
        return run

    def peer(name: str, cold: bool) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            if cold:
                evict(sources["WebDataset tars"][2])
            done = subprocess.run([args.peers, str(HERE / "record_peers.py"), name, "--shards",
                                   str(work / "wds" / "*.tar"), "--output", str(work / f"peer-{name}")],
                                  check=True, capture_output=True, text=True)
            measured = json.loads(done.stdout.strip().splitlines()[-1])
            return measured["samples"], measured["seconds"]  # its own clock: its interpreter's start left out
        return run

    cases: dict[str, Callable[[], tuple[int, float]]] = {}
    for cold in (False, True):
        mode = "cold" if cold else "hot"
        cases[f"folder of JPEGs, {mode}"] = folder(cold)
        for name, (source, format, evicted) in sources.items():
            cases[f"{name}, {mode}"] = records(source, format, evicted, cold)
        source, format, evicted = sources["WebDataset tars"]  # what the peers convert: their JPEGs kept as they are
        cases[f"WebDataset tars, images='encoded', {mode}"] = records(source, format, evicted, cold, "encoded")
    peers = {}
    if args.peers:
        for name in ("litdata", "mosaic"):
            for cold in (False, True):
                peers[f"{name} ({'optimize' if name == 'litdata' else 'MDSWriter'}) from the tars, "
                      f"{'cold' if cold else 'hot'}"] = peer(name, cold)
    rates = interleaved_rates({**cases, **peers}, args.repeats)
    print(f"\n{args.images} JPEGs of {args.size} px into pixels of {args.shape} px; {os.cpu_count()} cores; "
          f"median of {args.repeats} rounds (peers: the JPEG bytes copied, not decoded)")
    print_table(("source", "images/s"), list(rates.items()),
                {"/ folder (hot)": rates["folder of JPEGs, hot"], "/ folder (cold)": rates["folder of JPEGs, cold"]})


if __name__ == "__main__":
    sys.exit(main())
