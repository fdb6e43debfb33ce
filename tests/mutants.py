"""Mutation testing: deliberate bugs in the modules that guard orders and bytes, and whether the tests catch them.

    python tests/mutants.py [--per-module 12] [--seed 0] [--modules plan,options,...] [--list]

For each module below, every place where one small change makes another program (a comparison or
arithmetic operator swapped, a number off by one, ``and``/``or`` swapped, a ``not`` dropped, ``True``/
``False`` swapped) is a mutant; ``--per-module`` of them, drawn with ``--seed``, are applied one at a time
(in place, the file restored after each) and the module's tests run (``-x``: the first failure kills the
mutant). A mutant the tests do not kill **survives**. Prints a table per module and each survivor, to be
read: a survivor is either a missing test or a change that makes no difference (an equivalent mutant),
and which it is must be said.

Refuses to run when the modules have uncommitted changes (it restores them from what it read).
"""

from __future__ import annotations

import argparse
import io
import random
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = {  # short name -> (file, the tests that cover it)
    "plan": ("outcore/iterate/plan.py", ["tests/test_plan.py", "tests/test_golden.py"]),
    "options": ("outcore/iterate/options.py", ["tests/test_plan.py", "tests/test_loader.py"]),
    "shard_reader": ("outcore/storage/shard_reader.py", ["tests/test_store.py", "tests/test_chunks.py",
                                                         "tests/test_conformance.py"]),
    "remote": ("outcore/storage/remote.py", ["tests/test_remote.py"]),
    "writer": ("outcore/ingest/writer.py", ["tests/test_arrays_and_writer.py"]),
    "seeds": ("outcore/seeds.py", ["tests/test_golden.py", "tests/test_plan.py"]),
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


def killed(tests: list[str], timeout: float) -> bool:
    """Whether the tests fail (or do not finish) on the mutated code."""
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=ROOT, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return True
    return done.returncode != 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-module", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modules", default=",".join(MODULES))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a test run may take (then: killed)")
    parser.add_argument("--list", action="store_true", help="only list the mutants drawn")
    args = parser.parse_args()
    names = args.modules.split(",")
    changed = subprocess.run(["git", "diff", "--quiet", "--", *(MODULES[n][0] for n in names)], cwd=ROOT, check=False)
    if changed.returncode and not args.list:
        raise SystemExit("commit or stash the changes of the modules first: each mutant is applied in place")
    rows = []
    for name in names:
        path, tests = MODULES[name]
        file = ROOT / path
        source = file.read_text()
        every = mutants(source)
        drawn = sorted(random.Random(f"{args.seed}-{name}").sample(every, min(args.per_module, len(every))),
                       key=lambda m: (m.line, m.column))
        survivors = []
        began = time.monotonic()
        for mutant in drawn:
            if args.list:
                print(f"{path} {mutant}")
                continue
            try:
                file.write_text(mutant.apply(source))
                doctests = f"tests/test_examples.py::test_docstring_examples[{_module(path)}]"
                if not killed([*tests, doctests], args.timeout):
                    survivors.append(mutant)
            finally:
                file.write_text(source)
            print(f"{path} {mutant}: {'SURVIVED' if survivors and survivors[-1] is mutant else 'killed'}",
                  flush=True)
        rows.append((path, len(every), len(drawn), survivors, time.monotonic() - began))
    if args.list:
        return
    print("\n| module | mutants in it | drawn | killed | survived | minutes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for path, every, drawn, survivors, seconds in rows:
        print(f"| {path} | {every} | {drawn} | {drawn - len(survivors)} | {len(survivors)} | {seconds / 60:.1f} |")
    total, alive = sum(r[2] for r in rows), sum(len(r[3]) for r in rows)
    print(f"\nsurvivors: {alive} of {total} ({alive / max(1, total):.0%})")
    for path, _, _, survivors, _ in rows:
        for mutant in survivors:
            print(f"  {path} {mutant}: {(ROOT / path).read_text().splitlines()[mutant.line - 1].strip()}")


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


if __name__ == "__main__":
    main()
