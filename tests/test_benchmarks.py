"""Every benchmark's command runs: it answers ``--help``, so a name it imports from another benchmark or from outcore
that has gone fails here, not on the next machine that runs it (a GPU machine's device time, say)."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("benchmarks/device/*.py")])


@pytest.mark.slow
def test_every_benchmark_answers_help():
    def run(script: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), "--help"], check=False, capture_output=True, text=True, timeout=300,
                              cwd=ROOT)

    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(SCRIPTS, pool.map(run, SCRIPTS), strict=True))
    failed = []
    for script, result in done.items():
        missing = re.search(r"No module named '(\w+)", result.stderr)
        if result.returncode and not (missing and f"pip install {missing[1]}" in script.read_text()):
            failed.append(f"{script.relative_to(ROOT)}: {(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    assert len(SCRIPTS) > 20 and not failed, failed
