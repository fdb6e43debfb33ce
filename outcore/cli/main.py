"""The ``outcore`` command: ``ingest``, ``info``, ``verify``, ``bench``, ``cache`` and ``demo``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

from ..dataset import Dataset, open_dataset
from ..errors import ClusterError, OptionError, OutcoreError
from ..imaging import DEFAULT_QUALITY, MAX_PIXELS, RESIZE_POLICIES, native
from ..ingest import ingest_coco, ingest_dataframe, ingest_images, ingest_records, ingest_splits, ingest_voc
from ..ingest.records import FORMATS as RECORD_FORMATS
from ..ingest.records import TFRecord, recognise
from ..iterate import shuffle_quality
from ..iterate.quality import label_fields
from ..storage import ChunkCache, RemoteStore, huge_pages
from ..storage.cache import ENVIRONMENT
from .advice import advise, picture_fields
from .bench import compare, epoch_traffic
from .demo import run_demo
from .info import describe, system_report
from .verify import verify


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``outcore`` console script; returns the exit status.

    Every failure is one line on stderr, in the command's flag names, with exit status 2; Ctrl-C is
    one line (with what outcore noted on its way out: tasks it could not stop) and 130; a closed pipe (``outcore info STORE | head``) ends quietly.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = partial(_show_warning, args)
            return args.run(args)
    except OutcoreError as error:
        said = " ".join(str(error).split())  # one line, whatever a library's message held
        print(f"outcore {args.command}: error: {in_flag_names(said, args.parser)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        kept = " (the shards written so far are kept: the same command with --resume continues)" \
            if args.command == "ingest" else ""
        noted = "".join(f"; {' '.join(note.split())}" for note in getattr(interrupt, "__notes__", ())
                        if note.startswith("outcore "))  # outcore's own: Python notes an interrupt taken as a class
        # is made ("Error calling __set_name__ on ..."), which says nothing to the user
        print(f"outcore {args.command}: interrupted{kept}{noted}", file=sys.stderr)
        _quiet_teardown()
        return 130
    except BrokenPipeError:  # the reader of stdout went away: nothing more to say, and nowhere to say it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a command killed by the closed pipe would


def _quiet_teardown() -> None:
    """After Ctrl-C, the process ends with its one line: what the interrupt left half made (an event loop zarr was
    creating, a coroutine it was about to await) fails to finalise as the interpreter exits, and Python would print
    that ("Exception ignored in ...", "coroutine ... was never awaited"): nothing more is said."""
    sys.unraisablehook = lambda unraisable: None
    warnings.simplefilter("ignore")


def _show_warning(args: argparse.Namespace, message: Warning | str, *_: Any, **__: Any) -> None:
    """A warning as one line, in flag names, like errors."""
    print(f"outcore {args.command}: warning: {in_flag_names(str(message), args.parser)}", file=sys.stderr)


_INGEST_CALL = re.compile(r"\b(?:outcore\.)?ingest_(?:images|dataframe|records|splits)\(([^()]*)\)")


def in_flag_names(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with the Python keyword spellings of ``parser``'s options written as its flags, and
    calls of the ingest functions as the command.

    >>> parser = argparse.ArgumentParser()
    >>> _ = parser.add_argument("--on-error"), parser.add_argument("--overwrite", action="store_true")
    >>> in_flag_names("pass on_error='skip' to skip it, or overwrite=True", parser)
    'pass --on-error skip to skip it, or --overwrite'
    >>> _ = parser.add_argument("--split")
    >>> in_flag_names("or with ingest_splits('photos', folder, split='folders')", parser)
    'or with outcore ingest photos STORE --split folders'
    """
    message = _INGEST_CALL.sub(_as_command, message)
    for action in parser._actions:  # argparse keeps its options only there
        flags = [flag for flag in action.option_strings if flag.startswith("--")]
        if not flags:
            continue
        pattern = rf"\b{action.dest}=(?:'([^']*)'|\"([^\"]*)\"|(\w+)\b)?"
        message = re.sub(pattern, lambda match, flag=flags[0], action=action: _flag(flag, action, match), message)
    return message


