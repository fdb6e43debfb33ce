"""``outcore bench``'s advice: the device read cold, the page cache's room, pixels or encoded pictures, and threads
or loader processes."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.cgroups import throttled
from support.optional import need

import outcore
from outcore.cli import main
from outcore.cli.advice import Advice, advise
from outcore.cli.loaders import Loaders, measure_loaders
from outcore.errors import OutcoreWarning
from outcore.imaging.synthetic import write_image_folder
from outcore.ingest import choice
from outcore.measure import gil_free_clock
from outcore.storage.device import SMALL_READ, DeviceRates
from outcore.storage.epochs import Kind
from outcore.storage.page_cache import Memory

MiB = 2**20


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("advice") / "photos"
    write_image_folder(root, 96, classes=("a", "b"), size=(48, 48), kind="photos", seed=0)
    return root


@pytest.fixture(scope="module")
def pixels(photos) -> outcore.Dataset:
    return outcore.ingest_images(photos, photos.parent / "pixels.zarr", shape=(48, 48, 3), progress=False)


def kind(name: str, nbytes: float, cpu: float, chunk: int = 128) -> Kind:
    return Kind(name, "this store", nbytes, {int(nbytes * chunk): 1 / chunk, SMALL_READ: 1 / chunk}, cpu)


def test_a_store_that_fits_in_memory_is_read_at_the_cores_rate_and_the_faster_decoder_wins():
    pixels, encoded = kind("pixels", 45_000, 20_000), kind("encoded", 5_000, 12_000)
    device = DeviceRates(200e6, {45_000 * 128: 34.0, 5_000 * 128: 600.0, SMALL_READ: 3000.0}, 2)
    advice = Advice(10_000, Memory(8 * 2**30, None), 2, device, (pixels, encoded))
    assert not advice.from_device(pixels)
    assert (advice.choice.kind, advice.choice.rate, advice.choice.limit) == (pixels, 20_000, "cores")
    assert advice.changes() == ["encoded with 4 cores or more (it decodes 6,000 samples/s per core)"]


def test_a_store_bigger_than_memory_is_read_at_the_device_s_rate_and_encoded_pictures_win():
    pixels, encoded = kind("pixels", 45_000, 20_000), kind("encoded", 5_000, 12_000)
    device = DeviceRates(200e6, {45_000 * 128: 34.0, 5_000 * 128: 300.0, SMALL_READ: 3000.0}, 2)
    advice = Advice(120_000, Memory(2**30, 2**30), 2, device, (pixels, encoded))
    assert advice.from_device(pixels) and advice.from_device(encoded) is False
    prediction = advice.predict(pixels)
    assert prediction.limit == "device" and 4_000 < prediction.rate < 4_400  # 200 MB/s over 45 kB a sample
    assert advice.choice.kind is encoded
    change = advice.changes()[0]
    assert change.startswith("pixels with a device reading over 540 MB/s, or 5.6 GiB of memory")
    assert "choose: encoded (2.91x pixels; limited by the cores)" in str(advice)


def test_bench_measures_the_store_and_a_converted_sample_of_the_other_kind(pixels, capsys):
    assert main(["bench", pixels.location, "--batch-size", "16", "--repeats", "1", "--processes", "0"]) == 0
    out = capsys.readouterr().out
    assert "device, read cold: " in out and " reads/s of 4 KiB" in out
    rows = {line[:13].strip(): line[13:] for line in out.splitlines() if line.startswith(("pixels", "encoded"))}
    assert rows["pixels"].lstrip().startswith("this store")
    assert rows["pixels, zstd"].lstrip().startswith("192 samples recompressed")
    assert rows["encoded"].lstrip().startswith("192 samples as quality-90 JPEGs")
    assert "choose: " in out and "from memory, all fields" in out


@pytest.mark.portable
def test_bench_times_loader_processes_against_the_threads_where_asked(pixels, capsys):
    assert main(["bench", pixels.location, "--batch-size", "16", "--repeats", "1", "--processes", "2"]) == 0
    out = capsys.readouterr().out
    timed = re.search(r"\nloaders, timed \(samples/s\): threads ([\d,]+); process=2 ([\d,]+) \(([\d.]+)x\)\n", out)
    assert timed, out
    threads, processes, ratio = (float(value.replace(",", "")) for value in timed.groups())
    assert threads > 0 and processes > 0 and ratio == pytest.approx(processes / threads, abs=0.01)
    chosen = "choose: process=2," if ratio >= 1.1 else "choose: this process's threads (no process= was 1.1x faster)"
    assert chosen in out
    held = re.search(r"loaders: a batch's CPU time holds the GIL ([\d.]+)% of it here", out)
    if gil_free_clock() is None:  # without outcore's C extensions
        assert held is None and "the GIL share is not timed here" in out
    else:
        assert held and 0 < float(held.group(1)) < 100


def test_bench_refuses_process_counts_it_cannot_read(pixels, capsys):
    for given in ("two", "-2", "0,2", ","):
        assert main(["bench", pixels.location, "--processes", given]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"--processes {given}: give loader process counts" in err, err


def test_loader_processes_are_chosen_where_they_beat_the_threads_by_a_tenth():
    slower = Loaders(16, 0.118, {0: 40_000.0, 2: 42_000.0})
    assert slower.choice == 0 and "choose: this process's threads (no process= was 1.1x faster)" in str(slower)
    faster = Loaders(16, 0.118, {0: 40_000.0, 2: 60_000.0, 4: 80_000.0, 8: 76_000.0})
    assert faster.choice == 4
    assert str(faster).splitlines() == [
        ("loaders: a batch's CPU time holds the GIL 11.8% of it here: one process's threads keep at most 5.8 of the "
         "16 cores busy (0.36 of them)"),
        ("loaders, timed (samples/s): threads 40,000; process=2 60,000 (1.50x); process=4 80,000 (2.00x); "
        "process=8 76,000 (1.90x)"),
        "choose: process=4, as in ds.batches(..., process=4) (also ds.torch, ds.keras, ds.tf)"]
    untimed = Loaders(16, None, {0: 60_000.0})
    assert str(untimed) == ("loaders: the GIL share is not timed here (outcore's C extensions do not load); outcore "
                            "bench --processes 2,4 times loader processes against the threads")


def test_no_loader_processes_are_timed_where_one_process_s_threads_can_use_the_cores(pixels):
    loaders = measure_loaders(pixels, ["images", "labels"], np.arange(len(pixels)), 16, None, cores=1, seconds=0.2)
    assert list(loaders.rates) == [0] and loaders.choice == 0 and loaders.skipped == ""
    assert "loaders, timed" not in str(loaders) and "choose" not in str(loaders)
    if loaders.held is not None:  # one core: the GIL keeps no thread from it
        assert loaders.bound == pytest.approx(1.0)


@pytest.mark.portable
def test_loader_processes_that_cannot_be_made_are_said_and_the_rest_timed(pixels):
    loaders = measure_loaders(pixels, ["images", "labels"], np.arange(len(pixels)), 16, None, cores=2, seconds=0.2,
                              counts=(1, 16))
    assert list(loaders.rates) == [0, 1] and all(rate > 0 for rate in loaders.rates.values())
    assert loaders.skipped.startswith("process=16 splits each batch among processes by the rank's streams, and it "
                                      "has 8: use process=8 or fewer"), loaders.skipped
    assert f"loaders: processes not timed: {loaders.skipped}" in str(loaders)


def test_advice_on_an_encoded_store_converts_a_sample_to_pixels(photos):
    ds = outcore.ingest_images(photos, photos.parent / "encoded.zarr", shape=(48, 48, 3), images="encoded",
                               progress=False)
    advice = advise(ds, batch_size=16, processes=())
    mine, pixels, zstd = advice.kinds
    assert [(kind.name, kind.source) for kind in advice.kinds] == [
        ("encoded", "this store"), ("pixels", "192 samples decoded"), ("pixels, zstd", "192 samples decoded")]
    assert pixels.bytes > zstd.bytes > 3 * mine.bytes  # photos' pixels take several times a JPEG's bytes
    assert all(size in advice.device.reads for kind in advice.kinds for size in kind.reads)
    assert advice.predict(mine, cold=True).limit in ("cores", "device")


def test_bench_of_a_store_without_pictures_says_nothing_of_them(tmp_path, capsys):
    ds = outcore.from_arrays({"x": [[1.0, 2.0]] * 64, "labels": [0, 1] * 32}, tmp_path / "numbers.zarr",
                             progress=False)
    assert main(["bench", ds.location, "--batch-size", "16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "choose:" not in out and "loaders" not in out and "from memory, all fields" in out


CHILD = """
import json, sys
from pathlib import Path
from outcore.storage.device import measure_device
from outcore.storage.page_cache import memory
paths = sorted(p for p in Path(sys.argv[1]).rglob("*") if p.is_file())
rates = measure_device(paths, in_flight=2, sizes=[4096, 256 * 1024], seconds=1.5)
room = memory()
print(json.dumps({"bandwidth": rates.bandwidth, "reads": rates.reads[4096], "available": room.available,
                  "limit": room.limit}))
