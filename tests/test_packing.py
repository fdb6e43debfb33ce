"""Where appended encoded pictures go (`outcore.ingest.packing`): an order in which every chunk's files fit
its region, found with the fewest swaps, else by packing, else refused."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.errors import SourceError
from outcore.ingest.packing import chunk_loads, fitting_order, swapped_order


@pytest.mark.parametrize(("nbytes", "used"), [([9, 9, 1, 1, 5, 5], 0), ([8, 8, 3, 2, 2, 1], 4)])
def test_fitting_order_swaps_as_little_as_needed_for_every_chunk_to_fit(nbytes, used):
    nbytes = np.array(nbytes)
    order = fitting_order(nbytes, first=2, used=used, chunk_size=4, capacity=16)
    assert sorted(order.tolist()) == list(range(6))
    slots = (2 + np.arange(6)) // 4
    loads = np.bincount(slots, weights=nbytes[order]) + [used, 0]
    assert loads.max() <= 16 and (order != np.arange(6)).sum() == 2  # one swap
    assert fitting_order(np.ones(6, int), 2, 0, 4, 14).tolist() == list(range(6))  # fits: unchanged
    with pytest.raises(SourceError, match="larger than the chunks"):
        fitting_order(np.full(6, 8), 2, 0, 4, 14)


def test_an_append_that_swaps_cannot_fit_is_packed():
    """Swaps of the chunk over capacity with the emptiest one cannot fit these (the swap search stops),
    a packing can: the append is not refused."""
    nbytes = np.array([3, 9, 7, 8, 5, 9, 2, 1])
    assert swapped_order(nbytes, 0, 0, 3, 15) is None
    order = fitting_order(nbytes, 0, 0, 3, 15)
    assert sorted(order.tolist()) == list(range(8))
    assert np.bincount(np.arange(8) // 3, weights=nbytes[order]).max() <= 15


def test_appends_of_files_like_the_stores_own_are_never_refused():
    """200 appends of 20 to 400 files drawn from the store's own size distribution (a store's chunks have
    the room of its fullest chunk at ingest, its last chunk partly filled): every one fits, each chunk within
    its room (the swaps alone refused 1 of these 200 on main 77b838a)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.lognormal(10, 0.35, 1000).astype(int)
        capacity = int(max(sizes[i : i + 16].sum() for i in range(0, 1000, 16)))
        first = 1000 - int(rng.integers(1, 16))
        used = int(sizes[first // 16 * 16 : first].sum())
        new = rng.lognormal(10, 0.35, int(rng.integers(20, 400))).astype(int)
        order = fitting_order(new, first, used, 16, capacity)
        assert sorted(order.tolist()) == list(range(len(new)))
        assert chunk_loads(new[order], first, used, 16).max() <= capacity