def _as_command(call: re.Match[str]) -> str:
    """An ingest function's call as the ``outcore ingest`` command (its keywords made flags after)."""
    words = ["outcore", "ingest"]
    for part in (part.strip() for part in call.group(1).split(",")):
        if part == "...":
            words += ["SRC", "STORE"]
        elif "=" in part:
            words.append(part)
        elif part[:1] in "'\"":
            words.append(part.strip("'\""))
        elif part:
            words.append("STORE" if len(words) > 2 else "SRC")
    return " ".join(words)


def _flag(flag: str, action: argparse.Action, match: re.Match[str]) -> str:
    value = next((group for group in match.groups() if group is not None), None)
    if value is None or action.nargs == 0:  # a flag that takes no value: --overwrite
        return flag
    return f"{flag} {'none' if value == 'None' else value}"


class _Parser(argparse.ArgumentParser):
    """argparse, with usage mistakes as one line (the usage itself is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="outcore", description="Ingest image folders and CSVs into Zarr v3 stores, describe, "
                                                 "verify and benchmark them, or run the end-to-end demo.")
    parser.add_argument("--version", action="version", version=f"outcore {version('outcore')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ingest = commands.add_parser(
        "ingest", help="ingest an image folder, a CSV of image paths or record files into a store",
        description="SRC is a folder (ROOT/<class>/<image>, class from the sub-folder), a CSV file with a "
                    "column of image paths (relative to the CSV's folder or --root), or record files, "
                    "recognised from what SRC holds or named with --format: TFRecord files, WebDataset tar "
                    "shards (a folder, a glob or shard-{000000..000099}.tar), an LMDB environment, Parquet "
                    "files or a Hugging Face dataset saved to disk; any of these but LMDB may be an object "
                    "store URL (s3://bucket/shards/, https://...). STORE ending in .zip "
                    "is written as one file; an object store URL (s3://bucket/train.zarr, gs://, az://) gets "
                    "the store uploaded as it is written and published once complete. With --split or "
                    "--split-column, STORE is a folder that gets one store per split and splits.json.",
    )
    ingest.add_argument("source", metavar="SRC")
    ingest.add_argument("store", metavar="STORE")
    ingest.add_argument("--split", metavar="NAME=FRACTION,...|folders",
                        help="one store per split in the folder STORE: fractions (train=0.8,val=0.1,test=0.1; each "
                             "file's split from a hash of its path and --seed) or 'folders' (SRC/<split>/<class>/...)")
    ingest.add_argument("--split-column", help="CSV column of each row's split name: one store per split")
    ingest.add_argument("--zip", action="store_true", help="with --split: write each split as one .zip file")
    ingest.add_argument("--shape", required=True,
                        help="sample shape, HxW or HxWxC (e.g. 128x128x3), or any: each picture keeps its own size "
                             "(stored encoded; crop it while reading)")
    ingest.add_argument("--resize", default="crop", choices=[p for p in RESIZE_POLICIES if p] + ["none"],
                        help="how to fit images of other sizes (default: crop; none: refuse them)")
    ingest.add_argument("--dtype", default="uint8", choices=["uint8", "uint16"])
    ingest.add_argument("--images", choices=["pixels", "encoded", "both"],
                        help="store decoded pixels, the files' encoded bytes (smaller; decoded while reading), or "
                             "both (default: chosen for this machine: pixels when they fit in the memory the page "
                             "cache can give, else the faster kind as measured on the device and the cores)")
    ingest.add_argument("--max-side", type=int,
                        help="with --images encoded: pictures whose longer side is larger are resized to it and "
                             "re-encoded once (default: every file's bytes kept)")
    ingest.add_argument("--quality", type=int, default=DEFAULT_QUALITY,
                        help=f"JPEG quality of pictures re-encoded by --max-side (default {DEFAULT_QUALITY})")
    ingest.add_argument("--path-column", default="path", help="CSV column of image paths (default: path)")
    ingest.add_argument("--label-columns", default="", help="comma-separated CSV label columns")
    ingest.add_argument("--label-dtype", help="what the label columns hold: class, int64 or float32, for all of "
                                              "them or per column (label=class,weight=float32); default: the cells decide, "
                                              "and a numeric column with a few other cells is an error")
    ingest.add_argument("--root", help="folder that relative CSV paths start from (default: the CSV's)")
    ingest.add_argument("--format", choices=sorted([*RECORD_FORMATS, "tfrecord-od", *ANNOTATIONS]),
                        help="SRC holds record files of this format, TensorFlow's object detection TFRecords "
                             "(tfrecord-od), a COCO annotation file (coco: its pictures under --root) or a Pascal "
                             "VOC folder (voc) (default: recognised from what SRC holds)")
    ingest.add_argument("--mask-columns", default="", help="comma-separated CSV columns of each picture's label map "
                                                           "file (a palette or grey PNG of ids)")
    ingest.add_argument("--pair-columns", default="", help="comma-separated CSV columns of a picture paired with each "
                                                           "(its depth, a second view), fitted as it is")
    ingest.add_argument("--mask-dtype", choices=["uint8", "uint16"],
                        help="the label maps' ids (default: what each mask column's first file needs)")
    ingest.add_argument("--masks", action=argparse.BooleanOptionalAction,
                        help="COCO: draw each picture's instance map (default: yes); VOC: read the class and object "
                             "maps of the segmentation split (default: no)")
    ingest.add_argument("--voc-set", default="train", help="VOC: the split of ImageSets to read (default: train)")
    ingest.add_argument("--voc-classes", help="VOC: comma-separated class names in the order of their ids (default: "
                                              "VOC's 20)")
    ingest.add_argument("--image-key", help="record files: the feature (TFRecord, default image/encoded), member "
                                            "extension (WebDataset, default jpg/jpeg/png/webp) or column (Parquet, "
                                            "default image) holding each picture")
    ingest.add_argument("--label-keys", metavar="FIELD=KEY,...",
                        help="record files: the label fields and the feature, member extension (or json.FIELD) or "
                             "column each comes from, e.g. labels=image/class/label (default: the format's usual "
                             "label, when the records have it)")
    ingest.add_argument("--lmdb-values", default="auto", choices=["auto", "bytes", "datum"],
                        help="LMDB: each value is a picture's file or a Caffe Datum (default: as its bytes show)")
    ingest.add_argument("--datum-channels", choices=["bgr", "rgb"],
                        help="LMDB of raw Caffe Datums: their channels' order (default: BGR, as Caffe's tools write, "
                             "with a warning)")
    ingest.add_argument("--label-pattern", metavar="REGEX",
                        help="LMDB of files: a regular expression whose named groups, searched in each key, are the "
                             "label fields, e.g. '^(?P<labels>[^/]+)/'")
    ingest.add_argument("--label-table", metavar="CSV",
                        help="LMDB of files: a CSV with a 'key' column and label columns")
    ingest.add_argument("--chunk-size", type=int, help="samples per chunk (default: about 8 MiB of pixels)")
    ingest.add_argument("--compression",
                        help="CNAME[:LEVEL[:SHUFFLE]], e.g. zstd:3:bitshuffle (default lz4:5:shuffle)")
    ingest.add_argument("--no-shuffle", action="store_true", help="keep source order instead of shuffling")
    ingest.add_argument("--seed", type=int, default=0, help="seed of the shuffle on write (default 0)")
    ingest.add_argument("--on-error", default="raise", choices=["raise", "skip"],
                        help="stop at the first bad image (raise) or skip and report bad images (skip)")
    ingest.add_argument("--max-pixels", type=int, default=MAX_PIXELS,
                        help=f"images of more pixels are bad files, as decompression bombs are (default {MAX_PIXELS:,}; "
                             "0: no limit)")
    ingest.add_argument("--overwrite", action="store_true", help="replace STORE if it exists")
    ingest.add_argument("--resume", action="store_true",
                        help="continue an ingest of the same files and settings that was killed or interrupted")
    ingest.add_argument("--append", action="store_true",
                        help="add to STORE the files it does not hold yet (same settings as it was made with)")
    ingest.add_argument("--by-content", action="store_true",
                        help="with --append: know stored files by their bytes, not by path, size and time")
    ingest.add_argument("--no-progress", action="store_true")
    _add_storage_options(ingest)
    _add_scheduler(ingest)
    ingest.set_defaults(run=_ingest, parser=ingest)

    info = commands.add_parser("info", help="describe a store: fields, chunks, codecs, sizes, classes; or, with "
                                            "--system, this machine's outcore (versions, JPEG decoder, threads)")
    info.add_argument("store", metavar="STORE", nargs="?")
    info.add_argument("--system", action="store_true",
                      help="what outcore runs on here: versions, the JPEG decoder (C extension or not), threads")
    _add_remote(info)
    info.set_defaults(run=_info, parser=info)

    check = commands.add_parser("verify", help="read every chunk and check checksums and labels")
    check.add_argument("store", metavar="STORE")
    check.add_argument("--no-progress", action="store_true")
    _add_remote(check)
    check.set_defaults(run=_verify, parser=check)

    bench = commands.add_parser("bench", help="reading speed and shuffle quality of a store")
    bench.add_argument("store", metavar="STORE")
    bench.add_argument("--batch-size", type=int, default=256)
    bench.add_argument("--repeats", type=int, default=3, help="runs per measurement; medians are shown")
    bench.add_argument("--crop", type=int, default=224,
                       help="pictures kept at their own size are read with RandomResizedCrop(CROP) and a flip "
                            "(default 224)")
    bench.add_argument("--processes", metavar="COUNTS",
                       help="loader process counts (process=) to time against this process's threads, e.g. 2,4; 0: "
                            "none (default: 2, 4, ... up to the cores where one process's GIL share keeps its "
                            "threads from them)")
    _add_remote(bench)
    bench.set_defaults(run=_bench, parser=bench)

    cache = commands.add_parser("cache", help="show or clear the node's cache of object-store chunks")
    cache.add_argument("--cache-dir", help=f"the cache folder (default: ${ENVIRONMENT})")
    cache.add_argument("--clear", action="store_true", help="remove every entry no process is writing")
    cache.set_defaults(run=_cache, parser=cache)

    demo = commands.add_parser("demo", help="cut sample photographs into classes, ingest, inspect, train a small "
                                             "CNN and predict, end to end")
    demo.add_argument("--workdir", default="outcore-demo",
                      help="where the pictures, stores and predictions go, and stay (default: ./outcore-demo)")
    demo.add_argument("--per-class", type=int, default=200, help="training pictures per class (default 200)")
    demo.add_argument("--size", type=int, default=64, help="picture height and width (default 64)")
    demo.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    demo.add_argument("--no-progress", action="store_true")
    _add_scheduler(demo)
    demo.set_defaults(run=_demo, parser=demo)
    return parser


SCHEDULER_TIMEOUT = 10.0  # seconds to wait for a --scheduler to answer


def _add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-option", metavar="KEY=VALUE", action="append", default=[], dest="storage_options",
                        help="a setting of the object store (endpoint=..., region=..., skip_signature=true); "
                             "repeat for more. Default: the standard environment (AWS_ENDPOINT_URL, ...)")


def _add_remote(parser: argparse.ArgumentParser) -> None:
    _add_storage_options(parser)
    parser.add_argument("--cache-dir", help=f"the node's cache of object-store chunks (default: ${ENVIRONMENT})")
    parser.add_argument("--cache-size", help="the cache's bound, e.g. 50GiB (default: $OUTCORE_CACHE_SIZE or 20 GiB)")
    parser.add_argument("--no-cache", action="store_true", help="read an object store without the cache")
    parser.add_argument("--split", help="STORE is a folder of splits (made by ingest --split): the one to read")


def _open_options(args: argparse.Namespace) -> dict[str, Any]:
    """`open_dataset`'s keywords from the --storage-option, --cache-dir, --cache-size, --no-cache and --split
    flags."""
    return {"storage_options": _storage_options(args), "cache_dir": False if args.no_cache else args.cache_dir,
            "cache_size": args.cache_size, "split": args.split}


def _storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The --storage-option flags as ``storage_options``."""
    options = {}
    for item in args.storage_options:
        key, sign, value = item.partition("=")
        if not sign or not key:
            raise OptionError(f"--storage-option {item!r}: give KEY=VALUE, e.g. --storage-option region=eu-west-1")
        options[key.strip()] = value.strip()
    return options or None


