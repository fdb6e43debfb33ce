"""Keras and TensorFlow with the real frameworks: model.fit, resume after an epoch, tf.data."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.optional import need

import outcore
from outcore.storage.chunk_reads import map_files
from outcore.transforms import Normalize

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


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


def _recording(store, log, **options):
    """A KerasBatches that logs what the model is fed, epoch by epoch, in the order Keras asks."""
    from outcore.adapters.keras import KerasBatches

    class Recording(KerasBatches):
        def __init__(self):
            super().__init__(store, 32, x="images", y="labels", **options)
            self.fed = None  # the epoch's list while Keras runs one

        def on_epoch_begin(self):
            super().on_epoch_begin()
            self.fed = log.setdefault(self.epoch, [])

        def on_epoch_end(self):
            self.fed = None
            super().on_epoch_end()

        def __getitem__(self, index):
            x, y = super().__getitem__(index)
            if self.fed is not None:  # not Keras' peeks at shapes before an epoch
                self.fed.append(hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest())
            return x, y

    return Recording()


def _hashes(store, epoch, **options):
    iterator = store.batches(32, fields=["images", "labels"], **options)
    iterator.set_epoch(epoch)
    return [hashlib.sha256(b["images"].tobytes() + b["labels"].tobytes()).hexdigest() for b in iterator]


@pytest.mark.parametrize("process", [False, 2])
def test_keras_fit_is_fed_outcore_order_whatever_order_keras_asks_in(splits, process):
    """fit(shuffle=True) asks for batch indices in a random order: the model still gets ds.batches' batches in
    ds.batches' order, each exactly once, and a new order each epoch; made by two processes (each its part of
    every batch), the same."""
    train, _ = splits
    log: dict = {}
    data = _recording(train, log, seed=5, process=process)
    _cnn().fit(data, epochs=2, verbose=0, shuffle=True)
    assert sorted(log) == [0, 1] and data.epoch == 2
    for epoch in (0, 1):
        assert log[epoch] == _hashes(train, epoch, seed=5)
    assert log[0] != log[1]


BACKEND_RUN = """
import json, sys
import numpy as np
import keras, outcore
from outcore.adapters.keras import KerasBatches
from outcore.testing.reads import chunk_reads, count_chunk_reads

ds = outcore.open_dataset(sys.argv[1])
events = []


class Recorded(KerasBatches):
    def __getitem__(self, index):
        batch = super().__getitem__(index)
        events.append(("get", batch[-1].tolist()))  # the ids (y) of fit and evaluate
        return batch

    def on_epoch_begin(self):
        events.append(("begin",))
        super().on_epoch_begin()

    def on_epoch_end(self):
        events.append(("end",))
        super().on_epoch_end()


def plain_reads(epochs, **options):
    count_chunk_reads()
    iterator = ds.batches(10, fields=["x", "id"], **options)
    for epoch in epochs:
        iterator.set_epoch(epoch)
        for _ in iterator:
            pass
    return chunk_reads()


plain = {"fit": plain_reads([0, 1], seed=3), "evaluate": plain_reads([0], shuffle=False)}
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
count_chunk_reads()
fit = Recorded(ds, 10, x="x", y="id", seed=3)
model.fit(fit, epochs=2, verbose=0)
fit_reads = chunk_reads()
count_chunk_reads()
model.evaluate(Recorded(ds, 10, x="x", y="id", shuffle=False), verbose=0)
evaluate_reads = chunk_reads()
predicted = model.predict(Recorded(ds, 10, x="x"), verbose=0)
print(json.dumps({"events": events, "fit_reads": fit_reads, "evaluate_reads": evaluate_reads, "plain": plain,
                  "predicted": len(predicted)}))
