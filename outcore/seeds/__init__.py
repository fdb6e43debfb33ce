"""Seed domains: every use of randomness draws from a generator of its own.

``numpy.random.default_rng([seed, 0, 0])`` is the same generator as ``default_rng(seed)``: numpy's
`SeedSequence` ignores trailing zeros. So keys made of the user's seed and a few counters collide
across uses (epoch 0's chunk order, the write order of shuffle-on-write and batch 0's augmentation
drew the same stream). `generator` keeps each use in its own domain (numpy's ``spawn_key``) and
prefixes the key with its length, so no two uses, and no two keys of one use, share a stream.

A batch draws on a dozen generators (its pieces' augmentations, the plan's windows): numpy's
`SeedSequence` makes each in Python, many times slower than the ``_state`` extension makes the same
state, which the generator then starts from (docs/benchmarks.md, "Figures behind the code"); and the few
numbers a transform draws a piece (`integers`, `uniform`) are numpy's own, drawn by the ``_draws`` extension
without numpy's argument handling, which costs more than the draws.

>>> a = generator(Domain.CHUNK_ORDER, 5, 0).random()
>>> b = generator(Domain.WRITE_ORDER, 5, 0).random()
>>> c = generator(Domain.CHUNK_ORDER, 5, 0, 0).random()
>>> len({a, b, c})
3
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from enum import IntEnum

import numpy as np
from numpy.random.bit_generator import ISeedSequence

from ..errors import OptionError

try:
    from . import _state as native
except ImportError:  # not built (no C compiler at install): numpy's SeedSequence, the same generators
    native = None
try:
    from . import _draws
except ImportError:  # not built: numpy's own calls, the same numbers
    _draws = None
if os.environ.get("OUTCORE_NATIVE", "1") == "0":
    native = _draws = None


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
    entropy = [len(values), *values]
    if native is not None:
        try:
            state = native.state(entropy, int(domain))
        except OverflowError:  # a number of 64 bits or more: numpy's own way
            pass
        else:
            return np.random.Generator(np.random.PCG64(_State(np.frombuffer(state, np.uint64))))
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(int(domain),)))


class _State(ISeedSequence):
    """The state `SeedSequence(entropy, spawn_key=(domain,)).generate_state(4, numpy.uint64)` would give, made by
    the ``_state`` extension: what a PCG64 generator is started from."""

    def __init__(self, words: np.ndarray) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype: type = np.uint32) -> np.ndarray:
        if (n_words, np.dtype(dtype)) != (len(self.words), np.dtype(np.uint64)):
            raise ValueError(f"a state of {len(self.words)} 64-bit words, not {n_words} of {np.dtype(dtype)}")
        return self.words


def how() -> str:
    """What makes the generators and the draws of transforms and epoch plans in this process, in words (``outcore info
    --system``)."""
    if _draws is not None and hasattr(_draws, "permutation"):
        return "C extension (a generator of each key made and drawn from in one call: crops, flips, orders)"
    if native is not None and _draws is not None:
        return "C extension (draws; each generator made by numpy: this build has no 128-bit integers)"
    return "numpy's calls (the same numbers: the extensions are not built here, or OUTCORE_NATIVE=0)"


def permutation(domain: Domain, key: Sequence[int], count: int) -> np.ndarray:
    """``generator(domain, *key).permutation(count)``: the same int64 order, made by the ``_draws`` extension where it
    is built, generator and all, in one call (an epoch plan's windows each draw one from a generator of their own).

    >>> permutation(Domain.WINDOW_ORDER, (0, 3), 5).tolist() == generator(Domain.WINDOW_ORDER, 0, 3).permutation(5).tolist()
    True
    """
    made = getattr(_draws, "permutation", None)  # not built where the compiler has no 128-bit integers
    values = [int(value) for value in key]
    if made is None or not _int64_key(values):  # numpy's way: it names a negative one
        return generator(domain, *values).permutation(count)
    out = np.empty(count, np.int64)
    made(np.array(values, np.int64), int(domain), out)
    return out


def window_draws(key: Sequence[int], first: np.ndarray, sizes: np.ndarray, deals: np.ndarray, ends: np.ndarray,
                 mixed: bool, starts: np.ndarray, indices: np.ndarray | None) -> WindowDraws | None:
    """The maker of an epoch stream's windows (`outcore.iterate.stream.StreamPlan`) by the ``_draws`` extension, one
    call for a run of consecutive windows (`WindowDraws`), its arrays made ready once for all the stream's windows:
    slot ``j`` starts at local index ``first[j]`` and has ``sizes[j]`` samples, in the order `permutation` gives for
    ``(*key, j)`` in `Domain.BUFFER_SHUFFLE` (with ``mixed``), of which ``deals[j, d]`` go to window ``j + d``
    (``ends``: their running sums); its sample of local index ``i`` is the store's ``starts[j] + i``, or, with a
    subset's ``indices``, ``indices[starts[j] + i]`` (`outcore.iterate.stream.Selection.sample`). None where the
    extension is not built (or the key is no int64 one): the caller makes the windows with numpy (the same numbers).

    >>> made = window_draws((0, 1), np.array([0]), np.array([4]), np.array([[4]]), np.array([[4]]), True,
    ...                     np.array([8]), None)
    >>> made is None or sorted(made(0, 1, 4)[0].tolist()) == [8, 9, 10, 11]
    True
    """
    values = [int(value) for value in key]
    if getattr(_draws, "window", None) is None or not _int64_key(values):
        return None
    return WindowDraws(np.array(values, np.int64), *(np.ascontiguousarray(array, np.int64) for array in (
        first, sizes, deals, ends, starts, np.empty(0, np.int64) if indices is None else indices)), bool(mixed))


class WindowDraws:
    """Windows ``w`` to ``stop - 1`` of a stream (`window_draws` made this from its slots), back to back: ``(samples,
    owner)``, the store's index and the slot of each of their ``count`` samples, made in one C call that keeps the GIL
    (a few microseconds of work a window: a GIL given up would be taken by another thread, which costs more): for
    each window ``v``, slots ``max(0, v - window + 1) .. v``, each one's stretch for this window back to back, then
    put in `permutation`'s order for ``(*key, v)`` in `Domain.WINDOW_ORDER` (with ``mixed``)."""

    __slots__ = ("deals", "ends", "first", "indices", "key", "mixed", "sizes", "starts")

    def __init__(self, key: np.ndarray, first: np.ndarray, sizes: np.ndarray, deals: np.ndarray, ends: np.ndarray,
                 starts: np.ndarray, indices: np.ndarray, mixed: bool) -> None:
        self.key, self.first, self.sizes, self.deals, self.ends, self.mixed = key, first, sizes, deals, ends, mixed
        self.starts, self.indices = starts, indices

    def __call__(self, w: int, stop: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        samples, owner = np.empty(count, np.int64), np.empty(count, np.int64)
        _draws.window(self.key, _BUFFER_SHUFFLE, _WINDOW_ORDER, w, stop, self.first, self.sizes, self.deals, self.ends,
                      self.starts, self.indices, self.mixed, samples, owner)
        return samples, owner


_BUFFER_SHUFFLE, _WINDOW_ORDER = int(Domain.BUFFER_SHUFFLE), int(Domain.WINDOW_ORDER)


def integers(rng: np.random.Generator, high: int, count: int) -> np.ndarray:
    """``rng.integers(0, high, size=count)``: the same int64 numbers, and the same state after, drawn by the
    ``_draws`` extension where it is built (numpy's argument handling costs more than the few draws of a
    transform's piece of a batch).

    >>> integers(np.random.default_rng(0), 10, 4).tolist() == np.random.default_rng(0).integers(0, 10, 4).tolist()
    True
    """
    if _draws is None or not 1 <= high < 2**32:
        return rng.integers(0, high, size=count)
    out = np.empty(count, np.int64)
    _draws.integers(rng.bit_generator.capsule, high, out)
    return out


def uniform(rng: np.random.Generator, count: int) -> np.ndarray:
    """``rng.random(count)``: the same numbers and state after, drawn by the ``_draws`` extension where it is built.

    >>> uniform(np.random.default_rng(0), 3).tolist() == np.random.default_rng(0).random(3).tolist()
    True
    """
    if _draws is None:
        return rng.random(count)
    out = np.empty(count, np.float64)
    _draws.uniform(rng.bit_generator.capsule, out)
    return out


def resized_crop_boxes(rng: np.random.Generator, sizes: np.ndarray, scale: tuple[float, float],
                       ratio: tuple[float, float]) -> np.ndarray | None:
    """RandomResizedCrop's boxes ``(top, left, height, width)`` of pictures of ``sizes`` (int64, ``(n, 2)``: height,
    width), drawn in order as `outcore.imaging.crops.random_resized_crop_box` draws each, the generator left as it
    leaves it, in one call of the ``_draws`` extension; None where it is not built, or for arguments that function
    refuses (it then draws them itself, and says why).

    >>> boxes = resized_crop_boxes(np.random.default_rng(0), np.array([[300, 400]]), (0.08, 1.0), (3 / 4, 4 / 3))
    >>> boxes is None or boxes.tolist() == [[28, 242, 137, 103]]
    True
    """
    if _draws is None or not (0 < ratio[0] <= ratio[1] and 0 <= scale[0] <= scale[1]) or (
            len(sizes) and not 1 <= sizes.min() <= sizes.max() < 2**32):
        return None
    out = np.empty((len(sizes), 4), np.int64)
    _draws.resized_crop_boxes(rng.bit_generator.capsule, np.ascontiguousarray(sizes, np.int64),
                              (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1])), out)
    return out


