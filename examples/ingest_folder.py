"""Ingest an image folder into one single-file store per split, then look at it.

    python examples/ingest_folder.py [WORKDIR]
"""

import sys
from pathlib import Path

import outcore
from outcore.imaging.synthetic import write_image_folder

workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "example-data")
for split, seed in (("train", 0), ("val", 1)):
    write_image_folder(workdir / "photos" / split, 30, classes=("disc", "square", "stripes"), size=(48, 48), seed=seed)
    ds = outcore.ingest_images(workdir / "photos" / split, workdir / f"{split}.zarr.zip", shape=(32, 32, 3),
                               overwrite=True, progress=False)
    print(ds)

train = outcore.open_dataset(workdir / "train.zarr.zip")
first = train["images"][:4].compute()           # numpy (4, 32, 32, 3), read chunk-wise
print("first labels:", [train.classes[i] for i in train["labels"][:4].compute()])
print("first files: ", list(train["path"][:4].compute()))
print("pixel mean of the first chunk:", float(train["images"][: train.chunk_size].mean().compute()))
assert first.shape == (4, 32, 32, 3)
