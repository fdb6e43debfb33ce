"""JPEG decoding on the GPU as a user would do it without outcore: torchvision's nvJPEG batch decode on CUDA, then
RandomResizedCrop(224) + flip on the GPU, batches of 256, shuffled epochs over an ImageNet-like folder: the GPU's
own anchor for outcore's CPU path.

    python benchmarks/device/gpu_decode.py FOLDER [EPOCHS]

Rows: decode only (the nvJPEG ceiling), decode + RRC + flip (the GPU pipeline). The files are read from the page
cache by a thread pool (as a DataLoader would feed them). Prints one JSON line per row. Needs CUDA and
torchvision (it says so and stops without them).
"""

from __future__ import annotations

import json
import random
import sys
import time
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


def main() -> None:
    root, epochs = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
    try:
        import torch
        import torchvision
    except ImportError as error:
        print(f"no torchvision here ({error}): nothing to measure")
        return
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return
    files = sorted(path for path in root.rglob("*") if path.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise SystemExit(f"no JPEGs under {root}")
    print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__,
                      "gpu": torch.cuda.get_device_name(0), "files": len(files)}), flush=True)
    for crop in (False, True):
        rates = [epoch(files, crop, seed) for seed in range(epochs)]
        print(json.dumps({"row": "nvJPEG decode + RRC(224) + flip on GPU" if crop else "nvJPEG decode only",
                          "img_s_each_epoch": [round(rate) for rate in rates],
                          "img_s_best_after_first": round(max(rates[1:] or rates))}), flush=True)


if __name__ == "__main__":
    main()
