"""Hypothesis strategies for stores: field arrays of many dtypes, shapes and byte orders; compressions.

>>> from hypothesis import given  # doctest: +SKIP
>>> @given(field_arrays(), compressions())  # doctest: +SKIP
... def test_round_trip(array, compression): ...
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..format import Compression

DTYPES = ("u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "?")


@st.composite
def field_arrays(draw: st.DrawFn, max_samples: int = 200) -> np.ndarray:
    """An array with a sample axis first: 1..``max_samples`` samples of shape (), (k,) or (k, m), any of
    `DTYPES`, in either byte order."""
    code = draw(st.sampled_from(DTYPES))
    order = draw(st.sampled_from("<>")) if np.dtype(code).itemsize > 1 else "|"
    dtype = np.dtype(order + code if order != "|" else code)
    sample_shape = draw(st.sampled_from([(), (3,), (2, 5), (1,)]))
    shape = (draw(st.integers(1, max_samples)), *sample_shape)
    elements = hnp.from_dtype(dtype, allow_nan=False) if dtype.kind == "f" else None
    return draw(hnp.arrays(dtype, shape, elements=elements))


def compressions() -> st.SearchStrategy[Compression]:
    """Every codec outcore writes: none, and Blosc with each compressor, level and shuffle."""
    blosc = st.builds(Compression, st.sampled_from(["zstd", "lz4", "lz4hc", "blosclz", "zlib"]), st.integers(0, 9),
                      st.sampled_from(["bitshuffle", "shuffle", "noshuffle"]))
    return st.one_of(st.just(Compression("none")), blosc)
