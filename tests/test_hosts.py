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

import numpy as np
import pytest

import outcore
from outcore.testing import write_image_folder
from outcore.testing.hosts import Hosts, command, unavailable, wait_for

WHY = unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(WHY is not None, reason=WHY or "")]

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


def host_of(worker: str, hosts: Hosts) -> str:
    """The name of the host of the Dask address ``worker`` (which names it or its address)."""
    return next(h.name for h in hosts if f"//{h.address}:" in worker or f"//{h.name}:" in worker)


def routes_by_host(run: dict, hosts: Hosts) -> dict[str, dict[str, int]]:
    """Batches delivered, by the host of the worker that made them and by route."""
    found: dict[str, dict[str, int]] = {}
    for worker, route, count in run["routes"]:
        host = host_of(worker, hosts)
        found.setdefault(host, {}).setdefault(route, 0)
        found[host][route] += count
    return found


def test_batches_across_hosts_are_the_local_ones_in_shared_memory_on_the_consumers_host_over_sockets_from_others(
        hosts, pictures, tmp_path):
    """Scheduler on host 0, a worker on each of hosts 1 and 2, the training process on host 1 with
    ``client=``: two epochs of the batches of local threads; host 1's worker hands its batches over in
    shared memory, host 2's over sockets straight from the worker, and both make some."""
    scheduler = hosts.start_dask()
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
    scheduler = hosts.start_dask()
    process, folder = consume(hosts[1], tmp_path / "run", store=pictures.location, scheduler=scheduler, pause=[1, 3])
    _pause_then(hosts, folder, hosts[2].stop)  # SIGKILL: the worker and its nanny
    run = result(process, folder)
    assert [epoch["digests"] for epoch in run["epochs"]] == local_epochs(pictures)


def test_a_host_cut_off_mid_epoch_changes_no_batch_and_stalls_the_epoch_seconds_not_dask_timeouts(
        hosts, pictures, tmp_path):
    """Host 2's link taken down mid-epoch (it vanishes without closing its connections): the batches do
    not change, and the epoch waits at most 10 s (it waited 30 s, Dask's connect timeout, for the spans
    host 2 held): the late spans are made again on host 1 (`outcore.iterate.hedge`)."""
    scheduler = hosts.start_dask()
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
    scheduler = hosts.start_dask()
    started = [consume(hosts[1 + rank], tmp_path / f"rank{rank}", store=pictures.location, scheduler=scheduler,
                       rank=rank, world_size=2) for rank in (0, 1)]
    runs = [result(*each) for each in started]
    for rank, run in enumerate(runs):
        assert [epoch["digests"] for epoch in run["epochs"]] == local_epochs(pictures, rank, 2)
        routes = routes_by_host(run, hosts)
        assert set(routes.get(f"host{1 + rank}", {"shared_memory": 0})) == {"shared_memory"}
        assert set(routes.get(f"host{2 - rank}", {"straight": 0})) == {"straight"}


S3_PORT = 5000
DIGEST = """
import hashlib, json, sys
import outcore

ds = outcore.open_dataset(sys.argv[1], cache_dir=False)
print(json.dumps({"samples": len(ds), "chunk_size": ds.chunk_size, "classes": ds.classes,
                  "fields": {name: hashlib.sha1(ds[name].compute().tobytes()).hexdigest() for name in ds.fields}}))
"""
EXECUTED = """
import json, sys
from distributed import Client

with Client(sys.argv[1], timeout=30) as client:
    print(json.dumps(client.run(lambda dask_worker: dask_worker.state.executed_count)))
"""
UPLOAD = """
import os, sys
from outcore.testing.s3 import upload

upload(sys.argv[1], sys.argv[2], {"endpoint": os.environ["AWS_ENDPOINT_URL"], "access_key_id": "testing",
                                  "secret_access_key": "testing", "region": "us-east-1"})
"""
BUCKET = """
import boto3, os
boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket="photos")
"""


def store_digest(location: str) -> dict:
    ds = outcore.open_dataset(location)
    return {"samples": len(ds), "chunk_size": ds.chunk_size, "classes": ds.classes,
            "fields": {name: hashlib.sha1(ds[name].compute().tobytes()).hexdigest() for name in ds.fields}}


