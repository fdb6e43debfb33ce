"""Build outcore's C extensions when they can be built: ``outcore.imaging._jpeg`` (cropped JPEG decoding),
``outcore.imaging._windows`` (a batch's samples and crops copied out of chunks), ``outcore.seeds._state`` (numpy's
SeedSequence state without its Python), ``outcore.seeds._draws`` (numpy's bounded integers and uniform draws
without its argument handling) and ``outcore.storage._chunks`` (a chunk of a local store read, checked and decoded
in one call outside the GIL); all but the first need a C compiler only.

It needs a C compiler and libjpeg-turbo 1.5 or later with its headers (Debian/Ubuntu ``libjpeg62-turbo-dev``
or ``libjpeg-turbo8-dev``, Fedora ``libjpeg-turbo-devel``, Homebrew ``jpeg-turbo``, conda ``libjpeg-turbo``),
found through ``pkg-config libjpeg``, the ``OUTCORE_JPEG_PREFIX`` environment variable (a folder with
``include/`` and ``lib/``), an active conda environment or Homebrew. Where zlib's header is found too (``pkg-config
zlib``, or beside them), it also decodes plain PNGs. Without them the install goes on
without the extension, saying so, and outcore decodes with simplejpeg and Pillow instead (the same pixels,
slower); ``outcore info --system`` shows which. ``OUTCORE_NATIVE=0`` skips the builds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

SOURCE = "outcore/imaging/_jpeg.c"
WINDOWS_SOURCE = "outcore/imaging/_windows.c"
SEEDS_SOURCE = "outcore/seeds/_state.c"
DRAWS_SOURCE = "outcore/seeds/_draws.c"
SEED_SEQUENCE = "outcore/seeds/_seed_sequence.h"  # numpy's SeedSequence hash, in both
CHUNKS_SOURCE = "outcore/storage/_chunks.c"
FREE_TIME = ["outcore/_free_time.h"]  # the GIL-free time counted by the extensions that release the GIL
BLAKE2B = "outcore/_blake2b.h"  # the survey's file digests, taken in check_files
WHOLE_FILES = "outcore/_whole_files.h"  # whole picture files read at ingest, by _jpeg and _chunks alike
MAPPED_FILES = "outcore/storage/_mapped_files.h"  # shard files mapped once, chunks in memory read in place
BATCH_ENGINE = "outcore/storage/_batch_engine.h"  # a run of plain batches made on C threads, in _chunks
WINDOW_COPY = "outcore/_window_copy.h"  # a picture's window copied and mirrored, by _windows and _chunks alike
TABLE_LOOKUP = "outcore/_table_lookup.h"  # uint8 pixels through a table of their results (Normalize), by both too
STREAM_COPY = "outcore/_stream_copy.h"  # large copies written past the caches, by _windows and _chunks alike
PNG = "outcore/imaging/_png.h"  # plain PNGs decoded by _jpeg's decode_each, where zlib is found
PICTURE_DECODER = "outcore/_picture_decoder.h"  # _jpeg's decoding lent to _chunks's batch engine, through a capsule


def pkg_config(package: str) -> tuple[list[str], list[str]] | None:
    """(include folders, library folders) of ``package`` as ``pkg-config`` gives them; None where it does not know it
    (or is not installed)."""
    if not shutil.which("pkg-config"):
        return None
    found = subprocess.run(["pkg-config", "--cflags-only-I", "--libs-only-L", package], capture_output=True, text=True,
                           check=False)
    if found.returncode != 0:
        return None
    words = found.stdout.split()
    return [w[2:] for w in words if w.startswith("-I")], [w[2:] for w in words if w.startswith("-L")]


def jpeg_paths() -> tuple[list[str], list[str]]:
    """(include folders, library folders) where libjpeg-turbo's headers and library may be."""
    found = pkg_config("libjpeg")
    if found is not None:
        return found
    prefixes = [os.environ.get("OUTCORE_JPEG_PREFIX"), os.environ.get("CONDA_PREFIX"),
                "/opt/homebrew/opt/jpeg-turbo", "/usr/local/opt/jpeg-turbo"]
    prefixes = [Path(p) for p in prefixes if p and (Path(p) / "include" / "jpeglib.h").exists()]
    return [str(p / "include") for p in prefixes], [str(p / "lib") for p in prefixes]


