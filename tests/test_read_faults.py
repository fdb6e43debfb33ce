"""Disks that fail while a store is read, made by a fault-injecting file layer (`outcore.testing.faults`,
loaded with LD_PRELOAD into a reading process): transient failures (EIO, EAGAIN, a stale NFS handle on
open or read, EINTR) are tried again and the epoch is exact; short reads are continued; a failure that
stays is one `StorageError` naming the store, field, chunk and file, the system's reason and what to do,
after four tries (0.62 s of pauses); `verify` lists it. Never a hang, never a wrong sample."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import outcore
from outcore.testing.faults import fault_environment, fault_library

READ = """
import json, sys, time
import numpy as np
import outcore

started = time.monotonic()
try:
    ds = outcore.open_dataset(sys.argv[1])
    ids = np.concatenate([batch["id"] for batch in ds.batches(100, seed=0)]).tolist()
    x = ds["x"].compute()
    print(json.dumps({"ids": ids, "x_ok": bool((x[:, 0] == ds["id"].compute()).all()),
                      "seconds": time.monotonic() - started}))
except outcore.OutcoreError as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error), "seconds": time.monotonic() - started}))
"""
N = 4000


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    built = fault_library(tmp_path_factory.mktemp("faults"))
    if built is None or not sys.platform.startswith("linux"):
        pytest.skip("the fault layer needs Linux and a C compiler (cc), which this machine lacks")
    return built


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    ids = np.arange(N)
    return outcore.from_arrays({"x": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "id": ids},
                               tmp_path_factory.mktemp("faulty") / "s.zarr", chunk_size=100, progress=False).location


def read_with_faults(library, store, match, error=errno.EIO, **faults) -> dict:
    env = {**os.environ, **fault_environment(library, f"s.zarr/{match}", error, **faults)}
    result = subprocess.run([sys.executable, "-c", READ, store], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("error", "on"), [(errno.EIO, "read"), (errno.EAGAIN, "read"), (errno.ESTALE, "read"),
                                           (errno.EINTR, "read"), (errno.ESTALE, "open"), (errno.EIO, "open")])
def test_transient_failures_are_tried_again_and_the_epoch_is_exact(library, store, error, on):
    got = read_with_faults(library, store, "id/c/", error, on=on, times=3)  # three failures, then reads succeed
    assert "error" not in got, got
    assert sorted(got["ids"]) == list(range(N)) and got["x_ok"]


def test_short_reads_are_continued(library, store):
    got = read_with_faults(library, store, "", short=True)  # every read of every file returns half
    assert sorted(got["ids"]) == list(range(N)) and got["x_ok"]


@pytest.mark.parametrize(("error", "reason", "advice"), [
    (errno.EIO, r"Input/output error \(EIO\) 4 times", "check the disk"),
    (errno.ESTALE, r"Stale file handle \(ESTALE\) 4 times", "check the mount"),
    (errno.EAGAIN, r"Resource temporarily unavailable \(EAGAIN\) 4 times", "check the file system"),
    (errno.EACCES, r"Permission denied \(EACCES\);", "check the file system"),
])
def test_a_failure_that_stays_is_named_after_four_tries(library, store, error, reason, advice):
    got = read_with_faults(library, store, "x/c/5", error)  # every read of one shard file fails
    assert got["error"] == "StorageError", got
    assert re.search(rf"{store}: field 'x', chunk 2\d \(samples \d+\.\.\d+, in file x/c/5/0\) cannot be read: "
                     rf"{reason}.*{advice}", got["message"]), got["message"]
    # four tries, 0.62 s of pauses, after the epoch's reads before that chunk: 1-2 s alone, up to 5.5 s seen in CI
    # beside two other test runs on two cores; a hang would be minutes (the 120 s of a remote read's deadline)
    assert got["seconds"] < 20


def test_verify_lists_a_shard_the_disk_cannot_read(library, store):
    code = "import sys, outcore; print(outcore.verify(sys.argv[1], progress=False))"
    env = {**os.environ, **fault_environment(library, "s.zarr/x/c/2", errno.EIO)}
    result = subprocess.run([sys.executable, "-c", code, store], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "field 'x', chunk 8 (samples 800..899, in file x/c/2/0) cannot be read: Input/output error" in result.stdout



def _damaged_store(tmp_path, chunks):
    ids = np.arange(640)
    ds = outcore.from_arrays({"x": np.repeat(ids[:, None], 8, axis=1).astype(np.float32), "id": ids},
                             tmp_path / "d.zarr", chunk_size=32, progress=False)
    for chunk in chunks:
        outcore.testing.corrupt_chunk(ds.location, "x", chunk)
    held = {chunk: set(ds.array("id")[chunk * 32 : (chunk + 1) * 32].tolist()) for chunk in chunks}
    return outcore.open_dataset(ds.location), held


def test_a_damaged_chunk_stops_the_epoch_by_default(tmp_path):
    ds, _ = _damaged_store(tmp_path, [5])
    with pytest.raises(outcore.CorruptChunkError, match=r"field 'x', chunk 5 "):
        list(ds.batches(50, seed=1))


def _jitter(batch, rng):
    """A transform drawing from its generator (a batch's pieces each get theirs)."""
    return {**batch, "x": batch["x"] + rng.uniform(0, 0.1, batch["x"].shape).astype(np.float32)}


@pytest.mark.parametrize("transform", [None, _jitter])
def test_skip_damaged_leaves_out_each_damaged_chunk_named_and_every_other_sample_once(tmp_path, transform):
    ds, held = _damaged_store(tmp_path, [5, 12])
    iterator = ds.batches(50, seed=1, skip_damaged=2, transform=transform)
    with pytest.warns(outcore.OutcoreWarning) as caught:
        ids = [batch["id"].tolist() for batch in iterator]
    named = sorted(str(warning.message) for warning in caught)
    assert len(named) == 2 and all("of skip_damaged=2" in message for message in named)
    assert {int(message.split("left out chunk ")[1].split()[0]) for message in named} == {5, 12}
    seen = [i for batch in ids for i in batch]
    assert sorted(seen) == sorted(set(range(640)) - held[5] - held[12])  # the others, each exactly once
    assert len(ids) == len(iterator) and iterator.stats()["damaged_chunks"] == 2
    with pytest.warns(outcore.OutcoreWarning, match="left out chunk"):  # the next epoch finds them again
        assert sorted(i for batch in iterator for i in batch["id"].tolist()) == sorted(seen)


def test_more_damaged_chunks_than_allowed_is_the_error(tmp_path):
    ds, _ = _damaged_store(tmp_path, [3, 9])
    with pytest.warns(outcore.OutcoreWarning, match="left out chunk"), \
            pytest.raises(outcore.CorruptChunkError, match="chunk (3|9) "):
        list(ds.batches(50, seed=1, skip_damaged=1))
    with pytest.raises(outcore.OptionError, match="skip_damaged=-1 must be a number of chunks"):
        ds.batches(50, skip_damaged=-1)
