"""Keep the JPEGs, and let a Dask cluster ingest them and decode and augment every batch.

    python examples/on_a_cluster.py [WORKDIR]

A LocalCluster stands in for a real one: with `Client("tcp://scheduler:8786")` the code is the same,
as long as every worker sees WORKDIR at the same path (docs/distributed.md).
"""

import sys
from pathlib import Path

from distributed import Client, LocalCluster

import outcore
from outcore.imaging.synthetic import write_image_folder
from outcore.transforms import BrightnessContrast, Compose, RandomCrop, RandomFlip

if __name__ == "__main__":  # worker processes import this file: start the cluster only once
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "example-data")
    write_image_folder(workdir / "photos", 100, classes=("disc", "square"), size=(80, 80))
    augment = Compose([RandomCrop((56, 56)), RandomFlip(), BrightnessContrast()])

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        print("dashboard:", client.dashboard_link)
        ds = outcore.ingest_images(workdir / "photos", workdir / "photos.zarr", shape=(64, 64, 3), images="encoded",
                                   chunk_size=32, client=client, overwrite=True, progress=False)
        print(ds)

        it = ds.batches(32, seed=0, transform=augment, client=client)
        for epoch in range(2):
            labels = [int(label) for batch in it for label in batch["labels"]]
            print(f"epoch {epoch}: {len(labels)} samples, first labels {labels[:8]}")
        print(it.stats())
