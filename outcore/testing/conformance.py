"""The conformance suite: what every kind of store must do, as test methods pytest collects.

>>> class TestZipStores(StoreConformance):  # in a test module  # doctest: +SKIP
...     kind = "zip"
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from ..cli import verify
from ..dataset import Dataset
from ..errors import CorruptChunkError
from ..storage import RangeZipStore
from .damage import corrupt_chunk
from .stores import make_store, sample_arrays


class StoreConformance:
    """Subclass it in a test module as ``Test<Kind>`` with ``kind`` set to one of `STORE_KINDS`."""

    kind = "directory"

    def make(self, root: Path, **options: object) -> Dataset:
        return make_store(root, kind=self.kind, **options)

    def test_fields_read_back_exactly(self, tmp_path: Path) -> None:
        ds, arrays = self.make(tmp_path), sample_arrays()
        assert len(ds) == len(arrays["id"]) and set(ds.fields) == set(arrays)
        for name, values in arrays.items():
            np.testing.assert_array_equal(ds[name].compute(), values, err_msg=name)

    def test_shard_reader_equals_zarr(self, tmp_path: Path) -> None:
        ds = self.make(tmp_path)
        for name in ds.fields:
            reader = ds.shard_reader(name)
            assert reader.direct or self.kind == "url"  # a URL is read directly where zarr maps it to files
            for chunk in range(ds.num_chunks):
                expected = ds.array(name)[chunk * ds.chunk_size : (chunk + 1) * ds.chunk_size]
                np.testing.assert_array_equal(reader.read(chunk), expected, err_msg=f"{name} chunk {chunk}")

    def test_shuffled_epoch_yields_every_sample_once(self, tmp_path: Path) -> None:
        ds = self.make(tmp_path)
        batches = list(ds.batches(64, seed=3))
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == list(range(len(ds)))
        expected = sample_arrays()
        for batch in batches:
            np.testing.assert_array_equal(batch["images"], expected["images"][batch["id"]])
            np.testing.assert_array_equal(batch["name"], expected["name"][batch["id"]])

    def test_plain_zarr_reads_it(self, tmp_path: Path) -> None:
        ds = self.make(tmp_path)
        where = ds.location
        group = zarr.open_group(RangeZipStore(where) if self.kind == "zip" else where, mode="r")
        np.testing.assert_array_equal(group["labels"][:], sample_arrays()["labels"])

    def test_corrupt_chunk_is_named(self, tmp_path: Path) -> None:
        ds = self.make(tmp_path)
        corrupt_chunk(ds.location, "images", 3)
        expected = r"field 'images', chunk 3 \(samples 96\.\.127"
        with pytest.raises(CorruptChunkError, match=expected):
            list(ds.batches(64, shuffle=False))
        with pytest.raises(CorruptChunkError, match=expected):
            ds["images"][96:100].compute()
        ds["images"][:96].compute()  # the chunks before it are intact
        report = verify(ds.location, progress=False)
        assert len(report.problems) == 1 and "chunk 3" in report.problems[0]
