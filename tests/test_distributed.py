"""Ingest and iteration on a real distributed.LocalCluster (worker processes, loopback only)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import cloudpickle
import dask
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from PIL import Image
from support.optional import need

import outcore
from outcore import transforms
from outcore.cli import main
from outcore.errors import ClusterError, NotAStoreError
from outcore.iterate import cluster, direct, mappings
from outcore.iterate.shared import is_mapped
from outcore.testing import write_image_folder
from outcore.testing.interrupts import as_from_a_terminal
from outcore.testing.reads import chunk_reads, count_chunk_reads

pytestmark = pytest.mark.e2e  # starts a LocalCluster of worker processes: see conftest.py


def augment(field: str) -> transforms.Compose:
    return transforms.Compose([transforms.RandomCrop((24, 24), field=field), transforms.RandomFlip(field=field),
                               transforms.BrightnessContrast(field=field)])


class SlowAugment:
    """`augment` of ``images_encoded`` and a pause, so that tasks are still running when a worker is killed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, batch, rng):
        time.sleep(self.seconds)
        return augment("images_encoded")(batch, rng)


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module


def on_local_threads():
    """While a client is active, ingest runs on its cluster unless dask's config says otherwise."""
    return dask.config.set(scheduler="threads")


@pytest.fixture(scope="module")
def client():
    """Two single-threaded workers with the settings outcore recommends (the tests that start their own
    clusters run with Dask's defaults)."""
    with dask.config.set(outcore.WORKER_CONFIG), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


def _runs_with_outcores_settings(dask_worker) -> bool:
    """Whether a worker runs as `outcore.WORKER_CONFIG` says: no statistical profiler, a tick a second."""
    callbacks = dask_worker.periodic_callbacks
    return "profile" not in callbacks and callbacks["tick"].callback_time == 1000


def test_workers_started_within_outcores_settings_run_with_them(client):
    assert list(client.run(_runs_with_outcores_settings).values()) == [True, True]


def test_the_worker_settings_read_back_from_their_environment_variables():
    collected = dask.config.collect_env(outcore.worker_environment())
    assert {key: dask.config.get(key, config=collected) for key in outcore.WORKER_CONFIG} == outcore.WORKER_CONFIG


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """120 JPEGs stored both ways, in 15 chunks of 8."""
    root = tmp_path_factory.mktemp("cluster")
    write_image_folder(root / "src", 40, classes=("a", "b", "c"), size=(40, 48), extension=".jpg", seed=8)
    return outcore.ingest_images(root / "src", root / "both.zarr", shape=(32, 32, 3), images="both", chunk_size=8,
                                 progress=False)


def _lanes_from_a_disk_too(monkeypatch):
    """Cluster runs cut into lanes as from an object store (`outcore.iterate.cluster.Lanes.count_for`), from a
    store on disk too."""
    from_an_object_store = partial(cluster.Lanes.count_for, "s3://bucket/store.zarr")
    monkeypatch.setattr(cluster.Lanes, "count_for", staticmethod(lambda _, streams, threads: from_an_object_store(
        streams, threads)))


def _assert_same_batches(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _assert_same_store(a, b):
    assert a.fields == b.fields and len(a) == len(b) and a.chunk_size == b.chunk_size and a.classes == b.classes
    for name in a.fields:
        np.testing.assert_array_equal(a[name].compute(), b[name].compute(), err_msg=name)


def test_cluster_ingest_equals_local_ingest(client, image_folder, tmp_path):
    with on_local_threads():
        local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", shape=(32, 32, 3), chunk_size=4,
                                      progress=False)
    remote = outcore.ingest_images(image_folder, tmp_path / "cluster.zarr", shape=(32, 32, 3), chunk_size=4,
                                   client=client, progress=False)
    _assert_same_store(local, remote)
    ran_on = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert len(ran_on) == 2 and all(count > 0 for count in ran_on.values())  # both workers did work


INTERRUPTED_AS_A_WAKE_UP_TAKES_ITS_LOCK = """
import os, signal, sys
import dask, outcore
from distributed import Client, LocalCluster, client as module

next_of, sent = module.as_completed.__next__, []


def interrupted_as_its_lock_is_taken(self):  # each wake-up of as_completed begins `with self.thread_condition:`
    if not sent:
        sent.append(True)
        self.thread_condition.acquire()
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C now: on the main thread, its KeyboardInterrupt is raised here
        self.thread_condition.release()
    return next_of(self)


module.as_completed.__next__ = interrupted_as_its_lock_is_taken
with dask.config.set(outcore.WORKER_CONFIG), LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                                          host="127.0.0.1", dashboard_address=":0") as cluster, \
        Client(cluster) as client:
    ingest = dict(shape=(32, 32, 3), chunk_size=4, client=client, progress=False)
    try:
        outcore.ingest_images(sys.argv[1], sys.argv[2], **ingest)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    print(len(outcore.ingest_images(sys.argv[1], sys.argv[2], resume=True, **ingest)), flush=True)
"""


