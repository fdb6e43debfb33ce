"""A store is complete or not there: atomic replacement, killed ingests, leftovers cleaned, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import outcore
from outcore.errors import OutcoreWarning, StoreExistsError
from outcore.imaging.synthetic import write_image_folder
from outcore.ingest.images import _files_json
from outcore.storage import remove_path
from outcore.testing.interrupts import OUTCOMES, as_from_a_terminal, outcome, start_command
from outcore_command import CLEANUP_SECONDS


def test_overwrite_never_leaves_the_target_without_a_store(tmp_path):
    target = tmp_path / "s.zarr"
    outcore.from_arrays({"x": np.zeros(100)}, target, progress=False)
    missing, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            if not (target / "zarr.json").exists():
                missing.append(time.perf_counter())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for value in range(1, 9):
            outcore.from_arrays({"x": np.full(100, value)}, target, overwrite=True, progress=False)
    finally:
        stop.set()
        watcher.join()
    assert missing == []
    assert outcore.open_dataset(target)["x"].compute().tolist() == [8] * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]  # nothing left beside it


def test_a_run_folder_is_never_seen_unlocked_by_a_concurrent_run(tmp_path, monkeypatch):
    """A run's folder was visible before it was locked: another run starting in that instant took it for a
    dead run and removed it. Here a second run cleans up at the worst moment of the first's start."""
    from outcore.storage import staging

    target = tmp_path / "s.zarr"
    real_lock, cleanups = staging._lock, []

    def lock_after_a_rival_cleans_up(run):
        with warnings.catch_warnings(record=True):
            cleanups.append(staging._adopt_or_clean(target, None, str(target)))  # what a concurrent run does first
        return real_lock(run)

    monkeypatch.setattr(staging, "_lock", lock_after_a_rival_cleans_up)
    ds = outcore.from_arrays({"x": np.arange(100)}, target, progress=False)
    assert cleanups and sorted(ds["x"].compute().tolist()) == list(range(100))


@pytest.mark.parametrize("name", ["data[1].zarr", "d*.zarr"])
def test_target_names_are_not_glob_patterns(tmp_path, name):
    """``data[1].zarr`` matched ``.data1.zarr.partial-*``: a run on one target removed another's files."""
    other = tmp_path / ".data1.zarr.partial-12345678"
    other.mkdir()
    (tmp_path / ".dz.zarr.partial-12345678").mkdir()
    outcore.from_arrays({"x": np.arange(10)}, tmp_path / name, progress=False)
    assert other.exists() and (tmp_path / ".dz.zarr.partial-12345678").exists()
    assert sorted(outcore.open_dataset(tmp_path / name)["x"].compute().tolist()) == list(range(10))


def test_a_tree_is_removed_whole_its_links_removed_not_followed(tmp_path):
    """A folder tree of many folders of files (a finished run's scratch: a folder a field, a file a task) is removed
    whole, its folders' files on the pool's threads; a link to a folder or a file elsewhere is removed, and what it
    leads to is kept."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept.bin").write_bytes(b"kept")
    tree = tmp_path / "tree"
    for field in range(6):
        for depth in ("", "inner/"):
            folder = tree / f"field-{field}" / depth
            folder.mkdir(parents=True, exist_ok=True)
            for task in range(40):
                (folder / f"{task * 512}.rows").write_bytes(b"rows")
    (tree / "field-0" / "to-a-folder").symlink_to(elsewhere, target_is_directory=True)
    (tree / "field-1" / "to-a-file").symlink_to(elsewhere / "kept.bin")
    (tree / "top.json").write_text("{}")
    remove_path(tree)
    assert not tree.exists() and not tree.is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["kept.bin"] and (elsewhere / "kept.bin").read_bytes() == b"kept"


def test_a_store_left_between_two_renames_is_put_back(tmp_path):
    """Where the system cannot swap two folders, a replace is two renames; a run dying between them
    leaves the old store aside, and the next run restores it before anything else."""
    outcore.from_arrays({"x": np.arange(10)}, tmp_path / "s.zarr", shuffle_on_write=False, progress=False)
    os.replace(tmp_path / "s.zarr", tmp_path / ".s.zarr.previous-1234abcd")
    with pytest.warns(OutcoreWarning, match="put back"), pytest.raises(StoreExistsError):
        outcore.from_arrays({"x": np.arange(10)}, tmp_path / "s.zarr", progress=False)
    assert outcore.open_dataset(tmp_path / "s.zarr")["x"].compute().tolist() == list(range(10))


SLOW_INGEST = """
import signal, sys, time
import outcore.ingest.build as build
from outcore.cli import main

