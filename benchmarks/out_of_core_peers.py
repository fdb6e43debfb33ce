"""LitData and Mosaic streaming for ``benchmarks/out_of_core.py``: each writes the JPEG folder once in its
own format, as decoded pixels ("raw") and as the JPEG files' bytes ("jpeg"), then reads one shuffled
epoch with its own DataLoader (batch 256, one worker process per core), decoding JPEGs with Pillow.

Run by ``out_of_core.py --peers PYTHON`` with a Python that has them (their own environment, as
``benchmarks/remote_peers.py`` says). ``write`` prints nothing; ``read`` prints one JSON line.

    python benchmarks/out_of_core_peers.py write litdata-raw --folder bench-data/out-of-core/jpeg-24000 --output DIR
    python benchmarks/out_of_core_peers.py read litdata-raw --output DIR
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np
from remote_peers import _stand_in_for_torchvision

BATCH = 256
PEERS = ("litdata-raw", "litdata-jpeg", "mosaic-raw", "mosaic-jpeg")


def folder_samples(folder: Path) -> list[tuple[Path, int]]:
    files = sorted(folder.rglob("*.jpg"))
    classes = sorted({path.parent.name for path in files})
    return [(path, classes.index(path.parent.name)) for path in files]


def decode(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


def sample(item: tuple[Path, int], raw: bool) -> dict:
    data = Path(item[0]).read_bytes()
    return {"image": decode(data) if raw else data, "label": item[1]}


def _litdata_item(item: tuple[str, int, bool]) -> dict:
    path, label, raw = item
    return sample((Path(path), label), raw)


def write(peer: str, folder: Path, output: Path) -> None:
    shutil.rmtree(output, ignore_errors=True)
    items = folder_samples(folder)
    raw = peer.endswith("raw")
    if peer.startswith("litdata"):
        from litdata import optimize

        optimize(fn=_litdata_item, inputs=[(str(path), label, raw) for path, label in items],
                 output_dir=str(output), chunk_bytes="64MB", num_workers=os.cpu_count() or 1, mode="overwrite")
        return
    from streaming import MDSWriter

    columns = {"image": "ndarray:uint8" if raw else "bytes", "label": "int"}
    with MDSWriter(out=str(output), columns=columns, size_limit="64mb") as writer:
        for item in items:
            writer.write(sample(item, raw))


def read(peer: str, output: Path) -> dict:
    import torch

    workers = os.cpu_count() or 1
    began = time.perf_counter()
    if peer.startswith("litdata"):
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(str(output), shuffle=True, seed=1)
        loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                     collate_fn=lambda items: [_decoded(item) for item in items])
    else:
        from streaming import StreamingDataset

        dataset = StreamingDataset(local=str(output), shuffle=True, shuffle_seed=1, batch_size=BATCH)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                             collate_fn=lambda items: [_decoded(item) for item in items])
    samples = sum(len(batch) for batch in loader)
    seconds = time.perf_counter() - began
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"samples": samples, "seconds": seconds, "rss": rss * 1024}


def _decoded(item: dict) -> tuple[np.ndarray, int]:
    image = item["image"]
    return (decode(bytes(image)) if isinstance(image, (bytes, bytearray, memoryview)) else image), item["label"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["write", "read"])
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--folder", help="the JPEG folder (write)")
    parser.add_argument("--output", required=True, help="the peer's dataset folder")
    args = parser.parse_args()
    _stand_in_for_torchvision()
    if args.action == "write":
        write(args.peer, Path(args.folder), Path(args.output))
    else:
        print(json.dumps(read(args.peer, Path(args.output))))


if __name__ == "__main__":
    main()