def zlib_paths(jpeg_includes: list[str]) -> tuple[list[str], list[str]] | None:
    """(include folders, library folders) of zlib, which ``_jpeg`` decodes plain PNGs with (``OUTCORE_PNG``); None
    where its header is not found: ``_jpeg`` is built without it."""
    found = pkg_config("zlib")
    if found is not None:
        return found
    folders = [*jpeg_includes, "/usr/include", "/usr/local/include"]
    return ([], []) if any((Path(folder) / "zlib.h").exists() for folder in folders) else None


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed build and goes on without that extension: it is optional."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError) as error:
            if ("OUTCORE_PNG", "1") in ext.define_macros:  # zlib's header without its library: without PNGs
                print(f"outcore: {ext.name} was not built with zlib ({error}); building it without: its PNGs are "
                      "decoded by Pillow", file=sys.stderr)
                ext.define_macros.remove(("OUTCORE_PNG", "1"))
                ext.libraries.remove("z")
                self.build_extension(ext)
                return
            self.extensions = [other for other in self.extensions if other is not ext]  # nothing to copy or install
            instead = {"outcore.imaging._jpeg": "decode JPEGs with simplejpeg and Pillow (same pixels, slower). Install "
                                                "libjpeg-turbo's headers and a C compiler to build it.",
                       "outcore.imaging._windows": "copy batches' samples with numpy (same bytes, slower). Install a C "
                                                   "compiler to build it.",
                       "outcore.seeds._state": "seed generators with numpy's SeedSequence (the same generators, slower). "
                                         "Install a C compiler to build it.",
                       "outcore.seeds._draws": "draw transforms' numbers with numpy's calls (the same numbers, slower). "
                                               "Install a C compiler to build it.",
                       "outcore.storage._chunks": "read chunks of local stores with Python's calls (the same bytes, "
                                                  "more time holding the GIL). Install a C compiler to build it."}[ext.name]
            print(f"outcore: the C extension {ext.name} was not built ({error}); outcore will {instead}", file=sys.stderr)


def extensions() -> list[Extension]:
    if os.environ.get("OUTCORE_NATIVE", "1") == "0":
        return []
    include_dirs, library_dirs = jpeg_paths()
    libraries, macros = ["jpeg"], []
    zlib = zlib_paths(include_dirs)
    if zlib is not None:
        include_dirs, library_dirs = include_dirs + zlib[0], library_dirs + zlib[1]
        libraries, macros = [*libraries, "z"], [("OUTCORE_PNG", "1")]
    flags = ["-O3", "-ffp-contract=off"] if os.name != "nt" else []
    return [Extension("outcore.imaging._jpeg", [SOURCE], include_dirs=include_dirs, library_dirs=library_dirs,
                      libraries=libraries, define_macros=macros, extra_compile_args=flags,
                      depends=[*FREE_TIME, BLAKE2B, WHOLE_FILES, PNG, PICTURE_DECODER]),
            Extension("outcore.imaging._windows", [WINDOWS_SOURCE], extra_compile_args=flags,
                      depends=[*FREE_TIME, STREAM_COPY, WINDOW_COPY, TABLE_LOOKUP]),
            Extension("outcore.seeds._state", [SEEDS_SOURCE], extra_compile_args=flags, depends=[SEED_SEQUENCE]),
            Extension("outcore.seeds._draws", [DRAWS_SOURCE], extra_compile_args=flags, depends=[SEED_SEQUENCE]),
            Extension("outcore.storage._chunks", [CHUNKS_SOURCE], extra_compile_args=flags,
                      depends=[*FREE_TIME, WHOLE_FILES, MAPPED_FILES, STREAM_COPY, BATCH_ENGINE, WINDOW_COPY,
                               PICTURE_DECODER, TABLE_LOOKUP])]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
