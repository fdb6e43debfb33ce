"""Every script in examples/ runs, and the runnable docstring examples hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import outcore

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "outcore.Dataset" in result.stdout


def test_there_are_examples():
    assert len(EXAMPLES) >= 2


def _modules() -> list[str]:
    """Every module of outcore, but the framework adapters (their frameworks may not be installed) and the
    command's ``__main__``."""
    names = [info.name for info in pkgutil.walk_packages(outcore.__path__, "outcore.")]
    return [name for name in names if not name.startswith(("outcore.adapters.keras", "outcore.adapters.tf",
                                                           "outcore.adapters.torch", "outcore.cli.__main__"))]


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    results = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert results.failed == 0

