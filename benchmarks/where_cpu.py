"""Where a loader's CPU time goes, every thread and the kernel's part included: ``perf`` samples a process running a
case of `cores.py` flat out, and each sample is put in outcore's C calls that release the GIL, by what they were
doing (decompressing, checksums, the kernel copying a read's bytes, copies into chunk buffers and the batch, decoding, the kernel
zeroing new pages), in other calls that release it (Python's file calls, OpenSSL's digests: an ingest's), or in
neither: the time that holds the GIL or waits for it (the interpreter and numpy's calls, by Python function where
Python runs with ``-X perf``, 3.12 or newer; the kernel's thread switches, page faults and other calls made there).

    python benchmarks/where_cpu.py [--cases pixels,encoded,ingest] [--threads 16] [--as-cpus 16] [--seconds 8]
                                   [--images 6000] [--workdir bench-data/cores] [--top 12]

`cores.py`'s timed GIL share counts the same time outside outcore's C calls, per thread, but not what it is. Its
py-spy rows (``--only gil``) sample only the thread holding the GIL, a few hundred samples a case. Here every CPU
sample counts, and a new page zeroed inside a copy, or a thread switch after a futex wait, is named for what it is.

Needs ``perf``, allowed to record the process (root, or ``kernel.perf_event_paranoid`` 1 or less), and room for its
samples (DWARF call stacks: a few hundred MB a case, in a temporary folder). Without Python 3.12's ``-X perf``, the
Python functions are not named: the interpreter's time is one line.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from cores import CASES, perf_record, stores

SAMPLES = 8000  # perf's samples of a case, about: its rate a CPU is set to take as many (each a DWARF stack to unwind)
STACK_BYTES = 16384  # of each thread's stack copied with a sample, for perf to unwind (DWARF)
WARM_SECONDS = 4.0  # before the samples: the first epochs make the chunk buffers and blocks the next ones use again
OUTCORE, FREED, HELD_GIL = "in outcore's C calls (the GIL released)", "in other calls that release the GIL", \
    "outside them (holding the GIL, or waiting for it)"
# Libraries only ever called with the GIL released (by outcore's C, or numcodecs'): a sample in them is counted in
# outcore's C calls even where perf could not unwind the stack past them (libjpeg-turbo's SIMD code has no unwind
# tables).
GIL_FREE_LIBRARIES = re.compile(r"libjpeg|libturbojpeg|blosc")
# Other calls that release the GIL, by their library or by the system call their innermost user-space frame makes:
# Python's own file calls (os, io, pathlib, shutil), OpenSSL's digests (hashlib, on more than 2 KiB), and glibc's
# copies and fills called outside outcore's C: numpy's and bytes.join's, which give the GIL up for large ones (small
# ones counted here too: an upper bound of what runs without it).
OTHER_FREE = (
    ("Python's file calls (writes, opens, removals)", re.compile(
        r"^(__GI_|__libc_|__GI___libc_|__)?(write|read|pread64|pwrite64|open64|openat64|close|mkdir|rmdir|unlink|"
        r"unlinkat|rename|renameat|fsync|fdatasync|stat64|fstatat64|fstat64|lseek64|ftruncate64|getdents64)$")),
    ("digests (OpenSSL)", re.compile(r"libcrypto")),
    ("copies and fills by numpy, bytes.join (large: GIL released)", re.compile(
        r"^__(memcpy|memmove|memset)_")),
)
FRAME = re.compile(r"^\s*[0-9a-f]+ (?P<symbol>.+?)(?:\+0x[0-9a-f]+)? \((?P<library>.*)\)$")
# What a sample in outcore's C calls does, by the native frames below its Python one (innermost first): the first of
# these whose pattern they match.
RELEASED = (
    ("page faults: new pages zeroed", re.compile(r"clear_page|folio_zero|do_anonymous_page|do_huge_pmd")),
    ("decompress", re.compile(r"blosc|LZ4_|ZSTD_|zstd|lz4|inflate|_decompress")),
    ("checksums", re.compile(r"\blanes\b|crc32|blake2")),
    ("JPEG decode, crop, resize", re.compile(r"jpeg|jsimd|decode_mcu|ycc_rgb")),
    ("copies into chunk buffers and the batch", re.compile(r"memmove|memcpy|stream_copy|copy_all|copy_window")),
    ("reads: the kernel finding and copying a file's pages", re.compile(r"\[kernel")),
)
# What a sample outside them does, by the same frames and these patterns, else Python's.
HELD = (
    ("the kernel: thread switches, futex waits and wakes", re.compile(r"futex|schedule|finish_task_switch|switch_to")),
    ("the kernel: page faults", re.compile(r"page_fault|clear_page|folio_zero|handle_mm_fault")),
    ("the kernel: memory given back (munmap, madvise)", re.compile(r"munmap|madvise|zap_|unmap_|tlb_")),
    ("the kernel: other calls", re.compile(r"\[kernel")),
    ("malloc and free", re.compile(r"malloc|_int_free|cfree|\bfree\b|arena")),
)


def samples(script: Iterable[str]) -> Iterator[list[tuple[str, str]]]:
    """``perf script``'s samples, each its frames ``(symbol, library)``, innermost first."""
    frames: list[tuple[str, str]] = []
    for line in script:
        if not line.strip():
            if frames:
                yield frames
            frames = []
            continue
        found = FRAME.match(line)
        if found:
            frames.append((found["symbol"], found["library"]))
    if frames:
        yield frames


