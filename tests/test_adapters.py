"""Framework adapters with real frameworks: Keras model.fit, tf.data and a PyTorch training loop."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import outcore
from outcore.testing import write_image_folder
from outcore.transforms import Normalize

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
CLASSES = ("disc", "square", "hstripes")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    write_image_folder(root / "train", 150, classes=CLASSES, size=(32, 32), seed=0)
    write_image_folder(root / "val", 40, classes=CLASSES, size=(32, 32), seed=1)
    train = outcore.ingest_images(root / "train", root / "train.zarr", shape=(32, 32, 3), chunk_size=32,
                                  progress=False)
    val = outcore.ingest_images(root / "val", root / "val.zarr", shape=(32, 32, 3), progress=False)
    return train, val


@pytest.fixture
def ids_store(tmp_path):
    return outcore.from_arrays({"images": np.zeros((1000, 4, 4, 3), np.uint8), "id": np.arange(1000)},
                               tmp_path / "ids.zarr", chunk_size=32, progress=False)


# -- PyTorch ------------------------------------------------------------------------------------------------


START_METHODS = ["fork", "spawn", "forkserver"]


@pytest.mark.parametrize("start_method", START_METHODS)
def test_torch_workers_and_ranks_share_an_epoch_exactly_once(ids_store, start_method):
    ids_store["images"][:10].compute()  # read in the parent before the workers start
    seen = []
    for rank in range(2):
        loader = ids_store.torch(50, num_workers=2, rank=rank, world_size=2, seed=4,
                                 multiprocessing_context=start_method)
        batches = list(loader)
        assert len(batches) == len(loader) == 10  # every rank the same number of batches
        seen.append(np.concatenate([b["id"].numpy() for b in batches]))
    assert sorted(np.concatenate(seen).tolist()) == list(range(1000))


@pytest.mark.parametrize("start_method", START_METHODS)
def test_torch_resume_mid_epoch_is_exact_for_every_start_method(ids_store, start_method):
    def loader():
        made = ids_store.torch(64, num_workers=2, seed=5, multiprocessing_context=start_method)
        made.set_epoch(2)
        return made

    uninterrupted = [b["id"].numpy() for b in loader()]
    interrupted, head = loader(), []
    for batch in interrupted:
        head.append(batch["id"].numpy())
        if len(head) == 5:
            break
    state = json.loads(json.dumps(interrupted.state_dict()))  # saved with a checkpoint
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [b["id"].numpy() for b in resumed]
    assert len(head + tail) == len(uninterrupted) == 16
    for got, expected in zip(head + tail, uninterrupted, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_torch_passes_dataloader_keywords_through(ids_store):
    loader = ids_store.torch(100, num_workers=2, prefetch_factor=3, timeout=60, worker_init_fn=_set_threads,
                             multiprocessing_context="fork", seed=1)
    assert (loader.prefetch_factor, loader.timeout, loader.worker_init_fn) == (3, 60, _set_threads)
    assert sorted(np.concatenate([b["id"].numpy() for b in loader]).tolist()) == list(range(1000))
    with pytest.raises(ValueError, match="persistent_workers=True is not supported"):
        ids_store.torch(100, num_workers=2, persistent_workers=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_wrokers'"):
        ids_store.torch(100, num_wrokers=2)


def test_a_transform_that_cannot_pickle_is_named_before_spawned_workers_start(ids_store):
    with pytest.raises(ValueError, match="started by 'spawn' receive the dataset pickled.*module level"):
        ids_store.torch(100, num_workers=2, multiprocessing_context="spawn", transform=lambda batch, rng: batch)
    ids_store.torch(100, num_workers=2, multiprocessing_context="fork", transform=lambda batch, rng: batch)


def _set_threads(worker: int) -> None:
    import torch

    torch.set_num_threads(1)


def test_torch_batches_in_a_plain_dataloader(ids_store):
    import torch

    from outcore.adapters.torch import TorchBatches

    batches = TorchBatches(ids_store, 100, seed=1)  # built without knowing the DataLoader's workers
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2)
    assert sorted(np.concatenate([b["id"].numpy() for b in loader]).tolist()) == list(range(1000))


def test_torch_epochs_advance_and_set_epoch_repeats(ids_store):
    loader = ids_store.torch(100, num_workers=2, seed=4)
    first = np.concatenate([b["id"].numpy() for b in loader])
    stats = loader.stats()
    assert stats["batches"] == 10 and stats["samples"] == 1000 and 0 <= stats["wait_fraction"] <= 1
    second = np.concatenate([b["id"].numpy() for b in loader])
    assert not np.array_equal(first, second) and sorted(second.tolist()) == list(range(1000))
    loader.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate([b["id"].numpy() for b in loader]), first)


def test_torch_training_loop_learns(splits):
    import torch

    train, val = splits
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = train.torch(32, num_workers=2, channels_first=True, fields=["images", "labels"], transform=Normalize())
    for _ in range(3):
        for batch in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
            loss.backward()
            optimizer.step()
    correct = 0
    with torch.no_grad():
        for batch in val.torch(64, num_workers=0, shuffle=False, channels_first=True, transform=Normalize()):
            correct += int((model(batch["images"]).argmax(1) == batch["labels"]).sum())
    assert correct / len(val) > 0.5  # three classes: chance is 1/3


# -- Keras and tf.data --------------------------------------------------------------------------------------


def _cnn():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_keras_fit_with_validation_learns(splits):
    train, val = splits
    model = _cnn()
    history = model.fit(train.keras(32, x="images", y="labels", transform=Normalize()), epochs=4, verbose=0,
                        validation_data=val.keras(32, x="images", y="labels", shuffle=False, transform=Normalize()))
    assert history.history["val_accuracy"][-1] > 0.5
    predictions = model.predict(val.keras(32, x="images", shuffle=False, transform=Normalize()), verbose=0)
    assert predictions.shape == (len(val), 3)


def test_keras_resume_after_an_epoch_sees_the_same_batches(splits):
    from outcore.adapters.keras import KerasBatches

    train, _ = splits

    class Recording(KerasBatches):
        """Records what the model is fed, by (epoch, batch index)."""

        def __init__(self, log):
            super().__init__(train, 32, x="images", y="labels", transform=Normalize())
            self.log = log

        def __getitem__(self, index):
            x, y = super().__getitem__(index)
            self.log[self.iterator.epoch, index] = hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
            return x, y

    uninterrupted: dict = {}
    _cnn().fit(Recording(uninterrupted), epochs=2, verbose=0)
    first: dict = {}
    data = Recording(first)
    _cnn().fit(data, epochs=1, verbose=0)
    state = data.state_dict()  # saved beside the model checkpoint
    assert state["epoch"] == 1
    resumed: dict = {}
    again = Recording(resumed)
    again.load_state_dict(state)
    _cnn().fit(again, initial_epoch=1, epochs=2, verbose=0)
    assert len(uninterrupted) == 2 * len(data)
    assert {**first, **resumed} == uninterrupted
    assert [first[0, i] for i in range(len(data))] != [resumed[1, i] for i in range(len(data))]


def test_tf_data_pipeline(splits):
    import keras
    import tensorflow as tf

    train, _ = splits
    data = train.tf(32, x="images", y="labels", drop_last=True)
    assert data.element_spec == (tf.TensorSpec((32, 32, 32, 3), tf.uint8, name="images"),
                                 tf.TensorSpec((32,), tf.int64, name="labels"))
    assert int(data.cardinality()) == len(train) // 32
    scaled = data.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y)).prefetch(2)
    history = _cnn().fit(scaled, epochs=3, verbose=0, shuffle=False)
    assert history.history["accuracy"][-1] > 0.5
    assert keras.backend.backend() == "tensorflow"


def test_loader_stats(ids_store):
    it = ids_store.batches(100)
    for _ in it:
        pass
    stats = it.stats()
    assert stats["batches"] == 10 and stats["samples"] == 1000
    assert set(stats) >= {"samples_per_s", "wait_mean_ms", "wait_p95_ms", "wait_fraction", "ready_mean"}
    assert 0 <= stats["wait_fraction"] <= 1


def test_keras_multi_input_dict_and_sample_weights(tmp_path, rng):
    import keras

    n = 256
    a, b = rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)
    target = (a[:, 0] + b[:, 1] > 0).astype(np.int64)
    weight = np.where(target == 1, 2.0, 1.0).astype(np.float32)
    ds = outcore.from_arrays({"a": a, "b": b, "target": target, "weight": weight}, tmp_path / "m.zarr",
                             progress=False)
    data = ds.keras(64, x={"left": "a", "right": "b"}, y="target", sample_weight="weight")
    x, _, w = data[0]
    assert set(x) == {"left", "right"} and x["left"].shape == (64, 4) and w.dtype == np.float32
    left, right = keras.Input((4,), name="left"), keras.Input((2,), name="right")
    output = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([left, right]))
    model = keras.Model({"left": left, "right": right}, output)
    model.compile("adam", "binary_crossentropy")
    history = model.fit(data, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    pairs = ds.keras(64, x=("a", "b"), y=("target", "weight"))[1]
    assert isinstance(pairs[0], tuple) and len(pairs[0]) == 2 and len(pairs[1]) == 2


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes:UserWarning")  # 2-core CI
@pytest.mark.parametrize(("workers", "stop"), [(2, 7), (3, 1), (3, 16)])
def test_torch_resume_mid_epoch_in_a_new_loader(ids_store, workers, stop):
    loader = ids_store.torch(64, num_workers=workers, seed=5)
    loader.set_epoch(3)
    uninterrupted = [b["id"].numpy() for b in loader]
    assert len(uninterrupted) == len(loader)
    interrupted = ids_store.torch(64, num_workers=workers, seed=5)
    interrupted.set_epoch(3)
    head = []
    for batch in interrupted:
        head.append(batch["id"].numpy())
        if len(head) == stop:
            break
    state = interrupted.state_dict()
    assert state["epoch"] == 3 and sum(state["positions"]) == stop
    resumed = ids_store.torch(64, num_workers=workers, seed=5)
    resumed.load_state_dict(state)
    tail = [b["id"].numpy() for b in resumed]
    assert len(head) + len(tail) == len(uninterrupted)
    for got, expected in zip(head + tail, uninterrupted, strict=True):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="seed"):
        ids_store.torch(64, num_workers=workers, seed=6).load_state_dict(state)


def test_to_device_on_the_cpu_passes_batches_through(ids_store):
    from outcore.adapters.torch import to_device

    loader = ids_store.torch(100, num_workers=0, shuffle=False)
    moved = [b["id"].numpy() for b in to_device(loader, "cpu")]
    np.testing.assert_array_equal(np.concatenate(moved), ids_store["id"].compute())  # storage order


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
def test_to_device_overlaps_copies_on_a_gpu(ids_store):
    import torch

    from outcore.adapters.torch import to_device

    loader = ids_store.torch(100, num_workers=2, shuffle=False, pin_memory=True)
    batches = list(to_device(loader, "cuda"))
    assert all(b["id"].device.type == "cuda" for b in batches)
    assert torch.equal(torch.cat([b["id"] for b in batches]).cpu(), torch.from_numpy(ids_store["id"].compute()))
