"""The documentation runs: every Python and shell block of the site and the README is executed, page by
page in a fresh folder that holds ``photos/train``, ``photos/val`` (three classes of JPEGs) and
``labels.csv`` (``path``, ``label``, ``weight``); the site builds with ``mkdocs build --strict``.

A block that cannot run here says why on the line before it: ``<!-- not run: needs a Dask scheduler -->``.
"""

from __future__ import annotations

import gc
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from support.optional import INSTALL, TRAINERS, reason, required

from outcore.cli import main
from outcore.errors import OutcoreWarning
from outcore.testing import write_image_folder

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CODE = ("python", "console", "bash")
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int
    not_run: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` in Python or shell, with the reason given when one is not run."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = NOT_RUN.match(lines[i - 1]) if i else None
        if opening.group(1) in CODE:
            found.append(Block(opening.group(1), "\n".join(lines[i + 1 : end]), i + 1,
                               marker.group(1) if marker else None))
        i = end + 1
    return found


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-sources")
    write_image_folder(root / "photos" / "train", 12, classes=("cat", "dog", "owl"), size=(48, 48), seed=0)
    write_image_folder(root / "photos" / "val", 4, classes=("cat", "dog", "owl"), size=(48, 48), seed=1)
    paths = sorted(p.relative_to(root).as_posix() for p in (root / "photos" / "train").rglob("*.jpg"))
    pd.DataFrame({"path": paths, "label": [p.split("/")[2] for p in paths],
                  "weight": [1.0 + (i % 2) for i in range(len(paths))]}).to_csv(root / "labels.csv", index=False)
    return root


def _page(page: Path):
    """``page`` as a test parameter: marked ``trainers`` where its code imports one of that extra's modules."""
    code = "\n".join(block.code for block in blocks(page) if block.not_run is None)
    imports = set(re.findall(r"^\s*(?:import|from) (\w+)", code, re.MULTILINE))
    marks = [pytest.mark.trainers] if imports & set(TRAINERS) else []
    return pytest.param(page, marks=marks, id=str(page.relative_to(ROOT)))


@pytest.mark.slow
@pytest.mark.parametrize("page", [_page(page) for page in PAGES])
def test_every_code_block_runs(page, sources, tmp_path, monkeypatch):
    shutil.copytree(sources, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    namespace: dict = {"__name__": "__docs__"}
    environment = dict(os.environ)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OutcoreWarning)  # pages show what outcore warns of; other warnings fail
            _run(page, namespace)
    finally:  # a page may set variables (`outcore.worker_environment()`): they end with it
        os.environ.clear()
        os.environ.update(environment)


def _run(page: Path, namespace: dict) -> None:
    gc.collect()  # earlier pages' and tests' garbage (Keras models among it) freed here, not in a worker forked by this one
    for block in blocks(page):
        where = f"{page.relative_to(ROOT)}:{block.line}"
        if block.not_run is not None:
            continue
        if block.language == "python":
            try:
                exec(compile(block.code, where, "exec"), namespace)  # noqa: S102 - the documentation's own code
            except ModuleNotFoundError as error:
                optional = (error.name or "").partition(".")[0]
                if optional not in INSTALL or optional in required():
                    raise
                pytest.skip(f"{where}: {reason(optional)}")  # an optional package: say how to install it
        else:
            commands = _commands(block.code)
            assert commands, f"{where}: a shell block runs its '$ ' lines; mark it not run, saying why"
            for command in commands:
                words = shlex.split(command, comments=True)
                assert words[0] == "outcore", f"{where}: only outcore commands run here; mark the block not run"
                assert main(words[1:]) == 0, f"{where}: {command}"


def _commands(code: str) -> list[str]:
    return [line.removeprefix("$ ") for line in code.splitlines() if line.startswith("$ ")]


def test_every_package_a_test_needs_is_named_with_its_install_command():
    """A test that skips without an optional package says how to install it: `need` of a module missing from
    INSTALL fails where the package is missing, as on a GPU machine without torchvision."""
    needed = {module.partition(".")[0] for path in (ROOT / "tests").rglob("*.py")
              for module in re.findall(r'need\("([\w.]+)"\)', path.read_text())}
    assert needed and needed <= set(INSTALL), sorted(needed - set(INSTALL))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=220, check=False,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "api" / "index.html").exists() and (tmp_path / "howto" / "keras" / "index.html").exists()


FIGURE = re.compile(r"(?<![\w.,-])\d[\d,.]*(?:-\d[\d,.]*)?(?:x\b| %| MiB\b| µs\b)")


def _quoted_figures(markdown: str) -> set[str]:
    """The ratios, percentages, memory sizes and times a page's prose quotes (code blocks left out)."""
    return set(FIGURE.findall(re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)))


def test_every_figure_readme_quotes_is_in_the_benchmarks_table_of_them_with_its_command_and_commit():
    quoted = _quoted_figures((ROOT / "README.md").read_text())
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    table = page.split("## The figures README quotes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| README")]
    assert _quoted_figures("at 2.1x, 6.0-97x, 0.4 % and 62-176 µs in 282-311 MiB; 128x128\n```\n9x\n```") == {
        "2.1x", "6.0-97x", "0.4 %", "62-176 µs", "282-311 MiB"}  # figures, not shapes nor code
    assert len(quoted) >= 8
    missing = sorted(figure for figure in quoted if not any(figure in row.split(" | ")[0] for row in rows))
    assert not missing, f"README quotes figures docs/benchmarks.md's table of them lacks: {missing}"
    for row in rows[1:]:
        cells = row.strip("|").split(" | ")
        assert re.search(r"`python benchmarks/\w+\.py", cells[2]), f"no command: {row}"
        assert re.search(r"\b[0-9a-f]{7}\b, \d{4}-\d\d-\d\d", cells[3]), f"no commit and date: {row}"


