"""Folders of splits: ``splits.json`` names each split's store (written by `outcore.ingest_splits`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import NotAStoreError, OptionError
from .groups import is_url

SPLITS_INDEX = "splits.json"
INDEX_FORMAT = "outcore-splits"


def split_location(location: str | os.PathLike, split: str | None) -> str | os.PathLike:
    """The store of ``split`` in a folder of splits (``splits.json``); ``location`` itself when it is not
    one and no split is asked for. A folder of splits opened without ``split``, or an unknown split, is
    an `OptionError` naming the splits."""
    if is_url(location):
        if split is not None:
            raise OptionError(f"split= reads a local folder of splits; {str(location)!r} is a URL: open the "
                              "split's store by its own URL")
        return location
    if not (Path(location) / SPLITS_INDEX).is_file():
        if split is not None:
            raise NotAStoreError(f"{str(location)!r} is not a folder of splits (it has no {SPLITS_INDEX}): "
                                 "open it without split=")
        return location
    splits = read_index(location)["splits"]
    if split not in splits:
        raise OptionError(f"{str(location)!r} is a folder of splits {list(splits)}: pass split= one of them"
                          if split is None else f"no split {split!r} in {str(location)!r}; splits: {list(splits)}")
    return str(Path(location) / splits[split]["store"])


def read_index(folder: str | os.PathLike) -> dict:
    """The ``splits.json`` of a folder of splits, checked to name each split's store; a missing or damaged
    one is a `NotAStoreError` naming it."""
    index_path = Path(folder) / SPLITS_INDEX
    try:
        index = json.loads(index_path.read_text())
        splits = index["splits"] if index.get("format") == INDEX_FORMAT else None
        stores = [entry["store"] for entry in splits.values()]
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        stores = None
    if not stores or not all(isinstance(store, str) for store in stores):
        raise NotAStoreError(f"{index_path} is not a readable outcore splits index: write it again with "
                             "ingest_splits(..., overwrite=True)")
    return index
