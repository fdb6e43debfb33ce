"""The set-up lines the documentation gives resolve to what pyproject.toml declares: every ``pip install`` of
README and the site names extras that exist and versions its specifiers admit, and environment.yml (conda,
which cannot be installed from the package registry CI reaches) holds the same packages at the same versions
as README's set-up line. README's set-up line, test command and the site's line run word for word in CI
(`.ci/run`)."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SETUP_EXTRAS = ("dev", "tf", "torch")  # README's set-up line: torch==2.13.0, then ".[dev,tf]"
CONDA_NAMES = {"torch": "pytorch", "tensorflow-cpu": "tensorflow", "lmdb": "python-lmdb"}  # conda-forge's names where they differ
CONDA_EXTRAS = {"mkdocstrings[python]": {"mkdocstrings-python"}, "moto[server]": {"flask", "flask-cors"}}
CONDA_ONLY = {"python", "pip", "c-compiler", "libjpeg-turbo"}  # a compiler and libjpeg-turbo for the C extension


def requirements(*extras: str) -> list[Requirement]:
    """outcore's dependencies and those of ``extras`` (an extra's ``outcore[other]``: those of ``other``)."""
    found = [Requirement(r) for r in PYPROJECT["dependencies"]]
    for extra in extras:
        for requirement in map(Requirement, PYPROJECT["optional-dependencies"][extra]):
            if canonicalize_name(requirement.name) == "outcore":
                found += requirements(*requirement.extras)[len(PYPROJECT["dependencies"]):]
            else:
                found.append(requirement)
    return found


def install_lines() -> list[tuple[str, list[str]]]:
    """``(where, arguments)`` of every ``pip install`` the documentation shows, in code blocks and inline code."""
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for command in re.findall(r"pip install ([^`#&\n]+)", line):
                found.append((f"{page.relative_to(ROOT)}:{number}", shlex.split(command)))
    return found


def where_text(where: str) -> str:
    """The line ``page:number`` names."""
    page, number = where.rsplit(":", 1)
    return (ROOT / page).read_text().splitlines()[int(number) - 1]


def test_the_documentation_shows_install_lines():
    wheres = [where for where, _ in install_lines()]
    assert any(w.startswith("README.md") for w in wheres) and any(w.startswith("docs/index.md") for w in wheres)


@pytest.mark.parametrize(("where", "arguments"), install_lines(), ids=[w for w, _ in install_lines()])
def test_every_install_line_names_extras_and_versions_pyproject_declares(where, arguments):
    declared = {canonicalize_name(r.name): r for r in requirements(*PYPROJECT["optional-dependencies"])}
    for argument in (a for a in arguments if not a.startswith("-")):
        wanted = Requirement("outcore" + argument[1:] if argument.startswith(".") else argument)  # ".[dev]"
        if canonicalize_name(wanted.name) == "outcore":
            unknown = wanted.extras - set(PYPROJECT["optional-dependencies"])
            assert not unknown, f"{where}: outcore has no extra(s) {sorted(unknown)}"
            continue
        if "not an outcore dependency" in where_text(where):  # a peer a benchmark compares with
            continue
        assert canonicalize_name(wanted.name) in declared, f"{where}: {wanted.name} is not in pyproject.toml"
        ours = declared[canonicalize_name(wanted.name)]
        assert wanted.extras <= ours.extras, f"{where}: pyproject.toml asks {ours}, not {wanted}"
        for pinned in (s.version for s in wanted.specifier if s.operator == "=="):
            assert ours.specifier.contains(pinned), f"{where}: {wanted} is outside pyproject.toml's {ours}"


def conda_requirements() -> dict[str, tuple[SpecifierSet, str]]:
    """environment.yml's conda packages: name -> (specifier, the line)."""
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    found = {}
    for entry in environment["dependencies"]:
        if isinstance(entry, str):
            name, specifier = re.fullmatch(r"([\w.-]+)\s*(.*)", entry).groups()
            found[canonicalize_name(name)] = (SpecifierSet(specifier.replace("=", "==") if re.fullmatch(
                r"=\d[\d.]*", specifier) else specifier), entry)
    return found


def test_environment_yml_holds_readmes_set_up_packages_at_pyprojects_versions():
    conda = conda_requirements()
    expected = set(CONDA_ONLY)
    for requirement in requirements(*SETUP_EXTRAS):
        name = canonicalize_name(CONDA_NAMES.get(requirement.name, requirement.name))
        extras = "".join(f"[{extra}]" for extra in sorted(requirement.extras))
        expected |= {name} | CONDA_EXTRAS.get(requirement.name + extras, set())
        assert name in conda, f"environment.yml lacks {name} (pyproject.toml: {requirement})"
        assert conda[name][0] == requirement.specifier, \
            f"environment.yml's {conda[name][1]!r} is not pyproject.toml's {requirement}"
    assert set(conda) == expected, (f"environment.yml holds what pyproject.toml does not: {sorted(set(conda) - expected)}"
                                    f"; lacks: {sorted(expected - set(conda))}")
    python = conda["python"][0]
    assert SpecifierSet(PYPROJECT["requires-python"]).contains(next(iter(python)).version), python
