"""Each use of randomness has a generator of its own (`outcore.seeds`), made by the ``_state`` extension where it is
built: the very generator numpy's SeedSequence makes from the same key, for any key; a transform's draws, made by
the ``_draws`` extension, are numpy's numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore import seeds
from outcore.errors import OptionError
from outcore.seeds import Domain, generator


def _numpy(domain: Domain, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([len(key), *key], spawn_key=(int(domain),)))


@settings(max_examples=400, deadline=None)
@given(domain=st.sampled_from(list(Domain)),
       key=st.lists(st.one_of(st.integers(0, 2**32), st.integers(0, 2**64 - 1), st.integers(0, 2**100)), max_size=8))
def test_every_generator_is_numpys_from_the_same_key(domain, key):
    """Numbers of 64 bits or more, which the extension leaves to numpy, included."""
    np.testing.assert_array_equal(generator(domain, *key).random(4), _numpy(domain, *key).random(4))


def test_the_extension_makes_them_where_it_is_built():
    if seeds.native is None:
        pytest.skip("outcore's seeds._state extension is not in use here (OUTCORE_NATIVE=0, or not built)")
    state = np.frombuffer(seeds.native.state([2, 7, 3], int(Domain.TRANSFORM)), np.uint64)
    expected = np.random.SeedSequence([2, 7, 3], spawn_key=(int(Domain.TRANSFORM),)).generate_state(4, np.uint64)
    np.testing.assert_array_equal(state, expected)
    with pytest.raises(OverflowError):
        seeds.native.state([1, 2**64], 1)


def test_negative_seeds_are_refused():
    with pytest.raises(OptionError, match="0 or more"):
        generator(Domain.CHUNK_ORDER, -1)


@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), before=st.integers(0, 3), count=st.integers(0, 40),
       high=st.one_of(st.integers(1, 300), st.integers(1, 2**32 + 5), st.sampled_from([2**31, 2**32 - 1, 2**32])))
def test_a_transform_s_draws_are_numpy_s_numbers_and_leave_its_state(seed, before, count, high):
    """Drawn by the ``_draws`` extension where it is built: the same numbers as numpy's calls, and the generator
    left in the same state, a half-used 64-bit output (after an odd number of 32-bit draws) included."""
    ours, numpy = np.random.default_rng(seed), np.random.default_rng(seed)
    for rng in (ours, numpy):
        rng.integers(0, 7, size=before)  # 32-bit draws: an odd number leaves half an output buffered
    integers, expected = seeds.integers(ours, high, count), numpy.integers(0, high, size=count)
    assert integers.dtype == expected.dtype and integers.tolist() == expected.tolist()
    assert seeds.uniform(ours, count).tolist() == numpy.random(count).tolist()
    assert ours.bit_generator.state == numpy.bit_generator.state


def test_the_draws_are_made_by_the_extension_where_it_is_built():
    if seeds._draws is None:
        pytest.skip("outcore's seeds._draws extension is not in use here (OUTCORE_NATIVE=0, or not built)")
    out = np.full(5, -1, np.int64)
    seeds._draws.integers(np.random.default_rng(3).bit_generator.capsule, 10, out)
    assert out.tolist() == np.random.default_rng(3).integers(0, 10, size=5).tolist()
    with pytest.raises(ValueError, match="high < 2"):
        seeds._draws.integers(np.random.default_rng(3).bit_generator.capsule, 2**32, out)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), before=st.integers(0, 3),
       sizes=st.lists(st.tuples(st.integers(1, 700), st.integers(1, 700)), max_size=20),
       scale=st.tuples(st.floats(0, 1), st.floats(0, 1)).map(sorted),
       ratio=st.tuples(st.floats(0.05, 20), st.floats(0.05, 20)).map(sorted))
def test_resized_crop_boxes_are_those_drawn_one_by_one_and_leave_the_same_state(seed, before, sizes, scale, ratio):
    """RandomResizedCrop's boxes drawn by the ``_draws`` extension where it is built: those
    `random_resized_crop_box` draws picture by picture with numpy's calls (tries, central fallbacks, ratios in
    equal, half-used 64-bit outputs), and the generator left in the same state."""
    from outcore.imaging.crops import random_resized_crop_box

    ours, numpy = np.random.default_rng(seed), np.random.default_rng(seed)
    for rng in (ours, numpy):
        rng.integers(0, 7, size=before)
    scale, ratio = tuple(scale), tuple(ratio)
    drawn = seeds.resized_crop_boxes(ours, np.array(sizes, np.int64).reshape(-1, 2), scale, ratio)
    expected = [random_resized_crop_box(height, width, scale, ratio, numpy) for height, width in sizes]
    if seeds._draws is None:
        assert drawn is None
        return
    assert drawn.tolist() == [list(box) for box in expected]
    assert ours.bit_generator.state == numpy.bit_generator.state


def test_resized_crop_boxes_leave_what_the_extension_cannot_draw_to_python():
    sizes = np.array([[0, 5]], np.int64)  # a picture of no rows: random_resized_crop_box says so itself
    assert seeds.resized_crop_boxes(np.random.default_rng(0), sizes, (0.08, 1.0), (0.75, 1.33)) is None
    assert seeds.resized_crop_boxes(np.random.default_rng(0), sizes + 1, (0.08, 1.0), (0, 1.33)) is None
    assert seeds.resized_crop_boxes(np.random.default_rng(0), sizes + 1, (-1, 1.0), (0.75, 1.33)) is None
    assert seeds.resized_crop_boxes(np.random.default_rng(0), sizes + 1, (0.08, 1.0), (1.33, 0.75)) is None  # numpy refuses


@settings(max_examples=300, deadline=None)
@given(domain=st.sampled_from(list(Domain)), length=st.integers(1, 5),
       keys=st.lists(st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**63 - 1)), min_size=5, max_size=5),
                     min_size=1, max_size=8),
       counts=st.lists(st.integers(0, 40), min_size=8, max_size=8),
       highs=st.tuples(st.integers(1, 300), st.one_of(st.integers(1, 2**32 - 1), st.just(1))),
       p=st.floats(0, 1), axes=st.tuples(st.booleans(), st.booleans()),
       window=st.tuples(st.integers(1, 600), st.integers(1, 600)), pad=st.integers(0, 16))
def test_a_batch_s_crops_and_flips_drawn_at_once_are_each_piece_s_generator_s(domain, length, keys, counts, highs, p,
                                                                            axes, window, pad):
    """`seeds.crops_and_flips` makes each piece's generator in C (numpy's PCG64 from the SeedSequence's state, keys of
    one and two 32-bit words a number) and draws what `RandomCrop.boxes` and `RandomFlip.draw` draw from it, in their
    order: the same numbers as numpy's generator of the key, piece by piece, written as the batch's float64 boxes
    (the corners less the padding, the window's size)."""
    pieces = [(count, tuple(key[:length])) for count, key in zip(counts, keys)]
    drawn = seeds.crops_and_flips(domain, pieces, highs, p, axes, window, pad=pad)

    def crops(rng, low, high):
        boxes = drawn[0][low:high]
        assert drawn[0].dtype == np.float64 and drawn[0].shape[1] == 4
        assert (boxes[:, 0] + pad).tolist() == rng.integers(0, highs[0], size=high - low).tolist()
        assert (boxes[:, 1] + pad).tolist() == rng.integers(0, highs[1], size=high - low).tolist()
        assert boxes[:, 2:].tolist() == [list(window)] * (high - low)

    _each_piece_drew_so(drawn, "crops_and_flips", pieces, domain, p, axes, crops)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 50)), min_size=1, max_size=6),
       counts=st.lists(st.integers(0, 12), min_size=6, max_size=6),
       sides=st.lists(st.tuples(st.integers(1, 700), st.integers(1, 700)), min_size=72, max_size=72),
       scale=st.tuples(st.floats(0, 1), st.floats(0, 1)).map(sorted),
       ratio=st.tuples(st.floats(0.05, 20), st.floats(0.05, 20)).map(sorted),
       p=st.floats(0, 1), axes=st.tuples(st.booleans(), st.booleans()))