"""


def test_the_device_is_measured_cold_under_a_throttled_device_and_a_memory_limit(tmp_path):
    """In a cgroup whose device gives 20 MB/s and 200 reads/s, the files' pages evicted: what is
    measured is the device's limit (from the page cache it would be GB/s), and the memory limit is seen."""
    store = tmp_path / "files"
    store.mkdir()
    for i in range(4):
        (store / f"shard-{i}").write_bytes(os.urandom(16 * MiB))
    os.sync()
    with throttled(store, bandwidth=20 * 10**6, requests=200, memory=768 * MiB) as cgroup:
        out = cgroup.run(CHILD, str(store))
    measured = json.loads(out)
    assert 10e6 < measured["bandwidth"] < 26e6, measured
    assert 100 < measured["reads"] < 260, measured
    assert measured["limit"] == 768 * MiB and measured["available"] <= 768 * MiB


def test_ingest_stores_pixels_when_the_pixel_store_fits_in_the_page_cache(photos, tmp_path, capsys):
    ds = outcore.ingest_images(photos, tmp_path / "fits.zarr", shape=(48, 48, 3), progress=True)
    recipe = ds.attrs.provenance["recipe"]
    assert not ds.info("images").is_image and (recipe["images"], recipe["images_chosen"]) == ("pixels", True)
    said = capsys.readouterr().err
    assert re.search(r"images='pixels': the pixel store \(1\.3 MiB\) fits in the memory the page cache can give "
                     r"\([\d.]+ GiB\): its epochs come from memory, with nothing to decode \(pass images= to choose\)",
                     said), said


