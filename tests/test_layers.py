"""The folders are the layers: a module imports only from its own layer and the layers below it, there
are no import cycles, and an import inside a function is only ever there for an optional framework, to
keep a reading process light, or to leave an ingest's later imports to a thread of their own while it surveys
its files (what each imports is checked too)."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "outcore"
LAYERS = ("errors", "seeds", "threads", "format", "storage", "imaging", "iterate", "adapters", "dataset", "mixture", "measure", "ingest", "cli", "testing")
PUBLIC = ("__init__", "transforms")  # the public assembly at the top: may import any layer
# optional frameworks, imported only where used: distributed (clusters; tornado, its event loop, for a
# worker's periodic callback), scikit-learn (sample photographs), scikit-image (the demo's photographs),
# h5py (HDF5 sources in the test kit), xarray (Dataset.to_xarray)
# optional packages (frameworks, and the object-store client and test server), imported where they are used
FRAMEWORKS = ("torch", "tensorflow", "keras", "distributed", "tornado", "sklearn", "skimage", "h5py", "xarray",
              "obstore", "moto", "boto3", "lmdb", "pyarrow", "webdataset", "datasets", "google",
              "torchvision")  # google: protobuf
LATE = ("dask", "importlib", "pandas", "tqdm", "psutil")  # imported where used: a process that only reads batches
# needs none of them (test_setup); an ingest imports dask.array while it surveys (outcore.ingest.imports), and a
# folder's ingest no pandas; tqdm.notebook imports IPython, for a notebook's progress bars only; psutil (its import
# a tenth of outcore.dataset's) for a cluster's direct transfers and the demo's start time only


@functools.cache  # read-only: the package's files do not change during a run
def _modules() -> dict[str, Path]:
    return {".".join(("outcore", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
            for path in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    part = module.split(".")[1] if module != "outcore" else "__init__"
    return len(LAYERS) if part in PUBLIC else LAYERS.index(part)


def _imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """``(imported module, at module level)`` for every import of ``path``, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    local = {id(node) for function in ast.walk(tree) if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
             for node in ast.walk(function)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) not in local) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names]
            found += [(name if name.removeprefix("outcore.").split(".")[0] in _submodules() else base,
                       id(node) not in local) for name in names]
    return found


@functools.cache  # read-only: the package's files do not change during a run
def _submodules() -> set[str]:
    return {path.stem if path.parent == PACKAGE else path.parent.name for path in PACKAGE.rglob("*.py")}


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The outcore module ``name`` is (or is in), or None for another package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache  # read-only: the package's files do not change during a run
def _graph() -> dict[str, list[tuple[str, bool]]]:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        graph[module] = [(target if (target := _target(name, modules)) else name, top)
                         for name, top in _imports(module, path)]
    return graph


def test_every_module_imports_only_its_layer_and_the_layers_below():
    modules, violations = _modules(), []
    for module, imports in _graph().items():
        for name, top in imports:
            if name in modules and top and _layer(name) > _layer(module):
                violations.append(f"{module} ({LAYERS[_layer(module)] if _layer(module) < len(LAYERS) else 'public'}) "
                                  f"imports {name} ({LAYERS[_layer(name)]})")
    assert violations == []
    assert len(modules) > 40


def test_there_are_no_import_cycles():
    graph = {module: [name for name, top in imports if top and name in _modules() and name != module]
             for module, imports in _graph().items()}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for name in graph[module]:
            if state.get(name) == "open" and not module.startswith(name + "."):  # a package's __init__ runs first
                pytest.fail("import cycle: " + " -> ".join([*trail, module, name]))
            if name not in state:
                visit(name, [*trail, module])
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [])


def test_no_module_imports_another_module_s_private_names():
    """A name with a leading underscore is its module's own: a module that needs it from another makes it public
    there (the C extensions, modules named ``_jpeg`` and the like, are imported as modules)."""
    extensions = {path.stem for path in PACKAGE.rglob("_*.c")}
    private = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("outcore")):
                private += [f"{module}: from {'.' * node.level}{node.module or ''} import {alias.name}"
                            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")
                            and alias.name not in extensions]
    assert private == []