def test_a_batch_s_resized_crops_drawn_at_once_are_each_piece_s_generator_s(keys, counts, sides, scale, ratio, p, axes):
    """`seeds.resized_crops_and_flips`: each piece's RandomResizedCrop boxes (pictures of their own sizes), then its
    mirrors, from a generator made in C: those `random_resized_crop_box` and numpy's draws give, piece by piece."""
    from outcore.imaging.crops import random_resized_crop_box

    pieces = list(zip(counts, keys))
    sizes = np.array(sides[: sum(count for count, _ in pieces)], np.int64).reshape(-1, 2)
    scale, ratio = tuple(scale), tuple(ratio)
    drawn = seeds.resized_crops_and_flips(Domain.TRANSFORM, pieces, sizes, scale, ratio, p, axes)

    def crops(rng, low, high):
        expected = [random_resized_crop_box(height, width, scale, ratio, rng) for height, width in sizes[low:high].tolist()]
        assert drawn[0].dtype == np.float64 and drawn[0][low:high].tolist() == [list(box) for box in expected]

    _each_piece_drew_so(drawn, "resized_crops_and_flips", pieces, Domain.TRANSFORM, p, axes, crops)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 50)), min_size=1, max_size=6),
       counts=st.lists(st.integers(0, 12), min_size=6, max_size=6),
       sides=st.lists(st.tuples(st.integers(1, 2000), st.integers(1, 2000)), min_size=72, max_size=72),
       scale=st.tuples(st.floats(0, 4), st.floats(0, 4)).map(sorted),
       size=st.tuples(st.integers(1, 1024), st.integers(1, 1024)), p=st.floats(0, 1),
       axes=st.tuples(st.booleans(), st.booleans()))
