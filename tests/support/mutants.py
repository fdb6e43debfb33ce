"""Mutation testing: deliberate bugs in the modules that guard orders and bytes, and whether the tests catch them.

    python tests/support/mutants.py [--per-module 12] [--seed 0] [--modules plan,options,...] [--list]

For each module below, every place where one small change makes another program (a comparison or
arithmetic operator swapped, a number off by one, ``and``/``or`` swapped, a ``not`` dropped, ``True``/
``False`` swapped) is a mutant; ``--per-module`` of them, drawn with ``--seed``, are applied one at a time
and the module's tests run (``-x``: the first failure kills the mutant). A mutant the tests do not kill
**survives**. Prints a table per module and each survivor, to be read: a survivor is either a missing test
or a change that makes no difference (an equivalent mutant), and which it is must be said.

Mutants are made in a scratch copy of the working tree (its files, as CI copies them, and the C extension
built here), imported from there (``PYTHONPATH``) and deleted at the end: the working tree is never
written, so a run that is killed leaves nothing behind. The unmutated tests must pass in the copy first.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = {  # short name -> (file, the tests that cover it)
    "plan": ("outcore/iterate/plan.py", ["tests/test_plan.py", "tests/test_golden.py"]),
    "options": ("outcore/iterate/options.py", ["tests/test_plan.py", "tests/test_loader.py"]),
    "shard_reader": ("outcore/storage/shard_reader.py", ["tests/test_store.py", "tests/test_chunks.py",
                                                         "tests/test_conformance.py"]),
    "remote": ("outcore/storage/remote.py", ["tests/test_remote.py", "tests/test_upload.py"]),
    "writer": ("outcore/ingest/writer.py", ["tests/test_arrays_and_writer.py"]),
    "seeds": ("outcore/seeds/__init__.py", ["tests/test_golden.py", "tests/test_plan.py", "tests/test_seeds.py"]),
}
SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "+": "-", "-": "+", "*": "//",
         "//": "*", "and": "or", "or": "and", "True": "False", "False": "True"}


@dataclass(frozen=True)
class Mutant:
    line: int
    column: int
    original: str
    replacement: str

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        text = lines[self.line - 1]
        lines[self.line - 1] = text[: self.column] + self.replacement + text[self.column + len(self.original) :]
        return "".join(lines)

    def __str__(self) -> str:
        return f"line {self.line}: {self.original!r} -> {self.replacement!r}"


def mutants(source: str) -> list[Mutant]:
    """Every one-token mutant of the code that still compiles (none in docstrings or comments)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        (line, column), text = token.start, token.string
        if token.type in (tokenize.OP, tokenize.NAME) and text in SWAPS:
            found.append(Mutant(line, column, text, SWAPS[text]))
        elif token.type == tokenize.NAME and text == "not":
            found.append(Mutant(line, column, "not ", ""))
        elif token.type == tokenize.NUMBER and text.isdigit():
            found.append(Mutant(line, column, text, str(int(text) + 1)))
    return [mutant for mutant in found if _compiles(mutant.apply(source))
            if source.splitlines()[mutant.line - 1][mutant.column :].startswith(mutant.original)]


def _compiles(source: str) -> bool:
    try:
        compile(source, "mutant", "exec")
    except SyntaxError:
        return False
    return True


@contextmanager
def scratch_copy() -> Iterator[Path]:
    """The working tree's files (tracked, and untracked but not ignored) and built extensions, in a new folder."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    built = [str(path.relative_to(ROOT)) for path in (ROOT / "outcore").rglob("*.so")]
    with tempfile.TemporaryDirectory(prefix="outcore-mutants.") as folder:
        for name in [*(n.decode() for n in listed if n), *built]:
            target = Path(folder, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / name).is_file():
                shutil.copy2(ROOT / name, target)
        yield Path(folder)


def passes(copy: Path, tests: list[str], timeout: float) -> bool:
    """Whether the tests pass (in time) on the copy's code, imported from the copy, in this process and in
    every process the tests start."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=copy, env=environment, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-module", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modules", default=",".join(MODULES))
    parser.add_argument("--timeout", type=float, help="seconds a mutant's test run may take (then: killed); "
                        "default: 3 times the unmutated run's, and 30 s")
    parser.add_argument("--list", action="store_true", help="only list the mutants drawn")
    args = parser.parse_args()
    drawn = {}
    for name in args.modules.split(","):
        path, _ = MODULES[name]
        every = mutants((ROOT / path).read_text())
        drawn[name] = (len(every), sorted(random.Random(f"{args.seed}-{name}").sample(every, min(args.per_module, len(every))),
                                          key=lambda m: (m.line, m.column)))
    if args.list:
        for name, (_, chosen) in drawn.items():
            print("\n".join(f"{MODULES[name][0]} {mutant}" for mutant in chosen))
        return
    with scratch_copy() as copy:
        rows = [run_module(copy, name, every, chosen, args.timeout) for name, (every, chosen) in drawn.items()]
    print("\n| module | mutants in it | drawn | killed | survived | minutes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for path, every, count, survivors, seconds in rows:
        print(f"| {path} | {every} | {count} | {count - len(survivors)} | {len(survivors)} | {seconds / 60:.1f} |")
    total, alive = sum(r[2] for r in rows), sum(len(r[3]) for r in rows)
    print(f"\nsurvivors: {alive} of {total} ({alive / max(1, total):.0%})")
    for path, _, _, survivors, _ in rows:
        for mutant, line in survivors:
            print(f"  {path} {mutant}: {line.strip()}")


def run_module(copy: Path, name: str, every: int, chosen: list[Mutant], timeout: float | None) -> tuple:
    """Each mutant of one module applied in the copy in turn, and its tests run (its doctests first, the
    quickest); the module restored after. A mutant that makes the tests hang is killed by the timeout."""
    path, tests = MODULES[name]
    tests = [f"tests/test_examples.py::test_docstring_examples[{_module(path)}]", *tests]
    file, source = copy / path, (copy / path).read_text()
    began = time.monotonic()
    if not passes(copy, tests, 3600.0):
        raise SystemExit(f"{path}: its tests fail without a mutant: {' '.join(tests)}")
    timeout = timeout or 3 * (time.monotonic() - began) + 30
    survivors = []
    for mutant in chosen:
        file.write_text(mutant.apply(source))
        survived = passes(copy, tests, timeout)
        survivors += [(mutant, source.splitlines()[mutant.line - 1])] if survived else []
        print(f"{path} {mutant}: {'SURVIVED' if survived else 'killed'}", flush=True)
    file.write_text(source)
    return path, every, len(chosen), survivors, time.monotonic() - began


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


if __name__ == "__main__":
    main()
