"""Every script in examples/ runs, and the runnable docstring examples hold."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import outcore.encoded
import outcore.imaging
import outcore.schema
import outcore.shuffle
import outcore.synthetic

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script, tmp_path):
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "outcore.Dataset" in result.stdout


def test_there_are_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("module", [outcore.schema, outcore.imaging, outcore.synthetic, outcore.shuffle, outcore.encoded],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    results = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0 and results.failed == 0