"""


def _served(events: list) -> list[list[list[int]]]:
    """The batches served inside each epoch Keras ran (a one-batch epoch before the first is its peek)."""
    epochs, current = [], None
    for event in events:
        if event[0] == "begin":
            current = []
        elif event[0] == "end":
            if current is not None:
                epochs.append(current)
            current = None
        elif current is not None:
            current.append(event[1])
    return epochs


@pytest.mark.parametrize("backend", ["jax", "torch", "tensorflow"])
def test_fit_and_evaluate_get_exactly_outcores_order_under_each_keras_backend(tmp_path, backend):
    """Keras' JAX and torch backends peek at a batch in a one-batch epoch before the first: that batch is the
    epoch's first, read once, and the model is fed ds.batches' order exactly; TensorFlow peeks outside."""
    if backend != "tensorflow":
        need(backend)
    ids = np.arange(160)
    ds = outcore.from_arrays({"x": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "id": ids},
                             tmp_path / "s.zarr", chunk_size=20, shuffle_on_write=False, progress=False)
    result = subprocess.run([sys.executable, "-c", BACKEND_RUN, str(ds.location)], capture_output=True, text=True,
                            env={**os.environ, "KERAS_BACKEND": backend}, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    epochs = [epoch for epoch in _served(got["events"]) if len(epoch) > 1]
    expected = []
    for epoch in (0, 1):
        iterator = ds.batches(10, fields=["x", "id"], seed=3)
        iterator.set_epoch(epoch)
        expected.append([batch["id"].tolist() for batch in iterator])
    assert epochs[:2] == expected  # fit: outcore's order, each batch once, epoch by epoch
    assert epochs[2] == [list(range(start, start + 10)) for start in range(0, 160, 10)]  # evaluate: store order
    if backend != "tensorflow":  # the chunks ds.batches reads, no more (TensorFlow's peeks are read on demand)
        assert (got["fit_reads"], got["evaluate_reads"]) == (got["plain"]["fit"], got["plain"]["evaluate"])
    assert got["predicted"] == 160


PINNED_RUN = """
import json, sys
import numpy as np
import torch
import outcore
ds = outcore.open_dataset(sys.argv[1])
batches = ds.keras(10, x="x", y="id", seed=3)
batches.on_epoch_begin()
served = [batches[i] for i in range(len(batches))]
batches.on_epoch_end()
cuda = torch.cuda.is_available()
print(json.dumps({"cuda": cuda, "ids": [y.tolist() for _, y in served],
                  "pinned": [bool(torch.from_numpy(x).is_pinned()) for x, _ in served] if cuda else []}))
"""


def test_under_keras_torch_backend_batches_are_made_in_pinned_memory_where_a_gpu_takes_them(tmp_path):
    """Keras' torch backend copies each batch to the GPU as it takes it: on a CUDA machine the batches are made in
    pinned memory (a copy straight to the device); without a GPU, in plain memory. The same batches either way."""
    need("torch")
    ids = np.arange(60)
    ds = outcore.from_arrays({"x": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "id": ids},
                             tmp_path / "s.zarr", chunk_size=20, shuffle_on_write=False, progress=False)
    result = subprocess.run([sys.executable, "-c", PINNED_RUN, str(ds.location)], capture_output=True, text=True,
                            env={**os.environ, "KERAS_BACKEND": "torch"}, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["ids"] == [batch["id"].tolist() for batch in ds.batches(10, fields=["x", "id"], seed=3)]
    assert got["pinned"] == ([True] * 6 if got["cuda"] else [])


def test_keras_resume_after_an_epoch_sees_the_same_batches(splits):
    train, _ = splits
    uninterrupted: dict = {}
    _cnn().fit(_recording(train, uninterrupted, transform=Normalize()), epochs=2, verbose=0)
    first: dict = {}
    data = _recording(train, first, transform=Normalize())
    _cnn().fit(data, epochs=1, verbose=0)
    state = data.state_dict()  # saved beside the model checkpoint
    assert state["epoch"] == 1
    resumed: dict = {}
    again = _recording(train, resumed, transform=Normalize())
    again.load_state_dict(state)
    _cnn().fit(again, initial_epoch=1, epochs=2, verbose=0)
    assert {**first, **resumed} == uninterrupted and len(uninterrupted[1]) == len(data)
    assert uninterrupted[0] != uninterrupted[1]
    on_two_ranks = train.keras(16, x="images", y="labels", transform=Normalize(), rank=1, world_size=2)
    on_two_ranks.load_state_dict(state)  # the same global batch (16 x 2): the run goes on on two ranks
    assert on_two_ranks.state_dict()["epoch"] == 1
    with pytest.raises(ValueError, match="global_batch_size"):
        train.keras(16, x="images", y="labels", transform=Normalize()).load_state_dict(state)


def test_a_keras_fit_epoch_reads_the_store_about_once(tmp_path):
    """Measured with the process's own read counter: a shuffled fit epoch of 100 chunks reads about the
    fields' bytes once (it read 5x when each batch index was read on its own). Chunks in memory are read by
    ``read`` calls here, which the counter counts, not in place through their files' mappings."""
    import keras

    n, rng = 3200, np.random.default_rng(0)
    store = outcore.from_arrays({"images": rng.integers(0, 256, (n, 16, 16, 3), np.uint8),
                                 "labels": rng.integers(0, 3, n)}, tmp_path / "r.zarr", chunk_size=32,
                                compression="none", progress=False)
    stored = sum(f.stat().st_size for f in (tmp_path / "r.zarr").rglob("c/**/*") if f.is_file())
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    data = store.keras(64, x="images", y="labels")
    mapping = map_files(False) if map_files is not None else False
    try:
        before = _bytes_read()
        model.fit(data, epochs=3, verbose=0, shuffle=True)
        ratio = (_bytes_read() - before) / (3 * stored)
    finally:
        if map_files is not None:
            map_files(mapping)
    assert 0.95 < ratio < 1.2, ratio