# A device slow enough that encoded pictures win however slowly the cores decode: CI's timed decodes, on a loaded
# machine without the C extension, fell below the pixel rate of a device ten times faster.
SLOW_DEVICE = {"bandwidth": 2e6, "reads": 15}


def _machine(monkeypatch, tmp_path, bandwidth: float, reads: float) -> list[int]:
    """Memory of 1 MiB for the page cache, and a device of ``bandwidth`` and ``reads``/s under the target."""
    probes = []

    def measured(paths, in_flight, sizes, seconds):
        (probe,) = paths
        assert probe.parent == tmp_path and probe.name.startswith(".outcore-probe-")
        probes.append(probe.stat().st_size)
        return DeviceRates(bandwidth, {size: min(reads, bandwidth / size) for size in sizes}, in_flight)

    monkeypatch.setattr(choice, "memory", lambda: Memory(MiB, None))
    monkeypatch.setattr(choice, "measure_device", measured)
    return probes


def test_ingest_stores_encoded_pictures_when_a_slow_device_would_hold_pixels_up(photos, tmp_path, monkeypatch,
                                                                                capsys):
    probes = _machine(monkeypatch, tmp_path, **SLOW_DEVICE)
    source = shutil.copytree(photos, tmp_path / "photos")
    ds = outcore.ingest_images(source, tmp_path / "chosen.zarr", shape=(48, 48, 3), progress=True)
    assert ds.info("images").is_image and probes == [choice.PROBE_BYTES]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chosen.zarr", "photos"]  # the probe file is gone
    said = capsys.readouterr().err
    assert "images='encoded': the pixel store (1.3 MiB) does not fit in the memory the page cache can give" in said
    assert "an epoch of pixels would run at about" in said and ds.attrs.provenance["recipe"]["images_chosen"]
    for i, path in enumerate(sorted((source / "a").glob("*"))[:3]):
        (source / "b" / f"new-{i}{path.suffix}").write_bytes(path.read_bytes())
    with pytest.warns(OutcoreWarning, match="grew the room of field"):  # the new files outgrow a chunk's room
        grown = outcore.ingest_images(source, ds.location, shape=(48, 48, 3), append=True, progress=False)
    assert len(grown) == len(ds) + 3 and grown.info("images").is_image and probes == [choice.PROBE_BYTES]