def outcore_c(library: str) -> bool:
    """Whether ``library`` is one of outcore's C extensions (their calls that release the GIL, and the few microseconds
    each takes its arguments holding it)."""
    return "/outcore/" in library and library.endswith(".so")


def where(frames: list[tuple[str, str]]) -> tuple[str, str, str | None]:
    """``(group, what, python)`` of a sample: in one of outcore's C calls (below the innermost Python frame where
    there is one: `OUTCORE`), in another call that releases the GIL (`FREED`) or neither (`HELD_GIL`), what it was
    doing, and the innermost Python function (``-X perf``'s ``py::`` frames), if any.

    >>> where([("LZ4_decompress_safe", "/x/blosc.so"), ("read_one", "/x/outcore/storage/_chunks.so"),
    ...        ("py::ShardReader.read_vouched:/x/outcore/storage/shard_reader.py", "/tmp/perf-1.map")])[1:]
    ('decompress', 'ShardReader.read_vouched (outcore/storage/shard_reader.py)')
    >>> where([("copy_folio_from_iter_atomic", "[kernel.kallsyms]"), ("__GI___libc_write", "/x/libc.so.6"),
    ...        ("py::_write_shard:/x/outcore/storage/shard_writer.py", "/tmp/perf-1.map")])[1]
    "Python's file calls (writes, opens, removals)"
    >>> where([("finish_task_switch.isra.0", "[kernel.kallsyms]"), ("futex_wait", "[kernel.kallsyms]"),
    ...        ("py::_Worker.run:/x/outcore/threads/pool.py", "/tmp/perf-1.map")])[:2] == (HELD_GIL,
    ...     "the kernel: thread switches, futex waits and wakes")
    True
    """
    python = next((k for k, (symbol, _) in enumerate(frames) if symbol.startswith("py::")), len(frames))
    native = frames[:python] or frames[:1]
    name = None
    if python < len(frames):
        function, _, path = frames[python][0][4:].partition(":")
        name = f"{function} ({path[path.find('outcore/'):] if 'outcore/' in path else Path(path).name})"
    text = " ".join(f"{symbol} [{library}]" for symbol, library in native)
    if any(outcore_c(library) or GIL_FREE_LIBRARIES.search(library) for _, library in native):
        return OUTCORE, first(RELEASED, [text], "other (in outcore's C)"), name
    user = next(((symbol, library) for symbol, library in native if library != "[kernel.kallsyms]"), ("", ""))
    freed = first(OTHER_FREE, user, None)
    if freed is not None:
        return FREED, freed, name
    return HELD_GIL, first(HELD, [text], "Python: the interpreter and numpy's calls"), name