def _add_scheduler(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="run on an existing Dask cluster (e.g. tcp://10.0.0.1:8786) instead of local threads")
    parser.add_argument("--scheduler-timeout", metavar="SECONDS", type=float, default=SCHEDULER_TIMEOUT,
                        help=f"how long to wait for the scheduler to answer (default {SCHEDULER_TIMEOUT:g})")


@contextmanager
def _client(args: argparse.Namespace) -> Iterator[Any]:
    if args.scheduler is None:
        yield None
        return
    from distributed import Client  # the cluster framework, needed only with --scheduler

    try:
        client = Client(args.scheduler, timeout=args.scheduler_timeout)
    except (OSError, ValueError) as error:
        raise ClusterError(f"no Dask scheduler answered at {args.scheduler} within {args.scheduler_timeout:g} s "
                           f"({error}); start one (dask scheduler) or correct --scheduler") from None
    with client:
        yield client


def _ingest(args: argparse.Namespace) -> int:
    options = {
        "shape": args.shape,
        "resize": None if args.resize == "none" else args.resize,
        "dtype": args.dtype,
        "images": args.images,
        "max_side": args.max_side,
        "quality": args.quality,
        "chunk_size": args.chunk_size,
        "compression": args.compression,
        "shuffle_on_write": not args.no_shuffle,
        "seed": args.seed,
        "on_error": args.on_error,
        "max_pixels": args.max_pixels or None,
        "overwrite": args.overwrite,
        "resume": args.resume,
        "append": args.append,
        "by_content": args.by_content,
        "progress": not args.no_progress,
        "storage_options": _storage_options(args),
    }
    annotations = args.format if args.format in ANNOTATIONS else _annotations_at(args.source)
    if annotations is not None and args.format in (None, *ANNOTATIONS):
        return _ingest_annotations(annotations, args, options)
    if args.masks is not None:
        raise OptionError("--masks says whether a COCO file's or a VOC folder's maps are stored: SRC is neither; "
                          "label maps of a CSV come from --mask-columns")
    if (args.mask_columns or args.pair_columns) and (args.split is not None or args.split_column is not None):
        raise OptionError("--mask-columns or --pair-columns with --split or --split-column: ingest each split's CSV "
                          "on its own (label maps and paired pictures are not cut into splits yet)")
    records = args.format or (None if Path(args.source).suffix.lower() == ".csv"
                              else recognise(args.source, options["storage_options"]))
    format = _record_format(records, args) if records else None
    if args.split is not None or args.split_column is not None:
        return _ingest_splits(args, options, format)
    before = len(open_dataset(args.store)) if args.append and Path(args.store).exists() else 0
    with _client(args) as client:
        if format is not None:
            ds = ingest_records(args.source, args.store, format=format, client=client,
                                **{k: v for k, v in options.items() if k not in ("append", "by_content")})
        elif Path(args.source).is_file():
            labels = [c for c in args.label_columns.split(",") if c]
            masks = [c for c in args.mask_columns.split(",") if c]
            pairs = [c for c in args.pair_columns.split(",") if c]
            ds = ingest_dataframe(args.source, args.store, path_column=args.path_column, label_columns=labels,
                                  label_dtype=_label_dtype(args.label_dtype), root=args.root, mask_columns=masks,
                                  mask_dtype=args.mask_dtype, pair_columns=pairs, client=client, **options)
        else:
            ds = ingest_images(args.source, args.store, client=client, **options)
    print(describe(ds))
    if args.append:
        print(f"appended {len(ds) - before:,} samples ({before:,} before)")
    return 0


