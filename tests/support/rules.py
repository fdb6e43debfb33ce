"""The documented rules of outcore's seeded orders, written here from the documentation alone (never by
calling outcore's own helpers), so that a test comparing outcore with them fails when an order changes.

Each use of randomness draws from ``default_rng(SeedSequence([len(key), *key], spawn_key=(domain,)))``
(`outcore/seeds/`), with these domain numbers, which are part of every order outcore makes.
"""

from __future__ import annotations

import numpy as np

CHUNK_ORDER, BUFFER_SHUFFLE, WINDOW_ORDER, TRANSFORM, WRITE_ORDER, REFERENCE, MIXTURE = 1, 2, 3, 4, 5, 6, 7


def seeded(domain: int, *key: int) -> np.random.Generator:
    """The generator of ``domain`` and ``key`` (the user's seed first, then counters)."""
    return np.random.default_rng(np.random.SeedSequence([len(key), *key], spawn_key=(domain,)))


def chunk_permutation(num_chunks: int, *, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """An epoch's order of chunks: a permutation drawn from ``(seed, epoch)``, or storage order."""
    if not shuffle:
        return list(range(num_chunks))
    return seeded(CHUNK_ORDER, seed, epoch).permutation(num_chunks).tolist()


def write_order(num_samples: int, seed: int) -> np.ndarray:
    """Shuffle on write: stored sample ``i`` is source sample ``write_order[i]``."""
    return seeded(WRITE_ORDER, seed).permutation(num_samples)