def s3_environment(hosts: Hosts) -> dict[str, str]:
    """moto's S3 server on host 0, as the standard environment names it."""
    return {"AWS_ENDPOINT_URL": f"http://{hosts[0].name}:{S3_PORT}", "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def leftovers(host) -> list[str]:
    """What outcore left in a host's own folders: its staging and cache folders (in its home) and anything
    of outcore's in its scratch folder."""
    own = [p for p in (host.home / ".cache" / "outcore").rglob("*") if p.is_file()]
    scratch = [p for p in host.tmp.rglob("*") if p.is_file() and "outcore" in p.relative_to(host.tmp).as_posix()]
    return [p.relative_to(host.root).as_posix() for p in own + scratch]


def test_outcore_ingest_on_a_scheduler_across_hosts_equals_a_local_ingest(hosts, tmp_path):
    """``outcore ingest --scheduler`` from host 1, with a worker on each of hosts 1 and 2, into the folder
    every host sees and into the S3 server on host 0: each store equals a local ingest, and nothing is left
    in any host's staging or scratch folders (nor beside the shared store)."""
    photos, shared = tmp_path / "shared" / "photos", tmp_path / "shared"
    write_image_folder(photos, 20, classes=("a", "b", "c"), size=(40, 40), seed=5)
    local = outcore.ingest_images(photos, tmp_path / "local.zarr", shape=(32, 32, 3), chunk_size=8, progress=False)
    s3 = s3_environment(hosts)
    hosts[0].start([command("moto_server"), "-H", hosts[0].name, "-p", str(S3_PORT)])
    scheduler = hosts.start_dask(env=s3)
    wait_for(lambda: hosts[1].run([sys.executable, "-c", BUCKET], timeout=60, env=s3).returncode == 0, 60,
             "the S3 server on host 0 answering")
    for target in (str(shared / "train.zarr"), "s3://photos/train.zarr"):
        done = hosts[1].run([command("outcore"), "ingest", str(photos), target, "--shape", "32x32x3",
                             "--chunk-size", "8", "--scheduler", scheduler, "--no-progress"], timeout=180, env=s3)
        assert done.returncode == 0, done.stdout[-3000:]
        read = hosts[1].run([sys.executable, "-c", DIGEST, target], timeout=120, env=s3)
        assert read.returncode == 0, read.stdout[-3000:]
        assert json.loads(read.stdout.strip().splitlines()[-1]) == store_digest(local.location), target
    executed = hosts[1].run([sys.executable, "-c", EXECUTED, scheduler], timeout=60)
    counts = json.loads(executed.stdout.strip().splitlines()[-1])
    assert sorted(host_of(worker, hosts) for worker, count in counts.items() if count) == ["host1", "host2"]
    assert sorted(p.name for p in shared.iterdir()) == ["photos", "train.zarr"]
    for host in hosts:
        assert leftovers(host) == [], host


RENDEZVOUS_PORT = 29400
SAMPLES, GLOBAL_BATCH = 960, 48  # 20 global steps: 8 samples a rank on 6 ranks, 12 on 4; no short last step
TRAINER = """
import json, sys
from pathlib import Path
import torch.distributed as dist
import outcore


def main(args):
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = outcore.open_dataset(args["store"]).torch(args["global_batch"] // world_size, shuffle=True, seed=11,
                                                       num_workers=2, fields=["id"])  # the default options
    if args["resume"]:
        loader.load_state_dict(json.loads(Path(args["resume"]).read_text()))
    epochs = []
    for epoch in range(args["passes"]):
        batches = []
        for batch in loader:
            batches.append(batch["id"].tolist())
            if [epoch, len(batches)] == args["stop"]:
                if rank == 0:
                    Path(args["state"]).write_text(json.dumps(loader.state_dict()))
                break
        epochs.append({"len": len(loader), "batches": batches})
    Path(args["folder"], f"rank{rank}.json").write_text(json.dumps({"world_size": world_size, "epochs": epochs}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":  # DataLoader workers started by forkserver (an object store's) import this file
    main(json.loads(Path(sys.argv[1]).read_text()))
"""


def torchrun(hosts: list, folder: Path, job: str, env: dict[str, str], **args) -> list[dict]:
    """``torchrun --nnodes N --nproc-per-node 2`` on each of ``hosts`` (c10d rendezvous on the first, gloo over
    the hosts' addresses), each rank running `TRAINER` with ``args``, ``env`` and the node cache in the
    host's home; each rank's result."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(TRAINER)
    (folder / "args.json").write_text(json.dumps({"folder": str(folder), "resume": None, "stop": None, **args}))
    endpoint = f"{hosts[0].name}:{RENDEZVOUS_PORT}"
    started = [host.start([command("torchrun"), "--nnodes", str(len(hosts)), "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", job,
                           str(folder / "train.py"), str(folder / "args.json")],
                          env={"OUTCORE_CACHE_DIR": str(host.home / "cache"), **env})
               for host in hosts]
    for process in started:
        try:
            process.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun did not end within 300 s: {Path(process.log).read_text()[-3000:]}")
        assert process.returncode == 0, Path(process.log).read_text()[-3000:]
    ranks = [json.loads(path.read_text()) for path in sorted(folder.glob("rank*.json"), key=lambda p: int(p.stem[4:]))]
    assert len(ranks) == 2 * len(hosts)
    return ranks


def shard_requests(log: Path, address: str) -> int:
    """Requests for shard data (``.../c/...``) from ``address`` in moto's log."""
    return sum(1 for line in log.read_text().splitlines() if line.startswith(f"{address} ") and "/c/" in line
               and '"GET ' in line)


@pytest.mark.parametrize("source", ["folder", "s3"])
def test_torchrun_across_3_hosts_resumes_on_2_with_every_sample_once(hosts, tmp_path, source):
    """``torchrun`` on 3 hosts x 2 processes (world size 6: 8 streams refused it), each rank
    ``ds.torch(..., num_workers=2)`` with the default options, from the folder every host sees or from
    the S3 server on host 0 through each host's node cache: every rank the same number of batches, every
    sample once an epoch; a job stopped after 5 of 20 steps of its second epoch resumes on 2 hosts x 2
    (world size 4 divides the 24 streams of 6) with every sample of that epoch once. From S3, each host
    asks for each byte range once, however many of its ranks and DataLoader workers read it and in how many
    epochs: no more requests for shard data than its cache holds entries (byte ranges)."""
    local = outcore.from_arrays({"id": np.arange(SAMPLES), "x": np.zeros((SAMPLES, 64), np.float32)},
                                tmp_path / "ids.zarr", chunk_size=16, progress=False)
    env: dict[str, str] = {}
    store = local.location
    if source == "s3":
        env = s3_environment(hosts)
        hosts[0].start([command("moto_server"), "-H", hosts[0].name, "-p", str(S3_PORT)],
                       log=tmp_path / "moto.log")
        wait_for(lambda: hosts[1].run([sys.executable, "-c", BUCKET], timeout=60, env=env).returncode == 0, 60,
                 "the S3 server on host 0 answering")
        store = "s3://photos/ids.zarr"
        copied = hosts[1].run([sys.executable, "-c", UPLOAD, local.location, store], timeout=120, env=env)
        assert copied.returncode == 0, copied.stdout[-3000:]
    first = torchrun(list(hosts), tmp_path / "six", "six", env, store=store, global_batch=GLOBAL_BATCH,
                     passes=2, stop=[1, 5], state=str(tmp_path / "state.json"))
    assert {rank["world_size"] for rank in first} == {6}
    epoch0 = [rank["epochs"][0] for rank in first]
    assert {e["len"] for e in epoch0} == {20} and {len(e["batches"]) for e in epoch0} == {20}
    assert sorted(i for e in epoch0 for batch in e["batches"] for i in batch) == list(range(SAMPLES))
    head = [i for rank in first for batch in rank["epochs"][1]["batches"] for i in batch]
    assert {len(rank["epochs"][1]["batches"]) for rank in first} == {5}
    second = torchrun(list(hosts)[:2], tmp_path / "four", "four", env, store=store,
                      global_batch=GLOBAL_BATCH, passes=1, resume=str(tmp_path / "state.json"))
    assert {rank["world_size"] for rank in second} == {4}
    assert {len(rank["epochs"][0]["batches"]) for rank in second} == {15}
    tail = [i for rank in second for batch in rank["epochs"][0]["batches"] for i in batch]
    assert sorted(head + tail) == list(range(SAMPLES))  # the second epoch: every sample once, across the resume
    if source == "s3":
        for host in hosts:
            entries = [p for p in (host.home / "cache").rglob("*") if p.is_file() and "blobs" in p.parts]
            asked = shard_requests(tmp_path / "moto.log", host.address)
            assert 0 < asked <= len(entries), (host, asked, len(entries))  # a request may fill two adjacent ranges
