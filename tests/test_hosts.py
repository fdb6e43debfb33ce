"""Many machines, emulated for real (`outcore.testing.hosts`): each host a network namespace with its own
address, ``/dev/shm`` and ``TMPDIR``, processes started with the commands users type (``dask scheduler``,
``dask worker ADDRESS``, ``outcore ingest --scheduler``, ``torchrun --nnodes``), the store in a folder every
host sees (as over NFS) or on an S3 server on one host. Needs root: skipped otherwise, saying so."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import outcore
from outcore.testing import write_image_folder
from outcore.testing.hosts import Hosts, unavailable, wait_for

WHY = unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(WHY is not None, reason=WHY or "")]

BIN = Path(sys.executable).parent  # the commands users type: dask, outcore, torchrun
PORT = 8786
BATCH = 32

CONSUMER = """
import hashlib, json, sys, time
from pathlib import Path
from distributed import Client
import outcore

args = json.loads(Path(sys.argv[1]).read_text())
folder = Path(args["folder"])
client = Client(args["scheduler"], timeout=30)
client.wait_for_workers(args["workers"], timeout=60)
it = outcore.open_dataset(args["store"]).batches(args["batch"], seed=3, client=client, rank=args["rank"],
                                                 world_size=args["world_size"])
epochs = []
for epoch in range(args["epochs"]):
    digests, gaps, last = [], [], time.monotonic()
    for k, batch in enumerate(it):
        gaps.append(time.monotonic() - last)
        digests.append(hashlib.sha1(b"".join(batch[f].tobytes() for f in sorted(batch))).hexdigest())
        if [epoch, k] == args["pause"]:  # the test does something to a host meanwhile
            (folder / "paused").write_text("")
            deadline = time.monotonic() + 60
            while not (folder / "go").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        last = time.monotonic()
    epochs.append({"digests": digests, "gaps": gaps})