def test_imports_inside_functions_are_only_for_optional_frameworks():
    graph, modules = _graph(), _modules()
    framework_modules: set[str] = set()  # modules that import a framework at module level, themselves or through others
    while True:
        found = {module for module, imports in graph.items()
                 if any(top and (name.split(".")[0] in FRAMEWORKS or name in framework_modules) for name, top in imports)}
        if found == framework_modules:
            break
        framework_modules = found
    late = [(module, name) for module, imports in graph.items() for name, top in imports if not top]
    wrong = [f"{module} imports {name} inside a function" for module, name in late
             if name.split(".")[0] not in (*FRAMEWORKS, *LATE) and name not in framework_modules]
    assert wrong == []
    assert {name for _, name in late if name in modules} == {"outcore.adapters.keras", "outcore.adapters.tf",
                                                              "outcore.adapters.torch", "outcore.adapters.torch_mixture",
                                                              "outcore.adapters.torch_batches"}


def layer_report() -> str:
    """One line per layer: its modules and the layers it imports (``python tests/test_layers.py``)."""
    graph, modules = _graph(), _modules()
    lines = []
    for index, layer in enumerate((*LAYERS, "public")):
        members = sorted(m for m in modules if _layer(m) == index)
        uses = sorted({LAYERS[_layer(n)] for m in members for n, top in graph[m]
                       if top and n in modules and _layer(n) < index})
        lines.append(f"{layer:9s} {len(members):2d} modules; imports {', '.join(uses) or 'nothing of outcore'}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(layer_report())


HEAVY = ("pandas", "dask", "xarray", "distributed", "pyarrow", "psutil", "outcore.cli", "outcore.ingest")
READER = """
import json, sys
import outcore
bare = sorted(sys.modules)
ds = outcore.open_dataset(sys.argv[1])
batch = next(iter(ds.batches(4, shuffle=True)))
print(json.dumps({"bare": bare, "read": sorted(sys.modules)}))
"""


def test_a_process_that_reads_batches_imports_no_ingest_cli_or_dataframes(tmp_path):
    import numpy as np

    import outcore

    outcore.from_arrays({"images": np.zeros((8, 4, 4, 3), np.uint8), "labels": np.arange(8)}, tmp_path / "s.zarr",
                        progress=False)
    done = subprocess.run([sys.executable, "-c", READER, str(tmp_path / "s.zarr")], capture_output=True, text=True,
                          timeout=120, check=True)
    found = json.loads(done.stdout)
    assert [m for m in found["bare"] if m.startswith("outcore") and m not in ("outcore", "outcore.errors")] == []
    assert [m for m in found["read"] if m.startswith(HEAVY)] == []


def _mapped_files() -> set[str]:
    """The files docs/architecture.md's module map names (paths under outcore/): folders by their indent,
    several names on a line where they share a description."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = page.split("## Modules", 1)[1].split("```", 2)[1]
    folders: list[str] = []
    named = set()
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2 - 1  # "outcore/" itself is depth -1
        if depth < 0:
            continue
        names = line.strip().split("  ")[0].split()
        folders = folders[:depth]
        for name in names:
            if name.endswith("/"):
                folders.append(name.rstrip("/"))
                named.add("/".join([*folders, "__init__.py"]))  # a folder's line stands for its __init__
            else:
                named.add("/".join([*folders, name]))
    return named


def test_the_module_map_names_every_module_and_only_those():
    on_disk = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*")
               if path.suffix in (".py", ".c", ".h") and "__pycache__" not in path.parts}
    mapped = _mapped_files()
    assert sorted(on_disk - mapped) == [], "modules docs/architecture.md's map leaves out"
    assert sorted(mapped - on_disk) == [], "files docs/architecture.md's map names that are not there"


INGEST = """
import importlib.abc, json, sys, threading
import outcore.ingest
light = sorted(name for name in ("dask.array", "pandas") if name in sys.modules)
importers = {}


class Seen(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "dask.array" and name not in importers:
            importers[name] = threading.current_thread().name
        if name == sys.argv[3]:
            raise ImportError(f"no module named {name!r} (this test's finder)")


sys.meta_path.insert(0, Seen())
try:
    ds = outcore.ingest.ingest_images(sys.argv[1], sys.argv[2], shape=None, images="encoded", progress=False)
    made = {"samples": len(ds), "classes": ds.classes}
except ImportError as error:
    made = {"error": str(error)}
print(json.dumps({"light": light, "importers": importers, **made}))
"""


def _ingest_importing(folder: Path, store: Path, broken: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", INGEST, str(folder), str(store), broken], capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_an_ingest_imports_dask_array_on_a_thread_of_its_own_while_it_surveys(tmp_path):
    """`outcore.ingest.imports`: importing the ingest leaves out dask.array and pandas (a second or so holding the
    GIL), and an ingest of pictures at their own size starts dask.array's on a thread of its own once its survey's
    tasks are made, so that it runs beside them, not before them; a module that cannot be imported fails the ingest with
    its ImportError, as an import at the top would, and leaves no store."""
    from outcore.testing import write_image_folder

    write_image_folder(tmp_path / "photos", 30, classes=("cat", "dog"), size=(64, 64))  # a survey of some ms at least
    found = _ingest_importing(tmp_path / "photos", tmp_path / "a.zarr")
    assert found["light"] == []
    assert found["importers"] == {"dask.array": "outcore-imports"}  # not the ingest's thread, after the survey
    assert found["samples"] == 60 and found["classes"] == ["cat", "dog"]
    broken = _ingest_importing(tmp_path / "photos", tmp_path / "b.zarr", broken="dask.array")
    assert broken["light"] == [] and "no module named 'dask.array' (this test's finder)" in broken["error"]
    assert not (tmp_path / "b.zarr").exists()


LATER = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from outcore.ingest import imports
imports.AHEAD = ("slow_module",)
ran = []

def where():
    ran.append((threading.current_thread().name, "slow_module" in sys.modules))
    return len(ran)

def failing():
    raise ValueError("the work's own error")

given, failed = imports.after_imports(where), imports.after_imports(failing)
imports.import_ahead()
imports._thread.join(30)
try:
    failed.result()
except ValueError as error:
    raised = str(error)
late = imports.after_imports(where)  # the thread has ended: whoever asks runs it
print(given.result(), late.result(), ran, raised, len(imports._later))
"""


def test_work_given_after_the_imports_runs_on_their_thread_once_they_are_done_or_where_it_is_asked_for(tmp_path):
    """`outcore.ingest.imports.after_imports`: the imports thread runs the work once its imports are done; its failure
    is raised where the result is asked for; work given once the thread has ended runs where it is asked for, and
    none is kept."""
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(0.3)\n")
    done = subprocess.run([sys.executable, "-c", LATER, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.split("\n")[0] == ("1 2 [('outcore-imports', True), ('MainThread', True)] the work's own error 0")


FORK = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from outcore.ingest import imports
imports.AHEAD = ("slow_module",)
imports.import_ahead()
time.sleep(0.3)  # the thread is inside slow_module's import, holding its lock
child = os.fork()
if child == 0:
    import slow_module
    os._exit(0 if slow_module.DONE else 3)
deadline = time.monotonic() + 20
while (ended := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
if ended[0] == 0:
    os.kill(child, 9)
    os.waitpid(child, 0)
print(os.waitstatus_to_exitcode(ended[1]) if ended[0] else "hung")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="os.fork is POSIX")
def test_a_process_forked_while_an_ingest_imports_ahead_can_import_the_same(tmp_path):
    """A fork waits for `outcore.ingest.imports`' thread: a child made while it held a module's import lock would
    wait forever for that lock, importing the module."""
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(1.5)\nDONE = True\n")
    done = subprocess.run([sys.executable, "-c", FORK, str(tmp_path)], capture_output=True, text=True, timeout=30,
                          check=True)
    assert done.stdout.split()[-1] == "0", done.stderr  # the child's exit status, or "hung"
