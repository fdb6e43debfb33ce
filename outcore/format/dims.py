"""Dimension names of field arrays (Zarr v3 ``dimension_names``), so xarray shows named dimensions.

Axis 0 is always ``sample``. Pictures (``uint8``/``uint16`` samples of shape (H, W) or (H, W, C) with
C in 1, 3, 4) have ``height``, ``width`` and ``channel``; other axes are ``<field>_dim_<k>``. A name is
shared only by fields of the same size along it (xarray requires it): a second picture field of
another size gets ``<field>_height``, and so on.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

SAMPLE_DIM = "sample"
PICTURE_DIMS = ("height", "width", "channel")
PICTURE_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16))


def dimension_names(fields: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> dict[str, tuple[str, ...]]:
    """Each field's dimension names, from its ``(dtype, sample_shape)``.

    >>> names = dimension_names({"images": (np.uint8, (32, 32, 3)), "masks": (np.uint8, (16, 16, 1)),
    ...                          "labels": (np.int64, ()), "emb": (np.float32, (8,))})
    >>> names["images"], names["labels"], names["emb"]
    (('sample', 'height', 'width', 'channel'), ('sample',), ('sample', 'emb_dim_1'))
    >>> names["masks"]
    ('sample', 'masks_height', 'masks_width', 'masks_channel')
    """
    sizes: dict[str, int] = {}
    names = {}
    for name, (dtype, shape) in fields.items():
        axes = []
        for size, wanted in zip(shape, _wanted(dtype, shape), strict=True):
            shared = wanted in PICTURE_DIMS and sizes.setdefault(wanted, size) == size
            axes.append(wanted if shared else f"{name}_{wanted}")
        names[name] = (SAMPLE_DIM, *axes)
    return names


def _wanted(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[str, ...]:
    is_picture = np.dtype(dtype) in PICTURE_DTYPES and (len(shape) == 2 or len(shape) == 3 and shape[2] in (1, 3, 4))
    return PICTURE_DIMS[: len(shape)] if is_picture else tuple(f"dim_{k}" for k in range(1, len(shape) + 1))
