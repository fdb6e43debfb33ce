"""LitData and Mosaic streaming reading the samples of ``benchmarks/remote.py`` from the same S3 endpoint.

Run by ``benchmarks/remote.py --peers PYTHON`` with a Python that has them (they need their own
environment: ``pip install torch==2.13.0`` first, then ``pip install --no-deps litdata
mosaicml-streaming`` and their light dependencies; torchvision, which Mosaic imports for its vision
datasets only, is stood in for, as there is no CPU build of it here; LitData's client is told to allow
the loopback server's plain http, which it refuses by default). Writes each peer's own format once
(kept in ``--workdir``), uploads it, then reads one shuffled epoch (batch 256, no worker processes, like
outcore's default) through ``--via`` into an empty cache, and a second epoch from that cache. Prints
one JSON line: samples/s of each, and the process's peak memory. With ``--workers N``, one DataLoader of
N workers (the peer's own loader, its defaults otherwise) reads ``--epochs`` epochs in a row, the first
into the empty cache; ``epochs`` then holds each epoch's first batch (seconds) and samples/s.

    python benchmarks/remote_peers.py mosaic --samples bench-data/peer-samples.npz --endpoint URL --via URL
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

BATCH = 256
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _stand_in_for_torchvision() -> None:
    """Mosaic streaming imports torchvision for its vision datasets, which this benchmark does not use."""
    vision = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    datasets.VisionDataset = type("VisionDataset", (), {})
    datasets.CIFAR10 = type("CIFAR10", (), {})
    functional.to_tensor = lambda picture: picture
    vision.datasets, vision.transforms, transforms.functional = datasets, transforms, functional
    for module in (vision, datasets, transforms, functional):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        sys.modules[module.__name__] = module


def _upload(folder: Path, bucket: str, prefix: str, endpoint: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")


def _mosaic(args: argparse.Namespace) -> dict[str, float]:
    _stand_in_for_torchvision()
    from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
    from torch.utils.data import DataLoader

    written = Path(args.workdir) / "peer-mds"
    if not (written / "index.json").exists():
        shutil.rmtree(written, ignore_errors=True)
        samples = dict(np.load(args.samples))
        with MDSWriter(out=str(written), columns={"image": "ndarray:uint8", "label": "int"}, size_limit="64mb") as out:
            for image, label in zip(samples["images"], samples["labels"], strict=True):
                out.write({"image": image, "label": int(label)})
    _upload(written, args.bucket, "mds", args.endpoint)
    os.environ["S3_ENDPOINT_URL"] = args.via
    rates = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as cache:
        def dataset() -> StreamingDataset:
            return StreamingDataset(remote=f"s3://{args.bucket}/mds", local=cache, shuffle=True, shuffle_seed=1,
                                    batch_size=BATCH, cache_limit=None)

        if args.workers:
            return _epochs(StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=args.workers), args.epochs)
        for name in ("cold", "cached"):
            rates[name] = _epoch(DataLoader(dataset(), batch_size=BATCH, num_workers=0), "label")
    return rates


def _litdata(args: argparse.Namespace) -> dict[str, float]:
    import litdata
    from litdata.streaming import downloader

    # LitData's object-store client refuses a plain-http endpoint (the loopback server) unless told, here and
    # in DataLoader workers however they start
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
    os.environ["AWS_ALLOW_HTTP"] = "true"

    written = Path(args.workdir) / "peer-litdata"
    if not (written / "index.json").exists():
        shutil.rmtree(written, ignore_errors=True)
        count = len(np.load(args.samples)["labels"])
        litdata.optimize(fn=_litdata_sample, inputs=list(range(count)), output_dir=str(written),
                         chunk_bytes="64MB", num_workers=2, mode="overwrite")
    _upload(written, args.bucket, "litdata", args.endpoint)
    options = {"endpoint_url": args.via, "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
               "region_name": "us-east-1"}
    rates = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as cache:
        def dataset() -> litdata.StreamingDataset:
            return litdata.StreamingDataset(f"s3://{args.bucket}/litdata", cache_dir=cache, shuffle=True, seed=1,
                                            storage_options=options, max_cache_size="100GB")

        if args.workers:
            return _epochs(litdata.StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=args.workers),
                           args.epochs)
        for name in ("cold", "cached"):
            rates[name] = _epoch(litdata.StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=0), "label")
    return rates


_SAMPLES: dict[str, np.ndarray] = {}


def _litdata_sample(index: int) -> dict[str, object]:
    if not _SAMPLES:
        _SAMPLES.update(np.load(os.environ["PEER_SAMPLES"]))
    return {"image": _SAMPLES["images"][index], "label": int(_SAMPLES["labels"][index])}


def _epoch(loader: object, label: str) -> float:
    began = time.perf_counter()
    count = sum(len(batch[label]) for batch in loader)
    return count / (time.perf_counter() - began)


def _epochs(loader: object, epochs: int) -> dict[str, object]:
    """``epochs`` passes of one loader: each one's first batch (seconds) and samples/s, and the samples."""
    measured = []
    for _ in range(epochs):
        began, first, count = time.perf_counter(), None, 0
        for batch in loader:
            first = time.perf_counter() - began if first is None else first
            count += len(batch["label"])
        measured.append({"first": first, "rate": count / (time.perf_counter() - began), "samples": count})
    return {"epochs": measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=["mosaic", "litdata"])
    parser.add_argument("--samples", required=True, help="an .npz of images (N, H, W, C) uint8 and labels (N,)")
    parser.add_argument("--endpoint", required=True, help="the S3 server itself (uploads)")
    parser.add_argument("--via", required=True, help="the endpoint the epochs are read through (the proxy)")
    parser.add_argument("--bucket", default="data")
    parser.add_argument("--workdir", default="bench-data")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (0: the two-epoch rates)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of one loader, with --workers")
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    os.environ["PEER_SAMPLES"] = str(Path(args.samples).absolute())
    rates = (_mosaic if args.peer == "mosaic" else _litdata)(args)  # the samples are loaded only to write
    status = Path("/proc/self/status").read_text()  # VmHWM: unlike ru_maxrss, not inherited across exec
    rates["peak_rss_mib"] = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