def test_the_cli_page_has_a_synopsis_line_and_a_section_for_every_command():
    from outcore.cli.main import _parser

    commands = set(next(action for action in _parser()._actions if action.dest == "command").choices)
    page = (ROOT / "docs" / "cli.md").read_text()
    synopsis = page.split("```console", 1)[1].split("```", 1)[0]
    assert {line.split()[2] for line in synopsis.splitlines() if line.startswith("$ outcore ") and
            not line.split()[2].startswith("-")} == commands
    assert {found for found in re.findall(r"^## `outcore (\w+)`", page, re.MULTILINE)} == commands


MACHINE_FIGURES = re.compile(r"on \d+ cores| \((measured|benchmarked)\)|[Mm]easured across|\d \w+ faster than|"
                             r"\d(\.\d+)?x (faster|slower)|\d(\.\d+)? ?µs")


def test_the_code_says_why_and_leaves_measured_figures_to_the_benchmarks_page():
    """A figure of one machine's run in a comment goes stale unseen: it belongs in docs/benchmarks.md
    ("Figures behind the code"), with what made it."""
    root = Path(__file__).parent.parent
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}"
             for path in sorted((root / "outcore").rglob("*.[pc]*")) if path.suffix in (".py", ".c")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if MACHINE_FIGURES.search(line)]
    assert found == [], "\n".join(found)
    assert "## Figures behind the code" in (root / "docs" / "benchmarks.md").read_text()


def test_the_tests_readme_names_every_test_file_with_what_it_tests():
    """tests/README.md: each test file with the first paragraph of its docstring, so a newcomer finds a part's tests."""
    import ast

    tests = Path(__file__).parent
    listed = dict(re.findall(r"^\| `(test_\w+\.py)` \| (.*) \|$", (tests / "README.md").read_text(), re.MULTILINE))
    files = {}
    for path in sorted(tests.glob("test_*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        assert docstring, f"{path.name} has no docstring saying what it tests"
        files[path.name] = " ".join(docstring.split("\n\n")[0].split())
    assert listed == files


def test_the_tests_readme_names_the_tests_of_every_module():
    """tests/README.md's second table: every module of outcore (but the packages' ``__init__.py`` that only
    gather names) with the test files that test it, each of which exists."""
    import ast

    tests, package = Path(__file__).parent, Path(__file__).parent.parent / "outcore"
    rows = dict(re.findall(r"^\| `([\w/]+\.py)` \| (`test_.*) \|$", (tests / "README.md").read_text(), re.MULTILINE))
    modules = {str(path.relative_to(package)) for path in package.rglob("*.py")
               if path.name != "__init__.py" or any(isinstance(node, ast.FunctionDef | ast.ClassDef)
                                                    for node in ast.parse(path.read_text()).body)}
    assert set(rows) == modules
    named = {name for files in rows.values() for name in re.findall(r"`(test_\w+\.py)`", files)}
    assert named <= {path.name for path in tests.glob("test_*.py")}
