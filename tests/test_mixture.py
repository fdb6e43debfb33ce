"""Mixtures: every batch holds each source in its share, every epoch is each source's drawn multiset exactly
(repeats for a small source, other samples each epoch for a large one), determinism, resume, ranks, named
errors, and the adapters (Keras fit, tf.data, a DataLoader)."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.optional import need

import outcore
from outcore.errors import OptionError, OutcoreWarning
from outcore.iterate.mixture import MixtureLayout, epoch_samples_of, warn_uneven


def _store(path, count, offset, classes=("a", "b"), shape=(2,)):
    labels = np.arange(count) % len(classes)
    return outcore.from_arrays({"x": np.full((count, *shape), offset, np.float32), "id": offset + np.arange(count),
                                "labels": labels}, path, chunk_size=40, shuffle_on_write=False,
                               classes={"labels": classes}, progress=False)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    return {"base": _store(root / "base.zarr", 1000, 0), "curated": _store(root / "curated.zarr", 90, 100_000)}


def _source_of(ids):
    return np.where(np.asarray(ids) >= 100_000, "curated", "base")


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=4), data=st.data(), batch=st.integers(1, 300),
       world_size=st.sampled_from([1, 2, 4]))
def test_a_layout_apportions_every_batch_and_makes_whole_epochs(sizes, data, batch, world_size):
    weights = data.draw(st.lists(st.floats(0.01, 10), min_size=len(sizes), max_size=len(sizes)))
    layout = MixtureLayout.of(tuple(sizes), batch_size=batch, world_size=world_size, weights=tuple(weights))
    shares = batch * np.array(weights) / sum(weights)
    assert layout.per_batch.sum() == batch and (np.abs(layout.per_batch - shares) < 1).all()
    assert layout.steps == max(1, round(sum(sizes) / (batch * world_size)))
    assert (layout.per_epoch == layout.steps * world_size * layout.per_batch).all()


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=4), batch=st.integers(1, 300),
       world_size=st.sampled_from([1, 2, 3, 8]), seed=st.integers(0, 3))
def test_the_default_gives_each_source_what_its_warning_says(sizes, batch, world_size, seed):
    """The default (repeats of 1) keeps each batch's shares: every sample of every source once an epoch
    exactly when the shares make each source's size, and otherwise a warning giving each source's count,
    which an epoch's samples then hold: each sample that count // size times, the rest once."""
    layout = MixtureLayout.of(tuple(sizes), batch_size=batch, world_size=world_size, repeats=(1.0,) * len(sizes))
    sources = {f"s{i}": range(size) for i, size in enumerate(sizes)}
    exact = layout.per_epoch.tolist() == sizes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_uneven(sources, layout, batch)
    assert (not caught) == exact
    for i, (name, size) in enumerate(zip(sources, sizes, strict=True)):
        count = int(layout.per_epoch[i])
        if caught:
            assert f"{name} {count:,} (" in str(caught[0].message)
        drawn = Counter(epoch_samples_of(size, count, seed, 0, i).tolist())
        assert sum(drawn.values()) == count and set(drawn) <= set(range(size))
        assert set(drawn.values()) <= {count // size, count // size + 1}
        if count >= size:
            assert len(drawn) == size  # none left out
        assert abs(count - size) <= world_size * (layout.steps + int(layout.per_batch[i]))  # a share a step, at most


def test_the_default_warns_saying_what_an_epoch_gives_each_source(tmp_path):
    uneven = outcore.mix({"a": _store(tmp_path / "a.zarr", 1003, 0), "b": _store(tmp_path / "b.zarr", 500, 100_000)})
    with pytest.warns(OutcoreWarning, match=r"a batch of 10 holds 7 of a and 3 of b samples, so an epoch of 150 "
                                            r"batches gives a 1,050 \(47 of its 1,003 samples twice\), b 450 \(50 "
                                            r"of its 500 samples left for another epoch\)"):
        it = uneven.batches(10, seed=0, fields=["id"])
    ids = Counter(i for b in it for i in b["id"].tolist())
    assert sum(1 for i in ids if i < 100_000) == 1003 and sorted(ids.values()).count(2) == 47
    assert sum(1 for i in ids if i >= 100_000) == 450


def test_every_batch_holds_each_source_in_its_share_and_an_epoch_its_drawn_samples(sources):
    mixture = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1})
    it = mixture.batches(50, seed=3, fields=["id", "x"])
    layout = mixture.layout(50)
    assert layout.per_batch.tolist() == [45, 5] and len(it) == 22 and layout.per_epoch.tolist() == [990, 110]
    epochs = []
    for epoch in range(2):
        batches = [b["id"].tolist() for b in it]
        for batch in batches:
            assert Counter(_source_of(batch)) == {"base": 45, "curated": 5}
        ids = [i for batch in batches for i in batch]
        for s, (name, offset) in enumerate((("base", 0), ("curated", 100_000))):
            got = sorted(i - offset for i in ids if _source_of([i])[0] == name)
            assert got == epoch_samples_of(len(sources[name]), int(layout.per_epoch[s]), 3, epoch, s).tolist()
        epochs.append(ids)
    curated = [Counter(i for i in ids if i >= 100_000) for ids in epochs]
    assert all(set(c.values()) <= {1, 2} for c in curated) and len(curated[0]) == 90  # 110 of 90: 20 twice
    base = [{i for i in ids if i < 100_000} for ids in epochs]
    assert len(base[0]) == 990 and base[0] != base[1]  # 990 of 1,000, another 990 each epoch
    again = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1}).batches(50, seed=3, fields=["id", "x"])
    assert [i for b in again for i in b["id"].tolist()] == epochs[0]
    assert it.stats()["samples_curated"] == 220


