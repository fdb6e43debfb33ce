"""The checks made on open: outcore attributes present and well formed, no codec that would unpickle."""

from __future__ import annotations

import json
from collections.abc import Iterable

import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

from ..errors import NotAStoreError, UnsafeStoreError
from ..format import ATTRS_KEY, StoreAttrs, unsafe_codecs


def read_attrs(group: zarr.Group, where: str) -> StoreAttrs:
    """The store's outcore attributes, validated; `NotAStoreError` when absent or malformed."""
    document = group.attrs.get(ATTRS_KEY)
    if document is None:
        raise NotAStoreError(
            f"{where} is a Zarr group but not an outcore store (no {ATTRS_KEY!r} attribute); read it with "
            "zarr.open_group, or convert it with outcore.from_arrays"
        )
    return StoreAttrs.from_dict(document, where)


def check_safe(group: zarr.Group, arrays: Iterable[str], where: str) -> None:
    """Refuse an array whose codecs or data type would unpickle or evaluate stored bytes.

    The raw JSON metadata is read, so such a codec is refused before Zarr even looks it up.
    """
    for name in arrays:
        raw = sync(group.store.get(f"{group.path}/{name}/zarr.json".lstrip("/"), default_buffer_prototype()))
        if raw is None:
            raw = sync(group.store.get(f"{group.path}/{name}/.zarray".lstrip("/"), default_buffer_prototype()))
        if raw is None:
            continue  # a missing array is reported with the shape it should have
        unsafe = unsafe_codecs(json.loads(raw.to_bytes()))
        if unsafe is not None:
            raise UnsafeStoreError(
                f"{where}: array {name!r} uses an object or pickle codec or data type ({unsafe}); "
                "outcore never decodes such data. Rewrite the field with a fixed-size dtype."
            )
