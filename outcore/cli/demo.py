"""``outcore demo``: the main job end to end on real photographs, in about a minute.

1. cut the sample photographs that scikit-image and scikit-learn ship (an astronaut, a cat, coffee, a
   rocket, a Chinese temple, a flower: one class each) into train/val/test folders of JPEG crops;
2. ingest each split into one single-file store (``train.zarr.zip`` …), in parallel, with progress;
3. print ``outcore info`` of the training store, compare it with an encoded store, verify every checksum;
4. train a small Keras CNN for a few epochs on shuffled, augmented batches streamed from the training
   store (`Dataset.batches`), and report its throughput, the share of time it waited for data and
   the shuffle quality;
5. predict the test split through ``ds.keras`` (store order, so rows line up with labels and paths),
   stream the predictions into a new store with `Writer`, report the test accuracy, and print the
   commands that do the same on the user's own folders.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..dataset import Dataset
from ..errors import OptionError
from ..imaging.synthetic import SAMPLE_PHOTOS, write_image_folder
from ..ingest import Writer, ingest_images, progress_bar
from ..iterate import shuffle_quality
from ..iterate.transforms import Compose, Normalize, RandomFlip
from ..storage.report import field_reports, human_size
from .info import describe
from .verify import verify

SPLITS = {"train": 1.0, "val": 0.25, "test": 0.25}
BATCH = 64
NORMALIZE = Normalize(0.5, 0.25)


def run_demo(workdir: str | Path, *, per_class: int = 200, size: int = 64, epochs: int = 3, client: Any = None,
             progress: bool = True, started: float | None = None) -> float:
    """Run the demo in ``workdir`` (its pictures, stores and predictions stay there); return the test
    accuracy (chance is 1/6). The time it says it took counts from ``started`` (a `time.time`; the
    command passes its process's start), else from the call.

    >>> run_demo("outcore-demo", per_class=100, epochs=2)  # doctest: +SKIP
    """
    started = time.time() if started is None else started
    keras = _keras()
    workdir = Path(workdir)
    _say(f"outcore demo: everything goes to {workdir.absolute()}")
    stores = {}
    for offset, (split, fraction) in enumerate(SPLITS.items()):
        folder = workdir / "photos" / split
        if not folder.exists():
            count = max(2, int(per_class * fraction))
            write_image_folder(folder, count, classes=SAMPLE_PHOTOS, size=(size, size), kind="sample-photos",
                               seed=offset)
            _say(f"cut {count * len(SAMPLE_PHOTOS)} {size}x{size} JPEG crops of the sample photographs into {folder}")
        stores[split] = ingest_images(folder, workdir / f"{split}.zarr.zip", shape=(size, size, 3), overwrite=True,
                                      client=client, progress=progress)
    train, val, test = stores["train"], stores["val"], stores["test"]
    _say("\n" + describe(train) + "\n")
    _compare_with_encoded(train, workdir, size, client, progress)
    _say(verify(train.location, progress=progress))

    model = _small_cnn(keras, size, len(train.classes))
    batches = train.batches(BATCH, fields=["images", "labels"], seed=0, transform=Compose([RandomFlip(), NORMALIZE]))
    for epoch in range(epochs):  # each pass over `batches` is a new epoch: another order, other flips
        with progress_bar(len(batches), f"epoch {epoch + 1}/{epochs}", "batches", progress) as bar:
            for batch in batches:
                loss, accuracy = model.train_on_batch(batch["images"], batch["labels"])
                bar.set_postfix(loss=f"{float(loss):.3f}", accuracy=f"{float(accuracy):.2f}", refresh=False)
                bar.update()
        _, val_accuracy = model.evaluate(val.keras(BATCH, x="images", y="labels", transform=NORMALIZE), verbose=0)
        _say(f"epoch {epoch + 1}: validation accuracy {val_accuracy:.1%}")
    stats = batches.stats()
    _say(f"\ntraining ran at {stats['samples_per_s']:,.0f} samples/s (the model's pace) and waited for data "
         f"{stats['wait_fraction']:.1%} of the time (mean wait {stats['wait_mean_ms']:.1f} ms per batch)")
    _say(shuffle_quality(train, batch_size=BATCH))

    accuracy = _predict_to_store(model, test, workdir / "test-predictions.zarr")
    _say(f"\ntest accuracy: {accuracy:.1%} (chance {1 / len(test.classes):.1%}); predictions in "
         f"{workdir / 'test-predictions.zarr'}; demo took {time.time() - started:.0f} s")
    _say(_your_own_folders(size))
    return accuracy


def _keras() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up notes are not the demo's
    try:
        with _native_stderr_muted():  # its oneDNN and absl lines are written by C++ whatever the level
            import keras  # the demo trains with Keras (the tf extra)
        import skimage  # noqa: F401
        import sklearn  # noqa: F401 - the sample photographs (the demo extra)
    except ImportError as error:
        raise OptionError(f"outcore demo needs Keras, scikit-image and scikit-learn ({error}): "
                          "pip install 'outcore[demo]'") from None
    return keras


@contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null while the block runs (Python's exceptions still propagate)."""
    sys.stderr.flush()
    kept = os.dup(2)
    try:
        with open(os.devnull, "wb") as nowhere:
            os.dup2(nowhere.fileno(), 2)
        yield
    finally:
        os.dup2(kept, 2)
        os.close(kept)


def _small_cnn(keras: Any, size: int, classes: int) -> Any:
    keras.utils.set_random_seed(0)
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((size, size, 3)),
        layers.Conv2D(16, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"), layers.GlobalAveragePooling2D(),
        layers.Dropout(0.2), layers.Dense(classes, activation="softmax"),
    ])
    model.compile(keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _compare_with_encoded(train: Dataset, workdir: Path, size: int, client: Any, progress: bool) -> None:
    """Photographs' pixels barely compress without loss (ratio near 1.0x); their JPEG bytes are smaller."""
    encoded = ingest_images(workdir / "photos" / "train", workdir / "train-encoded.zarr.zip", shape=(size, size, 3),
                            images="encoded", overwrite=True, client=client, progress=progress)
    pixels = next(r for r in field_reports(train) if r.name == "images")
    files = next(r for r in field_reports(encoded) if r.name == "images")
    _say(f"the pixels take {human_size(pixels.stored)} on disk ({pixels.ratio}: photographs' pixels barely "
         f"compress without loss); the same pictures as JPEG bytes ({encoded.location}, --images encoded, "
         f"decoded while reading) take {human_size(files.stored)} ({pixels.stored / files.stored:.1f}x smaller)\n")


def _predict_to_store(model: Any, test: Dataset, location: Path) -> float:
    """Predictions in store order (``ds.keras`` with ``x`` alone does not shuffle): row i is sample i."""
    probabilities = model.predict(test.keras(BATCH, x="images", transform=NORMALIZE), verbose=0)
    predicted = probabilities.argmax(axis=1)
    with Writer(location, overwrite=True, roles={"predicted": "target"},
                classes={"predicted": test.classes}) as out:
        out.append({"predicted": predicted, "probability": probabilities.max(axis=1).astype(np.float32)})
    return float((predicted == test["labels"].compute()).mean())


def _your_own_folders(size: int) -> str:
    return f"""
the same on your own pictures (one sub-folder per class in each split):
  outcore ingest my_photos/train train.zarr --shape {size}x{size}x3
  outcore ingest my_photos/val val.zarr --shape {size}x{size}x3
  outcore info train.zarr && outcore verify train.zarr && outcore bench train.zarr
then, in Python:
  ds, val = outcore.open_dataset("train.zarr"), outcore.open_dataset("val.zarr")
  model.fit(ds.keras({BATCH}, x="images", y="labels"), validation_data=val.keras({BATCH}, x="images", y="labels"))"""


def _say(text: object) -> None:
    """A line of the demo's story, shown at once even through a pipe (a log, ``tee``): the demo takes minutes."""
    print(text, flush=True)