ANNOTATIONS = ("coco", "voc")  # --format values that are annotated pictures, not record files


def _annotations_at(source: str) -> str | None:
    """``"coco"`` for a JSON file, ``"voc"`` for a folder with ``Annotations`` and ``JPEGImages``, else None."""
    path = Path(source)
    if path.suffix.lower() == ".json" and path.is_file():
        return "coco"
    return "voc" if (path / "Annotations").is_dir() and (path / "JPEGImages").is_dir() else None


def _ingest_annotations(kind: str, args: argparse.Namespace, options: dict[str, Any]) -> int:
    """``outcore ingest`` of a COCO annotation file or a Pascal VOC folder."""
    given = [flag for flag, value in (("--append", args.append), ("--split", args.split),
                                      ("--split-column", args.split_column), ("--mask-columns", args.mask_columns),
                                      ("--pair-columns", args.pair_columns))
             if value]
    if given:
        raise OptionError(f"{', '.join(given)} describe an image folder or a CSV; SRC is a {kind.upper()} source, "
                          "ingested into a new store")
    options = {k: v for k, v in options.items() if k not in ("append", "by_content")}
    with _client(args) as client:
        if kind == "coco":
            ds = ingest_coco(args.source, args.store, root=args.root, masks=args.masks is not False, client=client,
                             **options)
        else:
            classes = {"classes": args.voc_classes.split(",")} if args.voc_classes else {}
            ds = ingest_voc(args.source, args.store, split=args.voc_set, masks=bool(args.masks), client=client,
                            **classes, **options)
    print(describe(ds))
    return 0


