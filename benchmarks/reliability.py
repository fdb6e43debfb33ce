"""Trust, measured: killed ingests, damaged stores, hostile stores, a growing store read while it grows,
bad inputs, stores replaced under their readers, disks that fail while read and Ctrl-C at random instants — each
tried for real
(real processes, real SIGKILLs, real files, a fault layer in the C library's calls), counted, in one run.

    python benchmarks/reliability.py [--kills 30] [--soak 20] [--interrupts 100] [--workdir bench-data]

Prints one table per part; docs/reliability.md quotes a run. Every case prints what it found when
something is wrong, so a failure here is a bug report.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zarr

import outcore
from outcore.imaging.synthetic import write_image_folder
from outcore.testing import (
    corrupt_chunk,
    delete_shard,
    make_store,
    rewrite_shard_index,
    shard_key,
    truncate_shard,
)
from outcore.testing.interrupts import OUTCOMES, outcome, start_command

CLI = [sys.executable, "-m", "outcore.cli"]


def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """The ``outcore`` command in a fresh process."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


def clean(result: subprocess.CompletedProcess) -> bool:
    """A clean end: exit 0, 1 (verify found problems) or 2 (one line), and no traceback."""
    return result.returncode in (0, 1, 2) and "Traceback" not in result.stderr and (
        result.returncode != 2 or len(result.stderr.strip().splitlines()) == 1)


# -- 1. killed ingests --------------------------------------------------------------------------------------


def kills(workdir: Path, count: int) -> list[str]:
    source = workdir / "kill-src"
    if not source.exists():
        write_image_folder(source, 500, classes=("a", "b", "c", "d"), size=(48, 48), kind="photos", seed=5)
    options = ["--shape", "32x32x3", "--chunk-size", "16", "--no-progress"]
    reference = {}
    for suffix in (".zarr", ".zarr.zip"):
        target = workdir / f"kill-reference{suffix}"
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        began = time.perf_counter()
        assert run(["ingest", str(source), str(target), *options]).returncode == 0
        reference[suffix] = (outcore.open_dataset(target), time.perf_counter() - began)
    tally, rng, trial = Counter(), random.Random(0), 0
    while tally["killed"] < count and trial < 3 * count:  # a run that finished before its kill does not count
        trial += 1
        suffix = rng.choice([".zarr", ".zarr.zip"])
        overwrite = rng.random() < 0.5
        api = rng.random() < 0.5
        folder = workdir / f"kill-{trial}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        target = folder / f"t{suffix}"
        if overwrite:  # an old store that must survive the kill whole
            outcore.from_arrays({"x": np.arange(77)}, target, progress=False)
        command = ([sys.executable, "-c", ("import sys, outcore; outcore.ingest_images(sys.argv[1], sys.argv[2], "
                    "shape=(32, 32, 3), chunk_size=16, overwrite=True, progress=False)"), str(source), str(target)]
                   if api else [*CLI, "ingest", str(source), str(target), *options, "--overwrite"])
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 0.3 + 0.9 * reference[suffix][1]))  # start-up, then anywhere in the work
        process.send_signal(signal.SIGKILL)
        process.wait()
        tally["killed" if process.returncode == -signal.SIGKILL else "finished before the kill"] += 1
        if target.exists():
            ds = outcore.open_dataset(target)
            fine = len(ds) == 77 if ds.fields == ("x", "source_index") else _same(ds, reference[suffix][0])
            tally["target: old store whole" if ds.fields == ("x", "source_index") else "target: new store whole"] += 1
            tally["SILENT LOSS"] += not fine
        else:
            tally["target: absent (no store yet)"] += 1
            tally["SILENT LOSS"] += overwrite  # the old store must never vanish
        resume = rng.random() < 0.5
        next_run = run(["ingest", str(source), str(target), *options, "--overwrite", *(["--resume"] if resume else [])])
        tally["next run ok"] += next_run.returncode == 0
        tally["said it cleaned up"] += "removed what an interrupted ingest" in next_run.stderr
        leftovers = [p.name for p in folder.iterdir() if p.name != target.name]
        tally["LEFTOVERS after the next run"] += bool(leftovers)
        identical = _same(outcore.open_dataset(target), reference[suffix][0])
        tally["next run's store identical to an uninterrupted one"] += identical
        tally["resumed"] += resume
        shutil.rmtree(folder)
    return [f"{key:55s} {value}" for key, value in sorted(tally.items())]