def test_sources_made_by_processes_of_their_own_give_the_same_batches_epoch_after_epoch(sources):
    options = {"seed": 3, "fields": ["id", "x"]}
    here = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1}).batches(50, **options)
    there = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1}).batches(50, process=True, **options)
    started = [loader.process.pid for loader in there._processes]
    for _ in range(2):
        assert [b["id"].tolist() for b in there] == [b["id"].tolist() for b in here]
    assert [loader.process.pid for loader in there._processes] == started  # one process a source, kept
    there.close()
    assert all(loader.process is None for loader in there._processes)


def test_sources_made_by_several_processes_each_give_the_same_batches(sources):
    options = {"seed": 3, "fields": ["id", "x"]}
    here = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1}).batches(50, **options)
    there = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1}).batches(50, process=2, **options)
    for _ in range(2):
        assert [b["id"].tolist() for b in there] == [b["id"].tolist() for b in here]
    assert [len(loader.members) for loader in there._processes] == [2, 2]
    there.close()


def test_repeats_take_each_sample_that_many_times_and_resume_exactly(sources):
    mixture = outcore.mix(sources, repeats={"base": 1, "curated": 3})
    it = mixture.batches(64, seed=1, fields=["id"])
    whole = [b["id"].tolist() for b in it]
    counts = Counter(i for batch in whole for i in batch)
    layout = mixture.layout(64)
    assert sum(counts.values()) == layout.per_epoch.sum() == len(whole) * 64
    assert abs(layout.per_epoch[1] / layout.per_epoch.sum() - 270 / 1270) < 0.01
    head = mixture.batches(64, seed=1, fields=["id"])
    first = [b["id"].tolist() for _, b in zip(range(7), head)]
    tail = mixture.batches(64, seed=1, fields=["id"])
    tail.load_state_dict(json.loads(json.dumps(head.state_dict())))
    assert first + [b["id"].tolist() for b in tail] == whole
    with pytest.raises(OptionError, match="state does not match this mixture"):
        mixture.batches(32, seed=1, world_size=2, fields=["id"]).load_state_dict(head.state_dict())
    plain = outcore.mix(sources)  # repeats of 1: every sample of every source once an epoch
    assert sorted(i for b in plain.batches(109, fields=["id"]) for i in b["id"].tolist()) == \
        [*range(1000), *range(100_000, 100_090)]


