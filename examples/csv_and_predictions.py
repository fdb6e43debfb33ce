"""Ingest from a CSV of paths and labels, then stream per-sample results into a second store.

    python examples/csv_and_predictions.py [WORKDIR]
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

import outcore
from outcore.imaging.synthetic import write_image_folder

workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "example-data")
files = write_image_folder(workdir / "images", 20, classes=("a", "b"), size=(40, 40), extension=".png")
table = pd.DataFrame({
    "path": [f.relative_to(workdir).as_posix() for f in files],
    "kind": [f.parent.name for f in files],           # strings: stored as class indices
    "score": np.linspace(0.0, 1.0, len(files)),       # numbers: stored as they are
})
table.to_csv(workdir / "labels.csv", index=False)

ds = outcore.ingest_dataframe(workdir / "labels.csv", workdir / "images.zarr", label_columns=["kind", "score"],
                              shape=(40, 40, 3), resize=None, overwrite=True, progress=False)
print(ds)

# Stream a result per sample, one chunk at a time (here: the mean brightness).
with outcore.Writer(workdir / "brightness.zarr", overwrite=True) as out:
    for start in range(0, len(ds), ds.chunk_size):
        images = ds["images"][start : start + ds.chunk_size].compute()
        out.append({"brightness": images.mean(axis=(1, 2, 3)).astype("float32")})
print(outcore.open_dataset(workdir / "brightness.zarr"))