def first(kinds: Sequence[tuple[str, re.Pattern]], texts: Sequence[str], otherwise: str | None) -> str | None:
    """The first of ``kinds`` (``(name, pattern)``) whose pattern is found in one of ``texts``, else ``otherwise``.

    >>> first([("a", re.compile("x")), ("b", re.compile("y"))], ["zy"], None)
    'b'
    """
    return next((kind for kind, pattern in kinds if any(pattern.search(text) for text in texts)), otherwise)


def rate(seconds: float) -> int:
    """perf's samples a second of each CPU, for about `SAMPLES` over ``seconds`` on the CPUs this process may use."""
    return max(49, min(999, round(SAMPLES / (seconds * len(os.sched_getaffinity(0))))))


def profile(case: str, store: Path, threads: int, as_cpus: int, seconds: float, folder: Path) -> Counter:
    """Counts of ``(group, what, python)`` (`where`) over the samples of a process running ``case`` flat out."""
    flags = ["-X", "perf"] if sys.version_info >= (3, 12) else []
    script = Path(__file__).with_name("cores.py")
    process = subprocess.Popen([sys.executable, *flags, str(script), "--run", case, str(store), str(threads),
                                str(WARM_SECONDS + seconds * 10), "--ready", "--as-cpus", str(as_cpus)], stdout=subprocess.PIPE, text=True)
    data = folder / f"{case}.data"
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise SystemExit(f"where_cpu: case {case!r} ended before its first epoch (its error is printed above)")
        time.sleep(WARM_SECONDS)
        perf_record(process.pid, data, seconds, ["-F", str(rate(seconds)), "--call-graph", f"dwarf,{STACK_BYTES}"])
    finally:
        process.kill()
        process.wait()
    counted: Counter = Counter()
    with subprocess.Popen(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], stdout=subprocess.PIPE, text=True,
                          errors="replace", stderr=subprocess.DEVNULL) as script_out:
        assert script_out.stdout is not None
        for frames in samples(script_out.stdout):
            counted[where(frames)] += 1
    data.unlink()
    return counted


def report(counted: Counter, top: int) -> None:
    """The shares of `where`'s groups and kinds in ``counted``, and the Python functions holding the GIL most."""
    total = sum(counted.values())
    by_kind: Counter = Counter()
    functions: Counter = Counter()
    for (group, what, python), count in counted.items():
        by_kind[group, what] += count
        if group == HELD_GIL and python is not None:
            functions[python] += count
    for group in (OUTCORE, FREED, HELD_GIL):
        part = sum(count for (each, _), count in by_kind.items() if each == group)
        if part or group != FREED:
            print(f"  {group:62s} {part / total:6.1%}")
        for (each, what), count in by_kind.most_common():
            if each == group:
                print(f"    {what:60s} {count / total:6.1%}")
    if functions:
        print(f"  the Python functions holding the GIL most (innermost frame; {total:,} samples in all):")
        for name, count in functions.most_common(top):
            print(f"    {count / total:6.2%}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="pixels,encoded")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--as-cpus", type=int, default=0, help="the pool made and gauged as on this many CPUs")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--workdir", type=Path, default=Path("bench-data/cores"))
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("perf is not installed here (linux-tools): no profile")
        return
    cases = args.cases.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    made = stores(args.workdir, args.images, {CASES[case][0] for case in cases})
    pretend = f", the pool made and gauged as on {args.as_cpus} CPUs" if args.as_cpus else ""
    named = "" if sys.version_info >= (3, 12) else " (Python functions are named from Python 3.12 on: -X perf)"
    print(f"where the CPU time goes at {args.threads} threads{pretend}: perf's samples of every thread, "
          f"{rate(args.seconds)} a second a CPU, for {args.seconds:g} s after {WARM_SECONDS:g} s of epochs{named}")
    with tempfile.TemporaryDirectory() as folder:
        for case in cases:
            print(f"\n{case}:")
            report(profile(case, made[CASES[case][0]], args.threads, args.as_cpus, args.seconds, Path(folder)), args.top)


if __name__ == "__main__":
    main()
