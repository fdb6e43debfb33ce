"""The optional packages some tests need, and how to install each: a test that needs one skips without it,
saying which package and the command that installs it, unless ``OUTCORE_REQUIRE`` names it (CI's passes
name what they installed, so that a package missing there fails instead of skipping).

README's set-up line installs everything but the ``trainers`` extra (PyTorch Lightning, Hugging Face
Accelerate, torchdata), whose tests are marked ``trainers``: ``pip install -e ".[trainers]" && python -m
pytest -q -m trainers`` runs them.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

TORCH_FIRST = "after `pip install torch==2.13.0` (a CPU build, Python 3.11 only; any other spec pulls CUDA wheels)"

INSTALL = {  # top-level module -> (the package, how to install it)
    "torch": ("PyTorch", "pip install torch==2.13.0 (its CPU wheel exists for Python 3.11 only)"),
    "lightning": ("PyTorch Lightning", f'pip install -e ".[trainers]", {TORCH_FIRST}'),
    "accelerate": ("Hugging Face Accelerate", f'pip install -e ".[trainers]", {TORCH_FIRST}'),
    "torchdata": ("torchdata", f'pip install -e ".[trainers]", {TORCH_FIRST}'),
    "obstore": ("obstore (object stores)", 'pip install -e ".[remote]"'),
    "moto": ("moto's S3 server", 'pip install -e ".[dev]"'),
    "jax": ("JAX (Keras' JAX backend)", 'pip install -e ".[dev]"'),
    "nbformat": ("nbformat", 'pip install -e ".[dev]"'),
    "xarray": ("xarray", 'pip install -e ".[xarray]"'),
    "tensorflow": ("TensorFlow", 'pip install -e ".[tf]"'),
    "webdataset": ("webdataset (writes the test shards)", 'pip install -e ".[dev]"'),
    "lmdb": ("lmdb", 'pip install -e ".[lmdb]"'),
    "google": ("protobuf (writes Caffe Datums)", 'pip install -e ".[dev]"'),
    "pyarrow": ("pyarrow", 'pip install -e ".[parquet]"'),
    "datasets": ("Hugging Face datasets (writes the test datasets)", 'pip install -e ".[dev]"'),
    "pycocotools": ("pycocotools (writes COCO's run-length encodings)", 'pip install -e ".[dev]"'),
    "torchvision": ("torchvision (nvJPEG decoding on a GPU)", "pip install torchvision (on a CUDA machine)"),
}
TRAINERS = ("lightning", "accelerate", "torchdata")  # the modules of the ``trainers`` extra and marker


def required() -> set[str]:
    """The modules ``OUTCORE_REQUIRE`` (comma-separated) says must be there."""
    return {name.strip() for name in os.environ.get("OUTCORE_REQUIRE", "").split(",") if name.strip()}


def reason(module: str) -> str:
    """Why a test that needs ``module`` skips: the package and how to install it.

    >>> reason("lightning").startswith("PyTorch Lightning is not installed: pip install")
    True
    """
    package, install = INSTALL[module.partition(".")[0]]
    return f"{package} is not installed: {install}"


def need(module: str) -> ModuleType:
    """``module``, imported; without it the test skips, naming the package and its install command (or fails,
    where ``OUTCORE_REQUIRE`` names it)."""
    if module.partition(".")[0] in required():
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=reason(module))
