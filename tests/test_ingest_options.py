"""The options of an image ingest (`outcore.ingest.options`): one set of keywords for every ingest, checked
once, before any file is read."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import outcore
from outcore.errors import OptionError
from outcore.ingest.options import IngestKeywords, IngestOptions


def test_the_keywords_and_the_checked_value_name_the_same_options():
    assert set(typing.get_type_hints(IngestKeywords)) == {field.name for field in dataclasses.fields(IngestOptions)}


@pytest.mark.parametrize("ingest", [
    lambda **kw: outcore.ingest_images("no-such-folder", "x.zarr", **kw),
    lambda **kw: outcore.ingest_dataframe("no-such.csv", "x.zarr", **kw),
    lambda **kw: outcore.ingest_records("no-such.tfrecord", "x.zarr", **kw),
    lambda **kw: outcore.ingest_splits("no-such-folder", "splits", split="train=0.5,val=0.5", **kw),
])
def test_every_ingest_refuses_a_misspelled_option_or_a_bad_value_before_reading_its_source(ingest, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=r"unknown ingest option\(s\) \['shufle'\]; the options are \['chunk_size'"):
        ingest(shape=(8, 8, 3), shufle=False)
    with pytest.raises(TypeError, match="ingest needs shape="):
        ingest()
    with pytest.raises(OptionError, match="images='jpeg' is not one of"):
        ingest(shape=(8, 8, 3), images="jpeg")
    with pytest.raises(OptionError, match="on_error='ignore' is not 'raise' or 'skip'"):
        ingest(shape=(8, 8, 3), on_error="ignore")
    with pytest.raises(OptionError, match="store the pictures as files: pass images='encoded'"):
        ingest(shape=None, images="pixels")
    assert list(tmp_path.iterdir()) == []


def test_options_are_parsed_once_and_changed_only_through_a_check():
    options = IngestOptions.of({"shape": "32,32,3", "resize": "pad", "dtype": "uint8"})
    assert (options.shape, options.resize, options.dtype.name) == ((32, 32, 3), "pad", "uint8")
    assert options.recipe("pixels") == {"shape": [32, 32, 3], "resize": "pad", "dtype": "uint8", "images": "pixels",
                                        "max_side": None, "quality": 90, "max_pixels": options.max_pixels}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 3  # type: ignore[misc]
    with pytest.raises(OptionError, match="quality=0"):
        options.replace(quality=0)
    assert options.replace(overwrite=True).overwrite and not options.overwrite