def _ingest_splits(args: argparse.Namespace, options: dict[str, Any], format: Any) -> int:
    labels = [c for c in args.label_columns.split(",") if c]
    with _client(args) as client:
        stores = ingest_splits(args.source, args.store, split=args.split or "folders", split_column=args.split_column,
                               path_column=args.path_column, label_columns=labels,
                               label_dtype=_label_dtype(args.label_dtype), root=args.root, zip=args.zip,
                               client=client, format=format, **options)
    for name, ds in stores.items():
        print(f"{name}: {len(ds):,} samples in {ds.location}")
    print(f"index: {Path(args.store) / 'splits.json'}; open one with outcore.open_dataset({args.store!r}, split=...)")
    return 0


def _record_format(name: str, args: argparse.Namespace) -> Any:
    """The format object the record flags describe."""
    keys = None if args.label_keys is None else dict(
        part.split("=", 1) if "=" in part else ("labels", part) for part in args.label_keys.split(",") if part)
    if args.append:
        raise OptionError("--append adds files of an image folder or a CSV; record files are ingested into a new store")
    lmdb_only = [flag for flag, value in (("--label-pattern", args.label_pattern), ("--label-table", args.label_table),
                                         ("--lmdb-values", args.lmdb_values != "auto" or None),
                                         ("--datum-channels", args.datum_channels)) if value]
    if name != "lmdb" and lmdb_only:
        raise OptionError(f"{', '.join(lmdb_only)} describe an LMDB environment, and SRC holds {name} files")
    if name == "lmdb":
        if args.image_key or keys:
            raise OptionError("an LMDB's labels come from --label-pattern or --label-table (files) or its Datums "
                              "(read as such), not --image-key or --label-keys")
        return RECORD_FORMATS[name](values=args.lmdb_values, label_pattern=args.label_pattern,
                                    label_table=args.label_table, datum_channels=args.datum_channels)
    given = {"image_key": args.image_key} if args.image_key else {}
    if name == "tfrecord-od":
        if keys:
            raise OptionError("--label-keys: TensorFlow's object detection records keep their labels per box")
        return dataclasses.replace(TFRecord.object_detection(), **given)
    return RECORD_FORMATS[name](label_keys=keys, **given)