# as from a terminal: Ctrl-C raises KeyboardInterrupt (a process started from one that ignores SIGINT,
# as the test runner may by the time this runs, would inherit the ignoring)
signal.signal(signal.SIGINT, signal.default_int_handler)

write = build._write_shard
def slowly(*args):  # every shard takes a while, so the test can kill the run between two of them
    result = write(*args)
    time.sleep(1.0)  # 8 shards on 2 threads: seconds left to stop the run after the first
    return result
build._write_shard = slowly
sys.exit(main(sys.argv[1:]))
"""


PIXELS = ("--shape", "16x16x3")
OWN_SIZES_CAPPED = ("--shape", "any", "--images", "encoded", "--max-side", "12")  # a survey, then the writes


def _ingest_command(source, store, *extra, images=PIXELS):
    return [str(source), str(store), *images, "--chunk-size", "8", "--no-progress", "--on-error", "skip", *extra]


def _without_times(ds):
    """The attributes but the creation time, the generation (each store's own) and the report's name (which
    follows the store's)."""
    attrs = ds.attrs.to_dict()
    attrs["provenance"].pop("created")
    attrs.pop("generation")
    attrs["skipped"].pop("report")
    return attrs


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("killed") / "src"
    write_image_folder(root, 150, classes=("a", "b", "c"), size=(20, 20), seed=3)
    (root / "b" / "broken.jpg").write_bytes(b"not a picture")  # skipped, and reported the same after a resume
    return root


def _stop_part_way(source, store, shards: int = 1, how: int = signal.SIGKILL, images=PIXELS, script=SLOW_INGEST,
                   **popen) -> subprocess.Popen:
    """Start a slow CLI ingest (``script``) into ``store``, and send it ``how`` once it has finished ``shards``
    shards."""
    command = _ingest_command(source, store, images=images)
    process = subprocess.Popen([sys.executable, "-c", script, "ingest", *command], **popen)
    deadline = time.monotonic() + 120
    while len(list(store.parent.glob(f".{store.name}.partial-*.run/done/shard-*.json"))) < shards:
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(how)
    return process


@pytest.mark.parametrize("images", [PIXELS, OWN_SIZES_CAPPED])
def test_a_killed_ingest_leaves_no_store_and_resume_gives_the_uninterrupted_store(source, tmp_path, images):
    store = tmp_path / "t.zarr"
    _stop_part_way(source, store, shards=2, images=images).wait()
    assert not store.exists()
    run = next(tmp_path.glob(".t.zarr.partial-*.run"))
    assert len(list((run / "done").glob("shard-*.json"))) < 8  # killed part-way: shards were left to do

    from outcore.cli import main

    assert main(["ingest", *_ingest_command(source, store, "--resume", images=images)]) == 0
    resumed = outcore.open_dataset(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.zarr", "t.zarr.skipped.txt"]  # leftovers gone
    assert main(["ingest", *_ingest_command(source, tmp_path / "u.zarr", images=images)]) == 0
    uninterrupted = outcore.open_dataset(tmp_path / "u.zarr")
    assert _without_times(resumed) == _without_times(uninterrupted) and resumed.attrs.skipped["count"] == 1
    assert resumed.array_names() == uninterrupted.array_names()
    for name in resumed.array_names():  # every array as stored: pixels, or files, their ranges and shapes
        np.testing.assert_array_equal(resumed.array(name)[:], uninterrupted.array(name)[:], err_msg=name)


def test_the_next_run_removes_what_a_killed_one_left_and_says_so(source, tmp_path):
    store = tmp_path / "t.zarr"
    _stop_part_way(source, store).wait()
    with pytest.warns(OutcoreWarning, match=r"removed what an interrupted ingest .* left behind.*; resume=True "
                                            "continues such a run instead of removing it"):
        outcore.ingest_images(source, store, shape=(16, 16, 3), chunk_size=8, on_error="skip", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.zarr", "t.zarr.skipped.txt"]


def test_the_commands_next_run_says_so_in_its_flag_names(source, tmp_path, capsys):
    store = tmp_path / "t.zarr"
    _stop_part_way(source, store).wait()
    from outcore.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the command shows warnings as lines, which pytest makes errors
        assert main(["ingest", *_ingest_command(source, store)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "left behind" in line]
    assert len(warned) == 1 and warned[0].startswith("outcore ingest: warning: removed what an interrupted ingest of")
    assert warned[0].endswith("; --resume continues such a run instead of removing it"), warned[0]


def test_resume_with_other_files_or_settings_starts_again(source, tmp_path):
    store = tmp_path / "t.zarr"
    _stop_part_way(source, store).wait()
    manifest = json.loads(next(tmp_path.glob(".t.zarr.partial-*.run/manifest.json")).read_text())
    with pytest.warns(OutcoreWarning, match="removed what an interrupted ingest"):
        ds = outcore.ingest_images(source, store, shape=(16, 16, 3), chunk_size=8, on_error="skip", seed=1,
                                   resume=True, progress=False)  # another seed: another store, nothing to resume
    assert manifest["fingerprint"] and ds.attrs.seed == 1 and len(ds) == 450


def test_resume_of_a_finished_store_returns_it_saying_so(source, tmp_path, capsys):
    """A kill that landed after the commit, or the command run twice: the store made by the same files,
    labels and settings is returned as it is, not refused for want of --overwrite."""
    from outcore.cli import main

    store = tmp_path / "t.zarr"
    assert main(["ingest", *_ingest_command(source, store)]) == 0
    made = store.stat().st_ino, outcore.open_dataset(store).attrs.generation
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the command shows warnings as lines, which pytest makes errors
        assert main(["ingest", *_ingest_command(source, store, "--resume")]) == 0
    assert capsys.readouterr().err.strip() == (f"outcore ingest: warning: {store} is already complete (an ingest of "
                                               "the same files, labels and settings finished it): nothing to resume")
    assert (store.stat().st_ino, outcore.open_dataset(store).attrs.generation) == made  # untouched
    with pytest.warns(OutcoreWarning, match="already complete"):
        ds = outcore.ingest_images(source, store, shape=(16, 16, 3), chunk_size=8, on_error="skip", resume=True,
                                   progress=False)
    assert len(ds) == 450 and ds.attrs.generation == made[1]


def test_resume_of_a_store_another_ingest_made_says_what_differs(source, tmp_path):
    store = tmp_path / "t.zarr"
    outcore.ingest_images(source, store, shape=(16, 16, 3), chunk_size=8, on_error="skip", progress=False)
    with pytest.raises(StoreExistsError, match=r"not made by this ingest \(seed was 0, now 1; shape was \(16, 16, "
                                               r"3\), now \(12, 12, 3\)\).*pass overwrite=True"):
        outcore.ingest_images(source, store, shape=(12, 12, 3), chunk_size=8, on_error="skip", seed=1, resume=True,
                              progress=False)
    (source / "a" / "extra.jpg").write_bytes((source / "a" / next(iter(sorted(os.listdir(source / "a"))))).read_bytes())
    try:
        with pytest.raises(StoreExistsError, match=r"451 files then, 452 now"):
            outcore.ingest_images(source, store, shape=(16, 16, 3), chunk_size=8, on_error="skip", resume=True,
                                  progress=False)
    finally:
        (source / "a" / "extra.jpg").unlink()
    outcore.from_arrays({"x": np.arange(3)}, tmp_path / "arrays.zarr", progress=False)
    with pytest.raises(StoreExistsError, match="it records no manifest of an ingest like this one"):
        outcore.ingest_images(source, tmp_path / "arrays.zarr", shape=(16, 16, 3), resume=True, progress=False)


LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))
from outcore.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_write_the_system_refuses_is_one_line_and_leaves_nothing(source, tmp_path):
    store = tmp_path / "t.zarr"
    result = subprocess.run([sys.executable, "-c", LIMITED, "ingest", *_ingest_command(source, store)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "outcore ingest: error: [Errno 27] writing the store" in line
    assert f"Nothing was left at {store}" in line
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_ends_quietly_and_keeps_the_shards_for_resume(source, tmp_path):
    store = tmp_path / "t.zarr"
    process = _stop_part_way(source, store, how=signal.SIGINT, stderr=subprocess.PIPE, text=True)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == ("outcore ingest: interrupted (the shards written so far are kept: the "
                                            "same command with --resume continues)")
    assert "Traceback" not in err and not store.exists()
    from outcore.cli import main

    assert main(["ingest", *_ingest_command(source, store, "--resume")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.zarr", "t.zarr.skipped.txt"]


UNSTOPPABLE_INGEST = """
import outcore.ingest.scheduler as scheduler

def stop_starting(self):  # as a cluster's cancel fails once the cluster is gone
    raise RuntimeError("the scheduler at tcp://127.0.0.1:1 is gone")

scheduler._ProgressCallback.stop_starting = stop_starting
""" + SLOW_INGEST


def test_a_ctrl_c_whose_stop_fails_says_so_in_its_one_line(source, tmp_path):
    """Where the stop a Ctrl-C starts fails, the command's one line says that the tasks started may still run."""
    store = tmp_path / "t.zarr"
    process = _stop_part_way(source, store, how=signal.SIGINT, script=UNSTOPPABLE_INGEST, stderr=subprocess.PIPE,
                             text=True)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == (
        "outcore ingest: interrupted (the shards written so far are kept: the same command with --resume continues); "
        "outcore could not stop the ingest's tasks (RuntimeError: the scheduler at tcp://127.0.0.1:1 is gone); those "
        "started may still run")
    assert "Traceback" not in err and not store.exists()


def _start_command(source, store) -> subprocess.Popen:
    """The command's ingest of ``source`` into ``store``, started as from a terminal (`start_command`)."""
    return start_command(["ingest", *_ingest_command(source, store)])


SWALLOWING_COMMAND = """
import signal, sys, time, types, weakref, outcore_command

class Thing:
    pass

def lost_here(_):  # a weakref callback: Python only reports what it raises (as for importlib's module locks)
    signal.raise_signal(signal.SIGINT)
    for _ in range(1000):  # the handler runs here
        pass

def command():
    thing = Thing()
    ref = weakref.ref(thing, lost_here)
    del thing
    time.sleep(30)  # the Ctrl-C is delivered again here
    return 0

sys.modules["outcore.cli.main"] = types.SimpleNamespace(main=command)
sys.exit(outcore_command.main())
"""


def test_a_ctrl_c_landing_where_python_only_reports_exceptions_is_delivered_again():
    """A Ctrl-C whose KeyboardInterrupt is raised in a weakref callback (Python prints "Exception ignored"
    and goes on) still stops the command: one line, 130, at once."""
    started = time.monotonic()
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", SWALLOWING_COMMAND], capture_output=True, text=True,
                                timeout=60, check=False)
    assert (result.returncode, result.stderr) == (130, "outcore: interrupted\n")
    assert time.monotonic() - started < 20


LOST_ON_IMPORT_COMMAND = """
import builtins, signal, sys, types, weakref

class Thing:
    pass

def lost_here(_):  # as an import's module-lock callback: Python only reports what it raises
    signal.raise_signal(signal.SIGINT)  # Python's own handler: outcore_command is being imported
    for _ in range(1000):  # the handler runs here
        pass

real_import = builtins.__import__

def importing(name, *args, **kwargs):
    if name == "gc" and sys._getframe(1).f_globals.get("__name__") == "outcore_command":
        thing = Thing()
        ref = weakref.ref(thing, lost_here)
        del thing
    return real_import(name, *args, **kwargs)

def command():
    print("the command ran")
    return 0

builtins.__import__ = importing
sys.modules["outcore.cli.main"] = types.SimpleNamespace(main=command)
import outcore_command
sys.exit(outcore_command.main())
"""


def test_a_ctrl_c_lost_while_the_command_module_is_imported_stops_the_command():
    """A Ctrl-C as the command's module is imported, before its ``main`` takes Ctrl-C, whose KeyboardInterrupt is
    raised in a module lock's callback (Python prints "Exception ignored" and goes on), still stops the command:
    one line, 130, the command not run."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", LOST_ON_IMPORT_COMMAND], capture_output=True, text=True,
                                timeout=60, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "outcore: interrupted\n")


HANDLER_INSTALLED_COMMAND = """
import signal, sys, types, outcore_command

def installed(signum, handler, install=signal.signal):  # a Ctrl-C that comes as main installs its handler
    previous = install(signum, handler)
    if handler is outcore_command._first_interrupt:
        signal.raise_signal(signal.SIGINT)  # taken as the call returns: by the handler just installed
    return previous

signal.signal = installed
sys.modules["outcore.cli.main"] = types.SimpleNamespace(main=lambda: print("the command ran") or 0)
sys.exit(outcore_command.main())
"""


def test_a_ctrl_c_as_the_command_installs_its_handler_is_one_line_and_130():
    """Python runs the handler of a Ctrl-C that comes while ``main`` installs it as the installing call returns:
    its KeyboardInterrupt is the command's (one line, 130), not a traceback (seen once in CI, on Python 3.13)."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", HANDLER_INSTALLED_COMMAND], capture_output=True, text=True,
                                timeout=60, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "outcore: interrupted\n")


CALLED_COMMAND = """
import signal, sys, types, outcore_command

def profile(frame, event, arg):  # a Ctrl-C as main is called: Python takes it as main starts, before its first line
    if event == "call" and frame.f_code is outcore_command.main.__code__:
        sys.setprofile(None)
        signal.raise_signal(signal.SIGINT)  # Python's own handler: main has not installed the command's

sys.modules["outcore.cli.main"] = types.SimpleNamespace(main=lambda: print("the command ran") or 0)
sys.setprofile(profile)
sys.exit(outcore_command.main())
"""


def test_a_ctrl_c_as_main_is_called_is_one_line_and_130():
    """A Ctrl-C that Python takes as ``main`` starts, before its ``try`` (Python checks for signals there), escapes
    ``main`` as Python's own ``KeyboardInterrupt``: still the command's, one line and 130, not a traceback (seen
    once in CI, on Python 3.11: the Ctrl-C at 0.01 of the command's time)."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", CALLED_COMMAND], capture_output=True, text=True, timeout=60,
                                check=False)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "outcore: interrupted\n")


ENDED_COMMAND = """
import signal, sys, types, outcore_command

def shut_down(shut_down=outcore_command._shut_down_quickly):  # a Ctrl-C that comes as main ends, past its try
    signal.raise_signal(signal.SIGINT)  # taken by the first call main makes there
    shut_down()

outcore_command._shut_down_quickly = shut_down
sys.modules["outcore.cli.main"] = types.SimpleNamespace(main=lambda: print("the command ran") or 0)
sys.exit(outcore_command.main())
"""


def test_a_ctrl_c_as_the_command_ends_is_one_line_and_130():
    """A first Ctrl-C that comes once the command is done, as ``main`` leaves the block that takes its
    KeyboardInterrupt: one line, 130, not a traceback."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", ENDED_COMMAND], capture_output=True, text=True, timeout=60,
                                check=False)
    assert (result.returncode, result.stdout, result.stderr) == (130, "the command ran\n", "outcore: interrupted\n")


REPLACING_COMMAND = """
import signal, sys, types, outcore_command

def command():  # stands for a C extension's import (NumPy's): it reports what broke its own imports off as its error
    try:
        if sys.argv[1] == "ctrl-c":
            signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the handler runs here
            pass
        raise OSError("datetime is missing")
    except BaseException:
        raise ImportError('PyCapsule_Import could not import module "datetime"') from None

sys.modules["outcore.cli.main"] = types.SimpleNamespace(main=command)
sys.exit(outcore_command.main())
"""


SWALLOWED_ON_IMPORT_COMMAND = """
import signal, sys, types, outcore_command

class Importing(types.ModuleType):  # stands for outcore's imports, where the Ctrl-C comes
    def __getattr__(self, name):
        if name != "main":
            raise AttributeError(name)
        try:
            try:
                signal.raise_signal(signal.SIGINT)
                for _ in range(1000):  # the handler runs here
                    pass
            except KeyboardInterrupt:  # a C extension's import reports it as its error (NumPy's)
                raise ImportError('PyCapsule_Import could not import module "datetime"') from None
        except ImportError:  # and a module goes on without it, as one does without an optional module
            pass
        return command

def command():
    print("the command ran")
    return 0

sys.modules["outcore.cli.main"] = Importing("outcore.cli.main")
sys.exit(outcore_command.main())
"""


def test_a_ctrl_c_swallowed_by_the_imports_stops_the_command_before_it_runs():
    """A Ctrl-C while outcore is imported that NumPy's C extension turns into an ``ImportError``, which a module
    then takes for a missing optional module and goes on, still stops the command: one line, 130, not run."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", SWALLOWED_ON_IMPORT_COMMAND], capture_output=True, text=True,
                                timeout=60, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "outcore: interrupted\n")


@pytest.mark.parametrize("cause", ["ctrl-c", "a fault"])
def test_a_ctrl_c_that_the_code_it_broke_off_replaced_with_its_own_error_is_still_one_line_and_130(cause):
    """Ctrl-C while NumPy's C extension imports ``datetime``: NumPy reports an ``ImportError`` instead of the
    ``KeyboardInterrupt``. That is still the Ctrl-C (one line, 130); the same error without a Ctrl-C is a fault,
    its traceback shown."""
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", REPLACING_COMMAND, cause], capture_output=True, text=True,
                                timeout=60, check=False)
    if cause == "ctrl-c":
        assert (result.returncode, result.stderr) == (130, "outcore: interrupted\n")
    else:
        assert result.returncode == 1 and result.stderr.strip().endswith(
            'ImportError: PyCapsule_Import could not import module "datetime"'), result.stderr


ENDING_COMMAND = """
import atexit, gc, sys, types, outcore_command

class Finishing:  # stands for what finishes its work as it is freed (a temporary folder's removal, say)
    def __del__(self):
        with open(sys.argv[1], "w") as out:
            out.write("finished")

class Importing(types.ModuleType):  # stands for outcore's imports
    def __getattr__(self, name):
        if name != "main":
            raise AttributeError(name)
        print("imported with the collector " + ("on" if gc.isenabled() else "off"))
        return command

def command():
    started = gc.get_freeze_count()  # the imports' objects, frozen before the command runs
    print("imports frozen" if started else "imports not frozen")
    print("run with the collector " + ("on" if gc.isenabled() else "off"))
    cycle = [Finishing()]
    cycle.append(cycle)  # garbage once the command returns, freed only by the collector
    kept.append([])  # alive once the command returns: frozen with the rest
    atexit.register(lambda: print("frozen" if gc.get_freeze_count() > started else "not frozen"))
    return 3

kept = []

sys.modules["outcore.cli.main"] = Importing("outcore.cli.main")
sys.exit(outcore_command.main())
"""


def test_a_command_ends_without_the_collectors_passes_and_finishes_what_its_garbage_holds(tmp_path):
    """What the imports made (with the collector off) is frozen before the command runs (with it on), so that the
    collector's full passes do not pass over it; once the command is done, what is alive is frozen, so that the interpreter's shutdown does not pass over the
    imported modules' objects looking for cycles; what is garbage then is collected first, its finalizers run."""
    finished = tmp_path / "finished.txt"
    result = subprocess.run([sys.executable, "-c", ENDING_COMMAND, str(finished)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert (result.returncode, result.stderr) == (3, "")
    assert result.stdout == ("imported with the collector off\nimports frozen\nrun with the collector on\n"
                             "frozen\n")
    assert finished.read_text() == "finished"


@pytest.fixture(scope="module")
def command_seconds(source, tmp_path_factory):
    """How long the whole command takes here, start-up included."""
    started = time.monotonic()
    process = _start_command(source, tmp_path_factory.mktemp("timed") / "t.zarr")
    assert process.wait(timeout=120) == 0, process.stderr.read()
    process.stderr.close()
    return time.monotonic() - started


@pytest.mark.parametrize("moment", [0.0, 0.01, 0.03, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.85, 0.92, 0.97, 1.0])
def test_ctrl_c_at_any_instant_of_the_command_is_one_line_and_130(source, tmp_path, command_seconds, moment):
    """From the interpreter's start-up (importing outcore takes a second or more) to the end of the
    ingest, a Ctrl-C at ``moment`` of the command's time is one line on stderr and exit status 130, never
    a traceback; before Python takes Ctrl-C and once it has given it back (its last instants, the work
    done), the process ends by the signal (a shell says 130), silently; in the interpreter's own start-up,
    what CPython does there (`outcore.testing.interrupts.outcome`)."""
    process = _start_command(source, tmp_path / "t.zarr")
    time.sleep(moment * command_seconds)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"the command had not ended 120 s after Ctrl-C (its cleanup has {CLEANUP_SECONDS:g} s)")
    ended = outcome(process.returncode, err)
    assert ended in OUTCOMES, f"{ended}: {err}"
    assert ended != "finished" or moment >= 0.6, err  # it finished first (the time measured varies: it may end sooner)


INTERRUPTED_AS_A_LOCK_IS_TAKEN = """
import concurrent.futures, os, signal, sys

add_done_callback = concurrent.futures.Future.add_done_callback
sent = []

def interrupted_as_the_lock_is_taken(future, callback):  # dask's scheduler, giving a task's future its queue's put
    future._condition.acquire()  # what `with future._condition:` does first (Condition.__enter__)
    if not sent and getattr(callback, "__name__", "") == "put" and future._state in ("PENDING", "RUNNING"):
        sent.append(True)  # one Ctrl-C (a second ends the command at once, without its line)
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C now (to the process, as a terminal's): on the main thread,
        # its KeyboardInterrupt is raised here
    future._condition.release()
    return add_done_callback(future, callback)

concurrent.futures.Future.add_done_callback = interrupted_as_the_lock_is_taken
"""

THROUGH_THE_COMMAND = """
import outcore_command
outcore_command.CLEANUP_SECONDS = {seconds}
sys.exit(outcore_command.main())
"""

THROUGH_PYTHON = """
import outcore
try:
    outcore.ingest_images(sys.argv[1], sys.argv[2], shape=(16, 16, 3), chunk_size=8, on_error="skip", progress=False)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""


def test_a_ctrl_c_whose_stop_fails_goes_on_as_itself_naming_the_failure():
    """The stop a Ctrl-C starts may fail (a cluster gone as the client cancels): the ``KeyboardInterrupt`` goes on
    at once, not replaced by that error, and its note says the tasks may still run."""
    from outcore.ingest.scheduler import _waited

    release = threading.Event()

    def stop() -> None:
        raise RuntimeError("the scheduler at tcp://127.0.0.1:1 is gone")

    interrupt = threading.Timer(0.3, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    interrupt.start()
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            _waited(lambda: [release.wait(30)], stop)
    finally:
        release.set()
        interrupt.join(10)
    assert time.monotonic() - began < 10  # not after the scheduler's thread, which the stop could not end
    assert caught.value.__notes__ == [("outcore could not stop the ingest's tasks (RuntimeError: the scheduler at "
                                       "tcp://127.0.0.1:1 is gone); those started may still run")]


def test_a_ctrl_c_as_the_scheduler_takes_a_lock_ends_the_ingest_at_once(source, tmp_path):
    """A Ctrl-C whose ``KeyboardInterrupt`` Python raises in ``Condition.__enter__``, once its lock is taken (as in
    ``Future.add_done_callback``, as dask's scheduler hands an ingest's tasks to its threads), left that lock taken
    when the scheduler ran on the main thread: the task's thread then waited for it for ever as it ended, and so did
    the cleanup (seen once in CI, on Python 3.13: the command never ended). The scheduler now runs on a thread of its
    own, where no ``KeyboardInterrupt`` is raised: the command ends with its own line (its cleanup's time limit set
    far beyond the test's), and a call from Python gets its ``KeyboardInterrupt``; each store is then finished by the
    same call with ``resume`` (``--resume``)."""
    store = tmp_path / "t.zarr"
    started = time.monotonic()
    with as_from_a_terminal():
        command = subprocess.run([sys.executable, "-c", INTERRUPTED_AS_A_LOCK_IS_TAKEN + THROUGH_THE_COMMAND.format(
            seconds=1000), "ingest", *_ingest_command(source, store)], capture_output=True, text=True, timeout=120,
            check=False)
        call = subprocess.run([sys.executable, "-c", INTERRUPTED_AS_A_LOCK_IS_TAKEN + THROUGH_PYTHON, str(source),
                               str(tmp_path / "p.zarr")], capture_output=True, text=True, timeout=120, check=False)
    said = "outcore ingest: interrupted (the shards written so far are kept: the same command with --resume continues)\n"
    assert (command.returncode, command.stderr) == (130, said)
    assert (call.returncode, call.stdout, call.stderr) == (0, "KeyboardInterrupt\n", "")
    assert time.monotonic() - started < 100 and not store.exists() and not (tmp_path / "p.zarr").exists()
    from outcore.cli import main

    assert main(["ingest", *_ingest_command(source, store, "--resume")]) == 0
    assert len(outcore.open_dataset(store)) == 450
    ds = outcore.ingest_images(source, tmp_path / "p.zarr", shape=(16, 16, 3), chunk_size=8, on_error="skip",
                               progress=False, resume=True)
    assert len(ds) == 450
    assert sorted(path.name for path in tmp_path.iterdir()) == ["p.zarr", "p.zarr.skipped.txt", "t.zarr",
                                                                "t.zarr.skipped.txt"]  # no run left behind


CLEANUP_NEVER_ENDS = """
import concurrent.futures, threading

concurrent.futures.ThreadPoolExecutor.shutdown = lambda *args, **kwargs: threading.Event().wait()  # a thread that never ends
"""


def test_a_ctrl_c_whose_cleanup_never_ends_ends_the_command_once_it_has_had_its_time(source, tmp_path):
    """The cleanup a first Ctrl-C starts has `outcore_command.CLEANUP_SECONDS`: one that waits for ever (here, for the
    ingest's pool of threads) is cut short then, and the command ends with one line and 130; the same command with
    ``--resume`` then finishes the store, as after a kill."""
    store = tmp_path / "t.zarr"
    started = time.monotonic()
    with as_from_a_terminal():
        result = subprocess.run([sys.executable, "-c", INTERRUPTED_AS_A_LOCK_IS_TAKEN + CLEANUP_NEVER_ENDS +
                                 THROUGH_THE_COMMAND.format(seconds=2), "ingest", *_ingest_command(source, store)],
                                capture_output=True, text=True, timeout=120, check=False)
    said = "outcore: interrupted (its cleanup had not ended 2 s after Ctrl-C: ended without it; the same command takes " \
        "over what it left)\n"
    assert (result.returncode, result.stderr) == (130, said)
    assert outcome(result.returncode, result.stderr) == "one line, 130"
    assert time.monotonic() - started < 60 and not store.exists()
    from outcore.cli import main

    assert main(["ingest", *_ingest_command(source, store, "--resume")]) == 0
    assert len(outcore.open_dataset(store)) == 450
    assert sorted(path.name for path in tmp_path.iterdir()) == ["t.zarr", "t.zarr.skipped.txt"]  # no run left


def test_the_manifest_lists_the_files_as_json_dumps_would(tmp_path):
    """A resumed run compares fingerprints of the files' JSON listing (index, path, size, time), written a file
    at a time without a list each (`_files_json`): the very text of ``json.dumps`` for any path, so that a run
    interrupted by one outcore is resumed by another."""
    paths = ["plain.jpg", 'quote"d.jpg', "back\\slash.jpg", "caf\u00e9/\u732b.jpg", "emoji\U0001f408.jpg", "tab\t.jpg",
             "line\nbreak.jpg", "", np.str_("numpy/str.jpg")]
    stats = np.array([[i * 1000 + 7, 1_700_000_000_123_456_789 + i] for i in range(len(paths))], np.int64)
    listed = [[j, path, [int(size), int(time)]] for j, (path, (size, time)) in enumerate(zip(paths, stats, strict=True))]
    assert _files_json(paths, stats) == json.dumps(listed)
    assert _files_json([], np.zeros((0, 2), np.int64)) == json.dumps([])