def test_a_batch_s_scale_jitters_drawn_at_once_are_each_piece_s_generator_s(keys, counts, sides, scale, size, p, axes):
    """`seeds.scale_jitters_and_flips`: each piece's ScaleJitter windows (pictures of their own sizes, scaled smaller
    and larger than the output), then its mirrors, from a generator made in C: what `ScaleJitter.boxes` and numpy's
    draws give, piece by piece, to the last bit."""
    from outcore.transforms import ScaleJitter

    pieces = list(zip(counts, keys))
    sizes = np.array(sides[: sum(count for count, _ in pieces)], np.int64).reshape(-1, 2)
    drawn = seeds.scale_jitters_and_flips(Domain.TRANSFORM, pieces, sizes, tuple(scale), size, p, axes)

    def crops(rng, low, high):
        expected = ScaleJitter(size, tuple(scale)).boxes(sizes[low:high], rng)
        assert drawn[0].dtype == np.float64 and drawn[0][low:high].tobytes() == expected.tobytes()

    _each_piece_drew_so(drawn, "scale_jitters_and_flips", pieces, Domain.TRANSFORM, p, axes, crops)


def _each_piece_drew_so(drawn, call, pieces, domain, p, axes, crops):
    """``drawn`` by the ``_draws`` extension's ``call`` (None without it): piece after piece, what ``crops(rng, low,
    high)`` asserts of its crops, ``rng`` numpy's generator of its key, then its mirrors numpy's draws after them."""
    if getattr(seeds._draws, call, None) is None:
        assert drawn is None
        return
    flips, at = drawn[1], 0
    for count, key in pieces:
        rng = _numpy(domain, *key)
        crops(rng, at, at + count)
        for axis, on in enumerate(axes):
            expected = rng.random(count) < p if on else np.zeros(count, bool)
            assert flips[at : at + count, axis].tolist() == expected.astype(np.uint8).tolist()
        at += count
    assert at == len(drawn[0]) == len(flips)


