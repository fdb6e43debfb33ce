"""A host cut off mid-epoch: how long the training loop waits, with late spans made again elsewhere and without.

    sudo python benchmarks/hosts.py [--repeats 3] [--workdir bench-data]

Three hosts emulated on this machine (`outcore.testing.hosts`, root only): ``dask scheduler`` on host 0, a
``dask worker`` of one thread on each of hosts 1 and 2, the training process on host 1 with ``client=``,
reading 2 epochs of a store of 576 pictures of 64x64 (batches of 32) in a folder every host sees. At the
fourth batch of the second epoch the training process pauses, host 2's link is taken down (it vanishes
without closing its connections) and the training process goes on. Each run prints the longest wait for
a batch after the cut, the spans made again, and whether the batches equal those of local threads:

- outcore as it is (a span late by four times a recent span's time, 2 s at least, is made again on the
  other workers: `outcore.iterate.hedge`);
- never made again (its thresholds set beyond any wait): what Dask's own timeouts give.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import outcore
from outcore.testing import write_image_folder
from outcore.testing.hosts import Hosts, unavailable, wait_for

BATCH, PAUSE = 32, [1, 3]
CONSUMER = """
import hashlib, json, sys, time
from pathlib import Path
from distributed import Client
import outcore
from outcore.iterate import hedge

store, scheduler, folder, hedged = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "1"
batch_size, pause = json.loads(sys.argv[5])
if not hedged:
    hedge.SPAN_HEDGE_SECONDS = hedge.FIRST_SECONDS = 1e9
client = Client(scheduler, timeout=30)
client.wait_for_workers(2, timeout=60)
it = outcore.open_dataset(store).batches(batch_size, seed=3, client=client)
digests, after = [], []
for epoch in range(2):
    last = time.monotonic()
    for k, batch in enumerate(it):
        if [epoch, k] > pause:
            after.append(time.monotonic() - last)
        digests.append(hashlib.sha1(b"".join(batch[f].tobytes() for f in sorted(batch))).hexdigest())
        if [epoch, k] == pause:
            (folder / "paused").write_text("")
            while not (folder / "go").exists():
                time.sleep(0.05)
        last = time.monotonic()
(folder / "result.json").write_text(json.dumps({"digests": digests, "after": after,
                                                "hedged": it.stats()["spans_hedged"]}))
it.close()
client.close()
"""


def one_run(root: Path, store: str, expected: list[str], hedged: bool) -> dict:
    with Hosts(3, root / "hosts") as hosts:
        scheduler = hosts.start_dask()
        folder = root / "run"
        folder.mkdir()
        (folder / "consumer.py").write_text(CONSUMER)
        process = hosts[1].start([sys.executable, str(folder / "consumer.py"), store, scheduler, str(folder),
                                  "1" if hedged else "0", json.dumps([BATCH, PAUSE])])
        wait_for(lambda: (folder / "paused").exists(), 120, "the training process reaching its pause")
        hosts[2].cut()
        (folder / "go").write_text("")
        process.wait(timeout=600)
        if process.returncode:
            raise SystemExit(Path(process.log).read_text()[-3000:])
        result = json.loads((folder / "result.json").read_text())
    return {"longest wait": max(result["after"]), "hedged": result["hedged"], "same": result["digests"] == expected}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(why)
    workdir = Path(args.workdir).absolute()
    store = workdir / "hosts-pictures.zarr"
    if not store.exists():
        write_image_folder(workdir / "hosts-photos", 192, classes=("a", "b", "c"), size=(64, 64), seed=0)
        outcore.ingest_images(workdir / "hosts-photos", store, shape=(64, 64, 3), chunk_size=32, progress=False)
    it = outcore.open_dataset(store).batches(BATCH, seed=3)
    expected = [hashlib.sha1(b"".join(b[f].tobytes() for f in sorted(b))).hexdigest() for _ in range(2) for b in it]
    rows = {}
    for hedged in (True, False):
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(dir=workdir) as root:
                began = time.monotonic()
                runs.append(one_run(Path(root), str(store), expected, hedged))
                print(f"{'hedged' if hedged else 'never made again'}: {runs[-1]} ({time.monotonic() - began:.0f} s)",
                      flush=True)
        rows["outcore (late spans made again)" if hedged else "late spans never made again"] = runs
    print("\n| after host 2's link is cut | longest wait for a batch (s), median | each run | spans made again "
          "| batches as local threads' |")
    print("| --- | ---: | --- | --- | --- |")
    for name, runs in rows.items():
        waits = [run["longest wait"] for run in runs]
        print(f"| {name} | {statistics.median(waits):.1f} | {', '.join(f'{w:.1f}' for w in waits)} | "
              f"{', '.join(str(run['hedged']) for run in runs)} | {'yes' if all(run['same'] for run in runs) else 'NO'} |")


if __name__ == "__main__":
    main()
