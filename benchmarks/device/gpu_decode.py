"""JPEG decoding on the GPU: as a user would do it without outcore (torchvision's nvJPEG batch decode on CUDA, then
RandomResizedCrop(224) + flip on the GPU, batches of 256, shuffled epochs over an ImageNet-like folder), and
outcore's ``ds.torch(decode="cuda")`` on a store of the same files against its CPU path.

    python benchmarks/device/gpu_decode.py FOLDER [EPOCHS] [--store STORE] [--device cuda]

Rows: decode only (the nvJPEG ceiling), decode + RRC + flip (the GPU pipeline), the files read from the page
cache by a thread pool (as a DataLoader would feed them); with ``--store`` (an encoded store of pictures at their
own sizes, e.g. imagenet.py's ``own.zarr``): ``ds.torch(256, shuffle=True, transform=RRC(224) + flip)`` decoded
on the device and on the CPU (the batches then copied to the device), and how far their pixels differ (the same
boxes: mean and largest absolute difference of the first batches), and the calls a batch decoded on the device
makes to torch's operators, views left out (on a GPU, each launches work: what the training process's thread
pays, a batch). Prints one JSON line per row. The nvJPEG rows
need CUDA and torchvision; ``--device cpu`` runs outcore's rows anywhere (outcore's decoder on the CPU in the
loader's process: the pipeline checked, not a GPU's speed).
"""

from __future__ import annotations

import argparse
import json
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BATCH = 256


def epoch(files: list[Path], crop: bool, seed: int) -> float:
    """Images/s of one shuffled epoch decoded on the GPU (and cut, resized and flipped there with ``crop``)."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import RandomResizedCrop
    from torchvision.transforms.v2 import functional

    order = files[:]
    random.Random(seed).shuffle(order)
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    with ThreadPoolExecutor(8) as pool:
        read = pool.map(lambda batch: [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
                                       for path in batch], batches)
        began, count = time.perf_counter(), 0
        for datas in read:
            images = decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda")
            if crop:
                cut = []
                for image in images:
                    top, left, height, width = RandomResizedCrop.get_params(image, (0.08, 1.0), (3 / 4, 4 / 3))
                    box = functional.resized_crop(image, top, left, height, width, [224, 224], antialias=True)
                    cut.append(box.flip(-1) if random.random() < 0.5 else box)
                torch.stack(cut)
            count += len(datas)
        torch.cuda.synchronize()
    return count / (time.perf_counter() - began)


def outcore_epochs(store: Path, device: str, epochs: int) -> dict[str, object]:
    """``ds.torch`` RRC(224) + flip epochs decoded on ``device`` and on the CPU (then copied there), and how far the
    first batches' pixels differ."""
    import torch

    import outcore
    from outcore.adapters.torch import to_device
    from outcore.transforms import Compose, RandomFlip, RandomResizedCrop

    ds = outcore.open_dataset(store)
    train = Compose([RandomResizedCrop(224), RandomFlip()])
    pinned = device.startswith("cuda")
    loaders = {"here": ds.torch(BATCH, shuffle=True, transform=train, fields=["images", "labels"], pin_memory=pinned),
               "there": ds.torch(BATCH, shuffle=True, transform=train, fields=["images", "labels"], decode=device)}
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():  # interleaved: a busy moment slows both
            began, count = time.perf_counter(), 0
            for batch in (to_device(loader, device) if name == "here" else loader):
                count += len(batch["images"])
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            rates[name].append(count / (time.perf_counter() - began))
    first = {name: next(iter(loader))["images"] for name, loader in loaders.items()}  # one epoch's: the same boxes
    difference = (first["there"].cpu().int() - first["here"].cpu().int()).abs().float()
    calls = operator_calls(lambda: next(iter(loaders["there"])))
    return {"store": str(store), "samples": len(ds), "img_s_cpu_path_each_epoch": [round(r) for r in rates["here"]],
            f"img_s_decode_{device}_each_epoch": [round(r) for r in rates["there"]],
            "pixels_mean_abs_difference": round(float(difference.mean()), 3),
            "pixels_largest_difference": int(difference.max()), "operator_calls_a_batch": sum(calls.values()),
            "operators_called_most": dict(calls.most_common(4))}


def operator_calls(action: Callable[[], object]) -> Counter[str]:
    """The torch operators ``action()`` calls, views left out (they launch no work): how many times each."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counted: Counter[str] = Counter()

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                counted[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    with Counting():
        action()
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("epochs", type=int, nargs="?", default=2)
    parser.add_argument("--store", type=Path, help="an encoded store of the folder's pictures at their own sizes")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    try:
        import torch
        import torchvision
    except ImportError as error:
        torch = torchvision = None
        print(f"no torchvision here ({error}): no nvJPEG rows")
    if torchvision is not None and torch.cuda.is_available():
        files = sorted(path for path in args.folder.rglob("*") if path.suffix.lower() in (".jpg", ".jpeg"))
        if not files:
            raise SystemExit(f"no JPEGs under {args.folder}")
        print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__,
                          "gpu": torch.cuda.get_device_name(0), "files": len(files)}), flush=True)
        for crop in (False, True):
            rates = [epoch(files, crop, seed) for seed in range(args.epochs)]
            print(json.dumps({"row": "nvJPEG decode + RRC(224) + flip on GPU" if crop else "nvJPEG decode only",
                              "img_s_each_epoch": [round(rate) for rate in rates],
                              "img_s_best_after_first": round(max(rates[1:] or rates))}), flush=True)
    elif args.device.startswith("cuda"):
        print("no CUDA GPU with torchvision: nothing to measure")
        return
    if args.store is not None:
        row = f"outcore ds.torch(decode={args.device!r}) against its CPU path"
        try:
            print(json.dumps({"row": row, **outcore_epochs(args.store, args.device, args.epochs)}), flush=True)
        except Exception as error:  # noqa: BLE001 - the row's result: the run goes on to say what failed, and where
            traceback.print_exc()
            print(json.dumps({"row": row, "failed": f"{type(error).__name__}: {error}"}), flush=True)


if __name__ == "__main__":
    main()
