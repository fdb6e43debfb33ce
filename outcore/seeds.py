"""Seed domains: every use of randomness draws from a generator of its own.

``numpy.random.default_rng([seed, 0, 0])`` is the same generator as ``default_rng(seed)``: numpy's
`SeedSequence` ignores trailing zeros. So keys made of the user's seed and a few counters collide
across uses (epoch 0's chunk order, the write order of shuffle-on-write and batch 0's augmentation
drew the same stream). `generator` keeps each use in its own domain (numpy's ``spawn_key``) and
prefixes the key with its length, so no two uses, and no two keys of one use, share a stream.

>>> a = generator(Domain.CHUNK_ORDER, 5, 0).random()
>>> b = generator(Domain.WRITE_ORDER, 5, 0).random()
>>> c = generator(Domain.CHUNK_ORDER, 5, 0, 0).random()
>>> len({a, b, c})
3
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from .errors import OptionError


class Domain(IntEnum):
    """What a generator is for. The values are part of every order outcore makes: never renumber them."""

    CHUNK_ORDER = 1  # the epoch's permutation of chunks
    BUFFER_SHUFFLE = 2  # which samples of a chunk go to which stretch of the buffer window
    WINDOW_ORDER = 3  # the order of the samples within one stretch of the window
    TRANSFORM = 4  # a batch's augmentation draws
    WRITE_ORDER = 5  # shuffle-on-write: where each source sample is stored
    REFERENCE = 6  # the full random permutation that shuffle quality is compared with
    MIXTURE = 7  # a mixture: which samples of a source an epoch takes, and each source's seed


def generator(domain: Domain, *key: int) -> np.random.Generator:
    """A generator for ``domain``, seeded by ``key`` (the user's seed first, then counters).

    >>> generator(Domain.TRANSFORM, 0, 3, 1, 7).integers(10)  # doctest: +SKIP
    """
    values = [int(value) for value in key]
    if any(value < 0 for value in values):
        raise OptionError(f"seeds and their counters must be 0 or more; got {tuple(values)}")
    return np.random.default_rng(np.random.SeedSequence([len(values), *values], spawn_key=(int(domain),)))
