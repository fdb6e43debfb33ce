"""Seeded orders pinned in tables committed here: the first samples of epochs 0 and 1 for a few seeds, world
sizes and store shapes, an epoch's chunk order, the write order of a small ingest, and a transform's draws.
Any change of a seeded order fails one of these tests: such a change must never happen silently; when one is
meant, announce it in CHANGELOG.md (it changes every user's shuffles and augmentations) and update the tables.
The rules themselves are checked against `tests/support/rules.py`, written from the documentation."""

from __future__ import annotations

import numpy as np
import pytest
from support.rules import MIXTURE, TRANSFORM, chunk_permutation, seeded, write_order

import outcore
from outcore.iterate import BatchOptions
from outcore.iterate.mixture import epoch_samples_of
from outcore.iterate.plan import chunk_order
from outcore.transforms import RandomFlip, RandomResizedCrop

EPOCH_STARTS = {  # (samples, chunk size, seed, world size, epoch) -> rank 0's first 12 samples (24 a global step)
    (1000, 32, 0, 1, 0): [42, 59, 63, 766, 765, 767, 638, 636, 634, 887, 895, 889],
    (1000, 32, 0, 1, 1): [112, 118, 127, 799, 798, 797, 826, 831, 828, 599, 600, 605],
    (1000, 32, 0, 3, 0): [33, 220, 858, 767, 125, 189, 637, 804, 44, 207, 851, 765],
    (1000, 32, 0, 3, 1): [122, 246, 445, 799, 59, 893, 828, 967, 97, 248, 440, 798],
    (1000, 32, 0, 8, 0): [42, 59, 63, 36, 33, 47, 51, 52, 44, 43, 39, 35],
    (1000, 32, 7, 1, 0): [713, 717, 727, 829, 831, 830, 479, 474, 475, 379, 380, 383],
    (1000, 32, 7, 8, 1): [323, 338, 340, 348, 322, 325, 331, 351, 346, 336, 350, 345],
    (777, 50, 0, 1, 0): [594, 552, 579, 548, 547, 549, 448, 446, 444, 641, 649, 643],
    (777, 50, 0, 3, 1): [726, 736, 466, 499, 384, 415, 446, 597, 701, 744, 492, 498],
    (777, 50, 7, 1, 1): [50, 98, 56, 149, 148, 147, 496, 498, 494, 443, 448, 449],
    (777, 50, 7, 8, 0): [109, 127, 124, 118, 111, 147, 120, 122, 130, 101, 115, 107],
}


@pytest.mark.parametrize("case", sorted(EPOCH_STARTS), ids=str)
def test_the_first_samples_of_an_epoch_are_pinned(case):
    samples, chunk_size, seed, world_size, epoch = case
    batch_size = 8 if world_size == 3 else 24 // world_size
    plan = BatchOptions(batch_size, seed=seed, world_size=world_size).plan(samples, chunk_size, epoch)
    assert plan.take(0, 12)[0].tolist() == EPOCH_STARTS[case]


def test_an_epochs_chunk_order_is_pinned_and_follows_the_documented_rule():
    pinned = {0: [4, 3, 7, 8, 9, 2, 6, 0, 5, 1], 1: [6, 1, 7, 0, 5, 9, 2, 4, 3, 8]}
    for epoch, order in pinned.items():
        assert chunk_order(10, shuffle=True, seed=3, epoch=epoch).tolist() == order
        assert chunk_permutation(10, shuffle=True, seed=3, epoch=epoch) == order


def test_the_write_order_of_a_small_ingest_is_pinned_and_follows_the_documented_rule(tmp_path):
    ds = outcore.from_arrays({"x": np.arange(20)}, tmp_path / "w.zarr", chunk_size=4, progress=False)
    pinned = [16, 13, 17, 5, 10, 12, 19, 6, 3, 14, 2, 15, 4, 8, 18, 1, 9, 11, 7, 0]
    assert ds["x"].compute().tolist() == pinned == write_order(20, 0).tolist()
    assert ds["source_index"].compute().tolist() == pinned


