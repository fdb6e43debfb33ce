"""Ingest on a real distributed.LocalCluster (worker processes, loopback only)."""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster

import outcore


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def _assert_same_store(a, b):
    assert a.fields == b.fields and len(a) == len(b) and a.chunk_size == b.chunk_size and a.classes == b.classes
    for name in a.fields:
        np.testing.assert_array_equal(a[name].compute(), b[name].compute(), err_msg=name)


def test_cluster_ingest_equals_local_ingest(client, image_folder, tmp_path):
    local = outcore.ingest_images(image_folder, tmp_path / "local.zarr", shape=(32, 32, 3), chunk_size=4,
                                  progress=False)
    remote = outcore.ingest_images(image_folder, tmp_path / "cluster.zarr", shape=(32, 32, 3), chunk_size=4,
                                   client=client, progress=False)
    _assert_same_store(local, remote)
    ran_on = client.run(lambda dask_worker: dask_worker.state.executed_count)
    assert len(ran_on) == 2 and all(count > 0 for count in ran_on.values())  # both workers did work


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
    local = outcore.from_arrays(arrays, tmp_path / "l.zarr", chunk_size=32, progress=False)
    remote = outcore.from_arrays(arrays, tmp_path / "c.zarr", chunk_size=32, client=client, progress=False)
    _assert_same_store(local, remote)
