"""Shared fixtures: small image folders written to disk with known pixels, and small stores."""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

import outcore
from outcore.testing import write_image_folder

CLASSES = ("disc", "square", "hstripes")


ONE_PYTHON = {
    "e2e": "an end-to-end suite",
    "slow": "tens of seconds of work the same on every interpreter",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``OUTCORE_E2E=0`` skips, saying so, the end-to-end suites (marked ``e2e``: an S3 server, a Dask cluster
    of worker processes) and the tests marked ``slow`` (examples, docs, stress and property tests of hundreds of
    examples); CI sets it on all but one Python, where they run.

    Those also marked ``portable`` need neither PyTorch nor TensorFlow, so CI runs them on another Python, in
    parallel: ``OUTCORE_PORTABLE=elsewhere`` skips them (CI's 3.11), ``OUTCORE_PORTABLE=here`` runs them even
    under ``OUTCORE_E2E=0`` (CI's 3.12)."""
    portable = os.environ.get("OUTCORE_PORTABLE", "")
    if portable not in ("", "here", "elsewhere"):
        raise pytest.UsageError(f"OUTCORE_PORTABLE={portable!r}: expected 'here' or 'elsewhere' (or unset)")
    quick = os.environ.get("OUTCORE_E2E", "1") == "0"
    for item in items:
        if item.get_closest_marker("portable"):
            if portable == "elsewhere":
                item.add_marker(pytest.mark.skip(reason="needs neither torch nor TensorFlow: off with "
                                                        "OUTCORE_PORTABLE=elsewhere (CI runs it on Python 3.12)"))
                continue
            if portable == "here":
                continue
        if not quick:
            continue
        where = "3.12" if item.get_closest_marker("portable") else "3.11"
        for marker, what in ONE_PYTHON.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=f"{what}, off with OUTCORE_E2E=0 (CI runs it on Python {where})"))
                break


def pytest_configure(config: pytest.Config) -> None:
    """A DataLoader worker forked by a test that crashes (a segmentation fault, a bus error) prints its threads'
    Python stacks, as pytest's faulthandler makes the test process do: a worker's own signal handlers
    (torch's, installed as it starts) say only that it crashed, and its parent that it died by the signal."""
    if importlib.util.find_spec("torch") is None:
        return
    from torch.utils.data._utils import signal_handling

    set_by_torch = signal_handling._set_worker_signal_handlers

    def set_handlers(*args: object) -> None:
        set_by_torch(*args)
        if faulthandler.is_enabled():  # inherited: installed again over torch's handlers
            faulthandler.disable()
            faulthandler.enable(file=sys.__stderr__, all_threads=True)

    signal_handling._set_worker_signal_handlers = set_handlers


@pytest.fixture(autouse=True, scope="session")
def _runs_started_ahead_let_go_soon():
    """A run started ahead for an epoch never asked for lets go of what it made after 3 s here, not a minute: the
    iterators that TensorFlow's generators keep after a test (tests/test_keras_tf.py) leave no thread for long,
    which a test looking for threads left behind waits out (tests/test_loader.py)."""
    from outcore.iterate import runs

    runs.UNTAKEN_SECONDS = 3.0


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Three classes (cat, dog, owl) of 32x32 pictures: JPEG RGB, PNG RGB, PNG greyscale, PNG RGBA."""
    root = tmp_path / "photos"
    write_image_folder(root, 5, classes=("cat", "dog"), size=(32, 32), extension=".jpg", seed=1)
    write_image_folder(root, 4, classes=("dog", "owl"), size=(32, 32), extension=".png", seed=2)
    rng = np.random.default_rng(3)
    iio.imwrite(root / "owl" / "grey.png", rng.integers(0, 256, (32, 32), dtype=np.uint8))
    iio.imwrite(root / "cat" / "alpha.png", rng.integers(0, 256, (32, 32, 4), dtype=np.uint8))
    return root


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """Train and validation stores of three learnable classes of 32x32 pictures."""
    root = tmp_path_factory.mktemp("splits")
    write_image_folder(root / "train", 150, classes=CLASSES, size=(32, 32), seed=0)
    write_image_folder(root / "val", 40, classes=CLASSES, size=(32, 32), seed=1)
    train = outcore.ingest_images(root / "train", root / "train.zarr", shape=(32, 32, 3), chunk_size=32,
                                  progress=False)
    val = outcore.ingest_images(root / "val", root / "val.zarr", shape=(32, 32, 3), progress=False)
    return train, val


@pytest.fixture
def ids_store(tmp_path):
    """1,000 samples in chunks of 32 whose ``id`` field is their index."""
    return outcore.from_arrays({"images": np.zeros((1000, 4, 4, 3), np.uint8), "id": np.arange(1000)},
                               tmp_path / "ids.zarr", chunk_size=32, progress=False)