def _bytes_read() -> int:
    """What this process has read through read() calls so far (Linux: /proc/self/io)."""
    with open("/proc/self/io") as counters:
        return int(dict(line.split(": ") for line in counters.read().splitlines())["rchar"])


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


@pytest.mark.parametrize("world_size", [3, 6])
def test_keras_and_tf_take_any_world_size_with_the_default_options(ids_store, world_size):
    """``rank=``/``world_size=`` on 3 and 6 ranks (8 streams refused them): each rank's PyDataset and
    tf.data pipeline the same length, and together every sample once an epoch, as `batches` makes them."""
    keras_ranks = [ids_store.keras(16, x="id", rank=r, world_size=world_size, shuffle=True) for r in range(world_size)]
    tf_ranks = [ids_store.tf(16, x="id", rank=r, world_size=world_size, shuffle=True) for r in range(world_size)]
    assert len({len(each) for each in keras_ranks}) == 1
    assert {int(each.cardinality()) for each in tf_ranks} == {len(keras_ranks[0])}
    expected = [[b["id"].tolist() for b in ids_store.batches(16, rank=r, world_size=world_size)]
                for r in range(world_size)]
    assert [[each[k][0].tolist() for k in range(len(each))] for each in keras_ranks] == expected  # (x,) batches
    assert [[x.numpy().tolist() for x in each] for each in tf_ranks] == expected
    assert {i for rank in expected for batch in rank for i in batch} == set(range(1000))


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


def test_predictions_line_up_with_the_store_labels_and_paths(tmp_path):
    """A model that returns each picture's mean: predicting on the store gives sample i's label back at row i."""
    import keras

    n = 300
    labels = np.random.default_rng(0).permutation(n)
    images = np.broadcast_to(labels[:, None, None, None], (n, 4, 4, 1)).astype(np.float32)
    paths = np.array([f"img_{label:03d}.png" for label in labels])
    ds = outcore.from_arrays({"images": images, "labels": labels, "path": paths}, tmp_path / "p.zarr", chunk_size=16,
                             progress=False)  # shuffled on write: store order is neither source nor label order
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.GlobalAveragePooling2D()])
    predictions = model.predict(ds.keras(64, x="images"), verbose=0)[:, 0]
    np.testing.assert_array_equal(predictions.astype(np.int64), ds["labels"].compute())
    assert [f"img_{int(p):03d}.png" for p in predictions] == ds["path"].compute().tolist()
    tf_predictions = model.predict(ds.tf(64, x="images"), verbose=0)[:, 0]
    np.testing.assert_array_equal(tf_predictions.astype(np.int64), ds["labels"].compute())
    training = ds.keras(64, x="images", y="labels")  # (x, y): shuffled unless shuffle=False
    assert not np.array_equal(training[0][1], ds["labels"][:64].compute())
    assert len(training[0]) == 2  # no sample-weight field in this store


