"""Ragged fields: boxes, keypoints and their labels stored as rows and ranges, batched as rows and offsets.

A store of pictures with a varying number of boxes each (none for some): plain zarr reads each sample's rows; the
iterator gives each sample its own rows in every order, on every rank and after a resume; a transform moves and
drops them with the label maps they were drawn into, also when a batch is made of several pieces; PyTorch's
DataLoader workers, tf.data (a RaggedTensor) and Keras (padded with -1) deliver them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from support.optional import need

import outcore
from outcore import Ragged
from outcore.errors import SourceError
from outcore.transforms import BoxPolicy, BrightnessContrast, Compose, RandomFlip, RandomResizedCrop, Targets

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
SIZE = (29, 37)
MOST = 5


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    """150 pictures with 0-5 boxes of whole pixels, each box drawn into its own channel of ``masks``, a label per
    box (the sample's id * 10 + the box's index), shuffled on write."""
    rng = np.random.default_rng(0)
    counts = rng.integers(0, MOST + 1, 150)
    boxes, masks = [], np.zeros((150, *SIZE, MOST), np.uint8)
    for sample, count in enumerate(counts.tolist()):
        x0, y0 = rng.integers(0, SIZE[1] - 2, count), rng.integers(0, SIZE[0] - 2, count)
        x1 = np.minimum(SIZE[1], x0 + rng.integers(1, 20, count))
        y1 = np.minimum(SIZE[0], y0 + rng.integers(1, 20, count))
        boxes.append(np.stack([x0, y0, x1, y1], axis=1).astype(np.float32))
        for j, (a, b, c, d) in enumerate(boxes[-1].astype(int).tolist()):
            masks[sample, b:d, a:c, j] = 1
    labels = Ragged.of([sample * 10 + np.arange(len(b)) for sample, b in enumerate(boxes)], np.int64, ())
    source = {"images": rng.integers(0, 256, (150, *SIZE, 3), dtype=np.uint8), "masks": masks,
              "boxes": Ragged.of(boxes, np.float32, (4,)), "box_labels": labels, "ids": np.arange(150)}
    ds = outcore.from_arrays(source, tmp_path_factory.mktemp("ragged") / "s.zarr", chunk_size=16, progress=False)
    return ds, source


def _rows_by_id(batches, field: str = "boxes") -> dict[int, bytes]:
    seen = {}
    for batch in batches:
        offsets = batch[f"{field}_offsets"]
        for i, sample in enumerate(batch["ids"].tolist()):
            seen[sample] = batch[field][offsets[i] : offsets[i + 1]].tobytes()
    return seen


def test_plain_zarr_reads_each_samples_rows_and_the_store_says_what_they_are(detection):
    ds, source = detection
    group = zarr.open_group(ds.location, mode="r")
    order = ds["ids"].compute()
    for row, sample in enumerate(order.tolist()):
        start, stop = group["boxes_ranges"][row]
        np.testing.assert_array_equal(group["boxes"][start:stop], source["boxes"].rows(sample))
    assert ds.info("boxes").is_ragged and ds.info("boxes").sample_shape == (4,)
    assert ds["box_labels"][7].compute().tolist() == source["box_labels"].rows(int(order[7])).tolist()
    assert "float32 (ragged)" in repr(ds)
    assert outcore.verify(ds.location).ok


def test_every_sample_gets_its_own_rows_in_any_order_on_any_rank_and_after_a_resume(detection):
    ds, source = detection
    expected = {sample: source["boxes"].rows(sample).tobytes() for sample in range(150)}
    assert _rows_by_id(ds.batches(batch_size=16, shuffle=False)) == expected
    assert _rows_by_id(ds.batches(batch_size=16, seed=3)) == expected
    assert {**_rows_by_id(ds.batches(batch_size=8, seed=3, rank=0, world_size=2)),
            **_rows_by_id(ds.batches(batch_size=8, seed=3, rank=1, world_size=2))} == expected
    first = ds.batches(batch_size=16, seed=3)
    seen = _rows_by_id(batch for _, batch in zip(range(4), first))
    resumed = ds.batches(batch_size=16, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert {**seen, **_rows_by_id(resumed)} == expected


def test_a_transform_of_batches_made_of_pieces_keeps_boxes_labels_and_masks_together(detection):
    """A random step after the crop runs on each piece of a batch (one per stream), and the pieces are joined."""
    ds, source = detection
    targets = Targets(label_maps=("masks",), boxes="boxes", instances=("box_labels",), policy=BoxPolicy(min_size=0))
    transform = Compose([RandomResizedCrop((23, 31), scale=(0.2, 1.0), targets=targets), RandomFlip(targets=targets),
                         BrightnessContrast()])
    kept = 0
    for batch in ds.batches(batch_size=32, seed=1, transform=transform):
        offsets = batch["boxes_offsets"]
        np.testing.assert_array_equal(batch["box_labels_offsets"], offsets)
        ys, xs = np.mgrid[0:23, 0:31] + 0.5
        for i, sample in enumerate(batch["ids"].tolist()):
            for row in range(offsets[i], offsets[i + 1]):
                index = int(batch["boxes_kept"][row])
                assert batch["box_labels"][row] == sample * 10 + index
                x0, y0, x1, y1 = batch["boxes"][row]
                inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
                near = (np.minimum(abs(xs - x0), abs(xs - x1)) < 1e-4) | (np.minimum(abs(ys - y0), abs(ys - y1)) < 1e-4)
                assert ((batch["masks"][i, ..., index] == inside) | near).all()
                kept += 1
    assert 0 < kept < len(source["boxes"].values)  # some boxes were cropped away, most were not


def test_dataloader_workers_deliver_the_rows_making_parts_of_batches_or_taking_turns(detection):
    ds, source = detection
    torch = need("torch")
    expected = {sample: source["boxes"].rows(sample).tobytes() for sample in range(150)}
    for method, shuffle in (("fork", True), ("spawn", False)):  # each worker a part of every batch, or turns
        loader = ds.torch(16, num_workers=2, seed=2, shuffle=shuffle, fields=["ids", "boxes"],
                          multiprocessing_context=method)
        batches = list(loader)
        assert all(isinstance(batch["boxes"], torch.Tensor) for batch in batches)
        assert _rows_by_id({name: value.numpy() for name, value in batch.items()} for batch in batches) == expected
        assert loader.dataset.parts == (2 if shuffle else 1)


def test_tf_data_delivers_ragged_tensors_and_keras_rows_padded_with_minus_one(detection):
    ds, source = detection
    tf = need("tensorflow")
    expected = {sample: source["boxes"].rows(sample).tobytes() for sample in range(150)}
    data = ds.tf(16, x="ids", y="boxes", shuffle=True, seed=2)
    assert isinstance(data.element_spec[1], tf.RaggedTensorSpec)
    for ids, boxes in data:
        for sample, rows in zip(ids.numpy().tolist(), boxes, strict=True):
            assert rows.numpy().tobytes() == expected[sample]
    ids, boxes = ds.keras(16, x="ids", y="boxes", shuffle=False)[0]
    for sample, rows in zip(ids.tolist(), boxes, strict=True):
        count = len(source["boxes"].rows(sample))
        assert rows[:count].tobytes() == expected[sample] and (rows[count:] == -1).all()


def test_a_writer_refuses_to_append_to_a_store_of_ragged_fields(detection):
    ds, _ = detection
    with pytest.raises(SourceError, match="ragged field"):
        outcore.Writer(ds.location, append=True)


def test_offsets_that_do_not_cut_the_rows_are_refused():
    with pytest.raises(ValueError, match="do not cut 3 rows"):
        Ragged(np.zeros((3, 4)), np.array([0, 2, 4]))


def test_a_mixture_of_stores_with_boxes_gives_each_sample_its_rows(detection, tmp_path):
    ds, source = detection
    rng = np.random.default_rng(5)
    other = [rng.uniform(0, 9, (int(rng.integers(0, 3)), 4)).astype(np.float32) for _ in range(40)]
    second = outcore.from_arrays({"images": np.zeros((40, *SIZE, 3), np.uint8), "boxes": Ragged.of(other, np.float32, (4,)),
                                  "ids": np.arange(1000, 1040)}, tmp_path / "other.zarr", chunk_size=8, progress=False)
    expected = {sample: source["boxes"].rows(sample).tobytes() for sample in range(150)}
    expected.update({1000 + i: rows.tobytes() for i, rows in enumerate(other)})
    mixture = outcore.mix({"a": ds, "b": second}, weights={"a": 0.75, "b": 0.25})
    seen = _rows_by_id(mixture.batches(16, seed=1, fields=["ids", "boxes"]))
    assert seen and all(expected[sample] == rows for sample, rows in seen.items())
    assert any(sample >= 1000 for sample in seen) and any(sample < 1000 for sample in seen)


def test_info_says_ragged_and_verify_checks_each_rows_class(tmp_path, capsys):
    labels = Ragged.of([np.array([0, 1]), np.array([], np.int64), np.array([3])], np.int64, ())
    ds = outcore.from_arrays({"images": np.zeros((3, 4, 4, 3), np.uint8), "labels": labels,
                              "boxes": Ragged.of([np.zeros((2, 4)), np.zeros((0, 4)), np.ones((1, 4))], np.float32, (4,))},
                             tmp_path / "s.zarr", classes={"labels": ["cat", "dog"]}, progress=False)
    from outcore.cli import main

    assert main(["info", ds.location]) == 0
    said = capsys.readouterr().out
    assert "int64 (ragged: 3 rows)" in said and "float32 (ragged: 3 rows)" in said
    report = outcore.verify(ds.location, progress=False)
    assert not report.ok and "field 'labels'" in str(report) and "label(s) [3] outside the 2 classes" in str(report)


def test_fields_named_as_a_batch_names_offsets_are_refused_when_the_loader_is_made(tmp_path):
    ds = outcore.from_arrays({"images": np.zeros((4, 4, 4, 3), np.uint8), "boxes": np.zeros((4, 4)),
                              "boxes_offsets": np.arange(4)}, tmp_path / "s.zarr", progress=False)
    with pytest.raises(outcore.OptionError, match="fields 'boxes' and 'boxes_offsets' .* leave one out with fields="):
        ds.batches(2)
    assert len(next(iter(ds.batches(2, fields=["images", "boxes"])))["boxes"]) == 2