def test_ingest_stores_pixels_out_of_core_when_the_device_outruns_the_cores(photos, tmp_path, monkeypatch, capsys):
    _machine(monkeypatch, tmp_path, bandwidth=50e9, reads=1e6)
    ds = outcore.ingest_images(photos, tmp_path / "fast.zarr", shape=(48, 48, 3), progress=True)
    assert not ds.info("images").is_image
    assert "images='pixels': the pixel store (1.3 MiB) does not fit in the memory" in capsys.readouterr().err


def test_a_file_that_cannot_be_decoded_is_left_to_the_ingest_when_the_cores_are_timed(photos, tmp_path, monkeypatch):
    _machine(monkeypatch, tmp_path, **SLOW_DEVICE)
    source = shutil.copytree(photos, tmp_path / "photos")
    for path in (source / "b").iterdir():  # half the files: some are among those the choice decodes
        path.write_bytes(b"not a picture")
    ds = outcore.ingest_images(source, tmp_path / "skipped.zarr", shape=(48, 48, 3), on_error="skip", progress=False)
    assert ds.info("images").is_image and len(ds) == 96 and ds.attrs.skipped["count"] == 96


def test_the_user_s_choice_of_images_is_kept_and_nothing_is_measured(photos, tmp_path, monkeypatch):
    monkeypatch.setattr(choice, "memory", lambda: pytest.fail("measured although images= was given"))
    ds = outcore.ingest_images(photos, tmp_path / "mine.zarr", shape=(48, 48, 3), images="pixels", progress=False)
    assert not ds.info("images").is_image and "images_chosen" not in ds.attrs.provenance["recipe"]


def test_advice_measures_encoded_pictures_decoded_on_a_device_where_asked(photos):
    """Where torch sees a CUDA GPU (and torchvision is installed) it is asked by default; any torch device may be
    given (here the CPU: the same path, decoded by outcore in the loader's process)."""
    need("torch")
    ds = outcore.ingest_images(photos, photos.parent / "for-a-gpu.zarr", shape=(48, 48, 3), images="encoded",
                               progress=False)
    advice = advise(ds, batch_size=16, gpu="cpu", processes=())
    names = [kind.name for kind in advice.kinds]
    assert names == ["encoded", "encoded, decode=cpu", "pixels", "pixels, zstd"]
    mine, there = advice.kinds[:2]
    assert (there.source, there.bytes, there.reads) == ("this store, decoded on cpu", mine.bytes, mine.reads)
    assert there.cpu > 0 and "encoded, decode=cpu" in str(advice)


def test_advice_choosing_a_gpu_says_how_to_read_with_it():
    encoded = Kind("encoded", "this store", bytes=20_000, reads={2**20: 1 / 128}, cpu=3_000)
    gpu = Kind("encoded, decode=cuda", "this store, decoded on cuda", 20_000, {2**20: 1 / 128}, 9_000, "cuda")
    advice = Advice(10**5, Memory(2**34, None), 16, None, (encoded, gpu))
    text = str(advice)
    assert "choose: encoded, decode=cuda (3.00x encoded; limited by the cores)" in text
    assert "that is: this store, read with ds.torch(..., decode='cuda')" in text
    assert "it would change: encoded with 48 cores or more" in text  # the GPU's kind is never asked for cores
