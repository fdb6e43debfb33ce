"""The conformance suite: what every kind of store must do, as test methods pytest collects.

>>> class TestZipStores(StoreConformance):  # in a test module  # doctest: +SKIP
...     kind = "zip"
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from ..cli import describe, verify
from ..dataset import Dataset, open_dataset
from ..errors import CorruptChunkError, NotAStoreError
from ..storage import RangeZipStore
from .damage import corrupt_chunk, delete_shard, rewrite_shard_index, truncate_shard
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
            assert reader.direct
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

    def test_a_missing_shard_is_named_never_read_as_zeros(self, tmp_path: Path) -> None:
        ds = self.make(tmp_path)
        per_shard = ds.array("images").shards[0] // ds.chunk_size
        key = delete_shard(ds.location, "images", 1)
        ds = open_dataset(ds.location)  # a zip store is rewritten without the member: open it again
        expected = rf"field 'images', chunk {per_shard} .*in file {key}\) is corrupt: its shard file is missing"
        with pytest.raises(CorruptChunkError, match=expected):
            list(ds.batches(64, shuffle=False))
        with pytest.raises(CorruptChunkError, match=expected):
            ds["images"].compute()
        with pytest.raises(CorruptChunkError, match=f"shard file.*missing.*{key}"):
            describe(ds)
        report = verify(ds.location, progress=False)
        missing = [p for p in report.problems if key in p]
        assert len(report.problems) == len(missing) == per_shard  # every chunk of that file, nothing else

    def test_a_missing_shard_of_a_small_field_is_named(self, tmp_path: Path) -> None:
        """Labels are in shard files of their own size (one here, holding every sample): without it the store
        claims samples it does not hold."""
        ds = self.make(tmp_path)
        key = delete_shard(ds.location, "labels", 0)
        with pytest.raises(NotAStoreError, match=rf"array 'labels' .*the shard file {key} holding its last sample "
                                                  "is missing"):
            open_dataset(ds.location)
        assert any(key in problem for problem in verify(ds.location, progress=False).problems)

    @pytest.mark.parametrize("size", [0, 3, 10, 200])
    def test_a_truncated_shard_is_named(self, tmp_path: Path, size: int) -> None:
        ds = self.make(tmp_path)
        key = truncate_shard(ds.location, "images", 0, size)
        ds = open_dataset(ds.location)
        with pytest.raises(CorruptChunkError, match=rf"field 'images', chunk 0 .*in file {key}\) is corrupt"):
            ds["images"][:5].compute()
        assert not verify(ds.location, progress=False).ok

    def test_a_forged_shard_index_is_refused(self, tmp_path: Path) -> None:
        ds = self.make(tmp_path, chunk_size=8)  # four chunks per shard file

        def point_chunk_1_at_chunk_0(index: np.ndarray) -> None:  # its samples would silently repeat
            index[1] = index[0]

        rewrite_shard_index(ds.location, "images", 0, point_chunk_1_at_chunk_0)
        ds = open_dataset(ds.location)
        with pytest.raises(CorruptChunkError, match=r"chunk 1 .* its shard index has chunks that overlap"):
            ds.shard_reader("images").read(1)

        def point_beyond_the_file(index: np.ndarray) -> None:
            index[2, 0] = 2**40

        rewrite_shard_index(ds.location, "labels", 0, point_beyond_the_file)
        ds = open_dataset(ds.location)
        with pytest.raises(CorruptChunkError, match=r"chunk 0 .* points beyond the file"):
            ds.shard_reader("labels").read(0)