def test_a_transforms_draws_are_pinned(tmp_path):
    """Batch 0 of epoch 0 in storage order draws from the generator of key (seed 0, epoch 0, step 0, stream
    0): which pictures it mirrors, and the boxes RandomResizedCrop cuts."""
    rng = seeded(TRANSFORM, 0, 0, 0, 0)
    assert RandomFlip().draw(8, rng).astype(int)[:, 0].tolist() == [1, 0, 0, 1, 0, 1, 1, 0]
    upside_down = RandomFlip(horizontal=False, vertical=True).draw(3, seeded(TRANSFORM, 0, 0, 0, 0))
    assert upside_down.astype(int).tolist() == [[0, 1], [0, 0], [0, 0]]  # the same draws, top-bottom
    boxes = RandomResizedCrop(16).boxes([(100, 80), (60, 120), (300, 300), (20, 20)], seeded(TRANSFORM, 0, 0, 0, 0))
    assert boxes == [(38, 43, 23, 30), (7, 18, 50, 60), (1, 81, 134, 140), (4, 0, 14, 18)]
    pictures = np.arange(8 * 2 * 2, dtype=np.uint8).reshape(8, 2, 2, 1)
    ds = outcore.from_arrays({"images": pictures, "id": np.arange(8)}, tmp_path / "f.zarr", chunk_size=4,
                             shuffle_on_write=False, progress=False)
    batch = next(iter(ds.batches(8, shuffle=False, transform=RandomFlip())))
    mirrored = [int(not np.array_equal(batch["images"][i], pictures[batch["id"][i]])) for i in range(8)]
    assert mirrored == [1, 0, 0, 1, 0, 1, 1, 0]


def test_a_mixtures_draws_are_pinned_and_follow_the_documented_rule(tmp_path):
    """A source asked for 13 samples of its 10 gives each once and 3 drawn without replacement from the
    generator of (seed, epoch, source); each source reads with a seed of its own drawn from (seed, source)."""
    assert epoch_samples_of(10, 13, 0, 0, 0).tolist() == [0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 7, 8, 9]
    assert epoch_samples_of(10, 13, 0, 1, 1).tolist() == [0, 1, 2, 2, 3, 3, 4, 5, 5, 6, 7, 8, 9]
    drawn = seeded(MIXTURE, 0, 1, 1).choice(10, 3, replace=False)
    assert sorted(np.concatenate([np.arange(10), drawn]).tolist()) == epoch_samples_of(10, 13, 0, 1, 1).tolist()
    a = outcore.from_arrays({"id": np.arange(40), "labels": np.arange(40) % 4}, tmp_path / "a.zarr", chunk_size=8,
                            shuffle_on_write=False, progress=False)
    b = outcore.from_arrays({"id": 100 + np.arange(12), "labels": np.arange(12) % 4}, tmp_path / "b.zarr",
                            chunk_size=4, shuffle_on_write=False, progress=False)
    mixture = outcore.mix({"a": a, "b": b}, weights={"a": 0.75, "b": 0.25})
    assert next(iter(mixture.batches(8, seed=3, fields=["id"])))["id"].tolist() == [34, 38, 31, 21, 14, 5, 111, 106]


def test_the_shuffle_quality_reference_is_pinned(tmp_path):
    """The full random permutation `shuffle_quality` compares with is drawn from (seed, epoch) in a domain
    of its own: its score on this store is pinned."""
    ds = outcore.from_arrays({"id": np.arange(40), "labels": np.arange(40) % 4}, tmp_path / "q.zarr", chunk_size=8,
                             shuffle_on_write=False, progress=False)
    quality = outcore.shuffle_quality(ds, batch_size=8, buffer_chunks=2)
    assert (round(quality.outcore, 4), round(quality.random, 4), quality.batches) == (0.325, 0.225, 5)