def _label_dtype(text: str | None) -> str | dict[str, str] | None:
    if text is None or "=" not in text:
        return text
    return dict(part.split("=", 1) for part in text.split(",") if part)


def _info(args: argparse.Namespace) -> int:
    if args.system:
        print(system_report())
    if args.store is not None:
        print(("\n" if args.system else "") + describe(open_dataset(args.store, **_open_options(args))))
    elif not args.system:
        raise OptionError("outcore info needs a STORE to describe, or --system")
    return 0


def _verify(args: argparse.Namespace) -> int:
    report = verify(args.store, progress=not args.no_progress, **_open_options(args))
    print(report)
    return 0 if report.ok else 1


def _cache(args: argparse.Namespace) -> int:
    cache = ChunkCache.from_environment(args.cache_dir, None)
    if cache is None:
        raise OptionError(f"no cache folder: give cache_dir=DIR, or set ${ENVIRONMENT}")
    if not (cache.directory / "index.sqlite").exists():
        raise OptionError(f"{cache.directory} holds no outcore cache (no index.sqlite there); check cache_dir=")
    print(cache.clear() if args.clear else cache.usage())
    return 0


def _bench(args: argparse.Namespace) -> int:
    processes = _process_counts(args.processes)
    ds = open_dataset(args.store, **_open_options(args))
    reads = "a 2 MiB page at a time" if huge_pages.available() else "with pread (no huge pages here)"
    print(f"{ds.location}: {len(ds):,} samples; JPEG boxes decoded by: {native.backend()}; large chunks read "
          f"{reads}\n")
    advice = (advise(ds, batch_size=args.batch_size, crop=args.crop, processes=processes) if _has_images(ds)
              else None)
    if advice is not None:
        print(f"{advice}\n")
    if advice is not None and any(advice.from_device(kind) for kind in advice.kinds if kind.source == "this store"):
        print("from memory: not measured, as the store does not fit in the page cache (see above)")
    else:
        rows = compare(ds, batch_size=args.batch_size, repeats=args.repeats, crop=args.crop)
        baseline = rows[0][1]
        print(f"from memory, all fields, medians of {args.repeats} runs (the store read once first):")
        print(f"{'what':50s} {'samples/s':>10s} {'vs plain zarr':>14s}")
        for name, rate in rows:
            print(f"{name:50s} {rate:10.0f} {rate / baseline:14.2f}")
    if label_fields(ds) and len(ds) >= args.batch_size:
        print("\nshuffle quality at these settings: " + str(shuffle_quality(ds, batch_size=args.batch_size)))
    if isinstance(ds.group.store, RemoteStore):
        print("\none more shuffled epoch: " + epoch_traffic(ds, args.batch_size))
    return 0


def _process_counts(text: str | None) -> tuple[int, ...] | None:
    """``--processes``: None (left out), the counts given, or none for ``0``."""
    if text is None:
        return None
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or any(count < 0 for count in counts) or (0 in counts and len(counts) > 1):
        raise OptionError(f"--processes {text}: give loader process counts, e.g. --processes 2,4, or 0 for none")
    return tuple(count for count in counts if count)


def _has_images(ds: Dataset) -> bool:
    return bool(picture_fields(ds))


def _demo(args: argparse.Namespace) -> int:
    import psutil

    with _client(args) as client:
        run_demo(args.workdir, per_class=args.per_class, size=args.size, epochs=args.epochs, client=client,
                 progress=not args.no_progress, started=psutil.Process().create_time())  # the command's own start
    return 0