def test_a_ctrl_c_as_the_cluster_ingest_waits_ends_it_and_resume_finishes_it(image_folder, tmp_path):
    """The tasks of an ingest on a cluster are waited for (``distributed.as_completed``) on a thread of their own: a
    Ctrl-C whose ``KeyboardInterrupt`` Python raises as ``as_completed`` has taken its condition's lock, on the main
    thread, left that lock taken, and the client's event loop, which takes it as each task ends, waited for ever, and
    so did the cancelling of the tasks after the interrupt. Now the interrupt lands in the main thread's wait: the
    tasks are cancelled, the call gets its ``KeyboardInterrupt``, and the same call with ``resume`` finishes the
    store (a fresh process with a cluster of its own)."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", INTERRUPTED_AS_A_WAKE_UP_TAKES_ITS_LOCK, str(image_folder),
                                 str(tmp_path / "c.zarr")], capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, result.stdout) == (0, "KeyboardInterrupt\n20\n"), result.stderr[-2000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.zarr", image_folder.name]  # no run left behind


def test_cluster_skip_and_raise(client, image_folder, tmp_path):
    (image_folder / "dog" / "bad.jpg").write_bytes(b"nope")
    ds = outcore.ingest_images(image_folder, tmp_path / "s.zarr", shape=(32, 32, 3), chunk_size=4,
                               on_error="skip", client=client, progress=False)
    assert len(ds) == 20 and ds.attrs.skipped["count"] == 1
    with pytest.raises(outcore.ImageError, match="dog/bad.jpg"):
        outcore.ingest_images(image_folder, tmp_path / "r.zarr", shape=(32, 32, 3), client=client, progress=False)
    assert not (tmp_path / "r.zarr").exists()


def test_cluster_from_arrays(client, tmp_path, rng):
    arrays = {"x": rng.normal(size=(500, 3)), "labels": rng.integers(0, 4, 500)}
    with on_local_threads():
        local = outcore.from_arrays(arrays, tmp_path / "l.zarr", chunk_size=32, progress=False)
    remote = outcore.from_arrays(arrays, tmp_path / "c.zarr", chunk_size=32, client=client, progress=False)
    _assert_same_store(local, remote)


def test_cluster_ingest_to_s3_uploads_from_the_workers(client, image_folder, tmp_path, monkeypatch):
    need("obstore")
    need("moto.server")
    from outcore.testing.s3 import S3Server

    monkeypatch.setenv("OUTCORE_STAGING_DIR", str(tmp_path / "staging"))
    with on_local_threads():
        local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", shape=(32, 32, 3), chunk_size=4,
                                      progress=False)
    before = _tasks_run_by_workers(client)
    with S3Server() as server:
        server.create_bucket("cluster")
        remote = outcore.ingest_images(image_folder, "s3://cluster/train.zarr", shape=(32, 32, 3), chunk_size=4,
                                       client=client, storage_options=server.options, progress=False)
        _assert_same_store(local, outcore.open_dataset("s3://cluster/train.zarr", storage_options=server.options,
                                                       cache_dir=False))
        assert len(remote) == len(local)
    assert _tasks_run_by_workers(client) > before  # the workers wrote and uploaded the shards
    assert not [p for p in (tmp_path / "staging").rglob("*") if p.is_file() and "/c/" in p.as_posix()]


def _tasks_run_by_workers(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.state.executed_count).values())


def test_ingest_uses_the_active_client_as_dask_does(client, tmp_path, rng):
    arrays = {"x": rng.normal(size=(500, 3))}
    before = _tasks_run_by_workers(client)
    outcore.from_arrays(arrays, tmp_path / "active.zarr", chunk_size=32, progress=False)  # client=None
    after = _tasks_run_by_workers(client)
    assert after > before
    with dask.config.set(scheduler="threads"):  # dask's way to say "not on the cluster"
        outcore.from_arrays(arrays, tmp_path / "threads.zarr", chunk_size=32, progress=False)
    assert _tasks_run_by_workers(client) == after


def test_cluster_ingest_of_encoded_images_equals_local(client, image_folder, tmp_path):
    options = {"shape": (32, 32, 3), "chunk_size": 4, "images": "both", "progress": False}
    with on_local_threads():
        local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", **options)
    remote = outcore.ingest_images(image_folder, tmp_path / "cluster.zarr", client=client, **options)
    _assert_same_store(local, remote)
    for name in ("images_encoded", "images_encoded_ranges"):
        np.testing.assert_array_equal(local.array(name)[:], remote.array(name)[:], err_msg=name)


def test_cluster_append_equals_local_append(client, image_folder, tmp_path):
    options = {"shape": (32, 32, 3), "chunk_size": 4, "images": "both", "progress": False}
    with on_local_threads():
        for name in ("local.zarr", "cluster.zarr"):
            outcore.ingest_images(image_folder, tmp_path / name, **options)
    write_image_folder(image_folder, 3, classes=("yak", "zebu"), size=(40, 40), seed=5)
    with on_local_threads():
        local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", append=True, **options)
    remote = outcore.ingest_images(image_folder, tmp_path / "cluster.zarr", client=client, append=True, **options)
    assert len(remote) == 26 and remote.classes == ["cat", "dog", "owl", "yak", "zebu"]
    _assert_same_store(local, remote)
    for name in ("images_encoded", "images_encoded_ranges"):
        np.testing.assert_array_equal(local.array(name)[:], remote.array(name)[:], err_msg=name)


@pytest.mark.parametrize("fields", [["images", "labels"], ["images_encoded", "labels", "path"]])
def test_cluster_iteration_equals_local_iteration(client, photos, fields):
    options = {"seed": 7, "buffer_chunks": 3, "transform": augment(fields[0]), "fields": fields}
    local, remote = photos.batches(10, **options), photos.batches(10, client=client, **options)
    for _ in range(2):  # two epochs, two orders
        _assert_same_batches(list(local), list(remote))
    shard = {"rank": 1, "world_size": 2, **options}
    _assert_same_batches(list(photos.batches(10, **shard)), list(photos.batches(10, client=client, **shard)))
    prefixes = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes))
    assert "outcore-span" in prefixes  # as the dashboard shows them


@pytest.mark.parametrize(("samples", "batch", "shard"), [(37, 3, {}), (37, 5, {"drop_last": True}),
                                                      (100, 6, {"rank": 1, "world_size": 2}), (9, 4, {}),
                                                      (37, 5, {"shuffle": False}), (37, 5, {"streams": 1})])
def test_lanes_make_the_local_batches_whatever_the_layout(client, tmp_path, monkeypatch, samples, batch, shard):
    # 2 worker threads: 2 lanes, each its 4 streams' part of every batch; a lane may have no part of a step;
    # with one stream (storage order, or streams=1), one lane, its spans on any worker. Lanes are for object
    # stores (test_lanes_ask_an_object_store_for_each_chunk_once_an_epoch): here, on a disk, as they are there
    _lanes_from_a_disk_too(monkeypatch)
    ds = outcore.from_arrays({"index": np.arange(samples), "x": np.arange(samples * 6.0).reshape(samples, 2, 3)},
                             tmp_path / "layout.zarr", chunk_size=4, progress=False)
    options = {"seed": 5, "buffer_chunks": 2, **shard}
    for epoch in range(2):
        local = ds.batches(batch, **options)
        local.set_epoch(epoch)
        remote = ds.batches(batch, client=client, **options)
        remote.set_epoch(epoch)
        _assert_same_batches(list(local), list(remote))


def test_lanes_read_each_chunk_once_an_epoch_and_whole_batches_from_a_disk_read_each_span_its_own(
        client, tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "SPAN_SAMPLES", 16)  # spans of one batch: a chunk's samples are in several
    ds = outcore.from_arrays({"index": np.arange(2048)}, tmp_path / "reads.zarr", chunk_size=32, progress=False)
    options = {"seed": 4, "buffer_chunks": 8}
    iterator = ds.batches(32, **options)
    once = sum(len(np.unique(iterator.plan(0, (lane, 2)).chunks)) for lane in range(2))  # a chunk per lane it feeds
    spans = sum(len(np.unique(iterator.plan(0).step(k)[1])) for k in range(len(iterator)))  # a span's own reads

    def reads() -> int:
        client.run(count_chunk_reads)
        _assert_same_batches(list(ds.batches(32, **options)), list(ds.batches(32, client=client, **options)))
        return sum(client.run(chunk_reads).values())

    assert spans > 3 * once
    # from a disk: one lane, spans of whole batches on either worker, each reading the chunks its batch draws
    # on but those the lane's previous span left, if it ran on the same worker
    assert once < reads() <= spans
    _lanes_from_a_disk_too(monkeypatch)
    got = reads()  # lanes, as an object store gets: each lane's spans on one worker, passing their chunks on
    assert once <= got <= 1.1 * once, (got, once)  # (a span Dask moved to the other worker reads its own)


def test_lanes_ask_an_object_store_for_each_chunk_once_an_epoch(client, tmp_path, monkeypatch):
    from outcore.testing.proxy import FaultProxy
    from outcore.testing.s3 import S3Server, upload

    monkeypatch.setattr(cluster, "SPAN_SAMPLES", 16)  # spans of one batch: a chunk's samples are in several
    values = np.random.default_rng(3).normal(size=(2048, 16, 16)).astype("f4")  # incompressible
    local = outcore.from_arrays({"x": values}, tmp_path / "local.zarr", chunk_size=32, progress=False)
    with S3Server() as server, FaultProxy(server.host, server.port) as proxy:
        server.create_bucket("lanes")
        stored = upload(local.location, "s3://lanes/x.zarr", server.options)
        remote = outcore.open_dataset("s3://lanes/x.zarr", storage_options={**server.options, "endpoint": proxy.url},
                                      cache_dir=False)  # every chunk read asks the store again
        _assert_same_batches(list(local.batches(32, seed=4)), list(remote.batches(32, seed=4, client=client)))
        assert proxy.traffic.bytes_sent <= 1.2 * stored, (proxy.traffic.bytes_sent, stored)  # each chunk once


def test_a_subset_on_the_cluster_is_the_subset_on_local_threads(client, photos):
    options = {"seed": 3, "indices": list(range(5, 120, 3)), "fields": ["images_encoded", "labels"]}
    local = list(photos.batches(8, **options))
    assert sum(len(b["labels"]) for b in local) == 39
    _assert_same_batches(local, list(photos.batches(8, client=client, **options)))


def test_a_mixture_on_the_cluster_is_the_mixture_on_local_threads(client, photos):
    mixture = outcore.mix({"a": photos, "b": photos}, weights={"a": 0.75, "b": 0.25})  # two draws of one store
    options = {"seed": 2, "fields": ["images_encoded", "labels"]}
    _assert_same_batches(list(mixture.batches(8, **options)), list(mixture.batches(8, client=client, **options)))


def test_cluster_workers_crop_while_decoding_as_local_threads_do(client, photos):
    field = "images_encoded"
    transform = transforms.Compose([transforms.RandomResizedCrop(20, field=field), transforms.RandomFlip(field=field)])
    options = {"seed": 5, "transform": transform, "fields": [field, "labels"]}
    local = list(photos.batches(10, **options))
    _assert_same_batches(local, list(photos.batches(10, client=client, **options)))
    assert local[0][field].shape == (10, 20, 20, 3)


def test_cluster_workers_leave_files_undecoded_with_the_boxes_local_threads_draw(client, photos):
    """``decode="later"`` on a cluster: the same files, boxes and mirrors as on local threads (the pictures
    then decoded elsewhere, `outcore.adapters.torch_decode`)."""
    field = "images_encoded"
    transform = transforms.Compose([transforms.RandomResizedCrop(20, field=field), transforms.RandomFlip(field=field)])
    options = {"seed": 5, "transform": transform, "fields": [field, "labels"], "decode": "later"}
    local = list(photos.batches(10, **options))
    _assert_same_batches(local, list(photos.batches(10, client=client, **options)))
    assert sorted(local[0]) == sorted([field, f"{field}_offsets", f"{field}_boxes", f"{field}_flips", f"{field}_sizes",
                                       "labels"])


def test_cluster_workers_move_masks_and_boxes_with_their_pictures_as_local_threads_do(client, tmp_path):
    rng = np.random.default_rng(0)
    corners = rng.uniform(0, 12, (60, 3, 2))
    boxes = outcore.Ragged.of([np.c_[c[: k], c[: k] + 10] for c, k in zip(corners, rng.integers(0, 4, 60), strict=True)],
                              np.float32, (4,))
    ds = outcore.from_arrays({"images": rng.integers(0, 256, (60, 24, 24, 3), dtype=np.uint8),
                              "masks": rng.integers(0, 5, (60, 24, 24), dtype=np.uint8), "boxes": boxes},
                             tmp_path / "s.zarr", chunk_size=8, progress=False)
    targets = transforms.Targets(label_maps=("masks",), boxes="boxes")
    transform = transforms.Compose([transforms.RandomCrop(20, targets=targets), transforms.RandomFlip(targets=targets),
                                    transforms.BrightnessContrast()])  # a step per piece: pieces cut and joined
    local = list(ds.batches(12, seed=2, transform=transform))
    _assert_same_batches(local, list(ds.batches(12, seed=2, transform=transform, client=client)))
    assert sum(len(batch["boxes_kept"]) for batch in local) > 0


def test_cluster_surveys_pictures_of_their_own_size_and_crops_them_as_local_threads_do(client, tmp_path):
    write_image_folder(tmp_path / "src", 12, classes=("a", "b"), size=(40, 56), kind="photos", seed=2)
    write_image_folder(tmp_path / "src", 12, classes=("c",), size=(72, 48), kind="photos", seed=3)
    options = {"shape": None, "images": "encoded", "max_side": 64, "chunk_size": 4, "progress": False}
    with on_local_threads():
        local = outcore.ingest_images(tmp_path / "src", tmp_path / "local.zarr", **options)
    remote = outcore.ingest_images(tmp_path / "src", tmp_path / "cluster.zarr", client=client, **options)
    for name in ("images", "images_ranges", "images_shapes", "labels", "path"):
        np.testing.assert_array_equal(local.array(name)[:], remote.array(name)[:], err_msg=name)
    assert {tuple(shape) for shape in remote.array("images_shapes")[:]} == {(40, 56, 3), (64, 43, 3)}
    transform = transforms.Compose([transforms.RandomResizedCrop(24), transforms.RandomFlip()])
    batches = {"seed": 1, "transform": transform, "fields": ["images", "labels"]}
    _assert_same_batches(list(remote.batches(8, **batches)), list(remote.batches(8, client=client, **batches)))


def test_cluster_ingests_and_cuts_maps_of_pictures_kept_at_their_own_size_as_local_threads_do(client, tmp_path):
    rng = np.random.default_rng(4)
    rows = []
    for i in range(14):
        height, width = int(rng.integers(24, 48)), int(rng.integers(24, 48))
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 6, (height, width), dtype=np.uint8), mode="L").save(tmp_path / f"{i}-m.png")
        rows.append({"path": f"{i}.png", "mask": f"{i}-m.png"})
    options = {"root": tmp_path, "mask_columns": ["mask"], "shape": None, "images": "encoded", "chunk_size": 4,
               "progress": False}
    with on_local_threads():
        local = outcore.ingest_dataframe(pd.DataFrame(rows), tmp_path / "local.zarr", **options)
    remote = outcore.ingest_dataframe(pd.DataFrame(rows), tmp_path / "cluster.zarr", client=client, **options)
    for name in ("mask", "mask_ranges", "mask_shapes", "images_shapes"):
        np.testing.assert_array_equal(local.array(name)[:], remote.array(name)[:], err_msg=name)
    targets = transforms.Targets(label_maps=("mask",), fill=9)
    transform = transforms.Compose([transforms.RandomCrop(28, padding=4, targets=targets),
                                    transforms.RandomFlip(targets=targets), transforms.BrightnessContrast()])
    batches = {"seed": 1, "transform": transform, "fields": ["images", "mask"]}
    local_batches = list(remote.batches(6, **batches))
    _assert_same_batches(local_batches, list(remote.batches(6, client=client, **batches)))
    assert local_batches[0]["mask"].shape == (6, 28, 28) and any((b["mask"] == 9).any() for b in local_batches)


def test_killed_worker_mid_epoch_still_gives_every_sample_once_in_order(client, photos):
    options = {"seed": 3, "buffer_chunks": 4, "transform": SlowAugment(0.03), "fields": ["images_encoded",
                                                                                           "source_index"]}
    expected = list(photos.batches(8, **options))
    got = []
    for i, batch in enumerate(photos.batches(8, client=client, **options)):
        got.append(batch)
        if i == 2:
            pids = client.run(os.getpid)
            os.kill(pids[min(pids)], signal.SIGKILL)
    _assert_same_batches(expected, got)
    order = np.concatenate([b["source_index"] for b in got])
    assert sorted(order.tolist()) == list(range(len(photos)))
    def restarted() -> bool:  # the nanny restarts the killed worker
        now = _worker_pids(client)
        return now is not None and len(now) == 2 and pids[min(pids)] not in now

    assert _soon(restarted, 60)


def _worker_pids(client) -> set[int] | None:
    """The workers' process ids, or None while the scheduler still counts a worker that died."""
    from distributed.comm import CommClosedError

    try:
        return set(client.run(os.getpid).values())
    except (CommClosedError, OSError):
        return None


