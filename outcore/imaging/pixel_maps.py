"""Each pixel's value mapped on its own, a batch's run of pictures in one C call outside the GIL (`native.windows`,
the ``_windows`` extension), or numpy: the same values either way. uint8 pictures through a table of the 256 values'
results (`Normalize`, `Cast`), float32 rounded to float16 (`Cast`), brightness and contrast (`BrightnessContrast`).

>>> out = np.empty((1, 2), np.float16)
>>> to_half(np.array([[1.0, 1 / 3]], np.float32), out)
>>> out.tolist()
[[1.0, 0.333251953125]]
"""

from __future__ import annotations

import math

import numpy as np

from . import native


def table_lookup(values: np.ndarray, table: np.ndarray, out: np.ndarray) -> None:
    """``out[..., c] = table[values[..., c], c]``: uint8 ``values`` through each column of ``table`` ((256, k) of
    ``out``'s dtype, ``k`` the values' last axis, or 1 for all), into ``out`` (``values``' shape): one C call outside
    the GIL for a batch's run where the extension is built, the arrays are C-contiguous and their items of 4 or 2
    bytes (float32, float16, int32, ...; `native.windows`' ``lookup``), else numpy, a column at a time. The same
    values either way.

    >>> out = np.empty((1, 2, 3), np.float32)
    >>> table_lookup(np.array([[[0, 1, 2], [255, 0, 1]]], np.uint8), np.tile(np.arange(256, dtype=np.float32)[:, None],
    ...              (1, 3)) * [1, 10, 100], out)
    >>> out.tolist()
    [[[0.0, 10.0, 200.0], [255.0, 0.0, 100.0]]]
    """
    lookup = getattr(native.windows, "lookup", None)  # None: not built (or built before it was)
    table = np.ascontiguousarray(table, out.dtype)
    columns = table.shape[1]
    if table.ndim != 2 or table.shape[0] != 256 or columns not in (1, values.shape[-1]) or out.shape != values.shape:
        raise ValueError(f"table_lookup: a table of (256, 1) or (256, {values.shape[-1]}) for values of "
                         f"{values.shape}, and an out of their shape, not a table of {table.shape} and an out of "
                         f"{out.shape}")
    if lookup is not None and values.dtype == np.uint8 and out.dtype.itemsize in (2, 4) \
            and values.flags.c_contiguous and out.flags.c_contiguous:
        lookup(values, table, out)
        return
    for column in range(columns):
        at = (..., column) if columns > 1 else ...
        np.take(table[:, column], values[at], out=out[at], mode="clip")


def to_half(values: np.ndarray, out: np.ndarray) -> None:
    """float32 ``values`` rounded to float16 into ``out`` (to nearest, ties to even, as numpy's ``astype``): by the
    CPU's own conversion in one C call outside the GIL where the extension is built and the CPU has one (x86-64's
    F16C; `native.windows`' ``halves``), several times numpy's speed, else numpy. The same values either way (a NaN
    stays a NaN, its payload bits perhaps not the same).

    >>> out = np.empty(3, np.float16)
    >>> to_half(np.array([65520.0, 1e-8, -2.5], np.float32), out)
    >>> out.tolist()
    [inf, 0.0, -2.5]
    """
    halves = getattr(native.windows, "halves", None)
    if values.shape != out.shape or values.dtype != np.float32 or out.dtype != np.float16:
        raise ValueError(f"to_half: float32 values and a float16 out of their shape, not {values.dtype} {values.shape} "
                         f"and {out.dtype} {out.shape}")
    if halves is not None and values.flags.c_contiguous and out.flags.c_contiguous and halves(values, out):
        return
    with np.errstate(over="ignore"):  # past float16's range is infinity, as the CPU's conversion gives, unsaid
        np.copyto(out, values, casting="same_kind")


def brightness_contrast(images: np.ndarray, factors: np.ndarray, shifts: np.ndarray, out: np.ndarray) -> None:
    """uint8 ``images``' brightness and contrast into ``out``: picture ``i``'s values ``v`` become
    ``clip((v - mean) * factors[i] + mean + shifts[i], 0, 255)`` truncated to uint8, computed in float32 one operation
    at a time from the left, ``mean`` the picture's exact mean (its integer sum over its values) rounded to float32:
    one C call outside the GIL where the extension is built and the arrays are C-contiguous (`native.windows`'
    ``adjust``: each picture's 256 values' results computed once), else numpy. The same bytes either way.

    >>> out = np.empty((1, 1, 2), np.uint8)
    >>> brightness_contrast(np.array([[[10, 30]]], np.uint8), np.array([2.0], np.float32), np.array([5.0], np.float32),
    ...                     out)
    >>> out.tolist()  # mean 20: (10 - 20) * 2 + 20 + 5, (30 - 20) * 2 + 20 + 5
    [[[5, 45]]]
    """
    factors, shifts = np.ascontiguousarray(factors, np.float32), np.ascontiguousarray(shifts, np.float32)
    if images.dtype != np.uint8 or out.dtype != np.uint8 or out.shape != images.shape \
            or factors.shape != (len(images),) or shifts.shape != (len(images),):
        raise ValueError(f"brightness_contrast: uint8 images (n, ...), float32 factors and shifts (n) and a uint8 out of "
                         f"the images' shape, not images {images.dtype} {images.shape}, factors {factors.shape}, shifts "
                         f"{shifts.shape} and out {out.dtype} {out.shape}")
    adjust = getattr(native.windows, "adjust", None)
    if adjust is not None and images.flags.c_contiguous and out.flags.c_contiguous:
        adjust(images, factors, shifts, out)
        return
    size = math.prod(images.shape[1:])
    if not len(images) or not size:
        return
    flat = images.reshape(len(images), size)
    shape = (len(images),) + (1,) * (images.ndim - 1)
    mean = (flat.sum(axis=1, dtype=np.uint64) / size).astype(np.float32).reshape(shape)
    adjusted = (images.astype(np.float32) - mean) * factors.reshape(shape) + mean + shifts.reshape(shape)
    np.copyto(out, np.clip(adjusted, 0, 255), casting="unsafe")