def _same(a: outcore.Dataset, b: outcore.Dataset) -> bool:
    return a.fields == b.fields and len(a) == len(b) and all(
        np.array_equal(a[name].compute(), b[name].compute()) for name in a.fields)


# -- 2. damaged stores --------------------------------------------------------------------------------------


def _folder_for_shard(location: str, field: str, shard: int) -> None:
    path = Path(location) / shard_key(location, field, shard)
    path.unlink()
    path.mkdir()


def _damage_json(location: str, name: str) -> None:
    (Path(location) / name / "zarr.json").write_text('{"zarr_format": 3, "node_')


def _truncate_file(location: str) -> None:
    with open(location, "r+b") as file:
        file.truncate(file.seek(0, 2) // 2)


DAMAGE: dict[str, tuple[tuple[str, ...], Callable[[str], object]]] = {
    "byte flipped in a chunk": (("directory", "zip"), lambda s: corrupt_chunk(s, "images", 3)),
    "shard truncated to 0 bytes": (("directory", "zip"), lambda s: truncate_shard(s, "images", 1, 0)),
    "shard truncated to 3 bytes": (("directory", "zip"), lambda s: truncate_shard(s, "labels", 1, 3)),
    "shard truncated to 10 bytes": (("directory", "zip"), lambda s: truncate_shard(s, "score", 1, 10)),
    "shard truncated to half": (("directory", "zip"), lambda s: truncate_shard(s, "images", 2, 1500)),
    "shard deleted": (("directory", "zip"), lambda s: delete_shard(s, "labels", 2)),
    "shard index pointing two chunks at one": (("directory", "zip"), lambda s: rewrite_shard_index(
        s, "images", 0, lambda index: index.__setitem__(1, index[0]))),
    "shard index entry of 2**40 bytes": (("directory", "zip"), lambda s: rewrite_shard_index(
        s, "images", 0, lambda index: index.__setitem__((1, 1), 2**40))),
    "a folder where a shard should be": (("directory",), lambda s: _folder_for_shard(s, "score", 0)),
    "damaged zarr.json of an array": (("directory",), lambda s: _damage_json(s, "labels")),
    "damaged zarr.json of the group": (("directory",), lambda s: _damage_json(s, "")),
    "zip file cut in half": (("zip",), _truncate_file),
}


def damages(workdir: Path) -> list[str]:
    rows, tally = [], Counter()
    for what, (kinds, damage) in DAMAGE.items():
        for kind in kinds:
            folder = workdir / "damaged"
            shutil.rmtree(folder, ignore_errors=True)
            ds = make_store(folder, kind=kind, chunk_size=8)
            damage(ds.location)
            verified, read = run(["verify", ds.location, "--no-progress"]), _read_all(ds.location)
            info = run(["info", ds.location])  # reads no chunk: only a missing file or damaged metadata is its to see
            detected = verified.returncode != 0 and read.returncode == 2
            named = _names_the_place(verified) and _names_the_place(read)
            tracebacks = sum(not clean(r) for r in (verified, read, info))
            tally.update(detected=detected, named=named, tracebacks=tracebacks, cases=1)
            rows.append(f"{what:42s} {kind:9s} detected: {'yes' if detected else 'NO'}  "
                        f"named: {'yes' if named else 'NO'}  tracebacks: {tracebacks}  (info exit {info.returncode})")
    rows.append(f"{tally['cases']} damaged stores: detected {tally['detected']}, named {tally['named']}, "
                f"tracebacks {tally['tracebacks']}")
    return rows


def _read_all(location: str) -> subprocess.CompletedProcess:
    """Every field through the dask view and a shuffled epoch, in a fresh process; exit 2 on an outcore error."""
    code = ("import sys, outcore\n"
            "try:\n"
            "    ds = outcore.open_dataset(sys.argv[1])\n"
            "    [ds[f].compute() for f in ds.fields]\n"
            "    [b for b in ds.batches(16)]\n"
            "except outcore.OutcoreError as error:\n"
            "    print(error, file=sys.stderr); sys.exit(2)\n")
    return subprocess.run([sys.executable, "-c", code, location], capture_output=True, text=True, check=False)


def _names_the_place(result: subprocess.CompletedProcess) -> bool:
    text = result.stdout + result.stderr
    return any(word in text for word in ("field '", "array '", "zip file", "metadata cannot be read", "shard file"))


# -- 3. hostile stores --------------------------------------------------------------------------------------


def _attrs(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        meta = json.loads((path / "zarr.json").read_text())
        change(meta["attributes"]["outcore"])
        (path / "zarr.json").write_text(json.dumps(meta))
    return edit


def _array_meta(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        meta = json.loads((path / name / "zarr.json").read_text())
        change(meta)
        (path / name / "zarr.json").write_text(json.dumps(meta))
    return edit


def _resize_all(samples: int) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        group = zarr.open_group(path, mode="r+")
        for name in ("images", "labels", "score", "name", "id"):
            group[name].resize((samples, *group[name].shape[1:]))
        _attrs(lambda a: a.__setitem__("num_samples", samples))(path)
    return edit


def _set(key: str, value: object) -> Callable[[Path], None]:
    return _attrs(lambda a: a.__setitem__(key, value))


def _field(field: str, key: str, value: object) -> Callable[[Path], None]:
    return _attrs(lambda a: a["fields"][field].__setitem__(key, value))


def _sharding(name: str, key: str, value: object) -> Callable[[Path], None]:
    return _array_meta(name, lambda m: m["codecs"][0]["configuration"].__setitem__(key, value))


HOSTILE: dict[str, Callable[[Path], None]] = {
    "format_version 0": _set("format_version", 0),
    "format_version 99": _set("format_version", 99),
    "format_version '1'": _set("format_version", "1"),
    "no format_version": _attrs(lambda a: a.pop("format_version")),
    "num_samples -5": _set("num_samples", -5),
    "num_samples 1999.7": _set("num_samples", 1999.7),
    "num_samples true": _set("num_samples", True),
    "num_samples '300'": _set("num_samples", "300"),
    "num_samples 2e9, arrays as claimed": _resize_all(2_000_000_000),
    "num_samples 2**60": _set("num_samples", 2**60),
    "chunk_size 0": _set("chunk_size", 0),
    "chunk_size 7 (arrays say 32)": _set("chunk_size", 7),
    "chunk_size 2**40": _set("chunk_size", 2**40),
    "fields {}": _set("fields", {}),
    "fields a list": _set("fields", ["images"]),
    "fields null": _set("fields", None),
    "a field without its array": _attrs(lambda a: a["fields"].__setitem__("ghost", {"role": "input"})),
    "role 'boss'": _field("labels", "role", "boss"),
    "classes a string": _field("labels", "classes", "abc"),
    "classes of numbers": _field("labels", "classes", [1, 2, 3]),
    "encoding 'base64'": _field("images", "encoding", "base64"),
    "text encoding on a float field": _field("score", "encoding", "utf-8"),
    "image encoding without decode": _field("images", "encoding", "image"),
    "decode shape (-1, 5)": _attrs(lambda a: a["fields"]["images"].update(
        encoding="image", decode={"shape": [-1, 5], "dtype": "uint8"})),
    "seed 'zero'": _set("seed", "zero"),
    "shuffled_on_write 'yes'": _set("shuffled_on_write", "yes"),
    "provenance a list": _set("provenance", [1]),
    "attributes a list": lambda p: (p / "zarr.json").write_text(json.dumps(
        {**json.loads((p / "zarr.json").read_text()), "attributes": {"outcore": [1, 2]}})),
    "pickle codec in a field": _array_meta("labels", lambda m: m["codecs"][0]["configuration"]["codecs"].insert(
        1, {"name": "numcodecs.pickle"})),
    "vlen-utf8 data type": _array_meta("name", lambda m: m.__setitem__("data_type", "string")),
    "object data type (v2 style)": _array_meta("id", lambda m: m.__setitem__("data_type", "|O")),
    "labels retyped to float64": _array_meta("labels", lambda m: m.__setitem__("data_type", "float64")),
    "chunk shape 2**31 samples": _sharding("images", "chunk_shape", [2**31, 8, 8, 3]),
    "chunks across the sample shape": _sharding("images", "chunk_shape", [32, 4, 8, 3]),
    "array shape shorter than num_samples": _array_meta("score", lambda m: m.__setitem__("shape", [10, 2])),
    "shard index entry of 2**40 bytes": lambda p: rewrite_shard_index(p, "images", 0, lambda index: index.__setitem__(
        (0, 1), 2**40)),
    "shard index pointing chunk 1 at chunk 0": lambda p: rewrite_shard_index(
        p, "images", 0, lambda index: index.__setitem__(1, index[0])),
    "shard index offset beyond the file": lambda p: rewrite_shard_index(
        p, "labels", 0, lambda index: index.__setitem__((0, 0), 2**50)),
    "a shard index of zeros": lambda p: rewrite_shard_index(p, "score", 0, lambda index: index.fill(0)),
    "text field made 1-D": _array_meta("name", lambda m: m.update(shape=[300], dimension_names=["sample"])),
    "group zarr.json of 10 MB of nesting": lambda p: (p / "zarr.json").write_text("[" * 5_000_000),
}


def hostile(workdir: Path) -> list[str]:
    rows, outcomes, peaks = [], Counter(), []
    for what, edit in HOSTILE.items():
        folder = workdir / "hostile"
        shutil.rmtree(folder, ignore_errors=True)
        ds = make_store(folder, chunk_size=8)
        edit(Path(ds.location))
        opened = _open_and_read(ds.location)
        lines = opened.stderr.strip().splitlines()
        verdict = ("refused" if opened.returncode == 2 and len(lines) == 1 else
                   "read, all correct" if opened.returncode == 0 else
                   "READ WRONG DATA" if opened.returncode == 3 else "FAILED")
        peak = int(opened.stdout.split()[-1]) / 1024 if opened.returncode in (0, 2) else float("nan")
        peaks.append(peak)
        outcomes[verdict] += 1
        rows.append(f"{what:42s} {verdict:18s} {peak:5.0f} MiB  {(lines or [''])[-1][:100]}")
    rows.append(f"{len(HOSTILE)} hostile stores: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
                + f"; peak memory {min(peaks):.0f}-{max(peaks):.0f} MiB")
    return rows


def _open_and_read(location: str) -> subprocess.CompletedProcess:
    """Open, read every field and one epoch under a 1 GiB data limit; print the peak RSS (KiB); exit 2 and
    one line on an outcore error, 3 on wrong data; anything else is a failure."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_DATA, (2**30, 2**30))\n"
            "import numpy as np, outcore\n"
            "from outcore.testing import sample_arrays\n"
            "try:\n"
            "    ds = outcore.open_dataset(sys.argv[1]); repr(ds)\n"
            "    values = {f: ds[f].compute() for f in ds.fields}\n"
            "    expected = sample_arrays()\n"
            "    if set(values) != set(expected) or any(not np.array_equal(values[f], expected[f]) for f in values):\n"
            "        print('WRONG DATA', file=sys.stderr); sys.exit(3)\n"
            "    [b for b in ds.batches(16)]\n"
            "except outcore.OutcoreError as error:\n"
            "    print(error, file=sys.stderr); code = 2\n"
            "else:\n"
            "    code = 0\n"
            "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]); sys.exit(code)\n")
    try:
        return subprocess.run([sys.executable, "-c", code, location], capture_output=True, text=True, timeout=120,
                              check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", "TIMEOUT")


# -- 4. a growing store, read while it grows ----------------------------------------------------------------


GROWING = """
import sys, time
import numpy as np, outcore
with outcore.Writer(sys.argv[1], chunk_size=16) as writer:
    start, end = 0, time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        rows = np.arange(start, start + 37)
        writer.append({"x": np.stack([rows, rows * 2], axis=1), "id": rows})
        writer.flush()
        start += 37
"""

READER = """
import sys, time
import numpy as np, outcore
reads = problems = 0
while time.monotonic() < float(sys.argv[2]):
    try:
        ds = outcore.open_dataset(sys.argv[1])
    except outcore.NotAStoreError:
        continue
    n = len(ds)
    for _ in range(3):
        try:
            x = ds["x"].compute()
            ids = np.concatenate([b["id"] for b in ds.batches(64)] or [np.zeros(0, int)])
            good = np.array_equal(x[:, 0], np.arange(n)) and np.array_equal(x[:, 1], 2 * np.arange(n)) and \\
                np.array_equal(np.sort(ids), np.arange(n))
        except Exception as error:
            print("ERROR", repr(error), file=sys.stderr)
            good = False
        reads += 1
        problems += not good
print(reads, problems)
"""


def soak(workdir: Path, seconds: float) -> list[str]:
    location = workdir / "growing.zarr"
    shutil.rmtree(location, ignore_errors=True)
    writer = subprocess.Popen([sys.executable, "-c", GROWING, str(location), str(seconds)])
    while not (location / "zarr.json").exists():
        time.sleep(0.01)
    until = time.monotonic() + seconds
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(location), str(until)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [reader.communicate() for reader in readers]
    writer.wait()
    reads = sum(int(out.split()[0]) for out, _ in results)
    problems = sum(int(out.split()[1]) for out, _ in results)
    errors = sorted({line for _, err in results for line in err.splitlines()})[:3]
    return [(f"{seconds:.0f} s, 1 Writer flushing every 37 samples ({len(outcore.open_dataset(location)):,} in the "
            f"end), 4 reader processes: {reads} reads, {problems} not a prefix or failed"), *errors]


# -- 5. bad inputs ------------------------------------------------------------------------------------------


def bad_inputs(workdir: Path) -> list[str]:
    root = workdir / "bad"
    shutil.rmtree(root, ignore_errors=True)
    write_image_folder(root / "photos", 4, classes=("cat", "dog"), size=(16, 16))
    cat = root / "photos" / "cat"
    (cat / "zero.jpg").write_bytes(b"")
    (cat / "text.png").write_text("not a picture")
    (cat / "half.jpg").write_bytes(next(cat.glob("*.jpg")).read_bytes()[:150])
    (root / "empty").mkdir()
    (root / "loose").mkdir()
    write_image_folder(root / "loose", 2, classes=("cat",), size=(16, 16))
    (root / "loose" / "stray.jpg").write_bytes((cat / "cat_000000.jpg").read_bytes())
    names = sorted(p.relative_to(root / "photos").as_posix() for p in (root / "photos").rglob("cat_*.jpg"))
    csvs = {
        "a label column with a stray 'x'": f"path,label\n{names[0]},1\n{names[1]},x\n",
        "a label of 10**30 in an integer column": f"path,label\n{names[0]},1\n{names[1]},{10**30}\n",
        "an unclosed quote": 'path,label\n"a.jpg,1\n',
        "an empty file": "",
        "a missing path column": "file,label\na.jpg,1\n",
        "an empty label cell": f"path,label\n{names[0]},\n",
        "a path that does not exist": "path,label\nnowhere.jpg,1\n",
    }
    rows = []
    for what, text in csvs.items():
        csv = root / "photos" / "labels.csv"
        csv.write_text(text)
        result = run(["ingest", str(csv), str(root / "c.zarr"), "--label-columns", "label", "--shape", "8x8x3",
                      "--no-progress"])
        rows.append(_verdict(f"CSV with {what}", result))
    for what, args in {
        "a folder with a zero-byte, a text and a truncated image": ["ingest", str(root / "photos"),
                                                                     str(root / "p.zarr"), "--shape", "8x8x3"],
        "the same with --on-error skip": ["ingest", str(root / "photos"), str(root / "q.zarr"), "--shape", "8x8x3",
                                          "--on-error", "skip"],
        "an empty folder": ["ingest", str(root / "empty"), str(root / "e.zarr"), "--shape", "8x8x3"],
        "images beside class folders": ["ingest", str(root / "loose"), str(root / "l.zarr"), "--shape", "8x8x3"],
        "a folder that does not exist": ["ingest", str(root / "nowhere"), str(root / "n.zarr"), "--shape", "8x8x3"],
        "a store location below a file": ["ingest", str(root / "photos"), str(cat / "zero.jpg" / "s.zarr"),
                                          "--shape", "8x8x3", "--on-error", "skip"],
    }.items():
        rows.append(_verdict(what, run([*args, "--no-progress"])))
    return rows


def _verdict(what: str, result: subprocess.CompletedProcess) -> str:
    line = (result.stderr.strip().splitlines() or [""])[-1]
    skipped = result.returncode == 0 and "skipped" in result.stdout
    kind = ("one-line error" if result.returncode == 2 and clean(result) else
            "recorded skip" if skipped else "ok" if result.returncode == 0 else "TRACEBACK")
    return f"{what:58s} {kind:15s} {line[:100] if result.returncode else ''}"


# -- 6. stores replaced under their readers ------------------------------------------------------------------


def _numbers(sign: int) -> dict[str, np.ndarray]:
    """Store A holds 0, 1, 2, ...; store B the same negated: a sample of B read as A's shows."""
    return {"y": sign * np.arange(2000), "x": sign * np.ones((2000, 16), np.float32)}


def _copy_file_by_file(target: Path, other: Path) -> None:
    """As rsync does: each file copied to a temporary name beside its target, then renamed over it."""
    for source in sorted(other.rglob("*")):
        if source.is_file():
            path = target / source.relative_to(other)
            shutil.copyfile(source, path.with_name(f".{path.name}.tmp"))
            path.with_name(f".{path.name}.tmp").replace(path)


def _move(target: Path, other: Path) -> None:
    target.rename(target.with_name("old.zarr"))
    shutil.copytree(other, target.with_name("moved.zarr"))
    target.with_name("moved.zarr").rename(target)


REPLACEMENTS: dict[str, Callable[[Path, Path], object]] = {
    "ingest with overwrite=True": lambda target, other: outcore.from_arrays(
        _numbers(-1), target, chunk_size=50, overwrite=True, progress=False),
    "cp -r of another store over it": lambda target, other: subprocess.run(
        ["cp", "-r", f"{other}/.", f"{target}/"], check=True),
    "a file-by-file copy (rsync's renames)": _copy_file_by_file,
    "mv of another store into its place": _move,
}


def replaced(workdir: Path) -> list[str]:
    root = workdir / "replaced"
    rows = []
    for what, replace in REPLACEMENTS.items():
        shutil.rmtree(root, ignore_errors=True)
        other = outcore.from_arrays(_numbers(-1), root / "b.zarr", chunk_size=50, progress=False).location
        ds = outcore.from_arrays(_numbers(1), root / "a.zarr", chunk_size=50, progress=False)
        batches = iter(ds.batches(50, seed=0, prefetch=1, buffer_chunks=2))
        seen = [next(batches)["y"] for _ in range(3)]
        replace(root / "a.zarr", Path(other))
        try:
            seen += [batch["y"] for batch in batches]
            ids = np.concatenate(seen)
            outcome = f"SILENT: {int((ids < 0).sum())} of {len(ids)} samples from the new store"
        except outcore.StoreChangedError as error:
            ids = np.concatenate(seen)
            outcome = f"StoreChangedError after {len(ids)} samples, all of the old store: {str(error)[:60]}..."
            if (ids < 0).any():
                outcome = "WRONG: " + outcome
        rows.append(f"{what:42s} {outcome}")
    return rows


# -- 7. disks that fail while reading ------------------------------------------------------------------------


FAULTY_READ = """
import json, sys, time
import numpy as np
import outcore
started = time.monotonic()
try:
    ds = outcore.open_dataset(sys.argv[1])
    ids = np.concatenate([batch["y"] for batch in ds.batches(100, seed=0)])
    print("exact epoch" if sorted(ids.tolist()) == list(range(len(ds))) else "WRONG SAMPLES",
          f"({time.monotonic() - started:.2f} s)")
except outcore.OutcoreError as error:
    print(type(error).__name__, f"({time.monotonic() - started:.2f} s):", str(error)[:110])
"""


def read_faults(workdir: Path) -> list[str]:
    from outcore.testing.faults import fault_environment, fault_library

    library = fault_library(workdir)
    if library is None:
        return ["skipped: no C compiler to build the fault layer (outcore.testing.faults)"]
    store = outcore.from_arrays(_numbers(1), workdir / "faulty.zarr", chunk_size=100, overwrite=True,
                                progress=False).location
    cases = [("EIO on reads, 3 times", {"error": errno.EIO, "times": 3}),
             ("EAGAIN on reads, 3 times", {"error": errno.EAGAIN, "times": 3}),
             ("ESTALE on reads, 3 times", {"error": errno.ESTALE, "times": 3}),
             ("ESTALE on opens, 3 times", {"error": errno.ESTALE, "on": "open", "times": 3}),
             ("EINTR on reads, 3 times", {"error": errno.EINTR, "times": 3}),
             ("short reads, every read", {"short": True}),
             ("EIO on every read of one shard", {"error": errno.EIO}),
             ("ESTALE on every read of one shard", {"error": errno.ESTALE})]
    rows = []
    for what, faults in cases:
        match = "faulty.zarr/y/c/3" if "one shard" in what else "faulty.zarr/y/c/"
        env = {**dict(os.environ), **fault_environment(library, match, **faults)}
        result = subprocess.run([sys.executable, "-c", FAULTY_READ, store], capture_output=True, text=True, env=env,
                                timeout=120, check=False)
        rows.append(f"{what:36s} {(result.stdout.strip() or 'TRACEBACK ' + result.stderr[-200:])}")
    return rows


# -- 8. full disks, per write path ---------------------------------------------------------------------------


def _frames(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).integers(0, 256, (count, 16, 16, 64), dtype=np.uint8)}  # 16 KiB each


def _fill(disk: Path, leave: int) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as file:
        try:
            file.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))
        except OSError:
            pass
    return filler