routes = [[worker, route, count] for (worker, route), count in it._stats.routes.items()]
(folder / "result.json").write_text(json.dumps({"epochs": epochs, "routes": routes, "stats": it.stats()}))
it.close()
client.close()
"""


def digests(batches) -> list[str]:
    return [hashlib.sha1(b"".join(b[f].tobytes() for f in sorted(b))).hexdigest() for b in batches]


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> outcore.Dataset:
    """576 pictures of 64x64 in a folder every host sees: 18 whole batches of 32 (393 KB each), so every
    batch travels in shared memory where it can (arrays under 256 KB go in the task's answer)."""
    root = tmp_path_factory.mktemp("shared")
    write_image_folder(root / "photos", 192, classes=("a", "b", "c"), size=(64, 64), seed=0)
    return outcore.ingest_images(root / "photos", root / "train.zarr", shape=(64, 64, 3), chunk_size=32,
                                 progress=False)


@pytest.fixture
def hosts(tmp_path):
    with Hosts(3, tmp_path / "hosts") as made:
        yield made


def start_cluster(hosts: Hosts, workers: tuple[int, ...] = (1, 2)) -> str:
    """``dask scheduler`` on host 0, ``dask worker ADDRESS`` (one thread, outcore's worker settings) on each
    of ``workers``; the scheduler's address."""
    scheduler = f"tcp://{hosts[0].address}:{PORT}"
    hosts[0].start([str(BIN / "dask"), "scheduler", "--host", hosts[0].address, "--port", str(PORT),
                    "--no-dashboard"])
    for index in workers:
        hosts[index].start([str(BIN / "dask"), "worker", scheduler, "--host", hosts[index].address, "--nthreads", "1",
                            "--no-dashboard"], env=outcore.worker_environment())
    return scheduler


def consume(host, folder: Path, **args) -> tuple[object, Path]:
    """Start the consumer script on ``host`` (its arguments: ``args``), writing into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"batch": BATCH, "epochs": 2, "rank": 0, "world_size": 1, "workers": 2, "pause": None,
                "folder": str(folder), **args}
    (folder / "args.json").write_text(json.dumps(settings))
    (folder / "consumer.py").write_text(CONSUMER)
    return host.start([sys.executable, str(folder / "consumer.py"), str(folder / "args.json")]), folder


def result(process, folder: Path, seconds: float = 240) -> dict:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the consumer did not end within {seconds} s: {Path(process.log).read_text()[-3000:]}")
    assert process.returncode == 0, Path(process.log).read_text()[-3000:]
    return json.loads((folder / "result.json").read_text())


def local_epochs(ds, rank: int = 0, world_size: int = 1) -> list[list[str]]:
    it = ds.batches(BATCH, seed=3, rank=rank, world_size=world_size)
    return [digests(it) for _ in range(2)]


def routes_by_host(run: dict, hosts: Hosts) -> dict[str, dict[str, int]]:
    """Batches delivered, by the host of the worker that made them and by route."""
    found: dict[str, dict[str, int]] = {}
    for worker, route, count in run["routes"]:
        host = next(h.name for h in hosts if f"//{h.address}:" in worker)
        found.setdefault(host, {}).setdefault(route, 0)
        found[host][route] += count
    return found


def test_batches_across_hosts_are_the_local_ones_in_shared_memory_on_the_consumers_host_over_sockets_from_others(
        hosts, pictures, tmp_path):
    """Scheduler on host 0, a worker on each of hosts 1 and 2, the training process on host 1 with
    ``client=``: two epochs of the batches of local threads; host 1's worker hands its batches over in
    shared memory, host 2's over sockets straight from the worker, and both make some."""
    scheduler = start_cluster(hosts)
    run = result(*consume(hosts[1], tmp_path / "run", store=pictures.location, scheduler=scheduler))
    assert [epoch["digests"] for epoch in run["epochs"]] == local_epochs(pictures)
    routes = routes_by_host(run, hosts)
    assert set(routes) == {"host1", "host2"}
    assert set(routes["host1"]) == {"shared_memory"} and set(routes["host2"]) == {"straight"}
    assert run["stats"]["spans_hedged"] == 0


def _pause_then(hosts, folder: Path, action) -> float:
    """Wait for the consumer to pause, do ``action``, let it go on; when it went on."""
    wait_for(lambda: (folder / "paused").exists(), 120, "the consumer reaching its pause")
    action()
    (folder / "go").write_text("")
    return time.monotonic()


def test_a_host_whose_worker_is_killed_mid_epoch_changes_no_batch(hosts, pictures, tmp_path):
    scheduler = start_cluster(hosts)
    process, folder = consume(hosts[1], tmp_path / "run", store=pictures.location, scheduler=scheduler, pause=[1, 3])
    _pause_then(hosts, folder, hosts[2].stop)  # SIGKILL: the worker and its nanny
    run = result(process, folder)
    assert [epoch["digests"] for epoch in run["epochs"]] == local_epochs(pictures)


def test_a_host_cut_off_mid_epoch_changes_no_batch_and_stalls_the_epoch_seconds_not_dask_timeouts(
        hosts, pictures, tmp_path):
    """Host 2's link taken down mid-epoch (it vanishes without closing its connections): the batches do
    not change, and the epoch waits at most 10 s (it waited 30 s, Dask's connect timeout, for the spans
    host 2 held): the late spans are made again on host 1 (`outcore.iterate.hedge`)."""
    scheduler = start_cluster(hosts)
    process, folder = consume(hosts[1], tmp_path / "run", store=pictures.location, scheduler=scheduler, pause=[1, 3])
    _pause_then(hosts, folder, hosts[2].cut)
    run = result(process, folder)
    assert [epoch["digests"] for epoch in run["epochs"]] == local_epochs(pictures)
    after_cut = run["epochs"][1]["gaps"][4:]
    assert max(after_cut) < 10.0, after_cut
    assert run["stats"]["spans_hedged"] >= 1


def test_two_training_processes_on_two_hosts_share_one_cluster(hosts, pictures, tmp_path):
    """Rank 0 on host 1 and rank 1 on host 2, one cluster (a worker on each): each gets the batches local
    threads make for its rank (together every sample once an epoch: `tests/test_loader.py`); each takes
    its own host's batches in shared memory and the other's over sockets."""
    scheduler = start_cluster(hosts)
    started = [consume(hosts[1 + rank], tmp_path / f"rank{rank}", store=pictures.location, scheduler=scheduler,
                       rank=rank, world_size=2) for rank in (0, 1)]
    runs = [result(*each) for each in started]
    for rank, run in enumerate(runs):
        assert [epoch["digests"] for epoch in run["epochs"]] == local_epochs(pictures, rank, 2)
        routes = routes_by_host(run, hosts)
        assert set(routes.get(f"host{1 + rank}", {"shared_memory": 0})) == {"shared_memory"}
        assert set(routes.get(f"host{2 - rank}", {"straight": 0})) == {"straight"}
