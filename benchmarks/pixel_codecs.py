"""Is there a faster choice for pixels where the disk is the limit? Lossless image codecs against Blosc
and the JPEGs an encoded store keeps, on photographs.

    pip install imagecodecs && python benchmarks/pixel_codecs.py [--images 1024] [--size 128]

Each candidate compresses the same photo crops (scikit-learn's sample photographs, random scales and
places; `outcore.imaging.synthetic.photo_crops`) one picture at a time (Blosc: 128 pictures, a chunk, at
a time), checks that every picture comes back exactly (JPEG, lossy, is the reference), and decodes all
of them on one core ``--repeats`` times (median). The last columns predict an epoch on this machine's
cores for each device of ``benchmarks/out_of_core.py``: the smaller of the cores' decoding and the
device's bandwidth over the bytes of a picture.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable

import imagecodecs
import numpy as np
from numcodecs import Blosc
from PIL import Image

from outcore.imaging.synthetic import photo_crops
from outcore.threads import available_cpus

DEVICES = {"cloud 200 MB/s": 200e6, "SATA 500 MB/s": 500e6, "disk 150 MB/s": 150e6}
CHUNK = 128


def jpeg(picture: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(picture).save(out, "JPEG", quality=90)
    return out.getvalue()


def blosc(cname: str, level: int, shuffle: int) -> tuple[Callable, Callable]:
    codec = Blosc(cname=cname, clevel=level, shuffle=shuffle)
    return codec.encode, codec.decode


CANDIDATES: dict[str, tuple[Callable, Callable, bool]] = {  # name: (encode, decode, per picture)
    "QOI": (imagecodecs.qoi_encode, imagecodecs.qoi_decode, True),
    "WebP lossless, method 0": (lambda a: imagecodecs.webp_encode(a, lossless=True, method=0),
                                imagecodecs.webp_decode, True),
    "JPEG-XL lossless, effort 1": (lambda a: imagecodecs.jpegxl_encode(a, lossless=True, effort=1),
                                   imagecodecs.jpegxl_decode, True),
    "PNG, level 1": (lambda a: imagecodecs.png_encode(a, level=1), imagecodecs.png_decode, True),
    "JPEG-LS": (imagecodecs.jpegls_encode, imagecodecs.jpegls_decode, True),
    "Blosc lz4:5:shuffle (outcore's)": (*blosc("lz4", 5, Blosc.SHUFFLE), False),
    "Blosc zstd:1:bitshuffle": (*blosc("zstd", 1, Blosc.BITSHUFFLE), False),
    "Blosc zstd:5:bitshuffle": (*blosc("zstd", 5, Blosc.BITSHUFFLE), False),
    "JPEG quality 90 (lossy: encoded)": (jpeg, imagecodecs.jpeg8_decode, True),
}


def measure(pictures: np.ndarray, encode: Callable, decode: Callable, per_picture: bool,
            repeats: int) -> tuple[int, float, bool]:
    """Bytes in all, decoded pictures per second on one core, and whether every picture came back exactly."""
    if per_picture:
        blobs = [encode(picture) for picture in pictures]
    else:
        blobs = [encode(np.ascontiguousarray(pictures[i : i + CHUNK])) for i in range(0, len(pictures), CHUNK)]
    decoded = [np.frombuffer(d, np.uint8) if isinstance(d, (bytes, bytearray)) else np.asarray(d)
               for d in map(decode, blobs)]
    back = np.concatenate([d.reshape(-1, *pictures.shape[1:]) for d in decoded])
    exact = back.shape == pictures.shape and np.array_equal(back, pictures)
    rates = []
    for _ in range(repeats):
        began = time.perf_counter()
        for blob in blobs:
            decode(blob)
        rates.append(len(pictures) / (time.perf_counter() - began))
    return sum(len(blob) for blob in blobs), statistics.median(rates), exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pictures = np.stack(photo_crops(args.images, (args.size, args.size), np.random.default_rng(0)))
    cores = available_cpus()
    raw = pictures.nbytes
    print(f"\n{args.images} photo crops {args.size}x{args.size}x3 ({raw / 2**20:.0f} MiB); imagecodecs "
          f"{imagecodecs.__version__}; predicted epochs on {cores} cores (samples/s)\n")
    header = (f"{'codec':34s} {'ratio':>6s} {'exact':>5s} {'MB/s/core':>9s} {'pics/s/core':>11s}"
              + "".join(f" {device:>15s}" for device in DEVICES))
    print(header)
    print("-" * len(header))
    for name, (encode, decode, per_picture) in CANDIDATES.items():
        nbytes, rate, exact = measure(pictures, encode, decode, per_picture, args.repeats)
        per_picture_bytes = nbytes / len(pictures)
        epochs = [min(cores * rate, bandwidth / per_picture_bytes) for bandwidth in DEVICES.values()]
        print(f"{name:34s} {raw / nbytes:6.2f} {'yes' if exact else 'NO':>5s} "
              f"{rate * raw / len(pictures) / 1e6:9.0f} {rate:11,.0f}" + "".join(f" {e:15,.0f}" for e in epochs))


if __name__ == "__main__":
    main()