def _outcome(attempt: Callable[[], object], kept: Callable[[], str]) -> str:
    try:
        attempt()
        outcome = "no error"
    except outcore.OutcoreError as error:  # its end says what is kept and what to do
        outcome = f"{type(error).__name__}: ...{str(error)[-100:]}"
    except OSError as error:
        outcome = f"RAW {type(error).__name__}: {error}"
    try:
        return f"{outcome} | after: {kept()}"
    except (outcore.OutcoreError, OSError, ValueError) as error:  # what is left cannot be read: say so
        return f"{outcome} | after: UNREADABLE ({type(error).__name__}: {str(error)[:60]})"


def full_disks(workdir: Path) -> list[str]:
    disk = workdir / "disk"
    disk.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        return [f"skipped: a 3 MiB tmpfs cannot be mounted here (needs root): {mounted.stderr.strip()}"]
    rows = []
    try:
        def count(location: Path) -> str:
            if not location.exists():
                return "no store left"
            report = outcore.verify(location, progress=False)
            return f"{len(outcore.open_dataset(location))} samples, verify {'OK' if not report.problems else 'FAILS'}"

        def writer(location: Path, batches: int, flush_first: bool) -> None:
            with outcore.Writer(location, chunk_size=64, append=location.exists()) as w:
                for i in range(batches):
                    w.append(_frames(64, seed=i))
                    if flush_first and i == 0:
                        w.flush()

        filler = _fill(disk, leave=100_000)
        rows.append("Writer, first shard  " + _outcome(lambda: writer(disk / "w.zarr", 1, True),
                                                       lambda: count(disk / "w.zarr")))
        filler.unlink()
        writer(disk / "g.zarr", 1, True)
        filler = _fill(disk, leave=300_000)
        rows.append("Writer, growing      " + _outcome(lambda: writer(disk / "g.zarr", 10, False),
                                                       lambda: count(disk / "g.zarr")))
        filler.unlink()
        shutil.rmtree(disk / "g.zarr", ignore_errors=True)
        photos = workdir / "full-photos"
        shutil.rmtree(photos, ignore_errors=True)
        write_image_folder(photos, 60, classes=("a", "b"), size=(48, 48), kind="photos", seed=1)
        options = {"shape": (40, 40, 3), "chunk_size": 16, "progress": False}
        outcore.ingest_images(photos, disk / "i.zarr", **options)
        for file in write_image_folder(workdir / "full-new", 400, classes=("a", "b"), size=(48, 48), kind="photos",
                                       seed=2):
            file.rename(photos / file.parent.name / f"new_{file.name}")
        rows.append("append               " + _outcome(
            lambda: outcore.ingest_images(photos, disk / "i.zarr", append=True, **options),
            lambda: count(disk / "i.zarr")))
        shutil.rmtree(disk / "i.zarr", ignore_errors=True)
        for file in (photos / "a").glob("new_*"):
            file.unlink()
        for file in (photos / "b").glob("new_*"):
            file.unlink()
        filler = _fill(disk, leave=700_000)
        rows.append("splits               " + _outcome(
            lambda: outcore.ingest_splits(photos, disk / "splits", split={"train": 0.5, "val": 0.5}, **options),
            lambda: ", ".join(f"{p.name}: {count(p)}" for p in sorted((disk / "splits").glob("*.zarr")))))
        filler.unlink()
        shutil.rmtree(disk / "splits", ignore_errors=True)
        cache = outcore.storage.ChunkCache(disk / "cache", max_bytes=10**9)
        filler = _fill(disk, leave=0)

        right = []

        def read_through() -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for i in range(20):
                    value = bytes([i]) * 50_000
                    right.append(bytes(cache.get_or_fetch(f"range-{i}", 50_000, lambda value=value: value)) == value)

        rows.append("node cache           " + _outcome(read_through, lambda: f"{sum(right)} of 20 ranges read right"))
        filler.unlink()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    return rows


