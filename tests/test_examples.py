"""Every script in examples/ runs, and the runnable docstring examples hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.optional import need

import outcore

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_the_notebook_runs_and_shows_what_it_says():
    nbformat = need("nbformat")
    from nbclient import NotebookClient

    notebook = nbformat.read(Path(__file__).parent.parent / "examples" / "tour.ipynb", as_version=4)
    NotebookClient(notebook, timeout=240, kernel_name="python3").execute()  # a failing cell raises
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    html = [output["data"]["text/html"] for output in outputs if "text/html" in output.get("data", {})]
    assert any("<th>on disk</th>" in page and "6: astronaut, cat, china" in page for page in html)
    assert sum("image/png" in output.get("data", {}) for output in outputs) == 3  # batch grid, two plots
    text = "".join(output.get("text", "") for output in outputs if output["output_type"] == "stream")
    assert "label TV distance per batch" in text and "validation accuracy" in text
    assert "IProgress" not in text and "ingest → train.zarr" in text  # a text progress bar, no warning
    accuracy = float(text.split("validation accuracy ")[1].split("%")[0])
    assert accuracy > 50  # six classes: chance is 16.7 %