def test_the_store_sample_weight_field_is_used_without_naming_it(tmp_path):
    ds = outcore.from_arrays({"x": np.zeros((64, 2), np.float32), "y": np.arange(64) % 2,
                              "weight": np.linspace(1, 2, 64).astype(np.float32)}, tmp_path / "w.zarr",
                             progress=False)
    _, _, weight = ds.keras(16, x="x", y="y", shuffle=False)[0]
    np.testing.assert_array_equal(weight, ds["weight"][:16].compute())
    assert len(ds.keras(16, x="x", y="y", sample_weight=None)[0]) == 2 and len(ds.keras(16, x="x")[0]) == 1


def test_several_sample_weight_fields_are_an_error_not_a_guess(tmp_path):
    ds = outcore.from_arrays({"x": np.zeros((32, 2), np.float32), "y": np.arange(32) % 2,
                              "weight": np.ones(32, np.float32), "sample_weight": np.ones(32, np.float32)},
                             tmp_path / "w.zarr", progress=False)
    with pytest.raises(outcore.OptionError, match=r"2 sample-weight fields \['weight', 'sample_weight'\]"):
        ds.keras(16, x="x", y="y")
    assert len(ds.keras(16, x="x", y="y", sample_weight="weight")[0]) == 3
    assert len(ds.keras(16, x="x", y="y", sample_weight=None)[0]) == 2


def test_two_passes_of_a_tf_dataset_at_once_both_finish(tmp_path):
    """ds.tf() shared one iterator between its passes: a second iter() closed the first, whose consumer
    then waited forever. Each pass is now an epoch of its own."""
    ds = outcore.from_arrays({"x": np.arange(640)}, tmp_path / "t.zarr", chunk_size=32, shuffle_on_write=False,
                             progress=False)
    data = ds.tf(64, x="x", shuffle=True)
    first, second = iter(data), iter(data)
    seen = {"first": [], "second": []}
    for _ in range(len(ds) // 64):
        seen["first"].append(next(first).numpy())
        seen["second"].append(next(second).numpy())
    for name, batches in seen.items():
        assert sorted(np.concatenate(batches).tolist()) == list(range(640)), name
    assert not np.array_equal(np.concatenate(seen["first"]), np.concatenate(seen["second"]))  # epochs 0 and 1
    with pytest.raises(StopIteration):
        next(first)


def test_k_folds_by_indices_fit_and_predict_each_held_out_fold_in_store_order(tmp_path):
    import keras
    from sklearn.model_selection import KFold

    n = 300
    labels = np.random.default_rng(1).permutation(n)
    images = np.broadcast_to(labels[:, None, None, None], (n, 4, 4, 1)).astype(np.float32)
    ds = outcore.from_arrays({"images": images, "labels": labels}, tmp_path / "k.zarr", chunk_size=16, progress=False)
    stored = ds["labels"].compute()
    mean = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.GlobalAveragePooling2D()])
    trained = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(1)])
    trained.compile("sgd", "mse")
    for train, held_out in KFold(3, shuffle=True, random_state=0).split(np.arange(n)):
        fold = ds.keras(32, x="images", y="labels", indices=train)
        assert len(fold) == -(-len(train) // 32)
        seen = np.concatenate([fold[i][1] for i in range(len(fold))])
        assert sorted(seen.tolist()) == sorted(stored[train].tolist())  # the fold's samples, each once
        trained.fit(fold, epochs=1, verbose=0)
        predicted = mean.predict(ds.keras(64, x="images", indices=held_out), verbose=0)[:, 0]
        np.testing.assert_array_equal(predicted.astype(np.int64), stored[np.sort(held_out)])  # row i: i-th index
        by_tf = mean.predict(ds.tf(64, x="images", indices=held_out), verbose=0)[:, 0]
        np.testing.assert_array_equal(by_tf.astype(np.int64), stored[np.sort(held_out)])