# -- 9. Ctrl-C at random instants ----------------------------------------------------------------------------------


def interrupts(workdir: Path, count: int) -> list[str]:
    """``outcore ingest`` of a small folder, Ctrl-C sent at ``count`` random instants of its time (start-up included),
    each outcome counted (`outcore.testing.interrupts.outcome`); one that ran to its end after a Ctrl-C sent in its
    first half, or that ended any other way, is wrong, its stderr shown."""
    source = workdir / "interrupt-src"
    if not source.exists():
        write_image_folder(source, 150, classes=("a", "b", "c"), size=(20, 20), seed=3)

    def started() -> subprocess.Popen:  # into a folder of its own: no run left behind by the last one
        folder = workdir / "interrupted"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        return start_command(["ingest", str(source), str(folder / "t.zarr"), "--shape", "16x16x3", "--chunk-size",
                              "8", "--no-progress"], stdout=subprocess.DEVNULL)

    took = []
    for _ in range(3):  # the median of three whole runs: the first, from cold caches, is slower than the rest
        began = time.perf_counter()
        started().communicate(timeout=300)
        took.append(time.perf_counter() - began)
    seconds = sorted(took)[1]
    rng, counts, wrong = random.Random(0), Counter(), []
    for _ in range(count):
        moment = rng.random()
        process = started()
        time.sleep(moment * seconds)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=300)
        ended = outcome(process.returncode, err)
        if ended == "finished" and moment < 0.5:
            ended = "wrong: ran to its end after a Ctrl-C in its first half"
        counts[ended] += 1
        if ended.startswith("wrong"):
            wrong.append(f"  at {moment:.3f} of {seconds:.2f} s, {ended}: {' | '.join(err.strip().splitlines()[-4:])}")
    rows = [f"{ended:28s} {counts[ended]}" for ended in (*OUTCOMES, *sorted(set(counts) - set(OUTCOMES)))]
    return [*rows, *wrong]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--soak", type=float, default=20.0, help="seconds of the growing-store soak")
    parser.add_argument("--interrupts", type=int, default=100, help="Ctrl-Cs sent to ingests at random instants")
    parser.add_argument("--parts", default="1,2,3,4,5,6,7,8,9", help="which parts to run, comma-separated")
    parser.add_argument("--workdir", default="bench-data")
    args = parser.parse_args()
    workdir = Path(args.workdir) / "reliability"
    workdir.mkdir(parents=True, exist_ok=True)
    parts = [
        (f"1. {args.kills} ingests killed (SIGKILL) at random points, CLI and API, directory and zip", lambda: kills(
            workdir, args.kills)),
        ("2. damaged stores: verify, info and reading, each in a fresh process", lambda: damages(workdir)),
        ("3. hostile stores, each opened and read under a 1 GiB data limit", lambda: hostile(workdir)),
        ("4. a growing store read while it grows", lambda: soak(workdir, args.soak)),
        ("5. bad inputs through the CLI", lambda: bad_inputs(workdir)),
        ("6. stores replaced under a running epoch", lambda: replaced(workdir)),
        ("7. disks that fail while reading (a fault layer loaded with LD_PRELOAD)", lambda: read_faults(workdir)),
        ("8. a disk that fills, per write path (a 3 MiB tmpfs; root)", lambda: full_disks(workdir)),
        (f"9. {args.interrupts} Ctrl-Cs sent to `outcore ingest` at random instants, start-up included",
         lambda: interrupts(workdir, args.interrupts)),
    ]
    for title, part in [parts[int(n) - 1] for n in args.parts.split(",")]:
        began = time.perf_counter()
        rows = part()
        print(f"\n{title} ({time.perf_counter() - began:.0f} s)")
        for row in rows:
            print("  " + row)


if __name__ == "__main__":
    main()