def _spans_of_epoch(client, epoch: int) -> list[str]:
    """This client's span tasks of ``epoch``: keys ``outcore-span-<run>-e<epoch>-<first step>``."""
    return [key for key in list(client.futures) if str(key).startswith("outcore-span-") and f"-e{epoch}-" in str(key)]


def _soon(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_from_its_second_epoch_on_a_cluster_run_starts_the_next_epoch_as_it_drains(client, photos):
    options = {"seed": 4, "buffer_chunks": 2, "fields": ["images_encoded", "labels"]}
    local = photos.batches(16, **options)
    expected = [list(local) for _ in range(3)]
    it = photos.batches(16, client=client, **options)
    for epoch in range(3):
        got = list(it)
        _assert_same_batches(expected[epoch], got)
        if epoch == 0:  # a first pass may be the only one (a prediction): it starts nothing
            assert not _spans_of_epoch(client, 1)
        else:  # submitted while this epoch drained, made while its last batches were consumed
            assert _soon(lambda epoch=epoch: _spans_of_epoch(client, epoch + 1))
    it.set_epoch(7)  # not the epoch started ahead: that run is dropped, epoch 7 made from its start
    local.set_epoch(7)
    _assert_same_batches(list(local), list(it))
    assert _soon(lambda: not _spans_of_epoch(client, 3))
    it.close()  # and the one started for epoch 8 goes with the iterator
    assert _soon(lambda: not _spans_of_epoch(client, 8))


@pytest.mark.portable
def test_lost_cluster_raises_and_the_state_resumes_without_it(photos):
    options = {"seed": 5, "transform": SlowAugment(0.05), "fields": ["images_encoded", "labels"]}
    expected = list(photos.batches(8, **options))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        it = photos.batches(8, client=client, **options)
        got = []
        with pytest.raises(ClusterError, match=r"lost the Dask cluster.*state_dict\(\)"):
            for batch in it:
                got.append(batch)
                if len(got) == 3:
                    cluster.close()
    state = it.state_dict()
    assert state["batches_done"] == len(got) >= 3
    resumed = photos.batches(8, **options)
    resumed.load_state_dict(state)
    _assert_same_batches(expected, got + list(resumed))


def test_workers_that_cannot_see_the_store_say_so(client, photos, tmp_path):
    moved = outcore.open_dataset(photos.location)
    it = moved.batches(8, client=client)
    moved.location = str(tmp_path / "elsewhere.zarr")  # what a worker without the shared filesystem sees
    moved.opener = partial(outcore.open_dataset, moved.location)
    with pytest.raises(NotAStoreError, match="Dask worker .* cannot open the store.*every worker sees it"):
        next(iter(it))


def test_workers_of_another_outcore_version_make_no_batches_and_say_so(client, photos, monkeypatch):
    """Another version may decode other pixels or lay batches out otherwise in shared memory: the consumer's
    version goes with every span, and a worker of another one refuses it, naming both."""
    monkeypatch.setattr(cluster, "VERSION", "0.0.1")  # this process's (the consumer's) version, not the workers'
    with pytest.raises(ClusterError, match=r"Dask worker .* runs outcore \S+ and the process reading the batches "
                                           r"outcore 0\.0\.1.*Install the same outcore"):
        next(iter(photos.batches(8, client=client)))


ADAPTER_OPTIONS = {"shuffle": True, "seed": 2, "transform": augment("images_encoded")}  # x=, y= choose the fields


def test_torch_takes_the_client(client, photos):
    torch = need("torch")
    fields = ["images_encoded", "labels"]
    expected = list(photos.batches(16, fields=fields, **ADAPTER_OPTIONS))
    loader = photos.torch(16, client=client, fields=fields, **ADAPTER_OPTIONS)
    got = list(loader)
    assert [b["images_encoded"].dtype for b in got] == [torch.uint8] * len(expected)
    _assert_same_batches(expected, [{k: v.numpy() for k, v in b.items()} for b in got])
    local = photos.batches(16, fields=fields, **ADAPTER_OPTIONS)
    list(local)
    for _ in range(2):  # the next epochs: the third's run started while the second drained
        _assert_same_batches(list(local), [{k: v.numpy() for k, v in b.items()} for b in loader])
    assert _soon(lambda: _spans_of_epoch(client, 3))
    del loader
    gc.collect()
    assert _soon(lambda: not _spans_of_epoch(client, 3))  # a loader dropped takes that run with it
    with pytest.raises(ValueError, match="num_workers=0"):
        photos.torch(16, client=client, num_workers=2)


def test_keras_and_tf_take_the_client(client, photos):
    import keras

    options = ADAPTER_OPTIONS
    expected = list(photos.batches(16, fields=["images_encoded", "labels"], **options))
    tf_batches = list(photos.tf(16, x="images_encoded", y="labels", client=client, **options).as_numpy_iterator())
    _assert_same_batches(expected, [{"images_encoded": x, "labels": y} for x, y in tf_batches])

    sequence = photos.keras(16, x="images_encoded", y="labels", client=client, **options)
    for i in (0, 1, 3, 2, 4, 0):  # in order, a skip ahead, a step back: all served right
        x, y = sequence[i]
        np.testing.assert_array_equal(x, expected[i]["images_encoded"])
        np.testing.assert_array_equal(y, expected[i]["labels"])
    model = keras.Sequential([keras.Input((24, 24, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    history = model.fit(sequence, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and sequence.epoch == 2
    assert _soon(lambda: _spans_of_epoch(client, 2))  # started while the second epoch drained
    sequence.iterator.close()
    assert _soon(lambda: not _spans_of_epoch(client, 2))


def test_cli_ingest_on_a_scheduler_address(client, image_folder, tmp_path, capsys):
    store = tmp_path / "cli.zarr"
    assert main(["ingest", str(image_folder), str(store), "--shape", "32x32x3", "--images", "encoded",
                 "--chunk-size", "4", "--scheduler", client.scheduler.address, "--no-progress"]) == 0
    assert "encoded images" in capsys.readouterr().out
    with on_local_threads():
        local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", shape=(32, 32, 3), images="encoded",
                                      chunk_size=4, progress=False)
    _assert_same_store(local, outcore.open_dataset(store))


class PauseUntil:
    """A transform that holds each piece it is given until file ``path`` is there (``seconds`` at most): a
    batch task that runs on after its iteration is closed, for as long as the test needs it to."""

    def __init__(self, path: Path, seconds: float) -> None:
        self.path, self.seconds = path, seconds

    def __call__(self, batch, rng):
        deadline = time.monotonic() + self.seconds
        while not self.path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return batch


def test_closing_a_cluster_iteration_never_waits_on_the_cluster(client, photos, tmp_path):
    """The gathering thread waited on a batch task's result however long it took: close() (and the
    consumer waiting on the run) waited with it."""
    import threading

    released = tmp_path / "released"
    it = photos.batches(8, fields=["labels"], transform=PauseUntil(released, 10), client=client, prefetch=1)
    outcome = {}

    def consume():
        try:
            next(iter(it))
        except outcore.IterationClosedError:
            outcome["closed at"] = time.perf_counter()

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        time.sleep(0.5)
        began = time.perf_counter()
        it.close()
        closed = time.perf_counter() - began
        consumer.join(timeout=10)
        assert closed < 2 and outcome["closed at"] - began < 2  # the batch tasks are still held
    finally:
        released.touch()  # the tasks under way end (the next tests share the cluster's two workers)


class CountedPause:
    """A transform that counts the batches it is given (a character each in file ``path``) and pauses (a
    batch of samples from several chunks is given in pieces, one per chunk)."""

    def __init__(self, path: Path, seconds: float) -> None:
        self.path, self.seconds = path, seconds

    def __call__(self, batch, rng):
        with open(self.path, "a") as made:
            made.write("x")
        time.sleep(self.seconds)
        return batch


def test_workers_stop_the_spans_of_a_closed_run_after_the_batch_under_way(client, photos, tmp_path):
    """A running Dask task cannot be cancelled: the spans of a closed run went on making batches nobody
    takes, on workers other runs and consumers share. A worker that sees the run's folder in shared memory
    stops once the consumer removes it."""
    made = tmp_path / "made"
    it = photos.batches(2, fields=["labels"], shuffle=False, transform=CountedPause(made, 0.1), client=client,
                        prefetch=1)  # 60 batches of one chunk each in 4 spans of 15, all submitted
    next(iter(it))  # once the first two spans are made
    deadline = time.monotonic() + 60
    while len(made.read_text()) <= 30 and time.monotonic() < deadline:  # the last two under way (a slow
        time.sleep(0.05)  # machine's workers start them later: wait for it, not a fixed time)
    time.sleep(0.5)
    at_close = len(made.read_text())
    it.close()
    time.sleep(2.5)  # the last two would be made 1.5 s after they started
    made_in_all = len(made.read_text())
    assert 30 < made_in_all <= 30 + 2 * 8, (at_close, made_in_all)  # of the last two's 30 batches, each made up to 8


def test_a_run_whose_folder_in_shared_memory_is_removed_under_it_says_so(client, photos, tmp_path):
    """The workers stop its spans as they would a closed run's: the consumer, still reading, names the cause."""
    import glob
    import shutil

    ours = f"/dev/shm/outcore-batches-{os.getpid()}-*"
    before = set(glob.glob(ours))
    it = photos.batches(2, fields=["labels"], shuffle=False, transform=CountedPause(tmp_path / "made", 0.1),
                        client=client, prefetch=1)
    batches = iter(it)
    next(batches)  # the first two spans of 15 made, the last two under way
    (folder,) = [name for name in set(glob.glob(ours)) - before if "spare" not in name]
    shutil.rmtree(folder)
    with pytest.raises(ClusterError, match=r"shared memory is gone \(a worker stopped span outcore-span-\S+ of "
                                           r"the run, its folder gone\): something removed files of"):
        list(batches)
    it.close()


@pytest.mark.portable
def test_two_dask_worker_processes_with_disks_of_their_own_ingest_and_read_one_store(image_folder, tmp_path,
                                                                                      monkeypatch):
    """A stand-in for two nodes: `dask scheduler` and two `dask worker` processes, each with scratch, staging
    and node-cache folders of its own ($OUTCORE_CACHE_DIR, $OUTCORE_STAGING_DIR) and outcore's Dask settings
    in its environment (`outcore.worker_environment`), ingest into an S3 API and read the store back: the
    batches are a local store's, and each node caches in its own folder."""
    need("obstore")
    need("moto.server")
    from outcore.testing.s3 import S3Server

    with on_local_threads():
        local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", shape=(32, 32, 3), chunk_size=2,
                                      progress=False)
    address_file = tmp_path / "scheduler.json"
    started = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                 "--port", "0", "--no-dashboard", "--scheduler-file", str(address_file)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for node in ("a", "b"):
            folders = {"OUTCORE_CACHE_DIR": tmp_path / node / "cache", "OUTCORE_STAGING_DIR": tmp_path / node / "staging"}
            started.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(address_file),
                 "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard", "--name", node,
                 "--local-directory", str(tmp_path / node / "scratch")],
                env={**os.environ, **outcore.worker_environment(), **{k: str(v) for k, v in folders.items()}},
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not address_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        monkeypatch.setenv("OUTCORE_CACHE_DIR", str(tmp_path / "trainer" / "cache"))  # the training node's
        with Client(scheduler_file=str(address_file), timeout=60) as client, S3Server() as server:
            client.wait_for_workers(2, timeout=60)
            server.create_bucket("nodes")
            outcore.ingest_images(image_folder, "s3://nodes/train.zarr", shape=(32, 32, 3), chunk_size=2,
                                  client=client, storage_options=server.options, progress=False)
            remote = outcore.open_dataset("s3://nodes/train.zarr", storage_options=server.options)
            _assert_same_batches(list(local.batches(4, seed=3)), list(remote.batches(4, seed=3, client=client)))
            ran = client.run(lambda dask_worker: (dask_worker.name, dask_worker.state.executed_count))
            assert list(client.run(_runs_with_outcores_settings).values()) == [True, True]  # from their environment
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(timeout=60)
    assert sorted(name for name, count in ran.values() if count) == ["a", "b"]  # both nodes worked
    for node in ("a", "b"):  # each read through its own cache
        assert [p for p in (tmp_path / node / "cache").rglob("*") if p.is_file()], node
    assert not [p for p in tmp_path.rglob("staging/**/c/*") if p.is_file()]  # shards uploaded, none left


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """96 frames of 64x64x3 (batches of 32 hold 384 KiB of them: large enough for shared memory)."""
    rng = np.random.default_rng(4)
    arrays = {"frames": rng.integers(0, 255, (96, 64, 64, 3), dtype=np.uint8), "index": np.arange(96)}
    return outcore.from_arrays(arrays, tmp_path_factory.mktemp("frames") / "frames.zarr", chunk_size=8,
                               progress=False)


def _our_mailboxes(spare: bool = False) -> list[Path]:
    """This process's mailbox folders in /dev/shm (or its folder of spare files)."""
    from outcore.iterate.shared import PREFIX, SHARED_ROOT, SPARE

    return [p for p in SHARED_ROOT.glob(f"{PREFIX}{os.getpid()}-*") if (SPARE in p.name) == spare]


def _double(batch, rng):
    return {**batch, "frames": batch["frames"].astype(np.float32) * 2}


@pytest.mark.parametrize("transform", [None, _double])
def test_cluster_batches_arrive_through_shared_memory_and_equal_local_ones_over_sockets_too(
        client, frames, monkeypatch, transform):
    options = {"seed": 2, "buffer_chunks": 3, "transform": transform}
    local = list(frames.batches(32, **options))
    shared = list(frames.batches(32, client=client, **options))
    _assert_same_batches(local, shared)
    assert all(is_mapped(batch["frames"]) for batch in shared)  # made by the workers straight into /dev/shm
    assert not _our_mailboxes()  # the run's folder went with it
    for _ in frames.batches(32, client=client, **options):
        pass  # each batch dropped as the next comes: its file is free for another, and for the next epoch
    assert [p for folder in _our_mailboxes(spare=True) for p in folder.iterdir() if p.name.startswith("free-")]
    monkeypatch.setenv("OUTCORE_SHARED_MEMORY", "0")
    sockets = list(frames.batches(32, client=client, **options))
    _assert_same_batches(local, sockets)
    assert not any(is_mapped(batch["frames"]) for batch in sockets)


def test_batches_over_sockets_come_straight_from_the_workers_the_consumer_reaches(client, frames, monkeypatch):
    """Without shared memory a span's batches crossed the scheduler on their way from its worker to the
    consumer: from workers the consumer reaches (on its machine, or taking a connection) they now come
    straight (2-2.5x the rate), from others through the scheduler, and as the client says where it was
    told (``Client(direct_to_workers=...)``)."""
    monkeypatch.setenv("OUTCORE_SHARED_MEMORY", "0")
    scheduler, relayed = client.cluster.scheduler, []
    gather = scheduler.handlers["gather"]

    def relaying(keys, serializers=None):
        relayed.append(keys)
        return gather(keys=keys, serializers=serializers)

    def through_the_scheduler() -> bool:
        relayed.clear()
        batches = list(frames.batches(32, seed=2, client=client))
        _assert_same_batches(straight, batches)
        return bool(relayed)

    monkeypatch.setitem(scheduler.handlers, "gather", relaying)
    straight = list(frames.batches(32, seed=2))
    assert not through_the_scheduler()  # workers on this machine
    monkeypatch.setattr(client, "direct_to_workers", False)
    assert through_the_scheduler()  # told so
    monkeypatch.setattr(client, "direct_to_workers", None)
    monkeypatch.setattr(direct, "on_this_machine", lambda address: False)  # as if elsewhere: each one tried
    assert not through_the_scheduler()
    monkeypatch.setattr(direct, "reachable", lambda address: False)
    assert through_the_scheduler()


def test_a_worker_address_is_reachable_where_it_takes_a_connection(monkeypatch):
    """Workers elsewhere: one connection tried per address, answers kept (`outcore.iterate.direct`)."""
    import socket
    from types import SimpleNamespace

    monkeypatch.setattr(direct, "_local_hosts", lambda: frozenset())  # 127.0.0.1 as if another machine's
    direct.reachable.cache_clear()
    with socket.create_server(("127.0.0.1", 0)) as listening, socket.create_server(("127.0.0.1", 0)) as closed:
        open_port, closed_port = listening.getsockname()[1], closed.getsockname()[1]
        closed.close()  # its port now refuses connections
        told = SimpleNamespace(direct_to_workers=None)
        assert direct.straight_from_workers(told, [f"tcp://127.0.0.1:{open_port}"])
        assert not direct.straight_from_workers(told, [f"tcp://127.0.0.1:{open_port}", f"tcp://127.0.0.1:{closed_port}"])
        assert direct.reachable.cache_info().misses == 2  # the open address tried once
        assert not direct.straight_from_workers(told, [])
    direct.reachable.cache_clear()


def _recording(original, inodes: list[int]):
    """`mappings.map_descriptor` that records the inode of each file it maps in ``inodes``."""
    def map_descriptor(descriptor, *args, **kwargs):
        mapped = original(descriptor, *args, **kwargs)
        inodes.append(os.fstat(descriptor).st_ino)
        return mapped

    return map_descriptor


def _count_mappings() -> None:
    """In a worker: record the inode of every file it maps from now on (`_mapped_inodes` says them)."""
    from outcore.iterate import mappings

    mappings.mapped_inodes, mappings.original_map_descriptor = [], mappings.map_descriptor
    mappings.map_descriptor = _recording(mappings.map_descriptor, mappings.mapped_inodes)


def _mapped_inodes() -> list[int]:
    from outcore.iterate import mappings

    mappings.map_descriptor = mappings.original_map_descriptor
    return mappings.mapped_inodes


def _kept_mappings() -> int:
    from outcore.iterate.mappings import kept_mappings

    return len(kept_mappings.kept)


def test_cluster_workers_and_the_consumer_map_each_shared_file_once_as_it_comes_back(
        client, tmp_path, monkeypatch):
    """Mapping a batch's file costs its page tables (`outcore.iterate.mappings`): over three epochs of 60
    batches in spans of 2, each worker and the consumer map each recycled file once (the first epoch's
    free files come back in the third epoch's folder, through the consumer's spare folder), and the batches
    are the local ones; once the files are removed, the workers let go of their mappings without another span."""
    from outcore.iterate.shared import SHARED_ROOT, _spare

    rng = np.random.default_rng(5)
    arrays = {"frames": rng.integers(0, 255, (1920, 64, 64, 3), dtype=np.uint8), "index": np.arange(1920)}
    with on_local_threads():
        ds = outcore.from_arrays(arrays, tmp_path / "long.zarr", chunk_size=32, progress=False)
    monkeypatch.setattr(cluster, "SPAN_SAMPLES", 64)
    consumer: list[int] = []
    monkeypatch.setattr(mappings, "map_descriptor", _recording(mappings.map_descriptor, consumer))
    client.run(_count_mappings)
    it = ds.batches(32, seed=3, client=client)
    try:
        got = [(batch["index"].copy(), batch["frames"].copy()) for _ in range(3) for batch in it]
    finally:
        it.close()
        workers = client.run(_mapped_inodes)
    local = ds.batches(32, seed=3)
    expected = [(batch["index"], batch["frames"]) for _ in range(3) for batch in local]
    for (index, frames), (expected_index, expected_frames) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(index, expected_index)
        np.testing.assert_array_equal(frames, expected_frames)
    assert len(got) == 180 and len(consumer) == len(set(consumer)) < 30
    assert all(len(inodes) == len(set(inodes)) for inodes in workers.values()), workers
    assert any(set(inodes) & set(consumer) for inodes in workers.values())  # the same files, on both sides
    # the runs closed and their folders went; the free files wait in the consumer's spare folder for its
    # next run. Once that goes too (as the consumer ends), idle workers let go of their mappings (the memory)
    _pid, spare = _spare.pop(SHARED_ROOT)
    spare.close()
    assert _soon(lambda: not any(client.run(_kept_mappings).values()), seconds=10 * mappings.PRUNE_SECONDS)


RANK = """
import sys
import numpy as np
import outcore
from distributed import Client
address, location, rank, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with Client(address, timeout=60) as client:
    batches = outcore.open_dataset(location).batches(8, seed=6, rank=rank, world_size=2, client=client)
    np.save(out, np.stack([batch["index"] for batch in batches]))
"""


def test_two_consumer_processes_share_one_cluster_each_with_its_share_of_the_epoch(client, frames, tmp_path):
    address = client.scheduler.address
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, address, frames.location, str(rank),
                               str(tmp_path / f"rank{rank}.npy")]) for rank in range(2)]
    for process in ranks:
        assert process.wait(timeout=240) == 0
    got = [np.load(tmp_path / f"rank{rank}.npy") for rank in range(2)]
    for rank in range(2):
        expected = [batch["index"] for batch in frames.batches(8, seed=6, rank=rank, world_size=2)]
        np.testing.assert_array_equal(got[rank], np.stack(expected))
    assert sorted(np.concatenate([g.ravel() for g in got]).tolist()) == list(range(96))  # each sample once