def test_ranks_together_make_each_sources_drawn_samples(sources):
    mixture = outcore.mix(sources, weights={"base": 0.8, "curated": 0.2})
    ranks = [mixture.batches(20, seed=5, rank=r, world_size=2, fields=["id"]) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    ids = [i for it in ranks for b in it for i in b["id"].tolist()]
    layout = mixture.layout(20, world_size=2)
    for s, (name, offset) in enumerate((("base", 0), ("curated", 100_000))):
        got = sorted(i - offset for i in ids if _source_of([i])[0] == name)
        assert got == epoch_samples_of(len(sources[name]), int(layout.per_epoch[s]), 5, 0, s).tolist()


def test_sources_that_cannot_be_mixed_are_named(sources, tmp_path):
    other_classes = _store(tmp_path / "c.zarr", 50, 200_000, classes=("a", "z"))
    with pytest.raises(OptionError, match="'labels' numbers other classes"):
        outcore.mix({**sources, "odd": other_classes}).batches(10)
    other_shape = _store(tmp_path / "s.zarr", 50, 300_000, shape=(3,))
    with pytest.raises(OptionError, match="'x' has other sample shapes"):
        outcore.mix({**sources, "odd": other_shape}).batches(10)
    with pytest.raises(OptionError, match=r"gives source\(s\) \['curated'\] no sample per batch"):
        outcore.mix(sources, weights={"base": 0.99, "curated": 0.01}).batches(10)
    with pytest.raises(OptionError, match="weights= must give each source"):
        outcore.mix(sources, weights={"base": 1.0})
    with pytest.raises(OptionError, match="indices= selects samples of one store"):
        outcore.mix(sources).batches(10, indices=[1, 2])
    extra = outcore.from_arrays({"x": np.zeros((50, 2), np.float32), "id": 400_000 + np.arange(50),
                                 "labels": np.arange(50) % 2, "weight": np.ones(50, np.float32)}, tmp_path / "w.zarr",
                                classes={"labels": ("a", "b")}, shuffle_on_write=False, progress=False)
    three = {"base": 0.9, "curated": 0.05, "extra": 0.05}
    with pytest.warns(outcore.OutcoreWarning, match=r"left out: \{'extra': \['weight'\]\}"):
        it = outcore.mix({**sources, "extra": extra}, weights=three).batches(100)
    assert it.fields == ("x", "id", "labels")
    assert outcore.mix({**sources, "extra": extra}, weights=three).batches(100, fields=["x", "id"]).fields == \
        ("x", "id")  # chosen


def test_keras_fits_and_tf_and_torch_read_a_mixture(sources):
    import keras

    mixture = outcore.mix(sources, weights={"base": 0.9, "curated": 0.1})
    fit = mixture.keras(50, x="x", y="labels")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    history = model.fit(fit, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and fit.stats()["samples_curated"] == 2 * 110
    through_tf = [y.numpy() for _, y in mixture.tf(50, x="x", y="id")]
    assert len(through_tf) == 22 and all(Counter(_source_of(y)) == {"base": 45, "curated": 5} for y in through_tf)
    torch = need("torch")
    with pytest.raises(OptionError, match="num_workers=0"):
        mixture.torch(10, num_workers=2)
    loader = mixture.torch(50, seed=2, fields=["id", "x"])
    batches = [b["id"].tolist() for b in loader]
    assert isinstance(next(iter(loader))["x"], torch.Tensor)
    assert batches == [b["id"].tolist() for b in mixture.batches(50, seed=2, fields=["id", "x"])]
    resumed = mixture.torch(50, seed=2, fields=["id", "x"])
    head = mixture.torch(50, seed=2, fields=["id", "x"])
    for _, _batch in zip(range(5), head):
        pass
    resumed.load_state_dict(head.state_dict())
    assert [b["id"].tolist() for b in resumed] == batches[5:]