def crops_and_flips(domain: Domain, pieces: Sequence[tuple[int, Sequence[int]]], highs: tuple[int, int],
                    p: float, axes: tuple[bool, bool], window: tuple[int, int],
                    pad: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """Each piece ``(count, key)``'s draws from its own generator, ``generator(domain, *key)``: ``count`` tops
    (``integers(rng, highs[0], count)``), then as many lefts (``highs[1]``), then ``count`` mirrors
    (``uniform(rng, count) < p``) for each of the ``axes`` (left-right, top-bottom) that is on: `RandomCrop.boxes`'
    and `RandomFlip.draw`'s draws, the same numbers. The ``_draws`` extension makes the generators and draws from
    them in one call for all the pieces, making no numpy generator (each cost more than a piece's draws), and writes
    the boxes as a batch holds them: ``(boxes, flips)``, (n, 4) float64 ``(top - pad, left - pad, *window)`` and (n, 2)
    uint8, the pieces one after another; None where it is not built or for keys of numbers of 63 bits or more, keys
    of different lengths, or highs of 32 bits or more (draw them one by one then).

    >>> drawn = crops_and_flips(Domain.TRANSFORM, [(2, (0, 1, 2, 3))], (17, 17), 0.5, (True, False), (8, 8), pad=2)
    >>> rng = generator(Domain.TRANSFORM, 0, 1, 2, 3)
    >>> drawn is None or drawn[0][:, 0].tolist() == (integers(rng, 17, 2) - 2).tolist()
    True
    """
    made = _pieces_call("crops_and_flips", pieces)
    if made is None or not all(1 <= high < 2**32 for high in highs):
        return None
    keys, counts, call = made
    boxes, flips = np.empty((int(counts.sum()), 4), np.float64), np.empty((int(counts.sum()), 2), np.uint8)
    call(keys, int(domain), counts, highs, (float(window[0]), float(window[1])), float(pad), _mirrors(p, axes), boxes,
         flips)
    return boxes, flips


def resized_crops_and_flips(domain: Domain, pieces: Sequence[tuple[int, Sequence[int]]], sizes: np.ndarray,
                            scale: tuple[float, float], ratio: tuple[float, float], p: float,
                            axes: tuple[bool, bool]) -> tuple[np.ndarray, np.ndarray] | None:
    """`crops_and_flips` for `RandomResizedCrop`: each piece's boxes ``(top, left, height, width)`` of its pictures of
    ``sizes`` ((n, 2) int64, the pieces one after another), drawn as `resized_crop_boxes` draws them, then its mirrors:
    ``(boxes, flips)``, (n, 4) float64 (whole numbers, as a batch holds them) and (n, 2) uint8; None where the
    extension cannot draw them.

    >>> drawn = resized_crops_and_flips(Domain.TRANSFORM, [(1, (0, 1, 2, 3))], np.array([[300, 400]]), (0.08, 1.0),
    ...                                 (3 / 4, 4 / 3), 0.5, (True, False))
    >>> rng = generator(Domain.TRANSFORM, 0, 1, 2, 3)
    >>> drawn is None or drawn[0].tolist() == resized_crop_boxes(rng, np.array([[300, 400]]), (0.08, 1.0),
    ...                                                          (3 / 4, 4 / 3)).tolist()
    True
    """
    if not 0 < ratio[0] <= ratio[1]:
        return None
    return _sized_crops("resized_crops_and_flips", domain, pieces, sizes, scale, ratio, _mirrors(p, axes))


def scale_jitters_and_flips(domain: Domain, pieces: Sequence[tuple[int, Sequence[int]]], sizes: np.ndarray,
                            scale: tuple[float, float], size: tuple[int, int], p: float,
                            axes: tuple[bool, bool]) -> tuple[np.ndarray, np.ndarray] | None:
    """`crops_and_flips` for `ScaleJitter`: each piece's windows of ``size`` (height, width) in its pictures' pixels
    (``sizes``, (n, 2) int64, the pieces one after another), drawn as ``ScaleJitter(size, scale).boxes`` draws them,
    then its mirrors: ``(boxes, flips)``, (n, 4) float64 and (n, 2) uint8; None where the extension cannot draw them.

    >>> from outcore.transforms import ScaleJitter
    >>> sizes = np.array([[300, 400], [20, 30]])
    >>> drawn = scale_jitters_and_flips(Domain.TRANSFORM, [(2, (0, 1, 2, 3))], sizes, (0.1, 2.0), (64, 64), 0.5,
    ...                                 (True, False))
    >>> rng = generator(Domain.TRANSFORM, 0, 1, 2, 3)
    >>> drawn is None or drawn[0].tolist() == ScaleJitter(64, (0.1, 2.0)).boxes(sizes, rng).tolist()
    True
    """
    if not (size[0] >= 1 and size[1] >= 1):
        return None
    return _sized_crops("scale_jitters_and_flips", domain, pieces, sizes, scale, size, _mirrors(p, axes))


def _sized_crops(name: str, domain: Domain, pieces: Sequence[tuple[int, Sequence[int]]], sizes: np.ndarray,
                 scale: tuple[float, float], second: tuple[float, float],
                 mirrors: tuple[float, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """The ``_draws`` extension's ``name`` call of the boxes of pictures of ``sizes`` (and their mirrors), each piece's
    from its own generator: ``(boxes, flips)``; None where it is not built or cannot draw them (keys it cannot take,
    a scale below 0 or reversed, pictures of no pixels or sides of 2**32 or more), for numpy to draw them instead."""
    made = _pieces_call(name, pieces)
    if made is None or not 0 <= scale[0] <= scale[1] or (len(sizes) and not 1 <= sizes.min() <= sizes.max() < 2**32):
        return None
    keys, counts, call = made
    boxes, flips = np.empty((len(sizes), 4), np.float64), np.empty((len(sizes), 2), np.uint8)
    call(keys, int(domain), counts, np.ascontiguousarray(sizes, np.int64), (float(scale[0]), float(scale[1])),
         (float(second[0]), float(second[1])), mirrors, boxes, flips)
    return boxes, flips


def _pieces_call(name: str, pieces: Sequence[tuple[int, Sequence[int]]]
                 ) -> tuple[np.ndarray, np.ndarray, Callable[..., None]] | None:
    """``(keys, counts, the _draws call name)`` of ``pieces`` ``(count, key)``, or None where it is not built (nor, with
    no 128-bit integers in the compiler, are these calls) or for keys it cannot take: of different lengths, of
    numbers of 63 bits or more."""
    call = getattr(_draws, name, None)
    keys = [key for _, key in pieces]
    if call is None or not keys or len({len(key) for key in keys}) != 1:
        return None
    if not _int64_key([value for key in keys for value in key]):
        return None
    return np.array(keys, np.int64), np.array([count for count, _ in pieces], np.int64), call


def _int64_key(values: Sequence[int]) -> bool:
    """Whether the ``_draws`` calls take a key of ``values``: numbers of 0 to 2**63 - 1 (int64, none negative)."""
    return not values or 0 <= min(values) <= max(values) < 2**63


def _mirrors(p: float, axes: tuple[bool, bool]) -> tuple[float, int]:
    """A flip's chance and its axes (left-right, top-bottom) as the bit mask the ``_draws`` calls take."""
    return float(p), int(axes[0]) | int(axes[1]) << 1