def test_crops_and_flips_leave_what_the_extension_cannot_draw_to_python():
    pieces = [(2, (0, 1, 2, 3))]
    assert seeds.crops_and_flips(Domain.TRANSFORM, pieces, (2**32, 5), 0.5, (True, False), (4, 4)) is None  # numpy's own way
    assert seeds.crops_and_flips(Domain.TRANSFORM, [(2, (2**63, 1, 2, 3))], (5, 5), 0.5, (True, False), (4, 4)) is None
    assert seeds.crops_and_flips(Domain.TRANSFORM, [*pieces, (1, (0, 1, 2))], (5, 5), 0.5, (True, False), (4, 4)) is None
    assert seeds.crops_and_flips(Domain.TRANSFORM, [], (5, 5), 0.5, (True, False), (4, 4)) is None
    sizes = np.array([[0, 5], [4, 4]], np.int64)  # a picture of no rows: random_resized_crop_box says so itself
    assert seeds.resized_crops_and_flips(Domain.TRANSFORM, pieces, sizes, (0.08, 1.0), (0.75, 1.3), 0.5,
                                         (True, False)) is None
    assert seeds.scale_jitters_and_flips(Domain.TRANSFORM, pieces, sizes, (0.1, 2.0), (8, 8), 0.5, (True, False)) is None
    for scale in ((2.0, 0.1), (-1.0, 2.0)):  # numpy draws what it is asked: ScaleJitter's draws
        assert seeds.scale_jitters_and_flips(Domain.TRANSFORM, pieces, sizes + 1, scale, (8, 8), 0.5,
                                             (True, False)) is None


@settings(max_examples=300, deadline=None)
@given(domain=st.sampled_from(list(Domain)),
       key=st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**63 - 1), st.integers(2**63, 2**64 - 1)), max_size=5),
       count=st.one_of(st.integers(0, 3), st.integers(0, 2000), st.just(70_000)))
def test_a_permutation_is_numpy_s_from_the_generator_of_its_key(domain, key, count):
    """`seeds.permutation` (an epoch's chunk order, its windows' orders, a write order): the order numpy's generator of
    the key gives, made in C where it is built (keys of numbers below 2**63; long orders with the GIL released)."""
    order = seeds.permutation(domain, key, count)
    assert order.dtype == np.int64 and order.tolist() == _numpy(domain, *key).permutation(count).tolist()


def test_a_permutation_of_a_negative_key_is_refused():
    with pytest.raises(OptionError, match="0 or more"):
        seeds.permutation(Domain.WINDOW_ORDER, (0, -1), 5)


def test_windows_the_stream_s_slots_do_not_make_are_refused():
    """`WindowDraws` asks the ``_draws`` extension for a run of windows, each sample as its index in the store (or in a
    subset's indices): a run past the stream's last window, counts that are not the windows' samples, deals that do
    not fit the slots or a subset's index that is not there are a ValueError."""
    arrays = (np.array([0, 4]), np.array([4, 2]), np.array([[4], [2]]), np.array([[4], [2]]))
    made = seeds.window_draws((0, 1), *arrays, True, np.array([100, 10]), None)
    if made is None:
        pytest.skip(f"outcore's seeds._draws extension is not in use here: {seeds.how()}")
    samples, owner = made(0, 2, 6)  # both windows of the stream's two slots, back to back
    assert sorted(samples[:4].tolist()) == [100, 101, 102, 103] and sorted(samples[4:].tolist()) == [14, 15]
    assert owner.tolist() == [0, 0, 0, 0, 1, 1]
    assert made(1, 1, 0)[0].tolist() == []  # no window
    subset = seeds.window_draws((0, 1), *arrays, True, np.array([0, 0]), np.arange(6) * 10)
    assert sorted(subset(0, 2, 6)[0].tolist()) == [0, 10, 20, 30, 40, 50]
    for stop, count in ((3, 6), (2, 5), (2, 7)):
        with pytest.raises(ValueError, match="windows w .. stop - 1"):
            made(0, stop, count)
    made.deals = np.array([[5], [2]])  # more samples dealt than the slot has
    with pytest.raises(ValueError, match="deals fit the"):
        made(0, 1, 5)
    short = seeds.window_draws((0, 1), *arrays, True, np.array([0, 0]), np.arange(5))  # index 5 is not there
    with pytest.raises(ValueError, match="indices holding every sample asked"):
        short(0, 2, 6)
